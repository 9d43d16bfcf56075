//! AVX-512 register tiles for the f16 tier's many-row product `C = A·Bᵀ` (prompts): `A` f32
//! activations `[m, k]`, `B` f16 weights `[n, k]`, both read in place. A tile holds
//! [`TILE_W`] weight rows × up to [`TILE_A`] activation rows in 24 accumulators of 16 lanes
//! each (partial sums along k, tinyBLAS's layout in llamafile's `sgemm.cpp`); the weights are
//! widened in registers (`vcvtph2ps`), so nothing is packed or widened into memory, which
//! took a third of an f16 prompt with `matrixmultiply` (its packing 20%, the widening 12%, at
//! 256-row blocks). Every weight is widened exactly; only the f32 summation order differs
//! from the other products.

use half::f16;
use std::arch::x86_64::*;

/// Weight rows per tile.
const TILE_W: usize = 4;
/// Activation rows per tile (4 × 6 accumulators + 4 widened weight vectors + 1 activation
/// vector of AVX-512's 32 registers).
const TILE_A: usize = 6;
/// Bytes of f16 weights one task keeps in L2 while every activation tile passes over them.
const TASK_WEIGHT_BYTES: usize = 1 << 18;

/// True when this CPU has AVX512F/BW/VL with F16C and FMA (checked once).
pub(super) fn available() -> bool {
    use std::sync::OnceLock;
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("fma")
    })
}

/// Weight rows per task of [`product_rows`] for `n` rows of `k` values on `threads` threads.
pub(super) fn task_rows(n: usize, k: usize, threads: usize) -> usize {
    task_width(n, k, threads, TILE_W)
}

/// Weights (rows of `Bᵀ`, columns of `B`, `k` values each) per task: a multiple of `unit`, at
/// most [`TASK_WEIGHT_BYTES`] of them, and at least four tasks per thread when `n` allows.
fn task_width(n: usize, k: usize, threads: usize, unit: usize) -> usize {
    let cap = (TASK_WEIGHT_BYTES / (2 * k.max(1))).max(unit);
    let want = n.div_ceil(4 * threads.max(1)).max(unit);
    want.min(cap).next_multiple_of(unit)
}

/// `C[i, j] = Σₚ A[i, p]·B[j, p]` for every activation row `i < m` and weight rows
/// `j0 ≤ j < j1`.
///
/// # Safety
/// [`available`]; `a` holds `m·k` values, `b` at least `j1·k`, `c` is valid for writes of
/// `m` rows × columns `j0..j1` at row stride `n`, written by no other thread meanwhile.
pub(super) unsafe fn product_rows(
    a: &[f32],
    b: &[f16],
    (m, k, n): (usize, usize, usize),
    (j0, j1): (usize, usize),
    c: *mut f32,
) {
    debug_assert!(a.len() >= m * k && b.len() >= j1 * k);
    let (a, w) = (a.as_ptr(), b.as_ptr() as *const u16);
    for i0 in (0..m).step_by(TILE_A) {
        let rows = (m - i0).min(TILE_A);
        let ai = a.add(i0 * k);
        let ci = c.add(i0 * n);
        let mut j = j0;
        while j + TILE_W <= j1 {
            tile_any::<TILE_W>(rows, ai, w.add(j * k), k, ci.add(j), n);
            j += TILE_W;
        }
        while j < j1 {
            tile_any::<1>(rows, ai, w.add(j * k), k, ci.add(j), n);
            j += 1;
        }
    }
}

/// [`tile`] for `rows` (1..=[`TILE_A`]) activation rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma,avx2")]
unsafe fn tile_any<const R: usize>(
    rows: usize,
    a: *const f32,
    w: *const u16,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    match rows {
        6 => tile::<R, 6>(a, w, k, c, ldc),
        5 => tile::<R, 5>(a, w, k, c, ldc),
        4 => tile::<R, 4>(a, w, k, c, ldc),
        3 => tile::<R, 3>(a, w, k, c, ldc),
        2 => tile::<R, 2>(a, w, k, c, ldc),
        _ => tile::<R, 1>(a, w, k, c, ldc),
    }
}

/// `R` weight rows (`w`, row stride `k`) × `N` activation rows (`a`, row stride `k`) into
/// `c[t·ldc + r]`: 16-lane partial sums along k, the tail masked, one horizontal sum each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma,avx2")]
unsafe fn tile<const R: usize, const N: usize>(
    a: *const f32,
    w: *const u16,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); R]; N];
    let mut wv = [_mm512_setzero_ps(); R];
    let mut p = 0;
    while p + 16 <= k {
        for (r, v) in wv.iter_mut().enumerate() {
            *v = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(r * k + p) as *const __m256i));
        }
        for (t, at) in acc.iter_mut().enumerate() {
            let x = _mm512_loadu_ps(a.add(t * k + p));
            for (s, &wr) in at.iter_mut().zip(&wv) {
                *s = _mm512_fmadd_ps(wr, x, *s);
            }
        }
        p += 16;
    }
    if p < k {
        let mask: __mmask16 = ((1u32 << (k - p)) - 1) as u16;
        for (r, v) in wv.iter_mut().enumerate() {
            let h = _mm256_maskz_loadu_epi16(mask, w.add(r * k + p) as *const i16);
            *v = _mm512_cvtph_ps(h);
        }
        for (t, at) in acc.iter_mut().enumerate() {
            let x = _mm512_maskz_loadu_ps(mask, a.add(t * k + p));
            for (s, &wr) in at.iter_mut().zip(&wv) {
                *s = _mm512_fmadd_ps(wr, x, *s);
            }
        }
    }
    for (t, at) in acc.iter().enumerate() {
        let out = c.add(t * ldc);
        if R == 4 {
            _mm_storeu_ps(out, hsum4([at[0], at[1], at[2], at[3]]));
        } else {
            for (r, &s) in at.iter().enumerate() {
                *out.add(r) = _mm512_reduce_add_ps(s);
            }
        }
    }
}

