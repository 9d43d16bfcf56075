//! Q4_K × Q8_K tile kernel (AVX2 integer pipeline, compiled twice: for AVX-512VL's 32 vector
//! registers, and for plain AVX2/FMA/F16C hosts, whose 16 registers keep part of the unpacked
//! block in L1): one weight row against up to [`TILE`] activation rows, each Q4_K block unpacked
//! once per tile (nibbles, the eight 6-bit scales and mins) instead of once per activation row.
//! The mat-vec and products of fewer than four activation rows (four or more take
//! [`super::avx2_gemm_k`]).
//!
//! Per (weight row, activation row) pair the integer sums of a super-block are ggml's AVX2
//! `ggml_vec_dot_q4_K_q8_K` ones (`madd(scale, maddubs(q4, q8))` per 32 values, the mins
//! against the Q8_K group sums), reduced to the exact `isum = Σ_s scale_s·Σ q·a` and
//! `msum = Σ_s min_s·Σ a`; then `acc = fma(d·d_a, isum, acc)`, `acc = fma(−(dmin·d_a), msum,
//! acc)` per block from `acc = 0` — the f32 order of [`super::kquant_row`] and
//! [`super::vnni_gemm_k`], so every tile width, the batch kernel and the AVX-512 VNNI path
//! give the same bits.

use super::avx2::{f16_pair, scale_shuffle_k4};
use infer_quant::{q4_k, q8_k};
use std::arch::x86_64::*;

/// Activation rows per tile.
pub(crate) const TILE: usize = 4;

