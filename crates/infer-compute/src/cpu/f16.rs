//! Products with IEEE half-precision weights (the vindex f16 tier) and f32 activations.
//!
//! Each f16 weight is widened exactly to f32 (`vcvtph2ps`, or `half::f16::to_f32` in the
//! scalar reference) and multiplied in f32, so the only difference from the f32 path over the
//! same (f16-rounded) weights is the summation order. Decode (one or a few activation rows)
//! streams the 2-byte weights once through fused widen-and-FMA loops; prefill runs the AVX-512
//! register tiles of `f16_tile` (both `A·Bᵀ` and `A·B`) where the CPU has them, else widens
//! blocks of weights into a per-thread f32 buffer and hands them to `matrixmultiply::sgemm`.

use std::cell::Cell;

use half::f16;
use rayon::prelude::*;

use super::matmul::{sgemm_strided, Dims};
use crate::backend::check_product as check;
use crate::backend::empty_product;
use crate::scratch;
use crate::shared_out::SharedOut;
use crate::vec_dot::Isa;

/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 15;
/// Activation rows up to which `A·Bᵀ` is a set of fused dot products (each weight row stays
/// in L1 while it meets every activation row); above it, widened blocks go to sgemm.
const DOT_MAX_ROWS: usize = 4;
/// Weight rows (of `Bᵀ`) or columns (of `B`) widened per sgemm block.
const BLOCK: usize = 64;
/// Most weight rows of `Bᵀ` per sgemm call of `A·Bᵀ`: each call packs all of `A` again, so
/// blocks are as large as this allows while every thread still gets two (measured on SmolLM2's
/// f16 prompt, pp512 at 2 threads: 64 rows 223 tok/s, 256 rows 303–330, 512 rows 284).
const BLOCK_T_MAX: usize = 256;
/// Rows of `B` per task of the few-row `A·B` product (each task adds into its own partial C).
const ROW_CHUNK: usize = 128;

thread_local! {
    /// Per-thread buffer for widened weight blocks (`crate::scratch`: reused, so steady-state
    /// products allocate nothing).
    static WIDE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's per-chunk partial sums of the few-row `A·B` product.
    static PARTIALS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `Σ a[i]·b[i]` with `b` widened from f16. Panics if the lengths differ.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    dot_f16_isa(Isa::best(), a, b)
}

/// `y[i] += alpha · x[i]` with `x` widened from f16. Panics if the lengths differ.
pub fn axpy_f16(alpha: f32, x: &[f16], y: &mut [f32]) {
    axpy_f16_isa(Isa::best(), alpha, x, y)
}

pub(crate) fn dot_f16_isa(isa: Isa, a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: `Isa::Avx2` is only constructed when AVX2, FMA and F16C are present.
        return unsafe { simd::dot(a, b) };
    }
    let _ = isa;
    dot_scalar(a, b)
}

pub(crate) fn axpy_f16_isa(isa: Isa, alpha: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: as in `dot_f16_isa`.
        return unsafe { simd::axpy(alpha, x, y) };
    }
    let _ = isa;
    y.iter_mut()
        .zip(x)
        .for_each(|(yi, xi)| *yi += alpha * xi.to_f32());
}

