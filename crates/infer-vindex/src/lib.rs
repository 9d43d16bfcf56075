//! infer-vindex: the vindex, a directory of memory-mapped weight files.
//!
//! - [`files`]: the one registry of file names.
//! - [`build`] / [`extract`]: stream a checkpoint (HF folder or GGUF, via
//!   [`infer_models::open_source`]) into `NAME.vindex/`, atomically.
//! - [`Vindex::open`]: map and validate; then zero-copy accessors ([`Vindex::gate_vectors`],
//!   [`Vindex::down_layer_matrix`], [`Vindex::tensor`], …) hand out `&[f32]`/`&[f16]` views.
//! - [`verify()`]: re-hash every file against `index.json`.
//! - [`describe`]: the text `infer inspect <vindex>` prints.
//!
//! Float tier layout: `embeddings.bin` `[vocab, hidden]`; `gate_vectors.bin`, `up_features.bin`,
//! `down_features.bin` one `[intermediate, hidden]` matrix per layer (down transposed from HF's
//! `[hidden, intermediate]`); `norms.bin`, `attn_weights.bin`, `other_weights.bin` with JSON
//! manifests of `{key, shape, format, offset, length}`; `lm_head.bin` when untied. Every tensor
//! starts at a 64-byte aligned offset; values are little-endian f32 or f16 (matrices in the
//! chosen dtype, 1-D tensors always f32).

mod api;
mod atomic;
pub mod build;
pub mod classify;
mod describe;
mod error;
pub mod files;
mod hash;
pub mod index;
mod load;
pub mod manifest;
mod tokenizer_src;
pub mod transform;
mod verify;
mod writer;

pub use api::FloatSlice;
pub use build::{build, extract, BuildOptions};
pub use describe::describe;
pub use error::VindexError;
pub use index::{Dtype, FileHash, LayerEntries, Provenance, Shapes, VindexIndex, FORMAT_VERSION};
pub use load::Vindex;
pub use manifest::{TensorEntry, TENSOR_ALIGN};
pub use verify::{verify, FileMismatch, VerifyReport};
