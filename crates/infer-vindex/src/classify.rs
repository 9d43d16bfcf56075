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

/// Check that per-layer tensors exist for exactly the layers `0..declared` the config declares
/// and that every layer has the same per-layer tensors. `layer_keys` holds `(layer, rest)` of
/// every per-layer canonical key (`model.layers.{layer}.{rest}`); `field` names the config
/// field for the message (HF `num_hidden_layers`, GGUF `{arch}.block_count`).
///
/// Errors (as a message): a tensor of a layer ≥ `declared` (too few declared), a layer below
/// `declared` without tensors (too many declared, or a gap), or a layer lacking a tensor that
/// another layer has (e.g. `mlp.gate_proj.weight`).
pub fn check_layer_count(
    declared: usize,
    field: &str,
    layer_keys: &[(usize, &str)],
) -> Result<(), String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut per_layer: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for &(l, rest) in layer_keys {
        per_layer.entry(l).or_default().insert(rest);
    }
    let Some(&max) = per_layer.keys().next_back() else {
        return Err(format!(
            "config declares {declared} layers ({field}) but no per-layer tensors exist"
        ));
    };
    let found = || format!("tensors exist for layers 0..{max} ({} layers)", max + 1);
    if max >= declared || (max + 1 < declared && per_layer.len() == max + 1) {
        return Err(format!(
            "config declares {declared} layers ({field}) but {}",
            found()
        ));
    }
    if let Some(gap) = (0..declared).find(|l| !per_layer.contains_key(l)) {
        return Err(format!(
            "layer {gap} has no tensors (config declares {declared} layers ({field}); {})",
            found()
        ));
    }
    let all: BTreeSet<&str> = per_layer.values().flatten().copied().collect();
    for (l, have) in &per_layer {
        if let Some(missing) = all.difference(have).next() {
            let other = per_layer
                .iter()
                .find(|(_, h)| h.contains(missing))
                .map_or(0, |(o, _)| *o);
            return Err(format!(
                "layer {l} lacks tensor '{missing}' that layer {other} has (config declares \
                 {declared} layers ({field}))"
            ));
        }
    }
    Ok(())
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
    fn layer_count_must_match_tensors() {
        let keys: Vec<(usize, &str)> = (0..3)
            .flat_map(|l| [(l, "self_attn.q_proj.weight"), (l, "mlp.gate_proj.weight")])
            .collect();
        assert_eq!(check_layer_count(3, "n", &keys), Ok(()));
        assert_eq!(
            check_layer_count(5, "n", &keys).unwrap_err(),
            "config declares 5 layers (n) but tensors exist for layers 0..2 (3 layers)"
        );
        assert_eq!(
            check_layer_count(2, "n", &keys).unwrap_err(),
            "config declares 2 layers (n) but tensors exist for layers 0..2 (3 layers)"
        );
        let gap: Vec<_> = keys.iter().copied().filter(|k| k.0 != 1).collect();
        assert_eq!(
            check_layer_count(3, "n", &gap).unwrap_err(),
            "layer 1 has no tensors (config declares 3 layers (n); tensors exist for layers 0..2 (3 layers))"
        );
        let partial: Vec<_> = keys
            .iter()
            .copied()
            .filter(|k| *k != (2, "mlp.gate_proj.weight"))
            .collect();
        assert_eq!(
            check_layer_count(3, "n", &partial).unwrap_err(),
            "layer 2 lacks tensor 'mlp.gate_proj.weight' that layer 0 has (config declares 3 layers (n))"
        );
        assert!(check_layer_count(3, "n", &[])
            .unwrap_err()
            .contains("no per-layer tensors"));
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
