//! Quantization error of the stored quantized tensors against the float tier of the same vindex
//! (which holds the exact dequantized source for GGUF, or the source values for HF folders):
//! what `infer quant-stats` prints.

use infer_quant::QuantFormat;
use rayon::prelude::*;
use serde::Serialize;

use crate::classify::split_layer;
use crate::files;
use crate::load::Vindex;
use crate::VindexError;

/// Files in report order.
const REPORT_FILES: [&str; 7] = [
    files::ATTN_Q4K_BIN,
    files::ATTN_Q8_BIN,
    files::INTERLEAVED_Q4K_BIN,
    files::INTERLEAVED_Q4_BIN,
    files::GATE_Q4_BIN,
    files::LM_HEAD_Q4_BIN,
    files::LM_HEAD_Q6K_BIN,
];

/// Error of one stored quantized tensor.
#[derive(Clone, Debug, Serialize)]
pub struct QuantStat {
    /// Vindex file holding it.
    pub file: String,
    /// Canonical key.
    pub key: String,
    /// Stored format (`Q8_0` for the Q8 tier's int8 + f32-scale planes).
    #[serde(with = "crate::manifest::format_tag")]
    pub format: QuantFormat,
    /// `[out, in]`.
    pub shape: Vec<usize>,
    /// Blocks copied unchanged from the GGUF source.
    pub passthrough: bool,
    /// ‖deq − ref‖₂ / ‖ref‖₂ (f64 sums); 0 when both are zero.
    pub rel_rmse: f64,
    /// max |deq − ref|.
    pub max_abs_err: f64,
}

/// Dequantize a stored quantized tensor to f32, `[out, in]` row-major: ggml `dequantize_row_*`
/// ([`infer_quant::dequantize`]) for block files; `q as f32 · scale` (ggml
/// `dequantize_row_q8_0`) for the Q8 tier. Errors: [`VindexError::Absent`]; a decode error as
/// [`VindexError::BadEntry`].
pub fn dequantize_stored(
    v: &Vindex,
    file: &'static str,
    key: &str,
) -> Result<Vec<f32>, VindexError> {
    if file == files::ATTN_Q8_BIN {
        let (values, scales) = v.q8_tensor(key)?;
        return Ok(values
            .iter()
            .enumerate()
            .map(|(i, &q)| q as i8 as f32 * scales[i / 32])
            .collect());
    }
    let (bytes, e) = v.quant_tensor(file, key)?;
    // Rows × values per row (an interleaved layout needs the row length to find its rows).
    let cols = e.shape.last().copied().unwrap_or(1);
    let mut out = vec![0f32; e.numel()];
    infer_quant::interleave::dequantize_matrix(
        e.format,
        bytes,
        e.numel() / cols.max(1),
        cols,
        &mut out,
    )
    .map(|()| out)
    .map_err(|err| VindexError::BadEntry {
        path: v.path().join(file),
        key: key.to_string(),
        msg: err.to_string(),
    })
}

/// The float-tier values of `key` in HF layout `[out, in]` (down_proj transposed back from its
/// feature-major storage; `lm_head.weight` from the embeddings when tied), widened to f32.
/// Errors: no such tensor in the float tier.
pub fn reference_f32(v: &Vindex, key: &str) -> Result<Vec<f32>, VindexError> {
    if key == "lm_head.weight" {
        let (s, _) = v.lm_head().unwrap_or_else(|| v.embeddings());
        return Ok(s.to_f32_vec());
    }
    if let Some((l, rest)) = split_layer(key) {
        match rest {
            "mlp.gate_proj.weight" => return Ok(v.gate_layer(l)?.to_f32_vec()),
            "mlp.up_proj.weight" => return Ok(v.up_layer(l)?.to_f32_vec()),
            "mlp.down_proj.weight" => {
                let d = v.down_layer(l)?.to_f32_vec();
                let inter = v.intermediate_size(l)?;
                let hidden = d.len() / inter.max(1);
                return Ok(crate::transform::transpose(&d, inter, hidden));
            }
            _ => {}
        }
    }
    Ok(v.tensor(key)?.0.to_f32_vec())
}

/// Relative RMSE and max abs error of `deq` against `reference`.
fn errors(deq: &[f32], reference: &[f32]) -> (f64, f64) {
    let (mut num, mut den, mut max) = (0f64, 0f64, 0f64);
    for (&d, &r) in deq.iter().zip(reference) {
        let e = d as f64 - r as f64;
        num += e * e;
        den += r as f64 * r as f64;
        max = max.max(e.abs());
    }
    let rel = if den > 0.0 {
        (num / den).sqrt()
    } else if num > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    (rel, max)
}

/// Error of every stored quantized tensor against the float tier, in file then offset order.
/// Errors: [`VindexError::Absent`] without a float tier; a tensor missing from the float
/// tier, or a decode error.
pub fn quant_stats(v: &Vindex) -> Result<Vec<QuantStat>, VindexError> {
    if !(v.has_tier(crate::Tier::F32) || v.has_tier(crate::Tier::F16)) {
        return Err(VindexError::Absent {
            path: v.path().to_path_buf(),
            what: "the float tier the quantized tensors are compared with (rebuild with `infer extract --float f32`)".into(),
        });
    }
    let mut items: Vec<(&'static str, String, QuantFormat, Vec<usize>, usize)> = Vec::new();
    for file in REPORT_FILES {
        if file == files::ATTN_Q8_BIN {
            for e in v.q8_value_entries() {
                items.push((
                    file,
                    e.key.clone(),
                    QuantFormat::Q8_0,
                    e.shape.clone(),
                    e.offset,
                ));
            }
        } else {
            for e in v.quant_entries(file) {
                items.push((file, e.key.clone(), e.format, e.shape.clone(), e.offset));
            }
        }
    }
    items.sort_by_key(|(f, _, _, _, off)| {
        (REPORT_FILES.iter().position(|x| x == f).unwrap_or(0), *off)
    });
    let pass = &v.index().passthrough;
    items
        .into_par_iter()
        .map(|(file, key, format, shape, _)| {
            let deq = dequantize_stored(v, file, &key)?;
            let reference = reference_f32(v, &key)?;
            if reference.len() != deq.len() {
                return Err(VindexError::BadEntry {
                    path: v.path().join(file),
                    key: key.clone(),
                    msg: format!(
                        "{} values but the float tier holds {}",
                        deq.len(),
                        reference.len()
                    ),
                });
            }
            let (rel_rmse, max_abs_err) = errors(&deq, &reference);
            Ok(QuantStat {
                file: file.to_string(),
                passthrough: pass.iter().any(|p| p.file == file && p.key == key),
                key,
                format,
                shape,
                rel_rmse,
                max_abs_err,
            })
        })
        .collect()
}
