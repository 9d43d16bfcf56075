//! [`ModelArchitecture`]: every per-layer question of the forward pass, answered per family.
//!
//! The compute path never branches on `model_type`; it asks this trait. Tensor names returned
//! here are the canonical names a vindex stores (Llama-style HF names; families with other HF
//! names are mapped to these at extract time by [`ModelArchitecture::canonical_name`]).

mod family;
mod names;
mod tensors;

use crate::{ModelConfig, RopeScaling};

pub use family::{Family, FamilyArch};
pub use tensors::{expected_tensors, ExpectedTensor};

/// Normalisation layer type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormType {
    /// `x / sqrt(mean(x²) + eps) · (w + offset)`.
    RmsNorm,
    /// `(x - mean) / sqrt(var + eps) · w + b`.
    LayerNorm,
}

/// FFN shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnType {
    /// `down(act(gate(x)) · up(x))` (SwiGLU, GeGLU).
    Gated,
    /// `down(act(up(x)))` (GPT-2, StarCoder2, phi, GPT-NeoX).
    Standard,
}

/// FFN activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
    /// exact erf GELU (`gelu`).
    Gelu,
}

/// How a source tensor must be transformed at extract time to give its canonical tensor(s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorTransform {
    /// Stored as the canonical tensor.
    AsIs,
    /// GPT-2 `Conv1D` weight stored `[in, out]`: transpose to the Linear `[out, in]` layout.
    Transpose,
    /// Fused q/k/v projection (canonical name `model.layers.{l}.self_attn.qkv_proj.{weight,bias}`):
    /// split into the q, k, v keys ([`ModelArchitecture::attn_q_key`] …) per [`QkvLayout`].
    SplitQkv(QkvLayout),
    /// Phi-3 `mlp.gate_up_proj`: rows `[gate; up]` (each `intermediate_size` rows) → the gate
    /// and up keys.
    SplitGateUp,
    /// gpt-oss fused experts (canonical key `model.layers.{l}.mlp.experts.{gate_up_proj,
    /// gate_up_proj_bias, down_proj, down_proj_bias}`, HF `GptOssExperts`) → per expert `e` the
    /// Linear-layout keys `mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}`, see
    /// [`ExpertsPart`].
    SplitExperts(ExpertsPart),
}

/// Which fused gpt-oss expert tensor a [`TensorTransform::SplitExperts`] splits (HF
/// `GptOssExperts`: `gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e]`, gate the even
/// columns, up the odd ones; `out = glu @ down_proj[e] + down_proj_bias[e]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertsPart {
    /// `gate_up_proj` `[E, hidden, 2·inter]`, columns alternating gate, up → per expert the
    /// gate and up weights `[inter, hidden]` (transposed).
    GateUp,
    /// `gate_up_proj_bias` `[E, 2·inter]` → per expert the gate and up biases `[inter]`.
    GateUpBias,
    /// `down_proj` `[E, inter, hidden]` → per expert the down weight `[hidden, inter]`.
    Down,
    /// `down_proj_bias` `[E, hidden]` → per expert the down bias `[hidden]`.
    DownBias,
    /// One projection's experts stacked as llama.cpp stores them (GGUF `ffn_{gate,up,down}_exps`,
    /// read under the names `mlp.experts.stacked_{gate,up,down}_proj`): `[E, rows, cols]` of HF
    /// Linear matrices → per expert the `{proj}.weight` `[rows, cols]`.
    Stacked,
    /// Their biases (`mlp.experts.stacked_{proj}_bias`, GGUF `ffn_{…}_exps.bias`) `[E, n]` →
    /// per expert the `{proj}.bias` `[n]`.
    StackedBias,
}

/// Row layout of a fused q/k/v projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvLayout {
    /// Phi-3 `qkv_proj` `[(H + 2·KV)·head_dim, hidden]`: rows `[q; k; v]`.
    Concat,
    /// GPT-NeoX `query_key_value` `[3·hidden, hidden]`: per head `h`, rows
    /// `[q_h; k_h; v_h]` (HF views it as `(heads, 3·head_dim)`).
    PerHeadInterleaved,
    /// GPT-2 `c_attn` Conv1D `[hidden, 3·hidden]`: columns `[q | k | v]` (transpose, then Concat).
    Conv1dConcat,
}

