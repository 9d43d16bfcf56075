//! RoPE settings from an HF config: transformers v4 (`rope_theta`, `rope_scaling`,
//! `partial_rotary_factor`, gpt_neox `rotary_emb_base`/`rotary_pct`, Gemma-3
//! `rope_local_base_freq`) and v5 (`rope_parameters`, flat or keyed by layer kind).

use super::json::Obj;
use crate::{ModelError, RopeScaling};

/// The RoPE fields of [`crate::ModelConfig`].
pub(crate) struct RopeSettings {
    pub theta: f64,
    pub local_theta: Option<f64>,
    pub scaling: Option<RopeScaling>,
    pub partial_rotary_factor: f64,
}

/// HF defaults per family (config classes of transformers): base 1e4 except Mixtral and the
/// Gemma-3 global layers (1e6) and gpt-oss (1.5e5); partial rotary 0.5 for phi, 0.25 for gpt_neox, else 1.0.
fn defaults(model_type: &str) -> (f64, f64) {
    let theta = match model_type {
        "mixtral" | "gemma3_text" => 1e6,
        "gpt_oss" => 150_000.0,
        _ => 1e4,
    };
    let prf = match model_type {
        "phi" => 0.5,
        "gpt_neox" => 0.25,
        _ => 1.0,
    };
    (theta, prf)
}

/// Parse the RoPE settings of `cfg` (the top-level config object); `max_positions` is the
/// config's context (YaRN's `original_max_position_embeddings` when absent).
/// Errors: an unsupported `rope_type` (only `default`, `linear`, `llama3`, `yarn` are
/// implemented), a scaling on Gemma-3 sliding layers, or a missing scaling parameter (named in
/// full).
pub(crate) fn parse_rope(
    cfg: &Obj,
    model_type: &str,
    max_positions: usize,
) -> Result<RopeSettings, ModelError> {
    let parse_scaling = |o: &Obj| parse_scaling(o, max_positions);
    let (default_theta, default_prf) = defaults(model_type);
    let is_gemma3 = model_type == "gemma3_text";
    let top_prf = cfg.opt_f64_any(&["partial_rotary_factor", "rotary_pct"])?;
    let v4_local = if is_gemma3 {
        Some(cfg.opt_f64("rope_local_base_freq")?.unwrap_or(1e4))
    } else {
        None
    };

    if let Some(rp) = cfg.opt_obj("rope_parameters")? {
        if rp.has("full_attention") || rp.has("sliding_attention") {
            // v5 per layer kind (Gemma-3): scaling applies on full-attention layers only.
            let full = rp.opt_obj("full_attention")?;
            let sliding = rp.opt_obj("sliding_attention")?;
            let (theta, scaling, prf) = match &full {
                Some(f) => (
                    f.opt_f64("rope_theta")?,
                    parse_scaling(f)?,
                    f.opt_f64("partial_rotary_factor")?,
                ),
                None => (None, None, None),
            };
            let local_theta = match &sliding {
                Some(s) => {
                    if parse_scaling(s)?.is_some() {
                        return Err(s.bad(
                            "rope_type",
                            "RoPE scaling on sliding-attention layers is not supported",
                        ));
                    }
                    s.opt_f64("rope_theta")?.or(v4_local)
                }
                None => v4_local,
            };
            return Ok(RopeSettings {
                theta: theta.unwrap_or(default_theta),
                local_theta,
                scaling,
                partial_rotary_factor: prf.or(top_prf).unwrap_or(default_prf),
            });
        }
        return Ok(RopeSettings {
            theta: rp
                .opt_f64("rope_theta")?
                .or(cfg.opt_f64("rope_theta")?)
                .unwrap_or(default_theta),
            local_theta: v4_local,
            scaling: parse_scaling(&rp)?,
            partial_rotary_factor: rp
                .opt_f64("partial_rotary_factor")?
                .or(top_prf)
                .unwrap_or(default_prf),
        });
    }

    // v4 layout.
    let scaling = match cfg.opt_obj("rope_scaling")? {
        Some(rs) => parse_scaling(&rs)?,
        // HF `GptOssConfig` without RoPE parameters: YaRN ×32 over 4096 positions, beta 32/1,
        // not truncated.
        None if model_type == "gpt_oss" => Some(RopeScaling::Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 4096,
            attention_factor: yarn_mscale(32.0, 1.0),
            truncate: false,
        }),
        None => None,
    };
    Ok(RopeSettings {
        theta: cfg
            .opt_f64_any(&["rope_theta", "rotary_emb_base"])?
            .unwrap_or(default_theta),
        local_theta: v4_local,
        scaling,
        partial_rotary_factor: top_prf.unwrap_or(default_prf),
    })
}

