//! infer-vindex: the vindex, a directory of memory-mapped weight files.
//!
//! - [`files`]: the one registry of file names.
//! - [`build`] / [`extract`]: stream a checkpoint (HF folder or GGUF, via
//!   [`infer_models::open_source`]) into `NAME.vindex/`, atomically.
//! - [`Vindex::open`]: map and validate; then zero-copy accessors ([`Vindex::gate_vectors`],
//!   [`Vindex::down_layer_matrix`], [`Vindex::tensor`], …) hand out `&[f32]`/`&[f16]` views.
//! - [`down_meta`]: `down_meta.bin`, each FFN feature's top tokens through the unembedding
//!   (opt-in, [`BuildOptions::down_meta`]), read with [`Vindex::down_meta`].
//! - [`verify()`]: re-hash every file against `index.json`.
//! - [`describe`]: the text `infer inspect <vindex>` prints.
//!
//! Float tier layout: `embeddings.bin` `[vocab, hidden]`; `gate_vectors.bin`, `up_features.bin`,
//! `down_features.bin` one `[intermediate, hidden]` matrix per layer (down transposed from HF's
//! `[hidden, intermediate]`); `norms.bin`, `attn_weights.bin`, `other_weights.bin` with JSON
//! manifests of `{key, shape, format, offset, length}`; `lm_head.bin` when untied. Every tensor
//! starts at a 64-byte aligned offset; values are little-endian f32 or f16 (matrices in the
//! chosen dtype, 1-D tensors always f32).
//!
//! Quantized tiers ([`Tier`], chosen with [`BuildOptions::quant`], written by
//! [`quant_build`]): raw ggml blocks in HF Linear layout `[out, in]` with a manifest per file
//! whose `format` tag is per tensor (K-quants fall back to Q5_0/Q8_0 for rows that are not a
//! multiple of 256, and any block format to F16 for rows that are not a multiple of 32). The data-provider API ([`Vindex::attn_q4k_layer_data`],
//! [`Vindex::ffn_q4k_layer_data`], [`Vindex::attn_q8_layer_data`], …) hands out the bytes with
//! their format; [`quant_stats`] measures their error against the float tier.

mod api;
mod atomic;
pub mod build;
pub mod classify;
mod describe;
pub mod down_meta;
mod down_meta_build;
mod error;
pub mod files;
mod hash;
pub mod index;
mod load;
pub mod manifest;
mod quant_api;
pub mod quant_build;
mod quant_stats;
pub mod tier;
mod tokenizer_src;
pub mod transform;
mod verify;
mod writer;

pub use api::FloatSlice;
pub use build::{build, extract, BuildOptions};
pub use describe::describe;
pub use down_meta::{DownMeta, DownMetaHeader, TokenScore, Unembedding};
pub use error::VindexError;
pub use index::{
    Dtype, FileHash, LayerEntries, Passthrough, Provenance, Shapes, VindexIndex, FORMAT_VERSION,
    INFER_VERSION,
};
pub use load::Vindex;
pub use manifest::{I8Entry, TensorEntry, I8_TAG, TENSOR_ALIGN};
pub use quant_api::Q8Slices;
pub use quant_stats::{dequantize_stored, quant_stats, reference_f32, QuantStat};
pub use tier::{QuantTiers, Tier};
pub use tokenizer_src::{check_tokenizer, resolve_tokenizer};
pub use verify::{verify, FileMismatch, VerifyReport};
