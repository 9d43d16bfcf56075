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
use crate::{ComputeBackend, ComputeError, KvType, MatData, Matrix, Proj, Tensor};

pub use dot::dot;
#[cfg(target_arch = "x86_64")]
#[cfg(target_arch = "x86_64")]
pub(crate) use dot::dot_avx2_kv;
pub(crate) use dot::dot_generic;
pub use f16::{axpy_f16, dot_f16};
pub(crate) use quant::Split;

/// CPU implementation of [`ComputeBackend`]: f32 products plus fused quantized kernels.
/// Holds only the instruction set of its quantized kernels and the type of its KV caches; uses
/// rayon's global thread pool (size it with `RAYON_NUM_THREADS` or `rayon::ThreadPoolBuilder`).
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    isa: Isa,
    /// How KV caches made by `fit_kv` store their values: f32 (the default) or f16.
    kv: KvType,
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
            kv: KvType::F32,
            moe_routing_ops: false,
        }
    }

    /// A CPU backend whose quantized kernels use `isa` (e.g. [`Isa::Generic`] to run the scalar
    /// reference kernels). `None` if this CPU cannot run `isa`.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        isa.is_available().then_some(CpuBackend {
            isa,
            kv: KvType::F32,
            moe_routing_ops: false,
        })
    }

    /// The instruction set of this backend's quantized kernels.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// This backend with its KV caches stored as `kv` (`--kv-type`): [`KvType::F32`] (the
    /// default) or [`KvType::F16`] (half the memory and half the bytes a decode step's
    /// attention reads; keys and values rounded to nearest even when stored, widened exactly
    /// when read). [`KvType::Q8_0`] is accepted here but refused by `fit_kv` (the first forward
    /// pass) with [`ComputeError::KvType`]: the CPU has no q8_0 cache.
    pub fn with_kv_type(self, kv: KvType) -> Self {
        CpuBackend { kv, ..self }
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

    fn kv_type(&self) -> KvType {
        self.kv
    }

    /// An f32 cache is a host tensor as [`ComputeBackend::fit`] makes it; an f16 cache a host
    /// f16 tensor ([`Tensor::host_f16_zeros`]), which `attend`, `read_at` and `write_at` read and
    /// write in place. Errors: a head_dim the type cannot store, a q8_0 cache.
    fn fit_kv(&self, t: &mut Tensor, len: usize, head_dim: usize) -> Result<(), ComputeError> {
        self.kv.check_head_dim(head_dim)?;
        match self.kv {
            KvType::F32 => self.fit(t, len),
            KvType::F16 => {
                if t.host_f16().is_none() {
                    *t = Tensor::host_f16_zeros(len);
                }
                t.set_len(len);
                Ok(())
            }
            KvType::Q8_0 => Err(ComputeError::KvType {
                kv: self.kv,
                reason: "the CPU backend stores its KV cache as f32 or f16 only".into(),
            }),
        }
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
