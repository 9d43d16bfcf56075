//! Per-architecture facts of llama.cpp's GGUF conversion that the file does not state.
//!
//! Sources: llama.cpp `convert_hf_to_gguf.py` (which families permute Q/K rows, which add 1 to
//! norm weights) and the HF `configuration_*.py` defaults of each family (activation, sliding
//! pattern, local RoPE base).

/// How one GGUF `general.architecture` maps back to the HF family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Family {
    /// GGUF `general.architecture`.
    pub gguf_arch: &'static str,
    /// HF `model_type`.
    pub model_type: &'static str,
    /// HF `hidden_act` (not stored in GGUF).
    pub hidden_act: &'static str,
    /// Q/K weight (and bias) rows were permuted for llama.cpp's interleaved RoPE
    /// (`LlamaModel.permute`); undo it on read.
    pub qk_permuted: bool,
    /// Every `*norm.weight` had 1 added (Gemma's `x·(1 + w)` folded in); subtract it on read.
    pub norm_plus_one: bool,
    /// HF `sliding_window_pattern`: layer `i` is full attention when `(i + 1) % n == 0`, sliding
    /// otherwise (Gemma-2: 2, Gemma-3: 6). `None`: no per-layer pattern.
    pub sliding_pattern: Option<usize>,
    /// RoPE base of sliding layers (Gemma-3 `rope_local_base_freq`, 1e4).
    pub rope_local_theta: Option<f64>,
    /// HF config has `query_pre_attn_scalar` (Gemma-2/3), which GGUF does not store.
    pub query_pre_attn_scalar: bool,
    /// `block_count` of the variant whose attention scale is `(hidden/heads)^-0.5` instead of
    /// `key_length^-0.5` (the 27B Gemmas; llama.cpp `f_attention_scale` for `LLM_TYPE_27B`).
    pub scale_by_hidden_per_head_at_layers: Option<usize>,
    /// Metadata key suffix of the norm epsilon (`attention.layer_norm_rms_epsilon` for RMSNorm
    /// families, `attention.layer_norm_epsilon` for LayerNorm ones).
    pub eps_key: &'static str,
    /// Whether and how the architecture stores a mixture of experts.
    pub moe: Moe,
    /// YaRN's correction range is floored/ceiled (HF `truncate`, not stored in GGUF): true
    /// except for gpt-oss, whose checkpoints set it false.
    pub yarn_truncate: bool,
}

/// Mixture of experts in a GGUF architecture: llama.cpp stores a router `ffn_gate_inp`
/// (`[n_embd, n_expert]`) and each projection's experts stacked in one 3-D tensor
/// `ffn_{gate,up,down}_exps` (ne `[n_embd, n_ff_exp, n_expert]`, down `[n_ff_exp, n_embd,
/// n_expert]`), with `{arch}.expert_count` and `{arch}.expert_used_count`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Moe {
    /// Dense only: an `expert_count` is refused.
    Dense,
    /// llama.cpp's plain MoE (`build_moe_ffn` with softmax gating, `norm_w = true`: the top-k
    /// weights renormalised; SiLU-gated experts; src/models/llama.cpp, qwen3moe.cpp): with
    /// `expert_count` > 0 the model is HF `model_type` (llama → mixtral, qwen3moe →
    /// qwen3_moe). `required`: the architecture has no dense form. `expert_width_key`: the
    /// experts' width is `expert_feed_forward_length` (HF `moe_intermediate_size`; absent,
    /// llama.cpp's `feed_forward_length / expert_used_count`), else `feed_forward_length`
    /// (Mixtral's `intermediate_size`).
    Softmax {
        model_type: &'static str,
        required: bool,
        expert_width_key: bool,
    },
    /// gpt-oss (`expert_count` required; `expert_feed_forward_length`; stacked `ffn_*_exps`
    /// with biases; softmax over the top-k logits; the clamped SwiGLU of HF `GptOssConfig`'s
    /// defaults, limit 7 and alpha 1.702, which GGUF does not store).
    GptOss,
}

impl Moe {
    /// The architecture also stores dense models (what infer's GGUF export writes).
    pub fn has_dense_form(self) -> bool {
        matches!(
            self,
            Moe::Dense
                | Moe::Softmax {
                    required: false,
                    ..
                }
        )
    }
}

