//! Error type of infer-models. Every variant names the file (or key) and what is wrong.

use std::path::PathBuf;

/// Errors from reading model files and configs.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {msg}")]
    Json { path: PathBuf, msg: String },
    #[error("{path}: config field '{field}' is missing or has the wrong type")]
    MissingField { path: PathBuf, field: String },
    #[error("{path}: config field '{field}': {msg}")]
    BadField {
        path: PathBuf,
        field: String,
        msg: String,
    },
    #[error("{path}: unknown model_type '{model_type}' (supported: {supported})")]
    UnknownArchitecture {
        path: PathBuf,
        model_type: String,
        supported: String,
    },
    #[error("{path}: not a GGUF file or corrupt: {msg}")]
    BadGguf { path: PathBuf, msg: String },
    #[error("{path}: bad safetensors file: {msg}")]
    BadSafetensors { path: PathBuf, msg: String },
    #[error("{path}: tensor '{name}': {msg}")]
    BadTensor {
        path: PathBuf,
        name: String,
        msg: String,
    },
    #[error("{path}: no tensor named '{name}'")]
    NoSuchTensor { path: PathBuf, name: String },
    #[error("{path}: {msg}")]
    Unsupported { path: PathBuf, msg: String },
    #[error("{path}: {source}")]
    Quant {
        path: PathBuf,
        source: infer_quant::QuantError,
    },
}
