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

mod config;
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
pub use file::{GgufFile, GgufTensorInfo, DEFAULT_ALIGNMENT};
pub use header::GgufHeader;
pub use permute::{permute_qk_rows, unpermute_qk_byte_rows, unpermute_qk_rows};
pub use source::{open_gguf_source, GgufTensors, RawBlocks};
pub use tokenizer::tokenizer_json_from_gguf;
pub use value::{GgufArray, GgufValue};
pub use writer::{encode_header, GgufWriter};
