//! GGUF metadata → [`ModelConfig`].
//!
//! Keys are llama.cpp's (`gguf-py/gguf/constants.py` `Keys`), prefixed by
//! `general.architecture`: `{arch}.block_count`, `{arch}.embedding_length`,
//! `{arch}.feed_forward_length`, `{arch}.context_length`, `{arch}.attention.head_count`,
//! `.head_count_kv`, `.key_length`, `.layer_norm_rms_epsilon`, `.sliding_window`,
//! `{arch}.rope.freq_base`, `.dimension_count`, `.scaling.type`, `.scaling.factor`,
//! `.freq_base_swa` and `{arch}.attention.sliding_window_pattern` (Gemma-2/3, Cohere-2),
//! `{arch}.logit_scale` (Cohere-2), and
//! `tokenizer.ggml.{bos,eos,padding}_token_id` (the end-of-generation ids are EOS then
//! `eot_token_id` and `eom_token_id`, as llama.cpp's `special_eog_ids`). What GGUF does not store comes from the family
//! defaults in `family.rs`.

use super::family::{family, supported, Family, Moe};
use super::{GgufArray, GgufFile, GgufValue};
use crate::config::limits::{MAX_COUNT, MAX_WIDTH};
use crate::config::validate::{check_config, CheckedFields};
use crate::config::yarn_mscale;
use crate::names::ROPE_FACTOR_TENSORS;
use crate::{LayerKind, ModelConfig, ModelError, RopeScaling};

/// `v` as the f64 of its shortest round-tripping decimal representation.
fn f32_to_f64_decimal(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(v as f64)
}

/// Typed metadata access with errors that name the file and key.
struct Meta<'a> {
    g: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn missing(&self, k: &str) -> ModelError {
        ModelError::MissingField {
            path: self.g.path().to_path_buf(),
            field: self.key(k),
        }
    }
    fn unsupported(&self, msg: String) -> ModelError {
        ModelError::Unsupported {
            path: self.g.path().to_path_buf(),
            msg,
        }
    }
    /// An optional `{arch}.k` integer; present with a non-integer type is an error.
    fn opt_usize(&self, k: &str) -> Result<Option<usize>, ModelError> {
        let key = self.key(k);
        match self.g.metadata(&key) {
            None => Ok(None),
            Some(_) => self
                .g
                .get_usize(&key)
                .map(Some)
                .ok_or_else(|| self.missing(k)),
        }
    }
    fn req_usize(&self, k: &str) -> Result<usize, ModelError> {
        self.opt_usize(k)?.ok_or_else(|| self.missing(k))
    }
    /// An optional `{arch}.k` float. An `f32` is widened through its shortest decimal form
    /// (f32 `1e-5` → f64 `1e-5`, not `9.99999974e-6`), recovering the decimal the converter
    /// wrote, so GGUF and HF configs of one model compare equal.
    fn opt_f64(&self, k: &str) -> Result<Option<f64>, ModelError> {
        let key = self.key(k);
        match self.g.metadata(&key) {
            None => Ok(None),
            Some(GgufValue::F32(v)) => Ok(Some(f32_to_f64_decimal(*v))),
            Some(_) => self
                .g
                .get_f64(&key)
                .map(Some)
                .ok_or_else(|| self.missing(k)),
        }
    }
    /// A `tokenizer.ggml.*` token id (absolute key).
    fn token_id(&self, key: &str) -> Result<Option<u32>, ModelError> {
        match self.g.metadata(key) {
            None => Ok(None),
            Some(_) => self
                .g
                .get_u32(key)
                .map(Some)
                .ok_or_else(|| ModelError::MissingField {
                    path: self.g.path().to_path_buf(),
                    field: key.to_string(),
                }),
        }
    }
}

