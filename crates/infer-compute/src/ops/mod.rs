//! Element-wise and per-row f32 operations of a transformer forward pass. Each function
//! documents the formula it implements and where that formula comes from (HF transformers).
//!
//! Slice-length disagreements are programmer errors and panic with a message.

mod activation;
mod elementwise;
mod erf;
mod fast_act;
mod moe;
pub(crate) use fast_act::exp_poly;
mod norm;

pub use crate::cpu::dot;
pub use activation::{clamped_swiglu, gelu, gelu_tanh, silu, Activation};
pub use elementwise::{add_inplace, scale_inplace, softcap, softcap_inplace, softmax_inplace};
pub use erf::{erf, erfc};
pub use fast_act::{act_fast_inplace, gated_mul_fast};
pub use moe::moe_route;
pub use norm::{layer_norm, rms_norm, rms_norm_inplace};
