//! Config checks shared by the HF (`config.json`) and GGUF readers and the vindex loader, run
//! on the finished [`ModelConfig`] so every source refuses the same nonsense: a context of 0
//! positions, a RoPE family whose rotary dimension is unusable (0 turns RoPE off silently; odd
//! or wider than a head cannot be rotated in pairs), a norm epsilon that is not a positive
//! number, KV heads that do not divide the heads, an FFN width of 0.

use std::path::Path;

use crate::arch::Family;
use crate::{ModelConfig, ModelError};

/// The source's own names of the checked fields (for error messages): HF
/// `max_position_embeddings` / `partial_rotary_factor` / `rope_theta` / `rms_norm_eps` /
/// `num_key_value_heads` / `intermediate_size`, GGUF `{arch}.context_length` /
/// `{arch}.rope.dimension_count` / `{arch}.rope.freq_base` / `{arch}.attention.layer_norm_rms_epsilon`
/// / `{arch}.attention.head_count_kv` / `{arch}.feed_forward_length`.
pub(crate) struct CheckedFields {
    pub context: String,
    pub rotary: String,
    pub theta: String,
    pub eps: String,
    pub kv_heads: String,
    pub intermediate: String,
}

impl CheckedFields {
    /// The names of [`ModelConfig`]'s own fields (as a vindex's index.json stores them).
    pub fn config_names() -> Self {
        CheckedFields {
            context: "max_position_embeddings".into(),
            rotary: "partial_rotary_factor".into(),
            theta: "rope_theta".into(),
            eps: "norm_eps".into(),
            kv_heads: "num_key_value_heads".into(),
            intermediate: "intermediate_size".into(),
        }
    }
}

impl ModelConfig {
    /// The checks every reader of a config applies ([`check_config`]), naming `path` and the
    /// fields as [`ModelConfig`] spells them: what a vindex loader runs on its index.json.
    pub fn check(&self, path: &Path) -> Result<(), ModelError> {
        check_config(self, path, &CheckedFields::config_names())
    }
}

/// Rotated leading dimensions of each head: `floor(head_dim · fraction)` as HF computes
/// `int(head_dim * partial_rotary_factor)` (a tiny epsilon absorbs the f64 error of factors
/// such as `32 / 80`, or a GGUF `rope.dimension_count / head_dim`); 0 for a non-finite or
/// non-positive fraction. The one formula of the config check and the forward pass.
pub fn rotary_dim(head_dim: usize, fraction: f64) -> usize {
    let x = head_dim as f64 * fraction;
    if x.is_finite() && x > 0.0 {
        (x + 1e-9).floor() as usize
    } else {
        0
    }
}

/// Check `max_position_embeddings ≥ 1`, `head_dim ≥ 1`, `norm_eps` finite and > 0,
/// `num_key_value_heads ≥ 1` dividing `num_attention_heads`, `intermediate_size ≥ 1`, and, for
/// RoPE families (all but GPT-2's learned positions): rotary dimension ([`rotary_dim`]) even,
/// ≥ 2 and ≤ `head_dim`, and `rope_theta` (and `rope_local_theta`) finite and > 0.
///
/// Errors: [`ModelError::BadField`] naming `path` and the source's field (`names`).
pub(crate) fn check_config(
    cfg: &ModelConfig,
    path: &Path,
    names: &CheckedFields,
) -> Result<(), ModelError> {
    let bad = |field: &str, msg: String| ModelError::BadField {
        path: path.to_path_buf(),
        field: field.to_string(),
        msg,
    };
    use super::limits::{check_sizes, MAX_COUNT, MAX_WIDTH};
    check_sizes(
        path,
        &[
            ("hidden_size", cfg.hidden_size, MAX_WIDTH),
            (&names.intermediate, cfg.intermediate_size, MAX_WIDTH),
            ("num_hidden_layers", cfg.num_hidden_layers, MAX_COUNT),
            ("num_attention_heads", cfg.num_attention_heads, MAX_WIDTH),
            (&names.kv_heads, cfg.num_key_value_heads, MAX_WIDTH),
            ("head_dim", cfg.head_dim, MAX_WIDTH),
            ("vocab_size", cfg.vocab_size, MAX_WIDTH),
            (&names.context, cfg.max_position_embeddings, MAX_WIDTH),
            ("num_experts", cfg.num_experts, MAX_COUNT),
        ],
    )?;
    if cfg.layer_types.len() != cfg.num_hidden_layers {
        return Err(bad(
            "layer_types",
            format!(
                "{} entries for {} layers",
                cfg.layer_types.len(),
                cfg.num_hidden_layers
            ),
        ));
    }
    if !(cfg.norm_eps.is_finite() && cfg.norm_eps > 0.0) {
        return Err(bad(
            &names.eps,
            format!(
                "the norm epsilon must be a positive number (got {})",
                cfg.norm_eps
            ),
        ));
    }
    let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    if kv == 0 || heads % kv != 0 {
        return Err(bad(
            &names.kv_heads,
            format!("{kv} KV heads do not divide the {heads} attention heads"),
        ));
    }
    if cfg.intermediate_size == 0 {
        return Err(bad(
            &names.intermediate,
            "the FFN width must be at least 1 (got 0)".into(),
        ));
    }
    if cfg.max_position_embeddings == 0 {
        return Err(bad(
            &names.context,
            "the context length must be at least 1 position (got 0)".into(),
        ));
    }
    if cfg.head_dim == 0 {
        return Err(bad(
            "head_dim",
            "the head dimension must be positive".into(),
        ));
    }
    if Family::from_model_type(&cfg.model_type) == Some(Family::Gpt2) {
        return Ok(()); // learned absolute positions, no RoPE
    }
    let d = rotary_dim(cfg.head_dim, cfg.partial_rotary_factor);
    if d < 2 || d % 2 != 0 || d > cfg.head_dim {
        return Err(bad(
            &names.rotary,
            format!(
                "rotary dimension {d} (head_dim {} × partial rotary factor {}) must be even, \
                 at least 2 and at most head_dim for a RoPE model ({})",
                cfg.head_dim, cfg.partial_rotary_factor, cfg.model_type
            ),
        ));
    }
    for theta in std::iter::once(cfg.rope_theta).chain(cfg.rope_local_theta) {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(bad(
                &names.theta,
                format!("RoPE base must be finite and positive (got {theta})"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rotary_dim;

    #[test]
    fn rotary_dim_absorbs_the_f64_error_of_a_stored_fraction() {
        // GGUF stores rope.dimension_count; the config keeps it as d / head_dim.
        for (d, hd) in [(30usize, 44usize), (32, 80), (64, 64), (24, 96)] {
            assert_eq!(rotary_dim(hd, d as f64 / hd as f64), d, "{d}/{hd}");
        }
        assert_eq!(rotary_dim(64, 0.0), 0);
        assert_eq!(rotary_dim(64, f64::NAN), 0);
    }
}
