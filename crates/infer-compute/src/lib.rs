//! infer-compute: the [`ComputeBackend`] trait, its CPU implementation [`CpuBackend`], and the
//! f32 building blocks of a transformer forward pass (norms, activations, RoPE, attention).
//!
//! Activations are row-major f32: host slices for the weight products and kernels, [`Tensor`]s
//! in the backend's memory for the forward pass's operations. Nothing here reads the vindex:
//! weights arrive as [`Matrix`] views (storage tag + bytes + shape); the fused dot-product
//! kernels of the ggml block formats live in [`vec_dot`].

mod attention;
mod attention_blocked;
mod attention_group;
mod backend;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod host_ops;
mod kv_type;
mod matrix;
mod op_args;
pub mod ops;
pub mod q8_split;
mod rope;
mod scratch;
mod shared_out;
mod tensor;
pub mod vec_dot;

pub use attention::{attention, attention_reference, AttentionParams};
pub use backend::{add_norm_composed, host, host_mut, rope_attend_composed, ComputeBackend};
pub use cpu::{axpy_f16, dot_f16, CpuBackend};
pub use error::ComputeError;
pub use host_ops::expert_index;
pub use infer_quant::QuantFormat;
pub use kv_type::{KvElem, KvType};
pub use matrix::{ExpertRows, MatData, Matrix, Proj, RoutedProj, TensorProj};
pub use op_args::{
    Argmax, Attend, AttentionInput, Chosen, FloatTable, KvSlot, Norm, NormKind, ResidualNorm,
    RopeAttend,
};
pub use rope::{apply_rope, Rope, RopeConfig, RopeScaling};
pub use tensor::{DeviceBuffer, HostVec, Tensor};
pub use vec_dot::Isa;
