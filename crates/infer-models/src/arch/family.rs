//! The one [`ModelArchitecture`] implementation: a [`ModelConfig`] plus its [`Family`], whose
//! differences from the Llama defaults of the trait follow HF transformers' modeling files.

use super::{names, Activation, FfnType, ModelArchitecture, NormType, TensorTransform};
use crate::{LayerKind, ModelConfig, RopeScaling};

/// Supported model families (HF `model_type`; `gemma3` and `gemma3_text` are one family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma,
    Gemma2,
    Gemma3,
    Starcoder2,
    Phi3,
    GptNeox,
    Granite,
    Olmo2,
    Gpt2,
    Phi,
    Mixtral,
    Qwen2Moe,
    /// Qwen3 attention (per-head q/k RMSNorm) + many-expert top-k MoE (`norm_topk_prob`), no
    /// shared expert (HF `Qwen3MoeForCausalLM`).
    Qwen3Moe,
    /// Parallel attention + gated FFN from one bias-free LayerNorm, interleaved RoPE on the
    /// sliding layers only, `logit_scale` on the logits (HF `Cohere2ForCausalLM`).
    Cohere2,
    /// Attention sinks, biases, YaRN, alternating sliding/full layers; MoE with a biased
    /// router, biased experts and a clamped SwiGLU (HF `GptOssForCausalLM`).
    GptOss,
}

impl Family {
    /// The family of an HF `model_type`, `None` when unsupported.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Some(match model_type {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma" => Family::Gemma,
            "gemma2" => Family::Gemma2,
            "gemma3_text" | "gemma3" => Family::Gemma3,
            "starcoder2" => Family::Starcoder2,
            "phi3" => Family::Phi3,
            "gpt_neox" => Family::GptNeox,
            "granite" => Family::Granite,
            "olmo2" => Family::Olmo2,
            "gpt2" => Family::Gpt2,
            "phi" => Family::Phi,
            "mixtral" => Family::Mixtral,
            "qwen2_moe" => Family::Qwen2Moe,
            "qwen3_moe" => Family::Qwen3Moe,
            "cohere2" => Family::Cohere2,
            "gpt_oss" => Family::GptOss,
            _ => return None,
        })
    }

    fn is_gemma(self) -> bool {
        matches!(self, Family::Gemma | Family::Gemma2 | Family::Gemma3)
    }

    /// Gemma-2/3 and OLMo-2 norm the attention and FFN outputs before the residual add.
    fn has_post_norms(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3 | Family::Olmo2)
    }

    /// LayerNorm + non-gated MLP families.
    fn is_layernorm(self) -> bool {
        matches!(
            self,
            Family::Starcoder2 | Family::GptNeox | Family::Gpt2 | Family::Phi
        )
    }
}

/// A config answered per its family (see the trait for what each method means).
pub struct FamilyArch {
    cfg: ModelConfig,
    family: Family,
    activation: Activation,
}

impl FamilyArch {
    /// Check the config is consistent for the family. Errors (as a message): unknown
    /// activation, `layer_types` length ≠ layer count, Gemma-2/3 without
    /// `query_pre_attn_scalar`, a sliding layer without a window, Granite without its
    /// attention multiplier.
    pub fn new(family: Family, cfg: ModelConfig) -> Result<Self, String> {
        let activation = match cfg.hidden_act.as_str() {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            other => {
                return Err(format!(
                    "{}: unsupported activation '{other}'",
                    cfg.model_type
                ))
            }
        };
        if cfg.layer_types.len() != cfg.num_hidden_layers {
            return Err(format!(
                "{}: layer_types has {} entries for {} layers",
                cfg.model_type,
                cfg.layer_types.len(),
                cfg.num_hidden_layers
            ));
        }
        if cfg.layer_types.contains(&LayerKind::Sliding) && cfg.sliding_window.is_none() {
            return Err(format!(
                "{}: sliding layers but no sliding_window",
                cfg.model_type
            ));
        }
        if matches!(family, Family::Gemma2 | Family::Gemma3) && cfg.query_pre_attn_scalar.is_none()
        {
            return Err(format!(
                "{}: query_pre_attn_scalar is required",
                cfg.model_type
            ));
        }
        if family == Family::Granite && cfg.attention_multiplier.is_none() {
            return Err("granite: attention_multiplier is required".into());
        }
        if family == Family::Cohere2 && !cfg.logit_scale.is_some_and(|s| s.is_finite() && s != 0.0)
        {
            return Err(format!(
                "cohere2: logit_scale {:?} must be a non-zero number",
                cfg.logit_scale
            ));
        }
        let positive = |v: Option<f64>| v.is_some_and(|v| v.is_finite() && v > 0.0);
        if family == Family::GptOss && !(positive(cfg.swiglu_limit) && positive(cfg.swiglu_alpha)) {
            return Err(format!(
                "gpt_oss: swiglu_limit {:?} and swiglu_alpha {:?} must be positive numbers",
                cfg.swiglu_limit, cfg.swiglu_alpha
            ));
        }
        if cfg.num_attention_heads == 0 || cfg.num_key_value_heads == 0 || cfg.head_dim == 0 {
            return Err(format!("{}: zero heads or head_dim", cfg.model_type));
        }
        Ok(FamilyArch {
            cfg,
            family,
            activation,
        })
    }