/// `out[j] = W_row · A_j` for one Q4_K weight row `w` of `nb` blocks and `N` Q8_K activation
/// rows `a[j]` (`nb` blocks each).
///
/// Always inlined into the row loops of `q8k_tile_rows!`, which carry the target features.
///
/// # Safety
/// AVX2, FMA, F16C available (the caller compiled for them); the pointers hold `nb` blocks.
#[inline(always)]
unsafe fn tile<const N: usize>(nb: usize, w: *const u8, a: [*const u8; N]) -> [f32; N] {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [0f32; N];
    for i in 0..nb {
        let xb = w.add(i * q4_k::BLOCK_BYTES);
        // d and dmin are adjacent f16 fields.
        const _: () = assert!(q4_k::DMIN_OFFSET == q4_k::D_OFFSET + 2);
        let dd = f16_pair(xb.add(q4_k::D_OFFSET));
        let (xd, xdmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
        let sc = std::slice::from_raw_parts(xb.add(q4_k::SCALES_OFFSET), 12);
        let utmp = super::layout::q4k_scales_mins(sc);
        // 8 scales (i16, low half) and 8 mins (i16, high half).
        let mins_and_scales =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(utmp.as_ptr() as *const __m128i));
        let mins = _mm256_extracti128_si256(mins_and_scales, 1);
        let sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
        let scales = _mm256_inserti128_si256(_mm256_castsi128_si256(sc128), sc128, 1);
        // The block's nibbles (low: sub-block 2j, high: 2j + 1) and their scales, once.
        let q = xb.add(q4_k::QS_OFFSET);
        let q4: [__m256i; 8] = std::array::from_fn(|k| {
            let bits = _mm256_loadu_si256(q.add(32 * (k / 2)) as *const __m256i);
            if k % 2 == 0 {
                _mm256_and_si256(bits, m4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4)
            }
        });
        let scl: [__m256i; 8] =
            std::array::from_fn(|k| _mm256_shuffle_epi8(scales, scale_shuffle_k4(k)));
        for j in 0..N {
            let yb = a[j].add(i * q8_k::BLOCK_BYTES);
            let yd = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned();
            let q8sums = _mm256_loadu_si256(yb.add(q8_k::BSUMS_OFFSET) as *const __m256i);
            let q8s = _mm_hadd_epi16(
                _mm256_extracti128_si256(q8sums, 0),
                _mm256_extracti128_si256(q8sums, 1),
            );
            let prod = _mm_madd_epi16(mins, q8s);
            let y = yb.add(q8_k::QS_OFFSET);
            let mut sumi = _mm256_setzero_si256();
            for k in 0..4 {
                let q8l = _mm256_loadu_si256(y.add(64 * k) as *const __m256i);
                let p16l = _mm256_madd_epi16(scl[2 * k], _mm256_maddubs_epi16(q4[2 * k], q8l));
                let q8h = _mm256_loadu_si256(y.add(64 * k + 32) as *const __m256i);
                let p16h =
                    _mm256_madd_epi16(scl[2 * k + 1], _mm256_maddubs_epi16(q4[2 * k + 1], q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
            }
            // [isum, msum, isum, msum], both reduced together.
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(sumi),
                _mm256_extracti128_si256::<1>(sumi),
            );
            let t = _mm_hadd_epi32(s4, prod);
            let im = _mm_cvtepi32_ps(_mm_hadd_epi32(t, t));
            acc[j] = (xd * yd).mul_add(_mm_cvtss_f32(im), acc[j]);
            acc[j] = (-(xdmin * yd)).mul_add(_mm_cvtss_f32(_mm_movehdup_ps(im)), acc[j]);
        }
    }
    acc
}

super::avx512_q6k::q8k_tile_rows!(tile);

/// True when this CPU can run [`rows_times_acts`] (AVX2/FMA/F16C).
pub(crate) fn available() -> bool {
    super::avx512_q6k::available()
}

/// Element (r, i) of `out` = `W_r · A_i` for the Q4_K weight rows `ws` (`row_bytes` each,
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
    assert!(available(), "Q4_K tile kernel needs AVX2/FMA/F16C");
    let nb = cols / 256;
    assert!(cols.is_multiple_of(256) && row_bytes >= nb * q4_k::BLOCK_BYTES && row_bytes > 0);
    assert!(
        ws.len().is_multiple_of(row_bytes),
        "Q4_K tile: partial weight row"
    );
    assert!(
        acts.len() >= m * nb * q8_k::BLOCK_BYTES,
        "Q4_K tile: activations too short"
    );
    let kq = super::vnni_gemm_k::KQuant::Q4K;
    // SAFETY: AVX2/FMA/F16C checked (`available`), VNNI by `batch_rows`; lengths checked above.
    if unsafe { super::avx2_gemm_k::batch_rows(kq, ws, row_bytes, nb, acts, m, out) } {
        return;
    }
    // SAFETY: the CPU features were checked (`available`), and the lengths above.
    unsafe { rows_impl(ws, row_bytes, nb, acts, m, out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 1 × N tile path (CPUs without VNNI): every tile width gives the bits of one
    /// activation row at a time (the mat-vec), and the AVX2 `ggml_vec_dot_q4_K_q8_K` port and
    /// the scalar reference within 1e-5 relative (the exact f32 model: `avx2_gemm_k`'s tests).
    #[test]
    fn q4k_tile_widths_agree_bit_for_bit() {
        if !available() {
            eprintln!("no AVX2/FMA/F16C on this CPU: nothing to compare");
            return;
        }
        let mut next = super::super::xorshift(0x9e37_79b9_7f4a_7c15);
        for nb in [1usize, 2, 3, 8] {
            let cols = nb * 256;
            let rows = 3;
            let mut w = vec![0u8; rows * nb * q4_k::BLOCK_BYTES];
            w.iter_mut().for_each(|b| *b = next() as u8);
            for blk in w.chunks_exact_mut(q4_k::BLOCK_BYTES) {
                blk[q4_k::D_OFFSET + 1] &= 0x3b; // finite, moderate f16 scales
                blk[q4_k::DMIN_OFFSET + 1] &= 0x3b;
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
            let row_bytes = nb * q4_k::BLOCK_BYTES;
            let mut out = vec![0f32; m * rows];
            // SAFETY: `rows` weight rows, m activation rows: out is [m, rows].
            unsafe {
                let o = super::super::OutMat::rows_last(&mut out, m, rows);
                rows_impl(&w, row_bytes, nb, &acts, m, o)
            };
            for r in 0..rows {
                let wr = &w[r * row_bytes..(r + 1) * row_bytes];
                for i in 0..m {
                    let a = &acts[i * ar..(i + 1) * ar];
                    let got = out[i * rows + r];
                    let one = {
                        let mut o = [0f32];
                        // SAFETY: one weight row, one activation row.
                        unsafe {
                            let om = super::super::OutMat::rows_last(&mut o, 1, 1);
                            rows_impl(wr, row_bytes, nb, a, 1, om)
                        };
                        o[0]
                    };
                    assert_eq!(
                        got.to_bits(),
                        one.to_bits(),
                        "nb={nb} row {r} act {i}: tile of 4 vs one row ({got} vs {one})"
                    );
                    let avx2 = super::super::avx2::vec_dot_q4_k_q8_k(cols, wr, a);
                    let want = super::super::generic::vec_dot_q4_k_q8_k(cols, wr, a);
                    for (what, v) in [("AVX2 port", avx2), ("scalar", want)] {
                        assert!(
                            (got - v).abs() <= 1e-5 * v.abs().max(1.0),
                            "nb={nb} row {r} act {i}: tile {got} {what} {v}"
                        );
                    }
                }
            }
        }
    }
}
