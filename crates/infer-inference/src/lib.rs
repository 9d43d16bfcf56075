//! Inference from a vindex: pipeline assembly ([`Model`], one [`FullPipelineLayer`] per layer),
//! the forward pass (prefill and decode share one loop), KV cache, walk FFN, sampling,
//! tokenizer and chat templates, and the generation loop.

pub mod chat;
pub mod conversation;
pub mod error;
pub mod forward;
pub mod generate;
pub mod kl_divergence;
pub mod kv_cache;
pub mod layer;
pub mod model;
pub mod perplexity;
pub mod plan;
pub mod sampling;
mod scratch;
pub mod tokenizer;
pub mod walk;
pub mod walk_k;
mod walk_sparse;

pub use conversation::Conversation;
pub use error::InferenceError;
pub use generate::{GenerateOptions, GenerationStats, Generator, StopFilter, StopReason};
pub use kv_cache::KvCache;
pub use layer::{AttnPath, FfnPath, FloatRows, FullPipelineLayer, LayerGeometry};
pub use model::Model;
pub use plan::{AttnChoice, FfnChoice, FormatPlan, FormatRequest, LmHeadChoice, LmHeadPath};
pub use sampling::{Sampler, SamplingParams};
pub use tokenizer::{TextStreamer, Tokenizer};
pub use walk_k::{KValue, Selection, WalkK};
