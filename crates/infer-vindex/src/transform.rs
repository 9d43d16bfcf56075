//! Extract-time tensor transforms ([`TensorTransform`], decided per family by
//! `ModelArchitecture::source_transform`): GPT-2 Conv1D transposes, and splitting fused q/k/v
//! (`qkv_proj`) and gate/up (`gate_up_proj`) projections into the canonical separate keys.

use infer_models::arch::{QkvLayout, TensorTransform};
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
