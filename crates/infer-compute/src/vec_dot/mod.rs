//! Fused quantized dot products: one row of ggml weight blocks against one row of quantized
//! activations, without dequantizing to f32 (the CPU `vec_dot` of ggml).
//!
//! Like ggml, every weight format is paired with an activation format
//! ([`activation_format`]): Q4_K and Q6_K weights with Q8_K activations, Q4_0, Q5_0 and Q8_0
//! weights with Q8_0 activations. The activations of a mat-vec are quantized once
//! ([`quantize_activations`]), then each weight row is one kernel call.
//!
//! Two implementations per pair, chosen by [`Isa`]:
//! - [`generic`]: scalar ports of ggml `ggml_vec_dot_*_generic`; bit-exact with ggml's scalar
//!   build, the correctness reference.
//! - AVX2 + FMA + F16C ports of ggml's `__AVX2__` paths (x86-64 only, chosen at run time).

#[cfg(target_arch = "x86_64")]
mod avx2;
mod avx2_dispatch;
pub mod generic;
mod layout;

use crate::ComputeError;
use infer_quant::QuantFormat;

pub use avx2_dispatch::avx2_available;

/// A fused dot product: `(n, weight_blocks, activation_blocks) -> Σ w·a` for a row of `n` values
/// (`n` a multiple of the block size). Panics if a slice holds fewer than `n / block` blocks.
pub type VecDotFn = fn(usize, &[u8], &[u8]) -> f32;

/// Instruction set of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable scalar code ([`generic`]); available everywhere.
    Generic,
    /// x86-64 AVX2 + FMA + F16C (checked at run time with `is_x86_feature_detected!`).
    Avx2,
}

impl Isa {
    /// The fastest instruction set this CPU supports.
    pub fn best() -> Isa {
        if avx2_available() {
            Isa::Avx2
        } else {
            Isa::Generic
        }
    }

    /// True when this CPU can run kernels of this instruction set.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Generic => true,
            Isa::Avx2 => avx2_available(),
        }
    }
}

/// The activation format ggml pairs with weight format `weights` (its CPU `vec_dot_type`), for
/// the weight formats that have a fused kernel here: Q4_K, Q6_K → Q8_K; Q4_0, Q5_0, Q8_0 → Q8_0.
/// `None` for every other format (those take the dequantize-then-dot path).
pub fn activation_format(weights: QuantFormat) -> Option<QuantFormat> {
    match weights {
        QuantFormat::Q4_K | QuantFormat::Q6_K => Some(QuantFormat::Q8_K),
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => Some(QuantFormat::Q8_0),
        _ => None,
    }
}

/// The fused kernel for `weights` × [`activation_format`]`(weights)` in instruction set `isa`.
/// `None` when the format has no fused kernel or `isa` is not available on this CPU.
pub fn kernel(weights: QuantFormat, isa: Isa) -> Option<VecDotFn> {
    if !isa.is_available() {
        return None;
    }
    match isa {
        Isa::Generic => match weights {
            QuantFormat::Q4_0 => Some(generic::vec_dot_q4_0_q8_0 as VecDotFn),
            QuantFormat::Q5_0 => Some(generic::vec_dot_q5_0_q8_0),
            QuantFormat::Q8_0 => Some(generic::vec_dot_q8_0_q8_0),
            QuantFormat::Q4_K => Some(generic::vec_dot_q4_k_q8_k),
            QuantFormat::Q6_K => Some(generic::vec_dot_q6_k_q8_k),
            _ => None,
        },
        Isa::Avx2 => avx2_dispatch::kernel(weights),
    }
}

/// Quantize activations `x` (whole rows, `x.len()` a multiple of the block size) to `format`
/// into `out` (`format.bytes_for(x.len())` bytes): Q8_K with ggml `quantize_row_q8_K_ref`
/// (also ggml's x86 `from_float` for Q8_K), Q8_0 with ggml `quantize_row_q8_0_ref`
/// (`d = amax/127`, `roundf`; ggml's AVX `quantize_row_q8_0` rounds ties to even instead and
/// can differ by one level on exact ties). Both come from `infer_quant`.
///
/// Errors: [`ComputeError::UnsupportedFormat`] for any other format,
/// [`ComputeError::Quant`] when `x.len()` is not block aligned, [`ComputeError::ShapeMismatch`]
/// when `out` has the wrong length.
pub fn quantize_activations(
    format: QuantFormat,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), ComputeError> {
    let expected = format.bytes_for(x.len())?;
    if out.len() != expected {
        return Err(ComputeError::ShapeMismatch {
            what: "quantized activation buffer",
            expected,
            got: out.len(),
            unit: "bytes",
        });
    }
    match format {
        QuantFormat::Q8_K => infer_quant::q8_k::quantize_row_ref(x, out),
        QuantFormat::Q8_0 => infer_quant::q8_0::quantize_row_ref(x, out),
        _ => {
            return Err(ComputeError::UnsupportedFormat {
                backend: "activation quantizer".to_string(),
                format,
            })
        }
    }
    Ok(())
}
