//! Vector kernels the compiler vectorises: an f32 dot product with 16 independent accumulators
//! and an axpy (SSE2 baseline; an AVX2 copy is selected at run time on x86-64).

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
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_generic(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_generic(a, b)
}

/// [`dot`]'s body (16 interleaved partial sums, then the remainder, reduced pairwise),
/// always inlined: callers with a length known at compile time (attention's head dims) get it
/// unrolled, bit-identical to [`dot`].
#[inline(always)]
pub(crate) fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    for ((s, &p), &q) in acc.iter_mut().zip(ra).zip(rb) {
        *s += p * q;
    }
    // Pairwise reduction 16 → 8 → 4 → 2 → 1.
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