    /// The family this architecture answers for.
    pub fn family_kind(&self) -> Family {
        self.family
    }

    fn layer(&self, layer: usize, rest: &str) -> String {
        format!("model.layers.{layer}.{rest}")
    }

    /// q/k/v biases exist (`attention_bias`; Qwen2 always, qwen2_moe `qkv_bias`).
    fn qkv_bias(&self, layer: usize, which: &str) -> Option<String> {
        self.cfg
            .attention_bias
            .then(|| self.layer(layer, &format!("self_attn.{which}_proj.bias")))
    }
}

impl ModelArchitecture for FamilyArch {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn intermediate_size_for_layer(&self, layer: usize) -> usize {
        match (self.family, self.num_experts_for_layer(layer) > 0) {
            (Family::Qwen2Moe | Family::Qwen3Moe, true) => self
                .cfg
                .moe_intermediate_size
                .unwrap_or(self.cfg.intermediate_size),
            _ => self.cfg.intermediate_size,
        }
    }

    /// Gemma-3: `rope_local_theta` on sliding layers, `rope_theta` on full ones (HF
    /// `Gemma3RotaryEmbedding` per layer type). Others: `rope_theta` everywhere.
    fn rope_base_for_layer(&self, layer: usize) -> f64 {
        if self.family == Family::Gemma3 && self.cfg.layer_types[layer] == LayerKind::Sliding {
            self.cfg.rope_local_theta.unwrap_or(self.cfg.rope_theta)
        } else {
            self.cfg.rope_theta
        }
    }

    /// Gemma-3 scales RoPE on full-attention layers only; GPT-2 has no RoPE.
    fn rope_scaling_for_layer(&self, layer: usize) -> Option<RopeScaling> {
        match self.family {
            Family::Gpt2 => None,
            Family::Gemma3 if self.cfg.layer_types[layer] == LayerKind::Sliding => None,
            _ => self.cfg.rope_scaling.clone(),
        }
    }

    /// 0.0 for GPT-2 (no RoPE); `partial_rotary_factor` otherwise.
    fn rotary_fraction_for_layer(&self, _layer: usize) -> f64 {
        match self.family {
            Family::Gpt2 => 0.0,
            _ => self.cfg.partial_rotary_factor,
        }
    }

    fn has_learned_positions(&self) -> bool {
        self.family == Family::Gpt2
    }

    /// Cohere-2 rotates only on sliding layers (HF `Cohere2Attention`: `apply_rotary_pos_emb`
    /// when `sliding_window` is set); GPT-2 never.
    fn has_rope_for_layer(&self, layer: usize) -> bool {
        match self.family {
            Family::Gpt2 => false,
            Family::Cohere2 => self.cfg.layer_types[layer] == LayerKind::Sliding,
            _ => true,
        }
    }

    /// Cohere-2 rotates pairs `(2i, 2i + 1)` (HF `modeling_cohere2.py` `rotate_half`).
    fn rope_interleaved(&self) -> bool {
        self.family == Family::Cohere2
    }

    /// `head_dim^-0.5`; Gemma-2/3 `query_pre_attn_scalar^-0.5`; Granite `attention_multiplier`.
    fn attention_scale_for_layer(&self, layer: usize) -> f64 {
        match self.family {
            Family::Gemma2 | Family::Gemma3 => {
                self.cfg.query_pre_attn_scalar.map_or(1.0, |s| s.powf(-0.5))
            }
            Family::Granite => self.cfg.attention_multiplier.unwrap_or(1.0),
            _ => (self.head_dim_for_layer(layer) as f64).powf(-0.5),
        }
    }

