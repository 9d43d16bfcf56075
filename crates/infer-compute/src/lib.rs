//! infer-compute: the [`ComputeBackend`] trait, its CPU implementation [`CpuBackend`], and the
//! f32 building blocks of a transformer forward pass (norms, activations, RoPE, attention).
//!
//! Everything here works on plain `&[f32]` activations in row-major layout and never reads the
//! vindex: callers hand in slices (mmap views or owned buffers) and shapes. Quantized weights
//! arrive as `(&[u8], QuantFormat)` pairs (see [`ComputeBackend::quant_matvec`] and
//! [`ComputeBackend::quant_matmul`]); their fused dot-product kernels live in [`vec_dot`].

mod attention;
mod attention_blocked;
mod backend;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod decode_plan;
mod error;
mod host_ops;
mod matrix;
mod op_args;
pub mod ops;
pub mod q8_split;
mod rope;
mod scratch;
mod shared_out;
pub mod vec_dot;

pub use attention::{attention, attention_reference, AttentionParams};
pub use backend::ComputeBackend;
pub use cpu::{axpy_f16, dot_f16, CpuBackend};
pub use decode_plan::{DecodePlan, PlanLayer, TokenDecoder};
pub use error::ComputeError;
pub use infer_quant::QuantFormat;
pub use matrix::{MatData, Matrix, Proj};
pub use op_args::{Argmax, AttentionInput, FloatTable, Norm, NormKind};
pub use rope::{apply_rope, Rope, RopeConfig, RopeScaling};
pub use vec_dot::Isa;
