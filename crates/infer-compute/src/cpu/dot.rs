//! Vector kernels the compiler vectorises: an f32 dot product with 16 independent accumulators
//! and an axpy (SSE2 baseline; an AVX2 copy is selected at run time on x86-64).

use crate::kv_type::sealed::Elem;

/// Number of independent partial sums (two AVX vectors, four SSE vectors).
const LANES: usize = 16;

/// `Σ a[i]·b[i]` in f32 with 16 interleaved partial sums reduced pairwise.
///
/// The summation order depends only on the length, never on the CPU features found, so the
/// result is bitwise identical on every x86-64 machine. Panics if the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU supports AVX2 and F16C, checked just above.
            return unsafe { dot_avx2_kv(a, b) };
        }
    }
    dot_generic(a, b)
}

/// [`dot`]'s body (16 interleaved partial sums, then the remainder, reduced pairwise),
/// always inlined: callers with a length known at compile time (attention's head dims) get it
/// unrolled, bit-identical to [`dot`].
/// `b` may also be f16 (a KV cache row), each value widened exactly to f32 before its multiply.
#[inline(always)]
pub(crate) fn dot_generic<T: Elem>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q.widen();
        }
    }
    finish(acc, ra, rb)
}

/// [`dot_generic`] with its 16 partial sums held in two AVX registers (the compiler's own
/// vectorisation of the generic body uses 2-wide loads), `b` f32 or an f16 KV cache row whose
/// groups of eight values are widened as they are loaded ([`Elem::load8`]): the same
/// multiplies and adds per lane in the same order, the remainder and the pairwise reduction as
/// in [`dot_generic`], so the result is bitwise identical. Lengths must be equal (checked by
/// the callers).
///
/// # Safety
/// AVX2 and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) unsafe fn dot_avx2_kv<T: Elem>(a: &[f32], b: &[T]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let chunks = n / LANES;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in 0..chunks {
        // SAFETY: c·16 + 16 <= n, within both slices; AVX2 and F16C are available.
        unsafe {
            let (pa, pb) = (a.as_ptr().add(c * LANES), b.as_ptr().add(c * LANES));
            lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(pa), T::load8(pb)));
            hi = _mm256_add_ps(
                hi,
                _mm256_mul_ps(_mm256_loadu_ps(pa.add(8)), T::load8(pb.add(8))),
            );
        }
    }
    let mut acc = [0f32; LANES];
    // SAFETY: `acc` holds 16 floats, two unaligned 8-float stores.
    unsafe {
        _mm256_storeu_ps(acc.as_mut_ptr(), lo);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi);
    }
    let done = chunks * LANES;
    finish(acc, &a[done..n], &b[done..n])
}

/// The end of [`dot_generic`] (and [`dot_avx2_kv`]): the remainder `ra · rb`
/// added to the first partial sums, then the pairwise reduction 16 → 8 → 4 → 2 → 1.
#[inline(always)]
fn finish<T: Elem>(mut acc: [f32; LANES], ra: &[f32], rb: &[T]) -> f32 {
    for ((s, &p), &q) in acc.iter_mut().zip(ra).zip(rb) {
        *s += p * q.widen();
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `y[i] += a · x[i]`. Element-wise, so the result does not depend on the CPU features found.
/// Panics if the lengths differ.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { axpy_avx2(a, x, y) };
        }
    }
    axpy_generic(a, x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
    axpy_generic(a, x, y)
}

#[inline(always)]
fn axpy_generic(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}
