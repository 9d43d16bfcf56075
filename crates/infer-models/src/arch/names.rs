//! HF tensor names → canonical (Llama-style) names, and the data transform each needs.
//!
//! Canonical names: `model.embed_tokens.weight`, `model.norm.{weight,bias}`, `lm_head.{weight,bias}`,
//! `model.layers.{l}.{input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
//! post_feedforward_layernorm}`, `…self_attn.{q,k,v,o}_proj`, `…self_attn.{q,k}_norm`,
//! `…mlp.{gate,up,down}_proj`; fused `…self_attn.qkv_proj` / `…mlp.gate_up_proj` (split at
//! extract time); MoE `…mlp.gate` (router), `…mlp.experts.{e}.{gate,up,down}_proj`,
//! `…mlp.shared_expert.*`, `…mlp.shared_expert_gate`; GPT-2 `model.embed_positions.weight`.

use super::{ExpertsPart, Family, QkvLayout, TensorTransform};

/// Buffers that are not weights (rotary caches, causal-mask buffers of old checkpoints).
fn is_buffer(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
        || name.ends_with(".attn.bias")
        || name.ends_with(".attn.masked_bias")
        || name.ends_with(".attention.bias")
        || name.ends_with(".attention.masked_bias")
}

/// Split `"{prefix}{N}.{rest}"` into `(N, rest)`.
fn layer_parts<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let tail = name.strip_prefix(prefix)?;
    let (num, rest) = tail.split_once('.')?;
    Some((num.parse().ok()?, rest))
}

/// Replace the first matching module path prefix of `rest` via `table` (old → new).
fn rename(rest: &str, table: &[(&str, &str)]) -> String {
    for (old, new) in table {
        if let Some(t) = rest.strip_prefix(old) {
            return format!("{new}{t}");
        }
    }
    rest.to_string()
}

/// Canonical name of `hf_name` for `family`, `None` to drop it (buffers, vision tower).
pub(super) fn canonical_name(family: Family, hf_name: &str) -> Option<String> {
    if is_buffer(hf_name) {
        return None;
    }
    let name = hf_name;
    Some(match family {
        Family::Gpt2 => {
            let n = name.strip_prefix("transformer.").unwrap_or(name);
            match n {
                "wte.weight" => "model.embed_tokens.weight".into(),
                "wpe.weight" => "model.embed_positions.weight".into(),
                "lm_head.weight" => n.into(),
                _ => {
                    if let Some(t) = n.strip_prefix("ln_f.") {
                        format!("model.norm.{t}")
                    } else if let Some((l, rest)) = layer_parts(n, "h.") {
                        let rest = rename(
                            rest,
                            &[
                                ("ln_1.", "input_layernorm."),
                                ("ln_2.", "post_attention_layernorm."),
                                ("attn.c_attn.", "self_attn.qkv_proj."),
                                ("attn.c_proj.", "self_attn.o_proj."),
                                ("mlp.c_fc.", "mlp.up_proj."),
                                ("mlp.c_proj.", "mlp.down_proj."),
                            ],
                        );
                        format!("model.layers.{l}.{rest}")
                    } else {
                        n.into()
                    }
                }
            }
        }
        Family::GptNeox => {
            if name == "embed_out.weight" {
                "lm_head.weight".into()
            } else if name == "gpt_neox.embed_in.weight" {
                "model.embed_tokens.weight".into()
            } else if let Some(t) = name.strip_prefix("gpt_neox.final_layer_norm.") {
                format!("model.norm.{t}")
            } else if let Some((l, rest)) = layer_parts(name, "gpt_neox.layers.") {
                let rest = rename(
                    rest,
                    &[
                        ("attention.query_key_value.", "self_attn.qkv_proj."),
                        ("attention.dense.", "self_attn.o_proj."),
                        ("mlp.dense_h_to_4h.", "mlp.up_proj."),
                        ("mlp.dense_4h_to_h.", "mlp.down_proj."),
                    ],
                );
                format!("model.layers.{l}.{rest}")
            } else {
                name.into()
            }
        }
        Family::Phi => {
            if let Some(t) = name.strip_prefix("model.final_layernorm.") {
                format!("model.norm.{t}")
            } else if let Some((l, rest)) = layer_parts(name, "model.layers.") {
                let rest = rename(
                    rest,
                    &[
                        ("self_attn.dense.", "self_attn.o_proj."),
                        ("mlp.fc1.", "mlp.up_proj."),
                        ("mlp.fc2.", "mlp.down_proj."),
                    ],
                );
                format!("model.layers.{l}.{rest}")
            } else {
                name.into()
            }
        }
        Family::Starcoder2 => match layer_parts(name, "model.layers.") {
            Some((l, rest)) => {
                let rest = rename(
                    rest,
                    &[
                        ("mlp.c_fc.", "mlp.up_proj."),
                        ("mlp.c_proj.", "mlp.down_proj."),
                    ],
                );
                format!("model.layers.{l}.{rest}")
            }
            None => name.into(),
        },
        Family::Mixtral => match layer_parts(name, "model.layers.") {
            Some((l, rest)) => {
                let rest = if let Some(t) = rest.strip_prefix("block_sparse_moe.gate.") {
                    format!("mlp.gate.{t}")
                } else if let Some((e, r)) = layer_parts(rest, "block_sparse_moe.experts.") {
                    let r = rename(
                        r,
                        &[
                            ("w1.", "gate_proj."),
                            ("w3.", "up_proj."),
                            ("w2.", "down_proj."),
                        ],
                    );
                    format!("mlp.experts.{e}.{r}")
                } else {
                    rest.to_string()
                };
                format!("model.layers.{l}.{rest}")
            }
            None => name.into(),
        },
        Family::GptOss => match layer_parts(name, "model.layers.") {
            Some((l, rest)) => {
                format!(
                    "model.layers.{l}.{}",
                    rename(rest, &[("mlp.router.", "mlp.gate.")])
                )
            }
            None => name.into(),
        },
        Family::Gemma3 => {
            // Multimodal Gemma-3 checkpoints: v4 `language_model.model.*`, v5
            // `model.language_model.*`; the vision tower and projector are dropped.
            if name.contains("vision_tower") || name.contains("multi_modal_projector") {
                return None;
            }
            if let Some(t) = name.strip_prefix("language_model.model.") {
                format!("model.{t}")
            } else if let Some(t) = name.strip_prefix("model.language_model.") {
                format!("model.{t}")
            } else if let Some(t) = name.strip_prefix("language_model.") {
                t.into()
            } else {
                name.into()
            }
        }
        _ => name.into(),
    })
}

