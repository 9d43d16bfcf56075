//! Typed model config: one struct for every supported family, parsed from HF `config.json`
//! (transformers v4 layout `rope_theta`/`rope_scaling` and v5 layout `rope_parameters`) or
//! from GGUF metadata (see `gguf.rs`).
//!
//! Every field here affects the forward pass unless listed in [`ModelConfig::EXEMPT_FIELDS`];
//! the vindex persists the whole struct (serde) in `index.json`.

use serde::{Deserialize, Serialize};

/// RoPE frequency scaling (HF `rope_scaling` / `rope_parameters.rope_type`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Positions divided by `factor` (HF `linear`).
    Linear { factor: f64 },
    /// Llama-3 wavelength-band scaling (HF `_compute_llama3_parameters`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// Attention kind of one layer (HF `layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Full causal attention (HF `full_attention`).
    Full,
    /// Causal attention limited to the last `sliding_window` positions (HF `sliding_attention`).
    Sliding,
}

/// The typed config of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// HF `model_type` (`llama`, `gemma3_text`, `gpt_neox`, …). GGUF `gemma3` maps to `gemma3_text`.
    pub model_type: String,
    pub hidden_size: usize,
    /// FFN width (dense MLP); for MoE models the dense/expert width HF calls `intermediate_size`.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// KV heads (GQA/MQA); equals `num_attention_heads` when the config omits it.
    pub num_key_value_heads: usize,
    /// Per-head dimension: explicit `head_dim` or `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// `rms_norm_eps` / `layer_norm_eps` / `layer_norm_epsilon` / `norm_epsilon`.
    pub norm_eps: f64,
    /// RoPE base of full-attention layers (HF `rope_theta`).
    pub rope_theta: f64,
    /// RoPE base of sliding layers when it differs (Gemma-3 `rope_local_base_freq`, 1e4).
    pub rope_local_theta: Option<f64>,
    /// RoPE scaling of full-attention layers (Gemma-3 applies it on global layers only).
    pub rope_scaling: Option<RopeScaling>,
    /// Fraction of head_dim that is rotated (phi, gpt_neox, phi3 partial rotary); 1.0 otherwise.
    pub partial_rotary_factor: f64,
    /// Sliding-window size in positions, when any layer slides.
    pub sliding_window: Option<usize>,
    /// Per-layer attention kind, `num_hidden_layers` long (from `layer_types`, the sliding-window
    /// pattern, or "all sliding" for Mistral-style configs).
    pub layer_types: Vec<LayerKind>,
    /// HF `hidden_act` / `hidden_activation` / `activation_function` string (`silu`,
    /// `gelu_pytorch_tanh`, `gelu_new`, `gelu`).
    pub hidden_act: String,
    pub tie_word_embeddings: bool,
    /// q/k/v (and o for some families) Linear layers carry biases.
    pub attention_bias: bool,
    /// FFN Linear layers carry biases.
    pub mlp_bias: bool,
    /// Gemma-2/3: attention scale is `query_pre_attn_scalar^-0.5` instead of `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    /// Granite multipliers.
    pub embedding_multiplier: Option<f64>,
    pub attention_multiplier: Option<f64>,
    pub residual_multiplier: Option<f64>,
    pub logits_scaling: Option<f64>,
    /// GPT-NeoX / phi: attention and MLP read the same input and are summed.
    pub use_parallel_residual: bool,
    /// MoE (mixtral `num_local_experts`, qwen2_moe `num_experts`); 0 for dense models.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: Option<usize>,
    pub shared_expert_intermediate_size: Option<usize>,
    pub norm_topk_prob: bool,
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (HF `eos_token_id` may be an int or a list).
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
}

impl ModelConfig {
    /// Fields that do not change the forward pass (kept for tokenization/generation only).
    pub const EXEMPT_FIELDS: &'static [&'static str] = &[
        "bos_token_id",
        "eos_token_ids",
        "pad_token_id",
        "max_position_embeddings",
    ];
}