/// Build the typed config of a GGUF model from its metadata and tensor shapes.
///
/// - `model_type` from `general.architecture` (`gemma3` → `gemma3_text`, `llama` with
///   `expert_count` → `mixtral`, `qwen3moe` → `qwen3_moe`); supported: llama, qwen2, qwen3,
///   qwen3moe, phi3, starcoder2, gemma, gemma2, cohere2, gpt-oss, gemma3.
/// - `head_dim` = `attention.key_length`, else `embedding_length / head_count`;
///   `num_key_value_heads` = `head_count_kv`, else `head_count`.
/// - `vocab_size` = rows of `token_embd.weight` (else length of `tokenizer.ggml.tokens`).
/// - `tie_word_embeddings` = no `output.weight` tensor; `attention_bias` / `mlp_bias` = the
///   layer-0 `attn_q.bias` / `ffn_up.bias` tensors exist.
/// - Family defaults (see `family.rs`): `hidden_act`, Gemma sliding pattern and local RoPE base,
///   Gemma `query_pre_attn_scalar` = key_length (hidden/heads for the 27B variants, as
///   llama.cpp does); gpt-oss's MoE (`expert_count`, `expert_used_count`, the experts' width
///   `expert_feed_forward_length`, top-k renormalised, SwiGLU limit 7 / alpha 1.702) and YaRN
///   without truncation; Mixtral's and Qwen3-MoE's (`expert_count`, `expert_used_count`, top-k
///   renormalised as llama.cpp's `build_moe_ffn(…, norm_w = true, …)`; the experts' width
///   `feed_forward_length` for Mixtral, `expert_feed_forward_length` as HF
///   `moe_intermediate_size` for Qwen3-MoE).
///
/// Errors: [`ModelError::UnknownArchitecture`] for another architecture;
/// [`ModelError::MissingField`] for a required key that is absent or mistyped (named
/// `{arch}.key`); [`ModelError::Unsupported`] for features this reader would otherwise get
/// silently wrong: MoE (`expert_count` > 0) outside llama, qwen3moe and gpt-oss, per-layer
/// FFN widths, RoPE scaling other than linear and YaRN, and RoPE frequency-factor tensors
/// (`rope_freqs`: Llama-3 scaling, LongRoPE); [`ModelError::BadField`] for
/// `{arch}.context_length` = 0, an `{arch}.expert_used_count` of 0 or above `expert_count`, a
/// `{arch}.rope.dimension_count` that is 0, odd or above head_dim, or a non-positive
/// `{arch}.rope.freq_base`.
pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig, ModelError> {
    let path = g.path().to_path_buf();
    let arch = g
        .get_str("general.architecture")
        .ok_or_else(|| ModelError::MissingField {
            path: path.clone(),
            field: "general.architecture".into(),
        })?;
    let fam: &Family = family(arch).ok_or_else(|| ModelError::UnknownArchitecture {
        path: path.clone(),
        model_type: arch.to_string(),
        supported: supported(),
    })?;
    let m = Meta { g, arch };

    let expert_count = m.opt_usize("expert_count")?.filter(|&n| n > 0);
    match (fam.moe, expert_count) {
        (Moe::Dense, Some(n)) => {
            return Err(m.unsupported(format!(
                "mixture-of-experts GGUF ({arch}.expert_count = {n}) is not supported for '{arch}'"
            )))
        }
        (Moe::GptOss | Moe::Softmax { required: true, .. }, None) => {
            return Err(m.missing("expert_count"))
        }
        _ => {}
    }
    // llama.cpp `load_hparams`: 0 < expert_used_count ≤ expert_count.
    let experts_used = match expert_count {
        Some(n) => {
            let k = m.req_usize("expert_used_count")?;
            if k == 0 || k > n {
                return Err(ModelError::BadField {
                    path: path.clone(),
                    field: m.key("expert_used_count"),
                    msg: format!("{k} experts used per token of {n}"),
                });
            }
            k
        }
        None => 0,
    };
    let model_type = match (fam.moe, expert_count) {
        (Moe::Softmax { model_type, .. }, Some(_)) => model_type,
        _ => fam.model_type,
    };
    if let Some(t) = g.tensor_infos().iter().find(|t| {
        ROPE_FACTOR_TENSORS
            .iter()
            .any(|r| t.name.strip_suffix(".weight") == Some(r))
    }) {
        return Err(m.unsupported(format!(
            "tensor '{}' holds RoPE frequency factors (Llama-3 / LongRoPE scaling), which this reader does not map to a config",
            t.name
        )));
    }
    if g.get_array(&m.key("feed_forward_length")).is_some() {
        return Err(m.unsupported(format!(
            "per-layer {arch}.feed_forward_length is not supported"
        )));
    }

    let hidden = m.req_usize("embedding_length")?;
    let n_layers = m.req_usize("block_count")?;
    let n_heads = m.req_usize("attention.head_count")?;
    if n_heads == 0 || n_layers == 0 || hidden == 0 {
        return Err(m.unsupported(format!(
            "{arch}: zero embedding_length, block_count or head_count"
        )));
    }
    // Before the per-layer tables below are sized by them.
    crate::config::limits::check_sizes(
        g.path(),
        &[
            (&m.key("embedding_length"), hidden, MAX_WIDTH),
            (&m.key("block_count"), n_layers, MAX_COUNT),
            (&m.key("attention.head_count"), n_heads, MAX_WIDTH),
        ],
    )?;
    let n_kv = m.opt_usize("attention.head_count_kv")?.unwrap_or(n_heads);
    let key_length = m.opt_usize("attention.key_length")?;
    let head_dim = key_length.unwrap_or(hidden / n_heads);
    let rotary = match m.opt_usize("rope.dimension_count")? {
        Some(d) if head_dim > 0 => d as f64 / head_dim as f64,
        _ => 1.0,
    };
    let eps = m
        .opt_f64(fam.eps_key)?
        .ok_or_else(|| m.missing(fam.eps_key))?;

    let rope_scaling = match g.get_str(&m.key("rope.scaling.type")) {
        None | Some("none") => None,
        Some("linear") => {
            let factor = m
                .opt_f64("rope.scaling.factor")?
                .ok_or_else(|| m.missing("rope.scaling.factor"))?;
            Some(RopeScaling::Linear { factor })
        }
        // llama.cpp's YaRN keys; the betas default to HF's 32 / 1, the cos/sin factor is HF's
        // `0.1 · ln(factor) + 1`.
        Some("yarn") => {
            let factor = m
                .opt_f64("rope.scaling.factor")?
                .ok_or_else(|| m.missing("rope.scaling.factor"))?;
            let original = m
                .opt_usize("rope.scaling.original_context_length")?
                .ok_or_else(|| m.missing("rope.scaling.original_context_length"))?;
            if !(factor.is_finite() && factor > 0.0) || original == 0 {
                return Err(m.unsupported(format!(
                    "{arch}.rope.scaling: YaRN factor {factor} over {original} positions"
                )));
            }
            Some(RopeScaling::Yarn {
                factor,
                beta_fast: m.opt_f64("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: m.opt_f64("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                original_max_position_embeddings: original,
                attention_factor: yarn_mscale(factor, 1.0),
                truncate: fam.yarn_truncate,
            })
        }
        Some(other) => {
            return Err(m.unsupported(format!(
                "{arch}.rope.scaling.type '{other}' is not supported (only linear and yarn)"
            )))
        }
    };

    let sliding_window = m.opt_usize("attention.sliding_window")?;
    // llama.cpp `load_swa_pattern`: one bool per layer (true: sliding), or a period, else the
    // family's period.
    let pattern_key = m.key("attention.sliding_window_pattern");
    let bad_pattern = |msg: String| ModelError::BadField {
        path: path.clone(),
        field: pattern_key.clone(),
        msg,
    };
    let (pattern, explicit): (Option<usize>, Option<Vec<LayerKind>>) =
        match g.metadata(&pattern_key) {
            None => (fam.sliding_pattern, None),
            Some(_) if fam.sliding_pattern.is_none() => {
                return Err(m.unsupported(format!(
                    "{pattern_key}: sliding-window patterns are not supported for '{arch}'"
                )))
            }
            Some(GgufValue::Array(GgufArray::Bool(is_swa))) => {
                if is_swa.len() != n_layers {
                    return Err(bad_pattern(format!(
                        "{} entries for {n_layers} layers",
                        is_swa.len()
                    )));
                }
                let kinds = is_swa
                    .iter()
                    .map(|&s| {
                        if s {
                            LayerKind::Sliding
                        } else {
                            LayerKind::Full
                        }
                    })
                    .collect();
                (fam.sliding_pattern, Some(kinds))
            }
            Some(_) => match m.opt_usize("attention.sliding_window_pattern") {
                Ok(Some(p)) if p > 0 => (Some(p), None),
                _ => {
                    return Err(bad_pattern(
                        "expected a positive period or one bool per layer".into(),
                    ))
                }
            },
        };
    let layer_types = match (pattern, sliding_window) {
        (Some(_), Some(_)) if explicit.is_some() => explicit.unwrap_or_default(),
        (Some(n), Some(_)) => (0..n_layers)
            .map(|i| {
                if (i + 1) % n == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding
                }
            })
            .collect(),
        // Mistral/Phi-3 style: the window applies to every layer.
        (None, Some(_)) => vec![LayerKind::Sliding; n_layers],
        (_, None) => vec![LayerKind::Full; n_layers],
    };

    let query_pre_attn_scalar = fam.query_pre_attn_scalar.then(|| {
        if fam.scale_by_hidden_per_head_at_layers == Some(n_layers) {
            (hidden / n_heads) as f64
        } else {
            head_dim as f64
        }
    });

    let vocab_size = match g.tensor_info("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1],
        _ => g
            .get_str_array("tokenizer.ggml.tokens")
            .map(|t| t.len())
            .ok_or_else(|| m.missing("vocab (token_embd.weight or tokenizer.ggml.tokens)"))?,
    };

    let mut eos: Vec<u32> = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = m.token_id(key)? {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let (intermediate_size, moe_intermediate_size) = match fam.moe {
        Moe::GptOss => match m.opt_usize("expert_feed_forward_length")? {
            Some(n) => (n, None),
            None => (m.req_usize("feed_forward_length")?, None),
        },
        Moe::Softmax {
            expert_width_key: true,
            ..
        } if expert_count.is_some() => {
            let ff = m.req_usize("feed_forward_length")?;
            let width = match m.opt_usize("expert_feed_forward_length")? {
                Some(n) => n,
                None => ff / experts_used,
            };
            (ff, Some(width))
        }
        _ => (m.req_usize("feed_forward_length")?, None),
    };
    let gpt_oss = fam.moe == Moe::GptOss;
    let cfg = ModelConfig {
        model_type: model_type.to_string(),
        hidden_size: hidden,
        intermediate_size,
        num_hidden_layers: n_layers,
        num_attention_heads: n_heads,
        num_key_value_heads: n_kv,
        head_dim,
        vocab_size,
        max_position_embeddings: m.req_usize("context_length")?,
        norm_eps: eps,
        rope_theta: m.opt_f64("rope.freq_base")?.unwrap_or(10_000.0),
        rope_local_theta: match fam.rope_local_theta {
            Some(default) => Some(m.opt_f64("rope.freq_base_swa")?.unwrap_or(default)),
            None => None,
        },
        rope_scaling,
        partial_rotary_factor: rotary,
        sliding_window,
        layer_types,
        hidden_act: fam.hidden_act.to_string(),
        tie_word_embeddings: g.tensor_info("output.weight").is_none(),
        attention_bias: g.tensor_info("blk.0.attn_q.bias").is_some()
            || g.tensor_info("blk.0.attn_qkv.bias").is_some(),
        mlp_bias: g.tensor_info("blk.0.ffn_up.bias").is_some(),
        query_pre_attn_scalar,
        attn_logit_softcapping: m.opt_f64("attn_logit_softcapping")?,
        final_logit_softcapping: m.opt_f64("final_logit_softcapping")?,
        embedding_multiplier: None,
        attention_multiplier: None,
        residual_multiplier: None,
        logits_scaling: None,
        // Cohere-2's parallel block is its architecture's, not a key.
        use_parallel_residual: fam.model_type == "cohere2",
        num_experts: expert_count.unwrap_or(0),
        num_experts_per_tok: experts_used,
        moe_intermediate_size,
        shared_expert_intermediate_size: None,
        // gpt-oss and llama.cpp's `build_moe_ffn(…, norm_w = true, …)` renormalise the top k.
        norm_topk_prob: expert_count.is_some(),
        logit_scale: if fam.model_type == "cohere2" {
            Some(
                m.opt_f64("logit_scale")?
                    .ok_or_else(|| m.missing("logit_scale"))?,
            )
        } else {
            None
        },
        swiglu_limit: gpt_oss.then_some(7.0),
        swiglu_alpha: gpt_oss.then_some(1.702),
        bos_token_id: m.token_id("tokenizer.ggml.bos_token_id")?,
        eos_token_ids: eos,
        pad_token_id: m.token_id("tokenizer.ggml.padding_token_id")?,
    };
    let names = CheckedFields {
        context: m.key("context_length"),
        rotary: m.key("rope.dimension_count"),
        theta: m.key("rope.freq_base"),
        eps: m.key(fam.eps_key),
        kv_heads: m.key("attention.head_count_kv"),
        intermediate: m.key("feed_forward_length"),
    };
    check_config(&cfg, g.path(), &names)?;
    Ok(cfg)
}
