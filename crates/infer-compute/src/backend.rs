//! The [`ComputeBackend`] trait: the operations of a forward pass — matrix products (float and
//! quantized), norms, RoPE, attention, activations, residuals, embedding lookup and argmax —
//! behind one interface, so that one block description runs on a CPU or a CUDA implementation.

use crate::ops::Activation;
use crate::{
    Argmax, AttentionParams, Chosen, ComputeError, ExpertRows, FloatTable, Matrix, Proj,
    ResidualNorm, RopeAttend, RopeConfig, RoutedProj, Tensor, TensorProj,
};
use half::f16;

/// Matrix products used by inference. All matrices are row-major f32 unless stated.
///
/// Weight matrices are stored like a PyTorch `nn.Linear` weight: `[out, in]`, one output
/// feature per row. The products therefore multiply by the **transpose** of the weight
/// (`x · Wᵀ`), which is also the layout of the vindex's feature-major tables.
///
/// Design notes for implementers:
/// - Every method writes **every** element of its output (no "skip" paths that leave stale
///   values); outputs need not be initialised by the caller.
/// - Every method is fallible: a device error (out of memory, a failed launch) is a
///   [`ComputeError`] naming the operation, never a panic or stale output. Matrices and the
///   activations of [`linear`](Self::linear) and of the whole operations are checked and
///   reported as [`ComputeError::ShapeMismatch`]; the raw f32 table products panic on slice
///   lengths that disagree with their explicit shapes (programmer errors).
/// - Weight matrices arrive as one view, [`Matrix`] (storage tag, bytes or values, shape); the
///   tag alone selects the kernel, it is never guessed from the byte count.
/// - Two levels. The weight products [`linear`](Self::linear) / [`linear_many`](Self::linear_many)
///   and the f32 table products take host slices (tests, benchmarks, the walk FFN). The forward
///   pass works on [`Tensor`]s that live in the backend's memory ([`fit`](Self::fit)): the
///   products [`project`](Self::project) / [`project_many`](Self::project_many) and every whole
///   operation (norm, RoPE, attention with its KV store, activations, residual, embedding,
///   logit post-processing). Their defaults are the CPU's, on host tensors; a device backend
///   overrides them all so that activations and KV cache stay on the device. Weights are host
///   views (the vindex mmap); a device backend caches device copies keyed by their address.
pub trait ComputeBackend: Send + Sync {
    /// Human-readable backend name, e.g. `"cpu"`.
    fn name(&self) -> &str;

    /// How the forward pass's steps were launched so far, in words (a device backend: e.g.
    /// how many were CUDA graph replays); `None` where there is nothing to say (the CPU).
    fn launch_report(&self) -> Option<String> {
        None
    }

