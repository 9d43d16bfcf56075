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
#[cfg(target_arch = "x86_64")]
mod avx2_gemm;
#[cfg(target_arch = "x86_64")]
mod avx2_gemm_k;
#[cfg(target_arch = "x86_64")]
mod avx2_pack;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_q4k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_q6k;
pub mod generic;
#[cfg(target_arch = "x86_64")]
mod kquant_row;
mod layout;
mod q8_act;
#[cfg(target_arch = "x86_64")]
mod vnni_gemm;
#[cfg(target_arch = "x86_64")]
mod vnni_gemm_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x16;

use crate::ComputeError;
use infer_quant::QuantFormat;

pub use avx2_dispatch::avx2_available;

/// How far past the block being read the one-row kernels (K-quants: [`kquant_row`]; f16:
/// `cpu::f16`'s dot and axpy) prefetch their weight rows, in bytes. Decode reads every weight
/// once per token from memory, one row after another; on this project's AMD EPYC test host the
/// hardware prefetchers alone left a single core at ~75% of its read bandwidth
/// (Llama-3.2-1B shapes, Q4_K_M, tg64 at 1 thread: 33.6 → 37.3 tok/s with hints 8 KiB ahead,
/// 2 threads: 55.0 → 65.2; 1 KiB ahead gained nothing). A hint past the end of a mapping is
/// dropped.
#[cfg(target_arch = "x86_64")]
const STREAM_AHEAD: usize = 8192;

/// Prefetch (into L1) the cache lines of the `bytes` bytes [`STREAM_AHEAD`] past `p`.
///
/// # Safety
/// None beyond a valid `p` provenance: prefetches never fault.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_stream(p: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let ahead = p.wrapping_add(STREAM_AHEAD);
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off) as *const i8);
        off += 64;
    }
}

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

/// The activation format of the fused kernel for weight format `weights`: the pairing of the
/// format table ([`QuantFormat::vec_dot_type`], ggml's `vec_dot_type`) for the formats that
/// have a fused kernel here (Q4_K, Q6_K → Q8_K; Q4_0, Q5_0, Q8_0 → Q8_0). `None` for every
/// other format (those take the dequantize-then-dot path).
pub fn activation_format(weights: QuantFormat) -> Option<QuantFormat> {
    kernel(weights, Isa::Generic).and(weights.vec_dot_type())
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
/// (also ggml's x86 `from_float` for Q8_K; an AVX2 copy with the same bytes), Q8_0 with ggml `quantize_row_q8_0_ref`
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
        QuantFormat::Q8_K => q8_act::quantize_q8k(x, out),
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

/// Activation rows quantized to Q8_0 (ggml `quantize_row_q8_0_ref`) and split for the tile
/// kernels: `qs` `[m, cols]` int8 quants, `d` `[m, cols/32]` block scales as f32 (the stored f16
/// value, converted exactly). Same numbers as [`quantize_activations`] to Q8_0.
#[derive(Clone, Debug, Default)]
pub struct Q8Rows {
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) m: usize,
    pub(crate) cols: usize,
}

impl Q8Rows {
    /// Quantize `x` (`[m, cols]` row-major f32, `cols` a multiple of 32).
    ///
    /// Errors: [`ComputeError::Quant`] when `cols` is not a multiple of 32. Panics if
    /// `x.len() != m * cols`.
    pub fn quantize(x: &[f32], m: usize, cols: usize) -> Result<Self, ComputeError> {
        let mut a = Q8Rows::default();
        a.quantize_into(x, m, cols)?;
        Ok(a)
    }

