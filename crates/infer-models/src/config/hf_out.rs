//! [`ModelConfig::to_hf_json`]: a Hugging Face `config.json` for a typed config, in each
//! family's own spelling (transformers v4 layout: `rope_theta` / `rope_scaling`, which
//! transformers 5 also reads), such that [`ModelConfig::from_hf_json`] gives the config back
//! unchanged.

use serde_json::{json, Map, Value};

use crate::{LayerKind, ModelConfig, RopeScaling};

/// The transformers model class of a `model_type` (`architectures` in `config.json`).
fn architecture(model_type: &str) -> &'static str {
    match model_type {
        "llama" => "LlamaForCausalLM",
        "mistral" => "MistralForCausalLM",
        "qwen2" => "Qwen2ForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "gemma" => "GemmaForCausalLM",
        "gemma2" => "Gemma2ForCausalLM",
        "gemma3_text" | "gemma3" => "Gemma3ForCausalLM",
        "starcoder2" => "Starcoder2ForCausalLM",
        "phi3" => "Phi3ForCausalLM",
        "gpt_neox" => "GPTNeoXForCausalLM",
        "granite" => "GraniteForCausalLM",
        "olmo2" => "Olmo2ForCausalLM",
        "gpt2" => "GPT2LMHeadModel",
        "phi" => "PhiForCausalLM",
        "mixtral" => "MixtralForCausalLM",
        "qwen2_moe" => "Qwen2MoeForCausalLM",
        "qwen3_moe" => "Qwen3MoeForCausalLM",
        "cohere2" => "Cohere2ForCausalLM",
        "gpt_oss" => "GptOssForCausalLM",
        _ => "AutoModelForCausalLM",
    }
}

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Null, Into::into)
}

fn layer_types(kinds: &[LayerKind]) -> Value {
    kinds
        .iter()
        .map(|k| match k {
            LayerKind::Full => "full_attention",
            LayerKind::Sliding => "sliding_attention",
        })
        .collect::<Vec<_>>()
        .into()
}

/// Gemma-3's `sliding_window_pattern` when `kinds` follows one (layer `i` full iff
/// `(i + 1) % p == 0`).
fn gemma3_pattern(kinds: &[LayerKind]) -> Option<usize> {
    (1..=kinds.len()).find(|&p| {
        kinds
            .iter()
            .enumerate()
            .all(|(i, k)| (*k == LayerKind::Full) == ((i + 1) % p == 0))
    })
}

impl ModelConfig {
    /// A HF `config.json` object for this config: `model_type`, `architectures`, the sizes,
    /// norm epsilon, activation, RoPE, sliding-window layout (`layer_types` whenever a layer
    /// slides), biases, soft-caps, multipliers, MoE sizes and token ids, each under the key the
    /// family's transformers config class reads (GPT-2 `n_embd`/`n_layer`/`n_head`/`n_inner`/
    /// `n_positions`/`layer_norm_epsilon`/`activation_function`; GPT-NeoX `rotary_pct`/
    /// `rotary_emb_base`; StarCoder2 `norm_epsilon`/`use_bias`; Gemma `hidden_activation`;
    /// Mixtral `num_local_experts`; …). `dtype` is written as `torch_dtype` (e.g. `float32`).
    ///
    /// [`ModelConfig::from_hf_json`] of the result equals `self` (tested on every archrefs case
    /// and on the GGUF-derived configs of the real models).
    pub fn to_hf_json(&self, dtype: &str) -> Value {
        let mt = self.model_type.as_str();
        let mt_out = if mt == "gemma3" { "gemma3_text" } else { mt };
        let gpt2 = mt == "gpt2";
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("architectures", json!([architecture(mt)]));
        put("model_type", json!(mt_out));
        put("torch_dtype", json!(dtype));
        if gpt2 {
            put("n_embd", json!(self.hidden_size));
            put("n_layer", json!(self.num_hidden_layers));
            put("n_head", json!(self.num_attention_heads));
            put("n_inner", json!(self.intermediate_size));
            put("n_positions", json!(self.max_position_embeddings));
            if self.head_dim * self.num_attention_heads != self.hidden_size {
                put("head_dim", json!(self.head_dim));
            }
        } else {
            put("hidden_size", json!(self.hidden_size));
            put("num_hidden_layers", json!(self.num_hidden_layers));
            put("num_attention_heads", json!(self.num_attention_heads));
            put("intermediate_size", json!(self.intermediate_size));
            put(
                "max_position_embeddings",
                json!(self.max_position_embeddings),
            );
            put("head_dim", json!(self.head_dim));
        }
        put("num_key_value_heads", json!(self.num_key_value_heads));
        put("vocab_size", json!(self.vocab_size));
        let eps_key = match mt {
            "gpt2" => "layer_norm_epsilon",
            "gpt_neox" | "phi" | "cohere2" => "layer_norm_eps",
            "starcoder2" => "norm_epsilon",
            _ => "rms_norm_eps",
        };
        put(eps_key, json!(self.norm_eps));
        match mt {
            "gemma" | "gemma2" | "gemma3_text" | "gemma3" => {
                put("hidden_activation", json!(self.hidden_act));
                put("hidden_act", json!(self.hidden_act));
            }
            "gpt2" => put("activation_function", json!(self.hidden_act)),
            _ => put("hidden_act", json!(self.hidden_act)),
        }
        put("tie_word_embeddings", json!(self.tie_word_embeddings));

        // RoPE.
        if mt == "gpt_neox" {
            put("rotary_emb_base", json!(self.rope_theta));
            put("rotary_pct", json!(self.partial_rotary_factor));
        } else {
            put("rope_theta", json!(self.rope_theta));
            if matches!(mt, "phi" | "phi3") || self.partial_rotary_factor != 1.0 {
                put("partial_rotary_factor", json!(self.partial_rotary_factor));
            }
        }
        if let Some(t) = self.rope_local_theta {
            put("rope_local_base_freq", json!(t));
        }
        put(
            "rope_scaling",
            match &self.rope_scaling {
                None => Value::Null,
                Some(RopeScaling::Linear { factor }) => {
                    json!({"rope_type": "linear", "factor": factor})
                }
                Some(RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                }) => json!({
                    "rope_type": "llama3", "factor": factor,
                    "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings,
                }),
                Some(RopeScaling::Yarn {
                    factor,
                    beta_fast,
                    beta_slow,
                    original_max_position_embeddings,
                    attention_factor,
                    truncate,
                }) => json!({
                    "rope_type": "yarn", "factor": factor,
                    "beta_fast": beta_fast, "beta_slow": beta_slow,
                    "original_max_position_embeddings": original_max_position_embeddings,
                    "attention_factor": attention_factor, "truncate": truncate,
                }),
            },
        );

