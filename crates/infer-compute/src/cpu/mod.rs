//! The CPU backend: `matrixmultiply` sgemm for matrix products, a hand-written auto-vectorised
//! dot product for matrix–vector products, both split across rayon's thread pool.

mod dot;
mod f16;
mod gemv;
mod matmul;
mod quant;
mod quant_fallback;
mod quant_many;
mod quant_tile;

use crate::vec_dot::Isa;
use crate::{ComputeBackend, ComputeError, QuantProj};
use infer_quant::QuantFormat;

pub use dot::dot;
pub(crate) use dot::dot_generic;
pub use f16::{axpy_f16, dot_f16};
pub(crate) use quant::Split;

/// CPU implementation of [`ComputeBackend`]: f32 products plus fused quantized kernels.
/// Holds only the instruction set of its quantized kernels; uses rayon's global thread pool
/// (size it with `RAYON_NUM_THREADS` or `rayon::ThreadPoolBuilder`).
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    isa: Isa,
}

impl CpuBackend {
    /// A CPU backend on rayon's global thread pool, with the fastest quantized kernels this CPU
    /// supports ([`Isa::best`], detected at run time).
    pub fn new() -> Self {
        CpuBackend { isa: Isa::best() }
    }

    /// A CPU backend whose quantized kernels use `isa` (e.g. [`Isa::Generic`] to run the scalar
    /// reference kernels). `None` if this CPU cannot run `isa`.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        isa.is_available().then_some(CpuBackend { isa })
    }

    /// The instruction set of this backend's quantized kernels.
    pub fn isa(&self) -> Isa {
        self.isa
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ComputeBackend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn matmul_transb(&self, a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
        matmul::matmul_transb(a, b, m, k, n, c);
    }

    fn matmul(&self, a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
        matmul::matmul(a, b, m, k, n, c);
    }

    fn gemv(&self, b: &[f32], x: &[f32], n: usize, k: usize, y: &mut [f32]) {
        gemv::gemv(b, x, n, k, y);
    }

    fn matmul_transb_f16(
        &self,
        a: &[f32],
        b: &[half::f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        f16::matmul_transb_f16(self.isa, a, b, m, k, n, c);
    }

    fn matmul_f16(&self, a: &[f32], b: &[half::f16], m: usize, k: usize, n: usize, c: &mut [f32]) {
        f16::matmul_f16(self.isa, a, b, m, k, n, c);
    }

    fn quant_matvec(
        &self,
        format: QuantFormat,
        bytes: &[u8],
        x: &[f32],
        rows: usize,
        cols: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        quant::quant_matvec(self.isa, format, bytes, x, rows, cols, y)
    }

    fn quant_matmul(
        &self,
        format: QuantFormat,
        bytes: &[u8],
        x: &[f32],
        m: usize,
        rows: usize,
        cols: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        quant::quant_matmul(self.isa, format, bytes, x, m, rows, cols, y)
    }

    fn quant_matmul_many(
        &self,
        x: &[f32],
        m: usize,
        cols: usize,
        projs: &mut [QuantProj<'_>],
    ) -> Result<(), ComputeError> {
        quant_many::quant_matmul_many(self.isa, x, m, cols, projs)
    }
}
