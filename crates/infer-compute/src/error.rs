//! Errors of the compute crate.

use infer_quant::{QuantError, QuantFormat};

/// Errors returned by fallible compute entry points (those that take bytes whose layout is
/// described by a format tag).
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// A buffer does not have the length its shape and format require.
    #[error("{what}: expected {expected} {unit}, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
        unit: &'static str,
    },
    /// This backend has no kernel for the format.
    #[error("{backend}: no kernel for format {format}")]
    UnsupportedFormat {
        backend: String,
        format: QuantFormat,
    },
    /// A device backend failed: no device or driver library, a kernel that did not compile
    /// (NVRTC log in `message`), a failed allocation, copy or launch.
    #[error("{backend}: {message}")]
    Device {
        backend: &'static str,
        message: String,
    },
    /// A kernel for ggml block formats was handed a matrix of another storage.
    #[error("a {storage} matrix where ggml blocks were expected")]
    NotBlocks { storage: String },
    /// A host implementation of an operation was handed a tensor in device memory (a tensor
    /// of another backend).
    #[error("{op}: the tensor is in device memory, not on the host (a tensor of another backend)")]
    NotOnHost { op: &'static str },
    /// The KV cache element type cannot hold this model's rows on this backend.
    #[error("KV cache type {kv}: {reason}")]
    KvType { kv: crate::KvType, reason: String },
    /// Error from the block-format layer (bad block alignment, byte count, unsupported format).
    #[error(transparent)]
    Quant(#[from] QuantError),
}
