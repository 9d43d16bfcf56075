//! Q6_K × Q8_K tile kernel (AVX2 integer pipeline, compiled twice: for AVX-512VL's 32 vector
//! registers, and for plain AVX2/FMA/F16C hosts' 16, where the unpacked block partly lives in
//! L1 instead): one weight row against up to [`TILE`] activation rows, each Q6_K block unpacked
//! once per tile — the mat-vec and products of fewer than four activation rows (four or more
//! take [`super::avx2_gemm_k`]). Per 32 values ggml's `__AVX2__` `ggml_vec_dot_q6_K_q8_K`
//! computes `madd(scale, maddubs(q, y) − maddubs(32, y))`; here the `−32·y` term is taken once
//! per block from the Q8_K group sums (`bsums`, as ggml's newer x86 path does): `Σ scale·(q −
//! 32)·y = Σ scale·q·y − 32·Σ_g scale_g·bsum_g`, exact in i32 (|maddubs| ≤ 2·63·128, no
//! saturation). The integer sum `isum` of every block equals ggml's; the f32 part is
//! `acc = fma(d·d_a, isum, acc)` per block from `acc = 0`, the order of [`super::kquant_row`]
//! and [`super::vnni_gemm_k`], so every tile width, the batch kernel and the AVX-512 VNNI path
//! give the same bits.

use super::layout::f16_bits_to_f32;
use infer_quant::{q6_k, q8_k};
use std::arch::x86_64::*;

/// Activation rows per tile.
pub(crate) const TILE: usize = 4;

/// ggml `get_scale_shuffle(i)`: bytes `2i` ×8 then `2i + 1` ×8.
pub(super) const SCALE_SHUFFLE: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        let mut k = 0;
        while k < 16 {
            t[i][k] = (2 * i + k / 8) as u8;
            k += 1;
        }
        i += 1;
    }
    t
};

/// `out[j] = W_row · A_j` for one Q6_K weight row `w` of `nb` blocks and `N` Q8_K activation
/// rows `a[j]` (`nb` blocks each).
///
/// Always inlined into the row loops of `q8k_tile_rows!`, which carry the target features.
///
/// # Safety
/// AVX2, FMA, F16C available (the caller compiled for them); the pointers hold `nb` blocks.
#[inline(always)]
unsafe fn tile<const N: usize>(nb: usize, w: *const u8, a: [*const u8; N]) -> [f32; N] {
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let mut acc = [0f32; N];
    for i in 0..nb {
        let xb = w.add(i * q6_k::BLOCK_BYTES);
        let xd = f16_bits_to_f32((xb.add(q6_k::D_OFFSET) as *const u16).read_unaligned());
        let scales = _mm_loadu_si128(xb.add(q6_k::SCALES_OFFSET) as *const __m128i);
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let ql = xb.add(q6_k::QL_OFFSET + 64 * h);
            let qh = _mm256_loadu_si256(xb.add(q6_k::QH_OFFSET + 32 * h) as *const __m256i);
            let b1 = _mm256_loadu_si256(ql as *const __m256i);
            let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let hi = |s: i32| {
                let v = match s {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(v, m2), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m4), hi(0)),
                _mm256_or_si256(_mm256_and_si256(b2, m4), hi(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), hi(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), hi(6)),
            ];
            let sc: [__m256i; 4] = std::array::from_fn(|k| {
                let shuf = _mm_loadu_si128(SCALE_SHUFFLE[4 * h + k].as_ptr() as *const __m128i);
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf))
            });
            for j in 0..N {
                let y = a[j].add(i * q8_k::BLOCK_BYTES + q8_k::QS_OFFSET + 128 * h);
                for k in 0..4 {
                    let yv = _mm256_loadu_si256(y.add(32 * k) as *const __m256i);
                    let p = _mm256_madd_epi16(sc[k], _mm256_maddubs_epi16(q[k], yv));
                    sumi[j] = _mm256_add_epi32(sumi[j], p);
                }
            }
        }
        let sc16 = _mm256_cvtepi8_epi16(scales);
        for j in 0..N {
            let yb = a[j].add(i * q8_k::BLOCK_BYTES);
            let bs = _mm256_loadu_si256(yb.add(q8_k::BSUMS_OFFSET) as *const __m256i);
            let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
            let s8 = _mm256_sub_epi32(sumi[j], corr);
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(s8),
                _mm256_extracti128_si256::<1>(s8),
            );
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let isum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
            let yd = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned();
            acc[j] = (xd * yd).mul_add(isum as f32, acc[j]);
        }
    }
    acc
}