/// Inverse of [`canonical_name`]: the HF name of the checkpoint tensor of `family` that holds
/// the canonical tensor `canonical` (what `infer export --safetensors` writes). For a part of a
/// fused projection the fused tensor's name: GPT-2 `attn.c_attn`, GPT-NeoX
/// `attention.query_key_value`, Phi-3 `self_attn.qkv_proj` (q/k/v) and `mlp.gate_up_proj`
/// (gate/up); the parts are joined again by the inverse of [`source_transform`]. Gemma-3 gives
/// the text-only names (`model.*`, as `Gemma3ForCausalLM` saves them), GPT-2 the
/// `transformer.`-prefixed ones. Identity for Llama-named tensors.
pub(super) fn source_name(family: Family, canonical: &str) -> String {
    let layer = |prefix: &str, table: &[(&str, &str)]| -> Option<String> {
        let (l, rest) = layer_parts(canonical, "model.layers.")?;
        Some(format!("{prefix}{l}.{}", rename(rest, table)))
    };
    let fused_qkv = |to: &'static str| -> [(&'static str, &'static str); 3] {
        [
            ("self_attn.q_proj.", to),
            ("self_attn.k_proj.", to),
            ("self_attn.v_proj.", to),
        ]
    };
    let named = match family {
        Family::Gpt2 => match canonical {
            "model.embed_tokens.weight" => Some("transformer.wte.weight".to_string()),
            "model.embed_positions.weight" => Some("transformer.wpe.weight".to_string()),
            "lm_head.weight" => None,
            _ => match canonical.strip_prefix("model.norm.") {
                Some(t) => Some(format!("transformer.ln_f.{t}")),
                None => {
                    let mut table = vec![
                        ("input_layernorm.", "ln_1."),
                        ("post_attention_layernorm.", "ln_2."),
                        ("self_attn.o_proj.", "attn.c_proj."),
                        ("mlp.up_proj.", "mlp.c_fc."),
                        ("mlp.down_proj.", "mlp.c_proj."),
                    ];
                    table.extend(fused_qkv("attn.c_attn."));
                    layer("transformer.h.", &table)
                }
            },
        },
        Family::GptNeox => match canonical {
            "lm_head.weight" => Some("embed_out.weight".to_string()),
            "model.embed_tokens.weight" => Some("gpt_neox.embed_in.weight".to_string()),
            _ => match canonical.strip_prefix("model.norm.") {
                Some(t) => Some(format!("gpt_neox.final_layer_norm.{t}")),
                None => {
                    let mut table = vec![
                        ("self_attn.o_proj.", "attention.dense."),
                        ("mlp.up_proj.", "mlp.dense_h_to_4h."),
                        ("mlp.down_proj.", "mlp.dense_4h_to_h."),
                    ];
                    table.extend(fused_qkv("attention.query_key_value."));
                    layer("gpt_neox.layers.", &table)
                }
            },
        },
        Family::Phi => match canonical.strip_prefix("model.norm.") {
            Some(t) => Some(format!("model.final_layernorm.{t}")),
            None => layer(
                "model.layers.",
                &[
                    ("self_attn.o_proj.", "self_attn.dense."),
                    ("mlp.up_proj.", "mlp.fc1."),
                    ("mlp.down_proj.", "mlp.fc2."),
                ],
            ),
        },
        Family::Starcoder2 => layer(
            "model.layers.",
            &[
                ("mlp.up_proj.", "mlp.c_fc."),
                ("mlp.down_proj.", "mlp.c_proj."),
            ],
        ),
        Family::Phi3 => {
            let mut table = vec![
                ("mlp.gate_proj.", "mlp.gate_up_proj."),
                ("mlp.up_proj.", "mlp.gate_up_proj."),
            ];
            table.extend(fused_qkv("self_attn.qkv_proj."));
            layer("model.layers.", &table)
        }
        Family::Mixtral => layer_parts(canonical, "model.layers.").map(|(l, rest)| {
            let rest = if let Some(t) = rest.strip_prefix("mlp.gate.") {
                format!("block_sparse_moe.gate.{t}")
            } else if let Some((e, r)) = layer_parts(rest, "mlp.experts.") {
                let r = rename(
                    r,
                    &[
                        ("gate_proj.", "w1."),
                        ("up_proj.", "w3."),
                        ("down_proj.", "w2."),
                    ],
                );
                format!("block_sparse_moe.experts.{e}.{r}")
            } else {
                rest.to_string()
            };
            format!("model.layers.{l}.{rest}")
        }),
        Family::GptOss => layer_parts(canonical, "model.layers.").map(|(l, rest)| {
            let rest = if let Some(t) = rest.strip_prefix("mlp.gate.") {
                format!("mlp.router.{t}")
            } else if let Some((_, r)) = layer_parts(rest, "mlp.experts.") {
                let fused = match r {
                    "gate_proj.weight" | "up_proj.weight" => "gate_up_proj",
                    "gate_proj.bias" | "up_proj.bias" => "gate_up_proj_bias",
                    "down_proj.weight" => "down_proj",
                    "down_proj.bias" => "down_proj_bias",
                    other => other,
                };
                format!("mlp.experts.{fused}")
            } else {
                rest.to_string()
            };
            format!("model.layers.{l}.{rest}")
        }),
        _ => None,
    };
    named.unwrap_or_else(|| canonical.to_string())
}

