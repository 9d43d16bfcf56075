//! Extract-time tensor transforms ([`TensorTransform`], decided per family by
//! `ModelArchitecture::source_transform`): GPT-2 Conv1D transposes, and splitting fused q/k/v
//! (`qkv_proj`) and gate/up (`gate_up_proj`) projections into the canonical separate keys, and
//! gpt-oss's fused expert tensors into per-expert Linear matrices and biases.

use infer_models::arch::{ExpertsPart, QkvLayout, TensorTransform};
use infer_models::ModelConfig;

/// One output tensor of a transform: canonical key and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutSpec {
    pub key: String,
    pub shape: Vec<usize>,
}

/// Replace the fused module name in a canonical key (`qkv_proj` → `q_proj`, …).
fn rekey(key: &str, fused: &str, part: &str) -> Result<String, String> {
    if key.contains(fused) {
        Ok(key.replacen(fused, part, 1))
    } else {
        Err(format!(
            "'{key}': expected a '{fused}' key for a fused tensor"
        ))
    }
}

/// Output keys and shapes of transforming a source tensor of `shape` whose canonical key is
/// `key`. Shapes follow HF: a fused q/k/v weight is `[(H + 2·KV)·head_dim, hidden]` (GPT-2 Conv1D:
/// `[hidden, 3·hidden]`), its bias `[(H + 2·KV)·head_dim]`; gate_up is `[2·intermediate, hidden]`.
/// Errors (as a message): a shape that does not fit the config.
pub fn plan_outputs(
    cfg: &ModelConfig,
    key: &str,
    shape: &[usize],
    t: TensorTransform,
) -> Result<Vec<OutSpec>, String> {
    let q_rows = cfg.num_attention_heads * cfg.head_dim;
    let kv_rows = cfg.num_key_value_heads * cfg.head_dim;
    let out = |key: String, shape: Vec<usize>| OutSpec { key, shape };
    match t {
        TensorTransform::AsIs => Ok(vec![out(key.to_string(), shape.to_vec())]),
        TensorTransform::Transpose => match shape {
            [r, c] => Ok(vec![out(key.to_string(), vec![*c, *r])]),
            _ => Ok(vec![out(key.to_string(), shape.to_vec())]),
        },
        TensorTransform::SplitQkv(layout) => {
            let (rows, cols) = match (layout, shape) {
                (_, [n]) => (*n, None),
                (QkvLayout::Conv1dConcat, [c, r]) => (*r, Some(*c)),
                (_, [r, c]) => (*r, Some(*c)),
                _ => return Err(format!("'{key}': fused qkv of shape {shape:?}")),
            };
            if rows != q_rows + 2 * kv_rows {
                return Err(format!(
                    "'{key}': fused qkv has {rows} rows, expected {q_rows} + 2×{kv_rows} (heads × head_dim)"
                ));
            }
            if layout == QkvLayout::PerHeadInterleaved && q_rows != kv_rows {
                return Err(format!(
                    "'{key}': per-head interleaved qkv needs as many kv heads as q heads"
                ));
            }
            let mk = |part: &str, r: usize| -> Result<OutSpec, String> {
                let shape = match cols {
                    Some(c) => vec![r, c],
                    None => vec![r],
                };
                Ok(out(rekey(key, "qkv_proj", part)?, shape))
            };
            Ok(vec![
                mk("q_proj", q_rows)?,
                mk("k_proj", kv_rows)?,
                mk("v_proj", kv_rows)?,
            ])
        }
        TensorTransform::SplitGateUp => {
            let (rows, rest) = shape
                .split_first()
                .ok_or_else(|| format!("'{key}': empty shape"))?;
            if rows % 2 != 0 {
                return Err(format!("'{key}': gate_up has an odd row count {rows}"));
            }
            let mk = |part: &str| -> Result<OutSpec, String> {
                let mut s = vec![rows / 2];
                s.extend_from_slice(rest);
                Ok(out(rekey(key, "gate_up_proj", part)?, s))
            };
            Ok(vec![mk("gate_proj")?, mk("up_proj")?])
        }
        TensorTransform::SplitExperts(part) => {
            let (prefix, fused) = key
                .rsplit_once("experts.")
                .ok_or_else(|| format!("'{key}': expected a '…experts.NAME' key"))?;
            let bad = || format!("'{key}': fused experts of shape {shape:?} ({part:?})");
            // A stacked GGUF projection names its own: `stacked_gate_proj` → `gate_proj.weight`,
            // `stacked_gate_proj_bias` → `gate_proj.bias`.
            let proj = fused.strip_prefix("stacked_").unwrap_or("");
            let stacked_weight = format!("{proj}.weight");
            let stacked_bias = proj
                .strip_suffix("_bias")
                .map(|p| format!("{p}.bias"))
                .unwrap_or_default();
            let (experts, shapes): (usize, Vec<(&str, Vec<usize>)>) = match (part, shape) {
                (ExpertsPart::Stacked, &[e, r, c])
                    if !proj.is_empty() && !proj.ends_with("_bias") =>
                {
                    (e, vec![(stacked_weight.as_str(), vec![r, c])])
                }
                (ExpertsPart::StackedBias, &[e, n]) if !stacked_bias.is_empty() => {
                    (e, vec![(stacked_bias.as_str(), vec![n])])
                }
                (ExpertsPart::GateUp, &[e, h, two_i]) if two_i % 2 == 0 => (
                    e,
                    vec![
                        ("gate_proj.weight", vec![two_i / 2, h]),
                        ("up_proj.weight", vec![two_i / 2, h]),
                    ],
                ),
                (ExpertsPart::GateUpBias, &[e, two_i]) if two_i % 2 == 0 => (
                    e,
                    vec![
                        ("gate_proj.bias", vec![two_i / 2]),
                        ("up_proj.bias", vec![two_i / 2]),
                    ],
                ),
                (ExpertsPart::Down, &[e, i, h]) => (e, vec![("down_proj.weight", vec![h, i])]),
                (ExpertsPart::DownBias, &[e, h]) => (e, vec![("down_proj.bias", vec![h])]),
                _ => return Err(bad()),
            };
            if experts != cfg.num_experts {
                return Err(format!(
                    "'{key}': {experts} experts, config has num_experts {}",
                    cfg.num_experts
                ));
            }
            Ok((0..experts)
                .flat_map(|e| {
                    shapes
                        .iter()
                        .map(move |(p, sh)| out(format!("{prefix}experts.{e}.{p}"), sh.clone()))
                })
                .collect())
        }
    }
}

