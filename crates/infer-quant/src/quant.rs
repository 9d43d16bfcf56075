//! `quantize`: one entry point for every quantizer, mirroring ggml `ggml_quantize_chunk`.

use crate::{float16, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_k};
use crate::{QuantError, QuantFormat};

type RowFn = fn(&[f32], &mut [u8]);
type ImplFn = fn(&[f32], &mut [u8], &[f32]);

/// Quantize `src` (`src.len() / n_per_row` rows of `n_per_row` f32 values, row-major) to
/// `format`, byte-exact with ggml `ggml_quantize_chunk` built without FMA contraction.
///
/// * `imatrix = None`: the reference quantizers `quantize_row_*_ref` (for Q8_K:
///   `quantize_row_q8_K_ref`, except that the `bsums` of an all-zero block are written as zeros;
///   ggml leaves them unwritten). F16 uses `ggml_fp32_to_fp16_row` (NaN -> 0x7E00|sign), BF16
///   `ggml_fp32_to_bf16_row_ref`, F32 a little-endian copy.
/// * `imatrix = Some(w)` (`w.len() == n_per_row`, per-column importance, as llama-quantize's
///   `--imatrix`): the `quantize_row_*_impl` paths for Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
///   Q5_K, Q6_K. Their results depend on `n_per_row` (the legacy types take `sigma2` over the whole
///   row). Q8_0, F32, F16, BF16 ignore the imatrix, as ggml does.
///
/// Returns `rows * format.bytes_for(n_per_row)` bytes: each row is the concatenation of its blocks.
///
/// Errors: [`QuantError::BadShape`] if `n_per_row == 0` or `src.len()` is not a multiple of it,
/// [`QuantError::NotBlockAligned`] if `n_per_row` is not a multiple of the block size,
/// [`QuantError::BadImatrix`] for an imatrix of the wrong length,
/// [`QuantError::Unsupported`] for Q8_1, and for Q8_K with an imatrix.
///
/// An interleaved layout (Q4_0x16) is its row format's bytes re-laid ([`crate::interleave`]),
/// `src` being the whole matrix.
pub fn quantize(
    format: QuantFormat,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<Vec<u8>, QuantError> {
    let row_bytes = check_rows(format, src, n_per_row)?;
    let mut out = vec![0u8; src.len() / n_per_row * row_bytes];
    quantize_into(format, src, n_per_row, imatrix, &mut out)?;
    Ok(out)
}

/// Rows of `n_per_row` values and the bytes of one encoded row. Errors as [`quantize`].
fn check_rows(format: QuantFormat, src: &[f32], n_per_row: usize) -> Result<usize, QuantError> {
    if n_per_row == 0 || src.len() % n_per_row != 0 {
        return Err(QuantError::BadShape(format!(
            "{} values are not a whole number of rows of {n_per_row}",
            src.len()
        )));
    }
    format.bytes_for(n_per_row)
}

/// [`quantize`] into a caller's buffer: `out.len()` must be `rows * format.bytes_for(n_per_row)`
/// (it is zeroed, then every row written). Errors as [`quantize`], and [`QuantError::WrongByteCount`] for an
/// `out` of another length.
pub fn quantize_into(
    format: QuantFormat,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    out: &mut [u8],
) -> Result<(), QuantError> {
    let row_bytes = check_rows(format, src, n_per_row)?;
    let expected = src.len() / n_per_row * row_bytes;
    if out.len() != expected {
        return Err(QuantError::WrongByteCount {
            format,
            expected,
            got: out.len(),
        });
    }
    if let Some((row_format, _)) = format.interleaved() {
        quantize_into(row_format, src, n_per_row, imatrix, out)?;
        let relaid = crate::interleave::from_rows(format, out, src.len() / n_per_row, n_per_row)?;
        out.copy_from_slice(&relaid);
        return Ok(());
    }
    // Some row functions pack bit fields into bytes they expect zeroed (Q4_K/Q5_K scales).
    out.fill(0);
    if let Some(w) = imatrix {
        if w.len() != n_per_row {
            return Err(QuantError::BadImatrix {
                expected: n_per_row,
                got: w.len(),
            });
        }
    }

    let (reference, weighted): (RowFn, Option<ImplFn>) = match format {
        QuantFormat::F32 => (f32_row, None),
        QuantFormat::F16 => (f16_row, None),
        QuantFormat::BF16 => (bf16_row, None),
        QuantFormat::Q8_0 => (q8_0::quantize_row_ref, None),
        QuantFormat::Q4_0 => (q4_0::quantize_row_ref, Some(q4_0::quantize_row_impl)),
        QuantFormat::Q4_1 => (q4_1::quantize_row_ref, Some(q4_1::quantize_row_impl)),
        QuantFormat::Q5_0 => (q5_0::quantize_row_ref, Some(q5_0::quantize_row_impl)),
        QuantFormat::Q5_1 => (q5_1::quantize_row_ref, Some(q5_1::quantize_row_impl)),
        QuantFormat::Q2_K => (q2_k::quantize_row_ref, Some(q2_k::quantize_row_impl)),
        QuantFormat::Q3_K => (q3_k::quantize_row_ref, Some(q3_k::quantize_row_impl)),
        QuantFormat::Q4_K => (q4_k::quantize_row_ref, Some(q4_k::quantize_row_impl)),
        QuantFormat::Q5_K => (q5_k::quantize_row_ref, Some(q5_k::quantize_row_impl)),
        QuantFormat::Q6_K => (q6_k::quantize_row_ref, Some(q6_k::quantize_row_impl)),
        QuantFormat::Q8_K => {
            if imatrix.is_some() {
                return Err(QuantError::Unsupported(format));
            }
            (q8_k::quantize_row_ref, None)
        }
        QuantFormat::Q8_1 => return Err(QuantError::Unsupported(format)),
        QuantFormat::Q4_0x16 => unreachable!("interleaved layouts return above"),
    };

    for (x, y) in src
        .chunks_exact(n_per_row)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        match (imatrix, weighted) {
            (Some(w), Some(f)) => f(x, y, w),
            _ => reference(x, y),
        }
    }
    Ok(())
}

fn f32_row(x: &[f32], y: &mut [u8]) {
    for (v, o) in x.iter().zip(y.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

fn f16_row(x: &[f32], y: &mut [u8]) {
    for (v, o) in x.iter().zip(y.chunks_exact_mut(2)) {
        o.copy_from_slice(&float16::f32_to_f16(*v).to_le_bytes());
    }
}

fn bf16_row(x: &[f32], y: &mut [u8]) {
    for (v, o) in x.iter().zip(y.chunks_exact_mut(2)) {
        o.copy_from_slice(&float16::f32_to_bf16(*v).to_le_bytes());
    }
}
