//! Typed model config: one struct for every supported family, parsed from HF `config.json`
//! (transformers v4 layout `rope_theta`/`rope_scaling` and v5 layout `rope_parameters`) or
//! from GGUF metadata (see `gguf.rs`).
//!
//! Every field here affects the forward pass unless listed in [`ModelConfig::EXEMPT_FIELDS`];
//! the vindex persists the whole struct (serde) in `index.json`.

mod hf_out;
mod json;
pub mod limits;
mod rope;
pub(crate) mod validate;

pub(crate) use rope::yarn_mscale;
pub use validate::rotary_dim;

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::arch::SUPPORTED_MODEL_TYPES;
use crate::ModelError;
use json::Obj;

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
    /// YaRN (HF `_compute_yarn_parameters`, transformers 5): frequencies blended between
    /// `inv_freq / factor` and `inv_freq` over the correction range of `beta_fast`..`beta_slow`
    /// rotations within `original_max_position_embeddings`, and cos/sin multiplied by
    /// `attention_factor` (default `0.1 · ln(factor) + 1`).
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_max_position_embeddings: usize,
        /// The cos/sin multiplier (HF `attention_factor`, resolved at parse time).
        attention_factor: f64,
        /// Floor/ceil the correction range (HF `truncate`, default true; gpt-oss: false).
        truncate: bool,
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
    /// Cohere-2 `logit_scale`: the logits are multiplied by it.
    #[serde(default)]
    pub logit_scale: Option<f64>,
    /// gpt-oss clamped SwiGLU of the experts (`swiglu_limit`, default 7): gate clamped above
    /// at the limit, up to `[-limit, limit]`.
    #[serde(default)]
    pub swiglu_limit: Option<f64>,
    /// gpt-oss SwiGLU sigmoid gain (`swiglu_alpha`, default 1.702).
    #[serde(default)]
    pub swiglu_alpha: Option<f64>,
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

    /// Read and parse an HF `config.json` (see [`ModelConfig::from_hf_json`]).
    /// Errors: [`ModelError::Io`] / [`ModelError::Json`] naming the file, then as `from_hf_json`.
    pub fn from_hf_file(path: &Path) -> Result<Self, ModelError> {
        let text = crate::text::read_utf8(path).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        Self::from_hf_json(path, &json)
    }

    /// Parse an HF `config.json` value (`path` is only used in errors).
    ///
    /// Accepts the transformers v4 layout (`rope_theta`, `rope_scaling`, Gemma-3
    /// `rope_local_base_freq`/`sliding_window_pattern`) and the v5 layout (`rope_parameters`,
    /// flat or keyed by `full_attention`/`sliding_attention`; `layer_types`), and the family
    /// spellings (gpt2 `n_embd`/`n_head`/`n_layer`/`n_inner`/`n_positions`/`layer_norm_epsilon`/
    /// `activation_function`; gpt_neox `layer_norm_eps`/`rotary_pct`/`rotary_emb_base`;
    /// starcoder2 `norm_epsilon`/`use_bias`; mixtral `num_local_experts`; qwen2_moe
    /// `num_experts`/`qkv_bias`). Absent optional fields take the defaults of the family's
    /// transformers config class. A multimodal `gemma3` config is read from its `text_config`.
    ///
    /// Errors: [`ModelError::UnknownArchitecture`] for a `model_type` outside
    /// [`SUPPORTED_MODEL_TYPES`]; [`ModelError::MissingField`] naming a required field
    /// (`hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size`,
    /// `vocab_size` or the family's spelling); [`ModelError::BadField`] for wrong types,
    /// inconsistent sizes, unknown activations or unsupported RoPE types, and (see
    /// `config/validate.rs`) `max_position_embeddings` (gpt2 `n_positions`) = 0 or, for RoPE
    /// families, a rotary dimension `head_dim · partial_rotary_factor` that is not even, ≥ 2
    /// and ≤ head_dim, or a non-positive `rope_theta`.
    pub fn from_hf_json(path: &Path, json: &Value) -> Result<Self, ModelError> {
        let top = Obj::new(path, json, "")?;
        let model_type = top
            .opt_str("model_type")?
            .ok_or_else(|| top.missing("model_type"))?;
        if !SUPPORTED_MODEL_TYPES.contains(&model_type) {
            return Err(ModelError::UnknownArchitecture {
                path: path.to_path_buf(),
                model_type: model_type.to_string(),
                supported: SUPPORTED_MODEL_TYPES.join(", "),
            });
        }
        if model_type == "gemma3" {
            if let Some(text) = top.get("text_config") {
                let merged = merge_text_config(&top, text)?;
                let obj = Obj::new(path, &merged, "text_config.")?;
                return parse_family(&obj, "gemma3_text");
            }
            return parse_family(&top, "gemma3_text");
        }
        parse_family(&top, model_type)
    }
}

