//! Run-time selection of the x86-64 AVX2 kernels (absent on other architectures).

use super::VecDotFn;
use infer_quant::QuantFormat;

#[cfg(target_arch = "x86_64")]
use super::avx2;

/// True when this CPU has AVX2, FMA and F16C (always false off x86-64).
pub fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::detected()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The AVX2 kernel for `weights`; the caller has checked [`avx2_available`].
pub(super) fn kernel(weights: QuantFormat) -> Option<VecDotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        match weights {
            QuantFormat::Q4_0 => Some(avx2::vec_dot_q4_0_q8_0 as VecDotFn),
            QuantFormat::Q5_0 => Some(avx2::vec_dot_q5_0_q8_0),
            QuantFormat::Q8_0 => Some(avx2::vec_dot_q8_0_q8_0),
            QuantFormat::Q4_K => Some(avx2::vec_dot_q4_k_q8_k),
            QuantFormat::Q6_K => Some(avx2::vec_dot_q6_k_q8_k),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = weights;
        None
    }
}