/// Per-family answers for the forward pass. Default methods read the [`ModelConfig`]; families
/// override what differs. `layer` is 0-based and always `< num_layers()`.
pub trait ModelArchitecture: Send + Sync {
    fn config(&self) -> &ModelConfig;
    /// Family name (HF `model_type`).
    fn family(&self) -> &str {
        &self.config().model_type
    }
    fn num_layers(&self) -> usize {
        self.config().num_hidden_layers
    }
    fn hidden_size(&self) -> usize {
        self.config().hidden_size
    }
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }
    fn norm_eps(&self) -> f64 {
        self.config().norm_eps
    }
    fn head_dim_for_layer(&self, _layer: usize) -> usize {
        self.config().head_dim
    }
    fn num_q_heads_for_layer(&self, _layer: usize) -> usize {
        self.config().num_attention_heads
    }
    fn num_kv_heads_for_layer(&self, _layer: usize) -> usize {
        self.config().num_key_value_heads
    }
    fn intermediate_size_for_layer(&self, _layer: usize) -> usize {
        self.config().intermediate_size
    }
    /// RoPE base of this layer (Gemma-3: local base on sliding layers).
    fn rope_base_for_layer(&self, layer: usize) -> f64;
    /// RoPE scaling applied on this layer, if any.
    fn rope_scaling_for_layer(&self, layer: usize) -> Option<RopeScaling>;
    /// Fraction of head_dim rotated by RoPE (1.0 = all).
    fn rotary_fraction_for_layer(&self, _layer: usize) -> f64 {
        self.config().partial_rotary_factor
    }
    /// True when RoPE rotates interleaved pairs (GPT-J style); false for HF's rotate_half.
    fn rope_interleaved(&self) -> bool {
        false
    }
    /// Learned absolute position embeddings (GPT-2) instead of RoPE.
    fn has_learned_positions(&self) -> bool {
        false
    }
    /// RoPE rotates q and k in this layer (false for learned positions, and for Cohere-2's
    /// global layers, which have no positional encoding).
    fn has_rope_for_layer(&self, _layer: usize) -> bool {
        !self.has_learned_positions()
    }
    /// Multiplier on QKᵀ before softmax (`head_dim^-0.5`, Gemma `query_pre_attn_scalar^-0.5`,
    /// Granite `attention_multiplier`).
    fn attention_scale_for_layer(&self, layer: usize) -> f64;
    /// Sliding-window size for this layer, `None` for full attention.
    fn sliding_window_for_layer(&self, layer: usize) -> Option<usize>;
    fn attn_logit_softcap(&self) -> Option<f64> {
        self.config().attn_logit_softcapping
    }
    fn final_logit_softcap(&self) -> Option<f64> {
        self.config().final_logit_softcapping
    }
    fn norm_type(&self) -> NormType {
        NormType::RmsNorm
    }
    /// Added to RMSNorm weights at run time (Gemma's `x·(1 + w)`: 1.0; otherwise 0.0).
    fn norm_weight_offset(&self) -> f32 {
        0.0
    }
    /// Norm applied to the input of attention (false for OLMo-2, post-norm only).
    fn has_pre_attn_norm(&self) -> bool {
        true
    }
    /// Norm on the attention output before the residual add (Gemma-2/3, OLMo-2).
    fn has_post_attn_norm(&self) -> bool {
        false
    }
    /// Norm on the FFN input (false for parallel-residual families that share the input norm,
    /// and for OLMo-2).
    fn has_pre_ffn_norm(&self) -> bool {
        true
    }
    /// Norm on the FFN output before the residual add (Gemma-2/3, OLMo-2).
    fn has_post_ffn_norm(&self) -> bool {
        false
    }
    /// Per-head RMSNorm on q and k (Qwen3, Gemma-3).
    fn has_qk_norm(&self) -> bool {
        false
    }
    /// q/k norm over the whole projection (OLMo-2) rather than per head.
    fn qk_norm_whole_projection(&self) -> bool {
        false
    }
    fn has_v_norm(&self) -> bool {
        false
    }
    /// Attention and FFN read the same normed input and both add to the residual (phi, GPT-NeoX).
    fn parallel_residual(&self) -> bool {
        self.config().use_parallel_residual
    }
    fn ffn_type(&self) -> FfnType {
        FfnType::Gated
    }
    fn activation(&self) -> Activation;
    /// Multiplier on the token embeddings (Gemma `sqrt(hidden)`, Granite `embedding_multiplier`).
    fn embedding_scale(&self) -> f32 {
        1.0
    }
    /// Multiplier on each residual branch before it is added (Granite `residual_multiplier`).
    fn residual_multiplier(&self) -> f32 {
        1.0
    }
    /// Logits are divided by this (Granite `logits_scaling`; Cohere-2 `1 / logit_scale`).
    fn logits_divisor(&self) -> f32 {
        1.0
    }
    /// The experts' clamped SwiGLU `(limit, alpha)` (gpt-oss `swiglu_limit`, `swiglu_alpha`):
    /// `(min(up, limit).max(−limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`
    /// instead of `act(gate) · up`. `None`: the plain gated activation.
    fn clamped_swiglu(&self) -> Option<(f64, f64)> {
        None
    }
    /// Weight key of a per-layer output scalar, if the family has one (none of the 19 do yet).
    fn layer_scalar_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// MoE: number of experts in this layer (0 = dense FFN).
    fn num_experts_for_layer(&self, _layer: usize) -> usize {
        self.config().num_experts
    }
    fn num_experts_per_tok(&self) -> usize {
        self.config().num_experts_per_tok
    }
    /// Map a source tensor's HF name to the canonical (Llama-style) name stored in a vindex,
    /// or `None` to drop it (e.g. rotary inv_freq buffers). Identity for Llama-named families.
    /// Only the name: see [`ModelArchitecture::source_transform`] for tensors whose data must
    /// also be transposed or split (GPT-2 Conv1D, fused qkv / gate_up).
    fn canonical_name(&self, hf_name: &str) -> Option<String> {
        Some(hf_name.to_string())
    }
    /// What must be done to the data of the source tensor `hf_name` at extract time.
    fn source_transform(&self, _hf_name: &str) -> TensorTransform {
        TensorTransform::AsIs
    }
    /// Inverse of [`ModelArchitecture::canonical_name`]: the HF checkpoint name of the tensor
    /// holding the canonical tensor `canonical` (for a part of a fused projection, the fused
    /// tensor's name, whose [`ModelArchitecture::source_transform`] splits it again). Used to
    /// write a HF folder back from a vindex. Identity for Llama-named families.
    fn source_name(&self, canonical: &str) -> String {
        canonical.to_string()
    }

    // ---- Canonical tensor keys the forward pass reads (Llama-style HF names). ----
    // Weights are `[out, in]` (Linear layout), norms `[hidden]` (or `[head_dim]` for per-head
    // q/k norms, `[H·head_dim]` / `[KV·head_dim]` for whole-projection q/k norms).

    /// Token embedding `[vocab, hidden]`.
    fn embed_key(&self) -> String {
        "model.embed_tokens.weight".into()
    }
    /// Learned absolute position embedding `[max_positions, hidden]` (GPT-2), if any.
    fn position_embed_key(&self) -> Option<String> {
        None
    }
    /// Final norm weight `[hidden]`.
    fn final_norm_key(&self) -> String {
        "model.norm.weight".into()
    }
    /// Output projection `[vocab, hidden]`: `lm_head.weight`, or the embedding key when the
    /// config ties them (`tie_word_embeddings`).
    fn lm_head_key(&self) -> String {
        if self.config().tie_word_embeddings {
            self.embed_key()
        } else {
            "lm_head.weight".into()
        }
    }
    /// Output projection bias `[vocab]` (phi), if any.
    fn lm_head_bias_key(&self) -> Option<String> {
        None
    }
    fn attn_q_key(&self, layer: usize) -> String {
        format!("model.layers.{layer}.self_attn.q_proj.weight")
    }
    fn attn_k_key(&self, layer: usize) -> String {
        format!("model.layers.{layer}.self_attn.k_proj.weight")
    }
    fn attn_v_key(&self, layer: usize) -> String {
        format!("model.layers.{layer}.self_attn.v_proj.weight")
    }
    fn attn_o_key(&self, layer: usize) -> String {
        format!("model.layers.{layer}.self_attn.o_proj.weight")
    }
    /// q/k/v biases (`[H·head_dim]`, `[KV·head_dim]`), when the family has them.
    fn attn_q_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    fn attn_k_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    fn attn_v_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// Attention output bias `[hidden]` (not Qwen2, whose o_proj has none).
    fn attn_o_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// Attention sinks `[num_q_heads]` (gpt-oss `self_attn.sinks`), if the family has them.
    fn attn_sinks_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// q norm weight (per head `[head_dim]`, or whole projection for OLMo-2).
    fn q_norm_key(&self, _layer: usize) -> Option<String> {
        None
    }
    fn k_norm_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// Norm on the attention input (HF `input_layernorm`); `None` for OLMo-2.
    fn pre_attn_norm_key(&self, layer: usize) -> Option<String> {
        Some(format!("model.layers.{layer}.input_layernorm.weight"))
    }
    /// Norm on the attention output before the residual add. Gemma-2/3 and OLMo-2 name it
    /// `post_attention_layernorm`; Llama has none.
    fn post_attn_norm_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// Norm on the FFN input. Trap: in Llama-style families it is HF's
    /// `post_attention_layernorm`; in Gemma-2/3 it is `pre_feedforward_layernorm`.
    fn pre_ffn_norm_key(&self, layer: usize) -> Option<String> {
        Some(format!(
            "model.layers.{layer}.post_attention_layernorm.weight"
        ))
    }
    /// Norm on the FFN output before the residual add (Gemma-2/3, OLMo-2).
    fn post_ffn_norm_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// The bias of a LayerNorm whose weight key is `norm_weight_key` (same key with `.bias`);
    /// `None` for RMSNorm families.
    fn norm_bias_key(&self, norm_weight_key: &str) -> Option<String> {
        match self.norm_type() {
            NormType::LayerNorm => norm_weight_key
                .strip_suffix(".weight")
                .map(|stem| format!("{stem}.bias")),
            NormType::RmsNorm => None,
        }
    }
    /// Dense FFN gate `[intermediate, hidden]`; `None` for [`FfnType::Standard`].
    fn ffn_gate_key(&self, layer: usize) -> Option<String> {
        Some(format!("model.layers.{layer}.mlp.gate_proj.weight"))
    }
    /// Dense FFN up `[intermediate, hidden]` (the only input projection of a Standard FFN).
    fn ffn_up_key(&self, layer: usize) -> String {
        format!("model.layers.{layer}.mlp.up_proj.weight")
    }
    /// Dense FFN down `[hidden, intermediate]`.
    fn ffn_down_key(&self, layer: usize) -> String {
        format!("model.layers.{layer}.mlp.down_proj.weight")
    }
    fn ffn_gate_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    fn ffn_up_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    fn ffn_down_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }

    // ---- MoE (canonical = Qwen2-MoE names; Mixtral's are mapped). ----

    /// Router `[num_experts, hidden]` (softmax over experts, top `num_experts_per_tok`).
    fn moe_router_key(&self, layer: usize) -> Option<String> {
        (self.num_experts_for_layer(layer) > 0)
            .then(|| format!("model.layers.{layer}.mlp.gate.weight"))
    }
    /// Router bias `[num_experts]` added to the router logits (gpt-oss), if any.
    fn moe_router_bias_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// Expert `e`'s gate, up (`[moe_intermediate]`) and down (`[hidden]`) biases (gpt-oss).
    fn expert_bias_keys(&self, _layer: usize, _expert: usize) -> Option<[String; 3]> {
        None
    }
    /// Expert `e` gate/up `[moe_intermediate, hidden]`, down `[hidden, moe_intermediate]`.
    fn expert_gate_key(&self, layer: usize, expert: usize) -> String {
        format!("model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight")
    }
    fn expert_up_key(&self, layer: usize, expert: usize) -> String {
        format!("model.layers.{layer}.mlp.experts.{expert}.up_proj.weight")
    }
    fn expert_down_key(&self, layer: usize, expert: usize) -> String {
        format!("model.layers.{layer}.mlp.experts.{expert}.down_proj.weight")
    }
    /// Width of the always-on shared expert (Qwen2-MoE), if any.
    fn shared_expert_intermediate_size(&self) -> Option<usize> {
        None
    }
    /// Shared expert (gate, up, down) keys, Qwen2-MoE.
    fn shared_expert_keys(&self, _layer: usize) -> Option<[String; 3]> {
        None
    }
    /// Shared expert's sigmoid gate `[1, hidden]` (Qwen2-MoE `shared_expert_gate`).
    fn shared_expert_gate_key(&self, _layer: usize) -> Option<String> {
        None
    }
    /// Whether top-k router weights are renormalised to sum to 1 (Mixtral: always).
    fn norm_topk_prob(&self) -> bool {
        self.config().norm_topk_prob
    }
}

/// Build the architecture for a config. Errors (as a message) on an unknown `model_type`;
/// callers wrap it with the file name.
pub fn architecture_for(config: &ModelConfig) -> Result<Box<dyn ModelArchitecture>, String> {
    let family = Family::from_model_type(&config.model_type).ok_or_else(|| {
        format!(
            "unknown model_type '{}' (supported: {})",
            config.model_type,
            SUPPORTED_MODEL_TYPES.join(", ")
        )
    })?;
    FamilyArch::new(family, config.clone()).map(|a| Box::new(a) as Box<dyn ModelArchitecture>)
}

/// HF `model_type` values this build knows.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "starcoder2",
    "phi3",
    "gpt_neox",
    "granite",
    "olmo2",
    "gpt2",
    "phi",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "cohere2",
    "gpt_oss",
];