/// The data transform the source tensor `hf_name` needs (see [`TensorTransform`]).
pub(super) fn source_transform(family: Family, hf_name: &str) -> TensorTransform {
    let experts_part = hf_name.rsplit_once("mlp.experts.").map(|(_, t)| t);
    // A GGUF's stacked experts (see `crate::names`), whatever the family.
    if let Some(t) = experts_part.filter(|t| t.starts_with("stacked_")) {
        return TensorTransform::SplitExperts(if t.ends_with("_bias") {
            ExpertsPart::StackedBias
        } else {
            ExpertsPart::Stacked
        });
    }
    match family {
        Family::Gpt2 => {
            if hf_name.contains("attn.c_attn.") {
                TensorTransform::SplitQkv(QkvLayout::Conv1dConcat)
            } else if hf_name.ends_with(".weight")
                && (hf_name.contains("attn.c_proj.")
                    || hf_name.contains("mlp.c_fc.")
                    || hf_name.contains("mlp.c_proj."))
            {
                TensorTransform::Transpose
            } else {
                TensorTransform::AsIs
            }
        }
        Family::GptNeox if hf_name.contains("attention.query_key_value.") => {
            TensorTransform::SplitQkv(QkvLayout::PerHeadInterleaved)
        }
        Family::Phi3 if hf_name.contains("self_attn.qkv_proj.") => {
            TensorTransform::SplitQkv(QkvLayout::Concat)
        }
        Family::Phi3 if hf_name.contains("mlp.gate_up_proj.") => TensorTransform::SplitGateUp,
        Family::GptOss => {
            let part = match experts_part {
                Some("gate_up_proj") => ExpertsPart::GateUp,
                Some("gate_up_proj_bias") => ExpertsPart::GateUpBias,
                Some("down_proj") => ExpertsPart::Down,
                Some("down_proj_bias") => ExpertsPart::DownBias,
                _ => return TensorTransform::AsIs,
            };
            TensorTransform::SplitExperts(part)
        }
        _ => TensorTransform::AsIs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `source_name` inverts `canonical_name` for every canonical key shape the families store;
    /// a fused part maps to the fused tensor, whose canonical name is the fused key.
    #[test]
    fn source_name_inverts_canonical_name() {
        let keys = [
            "model.embed_tokens.weight",
            "model.embed_positions.weight",
            "model.norm.weight",
            "model.norm.bias",
            "lm_head.weight",
            "lm_head.bias",
            "model.layers.2.input_layernorm.weight",
            "model.layers.2.input_layernorm.bias",
            "model.layers.2.post_attention_layernorm.weight",
            "model.layers.2.pre_feedforward_layernorm.weight",
            "model.layers.2.post_feedforward_layernorm.weight",
            "model.layers.2.self_attn.q_proj.weight",
            "model.layers.2.self_attn.k_proj.bias",
            "model.layers.2.self_attn.v_proj.weight",
            "model.layers.2.self_attn.o_proj.weight",
            "model.layers.2.self_attn.o_proj.bias",
            "model.layers.2.self_attn.q_norm.weight",
            "model.layers.2.mlp.gate_proj.weight",
            "model.layers.2.mlp.up_proj.weight",
            "model.layers.2.mlp.up_proj.bias",
            "model.layers.2.mlp.down_proj.weight",
            "model.layers.2.mlp.gate.weight",
            "model.layers.2.mlp.experts.3.gate_proj.weight",
            "model.layers.2.mlp.experts.3.up_proj.weight",
            "model.layers.2.mlp.experts.3.down_proj.weight",
            "model.layers.2.mlp.shared_expert.up_proj.weight",
            "model.layers.2.mlp.shared_expert_gate.weight",
        ];
        let families = [
            Family::Llama,
            Family::Gemma3,
            Family::Starcoder2,
            Family::Phi3,
            Family::GptNeox,
            Family::Phi,
            Family::Gpt2,
            Family::Mixtral,
            Family::Qwen2Moe,
            Family::Cohere2,
            Family::GptOss,
        ];
        for f in families {
            for k in keys {
                let hf = source_name(f, k);
                let back = canonical_name(f, &hf).unwrap_or_default();
                let fused = ["q_proj", "k_proj", "v_proj"]
                    .iter()
                    .any(|p| k.contains(&format!("self_attn.{p}.")))
                    && matches!(f, Family::Phi3 | Family::GptNeox | Family::Gpt2);
                let fused_ffn = matches!(f, Family::Phi3)
                    && (k.contains("mlp.gate_proj.") || k.contains("mlp.up_proj."));
                let fused_experts = f == Family::GptOss && k.contains(".mlp.experts.");
                if fused {
                    assert!(
                        back.contains(".self_attn.qkv_proj."),
                        "{f:?} {k} → {hf} → {back}"
                    );
                } else if fused_ffn {
                    assert!(
                        back.contains(".mlp.gate_up_proj."),
                        "{f:?} {k} → {hf} → {back}"
                    );
                } else if fused_experts {
                    assert!(
                        matches!(source_transform(f, &hf), TensorTransform::SplitExperts(_)),
                        "{f:?} {k} → {hf}"
                    );
                } else {
                    assert_eq!(back, k, "{f:?}: {k} → {hf}");
                }
            }
        }
        assert_eq!(
            source_name(Family::Gpt2, "model.layers.1.self_attn.k_proj.bias"),
            "transformer.h.1.attn.c_attn.bias"
        );
        assert_eq!(
            source_name(
                Family::Mixtral,
                "model.layers.0.mlp.experts.1.down_proj.weight"
            ),
            "model.layers.0.block_sparse_moe.experts.1.w2.weight"
        );
        assert_eq!(
            source_name(Family::GptNeox, "lm_head.weight"),
            "embed_out.weight"
        );
        assert_eq!(
            source_name(Family::GptOss, "model.layers.0.mlp.experts.1.up_proj.bias"),
            "model.layers.0.mlp.experts.gate_up_proj_bias"
        );
        assert_eq!(
            source_name(Family::GptOss, "model.layers.3.mlp.gate.bias"),
            "model.layers.3.mlp.router.bias"
        );
    }
}
