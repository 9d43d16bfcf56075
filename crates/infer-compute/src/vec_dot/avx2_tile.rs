//! AVX2 tile kernels for the Q8_0-activation family (Q4_0, Q5_0, Q8_0 weights and the seed's
//! split Q8 format): one weight row against up to [`TILE`] activation rows at once, so each
//! weight block is unpacked (nibbles, fifth bits, scale) once per tile instead of once per
//! activation row — the structure of llamafile's `tinyBLAS_Q0_AVX` (ggml `llamafile/sgemm.cpp`)
//! with a 1 × N tile. A CPU with AVX-512 VNNI takes [`super::vnni_gemm`] instead (see
//! [`rows_times_acts`]).
//!
//! Activations are pre-split ([`super::Q8Rows`]): int8 quants contiguous per row and the block
//! scales as f32. Per block the integer dot is ggml's `mul_sum_i8_pairs_float` (exact), scaled by
//! `d_w · d_a` and accumulated with one FMA; even and odd blocks go to two accumulators (two FMA
//! chains), added at the end. The arithmetic of one (weight row, activation row) pair does not
//! depend on the tile size, so a mat-vec and any row of a mat-mat give bit-identical results.

use infer_quant::{q4_0, q5_0, q8_0};
use std::arch::x86_64::*;

/// Activation rows per tile (AVX2: 16 vector registers).
pub(crate) const TILE: usize = 4;

/// Weight formats with a tile kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Q0 {
    Q4_0,
    Q5_0,
    Q8_0,
    /// The seed's split Q8 format: 32 int8 values per block, the f32 scales in a separate array
    /// (`crate::q8_split`).
    Q8S,
}

/// Const-generic tags of [`Q0`] (the format is resolved at compile time inside the loops).
const F4_0: u8 = 0;
const F5_0: u8 = 1;
const F8_0: u8 = 2;
const F8S: u8 = 3;

const fn q0_from_tag(tag: u8) -> Q0 {
    match tag {
        F4_0 => Q0::Q4_0,
        F5_0 => Q0::Q5_0,
        F8_0 => Q0::Q8_0,
        _ => Q0::Q8S,
    }
}

/// One 32-value weight block at `xb`: its scale (broadcast) and its 32 signed quants. `wd` is
/// the block's f32 scale for [`Q0::Q8S`] (not read for the other formats).
#[inline(always)]
unsafe fn unpack(fmt: Q0, xb: *const u8, wd: *const f32) -> (__m256, __m256i) {
    if fmt == Q0::Q8S {
        return (
            _mm256_set1_ps(*wd),
            _mm256_loadu_si256(xb as *const __m256i),
        );
    }
    // The f16 scale sits at offset 0 of every ggml format; one 32-bit load + vcvtph2ps (stays
    // inside the block: every block is ≥ 18 bytes).
    let d = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
    let d = _mm256_broadcastss_ps(d);
    let q = match fmt {
        Q0::Q4_0 => _mm256_sub_epi8(
            bytes_from_nibbles_32(xb.add(q4_0::QS_OFFSET)),
            _mm256_set1_epi8(8),
        ),
        Q0::Q5_0 => {
            let hi = _mm256_set1_epi8(0xF0u8 as i8);
            let bxhi = _mm256_andnot_si256(bytes_from_bits_32(xb.add(q5_0::QH_OFFSET)), hi);
            _mm256_or_si256(bytes_from_nibbles_32(xb.add(q5_0::QS_OFFSET)), bxhi)
        }
        Q0::Q8_0 | Q0::Q8S => _mm256_loadu_si256(xb.add(q8_0::QS_OFFSET) as *const __m256i),
    };
    (d, q)
}

/// ggml `bytes_from_nibbles_32`.
#[inline(always)]
pub(super) unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// ggml `bytes_from_bits_32`.
#[inline(always)]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = (p as *const u32).read_unaligned();
    let shuf_mask = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Horizontal sum of 8 f32 (ggml `hsum_float_8`).