        // Sliding-window layout.
        let window = self.sliding_window;
        match mt {
            "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" => {
                put("use_sliding_window", json!(window.is_some()));
                put("sliding_window", opt(window));
                if window.is_some() {
                    let first = self
                        .layer_types
                        .iter()
                        .position(|k| *k == LayerKind::Sliding)
                        .unwrap_or(self.num_hidden_layers);
                    put("max_window_layers", json!(first));
                    put("layer_types", layer_types(&self.layer_types));
                }
            }
            "mistral" | "mixtral" | "phi3" | "starcoder2" | "gemma2" | "gemma3_text" | "gemma3"
            | "cohere2" | "gpt_oss" => {
                put("sliding_window", opt(window));
                if window.is_some() {
                    put("layer_types", layer_types(&self.layer_types));
                    if matches!(mt, "gemma3_text" | "gemma3") {
                        if let Some(p) = gemma3_pattern(&self.layer_types) {
                            put("sliding_window_pattern", json!(p));
                        }
                    }
                }
            }
            _ => {}
        }

        // Biases.
        match mt {
            "qwen2" | "mistral" | "mixtral" | "phi3" | "phi" | "gpt2" => {}
            "qwen2_moe" => put("qkv_bias", json!(self.attention_bias)),
            "starcoder2" => put("use_bias", json!(self.attention_bias)),
            "gpt_neox" => put("attention_bias", json!(self.attention_bias)),
            _ => {
                put("attention_bias", json!(self.attention_bias));
                put("mlp_bias", json!(self.mlp_bias));
            }
        }

        // Family extras.
        if matches!(mt, "gemma2" | "gemma3_text" | "gemma3") {
            put("query_pre_attn_scalar", opt(self.query_pre_attn_scalar));
            put("attn_logit_softcapping", opt(self.attn_logit_softcapping));
            put("final_logit_softcapping", opt(self.final_logit_softcapping));
        }
        if mt == "granite" {
            put("embedding_multiplier", opt(self.embedding_multiplier));
            put("attention_multiplier", opt(self.attention_multiplier));
            put("residual_multiplier", opt(self.residual_multiplier));
            put("logits_scaling", opt(self.logits_scaling));
        }
        if mt == "gpt_neox" {
            put("use_parallel_residual", json!(self.use_parallel_residual));
        }
        if mt == "cohere2" {
            put("logit_scale", opt(self.logit_scale));
        }
        if mt == "gpt_oss" {
            put("swiglu_limit", opt(self.swiglu_limit));
            put("swiglu_alpha", opt(self.swiglu_alpha));
        }
        match mt {
            "mixtral" | "gpt_oss" => {
                put("num_local_experts", json!(self.num_experts));
                put("num_experts_per_tok", json!(self.num_experts_per_tok));
            }
            "qwen2_moe" | "qwen3_moe" => {
                put("num_experts", json!(self.num_experts));
                put("num_experts_per_tok", json!(self.num_experts_per_tok));
                put("moe_intermediate_size", opt(self.moe_intermediate_size));
                if mt == "qwen2_moe" {
                    put(
                        "shared_expert_intermediate_size",
                        opt(self.shared_expert_intermediate_size),
                    );
                }
                put("norm_topk_prob", json!(self.norm_topk_prob));
                put("decoder_sparse_step", json!(1));
                put("mlp_only_layers", json!([]));
            }
            _ => {}
        }

        // Token ids.
        put("bos_token_id", opt(self.bos_token_id));
        put(
            "eos_token_id",
            match self.eos_token_ids.as_slice() {
                [] => Value::Null,
                [one] => json!(one),
                many => json!(many),
            },
        );
        put("pad_token_id", opt(self.pad_token_id));
        Value::Object(m)
    }
}