/// The row loops around a tile kernel `tile::<N>(nb, w, [acts; N])` of one Q8_K-activation
/// format (the Q4_K and Q6_K kernels share them): `rows_impl(ws, row_bytes, nb, acts, m, out)`
/// sets element (r, i) of `out` to `W_r · A_i`, [`TILE`] activation rows at a time, then one;
/// `rows_avx512` and `rows_avx2` are the same loop compiled with and without AVX-512VL/BW, and
/// `rows_impl` runs the one this CPU has (same operations, so the same bits).
macro_rules! q8k_tile_rows {
    ($tile:ident) => {
        /// The row loop around the tile kernel: element (r, i) of `out` = `W_r · A_i`.
        ///
        /// # Safety
        /// [`rows_avx512`]'s contract, AVX2/FMA/F16C available.
        unsafe fn rows_impl(
            ws: &[u8],
            row_bytes: usize,
            nb: usize,
            acts: &[u8],
            m: usize,
            out: super::OutMat,
        ) {
            if super::avx512_q6k::avx512() {
                rows_avx512(ws, row_bytes, nb, acts, m, out)
            } else {
                rows_avx2(ws, row_bytes, nb, acts, m, out)
            }
        }

        /// [`rows_avx2`] with 32 vector registers.
        ///
        /// # Safety
        /// As [`rows_avx2`], and AVX512F/VL/BW available.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
        unsafe fn rows_avx512(
            ws: &[u8],
            row_bytes: usize,
            nb: usize,
            acts: &[u8],
            m: usize,
            out: super::OutMat,
        ) {
            rows_body(ws, row_bytes, nb, acts, m, out)
        }

        /// Element (r, i) of `out` = `W_r · A_i` for the weight rows `ws` (`row_bytes` each,
        /// `nb` blocks) and the `m` Q8_K rows `acts` (`nb` blocks each).
        ///
        /// # Safety
        /// AVX2/FMA/F16C available; lengths as above; `out` owns elements (r, i).
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn rows_avx2(
            ws: &[u8],
            row_bytes: usize,
            nb: usize,
            acts: &[u8],
            m: usize,
            out: super::OutMat,
        ) {
            rows_body(ws, row_bytes, nb, acts, m, out)
        }

        /// The body of the row loops, inlined into each.
        #[inline(always)]
        unsafe fn rows_body(
            ws: &[u8],
            row_bytes: usize,
            nb: usize,
            acts: &[u8],
            m: usize,
            out: super::OutMat,
        ) {
            let ar = nb * infer_quant::q8_k::BLOCK_BYTES;
            let ap = acts.as_ptr();
            for (r, w) in ws.chunks_exact(row_bytes).enumerate() {
                let mut i = 0;
                while i + TILE <= m {
                    let v = $tile::<TILE>(
                        nb,
                        w.as_ptr(),
                        std::array::from_fn(|j| ap.add((i + j) * ar)),
                    );
                    for (j, x) in v.into_iter().enumerate() {
                        out.put(r, i + j, x);
                    }
                    i += TILE;
                }
                while i < m {
                    out.put(r, i, $tile::<1>(nb, w.as_ptr(), [ap.add(i * ar)])[0]);
                    i += 1;
                }
            }
        }
    };
}
pub(crate) use q8k_tile_rows;

q8k_tile_rows!(tile);

/// True when this CPU can run [`rows_times_acts`] (AVX2/FMA/F16C).
pub(crate) fn available() -> bool {
    super::avx2_available()
}

/// True when the tile loops may use AVX512F/VL/BW's 32 registers (besides AVX2/FMA/F16C).
pub(crate) fn avx512() -> bool {
    use std::sync::OnceLock;
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| {
        super::avx2_available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
    })
}