    /// [`Q8Rows::quantize`] into this value's buffers, which only grow (no allocation when
    /// they already hold `m · cols` values): reuse one `Q8Rows` across calls.
    ///
    /// Errors and panics as [`Q8Rows::quantize`]; on error `self` is left empty (`m = 0`).
    pub fn quantize_into(&mut self, x: &[f32], m: usize, cols: usize) -> Result<(), ComputeError> {
        assert_eq!(x.len(), m * cols, "Q8Rows: x is not m*cols = {m}*{cols}");
        self.m = 0;
        QuantFormat::Q8_0.bytes_for(cols)?;
        let nb = cols / 32;
        grow(&mut self.qs, m * cols);
        grow(&mut self.d, m * nb);
        let (qs, d) = (&mut self.qs[..m * cols], &mut self.d[..m * nb]);
        let threads = rayon::current_num_threads();
        if threads > 1 && m > 1 && m * cols >= crate::host_ops::PAR_ROW_VALUES {
            // By rows across the pool (batched decode): the same bytes, without the other
            // threads waiting on this one.
            use rayon::prelude::*;
            let per = m.div_ceil(threads);
            x.par_chunks(per * cols)
                .zip(qs.par_chunks_mut(per * cols))
                .zip(d.par_chunks_mut(per * nb))
                .for_each(|((x, qs), d)| q8_act::quantize_split(x, qs, d));
        } else {
            q8_act::quantize_split(x, qs, d);
        }
        self.m = m;
        self.cols = cols;
        Ok(())
    }

    /// No rows (a `const` [`Default`]).
    pub(crate) const EMPTY: Q8Rows = Q8Rows {
        qs: Vec::new(),
        d: Vec::new(),
        m: 0,
        cols: 0,
    };

    /// Quantize `x` (`[m, cols]`) into this thread's reusable `Q8Rows` and run `f` on it
    /// (no allocation once the thread's buffers are large enough; see `crate::scratch`).
    ///
    /// Errors and panics as [`Q8Rows::quantize`].
    pub(crate) fn with_thread_buffer<R>(
        x: &[f32],
        m: usize,
        cols: usize,
        f: impl FnOnce(&Q8Rows) -> R,
    ) -> Result<R, ComputeError> {
        thread_local!(static ROWS: std::cell::Cell<Q8Rows> = const {
            std::cell::Cell::new(Q8Rows::EMPTY)
        });
        let mut a = ROWS.take();
        let r = a.quantize_into(x, m, cols).map(|()| f(&a));
        ROWS.set(a);
        r
    }

    /// Number of activation rows.
    pub fn rows(&self) -> usize {
        self.m
    }
}

/// Resize `v` to at least `n` elements (never shrinks; amortized growth).
fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Destination of a tiled product: the output of (weight row `r`, activation row `i`) lives at
/// `ptr[r·row_stride + i·act_stride]`. Lets parallel tasks that own disjoint weight rows write
/// straight into a `[m, rows]` result (no transposed copy).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutMat {
    ptr: *mut f32,
    row_stride: usize,
    act_stride: usize,
}

// SAFETY: an `OutMat` is only a pointer; users promise (see `put`) that concurrent tasks write
// disjoint elements of a buffer that outlives them.
unsafe impl Send for OutMat {}
// SAFETY: as for `Send`: shared use only ever writes disjoint elements.
unsafe impl Sync for OutMat {}

impl OutMat {
    /// The `[m, rows]` row-major matrix `y` (`y.len() == m·rows`): element (r, i) at
    /// `y[i·rows + r]`.
    pub(crate) fn rows_last(y: &mut [f32], m: usize, rows: usize) -> Self {
        assert_eq!(y.len(), m * rows, "OutMat: y is not m*rows");
        OutMat {
            ptr: y.as_mut_ptr(),
            row_stride: 1,
            act_stride: rows,
        }
    }

    /// The same matrix seen from weight row `r0` on.
    ///
    /// # Safety
    /// `r0` must be within the matrix.
    pub(crate) unsafe fn at_row(self, r0: usize) -> Self {
        OutMat {
            ptr: self.ptr.add(r0 * self.row_stride),
            ..self
        }
    }

    /// Write element (r, i).
    ///
    /// # Safety
    /// (r, i) must be inside the matrix this was made from, that buffer still alive, and no
    /// other thread may access the element concurrently.
    #[inline(always)]
    pub(crate) unsafe fn put(self, r: usize, i: usize, v: f32) {
        *self.ptr.add(r * self.row_stride + i * self.act_stride) = v;
    }
}

/// The kernels' tests' random source: xorshift64 (Marsaglia), `seed` ≠ 0.
#[cfg(test)]
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
