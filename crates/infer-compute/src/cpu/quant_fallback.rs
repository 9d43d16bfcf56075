//! Dequantize-then-dot path for weight formats without a fused kernel (Q4_1, Q5_1, Q2_K, Q3_K,
//! Q5_K, Q8_K, F16, BF16, F32): each weight row is decoded once with infer-quant's ggml-exact
//! `dequantize` into a per-thread reusable buffer (`crate::scratch`), then multiplied in f32 with every activation row.

use super::dot::dot;
use super::quant::Split;
use crate::scratch;
use crate::ComputeError;
use infer_quant::QuantFormat;
use rayon::prelude::*;
use std::cell::Cell;

thread_local!(static ROW: Cell<Vec<f32>> = const { Cell::new(Vec::new()) });

/// `yt[r*m + i] = W[r]·x[i]` for the `rows × cols` weight matrix `bytes` (`row_bytes` per row,
/// already validated) and the `m × cols` activations `x`. `yt` is `[rows, m]` (transposed output).
pub(super) fn matmul_t(
    format: QuantFormat,
    bytes: &[u8],
    x: &[f32],
    m: usize,
    cols: usize,
    row_bytes: usize,
    yt: &mut [f32],
) -> Result<(), ComputeError> {
    let rows = yt.len() / m;
    let split = Split::new(rows, row_bytes * m.max(1));
    let task = |buf: &mut [f32], ys: &mut [f32], ws: &[u8]| -> Result<(), ComputeError> {
        for (yr, wr) in ys.chunks_exact_mut(m).zip(ws.chunks_exact(row_bytes)) {
            decode_row(format, wr, buf)?;
            for (yi, xi) in yr.iter_mut().zip(x.chunks_exact(cols)) {
                *yi = dot(buf, xi);
            }
        }
        Ok(())
    };
    let task = |ys: &mut [f32], ws: &[u8]| scratch::with(&ROW, cols, |buf| task(buf, ys, ws));
    if split.serial {
        return task(yt, bytes);
    }
    yt.par_chunks_mut(split.rows_per_task * m)
        .zip(bytes.par_chunks(split.rows_per_task * row_bytes))
        .try_for_each(|(ys, ws)| task(ys, ws))
}

/// One row of `format` bytes to f32 (`F32` is read as little-endian directly).
fn decode_row(format: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), ComputeError> {
    match format {
        QuantFormat::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            Ok(())
        }
        _ => Ok(infer_quant::dequantize(format, bytes, out)?),
    }
}