/// A multimodal Gemma-3 config: the text model's fields, with token ids from the top level
/// when the text config lacks them.
fn merge_text_config(top: &Obj, text: &Value) -> Result<Value, ModelError> {
    let mut map = text
        .as_object()
        .cloned()
        .ok_or_else(|| top.bad("text_config", "expected a JSON object"))?;
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if !map.contains_key(key) {
            if let Some(v) = top.get(key) {
                map.insert(key.to_string(), v.clone());
            }
        }
    }
    Ok(Value::Object(map))
}

/// Activation strings the forward pass implements.
const KNOWN_ACTIVATIONS: &[&str] = &[
    "silu",
    "swish",
    "gelu",
    "gelu_new",
    "gelu_pytorch_tanh",
    "gelu_fast",
];

fn parse_family(c: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mt = model_type;
    let gpt2 = mt == "gpt2";
    let gemma_family = matches!(mt, "gemma" | "gemma2" | "gemma3_text");

    let hidden_size = c.req_positive_any(if gpt2 {
        &["n_embd", "hidden_size"]
    } else {
        &["hidden_size"]
    })?;
    let num_hidden_layers = c.req_positive_any(if gpt2 {
        &["n_layer", "num_hidden_layers"]
    } else {
        &["num_hidden_layers"]
    })?;
    let num_attention_heads = c.req_positive_any(if gpt2 {
        &["n_head", "num_attention_heads"]
    } else {
        &["num_attention_heads"]
    })?;
    // Before anything is sized by them (the per-layer tables below, GPT-2's `4 * n_embd`).
    limits::check_sizes(
        c.path,
        &[
            (&c.name("hidden_size"), hidden_size, limits::MAX_WIDTH),
            (
                &c.name("num_hidden_layers"),
                num_hidden_layers,
                limits::MAX_COUNT,
            ),
            (
                &c.name("num_attention_heads"),
                num_attention_heads,
                limits::MAX_WIDTH,
            ),
        ],
    )?;
    let num_key_value_heads = c
        .opt_usize("num_key_value_heads")?
        .unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
        return Err(c.bad(
            "num_key_value_heads",
            format!(
                "{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"
            ),
        ));
    }
    let derived_head_dim = || {
        if hidden_size % num_attention_heads != 0 {
            Err(c.bad(
                "head_dim",
                format!(
                    "hidden size {hidden_size} is not a multiple of {num_attention_heads} heads"
                ),
            ))
        } else {
            Ok(hidden_size / num_attention_heads)
        }
    };
    let head_dim = match c.opt_usize("head_dim")? {
        Some(d) => d,
        None if !c.has("head_dim") && matches!(mt, "qwen3" | "qwen3_moe") => 128,
        None if !c.has("head_dim") && gemma_family => 256,
        None => derived_head_dim()?,
    };
    let intermediate_size = if gpt2 {
        c.opt_usize("n_inner")?.unwrap_or(4 * hidden_size)
    } else {
        c.req_usize("intermediate_size")?
    };
    let vocab_size = c.req_usize("vocab_size")?;
    let context_key = if gpt2 {
        "n_positions"
    } else {
        "max_position_embeddings"
    };
    let max_position_embeddings =
        c.opt_usize(context_key)?
            .unwrap_or(if gpt2 { 1024 } else { 2048 });

    let eps_keys = [
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "norm_epsilon",
    ];
    let eps_key = eps_keys
        .into_iter()
        .find(|k| c.has(k))
        .unwrap_or("rms_norm_eps");
    let norm_eps = c.opt_f64_any(&eps_keys)?.unwrap_or(match mt {
        "llama" | "mistral" | "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" | "gemma"
        | "gemma2" | "gemma3_text" | "granite" => 1e-6,
        _ => 1e-5,
    });

    let hidden_act = parse_activation(c, mt)?;
    check_unsupported_options(c, mt)?;
    let rope = rope::parse_rope(c, mt, max_position_embeddings)?;
    let (sliding_window, layer_types) = parse_layer_kinds(c, mt, num_hidden_layers)?;

    let tie_default = matches!(
        mt,
        "gemma" | "gemma2" | "gemma3_text" | "starcoder2" | "gpt2" | "cohere2"
    );
    let tie_word_embeddings = c.opt_bool("tie_word_embeddings")?.unwrap_or(tie_default);

    let (attention_bias, mlp_bias) = match mt {
        "qwen2" => (true, false),
        "qwen2_moe" => (c.opt_bool("qkv_bias")?.unwrap_or(true), false),
        "starcoder2" => {
            let b = c.opt_bool("use_bias")?.unwrap_or(true);
            (b, b)
        }
        "phi" | "gpt2" => (true, true),
        "gpt_neox" => (c.opt_bool("attention_bias")?.unwrap_or(true), true),
        // HF `GptOssConfig.attention_bias` defaults to true; the experts always carry biases.
        "gpt_oss" => (c.opt_bool("attention_bias")?.unwrap_or(true), false),
        "mistral" | "mixtral" | "phi3" => (false, false),
        _ => (
            c.opt_bool("attention_bias")?.unwrap_or(false),
            c.opt_bool("mlp_bias")?.unwrap_or(false),
        ),
    };

    let gemma23 = matches!(mt, "gemma2" | "gemma3_text");
    let query_pre_attn_scalar = if gemma23 {
        Some(c.opt_f64("query_pre_attn_scalar")?.unwrap_or(256.0))
    } else {
        None
    };
    // Present-but-null disables a soft-cap; absent takes the class default (Gemma-2: 50/30).
    let softcap = |key: &str, gemma2_default: f64| -> Result<Option<f64>, ModelError> {
        Ok(match mt {
            "gemma2" if !c.has(key) => Some(gemma2_default),
            "gemma2" | "gemma3_text" => c.opt_f64(key)?,
            _ => None,
        })
    };
    let attn_logit_softcapping = softcap("attn_logit_softcapping", 50.0)?;
    let final_logit_softcapping = softcap("final_logit_softcapping", 30.0)?;

    let granite_mult = |key: &str| -> Result<Option<f64>, ModelError> {
        Ok(if mt == "granite" {
            Some(c.opt_f64(key)?.unwrap_or(1.0))
        } else {
            None
        })
    };

    let use_parallel_residual = match mt {
        "gpt_neox" => c.opt_bool("use_parallel_residual")?.unwrap_or(true),
        "phi" | "cohere2" => true,
        _ => false,
    };

    let (num_experts, num_experts_per_tok, moe_intermediate_size, shared, norm_topk_prob) = match mt
    {
        "mixtral" => (
            c.opt_usize("num_local_experts")?.unwrap_or(8),
            c.opt_usize("num_experts_per_tok")?.unwrap_or(2),
            None,
            None,
            true,
        ),
        "qwen2_moe" => {
            check_qwen2_moe_sparse_layout(c)?;
            (
                c.opt_usize("num_experts")?.unwrap_or(60),
                c.opt_usize("num_experts_per_tok")?.unwrap_or(4),
                Some(c.opt_usize("moe_intermediate_size")?.unwrap_or(1408)),
                Some(
                    c.opt_usize("shared_expert_intermediate_size")?
                        .unwrap_or(5632),
                ),
                c.opt_bool("norm_topk_prob")?.unwrap_or(false),
            )
        }
        // HF `Qwen3MoeConfig` (`num_experts`; transformers 5 writes `num_local_experts`).
        "qwen3_moe" => {
            check_qwen2_moe_sparse_layout(c)?;
            let n = match c.opt_usize("num_experts")? {
                Some(n) => n,
                None => c.opt_usize("num_local_experts")?.unwrap_or(128),
            };
            (
                n,
                c.opt_usize("num_experts_per_tok")?.unwrap_or(8),
                Some(c.opt_usize("moe_intermediate_size")?.unwrap_or(768)),
                None,
                c.opt_bool("norm_topk_prob")?.unwrap_or(false),
            )
        }
        // HF `GptOssConfig`: the top-k router logits are softmaxed among themselves, which is
        // the renormalised top-k of the full softmax (`norm_topk_prob`).
        "gpt_oss" => (
            c.opt_usize("num_local_experts")?.unwrap_or(128),
            c.opt_usize("num_experts_per_tok")?.unwrap_or(4),
            None,
            None,
            true,
        ),
        _ => (0, 0, None, None, false),
    };
    let gpt_oss = |key: &str, default: f64| -> Result<Option<f64>, ModelError> {
        Ok(if mt == "gpt_oss" {
            Some(c.opt_f64(key)?.unwrap_or(default))
        } else {
            None
        })
    };
    let logit_scale = if mt == "cohere2" {
        Some(c.opt_f64("logit_scale")?.unwrap_or(0.0625))
    } else {
        None
    };

    let cfg = ModelConfig {
        model_type: mt.to_string(),
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size,
        max_position_embeddings,
        norm_eps,
        rope_theta: rope.theta,
        rope_local_theta: rope.local_theta,
        rope_scaling: rope.scaling,
        partial_rotary_factor: rope.partial_rotary_factor,
        sliding_window,
        layer_types,
        hidden_act,
        tie_word_embeddings,
        attention_bias,
        mlp_bias,
        query_pre_attn_scalar,
        attn_logit_softcapping,
        final_logit_softcapping,
        embedding_multiplier: granite_mult("embedding_multiplier")?,
        attention_multiplier: granite_mult("attention_multiplier")?,
        residual_multiplier: granite_mult("residual_multiplier")?,
        logits_scaling: granite_mult("logits_scaling")?,
        use_parallel_residual,
        num_experts,
        num_experts_per_tok,
        moe_intermediate_size,
        shared_expert_intermediate_size: shared,
        norm_topk_prob,
        logit_scale,
        swiglu_limit: gpt_oss("swiglu_limit", 7.0)?,
        swiglu_alpha: gpt_oss("swiglu_alpha", 1.702)?,
        bos_token_id: c.opt_u32("bos_token_id")?,
        eos_token_ids: c.u32_or_list("eos_token_id")?,
        pad_token_id: c.opt_u32("pad_token_id")?,
    };
    let names = validate::CheckedFields {
        context: c.name(context_key),
        rotary: c.name("partial_rotary_factor"),
        theta: c.name("rope_theta"),
        eps: c.name(eps_key),
        kv_heads: c.name("num_key_value_heads"),
        intermediate: c.name(if gpt2 { "n_inner" } else { "intermediate_size" }),
    };
    validate::check_config(&cfg, c.path, &names)?;
    Ok(cfg)
}

