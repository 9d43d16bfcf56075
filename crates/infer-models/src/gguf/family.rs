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
    /// Mixture of experts as gpt-oss stores it (`expert_count`, `expert_used_count`,
    /// `expert_feed_forward_length`; stacked `ffn_*_exps`; softmax over the top-k logits; the
    /// clamped SwiGLU of HF `GptOssConfig`'s defaults, limit 7 and alpha 1.702, which GGUF
    /// does not store). `false`: an `expert_count` is refused.
    pub gpt_oss_moe: bool,
    /// YaRN's correction range is floored/ceiled (HF `truncate`, not stored in GGUF): true
    /// except for gpt-oss, whose checkpoints set it false.
    pub yarn_truncate: bool,
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
    gpt_oss_moe: false,
    yarn_truncate: true,
};

/// Supported GGUF architectures.
pub(crate) const FAMILIES: &[Family] = &[
    Family {
        qk_permuted: true,
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
        gpt_oss_moe: true,
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
