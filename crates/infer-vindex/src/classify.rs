//! Classify a tensor by its canonical (Llama-style Hugging Face) name into the vindex file that
//! stores it. Families whose HF names differ are mapped to canonical names before this runs
//! (`ModelArchitecture::canonical_name`); anything unrecognised becomes [`Role::Other`] and is
//! kept in `other_weights.bin`, never dropped.

/// The role of a tensor, which decides its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `model.embed_tokens.weight` → `embeddings.bin`.
    Embedding,
    /// `lm_head.weight` → `lm_head.bin`.
    LmHead,
    /// A 1-D norm weight or bias (`*norm*.weight|bias` outside attention) → `norms.bin`.
    Norm,
    /// Anything under `self_attn.` (q/k/v/o weights and biases, q/k norms) → `attn_weights.bin`.
    Attention,
    /// `mlp.gate_proj.weight` → `gate_vectors.bin`.
    FfnGate,
    /// `mlp.up_proj.weight` → `up_features.bin`.
    FfnUp,
    /// `mlp.down_proj.weight` → `down_features.bin` (transposed).
    FfnDown,
    /// Anything else (MoE experts and routers, FFN biases, …) → `other_weights.bin`.
    Other,
}

/// A classified tensor: its role and the layer it belongs to (`None` for global tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub role: Role,
    pub layer: Option<usize>,
}

/// Classify a canonical tensor name with its shape (`shape.len() == 1` tells norms apart).
pub fn classify(name: &str, shape: &[usize]) -> Placement {
    let (layer, rest) = match split_layer(name) {
        Some((l, rest)) => (Some(l), rest),
        None => (None, name),
    };
    let is_norm_name = |s: &str| {
        let last = s.rsplit('.').nth(1).unwrap_or("");
        last.contains("norm") || last.starts_with("ln")
    };
    let role = match (layer, rest) {
        (None, "model.embed_tokens.weight") => Role::Embedding,
        (None, "lm_head.weight") => Role::LmHead,
        (Some(_), r) if r.starts_with("self_attn.") => Role::Attention,
        (Some(_), "mlp.gate_proj.weight") => Role::FfnGate,
        (Some(_), "mlp.up_proj.weight") => Role::FfnUp,
        (Some(_), "mlp.down_proj.weight") => Role::FfnDown,
        (_, r) if shape.len() == 1 && is_norm_name(r) => Role::Norm,
        _ => Role::Other,
    };
    Placement { role, layer }
}

/// `model.layers.{l}.rest` → `(l, rest)`.
pub fn split_layer(name: &str) -> Option<(usize, &str)> {
    let tail = name.strip_prefix("model.layers.")?;
    let (num, rest) = tail.split_once('.')?;
    Some((num.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, shape: &[usize]) -> (Role, Option<usize>) {
        let p = classify(name, shape);
        (p.role, p.layer)
    }

    #[test]
    fn llama_style_names() {
        assert_eq!(
            role("model.embed_tokens.weight", &[8, 4]),
            (Role::Embedding, None)
        );
        assert_eq!(role("lm_head.weight", &[8, 4]), (Role::LmHead, None));
        assert_eq!(role("model.norm.weight", &[4]), (Role::Norm, None));
        assert_eq!(role("model.norm.bias", &[4]), (Role::Norm, None));
        for n in [
            "q_proj.weight",
            "k_proj.bias",
            "o_proj.weight",
            "q_norm.weight",
            "k_norm.weight",
        ] {
            let name = format!("model.layers.3.self_attn.{n}");
            assert_eq!(role(&name, &[4, 4]), (Role::Attention, Some(3)), "{name}");
        }
        for n in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            let name = format!("model.layers.12.{n}.weight");
            assert_eq!(role(&name, &[4]), (Role::Norm, Some(12)), "{name}");
        }
        assert_eq!(
            role("model.layers.0.mlp.gate_proj.weight", &[8, 4]),
            (Role::FfnGate, Some(0))
        );
        assert_eq!(
            role("model.layers.0.mlp.up_proj.weight", &[8, 4]),
            (Role::FfnUp, Some(0))
        );
        assert_eq!(
            role("model.layers.0.mlp.down_proj.weight", &[4, 8]),
            (Role::FfnDown, Some(0))
        );
    }

    #[test]
    fn unknown_names_are_other() {
        let experts = "model.layers.1.block_sparse_moe.experts.0.w1.weight";
        assert_eq!(role(experts, &[8, 4]), (Role::Other, Some(1)));
        assert_eq!(
            role("model.layers.1.mlp.c_fc.bias", &[8]),
            (Role::Other, Some(1))
        );
        assert_eq!(role("transformer.wpe.weight", &[8, 4]), (Role::Other, None));
        // A 2-D tensor named like a norm is not a norm.
        assert_eq!(
            role("model.layers.0.odd_norm.weight", &[2, 2]),
            (Role::Other, Some(0))
        );
    }
}
