//! The CUDA backend ([`CudaBackend`], feature `cuda`): the [`ComputeBackend`] products on an
//! NVIDIA GPU through `cudarc` (driver API and NVRTC, both loaded at run time, so a build without
//! CUDA works and fails only when a backend is opened).
//!
//! - Kernels (`kernels.cu`) are compiled with NVRTC when the backend is opened, for the
//!   device's compute capability (PTX, e.g. `compute_90` on an H100/H200).
//! - The forward pass's tensors ([`crate::Tensor`]) are device allocations and every whole
//!   operation runs on them on the device (`tensor_ops.rs`, `ops.cu`): activations and the KV
//!   cache stay on the device, only the logits come back.
//! - The host-slice products (`linear`, the f32 tables) copy per call, like the CPU backend's
//!   signatures. Weights (quantized bytes, f32 and
//!   f16 matrices) are uploaded on first use and kept on the device, keyed by the host slice's
//!   address and length (the vindex mmap never moves) and checked by a sampled fingerprint;
//!   activations and results are copied per call.
//! - Quantized products mirror the CPU numerics (`crate::vec_dot::generic`, `crate::q8_split`):
//!   activations are quantized on the device to the CPU's activation format with the same f32
//!   operations (Q8_K for Q4_K/Q6_K, Q8_0 for Q4_0/Q5_0/Q8_0, int8 + f32 scale for the seed's Q8
//!   format), block dot products are exact integer sums (`__dp4a`), and only the order in which
//!   the f32 block terms are added differs from the CPU (relative differences ~1e-7 of
//!   Σ|terms|; the parity tests allow 1e-5).
//! - The forward pass's quantized products of many rows (from 128, or 16 for mid-sized
//!   matrices) and the attention of long prompt chunks run through cuBLAS instead (`blas.rs`:
//!   weights dequantized to bf16, bf16 GEMMs with f32 accumulation, within 2⁻⁸ of Σ|terms| of
//!   the exact product; attention as f32 batched GEMMs around a masked softmax), as do f32
//!   weights from 9 rows (an MoE router over a chunk: one f32 GEMM, no TF32). A prompt chunk's
//!   MoE experts run as grouped tile products (`mmq_ids_*`, ggml's `mul_mat_id`: one launch per
//!   projection over every chosen expert, always the int8 / f16 tiles).
//! - Fused products ([`ComputeBackend::quant_matmul_many`]: QKV, gate+up) upload and quantize the
//!   activations once per activation format and return all outputs after one synchronisation.
//! - One stream for the products, calls serialised by a mutex.
//! - The forward pass's tensor operations are recorded and launched together when the host
//!   needs a result (`step.rs`): a decode step of a shape seen before is one CUDA graph replay.
//!   [`ComputeBackend::start_kernel_profile`] launches them kernel by kernel with timing events
//!   instead (`infer bench --profile`).

mod attn_split;
mod bench;
mod blas;
mod cache;
mod device;
mod float;
mod kernel_cache;
mod quant;
mod step;
mod tensor_ops;

use std::sync::{Mutex, MutexGuard};

use half::f16;

use crate::backend::check_product;
use crate::ops::Activation;
use crate::{
    Argmax, Attend, AttentionParams, Chosen, ComputeBackend, ComputeError, FloatTable, KvType,
    MatData, Matrix, Norm, Proj, ResidualNorm, RopeAttend, RopeConfig, RoutedProj, Tensor,
    TensorProj,
};
use cache::{Scratch, WeightCache};
use device::Device;
use float::{FloatOp, WType};

pub use bench::KernelTime;
pub use device::check_kernels_compile;
pub use step::StepStats;

/// Device state behind the backend's mutex.
#[derive(Debug)]
struct State {
    dev: Device,
    cache: WeightCache,
    s: Scratch,
    /// RoPE frequencies of the tensor operations.
    ops: tensor_ops::OpScratch,
    /// The tensor operations' pending launches, step arena and captured graphs.
    rec: step::Recorder,
    /// Activations a fused operation quantized for the next product, set by that operation
    /// (`pq_next`) and seen by the one tensor operation after it (`pq`): see
    /// [`tensor_ops::PreQuant`].
    pq_next: Option<tensor_ops::PreQuant>,
    pq: Option<tensor_ops::PreQuant>,
    /// How KV caches made by `fit_kv` store their values.
    kv: KvType,
}

/// [`ComputeBackend`] on one CUDA device. See the [module docs](self) for numerics and caching.
///
/// A device failure (lost device, out of memory, a failed launch) is returned as
/// [`ComputeError::Device`] naming the operation, from every method.
#[derive(Debug)]
pub struct CudaBackend {
    state: Mutex<State>,
    name: String,
}

