//! Model sources and model description.
//!
//! - [`ModelConfig`]: the typed config of a checkpoint, parsed from HF `config.json` (v4 and v5
//!   layouts) or from GGUF metadata.
//! - [`ModelArchitecture`]: every per-layer question the forward pass asks (head_dim, RoPE, norms,
//!   FFN type, soft-caps, …), answered per family.
//! - [`TensorSource`]: iterate tensors by Hugging Face name and read them as `f32`, whatever the
//!   source (HF safetensors folder or GGUF file). [`open_source`] picks the right one for a path.
//! - [`tokenizer::Tokenizer`]: text ↔ ids for a HF `tokenizer.json` or a GGUF vocabulary.

pub mod arch;
pub mod config;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod names;
pub mod source;
pub mod text;
pub mod tokenizer;

pub use arch::{architecture_for, Activation, FfnType, ModelArchitecture, NormType};
pub use config::{LayerKind, ModelConfig, RopeScaling};
pub use error::ModelError;
pub use source::{
    open_source, EncodedRows, ModelSource, SourceKind, Tensor, TensorInfo, TensorSource,
};