/// The activation string HF uses for the family: Gemma reads `hidden_activation` (HF ignores
/// Gemma's `hidden_act` and defaults to `gelu_pytorch_tanh`), gpt2 `activation_function`.
fn parse_activation(c: &Obj, mt: &str) -> Result<String, ModelError> {
    let (key, default) = match mt {
        "gemma" | "gemma2" | "gemma3_text" => ("hidden_activation", "gelu_pytorch_tanh"),
        "gpt2" => ("activation_function", "gelu_new"),
        "phi" => ("hidden_act", "gelu_new"),
        "gpt_neox" => ("hidden_act", "gelu"),
        "starcoder2" => ("hidden_act", "gelu_pytorch_tanh"),
        _ => ("hidden_act", "silu"),
    };
    let act = c.opt_str(key)?.unwrap_or(default);
    if !KNOWN_ACTIVATIONS.contains(&act) {
        return Err(c.bad(
            key,
            format!(
                "activation '{act}' is not supported (supported: {})",
                KNOWN_ACTIVATIONS.join(", ")
            ),
        ));
    }
    Ok(act.to_string())
}

/// Options of some families that change the forward pass and are not implemented:
/// gpt2 `scale_attn_weights: false` / `scale_attn_by_inverse_layer_idx: true`, phi
/// `qk_layernorm: true`.
fn check_unsupported_options(c: &Obj, mt: &str) -> Result<(), ModelError> {
    let unsupported = |key: &str, bad: bool| -> Result<(), ModelError> {
        match c.opt_bool(key)? {
            Some(v) if v == bad => Err(c.bad(key, format!("{bad} is not supported"))),
            _ => Ok(()),
        }
    };
    match mt {
        "gpt2" => {
            unsupported("scale_attn_weights", false)?;
            unsupported("scale_attn_by_inverse_layer_idx", true)
        }
        "phi" => unsupported("qk_layernorm", true),
        _ => Ok(()),
    }
}