impl CudaBackend {
    /// Open CUDA device `ordinal` (0 = first GPU) and compile the kernels.
    ///
    /// Errors ([`ComputeError::Device`]): no CUDA driver library or NVRTC on this machine, no
    /// such device, a kernel compile error (NVRTC log in the message), allocation failure.
    pub fn new(ordinal: usize) -> Result<Self, ComputeError> {
        let dev = Device::open(ordinal)?;
        let s = Scratch::new(&dev.stream)?;
        let ops = tensor_ops::OpScratch::default();
        let rec = step::Recorder::new(&dev.stream, dev.blas.clone())?;
        let name = format!("cuda:{ordinal} ({}, sm_{}{})", dev.name, dev.cc.0, dev.cc.1);
        Ok(CudaBackend {
            state: Mutex::new(State {
                dev,
                cache: WeightCache::default(),
                s,
                ops,
                rec,
                pq_next: None,
                pq: None,
                kv: KvType::F32,
            }),
            name,
        })
    }

    /// This backend with its KV caches (those made by [`ComputeBackend::fit_kv`] from now on)
    /// stored as `kv` (f32 after [`CudaBackend::new`]).
    pub fn with_kv_type(self, kv: KvType) -> Self {
        self.lock().kv = kv;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another thread cannot leave the device state inconsistent (every call
        // rewrites the scratch it reads), so a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The backend's state with every recorded tensor operation launched: for the host-slice
    /// products, which launch directly on the stream. Errors: a failed launch.
    fn synced(&self) -> Result<MutexGuard<'_, State>, ComputeError> {
        let mut st = self.lock();
        // These products overwrite the activation buffers: nothing stays pre-quantized.
        st.pq_next = None;
        st.pq = None;
        let State { rec, dev, .. } = &mut *st;
        rec.flush(&dev.stream)?;
        Ok(st)
    }

    /// Run tensor operation `f` (recorded, launched with its step: `step.rs`); when it fails,
    /// the step's pending launches are dropped unlaunched, so a failed step writes nothing.
    /// What the operation before quantized for a product is visible to `f` only (`State::pq`).
    fn tensor_op<R>(
        &self,
        f: impl FnOnce(&mut State) -> Result<R, ComputeError>,
    ) -> Result<R, ComputeError> {
        let mut st = self.lock();
        st.pq = st.pq_next.take();
        let r = f(&mut st);
        st.pq = None;
        if r.is_err() {
            st.rec.discard();
            st.pq_next = None;
            return r;
        }
        r
    }

    /// How the forward pass's steps were launched so far: kernel by kernel, captured into a
    /// CUDA graph, or as a replay of one (`step.rs`).
    pub fn step_stats(&self) -> StepStats {
        self.lock().rec.stats
    }

    /// Drop every cached device copy of a weight (after weight buffers were rewritten in place).
    pub fn clear_weight_cache(&self) {
        let mut st = self.lock();
        // Pending launches may read the weights: enqueue them before the memory is freed (in
        // stream order). A launch failure surfaces at the next synchronising call.
        let State { rec, dev, .. } = &mut *st;
        let _ = rec.flush(&dev.stream);
        st.cache.clear();
    }

    /// Whether quantized products of the forward pass from [`blas::GEMM_MIN_M`] rows run as
    /// dequantize + cuBLAS bf16 GEMMs (`libcublas` loaded, compute capability ≥ 8.0); otherwise
    /// they stay on the tensor-core tile kernels.
    pub fn uses_cublas(&self) -> bool {
        self.lock().dev.blas.is_some()
    }

    /// Bytes of weights currently resident on the device.
    pub fn cached_weight_bytes(&self) -> usize {
        self.lock().cache.bytes()
    }

    /// Device memory in use (total − free, `cuMemGetInfo`: by every process on the device) and
    /// the device's total, in bytes; `None` when the driver cannot say.
    pub fn memory_in_use(&self) -> Option<(usize, usize)> {
        let st = self.lock();
        st.dev.stream.context().bind_to_thread().ok()?;
        let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
        Some((total.saturating_sub(free), total))
    }
}

fn check_len(what: &str, got: usize, want: usize, shape: &str) {
    assert_eq!(got, want, "{what}: length {got}, want {shape} = {want}");
}

impl ComputeBackend for CudaBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn launch_report(&self) -> Option<String> {
        let s = self.step_stats();
        let per = |ns: u64| ns as f64 / 1e3 / s.replayed.max(1) as f64;
        let products = if self.uses_cublas() {
            format!(
                "quantized products of ≥ {} rows (≥ {} for matrices of 4–16 Mi values) as \
                 dequantize + cuBLAS bf16 GEMM",
                blas::GEMM_MIN_M,
                blas::MID_GEMM_MIN_M
            )
        } else {
            "no cuBLAS (libcublas not found, or compute capability below 8.0): every many-row \
             product on the tile kernels"
                .into()
        };
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        let memory = self.memory_in_use().map_or(String::new(), |(used, total)| {
            format!(
                "; device memory in use {:.2} of {:.1} GiB ({:.2} GiB of cached weights, the \
                 rest KV caches, activations and scratch)",
                gib(used),
                gib(total),
                gib(self.cached_weight_bytes())
            )
        });
        Some(format!(
            "forward-pass steps on {}: {} CUDA graph replays, {} captured, {} launched kernel by \
             kernel; per replay {:.1} µs recording and {:.1} µs launching on the host, {:.1} µs \
             waiting for the device; {products}{memory}",
            self.name,
            s.replayed,
            s.captured,
            s.eager,
            per(s.record_ns),
            per(s.launch_ns),
            per(s.wait_ns)
        ))
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
        check_product("matmul_transb", a, b, m, k, n, c);
        let op = FloatOp::new(WType::F32, true, m, k, n);
        float::product_typed(&mut *self.synced()?, op, a, b, c)
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
        check_product("matmul", a, b, m, k, n, c);
        let op = FloatOp::new(WType::F32, false, m, k, n);
        float::product_typed(&mut *self.synced()?, op, a, b, c)
    }

