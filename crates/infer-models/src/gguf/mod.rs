//! GGUF v2/v3 files (llama.cpp's format): parsing, config, tensors by HF name, tokenizer.
//!
//! - [`GgufFile`]: validated header, metadata and tensor infos over a memory map.
//! - [`config_from_gguf`]: the typed [`crate::ModelConfig`] from `<arch>.*` metadata plus family
//!   defaults for what GGUF does not store.
//! - [`open_gguf_source`]: a [`crate::ModelSource`] whose tensors carry HF names and read as f32
//!   with llama.cpp's conventions undone.
//! - [`tokenizer_json_from_gguf`]: a vindex `tokenizer.json` built from `tokenizer.ggml.*`
//!   (SentencePiece, byte-level BPE and Gemma-4 vocabularies).
//! - [`GgufHeader`] (header and tensor table, no data needed) and [`GgufWriter`] /
//!   [`encode_header`]: write GGUF files.
//! - [`model_metadata`] / [`tokenizer_metadata`] / [`export_family`]: the metadata and tensor
//!   conventions of a model written back to GGUF (the inverses of the readers above).

mod config;
mod export;
mod family;
mod file;
mod header;
mod permute;
mod pre_tokenizer;
mod reader;
mod source;
mod tokenizer;
mod value;
mod writer;

pub use config::config_from_gguf;
pub use export::{
    export_family, exportable_model_types, model_metadata, tokenizer_metadata, ExportFamily,
};
pub use file::{GgufFile, GgufTensorInfo, DEFAULT_ALIGNMENT};
pub use header::GgufHeader;
pub use permute::{
    permute_qk_byte_rows, permute_qk_rows, unpermute_qk_byte_rows, unpermute_qk_rows,
};
pub use source::{open_gguf_source, GgufTensors, RawBlocks};
pub use tokenizer::tokenizer_json_from_gguf;
pub use value::{GgufArray, GgufValue};
pub use writer::{encode_header, GgufWriter};