/// Qwen2-MoE / Qwen3-MoE layers are sparse only where `(i+1) % decoder_sparse_step == 0` and `i` is not in
/// `mlp_only_layers`; only the all-sparse layout (step 1, no dense layers) is implemented.
fn check_qwen2_moe_sparse_layout(c: &Obj) -> Result<(), ModelError> {
    let step = c.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if step != 1 {
        return Err(c.bad(
            "decoder_sparse_step",
            "only 1 (every layer sparse) is supported",
        ));
    }
    match c.get("mlp_only_layers") {
        None => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(c.bad(
            "mlp_only_layers",
            "dense layers in a MoE model are not supported",
        )),
    }
}

/// Sliding-window size and per-layer attention kinds.
///
/// Window: `sliding_window` (`null`/0 → none); Qwen families need `use_sliding_window`; class
/// defaults when absent: Mistral, Gemma-2/3, Cohere-2 4096, gpt-oss 128. Kinds: `layer_types`
/// when present; otherwise Gemma-2 and gpt-oss alternate starting with sliding (HF v4
/// `not layer_idx % 2`), Gemma-3 and Cohere-2 slide except every `sliding_window_pattern`-th
/// layer (layer i full iff (i+1) % pattern == 0, default 6 and 4), Qwen slides from `max_window_layers` on, Mistral/Mixtral/Phi-3/StarCoder2 slide on every
/// layer. Families without sliding attention (Llama, Gemma, GPT-2, …) ignore the window.
/// When no window results, every layer is [`LayerKind::Full`].
fn parse_layer_kinds(
    c: &Obj,
    mt: &str,
    n_layers: usize,
) -> Result<(Option<usize>, Vec<LayerKind>), ModelError> {
    let qwen = matches!(mt, "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe");
    let window = match mt {
        "mistral" | "gemma2" | "gemma3_text" | "cohere2" if !c.has("sliding_window") => Some(4096),
        "gpt_oss" if !c.has("sliding_window") => Some(128),
        "mistral" | "mixtral" | "phi3" | "starcoder2" | "gemma2" | "gemma3_text" | "cohere2"
        | "gpt_oss" => c.opt_usize("sliding_window")?,
        _ if qwen => {
            if c.opt_bool("use_sliding_window")?.unwrap_or(false) {
                c.opt_usize("sliding_window")?
            } else {
                None
            }
        }
        _ => None,
    }
    .filter(|&w| w > 0);

    let Some(window) = window else {
        return Ok((None, vec![LayerKind::Full; n_layers]));
    };

    let kinds: Vec<LayerKind> = if let Some(v) = c.get("layer_types") {
        let arr = v
            .as_array()
            .ok_or_else(|| c.bad("layer_types", "expected a list"))?;
        let kinds = arr
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerKind::Full),
                Some("sliding_attention") => Ok(LayerKind::Sliding),
                _ => Err(c.bad("layer_types", format!("unknown layer type {t}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if kinds.len() != n_layers {
            return Err(c.bad(
                "layer_types",
                format!("{} entries for {n_layers} layers", kinds.len()),
            ));
        }
        kinds
    } else {
        match mt {
            "gemma2" | "gpt_oss" => (0..n_layers)
                .map(|i| {
                    if i % 2 == 0 {
                        LayerKind::Sliding
                    } else {
                        LayerKind::Full
                    }
                })
                .collect(),
            "gemma3_text" | "cohere2" => {
                let default = if mt == "cohere2" { 4 } else { 6 };
                let pattern = match c.opt_usize("sliding_window_pattern")? {
                    Some(p) => p,
                    None => c.opt_usize("_sliding_window_pattern")?.unwrap_or(default),
                };
                if pattern == 0 {
                    return Err(c.bad("sliding_window_pattern", "must be positive"));
                }
                (0..n_layers)
                    .map(|i| {
                        if (i + 1) % pattern == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Sliding
                        }
                    })
                    .collect()
            }
            _ if qwen => {
                let first = c.opt_usize("max_window_layers")?.unwrap_or(28);
                (0..n_layers)
                    .map(|i| {
                        if i >= first {
                            LayerKind::Sliding
                        } else {
                            LayerKind::Full
                        }
                    })
                    .collect()
            }
            _ => vec![LayerKind::Sliding; n_layers],
        }
    };
    if kinds.iter().all(|k| *k == LayerKind::Full) {
        return Ok((None, kinds));
    }
    Ok((Some(window), kinds))
}