/// Row-major transpose of `[rows, cols]` to `[cols, rows]` (cache-blocked).
pub fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const B: usize = 32;
    let mut out = vec![0.0f32; data.len()];
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    out[c * rows + r] = data[r * cols + c];
                }
            }
        }
    }
    out
}

/// Apply `t` to a source tensor's data (`shape` as in the source); returns one buffer per
/// output of [`plan_outputs`], in the same order. `cfg` gives the head geometry.
pub fn apply(
    cfg: &ModelConfig,
    data: Vec<f32>,
    shape: &[usize],
    t: TensorTransform,
) -> Vec<Vec<f32>> {
    let q_rows = cfg.num_attention_heads * cfg.head_dim;
    let kv_rows = cfg.num_key_value_heads * cfg.head_dim;
    match (t, shape) {
        (TensorTransform::AsIs, _) => vec![data],
        (TensorTransform::Transpose, [r, c]) => vec![transpose(&data, *r, *c)],
        (TensorTransform::Transpose, _) => vec![data],
        (TensorTransform::SplitQkv(layout), _) => {
            let (data, cols) = match (layout, shape) {
                (_, [_]) => (data, 1),
                (QkvLayout::Conv1dConcat, [c, r]) => (transpose(&data, *c, *r), *c),
                (_, [_, c]) => (data, *c),
                _ => (data, 1),
            };
            match layout {
                QkvLayout::Concat | QkvLayout::Conv1dConcat => {
                    let (q, rest) = data.split_at(q_rows * cols);
                    let (k, v) = rest.split_at(kv_rows * cols);
                    vec![q.to_vec(), k.to_vec(), v.to_vec()]
                }
                QkvLayout::PerHeadInterleaved => {
                    // Per head h: rows [q_h; k_h; v_h], head_dim rows each.
                    let block = cfg.head_dim * cols;
                    let mut parts: Vec<Vec<f32>> =
                        (0..3).map(|_| Vec::with_capacity(q_rows * cols)).collect();
                    for (i, chunk) in data.chunks(block).enumerate() {
                        parts[i % 3].extend_from_slice(chunk);
                    }
                    parts
                }
            }
        }
        (TensorTransform::SplitGateUp, _) => {
            let (g, u) = data.split_at(data.len() / 2);
            vec![g.to_vec(), u.to_vec()]
        }
        (TensorTransform::SplitExperts(part), _) => split_experts(&data, shape, part),
    }
}