    /// `C[m×n] = A[m×k] · B[n×k]ᵀ`.
    ///
    /// - `a`: `[m, k]` row-major, `a.len() == m*k`.
    /// - `b`: `[n, k]` row-major (a Linear weight `[out=n, in=k]`), `b.len() == n*k`.
    /// - `c`: `[m, n]` row-major, `c.len() == m*n`; fully overwritten.
    ///
    /// `k == 0` gives an all-zero `c`. Errors: device failures. Panics if a slice length
    /// disagrees with the shape.
    fn matmul_transb(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError>;

    /// `C[m×n] = A[m×k] · B[k×n]` with `B` row-major `[k, n]` (a feature-major table such as
    /// the vindex's `down_features`, `[features, hidden]`).
    ///
    /// - `a`: `[m, k]`, `b`: `[k, n]`, `c`: `[m, n]` (fully overwritten), all row-major.
    ///
    /// `k == 0` gives an all-zero `c`. Errors: device failures. Panics if a slice length
    /// disagrees with the shape.
    fn matmul(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError>;

    /// Matrix–vector product `y[n] = B[n×k] · x[k]` (the `m == 1` case of
    /// [`matmul_transb`](Self::matmul_transb)).
    ///
    /// - `b`: `[n, k]` row-major, `x`: `[k]`, `y`: `[n]` (fully overwritten).
    ///
    /// Errors: device failures. Panics if a slice length disagrees with the shape.
    fn gemv(
        &self,
        b: &[f32],
        x: &[f32],
        n: usize,
        k: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError>;

    /// `C[m×n] = A[m×k] · B[n×k]ᵀ` with `B` in IEEE half precision (a Linear weight of the
    /// vindex f16 tier, read in place from the mmap).
    ///
    /// - `a`: `[m, k]` f32; `b`: `[n, k]` f16; `c`: `[m, n]` f32, fully overwritten; all
    ///   row-major.
    /// - Numerics: each weight is widened exactly to f32 and multiplied in f32, so the result
    ///   equals [`matmul_transb`](Self::matmul_transb) on the widened weights up to summation
    ///   order.
    ///
    /// Errors: device failures. Panics if a slice length disagrees with the shape. The default
    /// implementation widens `b` and calls `matmul_transb`.
    fn matmul_transb_f16(
        &self,
        a: &[f32],
        b: &[f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        self.matmul_transb(a, &wide, m, k, n, c)
    }

    /// `C[m×n] = A[m×k] · B[k×n]` with `B` row-major in IEEE half precision (a feature-major
    /// table of the vindex f16 tier such as `down_features`, `[features, hidden]`).
    ///
    /// - `a`: `[m, k]` f32; `b`: `[k, n]` f16; `c`: `[m, n]` f32, fully overwritten.
    /// - Numerics as [`matmul_transb_f16`](Self::matmul_transb_f16).
    ///
    /// Errors: device failures. Panics if a slice length disagrees with the shape. The default
    /// implementation widens `b` and calls [`matmul`](Self::matmul).
    fn matmul_f16(
        &self,
        a: &[f32],
        b: &[f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        self.matmul(a, &wide, m, k, n, c)
    }

    /// The product of a weight matrix in any storage: `y[m×rows] = x[m×cols] · Wᵀ`, the
    /// storage tag ([`crate::MatData`]) alone selecting the kernel (never guessed from a byte count).
    ///
    /// - `w`: a [`Matrix`] `[rows, cols]`; `x`: `[m, cols]` row-major f32 (one activation row
    ///   per token); `y`: `[m, rows]` row-major f32, fully overwritten. Row `i` of `y` depends
    ///   only on row `i` of `x` (a row's result does not depend on the other rows of a batch).
    /// - Numerics (CPU backend): f32 and f16 weights multiply in f32. Like llama.cpp, Q4_K and
    ///   Q6_K weights are multiplied with `x` quantized once to Q8_K, and Q4_0, Q5_0 and Q8_0
    ///   weights with `x` quantized to Q8_0 (integer block dot products, see [`crate::vec_dot`]);
    ///   so `y` carries the activation quantization error (relative ~1e-3 of Σ|wᵢxᵢ|) as in
    ///   llama.cpp. Other formats with a ggml dequantizer (Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, Q8_K,
    ///   F16, BF16, F32 blocks) are dequantized exactly and multiplied in f32. The seed's split
    ///   Q8 multiplies int8 values with int8 activations per 32 values ([`crate::q8_split`]).
    ///
    /// Errors: [`ComputeError::UnsupportedFormat`] for a format without kernel (Q8_1),
    /// [`ComputeError::Quant`] when `cols` is not a multiple of the format's block size,
    /// [`ComputeError::ShapeMismatch`] when the storage or `x`/`y` disagree with the shape;
    /// device failures.
    fn linear(
        &self,
        w: &Matrix<'_>,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError>;

    /// Several products of the **same** activations (a fused QKV or gate+up projection): for
    /// each `p` in `projs`, `p.y[m×p.w.rows] = x[m×cols] · p.wᵀ`, every `p.w` with `cols`
    /// columns.
    ///
    /// Each output equals [`linear`](Self::linear) of its matrix bit for bit; the CPU backend
    /// quantizes `x` once per activation format and runs all block-format matrices in one
    /// parallel region. Errors as [`linear`](Self::linear), checked for every matrix before
    /// anything runs. The default implementation calls `linear` per matrix.
    fn linear_many(&self, x: &[f32], m: usize, projs: &mut [Proj<'_>]) -> Result<(), ComputeError> {
        crate::matrix::linear_many_with(self, x, m, projs, |projs| {
            for p in projs.iter_mut() {
                self.linear(&p.w, x, m, p.y)?;
            }
            Ok(())
        })
    }

    /// Make `t` a tensor of `len` values in this backend's memory (the activation buffers of
    /// a forward pass; contents unspecified). Allocates only when `t` is smaller than `len`
    /// or lives elsewhere (a host tensor handed to a device backend is replaced). The default
    /// (the CPU's): host memory. Errors: allocation failure.
    fn fit(&self, t: &mut Tensor, len: usize) -> Result<(), ComputeError> {
        if !t.is_host() {
            *t = Tensor::default();
        }
        t.set_len(len);
        Ok(())
    }

    /// The element type this backend stores KV cache rows in ([`crate::KvType`]; F32 unless the
    /// backend was set up otherwise: `CpuBackend::with_kv_type`, `CudaBackend::with_kv_type`).
    fn kv_type(&self) -> crate::KvType {
        crate::KvType::F32
    }

    /// Make `t` a KV cache tensor of `len` values, rows of heads of `head_dim` values, stored
    /// as [`kv_type`](Self::kv_type) (its reads and writes still see f32 values). The default:
    /// [`fit`](Self::fit). Errors: a head_dim the type cannot store
    /// ([`crate::KvType::check_head_dim`]), allocation failure.
    fn fit_kv(&self, t: &mut Tensor, len: usize, head_dim: usize) -> Result<(), ComputeError> {
        self.kv_type().check_head_dim(head_dim)?;
        self.fit(t, len)
    }

    /// Free and total bytes of the backend's device memory (`cuMemGetInfo`); `None` for host
    /// memory (the CPU backend).
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }

    /// Copy `src` into `dst`, which is [`fit`](Self::fit) to `src.len()` values. Errors:
    /// allocation or copy failure.
    fn upload(&self, src: &[f32], dst: &mut Tensor) -> Result<(), ComputeError> {
        self.fit(dst, src.len())?;
        host_mut("upload", dst)?.copy_from_slice(src);
        Ok(())
    }

    /// Copy the values of `src` into `dst` (`dst.len() == src.len()`). Errors: lengths
    /// differ, a tensor this backend does not own, copy failure.
    fn download(&self, src: &Tensor, dst: &mut [f32]) -> Result<(), ComputeError> {
        crate::host_ops::check("download destination", dst.len(), src.len(), "values")?;
        dst.copy_from_slice(host("download", src)?);
        Ok(())
    }

    /// Copy `dst.len()` values of `src` from value `offset` on into `dst` (a KV cache stored
    /// in another [`crate::KvType`] widened to f32). Errors: the range past the tensor's end, a
    /// tensor this backend does not own, copy failure.
    fn read_at(&self, src: &Tensor, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError> {
        crate::host_ops::load_kv("read_at", src, offset, dst)
    }

    /// Copy `src` into `dst` from value `offset` on (the rest of `dst` unchanged; into a KV
    /// cache stored in another [`crate::KvType`], rounded as it stores). Errors as
    /// [`read_at`](Self::read_at).
    fn write_at(&self, src: &[f32], dst: &mut Tensor, offset: usize) -> Result<(), ComputeError> {
        crate::host_ops::store_kv("write_at", dst, offset, src)
    }

    /// Gather rows: row `i` of `dst` (fit to `rows.len() · width`) is row `rows[i]` of `src`
    /// (`[R, width]`). Errors: `src` not whole rows, a row index not below `R`; device
    /// failures.
    fn copy_rows(
        &self,
        src: &Tensor,
        width: usize,
        rows: &[usize],
        dst: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.fit(dst, rows.len() * width)?;
        crate::host_ops::copy_rows(
            host("copy_rows", src)?,
            width,
            rows,
            host_mut("copy_rows", dst)?,
        )
    }

    /// Scatter-add rows: row `rows[i]` of `dst` (`[R, width]`) `+= weights[i] ·` row `i` of `src`
    /// (`[rows.len(), width]`) — the way an MoE layer adds each expert's output rows into the
    /// tokens that chose it. Errors: `src` not `rows.len()` rows, `weights` of another length,
    /// a row index not below `R` or repeated (rows are updated concurrently on a device);
    /// device failures.
    fn add_rows_scaled(
        &self,
        src: &Tensor,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        dst: &mut Tensor,
    ) -> Result<(), ComputeError> {
        crate::host_ops::add_rows_scaled(
            host("add_rows_scaled", src)?,
            width,
            rows,
            weights,
            host_mut("add_rows_scaled", dst)?,
        )
    }

    /// Whether [`moe_route`](Self::moe_route), [`project_routed`](Self::project_routed) and
    /// [`combine_routed`](Self::combine_routed) keep an MoE layer's expert choice in this
    /// backend's memory, so that a decode step needs no host round trip per layer (a device
    /// backend). The defaults read the choice on the host; false.
    fn routes_on_device(&self) -> bool {
        false
    }

    /// The top-k experts of each router row of `logits` (`[rows, experts]`): row `r` of `sel`
    /// (fit to `[rows, 2·k]`) holds the chosen experts' indices (as f32, exact below 2²⁴),
    /// highest probability first, then their weights, as [`crate::ops::moe_route`] chooses
    /// them (softmax of `logits + bias`, ties to the lower index, renormalised when `norm`).
    /// Errors ([`ComputeError::ShapeMismatch`]): `logits` not whole rows, `k` 0 or above
    /// `experts`, a bias of another length; device failures.
    fn moe_route(
        &self,
        logits: &Tensor,
        experts: usize,
        bias: Option<&[f32]>,
        k: usize,
        norm: bool,
        sel: &mut Tensor,
    ) -> Result<(), ComputeError> {
        let rows = crate::host_ops::check_route(logits.len(), experts, bias, k)?;
        let logits = host("moe_route", logits)?;
        self.fit(sel, rows * 2 * k)?;
        let s = host_mut("moe_route", sel)?;
        crate::host_ops::moe_route_rows(logits, experts, bias, k, norm, s);
        Ok(())
    }

    /// The products of the `k` experts the router chose, for every slot at once (ggml's
    /// `mul_mat_id`): for slot `s < k` and each `p`, rows `s·r .. (s+1)·r` of `p.y` (fit to
    /// `k · r`, `r` the experts' rows) `= x_s · p.experts[e_s]ᵀ`, `e_s` the expert in slot `s`
    /// of `sel` ([`moe_route`](Self::moe_route)) and `x_s` either `x` itself (`[cols]`, one
    /// row for every slot) or its row `s` (`x` `[k, cols]`). Errors: an empty expert list,
    /// experts of different shapes, `x` neither, `k` past `sel`, an expert index out of range
    /// where the choice is read on the host (a device backend that reads it in its kernel
    /// clamps it into the expert list instead: it cannot fail there); device failures.
    fn project_routed(
        &self,
        x: &Tensor,
        projs: &mut [RoutedProj<'_>],
        sel: &Tensor,
        k: usize,
    ) -> Result<(), ComputeError> {
        let cols = crate::host_ops::check_routed(projs, x.len(), sel.len(), k)?;
        let mut ids = smallvec::SmallVec::<[f32; 16]>::from_elem(0.0, k);
        self.read_at(sel, 0, &mut ids)?;
        let x = host("project_routed", x)?;
        for p in projs.iter_mut() {
            let rows = p.experts[0].rows;
            self.fit(p.y, k * rows)?;
            let y = host_mut("project_routed", p.y)?;
            for (s, &id) in ids.iter().enumerate() {
                let e = crate::host_ops::expert_index(id, p.experts.len())?;
                let xs = if x.len() == cols {
                    x
                } else {
                    &x[s * cols..(s + 1) * cols]
                };
                self.linear(&p.experts[e], xs, 1, &mut y[s * rows..(s + 1) * rows])?;
            }
        }
        Ok(())
    }

    /// `out` (fit to `width = y.len() / k`) `= Σ_s w_s · y_s` over the `k` slots of `y`
    /// (`[k, width]`, [`project_routed`](Self::project_routed)'s outputs), `w_s = sel[k + s]`
    /// the router's weight of slot `s`, read where `sel` lives. Errors: `y` not `k` rows, `k`
    /// past `sel`; device failures.
    fn combine_routed(
        &self,
        y: &Tensor,
        sel: &Tensor,
        k: usize,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        let width = crate::host_ops::check_combine(y.len(), sel.len(), k)?;
        let mut w = smallvec::SmallVec::<[f32; 16]>::from_elem(0.0, k);
        self.read_at(sel, k, &mut w)?;
        self.fit(out, width)?;
        let (y, o) = (host("combine_routed", y)?, host_mut("combine_routed", out)?);
        o.fill(0.0);
        for (s, &ws) in w.iter().enumerate() {
            o.iter_mut()
                .zip(&y[s * width..(s + 1) * width])
                .for_each(|(a, b)| *a += ws * b);
        }
        Ok(())
    }

    /// Grouped expert products for many rows (ggml's `mul_mat_id` over a prompt chunk): `x`
    /// (`[R, cols]`, `R = Σ g.rows`) holds rows grouped by expert in the order of `groups`;
    /// for each `p`, the rows of group `g` in `p.y` (fit to `[R, r]`, `r` the experts' rows)
    /// `= x_g · p.experts[g.expert]ᵀ`. Numerics those of a quantized product (the CPU:
    /// [`linear`](Self::linear) of each group; CUDA: the int8 / f16 tile kernels whatever the
    /// rows, never the bf16 cuBLAS path of many-row products).
    /// Errors: an empty expert list, experts of different shapes, `x` not `R` rows, an expert
    /// index out of range, a group of no rows; device failures.
    fn project_grouped(
        &self,
        x: &Tensor,
        projs: &mut [RoutedProj<'_>],
        groups: &[ExpertRows],
    ) -> Result<(), ComputeError> {
        let cols = crate::host_ops::check_grouped(projs, x.len(), groups)?;
        let total: usize = groups.iter().map(|g| g.rows).sum();
        for p in projs.iter_mut() {
            self.fit(p.y, total * p.experts[0].rows)?;
        }
        let x = host("project_grouped", x)?;
        let experts: smallvec::SmallVec<[&[Matrix<'_>]; 3]> =
            projs.iter().map(|p| p.experts).collect();
        let mut ys: smallvec::SmallVec<[&mut [f32]; 3]> = projs
            .iter_mut()
            .map(|p| host_mut("project_grouped", p.y))
            .collect::<Result<_, _>>()?;
        let mut row0 = 0;
        for g in groups {
            let xs = &x[row0 * cols..(row0 + g.rows) * cols];
            // One call per group: a backend quantizes `xs` once for all products.
            let mut many: smallvec::SmallVec<[Proj<'_>; 3]> = experts
                .iter()
                .zip(ys.iter_mut())
                .map(|(e, y)| {
                    let r = e[0].rows;
                    Proj {
                        w: e[g.expert],
                        y: &mut y[row0 * r..(row0 + g.rows) * r],
                    }
                })
                .collect();
            self.linear_many(xs, g.rows, &mut many)?;
            row0 += g.rows;
        }
        Ok(())
    }

    /// Each token's expert outputs summed back (the end of an MoE chunk after
    /// [`project_grouped`](Self::project_grouped)): row `i` of `out` (fit to `[t, width]`,
    /// `t = slots.len() / k`) `= Σ_{j<k} weights[i·k + j] ·` row `slots[i·k + j]` of `y`
    /// (`[R, width]`), summed in slot order. Errors: `k` 0 or `slots` not `t·k` entries,
    /// `weights` of another length, a slot not below `R`, a width of 0 or `y` not whole rows;
    /// device failures.
    fn combine_rows(
        &self,
        y: &Tensor,
        width: usize,
        slots: &[usize],
        weights: &[f32],
        k: usize,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        let t = crate::host_ops::check_combine_rows(y.len(), width, slots, weights, k)?;
        self.fit(out, t * width)?;
        let (y, o) = (host("combine_rows", y)?, host_mut("combine_rows", out)?);
        crate::host_ops::combine_rows(y, width, slots, weights, k, o);
        Ok(())
    }

    /// Fit `t` to `len` values, all `value`. Errors: device failures.
    fn fill(&self, t: &mut Tensor, len: usize, value: f32) -> Result<(), ComputeError> {
        self.fit(t, len)?;
        host_mut("fill", t)?.fill(value);
        Ok(())
    }

    /// The product of a weight matrix with activations in this backend's memory:
    /// `y[m×rows] = x[m×cols] · Wᵀ`, `y` fit to `m · w.rows`. Numerics and errors as
    /// [`linear`](Self::linear), whose host slices the default passes on.
    fn project(
        &self,
        w: &Matrix<'_>,
        x: &Tensor,
        m: usize,
        y: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.fit(y, m * w.rows)?;
        self.linear(w, host("project", x)?, m, host_mut("project", y)?)
    }

    /// [`linear_many`](Self::linear_many) on tensors: for each `p`, `p.y` (fit to
    /// `m · p.w.rows`) `= x · p.wᵀ`. Errors as `linear_many`.
    fn project_many(
        &self,
        x: &Tensor,
        m: usize,
        projs: &mut [TensorProj<'_>],
    ) -> Result<(), ComputeError> {
        for p in projs.iter_mut() {
            self.fit(p.y, m * p.w.rows)?;
        }
        let x = host("project_many", x)?;
        // On the stack for the usual 2–3 products (a decode step allocates nothing).
        let mut host_projs = smallvec::SmallVec::<[Proj<'_>; 4]>::new();
        for p in projs.iter_mut() {
            host_projs.push(Proj {
                w: p.w,
                y: host_mut("project_many", p.y)?,
            });
        }
        self.linear_many(x, m, &mut host_projs)
    }

    /// Add `bias` (`[width]`) to every row of `y` (`[R, width]`). Errors: `y` not whole rows;
    /// device failures.
    fn add_bias(&self, y: &mut Tensor, bias: &[f32]) -> Result<(), ComputeError> {
        crate::host_ops::add_bias(host_mut("add_bias", y)?, bias)
    }

    /// Normalise every row of `x` (`[R, width]`, `width = norm.weight.len()`) into `out` (fit
    /// to the same shape): RMSNorm or LayerNorm as [`NormKind`] says. Errors
    /// ([`ComputeError::ShapeMismatch`]): `x` not whole rows, a bias of another length; device
    /// failures. The default (the CPU's): [`crate::ops::rms_norm`] /
    /// [`crate::ops::layer_norm`].
    ///
    /// [`NormKind`]: crate::NormKind
    fn norm(
        &self,
        norm: &crate::Norm<'_>,
        x: &Tensor,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.fit(out, x.len())?;
        crate::host_ops::norm(norm, host("norm", x)?, host_mut("norm", out)?)
    }

    /// [`norm`](Self::norm) in place (per-head q/k norms over `[R · heads, head_dim]`).
    fn norm_inplace(&self, norm: &crate::Norm<'_>, x: &mut Tensor) -> Result<(), ComputeError> {
        crate::host_ops::norm_inplace(norm, host_mut("norm", x)?)
    }

    /// Rotary position embedding in place on `x` `[R, n_heads · head_dim]`, row `r` rotated
    /// for absolute position `positions[r]` (every row its own position: rows of several
    /// sequences in one batch). Errors: `x` not `positions.len() · n_heads · cfg.head_dim`
    /// values; device failures. The default: [`crate::apply_rope`].
    fn rope(
        &self,
        x: &mut Tensor,
        n_heads: usize,
        positions: &[usize],
        cfg: &RopeConfig,
    ) -> Result<(), ComputeError> {
        crate::host_ops::rope(host_mut("rope", x)?, n_heads, positions, cfg)
    }

    /// One layer's attention for a batch of sequences: each [`KvSlot`] stores its new K/V rows
    /// (rows `row0..row0 + rows` of `a.k`, `a.v`) at positions `start..` of its own cache, then
    /// its query rows attend causally over its cache `0..start + rows` (GQA/MQA, sliding
    /// window, soft-cap per `params`; numerics and masking: [`crate::attention`]), into the
    /// same rows of `out` (fit to `a.q`'s shape, `[R, n_q_heads · head_dim]`). Errors: shapes
    /// that disagree, heads that do not divide, a cache without room; device failures. The
    /// default runs the sequences in parallel on the host.
    ///
    /// [`KvSlot`]: crate::KvSlot
    fn attend(
        &self,
        a: &mut crate::Attend<'_, '_>,
        params: &AttentionParams,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.fit(out, a.q.len())?;
        crate::host_ops::attend(a, params, out)
    }

    /// One layer's attention with the query/key preparation: [`norm_inplace`](Self::norm_inplace)
    /// of `a.q` and `a.k` by their norms (when given), [`rope`](Self::rope) of both at
    /// `a.positions`, then [`attend`](Self::attend) (KV store and attention) into `out` (fit to
    /// `[R, n_q_heads · head_dim]`). `a.q`, `a.k` hold unspecified values afterwards. A device
    /// backend may run it as one kernel (the CUDA backend does for decode rows: one new row per
    /// sequence, per-head norms). Errors: as the three operations; device failures. The
    /// default: the three operations in turn ([`rope_attend_composed`]).
    fn rope_attend(
        &self,
        a: &mut RopeAttend<'_, '_>,
        params: &AttentionParams,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        rope_attend_composed(self, a, params, out)
    }

    /// Gated FFN combination `up[i] = act(gate[i]) · up[i]`
    /// ([`crate::ops::gated_mul_fast`]'s numerics). Errors: lengths differ; device failures.
    fn gated_activation(
        &self,
        act: Activation,
        gate: &Tensor,
        up: &mut Tensor,
    ) -> Result<(), ComputeError> {
        crate::host_ops::gated_activation(
            act,
            host("gated_activation", gate)?,
            host_mut("gated_activation", up)?,
        )
    }

    /// `x[i] = act(x[i])` ([`crate::ops::act_fast_inplace`]). Errors: device failures.
    fn activation(&self, act: Activation, x: &mut Tensor) -> Result<(), ComputeError> {
        crate::ops::act_fast_inplace(act, host_mut("activation", x)?);
        Ok(())
    }

    /// Residual update `x += alpha · y` (`alpha` 1 for most models, Granite's
    /// `residual_multiplier`). Errors: lengths differ; device failures.
    fn add_scaled(&self, x: &mut Tensor, y: &Tensor, alpha: f32) -> Result<(), ComputeError> {
        crate::host_ops::add_scaled(host_mut("add_scaled", x)?, host("add_scaled", y)?, alpha)
    }

    /// `x[r] += sigmoid(gate[r]) · y[r]` for every row `r` of `x` and `y` (`[R, width]`; `gate`
    /// `[R]` logits, kept where the backend keeps them): an MoE layer's shared expert under its
    /// gate (HF `Qwen2MoeSparseMoeBlock`). Errors: `y` not as long as `x`, `x` not one row of
    /// `width` per gate; device failures.
    fn add_gated(
        &self,
        x: &mut Tensor,
        y: &Tensor,
        gate: &Tensor,
        width: usize,
    ) -> Result<(), ComputeError> {
        crate::host_ops::add_gated(
            host_mut("add_gated", x)?,
            host("add_gated", y)?,
            host("add_gated", gate)?,
            width,
        )
    }

    /// The residual step of a pre-norm block and the norm after it, fused: `branch` passed
    /// through `rn.post` when given (in place: `branch` holds unspecified values afterwards),
    /// `x += rn.alpha · branch`, then `out = rn.next(x)` (every row of `x`, `[R, width]`;
    /// `out` fit to `x`'s shape). A device backend may run it as one kernel and keep `out`
    /// ready for the next product (the CUDA backend quantizes it for its activation formats).
    /// Errors: lengths differ, `x` not whole rows of the norms' width; device failures. The
    /// default: [`norm_inplace`](Self::norm_inplace), [`add_scaled`](Self::add_scaled) and
    /// [`norm`](Self::norm) in turn ([`add_norm_composed`]).
    fn add_norm(
        &self,
        x: &mut Tensor,
        branch: &mut Tensor,
        rn: &ResidualNorm<'_>,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        add_norm_composed(self, x, branch, rn, out)
    }

    /// Embedding lookup: row `ids[r]` of `table` (`[rows, width]`) times `scale`, widened to
    /// f32, into row `r` of `out` (fit to `ids.len() · width`). Errors: an id not below the
    /// table's rows, a table that is not whole rows; device failures.
    fn embed(
        &self,
        table: FloatTable<'_>,
        width: usize,
        ids: &[u32],
        scale: f32,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        self.fit(out, ids.len() * width)?;
        crate::host_ops::embed(table, ids, scale, host_mut("embed", out)?)
    }

    /// Logit post-processing in place: `x / divisor`, then `cap · tanh(x / cap)` when a
    /// soft-cap is given (Gemma-2). Errors: device failures.
    fn scale_softcap(
        &self,
        x: &mut Tensor,
        divisor: f32,
        softcap: Option<f32>,
    ) -> Result<(), ComputeError> {
        crate::host_ops::scale_softcap(host_mut("scale_softcap", x)?, divisor, softcap);
        Ok(())
    }

    /// Greedy choice over `logits` `[vocab]`: the largest finite value, ties to the smaller
    /// id, and whether every value was finite. Errors: empty logits; device failures.
    fn argmax(&self, logits: &[f32]) -> Result<Argmax, ComputeError> {
        crate::host_ops::argmax(logits)
    }

    /// The greedy choice of every row of `logits` (`[R, width]`, a tensor of this backend),
    /// as [`argmax`](Self::argmax) per row, into `out` (resized to `R`): only the choices leave
    /// a device backend, not the logits. Errors: `width` 0 or `logits` not whole rows; device
    /// failures. The default: the host values (a download for a device tensor) row by row.
    fn argmax_rows(
        &self,
        logits: &Tensor,
        width: usize,
        out: &mut Vec<Argmax>,
    ) -> Result<(), ComputeError> {
        crate::host_ops::check_argmax_rows(logits.len(), width)?;
        let owned;
        let values = match logits.host() {
            Some(v) => v,
            None => {
                let mut v = vec![0.0; logits.len()];
                self.download(logits, &mut v)?;
                owned = v;
                &owned[..]
            }
        };
        out.clear();
        for row in values.chunks_exact(width) {
            out.push(self.argmax(row)?);
        }
        Ok(())
    }

    /// [`argmax_rows`](Self::argmax_rows) without waiting for the device: the choices of
    /// every row of `logits` are made where the logits are and start their way to the host;
    /// `chosen` (overwritten) says where they are. [`take_chosen`](Self::take_chosen) waits for
    /// them; [`embed_chosen`](Self::embed_chosen) looks them up before that. Errors as
    /// [`argmax_rows`](Self::argmax_rows). The default (a host backend): the choices made now,
    /// into `chosen.host`.
    fn argmax_rows_later(
        &self,
        logits: &Tensor,
        width: usize,
        chosen: &mut Chosen,
    ) -> Result<(), ComputeError> {
        let mut picks = chosen.host.take().unwrap_or_default();
        self.argmax_rows(logits, width, &mut picks)?;
        *chosen = Chosen {
            rows: picks.len(),
            host: Some(picks),
            ticket: 0,
        };
        Ok(())
    }

    /// The choices of an [`argmax_rows_later`](Self::argmax_rows_later) into `out` (resized to
    /// `chosen.rows`), waiting for the device if they are not on the host yet. Errors: choices
    /// this backend no longer holds (a device keeps the last two steps' in flight), device
    /// failures.
    fn take_chosen(&self, chosen: &Chosen, out: &mut Vec<Argmax>) -> Result<(), ComputeError> {
        match &chosen.host {
            Some(picks) => {
                out.clear();
                out.extend_from_slice(picks);
                Ok(())
            }
            None => Err(ComputeError::NotOnHost { op: "take_chosen" }),
        }
    }

    /// [`embed`](Self::embed) of the token ids `chosen` holds (row `r` of `out`: the choice of
    /// row `r`), read where they were made: a device looks up the choices of its last
    /// [`argmax_rows_later`](Self::argmax_rows_later) without waiting for them. A row whose
    /// logits were not all finite looks up some row of the table (its step is the caller's to
    /// discard). Errors as [`embed`](Self::embed) and [`take_chosen`](Self::take_chosen).
    fn embed_chosen(
        &self,
        table: FloatTable<'_>,
        width: usize,
        chosen: &Chosen,
        scale: f32,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        // Choices made on the host are read in place; others are taken (waited for) first.
        let mut taken = Vec::new();
        let picks = match &chosen.host {
            Some(picks) => picks,
            None => {
                self.take_chosen(chosen, &mut taken)?;
                &taken
            }
        };
        let rows = table.len().checked_div(width).unwrap_or(0);
        let ids = crate::host_ops::chosen_ids(picks, rows);
        self.embed(table, width, &ids, scale, out)
    }

    /// Start timing this backend's kernels: from now on, until
    /// [`take_kernel_profile`](Self::take_kernel_profile), each launch of the operations
    /// recorded so far runs kernel by kernel with a timing event after each (no CUDA graph), so
    /// that one step's device time can be split by kernel. Returns false where the backend has
    /// no kernels to time (the default, and the CPU backend). Errors: a device failure while
    /// launching what was pending before (that stays untimed).
    fn start_kernel_profile(&self) -> Result<bool, ComputeError> {
        Ok(false)
    }

    /// Stop timing (see [`start_kernel_profile`](Self::start_kernel_profile)) and return the
    /// device time of the kernels launched since, per kernel name: (name, launches, µs), in
    /// first-launch order; empty when nothing was timed. Errors: a device failure of the timed
    /// launches.
    fn take_kernel_profile(&self) -> Result<Vec<(String, usize, f64)>, ComputeError> {
        Ok(Vec::new())
    }
}

/// [`ComputeBackend::rope_attend`] as its three operations on `b`: the q/k norms in place,
/// RoPE of both, then [`ComputeBackend::attend`]. Errors: as those operations.
pub fn rope_attend_composed<B: ComputeBackend + ?Sized>(
    b: &B,
    a: &mut RopeAttend<'_, '_>,
    params: &AttentionParams,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    if let Some(n) = &a.q_norm {
        b.norm_inplace(n, a.q)?;
    }
    if let Some(n) = &a.k_norm {
        b.norm_inplace(n, a.k)?;
    }
    if let Some(rope) = a.rope {
        b.rope(a.q, params.n_q_heads, a.positions, rope)?;
        b.rope(a.k, params.n_kv_heads, a.positions, rope)?;
    }
    let mut at = crate::Attend {
        q: a.q,
        k: a.k,
        v: a.v,
        seqs: a.seqs,
    };
    b.attend(&mut at, params, out)
}

/// [`ComputeBackend::add_norm`] as its operations on `b`: the post norm of `branch` in place,
/// the residual add, the next norm. Errors: as those operations.
pub fn add_norm_composed<B: ComputeBackend + ?Sized>(
    b: &B,
    x: &mut Tensor,
    branch: &mut Tensor,
    rn: &ResidualNorm<'_>,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    if let Some(p) = &rn.post {
        b.norm_inplace(p, branch)?;
    }
    b.add_scaled(x, branch, rn.alpha)?;
    b.norm(&rn.next, x, out)
}

/// The values of a host tensor, or [`ComputeError::NotOnHost`] naming `op`.
pub fn host<'t>(op: &'static str, t: &'t Tensor) -> Result<&'t [f32], ComputeError> {
    t.host().ok_or(ComputeError::NotOnHost { op })
}

/// [`host`], writable.
pub fn host_mut<'t>(op: &'static str, t: &'t mut Tensor) -> Result<&'t mut [f32], ComputeError> {
    t.host_mut().ok_or(ComputeError::NotOnHost { op })
}

/// Shape check shared by every backend's f32/f16 products: panic unless `a` is `[m, k]`, `b` holds `n·k` values and `c` is `[m, n]`.
pub(crate) fn check_product<B>(
    what: &str,
    a: &[f32],
    b: &[B],
    m: usize,
    k: usize,
    n: usize,
    c: &[f32],
) {
    assert_eq!(
        a.len(),
        m * k,
        "{what}: a has {} values, want m*k = {m}*{k}",
        a.len()
    );
    assert_eq!(
        b.len(),
        n * k,
        "{what}: b has {} values, want n*k = {n}*{k}",
        b.len()
    );
    assert_eq!(
        c.len(),
        m * n,
        "{what}: c has {} values, want m*n = {m}*{n}",
        c.len()
    );
}

/// The degenerate cases of a product `C[m×n] = A[m×k] · op(B)` (shared by every backend): true
/// when nothing is left to compute — no output (`m` or `n` is 0), or an all-zero output (`k` is
/// 0; `c` is then filled with zeros).
pub(crate) fn empty_product(m: usize, n: usize, k: usize, c: &mut [f32]) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        c.fill(0.0);
        return true;
    }
    false
}
