//! `dequantize`: one entry point for every format, dispatching to the per-format modules.

use crate::{float16, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_k};
use crate::{QuantError, QuantFormat};

/// Dequantize `bytes` (whole blocks of `format`) into `out` (`out.len()` values), bit-exact
/// with ggml's `to_float` (`dequantize_row_*`; `dequantize_row_q8_K` for Q8_K; `bytes << 16`
/// for BF16; exact f16 widening for F16; little-endian copy for F32).
///
/// `bytes` is the concatenation of ggml blocks exactly as in memory / GGUF, so several rows can be
/// decoded in one call. Errors: [`QuantError::NotBlockAligned`] when `out.len()` is not a multiple
/// of the block size, [`QuantError::WrongByteCount`] when `bytes.len()` is not
/// `format.bytes_for(out.len())`, [`QuantError::Unsupported`] for Q8_1 (ggml has no `to_float`),
/// [`QuantError::Interleaved`] for an interleaved layout (Q4_0x16: its rows are found with the
/// matrix's shape, [`crate::interleave::dequantize_matrix`]).
pub fn dequantize(format: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let expected = format.bytes_for(out.len())?;
    if bytes.len() != expected {
        return Err(QuantError::WrongByteCount {
            format,
            expected,
            got: bytes.len(),
        });
    }
    match format {
        QuantFormat::F32 => float16::f32_le_to_f32(bytes, out),
        QuantFormat::F16 => float16::f16_row_to_f32(bytes, out),
        QuantFormat::BF16 => float16::bf16_row_to_f32(bytes, out),
        QuantFormat::Q4_0 => q4_0::dequantize_row(bytes, out),
        QuantFormat::Q4_1 => q4_1::dequantize_row(bytes, out),
        QuantFormat::Q5_0 => q5_0::dequantize_row(bytes, out),
        QuantFormat::Q5_1 => q5_1::dequantize_row(bytes, out),
        QuantFormat::Q8_0 => q8_0::dequantize_row(bytes, out),
        QuantFormat::Q2_K => q2_k::dequantize_row(bytes, out),
        QuantFormat::Q3_K => q3_k::dequantize_row(bytes, out),
        QuantFormat::Q4_K => q4_k::dequantize_row(bytes, out),
        QuantFormat::Q5_K => q5_k::dequantize_row(bytes, out),
        QuantFormat::Q6_K => q6_k::dequantize_row(bytes, out),
        QuantFormat::Q8_K => q8_k::dequantize_row(bytes, out),
        QuantFormat::Q8_1 => return Err(QuantError::Unsupported(format)),
        QuantFormat::Q4_0x16 => return Err(QuantError::Interleaved(format)),
    }
    Ok(())
}

/// Convenience wrapper: dequantize `n_elems` values into a new `Vec<f32>`.
/// Errors as [`dequantize`].
pub fn dequantize_to_vec(
    format: QuantFormat,
    bytes: &[u8],
    n_elems: usize,
) -> Result<Vec<f32>, QuantError> {
    let mut out = vec![0.0f32; n_elems];
    dequantize(format, bytes, &mut out)?;
    Ok(out)
}