/// Element (r, i) of `out` = `W_r · A_i` for the Q6_K weight rows `ws` (`row_bytes` each,
/// `cols / 256` blocks) and `m` Q8_K activation rows `acts` (`m · cols/256` blocks).
///
/// Panics on inconsistent lengths or when [`available`] is false.
///
/// # Safety
/// `out` must own elements (r, i) for every r < `ws.len() / row_bytes` and i < `m` (see
/// [`super::OutMat::put`]).
pub(crate) unsafe fn rows_times_acts(
    ws: &[u8],
    row_bytes: usize,
    cols: usize,
    acts: &[u8],
    m: usize,
    out: super::OutMat,
) {
    assert!(available(), "Q6_K tile kernel needs AVX2/FMA/F16C");
    let nb = cols / 256;
    assert!(cols.is_multiple_of(256) && row_bytes >= nb * q6_k::BLOCK_BYTES && row_bytes > 0);
    assert!(
        ws.len().is_multiple_of(row_bytes),
        "Q6_K tile: partial weight row"
    );
    assert!(
        acts.len() >= m * nb * q8_k::BLOCK_BYTES,
        "Q6_K tile: activations too short"
    );
    if super::avx2_gemm_k::batch_rows(
        super::vnni_gemm_k::KQuant::Q6K,
        ws,
        row_bytes,
        nb,
        acts,
        m,
        out,
    ) {
        return;
    }
    rows_impl(ws, row_bytes, nb, acts, m, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 1 × N tile path (CPUs without VNNI) equals the AVX2 `ggml_vec_dot_q6_K_q8_K` port up
    /// to f32 accumulation order (same integer block sums), and every tile width gives the same
    /// bits as `N = 1`.
    #[test]
    fn q6k_tile_matches_avx2_kernel() {
        if !available() {
            eprintln!("no AVX2/FMA/F16C on this CPU: nothing to compare");
            return;
        }
        let mut next = super::super::xorshift(0x2545_f491_4f6c_dd1d);
        for nb in [1usize, 2, 6, 8] {
            let cols = nb * 256;
            let mut w = vec![0u8; nb * q6_k::BLOCK_BYTES];
            w.iter_mut().for_each(|b| *b = next() as u8);
            for blk in w.chunks_exact_mut(q6_k::BLOCK_BYTES) {
                blk[q6_k::D_OFFSET + 1] &= 0x3b; // finite, moderate f16 scale
            }
            let m = 7;
            let x: Vec<f32> = (0..m * cols)
                .map(|_| ((next() % 2001) as f32 - 1000.0) * 1e-3)
                .collect();
            let ar = infer_quant::QuantFormat::Q8_K.bytes_for(cols).unwrap();
            let mut acts = vec![0u8; m * ar];
            for (xr, ab) in x.chunks_exact(cols).zip(acts.chunks_exact_mut(ar)) {
                infer_quant::q8_k::quantize_row_ref(xr, ab);
            }
            let mut out = vec![0f32; m];
            // SAFETY: AVX2/FMA/F16C detected; one weight row, m activation rows: out is [m, 1].
            unsafe {
                let o = super::super::OutMat::rows_last(&mut out, m, 1);
                rows_impl(&w, w.len(), nb, &acts, m, o)
            };
            for i in 0..m {
                let a = &acts[i * ar..(i + 1) * ar];
                let want = super::super::generic::vec_dot_q6_k_q8_k(cols, &w, a);
                let one = {
                    let mut o = [0f32];
                    // SAFETY: one weight row, one activation row.
                    unsafe {
                        let om = super::super::OutMat::rows_last(&mut o, 1, 1);
                        rows_impl(&w, w.len(), nb, a, 1, om)
                    };
                    o[0]
                };
                assert_eq!(
                    one.to_bits(),
                    out[i].to_bits(),
                    "nb={nb} row {i}: tile vs N=1"
                );
                let scale: f32 = want.abs().max(1.0);
                assert!(
                    (out[i] - want).abs() <= 1e-5 * scale,
                    "nb={nb} row {i}: tile {} scalar {want}",
                    out[i]
                );
            }
        }
    }
}