    fn sliding_window_for_layer(&self, layer: usize) -> Option<usize> {
        match self.cfg.layer_types[layer] {
            LayerKind::Sliding => self.cfg.sliding_window,
            LayerKind::Full => None,
        }
    }

    fn norm_type(&self) -> NormType {
        if self.family.is_layernorm() || self.family == Family::Cohere2 {
            NormType::LayerNorm
        } else {
            NormType::RmsNorm
        }
    }

    /// LayerNorm families' `.bias`; none for Cohere-2 (HF `Cohere2LayerNorm` has no bias).
    fn norm_bias_key(&self, norm_weight_key: &str) -> Option<String> {
        if self.norm_type() != NormType::LayerNorm || self.family == Family::Cohere2 {
            return None;
        }
        norm_weight_key
            .strip_suffix(".weight")
            .map(|stem| format!("{stem}.bias"))
    }

    fn norm_weight_offset(&self) -> f32 {
        if self.family.is_gemma() {
            1.0
        } else {
            0.0
        }
    }

    fn has_pre_attn_norm(&self) -> bool {
        self.family != Family::Olmo2
    }

    fn has_post_attn_norm(&self) -> bool {
        self.family.has_post_norms()
    }

    /// False for OLMo-2 (post-norm only), phi and Cohere-2 (attention and MLP share
    /// `input_layernorm`).
    fn has_pre_ffn_norm(&self) -> bool {
        !matches!(self.family, Family::Olmo2 | Family::Phi | Family::Cohere2)
    }

    fn has_post_ffn_norm(&self) -> bool {
        self.family.has_post_norms()
    }

    fn has_qk_norm(&self) -> bool {
        matches!(
            self.family,
            Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3 | Family::Olmo2
        )
    }

    fn qk_norm_whole_projection(&self) -> bool {
        self.family == Family::Olmo2
    }

    /// phi, Cohere-2: always; GPT-NeoX: `use_parallel_residual`.
    fn parallel_residual(&self) -> bool {
        match self.family {
            Family::Phi | Family::Cohere2 => true,
            Family::GptNeox => self.cfg.use_parallel_residual,
            _ => false,
        }
    }

    fn ffn_type(&self) -> FfnType {
        if self.family.is_layernorm() {
            FfnType::Standard
        } else {
            FfnType::Gated
        }
    }

    fn activation(&self) -> Activation {
        self.activation
    }

    /// Gemma: `sqrt(hidden)` (HF `Gemma*ScaledWordEmbedding`); Granite `embedding_multiplier`.
    fn embedding_scale(&self) -> f32 {
        if self.family.is_gemma() {
            (self.cfg.hidden_size as f32).sqrt()
        } else {
            self.cfg.embedding_multiplier.unwrap_or(1.0) as f32
        }
    }

    fn residual_multiplier(&self) -> f32 {
        self.cfg.residual_multiplier.unwrap_or(1.0) as f32
    }

    /// Granite `logits_scaling`; Cohere-2 `1 / logit_scale` (HF multiplies by `logit_scale`).
    fn logits_divisor(&self) -> f32 {
        match (self.family, self.cfg.logit_scale) {
            (Family::Cohere2, Some(s)) => (1.0 / s) as f32,
            _ => self.cfg.logits_scaling.unwrap_or(1.0) as f32,
        }
    }

    fn clamped_swiglu(&self) -> Option<(f64, f64)> {
        match (self.family, self.cfg.swiglu_limit, self.cfg.swiglu_alpha) {
            (Family::GptOss, Some(limit), Some(alpha)) => Some((limit, alpha)),
            _ => None,
        }
    }

    fn canonical_name(&self, hf_name: &str) -> Option<String> {
        names::canonical_name(self.family, hf_name)
    }

    fn source_transform(&self, hf_name: &str) -> TensorTransform {
        names::source_transform(self.family, hf_name)
    }

    fn source_name(&self, canonical: &str) -> String {
        names::source_name(self.family, canonical)
    }

    fn position_embed_key(&self) -> Option<String> {
        (self.family == Family::Gpt2).then(|| "model.embed_positions.weight".into())
    }

    fn lm_head_bias_key(&self) -> Option<String> {
        (self.family == Family::Phi).then(|| "lm_head.bias".into())
    }