/// YaRN's cos/sin multiplier for a context `scale` (the factor) and `m` (`mscale`): HF
/// `get_mscale` of `modeling_rope_utils.py`, `0.1 · m · ln(scale) + 1` for `scale > 1`, else 1.
pub(crate) fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// One scaling object (`rope_scaling` of v4, or a `rope_parameters` object of v5): the kind is
/// `rope_type` (or v4's older `type`); `default`/absent → no scaling. YaRN follows HF
/// `_compute_yarn_parameters` (transformers 5): `factor` (else `max_positions /
/// original_max_position_embeddings`), `original_max_position_embeddings` (else
/// `max_positions`), `beta_fast`/`beta_slow` (32/1 when absent or 0), `attention_factor`
/// (else `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both are set,
/// else `get_mscale(factor)`, `get_mscale(s, m) = 0.1·m·ln(s) + 1` for `s > 1`, 1 otherwise),
/// `truncate` (default true).
fn parse_scaling(o: &Obj, max_positions: usize) -> Result<Option<RopeScaling>, ModelError> {
    let key = if o.get("rope_type").is_some() {
        "rope_type"
    } else {
        "type"
    };
    let kind = o.opt_str(key)?;
    match kind {
        None | Some("default") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear {
            factor: o.req_f64("factor")?,
        })),
        Some("llama3") => Ok(Some(RopeScaling::Llama3 {
            factor: o.req_f64("factor")?,
            low_freq_factor: o.req_f64("low_freq_factor")?,
            high_freq_factor: o.req_f64("high_freq_factor")?,
            original_max_position_embeddings: o.req_usize("original_max_position_embeddings")?,
        })),
        Some("yarn") => {
            let original = o
                .opt_usize("original_max_position_embeddings")?
                .unwrap_or(max_positions);
            if original == 0 {
                return Err(o.bad("original_max_position_embeddings", "must be positive"));
            }
            let factor = o
                .opt_f64("factor")?
                .unwrap_or(max_positions as f64 / original as f64);
            if !(factor.is_finite() && factor > 0.0) {
                return Err(o.bad("factor", format!("{factor} is not a positive number")));
            }
            let attention_factor = match o.opt_f64("attention_factor")? {
                Some(a) => a,
                None => match (o.opt_f64("mscale")?, o.opt_f64("mscale_all_dim")?) {
                    (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, a)
                    }
                    _ => yarn_mscale(factor, 1.0),
                },
            };
            // HF `beta_fast or 32`: 0 and null take the default too.
            let beta = |k: &str, d: f64| -> Result<f64, ModelError> {
                Ok(o.opt_f64(k)?.filter(|&b| b != 0.0).unwrap_or(d))
            };
            Ok(Some(RopeScaling::Yarn {
                factor,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                original_max_position_embeddings: original,
                attention_factor,
                truncate: o.opt_bool("truncate")?.unwrap_or(true),
            }))
        }
        Some(other) => Err(o.bad(
            key,
            format!(
                "RoPE type '{other}' is not supported (supported: default, linear, llama3, yarn)"
            ),
        )),
    }
}