    fn gemv(
        &self,
        b: &[f32],
        x: &[f32],
        n: usize,
        k: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        check_len("gemv b", b.len(), n * k, "n*k");
        check_len("gemv x", x.len(), k, "k");
        check_len("gemv y", y.len(), n, "n");
        let op = FloatOp::new(WType::F32, true, 1, k, n);
        float::product_typed(&mut *self.synced()?, op, x, b, y)
    }

    fn matmul_transb_f16(
        &self,
        a: &[f32],
        b: &[f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        check_product("matmul_transb_f16", a, b, m, k, n, c);
        let op = FloatOp::new(WType::F16, true, m, k, n);
        float::product_typed(&mut *self.synced()?, op, a, b, c)
    }

    fn matmul_f16(
        &self,
        a: &[f32],
        b: &[f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        check_product("matmul_f16", a, b, m, k, n, c);
        let op = FloatOp::new(WType::F16, false, m, k, n);
        float::product_typed(&mut *self.synced()?, op, a, b, c)
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
            MatData::Blocks { .. } => quant::quant_matmul(&mut *self.synced()?, w, x, m, y),
            MatData::SplitQ8 { .. } => quant::q8_matmul(&mut *self.synced()?, w, x, m, y),
        }
    }

    fn linear_many(&self, x: &[f32], m: usize, projs: &mut [Proj<'_>]) -> Result<(), ComputeError> {
        crate::matrix::linear_many_with(self, x, m, projs, |projs| {
            quant::quant_matmul_many(&mut *self.synced()?, x, m, projs)
        })
    }

    fn fit(&self, t: &mut Tensor, len: usize) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::fit(st, t, len))
    }

    fn kv_type(&self) -> KvType {
        self.lock().kv
    }

    fn fit_kv(&self, t: &mut Tensor, len: usize, head_dim: usize) -> Result<(), ComputeError> {
        self.tensor_op(|st| {
            st.kv.check_head_dim(head_dim)?;
            let kv = st.kv;
            tensor_ops::fit_kv(st, t, len, kv)
        })
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.lock().dev.ctx.mem_get_info().ok()
    }