const RMS_EPS: &str = "attention.layer_norm_rms_epsilon";

const BASE: Family = Family {
    gguf_arch: "llama",
    model_type: "llama",
    hidden_act: "silu",
    qk_permuted: false,
    norm_plus_one: false,
    sliding_pattern: None,
    rope_local_theta: None,
    query_pre_attn_scalar: false,
    scale_by_hidden_per_head_at_layers: None,
    eps_key: RMS_EPS,
    moe: Moe::Dense,
    yarn_truncate: true,
};

/// Supported GGUF architectures.
pub(crate) const FAMILIES: &[Family] = &[
    // Mixtral is `llama` with experts (convert_hf_to_gguf.py `LlamaModel` merges
    // `block_sparse_moe.experts.*.w{1,3,2}` into `ffn_{gate,up,down}_exps`).
    Family {
        qk_permuted: true,
        moe: Moe::Softmax {
            model_type: "mixtral",
            required: false,
            expert_width_key: false,
        },
        ..BASE
    },
    Family {
        gguf_arch: "qwen2",
        model_type: "qwen2",
        ..BASE
    },
    Family {
        gguf_arch: "qwen3",
        model_type: "qwen3",
        ..BASE
    },
    // convert_hf_to_gguf.py `Qwen3MoeModel` (a `Qwen2MoeModel`: no Q/K permutation; experts
    // merged into `ffn_*_exps`, `expert_feed_forward_length` = `moe_intermediate_size`).
    Family {
        gguf_arch: "qwen3moe",
        model_type: "qwen3_moe",
        moe: Moe::Softmax {
            model_type: "qwen3_moe",
            required: true,
            expert_width_key: true,
        },
        ..BASE
    },
    Family {
        gguf_arch: "phi3",
        model_type: "phi3",
        ..BASE
    },
    Family {
        gguf_arch: "starcoder2",
        model_type: "starcoder2",
        hidden_act: "gelu_pytorch_tanh",
        eps_key: "attention.layer_norm_epsilon",
        ..BASE
    },
    Family {
        gguf_arch: "gemma",
        model_type: "gemma",
        hidden_act: "gelu_pytorch_tanh",
        norm_plus_one: true,
        ..BASE
    },
    Family {
        gguf_arch: "gemma2",
        model_type: "gemma2",
        hidden_act: "gelu_pytorch_tanh",
        norm_plus_one: true,
        sliding_pattern: Some(2),
        query_pre_attn_scalar: true,
        scale_by_hidden_per_head_at_layers: Some(46),
        ..BASE
    },
    // llama.cpp `LLM_ARCH_COHERE2`: `set_swa_pattern(4)`, RoPE on the sliding layers only, in
    // adjacent pairs as HF (no Q/K permutation), LayerNorm epsilon, `logit_scale`.
    Family {
        gguf_arch: "cohere2",
        model_type: "cohere2",
        sliding_pattern: Some(4),
        eps_key: "attention.layer_norm_epsilon",
        ..BASE
    },
    // llama.cpp `LLM_ARCH_OPENAI_MOE` ("gpt-oss"): `set_swa_pattern(2)`, NeoX RoPE (no Q/K
    // permutation), YaRN from `rope.scaling.*`, attention sinks `attn_sinks`.
    Family {
        gguf_arch: "gpt-oss",
        model_type: "gpt_oss",
        sliding_pattern: Some(2),
        moe: Moe::GptOss,
        yarn_truncate: false,
        ..BASE
    },
    Family {
        gguf_arch: "gemma3",
        model_type: "gemma3_text",
        hidden_act: "gelu_pytorch_tanh",
        norm_plus_one: true,
        sliding_pattern: Some(6),
        rope_local_theta: Some(10_000.0),
        query_pre_attn_scalar: true,
        scale_by_hidden_per_head_at_layers: Some(62),
        ..BASE
    },
];

/// The family of a GGUF architecture name, if supported.
pub(crate) fn family(gguf_arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.gguf_arch == gguf_arch)
}

/// Comma-separated supported GGUF architectures, for error messages.
pub(crate) fn supported() -> String {
    FAMILIES
        .iter()
        .map(|f| f.gguf_arch)
        .collect::<Vec<_>>()
        .join(", ")
}