/// [`apply`] of [`TensorTransform::SplitExperts`]: per expert, in [`plan_outputs`]' order,
/// gate and up (the even and odd columns of `gate_up_proj[e]` `[hidden, 2·inter]`, transposed to
/// `[inter, hidden]`; biases: the even and odd entries) or down (`down_proj[e]` `[inter, hidden]`
/// transposed to `[hidden, inter]`; bias as is); a stacked projection's slices as they are. A shape [`plan_outputs`] refuses gives nothing.
fn split_experts(data: &[f32], shape: &[usize], part: ExpertsPart) -> Vec<Vec<f32>> {
    match (part, shape) {
        (ExpertsPart::GateUp, &[e, h, two_i]) => {
            let i = two_i / 2;
            let mut out = Vec::with_capacity(2 * e);
            for m in data.chunks_exact(h * two_i).take(e) {
                for parity in 0..2 {
                    let mut w = vec![0f32; i * h];
                    for (row, src) in m.chunks_exact(two_i).enumerate() {
                        for f in 0..i {
                            w[f * h + row] = src[2 * f + parity];
                        }
                    }
                    out.push(w);
                }
            }
            out
        }
        (ExpertsPart::GateUpBias, &[_, two_i]) => data
            .chunks_exact(two_i)
            .flat_map(|b| (0..2).map(move |p| b.iter().skip(p).step_by(2).copied().collect()))
            .collect(),
        (ExpertsPart::Down, &[_, i, h]) => data
            .chunks_exact(i * h)
            .map(|m| transpose(m, i, h))
            .collect(),
        (ExpertsPart::DownBias | ExpertsPart::StackedBias, &[_, h]) => {
            data.chunks_exact(h).map(<[f32]>::to_vec).collect()
        }
        (ExpertsPart::Stacked, &[_, r, c]) => {
            data.chunks_exact(r * c).map(<[f32]>::to_vec).collect()
        }
        _ => Vec::new(),
    }
}

/// The inverse of [`split_experts`] (any element type).
fn join_experts<T: Copy + Default>(
    parts: &[Vec<T>],
    shape: &[usize],
    part: ExpertsPart,
) -> Result<Vec<T>, String> {
    let total: usize = shape.iter().product();
    let mut out = vec![T::default(); total];
    match (part, shape) {
        (ExpertsPart::GateUp, &[e, h, two_i]) if parts.len() == 2 * e => {
            let i = two_i / 2;
            for (k, w) in parts.iter().enumerate() {
                let (ex, parity) = (k / 2, k % 2);
                for f in 0..i {
                    for row in 0..h {
                        out[ex * h * two_i + row * two_i + 2 * f + parity] = w[f * h + row];
                    }
                }
            }
        }
        (ExpertsPart::GateUpBias, &[e, two_i]) if parts.len() == 2 * e => {
            for (k, b) in parts.iter().enumerate() {
                let (ex, parity) = (k / 2, k % 2);
                for (f, &v) in b.iter().enumerate() {
                    out[ex * two_i + 2 * f + parity] = v;
                }
            }
        }
        (ExpertsPart::Down, &[e, i, h]) if parts.len() == e => {
            for (ex, w) in parts.iter().enumerate() {
                let m = transpose_any(w, h, i);
                out[ex * i * h..(ex + 1) * i * h].copy_from_slice(&m);
            }
        }
        (ExpertsPart::DownBias | ExpertsPart::StackedBias, &[e, _])
        | (ExpertsPart::Stacked, &[e, _, _])
            if parts.len() == e =>
        {
            out = parts.concat()
        }
        _ => {
            return Err(format!(
                "{} parts do not make fused experts of shape {shape:?} ({part:?})",
                parts.len()
            ))
        }
    }
    Ok(out)
}