    fn attn_q_bias_key(&self, layer: usize) -> Option<String> {
        self.qkv_bias(layer, "q")
    }

    fn attn_k_bias_key(&self, layer: usize) -> Option<String> {
        self.qkv_bias(layer, "k")
    }

    fn attn_v_bias_key(&self, layer: usize) -> Option<String> {
        self.qkv_bias(layer, "v")
    }

    /// With `attention_bias` (or `use_bias`), except Qwen2 / Qwen2-MoE whose o_proj has none.
    fn attn_o_bias_key(&self, layer: usize) -> Option<String> {
        match self.family {
            Family::Qwen2 | Family::Qwen2Moe => None,
            _ => self.qkv_bias(layer, "o"),
        }
    }

    fn attn_sinks_key(&self, layer: usize) -> Option<String> {
        (self.family == Family::GptOss).then(|| self.layer(layer, "self_attn.sinks"))
    }

    fn moe_router_bias_key(&self, layer: usize) -> Option<String> {
        (self.family == Family::GptOss && self.num_experts_for_layer(layer) > 0)
            .then(|| self.layer(layer, "mlp.gate.bias"))
    }

    fn expert_bias_keys(&self, layer: usize, expert: usize) -> Option<[String; 3]> {
        (self.family == Family::GptOss).then(|| {
            ["gate_proj", "up_proj", "down_proj"]
                .map(|p| self.layer(layer, &format!("mlp.experts.{expert}.{p}.bias")))
        })
    }

    fn q_norm_key(&self, layer: usize) -> Option<String> {
        self.has_qk_norm()
            .then(|| self.layer(layer, "self_attn.q_norm.weight"))
    }

    fn k_norm_key(&self, layer: usize) -> Option<String> {
        self.has_qk_norm()
            .then(|| self.layer(layer, "self_attn.k_norm.weight"))
    }

    fn pre_attn_norm_key(&self, layer: usize) -> Option<String> {
        self.has_pre_attn_norm()
            .then(|| self.layer(layer, "input_layernorm.weight"))
    }

    fn post_attn_norm_key(&self, layer: usize) -> Option<String> {
        self.has_post_attn_norm()
            .then(|| self.layer(layer, "post_attention_layernorm.weight"))
    }

    fn pre_ffn_norm_key(&self, layer: usize) -> Option<String> {
        match self.family {
            Family::Olmo2 | Family::Phi | Family::Cohere2 => None,
            Family::Gemma2 | Family::Gemma3 => {
                Some(self.layer(layer, "pre_feedforward_layernorm.weight"))
            }
            _ => Some(self.layer(layer, "post_attention_layernorm.weight")),
        }
    }

    fn post_ffn_norm_key(&self, layer: usize) -> Option<String> {
        self.has_post_ffn_norm()
            .then(|| self.layer(layer, "post_feedforward_layernorm.weight"))
    }

    fn ffn_gate_key(&self, layer: usize) -> Option<String> {
        (self.ffn_type() == FfnType::Gated).then(|| self.layer(layer, "mlp.gate_proj.weight"))
    }

    fn ffn_gate_bias_key(&self, layer: usize) -> Option<String> {
        (self.cfg.mlp_bias && self.ffn_type() == FfnType::Gated)
            .then(|| self.layer(layer, "mlp.gate_proj.bias"))
    }

    fn ffn_up_bias_key(&self, layer: usize) -> Option<String> {
        self.cfg
            .mlp_bias
            .then(|| self.layer(layer, "mlp.up_proj.bias"))
    }

    fn ffn_down_bias_key(&self, layer: usize) -> Option<String> {
        self.cfg
            .mlp_bias
            .then(|| self.layer(layer, "mlp.down_proj.bias"))
    }

    fn shared_expert_intermediate_size(&self) -> Option<usize> {
        self.cfg.shared_expert_intermediate_size
    }

    fn shared_expert_keys(&self, layer: usize) -> Option<[String; 3]> {
        (self.family == Family::Qwen2Moe).then(|| {
            ["gate_proj", "up_proj", "down_proj"]
                .map(|p| self.layer(layer, &format!("mlp.shared_expert.{p}.weight")))
        })
    }

    fn shared_expert_gate_key(&self, layer: usize) -> Option<String> {
        (self.family == Family::Qwen2Moe)
            .then(|| self.layer(layer, "mlp.shared_expert_gate.weight"))
    }
}
