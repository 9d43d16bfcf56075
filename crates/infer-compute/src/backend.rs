//! The [`ComputeBackend`] trait: the operations of a forward pass — matrix products (float and
//! quantized), norms, RoPE, attention, activations, residuals, embedding lookup and argmax —
//! behind one interface, so that one block description runs on a CPU or a CUDA implementation.

use crate::ops::Activation;
use crate::{Argmax, AttentionParams, ComputeError, FloatTable, Matrix, Proj, RopeConfig};
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
/// - A GPU backend keeps the same signatures (host slices in, host slices out) and may cache
///   device copies of weight slices keyed by their address; fused kernels (QKV projection,
///   attention) will be added as further methods with a CPU default.
pub trait ComputeBackend: Send + Sync {
    /// Human-readable backend name, e.g. `"cpu"`.
    fn name(&self) -> &str;

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

    /// Normalise every row of `x` (`[R, width]`, `width = norm.weight.len()`) into `out`
    /// (same shape, fully overwritten): RMSNorm or LayerNorm as [`NormKind`] says. Errors
    /// ([`ComputeError::ShapeMismatch`]): `x` not whole rows, `out` or the bias of another
    /// length; device failures. The default (the CPU's): [`crate::ops::rms_norm`] /
    /// [`crate::ops::layer_norm`].
    ///
    /// [`NormKind`]: crate::NormKind
    fn norm(&self, norm: &crate::Norm<'_>, x: &[f32], out: &mut [f32]) -> Result<(), ComputeError> {
        crate::host_ops::norm(norm, x, out)
    }

    /// [`norm`](Self::norm) in place (per-head q/k norms over `[R · heads, head_dim]`).
    fn norm_inplace(&self, norm: &crate::Norm<'_>, x: &mut [f32]) -> Result<(), ComputeError> {
        crate::host_ops::norm_inplace(norm, x)
    }

    /// Rotary position embedding in place on `x` `[R, n_heads · head_dim]`, row `r` rotated
    /// for absolute position `positions[r]` (every row its own position: rows of several
    /// sequences in one batch). Errors: `x` not `positions.len() · n_heads · cfg.head_dim`
    /// values; device failures. The default: [`crate::apply_rope`].
    fn rope(
        &self,
        x: &mut [f32],
        n_heads: usize,
        positions: &[usize],
        cfg: &RopeConfig,
    ) -> Result<(), ComputeError> {
        crate::host_ops::rope(x, n_heads, positions, cfg)
    }

    /// Causal attention of one sequence's query rows over its KV cache (prefill chunk or
    /// decode row; GQA/MQA, sliding window, soft-cap per `params`), into `out`
    /// `[t_q, n_q_heads · head_dim]`. Numerics and masking: [`crate::attention`]. Errors:
    /// shapes that disagree, heads that do not divide, a query position not below `t_kv`;
    /// device failures.
    fn attention(
        &self,
        input: &crate::AttentionInput<'_>,
        params: &AttentionParams,
        out: &mut [f32],
    ) -> Result<(), ComputeError> {
        crate::host_ops::attention(input, params, out)
    }

    /// Gated FFN combination `up[i] = act(gate[i]) · up[i]`
    /// ([`crate::ops::gated_mul_fast`]'s numerics). Errors: lengths differ; device failures.
    fn gated_activation(
        &self,
        act: Activation,
        gate: &[f32],
        up: &mut [f32],
    ) -> Result<(), ComputeError> {
        crate::host_ops::gated_activation(act, gate, up)
    }

    /// `x[i] = act(x[i])` ([`crate::ops::act_fast_inplace`]). Errors: device failures.
    fn activation(&self, act: Activation, x: &mut [f32]) -> Result<(), ComputeError> {
        crate::ops::act_fast_inplace(act, x);
        Ok(())
    }

    /// Residual update `x += alpha · y` (`alpha` 1 for most models, Granite's
    /// `residual_multiplier`). Errors: lengths differ; device failures.
    fn add_scaled(&self, x: &mut [f32], y: &[f32], alpha: f32) -> Result<(), ComputeError> {
        crate::host_ops::add_scaled(x, y, alpha)
    }

    /// Embedding lookup: row `ids[r]` of `table` (`[rows, width]`, `width = out.len() /
    /// ids.len()`) times `scale`, widened to f32, into row `r` of `out`. Errors: an id not
    /// below the table's rows, `out` not whole rows; device failures.
    fn embed(
        &self,
        table: FloatTable<'_>,
        ids: &[u32],
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), ComputeError> {
        crate::host_ops::embed(table, ids, scale, out)
    }

    /// Greedy choice over `logits` `[vocab]`: the largest finite value, ties to the smaller
    /// id, and whether every value was finite. Errors: empty logits; device failures.
    fn argmax(&self, logits: &[f32]) -> Result<Argmax, ComputeError> {
        crate::host_ops::argmax(logits)
    }

    /// A device-resident whole-token decoder for `plan` (the seed's `decode_token`): weights,
    /// KV cache and activations stay on the device and one token costs one upload of its id and
    /// one download of the logits. `Ok(None)` (the default, and the CPU backend): no such
    /// decoder; the caller runs its host forward loop with this backend's products. Errors: the
    /// plan is malformed (shapes, formats) or the device fails.
    fn token_decoder<'s>(
        &'s self,
        plan: &crate::DecodePlan<'_>,
    ) -> Result<Option<Box<dyn crate::TokenDecoder + 's>>, ComputeError> {
        let _ = plan;
        Ok(None)
    }
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
