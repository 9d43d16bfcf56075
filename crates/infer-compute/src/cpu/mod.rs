//! The CPU backend: `matrixmultiply` sgemm for matrix products, a hand-written auto-vectorised
//! dot product for matrix–vector products, both split across rayon's thread pool.

mod dot;
mod f16;
#[cfg(target_arch = "x86_64")]
mod f16_tile;
mod gemv;
mod matmul;
mod quant;
mod quant_fallback;
mod quant_many;
mod quant_tile;
mod quant_x16;

use crate::vec_dot::Isa;
use crate::{ComputeBackend, ComputeError, MatData, Matrix, Proj};

pub use dot::dot;
#[cfg(target_arch = "x86_64")]
pub(crate) use dot::dot_avx2;
pub(crate) use dot::dot_generic;
pub use f16::{axpy_f16, dot_f16};
pub(crate) use quant::Split;

/// CPU implementation of [`ComputeBackend`]: f32 products plus fused quantized kernels.
/// Holds only the instruction set of its quantized kernels; uses rayon's global thread pool
/// (size it with `RAYON_NUM_THREADS` or `rayon::ThreadPoolBuilder`).
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    isa: Isa,
    /// MoE decode through `moe_route` / `project_routed` / `combine_routed` (the path of a
    /// device backend) instead of the host's own routing: [`CpuBackend::with_moe_routing_ops`].
    moe_routing_ops: bool,
}

impl CpuBackend {
    /// A CPU backend on rayon's global thread pool, with the fastest quantized kernels this CPU
    /// supports ([`Isa::best`], detected at run time).
    pub fn new() -> Self {
        CpuBackend {
            isa: Isa::best(),
            moe_routing_ops: false,
        }
    }

    /// A CPU backend whose quantized kernels use `isa` (e.g. [`Isa::Generic`] to run the scalar
    /// reference kernels). `None` if this CPU cannot run `isa`.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        isa.is_available().then_some(CpuBackend {
            isa,
            moe_routing_ops: false,
        })
    }

    /// The instruction set of this backend's quantized kernels.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// This backend reporting [`ComputeBackend::routes_on_device`], so that the forward pass
    /// decodes MoE layers through `moe_route`, `project_routed` and `combine_routed` (their CPU
    /// implementations), the path a device backend takes: for tests of that path without a
    /// device. Same results as the host routing (the same top-k rule), a little slower.
    pub fn with_moe_routing_ops(self) -> Self {
        CpuBackend {
            moe_routing_ops: true,
            ..self
        }
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

    fn routes_on_device(&self) -> bool {
        self.moe_routing_ops
    }

    fn matmul_transb(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        matmul::matmul_transb(a, b, m, k, n, c);
        Ok(())
    }

    fn matmul(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        matmul::matmul(a, b, m, k, n, c);
        Ok(())
    }

    fn gemv(
        &self,
        b: &[f32],
        x: &[f32],
        n: usize,
        k: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        gemv::gemv(b, x, n, k, y);
        Ok(())
    }

    fn matmul_transb_f16(
        &self,
        a: &[f32],
        b: &[half::f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        f16::matmul_transb_f16(self.isa, a, b, m, k, n, c);
        Ok(())
    }

    fn matmul_f16(
        &self,
        a: &[f32],
        b: &[half::f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        f16::matmul_f16(self.isa, a, b, m, k, n, c);
        Ok(())
    }

    fn linear(
        &self,
        w: &Matrix<'_>,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        w.check_product(x, m, y)?;
        match w.data {
            MatData::F32(b) => self.matmul_transb(x, b, m, w.cols, w.rows, y),
            MatData::F16(b) => self.matmul_transb_f16(x, b, m, w.cols, w.rows, y),
            MatData::Blocks { .. } => quant::quant_matmul(self.isa, w, x, m, y),
            MatData::SplitQ8 { values, scales } => {
                crate::q8_split::q8_matmul(values, scales, x, m, w.rows, w.cols, y)
            }
        }
    }

    fn linear_many(&self, x: &[f32], m: usize, projs: &mut [Proj<'_>]) -> Result<(), ComputeError> {
        crate::matrix::linear_many_with(self, x, m, projs, |projs| {
            quant_many::quant_matmul_many(self.isa, x, m, projs)
        })
    }
}
