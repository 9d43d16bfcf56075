//! One interface over every checkpoint source: tensors by Hugging Face name, read as `f32`.

use std::path::{Path, PathBuf};

use infer_quant::QuantFormat;

use crate::{ModelConfig, ModelError};

/// Metadata of one tensor as the source stores it, under its Hugging Face name.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Row-major shape in HF/PyTorch order (`[out_features, in_features]` for a Linear weight).
    pub shape: Vec<usize>,
    /// Storage format in the source (F32/F16/BF16 for safetensors; any ggml type for GGUF).
    pub dtype: QuantFormat,
    /// Bytes the tensor occupies in the source file.
    pub bytes: usize,
}

/// A tensor decoded to `f32`, row-major, with its HF shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A tensor's stored bytes in HF row order (see [`TensorSource::encoded_rows`]): `bytes` is the
/// rows concatenated, each `format.bytes_for(row length)` bytes (whole ggml blocks for a
/// quantized GGUF tensor, little-endian F32/F16/BF16 values for safetensors).
#[derive(Clone, Debug)]
pub struct EncodedRows<'a> {
    /// Storage format of `bytes`.
    pub format: QuantFormat,
    /// The rows, borrowed from the mapped file, or owned when rows had to be reordered.
    pub bytes: std::borrow::Cow<'a, [u8]>,
}

/// Tensors of a checkpoint by Hugging Face name, decoded to `f32` on demand (one at a time, so a
/// caller streaming layer by layer never holds the whole model).
pub trait TensorSource: Send + Sync {
    /// Every tensor, in a stable order, under its HF name (after any GGUF name mapping).
    fn tensors(&self) -> &[TensorInfo];
    /// Decode one tensor to `f32` with every source convention undone (ggml dequantization,
    /// llama.cpp's Q/K row permutation, Gemma's `+1` on norms).
    /// Errors: [`ModelError::NoSuchTensor`], or a decode error naming the file.
    fn read_f32(&self, name: &str) -> Result<Tensor, ModelError>;
    /// The tensor's stored bytes in HF row order with their format, when decoding them with
    /// [`infer_quant::dequantize`] (any number of whole rows at a time) gives exactly
    /// [`TensorSource::read_f32`]'s values: a caller can then decode and re-encode a large tensor
    /// in row chunks, in parallel, without holding it in `f32`. `Ok(None)` when a source
    /// convention changes values (Gemma's `+1` on GGUF norms) or the source cannot slice (the
    /// default). Errors: [`ModelError::NoSuchTensor`], or a layout error naming the file.
    fn encoded_rows(&self, name: &str) -> Result<Option<EncodedRows<'_>>, ModelError> {
        let _ = name;
        Ok(None)
    }
    /// Look up a tensor's info by HF name.
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors().iter().find(|t| t.name == name)
    }
}

/// What kind of checkpoint a [`ModelSource`] was opened from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// A Hugging Face folder: `config.json` + `model.safetensors` or sharded safetensors.
    HfFolder,
    /// A single GGUF v2/v3 file.
    Gguf,
}

/// An opened checkpoint: typed config, tensors, and the tokenizer/chat-template material it carries.
pub struct ModelSource {
    pub path: PathBuf,
    pub kind: SourceKind,
    pub config: ModelConfig,
    pub tensors: Box<dyn TensorSource>,
    /// `tokenizer.json` text: from the HF folder, or next to the GGUF, when present.
    pub tokenizer_json: Option<String>,
    /// `tokenizer_config.json` text from the HF folder, when present.
    pub tokenizer_config_json: Option<String>,
    /// Jinja chat template (HF `chat_template.jinja`, `tokenizer_config.json`, or GGUF
    /// `tokenizer.chat_template`).
    pub chat_template: Option<String>,
    /// The parsed GGUF (metadata incl. `tokenizer.ggml.*`), for GGUF sources.
    pub gguf: Option<std::sync::Arc<crate::gguf::GgufFile>>,
}

/// Open a checkpoint: a directory is read as a Hugging Face folder, a file as GGUF.
/// Errors: the path does not exist, or the files are missing/corrupt (the error names the file).
pub fn open_source(path: &Path) -> Result<ModelSource, ModelError> {
    let meta = std::fs::metadata(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    if meta.is_dir() {
        if !path.join("config.json").exists() {
            // Say what the folder is not, rather than "config.json: No such file" (a vindex
            // folder that lost its index.json lands here too).
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                msg: "is neither a vindex (no index.json) nor a Hugging Face model folder \
                      (no config.json)"
                    .into(),
            });
        }
        crate::hf::open_hf_folder(path)
    } else {
        crate::gguf::open_gguf_source(path)
    }
}