/// The scalar reference: 8 interleaved partial sums, reduced pairwise.
fn dot_scalar(a: &[f32], b: &[f16]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &p), q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q.to_f32();
        }
    }
    for ((s, &p), q) in acc.iter_mut().zip(ra).zip(rb) {
        *s += p * q.to_f32();
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `C[m×n] = A[m×k] · B[n×k]ᵀ`, `B` f16; see [`crate::ComputeBackend::matmul_transb_f16`].
pub(crate) fn matmul_transb_f16(
    isa: Isa,
    a: &[f32],
    b: &[f16],
    m: usize,
    k: usize,
    n: usize,
    c: &mut [f32],
) {
    check("matmul_transb_f16", a, b, m, k, n, c);
    if empty_product(m, n, k, c) {
        return;
    }
    let serial = rayon::current_num_threads() <= 1 || m * n * k < PAR_MIN_WORK;
    if m <= DOT_MAX_ROWS || isa == Isa::Generic {
        // Fused dots: output column j of every activation row from weight row j.
        let rows_per_task = n.div_ceil(rayon::current_num_threads() * 4).max(8);
        let out = SharedOut(c.as_mut_ptr());
        let task = |j0: usize| {
            let j1 = (j0 + rows_per_task).min(n);
            for j in j0..j1 {
                let row = &b[j * k..(j + 1) * k];
                for i in 0..m {
                    let v = dot_f16_isa(isa, &a[i * k..(i + 1) * k], row);
                    // SAFETY: (i, j) lies in C; tasks own disjoint column ranges j0..j1.
                    unsafe { *out.get().add(i * n + j) = v };
                }
            }
        };
        run_tasks(serial, n.div_ceil(rows_per_task), |t| {
            task(t * rows_per_task)
        });
        return;
    }
    let out = SharedOut(c.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && super::f16_tile::available() {
        let rows = super::f16_tile::task_rows(n, k, rayon::current_num_threads());
        column_tasks(serial, n, rows, |j0, j1| {
            // SAFETY: AVX-512 checked above; shapes checked by `check`; this task alone writes
            // C's columns j0..j1.
            unsafe { super::f16_tile::product_rows(a, b, (m, k, n), (j0, j1), out.get()) };
        });
        return;
    }
    let block = n
        .div_ceil(2 * rayon::current_num_threads())
        .clamp(BLOCK, BLOCK_T_MAX);
    let task = |j0: usize| {
        let j1 = (j0 + block).min(n);
        scratch::with(&WIDE, (j1 - j0) * k, |wide| {
            widen(&b[j0 * k..j1 * k], wide);
            // SAFETY: `wide` is Bᵀ's rows j0..j1 as a [k, j1-j0] matrix read with strides
            // (1, k); C's columns j0..j1 (row stride n) belong to this task alone.
            unsafe {
                let block = Dims { m, k, n: j1 - j0 };
                sgemm_strided(
                    a,
                    block,
                    wide.as_ptr(),
                    (1, k as isize),
                    out.get().add(j0),
                    n,
                )
            };
        });
    };
    run_tasks(serial, n.div_ceil(block), |t| task(t * block));
}

/// `C[m×n] = A[m×k] · B[k×n]`, `B` f16 row-major; see [`crate::ComputeBackend::matmul_f16`].
pub(crate) fn matmul_f16(
    isa: Isa,
    a: &[f32],
    b: &[f16],
    m: usize,
    k: usize,
    n: usize,
    c: &mut [f32],
) {
    check("matmul_f16", a, b, m, k, n, c);
    if m == 0 || n == 0 {
        return;
    }
    let serial = rayon::current_num_threads() <= 1 || m * n * k < PAR_MIN_WORK;
    let out = SharedOut(c.as_mut_ptr());
    if m <= DOT_MAX_ROWS || isa == Isa::Generic {
        // `C = Σₚ A[:, p]·B[p, :]` over chunks of ROW_CHUNK rows of B: each task streams its
        // rows front to back (whole rows, the order memory prefetchers like best) into its own
        // partial C, then the partials are added in chunk order. Chunking does not depend on
        // the thread count, so neither does the result.
        let chunks = k.div_ceil(ROW_CHUNK);
        scratch::with(&PARTIALS, chunks * m * n, |partials| {
            let parts = SharedOut(partials.as_mut_ptr());
            let task = |ci: usize| {
                let (p0, p1) = (ci * ROW_CHUNK, ((ci + 1) * ROW_CHUNK).min(k));
                // SAFETY: chunk ci owns partials[ci·m·n .. (ci+1)·m·n].
                let part =
                    unsafe { std::slice::from_raw_parts_mut(parts.get().add(ci * m * n), m * n) };
                part.fill(0.0);
                for (i, ys) in part.chunks_exact_mut(n).enumerate() {
                    for p in p0..p1 {
                        axpy_f16_isa(isa, a[i * k + p], &b[p * n..(p + 1) * n], ys);
                    }
                }
            };
            run_tasks(serial, chunks, task);
            c.fill(0.0);
            for part in partials.chunks_exact(m * n) {
                c.iter_mut().zip(part).for_each(|(o, v)| *o += v);
            }
        });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && super::f16_tile::available() {
        let cols = super::f16_tile::task_cols(n, k, rayon::current_num_threads());
        column_tasks(serial, n, cols, |j0, j1| {
            // SAFETY: AVX-512 checked above; shapes checked by `check`; this task alone writes
            // C's columns j0..j1.
            unsafe { super::f16_tile::product_cols(a, b, (m, k, n), (j0, j1), out.get()) };
        });
        return;
    }
    let task = |j0: usize| {
        let j1 = (j0 + BLOCK).min(n);
        let width = j1 - j0;
        scratch::with(&WIDE, k * width, |wide| {
            for p in 0..k {
                widen(
                    &b[p * n + j0..p * n + j1],
                    &mut wide[p * width..(p + 1) * width],
                );
            }
            // SAFETY: `wide` is B[:, j0..j1] as a row-major [k, width] matrix; C's columns
            // j0..j1 (row stride n) belong to this task alone.
            unsafe {
                let block = Dims { m, k, n: width };
                sgemm_strided(
                    a,
                    block,
                    wide.as_ptr(),
                    (width as isize, 1),
                    out.get().add(j0),
                    n,
                )
            };
        });
    };
    run_tasks(serial, n.div_ceil(BLOCK), |t| task(t * BLOCK));
}

/// Run `product(j0, j1)` over C's columns in ranges of `width` (the last one shorter), one task
/// each, on this thread or across rayon's pool.
fn column_tasks(
    serial: bool,
    n: usize,
    width: usize,
    product: impl Fn(usize, usize) + Sync + Send,
) {
    run_tasks(serial, n.div_ceil(width), |t| {
        product(t * width, ((t + 1) * width).min(n))
    });
}

/// Run `task(0..count)` on this thread or across rayon's pool.
fn run_tasks(serial: bool, count: usize, task: impl Fn(usize) + Sync + Send) {
    if serial {
        (0..count).for_each(task);
    } else {
        (0..count).into_par_iter().for_each(task);
    }
}

/// Widen f16 → f32 (exact; `half` uses F16C when the CPU has it).
fn widen(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use half::f16;
    use std::arch::x86_64::*;

    /// Four 8-wide accumulators, reduced pairwise; scalar tail.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f16]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr() as *const u16);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            crate::vec_dot::prefetch_stream(pb.add(i) as *const u8, 64);
            for (u, s) in acc.iter_mut().enumerate() {
                let w = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i + 8 * u) as *const __m128i));
                *s = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * u)), w, *s);
            }
            i += 32;
        }
        while i + 8 <= n {
            let w = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i) as *const __m128i));
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), w, acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
        let mut total = _mm_cvtss_f32(q);
        while i < n {
            total += a[i] * b[i].to_f32();
            i += 1;
        }
        total
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy(alpha: f32, x: &[f16], y: &mut [f32]) {
        let n = y.len();
        let (px, py) = (x.as_ptr() as *const u16, y.as_mut_ptr());
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 16 <= n {
            if i % 32 == 0 {
                crate::vec_dot::prefetch_stream(px.add(i) as *const u8, 64);
            }
            let x0 = _mm256_cvtph_ps(_mm_loadu_si128(px.add(i) as *const __m128i));
            let x1 = _mm256_cvtph_ps(_mm_loadu_si128(px.add(i + 8) as *const __m128i));
            _mm256_storeu_ps(
                py.add(i),
                _mm256_fmadd_ps(va, x0, _mm256_loadu_ps(py.add(i))),
            );
            _mm256_storeu_ps(
                py.add(i + 8),
                _mm256_fmadd_ps(va, x1, _mm256_loadu_ps(py.add(i + 8))),
            );
            i += 16;
        }
        while i < n {
            y[i] += alpha * x[i].to_f32();
            i += 1;
        }
    }
}