#[inline(always)]
unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// One block of one pair: `acc += (d_w·d_a) · Σ q_w·q_a` (ggml `mul_sum_i8_pairs_float`).
#[inline(always)]
unsafe fn block(
    acc: __m256,
    dw: __m256,
    ax: __m256i,
    qx: __m256i,
    qy: *const i8,
    da: f32,
) -> __m256 {
    let y = _mm256_loadu_si256(qy as *const __m256i);
    let sy = _mm256_sign_epi8(y, qx);
    let dot = _mm256_maddubs_epi16(ax, sy);
    let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot));
    _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), s, acc)
}

/// `out[j] = W_row · A_j` for `N` activation rows (quants `qs[j]`, `nb·32` values; scales
/// `d[j]`, `nb` values) and one weight row `w` of `nb` blocks of format `F` (`wd`: the row's
/// f32 scales for [`Q0::Q8S`], else unused).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` must hold `nb` blocks, each `qs[j]` `nb·32` bytes,
/// each `d[j]` (and `wd` for Q8S) `nb` f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const F: u8, const N: usize>(
    nb: usize,
    w: *const u8,
    wd: *const f32,
    qs: [*const i8; N],
    d: [*const f32; N],
) -> [f32; N] {
    let fmt = q0_from_tag(F);
    let bb = block_bytes(fmt);
    let mut acc0 = [_mm256_setzero_ps(); N];
    let mut acc1 = [_mm256_setzero_ps(); N];
    let mut ib = 0;
    while ib + 1 < nb {
        let (dw0, qx0) = unpack(fmt, w.add(ib * bb), wd.wrapping_add(ib));
        let ax0 = _mm256_sign_epi8(qx0, qx0);
        let (dw1, qx1) = unpack(fmt, w.add((ib + 1) * bb), wd.wrapping_add(ib + 1));
        let ax1 = _mm256_sign_epi8(qx1, qx1);
        for j in 0..N {
            acc0[j] = block(acc0[j], dw0, ax0, qx0, qs[j].add(ib * 32), *d[j].add(ib));
            acc1[j] = block(
                acc1[j],
                dw1,
                ax1,
                qx1,
                qs[j].add((ib + 1) * 32),
                *d[j].add(ib + 1),
            );
        }
        ib += 2;
    }
    if ib < nb {
        let (dw0, qx0) = unpack(fmt, w.add(ib * bb), wd.wrapping_add(ib));
        let ax0 = _mm256_sign_epi8(qx0, qx0);
        for j in 0..N {
            acc0[j] = block(acc0[j], dw0, ax0, qx0, qs[j].add(ib * 32), *d[j].add(ib));
        }
    }
    let mut out = [0f32; N];
    for j in 0..N {
        out[j] = hsum_float_8(_mm256_add_ps(acc0[j], acc1[j]));
    }
    out
}

