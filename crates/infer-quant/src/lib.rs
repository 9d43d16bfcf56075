//! ggml block formats: the one table of formats, f16/bf16 conversion, and ggml-exact
//! quantize / dequantize reference code. Depends on no other crate of this workspace.

mod format;
pub use format::QuantFormat;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("unknown quantization format '{0}'")]
    UnknownFormat(String),
    #[error("unknown ggml type id {0}")]
    UnknownGgmlType(u32),
    #[error("{n_elems} values are not a multiple of the {format} block size {block_elems}")]
    NotBlockAligned {
        format: QuantFormat,
        n_elems: usize,
        block_elems: usize,
    },
    #[error("{format}: expected {expected} bytes, got {got}")]
    WrongByteCount {
        format: QuantFormat,
        expected: usize,
        got: usize,
    },
    #[error("{0} is not supported by this operation")]
    Unsupported(QuantFormat),
}

/// Dequantize `bytes` (whole blocks of `format`) into `out` (`out.len()` values), exactly as
/// ggml's `to_float` (`dequantize_row_*`). Errors: byte count does not match `out.len()`.
pub fn dequantize(format: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let _ = (format, bytes, out);
    todo!("dequantization lands with the infer-quant work")
}