/// The four horizontal sums of `v` as one vector `[Σv₀, Σv₁, Σv₂, Σv₃]`.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn hsum4(v: [__m512; 4]) -> __m128 {
    let (s0, s1, s2, s3) = (fold(v[0]), fold(v[1]), fold(v[2]), fold(v[3]));
    let h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))
}

/// The two 8-lane halves of `x` added.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn fold(x: __m512) -> __m256 {
    _mm256_add_ps(
        _mm512_castps512_ps256(x),
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)),
    )
}

/// Columns of `B` per tile of the `A·B` form: [`AB_VECS`] vectors of 16.
const AB_VECS: usize = 4;
const AB_COLS: usize = 16 * AB_VECS;

/// Columns of `B` per task of [`product_cols`] for `n` columns of `k` values on `threads`
/// threads.
pub(super) fn task_cols(n: usize, k: usize, threads: usize) -> usize {
    task_width(n, k, threads, AB_COLS)
}

/// `C[i, j] = Σₚ A[i, p]·B[p, j]` for every activation row `i < m` and columns
/// `j0 ≤ j < j1`, `B` f16 row-major `[k, n]` (the layout of feature-major down projections):
/// tiles of [`TILE_A`] activation rows × [`AB_COLS`] columns, each `A[i, p]` broadcast against
/// 16-column vectors of `B`'s row `p` widened in registers; the last vector of a row masked.
///
/// # Safety
/// [`available`]; `a` holds `m·k` values, `b` `k·n`, `c` is valid for writes of `m` rows ×
/// columns `j0..j1` at row stride `n`, written by no other thread meanwhile.
pub(super) unsafe fn product_cols(
    a: &[f32],
    b: &[f16],
    (m, k, n): (usize, usize, usize),
    (j0, j1): (usize, usize),
    c: *mut f32,
) {
    debug_assert!(a.len() >= m * k && b.len() >= k * n && j1 <= n);
    let (a, w) = (a.as_ptr(), b.as_ptr() as *const u16);
    for i0 in (0..m).step_by(TILE_A) {
        let rows = (m - i0).min(TILE_A);
        let (ai, ci) = (a.add(i0 * k), c.add(i0 * n));
        let mut j = j0;
        while j < j1 {
            let cols = (j1 - j).min(AB_COLS);
            let vecs = cols.div_ceil(16);
            let last = (cols - 16 * (vecs - 1)) as u32;
            let mask = ((1u64 << last) - 1) as u16;
            let (wj, cj) = (w.add(j), ci.add(j));
            match vecs {
                4 => tile_ab_any::<4>(rows, ai, wj, (k, n), cj, mask),
                3 => tile_ab_any::<3>(rows, ai, wj, (k, n), cj, mask),
                2 => tile_ab_any::<2>(rows, ai, wj, (k, n), cj, mask),
                _ => tile_ab_any::<1>(rows, ai, wj, (k, n), cj, mask),
            }
            j += cols;
        }
    }
}

/// [`tile_ab`] for `rows` (1..=[`TILE_A`]) activation rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma,avx2")]
unsafe fn tile_ab_any<const V: usize>(
    rows: usize,
    a: *const f32,
    w: *const u16,
    kn: (usize, usize),
    c: *mut f32,
    mask: __mmask16,
) {
    match rows {
        6 => tile_ab::<V, 6>(a, w, kn, c, mask),
        5 => tile_ab::<V, 5>(a, w, kn, c, mask),
        4 => tile_ab::<V, 4>(a, w, kn, c, mask),
        3 => tile_ab::<V, 3>(a, w, kn, c, mask),
        2 => tile_ab::<V, 2>(a, w, kn, c, mask),
        _ => tile_ab::<V, 1>(a, w, kn, c, mask),
    }
}

/// `N` activation rows (`a`, row stride `k`) × `V` vectors of 16 columns of `B` (`w`, row
/// stride `n`; the last vector's lanes limited to `mask`) into `c` (row stride `n`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma,avx2")]
unsafe fn tile_ab<const V: usize, const N: usize>(
    a: *const f32,
    w: *const u16,
    (k, n): (usize, usize),
    c: *mut f32,
    mask: __mmask16,
) {
    let mut acc = [[_mm512_setzero_ps(); V]; N];
    let mut wv = [_mm512_setzero_ps(); V];
    for p in 0..k {
        let row = w.add(p * n);
        for (v, x) in wv.iter_mut().enumerate() {
            let m = if v + 1 == V { mask } else { 0xFFFF };
            *x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row.add(16 * v) as *const i16));
        }
        for (t, at) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*a.add(t * k + p));
            for (s, &wc) in at.iter_mut().zip(&wv) {
                *s = _mm512_fmadd_ps(x, wc, *s);
            }
        }
    }
    for (t, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            let m = if v + 1 == V { mask } else { 0xFFFF };
            _mm512_mask_storeu_ps(c.add(t * n + 16 * v), m, x);
        }
    }
}
