//! [`ModelArchitecture`]: every per-layer question of the forward pass, answered per family.
//!
//! The compute path never branches on `model_type`; it asks this trait. Tensor names returned
//! here are the canonical names a vindex stores (Llama-style HF names; families with other HF
//! names are mapped to these at extract time by [`ModelArchitecture::canonical_name`]).

use crate::{ModelConfig, RopeScaling};

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
    /// Logits are divided by this (Granite `logits_scaling`).
    fn logits_divisor(&self) -> f32 {
        1.0
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
    fn canonical_name(&self, hf_name: &str) -> Option<String> {
        Some(hf_name.to_string())
    }
}

/// Build the architecture for a config. Errors (as a message) on an unknown `model_type`;
/// callers wrap it with the file name.
pub fn architecture_for(config: &ModelConfig) -> Result<Box<dyn ModelArchitecture>, String> {
    let _ = config;
    todo!("filled in by the architecture work")
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
];