/// Row-major transpose of `[rows, cols]` to `[cols, rows]` for any element type (f32, f16).
fn transpose_any<T: Copy + Default>(data: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::default(); data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// The inverse of [`apply`]: the source tensor of `shape` (as the source stores it, the shape
/// [`plan_outputs`] was given) rebuilt from its canonical outputs `parts`, in the order
/// [`plan_outputs`] lists them (q, k, v; gate, up). Element-wise exact for any element type.
///
/// Errors (as a message): a part count or total length that does not fit `shape` and `t`.
pub fn unapply<T: Copy + Default>(
    cfg: &ModelConfig,
    parts: &[Vec<T>],
    shape: &[usize],
    t: TensorTransform,
) -> Result<Vec<T>, String> {
    let want_parts = match t {
        TensorTransform::AsIs | TensorTransform::Transpose => 1,
        TensorTransform::SplitQkv(_) => 3,
        TensorTransform::SplitGateUp => 2,
        TensorTransform::SplitExperts(part) => {
            let e = shape.first().copied().unwrap_or(0);
            match part {
                ExpertsPart::GateUp | ExpertsPart::GateUpBias => 2 * e,
                ExpertsPart::Down
                | ExpertsPart::DownBias
                | ExpertsPart::Stacked
                | ExpertsPart::StackedBias => e,
            }
        }
    };
    let total: usize = parts.iter().map(Vec::len).sum();
    if parts.len() != want_parts || total != shape.iter().product::<usize>() {
        return Err(format!(
            "{} parts of {total} values do not make a {shape:?} source tensor ({t:?})",
            parts.len()
        ));
    }
    Ok(match (t, shape) {
        (TensorTransform::SplitExperts(part), _) => join_experts(parts, shape, part)?,
        (TensorTransform::Transpose, [r, c]) => transpose_any(&parts[0], *c, *r),
        (TensorTransform::AsIs | TensorTransform::Transpose, _) => parts[0].clone(),
        (TensorTransform::SplitGateUp, _)
        | (TensorTransform::SplitQkv(QkvLayout::Concat), _)
        | (TensorTransform::SplitQkv(QkvLayout::Conv1dConcat), [_]) => parts.concat(),
        (TensorTransform::SplitQkv(QkvLayout::Conv1dConcat), [c, r]) => {
            // Rows [q; k; v] of the Linear layout, then back to Conv1D's [in, out].
            transpose_any(&parts.concat(), *r, *c)
        }
        (TensorTransform::SplitQkv(QkvLayout::Conv1dConcat), _) => parts.concat(),
        (TensorTransform::SplitQkv(QkvLayout::PerHeadInterleaved), _) => {
            let cols = if shape.len() == 2 { shape[1] } else { 1 };
            let block = cfg.head_dim * cols;
            if block == 0 || parts.iter().any(|p| p.len() % block != 0) {
                return Err(format!(
                    "parts of {:?} values are not whole heads of {block}",
                    parts.iter().map(Vec::len).collect::<Vec<_>>()
                ));
            }
            let heads = parts[0].len() / block;
            let mut out = Vec::with_capacity(total);
            for h in 0..heads {
                for p in parts {
                    out.extend_from_slice(&p[h * block..(h + 1) * block]);
                }
            }
            out
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(heads: usize, kv: usize, hd: usize) -> ModelConfig {
        let json = serde_json::json!({
            "model_type": "llama", "hidden_size": heads * hd, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv,
            "head_dim": hd, "vocab_size": 4,
        });
        ModelConfig::from_hf_json(std::path::Path::new("t.json"), &json).unwrap()
    }

    /// `unapply` rebuilds every transform's source tensor from `apply`'s outputs exactly.
    #[test]
    fn unapply_inverts_apply() {
        let cases: Vec<(ModelConfig, Vec<usize>, TensorTransform)> = vec![
            (cfg(2, 2, 4), vec![6, 5], TensorTransform::AsIs),
            (cfg(2, 2, 4), vec![6, 5], TensorTransform::Transpose),
            (
                cfg(4, 2, 4),
                vec![32, 16],
                TensorTransform::SplitQkv(QkvLayout::Concat),
            ),
            (
                cfg(4, 2, 4),
                vec![32],
                TensorTransform::SplitQkv(QkvLayout::Concat),
            ),
            (
                cfg(4, 4, 4),
                vec![48, 16],
                TensorTransform::SplitQkv(QkvLayout::PerHeadInterleaved),
            ),
            (
                cfg(4, 4, 4),
                vec![48],
                TensorTransform::SplitQkv(QkvLayout::PerHeadInterleaved),
            ),
            (
                cfg(4, 4, 4),
                vec![16, 48],
                TensorTransform::SplitQkv(QkvLayout::Conv1dConcat),
            ),
            (
                cfg(4, 4, 4),
                vec![48],
                TensorTransform::SplitQkv(QkvLayout::Conv1dConcat),
            ),
            (cfg(2, 2, 4), vec![16, 8], TensorTransform::SplitGateUp),
        ];
        for (c, shape, t) in cases {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let parts = apply(&c, data.clone(), &shape, t);
            let specs = plan_outputs(&c, "model.layers.0.self_attn.qkv_proj.weight", &shape, t)
                .or_else(|_| plan_outputs(&c, "model.layers.0.mlp.gate_up_proj.weight", &shape, t))
                .unwrap();
            assert_eq!(specs.len(), parts.len(), "{t:?}");
            for (s, p) in specs.iter().zip(&parts) {
                assert_eq!(s.shape.iter().product::<usize>(), p.len(), "{t:?}");
            }
            assert_eq!(
                unapply(&c, &parts, &shape, t).unwrap(),
                data,
                "{t:?} {shape:?}"
            );
        }
        let c = cfg(2, 2, 4);
        assert!(unapply(&c, &[vec![0.0f32; 3]], &[2, 2], TensorTransform::AsIs).is_err());
    }

    /// gpt-oss fused experts: expert e's gate/up are the even/odd columns of
    /// `gate_up_proj[e]` transposed, down is `down_proj[e]` transposed, biases split the same
    /// way; `unapply` puts every part back.
    #[test]
    fn split_experts_layout_and_inverse() {
        let json = serde_json::json!({
            "model_type": "gpt_oss", "hidden_size": 4, "intermediate_size": 3,
            "num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 4, "vocab_size": 4,
            "num_local_experts": 2, "num_experts_per_tok": 1,
        });
        let c = ModelConfig::from_hf_json(std::path::Path::new("t.json"), &json).unwrap();
        let (e, h, i) = (2usize, 4usize, 3usize);
        let base = "model.layers.0.mlp.experts.";
        for (part, shape, fused) in [
            (ExpertsPart::GateUp, vec![e, h, 2 * i], "gate_up_proj"),
            (ExpertsPart::GateUpBias, vec![e, 2 * i], "gate_up_proj_bias"),
            (ExpertsPart::Down, vec![e, i, h], "down_proj"),
            (ExpertsPart::DownBias, vec![e, h], "down_proj_bias"),
        ] {
            let t = TensorTransform::SplitExperts(part);
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|x| x as f32).collect();
            let specs = plan_outputs(&c, &format!("{base}{fused}"), &shape, t).unwrap();
            let parts = apply(&c, data.clone(), &shape, t);
            assert_eq!(specs.len(), parts.len(), "{part:?}");
            for (s, p) in specs.iter().zip(&parts) {
                assert_eq!(
                    s.shape.iter().product::<usize>(),
                    p.len(),
                    "{part:?} {}",
                    s.key
                );
            }
            assert_eq!(unapply(&c, &parts, &shape, t).unwrap(), data, "{part:?}");
            if part == ExpertsPart::GateUp {
                assert_eq!(specs[3].key, format!("{base}1.up_proj.weight"));
                assert_eq!(specs[3].shape, vec![i, h]);
                // Expert 1's up row f, column r is gate_up_proj[1][r][2f + 1].
                for f in 0..i {
                    for r in 0..h {
                        assert_eq!(parts[3][f * h + r], data[h * 2 * i + r * 2 * i + 2 * f + 1]);
                    }
                }
            }
            if part == ExpertsPart::Down {
                assert_eq!(specs[1].key, format!("{base}1.down_proj.weight"));
                // Expert 1 down [h=2][f=1] is down_proj[1][f=1][h=2].
                assert_eq!(parts[1][2 * i + 1], data[i * h + h + 2]);
            }
        }
        let bad = plan_outputs(
            &c,
            &format!("{base}down_proj"),
            &[3, i, h],
            TensorTransform::SplitExperts(ExpertsPart::Down),
        );
        assert!(bad.unwrap_err().contains("3 experts"));
    }

    #[test]
    fn transpose_matches_definition() {
        let (r, c) = (37, 70);
        let data: Vec<f32> = (0..r * c).map(|x| x as f32).collect();
        let t = transpose(&data, r, c);
        for i in 0..r {
            for j in 0..c {
                assert_eq!(t[j * r + i], data[i * c + j]);
            }
        }
    }
}
