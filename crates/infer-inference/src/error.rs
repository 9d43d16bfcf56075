//! Error type of infer-inference.

/// Errors from building a model from a vindex or running it.
#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    #[error(transparent)]
    Vindex(#[from] infer_vindex::VindexError),
    #[error("vindex is missing tensor '{0}' needed by this architecture")]
    MissingTensor(String),
    #[error("tensor '{key}': expected {expected} values, found {found}")]
    BadShape {
        key: String,
        expected: usize,
        found: usize,
    },
    #[error("{0}")]
    Architecture(String),
    #[error("KV cache full: {needed} positions needed, context size is {capacity} (use a larger --ctx or a shorter prompt)")]
    ContextFull { needed: usize, capacity: usize },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("format plan: {0}")]
    Plan(String),
    #[error("compute: {0}")]
    Compute(#[from] infer_compute::ComputeError),
    #[error("the model produced non-finite logits (corrupt weights or config?)")]
    NonFiniteLogits,
    #[error("empty input: nothing to run")]
    EmptyInput,
    /// A log-probability file (`--kl-divergence-base`) that cannot be written or read.
    #[error("{path}: {what}")]
    LogProbFile { path: String, what: String },
}
