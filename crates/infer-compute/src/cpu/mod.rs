//! The CPU backend: `matrixmultiply` sgemm for matrix products, a hand-written auto-vectorised
//! dot product for matrix–vector products, both split across rayon's thread pool.

mod dot;
mod gemv;
mod matmul;
mod quant;

use crate::{ComputeBackend, ComputeError};
use infer_quant::QuantFormat;

pub use dot::dot;

/// f32 CPU implementation of [`ComputeBackend`]. Stateless; uses rayon's global thread pool
/// (size it with `RAYON_NUM_THREADS` or `rayon::ThreadPoolBuilder`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// A CPU backend on rayon's global thread pool.
    pub fn new() -> Self {
        CpuBackend
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

    fn quant_matvec(
        &self,
        format: QuantFormat,
        bytes: &[u8],
        x: &[f32],
        rows: usize,
        cols: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        quant::quant_matvec(format, bytes, x, rows, cols, y)
    }
}
