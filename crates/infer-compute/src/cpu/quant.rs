//! Reference quantized matrix–vector product: dequantize one row at a time (infer-quant's
//! ggml-exact `dequantize`), then an f32 dot product. Fused block kernels replace this later;
//! it stays as their test oracle.

use super::dot::dot;
use crate::ComputeError;
use infer_quant::QuantFormat;
use rayon::prelude::*;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `y[rows] = W·x` for `W` stored as `rows` rows of `format` blocks; see
/// [`crate::ComputeBackend::quant_matvec`].
pub fn quant_matvec(
    format: QuantFormat,
    bytes: &[u8],
    x: &[f32],
    rows: usize,
    cols: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    assert_eq!(
        x.len(),
        cols,
        "quant_matvec: x has {} values, want cols = {cols}",
        x.len()
    );
    assert_eq!(
        y.len(),
        rows,
        "quant_matvec: y has {} values, want rows = {rows}",
        y.len()
    );
    let row_bytes = format.bytes_for(cols)?;
    let expected = rows
        .checked_mul(row_bytes)
        .ok_or(ComputeError::ShapeMismatch {
            what: "quantized matrix (rows * row bytes overflows)",
            expected: usize::MAX,
            got: bytes.len(),
            unit: "bytes",
        })?;
    if bytes.len() != expected {
        return Err(ComputeError::ShapeMismatch {
            what: "quantized matrix bytes (rows * bytes per row)",
            expected,
            got: bytes.len(),
            unit: "bytes",
        });
    }
    if rows == 0 {
        return Ok(());
    }
    if cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    y.par_chunks_mut(ROWS_PER_TASK)
        .zip(bytes.par_chunks(ROWS_PER_TASK * row_bytes))
        .try_for_each_init(
            || vec![0f32; cols],
            |row, (ys, bs)| {
                for (yi, rb) in ys.iter_mut().zip(bs.chunks_exact(row_bytes)) {
                    decode_row(format, rb, row)?;
                    *yi = dot(row, x);
                }
                Ok(())
            },
        )
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