    fn upload(&self, src: &[f32], dst: &mut Tensor) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::upload(st, src, dst))
    }

    fn download(&self, src: &Tensor, dst: &mut [f32]) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::download(st, src, dst))
    }

    fn read_at(&self, src: &Tensor, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::read_at(st, src, offset, dst))
    }

    fn write_at(&self, src: &[f32], dst: &mut Tensor, offset: usize) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::write_at(st, src, dst, offset))
    }

    fn copy_rows(
        &self,
        src: &Tensor,
        width: usize,
        rows: &[usize],
        dst: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::copy_rows(st, src, width, rows, dst))
    }

    fn add_rows_scaled(
        &self,
        src: &Tensor,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        dst: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::add_rows_scaled(st, src, width, rows, weights, dst))
    }

    fn routes_on_device(&self) -> bool {
        true
    }

    fn moe_route(
        &self,
        logits: &Tensor,
        experts: usize,
        bias: Option<&[f32]>,
        k: usize,
        norm: bool,
        sel: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::moe_route(st, logits, experts, bias, k, norm, sel))
    }

    fn project_routed(
        &self,
        x: &Tensor,
        projs: &mut [RoutedProj<'_>],
        sel: &Tensor,
        k: usize,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::project_routed(st, x, projs, sel, k))
    }

    fn project_grouped(
        &self,
        x: &Tensor,
        projs: &mut [RoutedProj<'_>],
        groups: &[crate::ExpertRows],
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::project_grouped(st, x, projs, groups))
    }

    fn combine_rows(
        &self,
        y: &Tensor,
        width: usize,
        slots: &[usize],
        weights: &[f32],
        k: usize,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::combine_rows(st, y, width, slots, weights, k, out))
    }

    fn combine_routed(
        &self,
        y: &Tensor,
        sel: &Tensor,
        k: usize,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::combine_routed(st, y, sel, k, out))
    }

    fn fill(&self, t: &mut Tensor, len: usize, value: f32) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::fill(st, t, len, value))
    }

    fn project(
        &self,
        w: &Matrix<'_>,
        x: &Tensor,
        m: usize,
        y: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::project(st, w, x, m, y))
    }

    fn project_many(
        &self,
        x: &Tensor,
        m: usize,
        projs: &mut [TensorProj<'_>],
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::project_many(st, x, m, projs))
    }

    fn add_bias(&self, y: &mut Tensor, bias: &[f32]) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::add_bias(st, y, bias))
    }

    fn norm(&self, norm: &Norm<'_>, x: &Tensor, out: &mut Tensor) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::norm(st, norm, x, out))
    }

    fn norm_inplace(&self, norm: &Norm<'_>, x: &mut Tensor) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::norm_inplace(st, norm, x))
    }

    fn rope(
        &self,
        x: &mut Tensor,
        n_heads: usize,
        positions: &[usize],
        cfg: &RopeConfig,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::rope(st, x, n_heads, positions, cfg))
    }

    fn attend(
        &self,
        a: &mut Attend<'_, '_>,
        params: &AttentionParams,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::attend(st, a, params, out))
    }

    fn rope_attend(
        &self,
        a: &mut RopeAttend<'_, '_>,
        params: &AttentionParams,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        if self.tensor_op(|st| tensor_ops::rope_attend(st, a, params, out))? {
            return Ok(());
        }
        crate::rope_attend_composed(self, a, params, out)
    }

    fn add_norm(
        &self,
        x: &mut Tensor,
        branch: &mut Tensor,
        rn: &ResidualNorm<'_>,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        if self.tensor_op(|st| tensor_ops::add_norm(st, x, branch, rn, out))? {
            return Ok(());
        }
        crate::add_norm_composed(self, x, branch, rn, out)
    }

    fn argmax_rows(
        &self,
        logits: &Tensor,
        width: usize,
        out: &mut Vec<Argmax>,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::argmax_rows(st, logits, width, out))
    }

    fn argmax_rows_later(
        &self,
        logits: &Tensor,
        width: usize,
        chosen: &mut Chosen,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::argmax_rows_later(st, logits, width, chosen))
    }

    fn take_chosen(&self, chosen: &Chosen, out: &mut Vec<Argmax>) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::take_chosen(st, chosen, out))
    }

    fn embed_chosen(
        &self,
        table: FloatTable<'_>,
        width: usize,
        chosen: &Chosen,
        scale: f32,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::embed_chosen(st, table, width, chosen, scale, out))
    }

    fn gated_activation(
        &self,
        act: Activation,
        gate: &Tensor,
        up: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::activation(st, act, Some(gate), up))
    }

    fn activation(&self, act: Activation, x: &mut Tensor) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::activation(st, act, None, x))
    }

    fn add_gated(
        &self,
        x: &mut Tensor,
        y: &Tensor,
        gate: &Tensor,
        width: usize,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::add_gated(st, x, y, gate, width))
    }

    fn add_scaled(&self, x: &mut Tensor, y: &Tensor, alpha: f32) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::add_scaled(st, x, y, alpha))
    }

    fn embed(
        &self,
        table: FloatTable<'_>,
        width: usize,
        ids: &[u32],
        scale: f32,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::embed(st, table, width, ids, scale, out))
    }

    fn scale_softcap(
        &self,
        x: &mut Tensor,
        divisor: f32,
        softcap: Option<f32>,
    ) -> Result<(), ComputeError> {
        self.tensor_op(|st| tensor_ops::scale_softcap(st, x, divisor, softcap))
    }

    fn start_kernel_profile(&self) -> Result<bool, ComputeError> {
        let mut st = self.lock();
        let State { rec, dev, .. } = &mut *st;
        rec.start_profile(&dev.stream, dev.names.clone())?;
        Ok(true)
    }

    fn take_kernel_profile(&self) -> Result<Vec<(String, usize, f64)>, ComputeError> {
        let mut st = self.lock();
        let State { rec, dev, .. } = &mut *st;
        rec.take_profile(&dev.stream)
    }
}