/// True when this CPU has AVX512F/VL/BW/VNNI (checked once).
pub(crate) fn vnni_available() -> bool {
    use std::sync::OnceLock;
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| {
        super::avx2_available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// The tile kernel for the ggml block format `fmt`, if any.
pub(crate) fn q0_of(fmt: infer_quant::QuantFormat) -> Option<Q0> {
    match fmt {
        infer_quant::QuantFormat::Q4_0 => Some(Q0::Q4_0),
        infer_quant::QuantFormat::Q5_0 => Some(Q0::Q5_0),
        infer_quant::QuantFormat::Q8_0 => Some(Q0::Q8_0),
        _ => None,
    }
}

/// Bytes per block of `fmt` (values only for [`Q0::Q8S`]).
pub(crate) const fn block_bytes(fmt: Q0) -> usize {
    match fmt {
        Q0::Q4_0 => q4_0::BLOCK_BYTES,
        Q0::Q5_0 => q5_0::BLOCK_BYTES,
        Q0::Q8_0 => q8_0::BLOCK_BYTES,
        Q0::Q8S => 32,
    }
}

/// Element (r, i) of `out` = `W_r · A_i` for the weight rows `ws` (`row_bytes` each,
/// `acts.cols / 32` blocks of the ggml format `fmt`) and every activation row `i` of `acts`:
/// tiles of activation rows, then the remainder one by one (same arithmetic per pair).
///
/// Panics if `ws` is not whole rows of at least a row's blocks, or `fmt` is [`Q0::Q8S`]
/// (see [`rows_times_acts_q8s`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`super::avx2_available`]); `out` must own elements
/// (r, i) for every r < `ws.len() / row_bytes` and i < `acts.m` (see [`super::OutMat::put`]).
pub(crate) unsafe fn rows_times_acts(
    fmt: Q0,
    ws: &[u8],
    row_bytes: usize,
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    let nb = acts.cols / 32;
    let m = acts.m;
    assert!(fmt != Q0::Q8S, "split Q8 goes through rows_times_acts_q8s");
    assert!(
        row_bytes >= nb * block_bytes(fmt) && row_bytes > 0 && ws.len().is_multiple_of(row_bytes),
        "tile: weight rows of {row_bytes} bytes, {} bytes given",
        ws.len()
    );
    assert!(acts.qs.len() >= m * acts.cols && acts.d.len() >= m * nb);
    debug_assert!(super::avx2_available());
    rows_dispatch(fmt, ws, row_bytes, std::ptr::null(), acts, out)
}

/// [`rows_times_acts`] for the split Q8 format: int8 `values` (`acts.cols` per row) with f32
/// `scales` (`acts.cols / 32` per row, `crate::q8_split`).
///
/// Panics if `values` is not whole rows or `scales` has not one scale per 32 values.
///
/// # Safety
/// As [`rows_times_acts`].
pub(crate) unsafe fn rows_times_acts_q8s(
    values: &[u8],
    scales: &[f32],
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    let cols = acts.cols;
    assert!(
        cols > 0 && cols.is_multiple_of(32) && values.len().is_multiple_of(cols),
        "split Q8 tile: partial row"
    );
    assert_eq!(scales.len(), values.len() / 32, "split Q8 tile: scales");
    assert!(acts.qs.len() >= acts.m * cols && acts.d.len() >= acts.m * (cols / 32));
    debug_assert!(super::avx2_available());
    rows_dispatch(Q0::Q8S, values, cols, scales.as_ptr(), acts, out)
}

/// Picks the row loop for `fmt` and the CPU: [`super::vnni_gemm`] with AVX-512 VNNI, else the
/// AVX2 tiles.
///
/// # Safety
/// As [`rows_times_acts`]; `wd` holds the rows' f32 scales for [`Q0::Q8S`].
unsafe fn rows_dispatch(
    fmt: Q0,
    ws: &[u8],
    row_bytes: usize,
    wd: *const f32,
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    if vnni_available() {
        return super::vnni_gemm::rows_times_acts(fmt, ws, row_bytes, wd, acts, out);
    }
    match fmt {
        Q0::Q4_0 => rows_avx2::<F4_0>(ws, row_bytes, wd, acts, out),
        Q0::Q5_0 => rows_avx2::<F5_0>(ws, row_bytes, wd, acts, out),
        Q0::Q8_0 => rows_avx2::<F8_0>(ws, row_bytes, wd, acts, out),
        Q0::Q8S => rows_avx2::<F8S>(ws, row_bytes, wd, acts, out),
    }
}

macro_rules! rows_fn {
    ($name:ident, $tile:ident, $n:expr, $feat:literal) => {
        /// The row loop of [`rows_times_acts`] around one tile kernel (one target-feature
        /// region, kernels inlined).
        #[target_feature(enable = $feat)]
        unsafe fn $name<const F: u8>(
            ws: &[u8],
            row_bytes: usize,
            wd: *const f32,
            acts: &super::Q8Rows,
            out: super::OutMat,
        ) {
            let nb = acts.cols / 32;
            let m = acts.m;
            let qs = acts.qs.as_ptr();
            let ds = acts.d.as_ptr();
            for (r, w) in ws.chunks_exact(row_bytes).enumerate() {
                let wd = wd.wrapping_add(r * nb);
                let mut i = 0;
                while i + $n <= m {
                    let v = $tile::<F, { $n }>(
                        nb,
                        w.as_ptr(),
                        wd,
                        std::array::from_fn(|j| qs.add((i + j) * acts.cols)),
                        std::array::from_fn(|j| ds.add((i + j) * nb)),
                    );
                    for (j, x) in v.into_iter().enumerate() {
                        out.put(r, i + j, x);
                    }
                    i += $n;
                }
                while i < m {
                    let v = $tile::<F, 1>(
                        nb,
                        w.as_ptr(),
                        wd,
                        [qs.add(i * acts.cols)],
                        [ds.add(i * nb)],
                    );
                    out.put(r, i, v[0]);
                    i += 1;
                }
            }
        }
    };
}

rows_fn!(rows_avx2, tile, TILE, "avx2,fma,f16c");

#[cfg(test)]
mod tests {
    use super::*;

    /// `tile` of tag `F` at width 4 over the four activation rows, and at width 1 over the last.
    ///
    /// # Safety
    /// AVX2 available; buffers sized for `nb` blocks.
    unsafe fn widths<const F: u8>(
        nb: usize,
        w: &[u8],
        wd: &[f32],
        qp: [*const i8; 4],
        dp: [*const f32; 4],
    ) -> ([f32; 4], [f32; 1]) {
        let (w, wd) = (w.as_ptr(), wd.as_ptr());
        (
            tile::<F, 4>(nb, w, wd, qp, dp),
            tile::<F, 1>(nb, w, wd, [qp[3]], [dp[3]]),
        )
    }

    /// The AVX2 tile kernel of width 4 equals width 1 bit for bit, for every format and
    /// remainder, on random weight bytes (quants avoid −128, as ggml's quantizers do) and random
    /// activation quants and scales.
    #[test]
    fn tile_widths_give_the_same_bits() {
        if !crate::vec_dot::avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut next = super::super::xorshift(0x9e37_79b9_7f4a_7c15);
        for fmt in [Q0::Q4_0, Q0::Q5_0, Q0::Q8_0, Q0::Q8S] {
            for nb in [1usize, 2, 3, 18, 20, 64] {
                let bb = block_bytes(fmt);
                let mut w = vec![0u8; nb * bb];
                for (k, b) in w.iter_mut().enumerate() {
                    let r = next() as u8;
                    *b = if fmt != Q0::Q8S && k % bb == 1 {
                        r & 0x3b // f16 scale: finite, moderate
                    } else if r == 0x80 && matches!(fmt, Q0::Q8_0 | Q0::Q8S) {
                        0x81
                    } else {
                        r
                    };
                }
                let wd: Vec<f32> = (0..nb).map(|_| (next() % 1000) as f32 * 1e-4).collect();
                let qs: Vec<Vec<i8>> = (0..4)
                    .map(|_| (0..nb * 32).map(|_| (next() % 255) as i8).collect())
                    .collect();
                let d: Vec<Vec<f32>> = (0..4)
                    .map(|_| (0..nb).map(|_| (next() % 1000) as f32 * 1e-4).collect())
                    .collect();
                let qp: [*const i8; 4] = std::array::from_fn(|j| qs[j].as_ptr());
                let dp: [*const f32; 4] = std::array::from_fn(|j| d[j].as_ptr());
                // SAFETY: AVX2 detected; buffers hold nb blocks / nb·32 quants.
                let (four, one) = unsafe {
                    match fmt {
                        Q0::Q4_0 => widths::<F4_0>(nb, &w, &wd, qp, dp),
                        Q0::Q5_0 => widths::<F5_0>(nb, &w, &wd, qp, dp),
                        Q0::Q8_0 => widths::<F8_0>(nb, &w, &wd, qp, dp),
                        Q0::Q8S => widths::<F8S>(nb, &w, &wd, qp, dp),
                    }
                };
                assert_eq!(four[3].to_bits(), one[0].to_bits(), "{fmt:?} nb={nb}");
                assert!(
                    four.iter().all(|v| v.is_finite()),
                    "{fmt:?} nb={nb}: {four:?}"
                );
            }
        }
    }
}
