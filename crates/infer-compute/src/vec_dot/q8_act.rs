//! Q8_0 activation quantization into split rows ([`super::Q8Rows`]): ggml
//! `quantize_row_q8_0_ref` per 32-value block (`d = amax/127`, `id = 1/d`,
//! `q = roundf(x·id)` half away from zero, `d` stored as f16), with an AVX2 copy that gives the
//! same bytes: the same f32 multiply, and `roundf` as `trunc(v) + sign(v)·[|v − trunc(v)| ≥ ½]`
//! (`v − trunc(v)` is exact). Blocks holding NaN or ±inf take the scalar reference.

use super::layout;
use infer_quant::{float16, q8_0};

/// Quantize whole rows `x` (`x.len()` a multiple of 32) into int8 quants `qs` (`x.len()`) and
/// f32 block scales `d` (`x.len() / 32`, the f16 value converted exactly).
pub(super) fn quantize_split(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_available() {
        // SAFETY: AVX2 is available.
        return unsafe { quantize_split_avx2(x, qs, d) };
    }
    quantize_split_ref(x, qs, d)
}

/// The scalar reference: infer-quant's `quantize_row_q8_0_ref`, block by block.
pub(super) fn quantize_split_ref(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    let mut blk = [0u8; q8_0::BLOCK_BYTES];
    for ((xb, q), dv) in x
        .chunks_exact(32)
        .zip(qs.chunks_exact_mut(32))
        .zip(d.iter_mut())
    {
        q8_0::quantize_row_ref(xb, &mut blk);
        *dv = layout::f16_at(&blk, q8_0::D_OFFSET);
        for (o, b) in q.iter_mut().zip(&blk[q8_0::QS_OFFSET..]) {
            *o = *b as i8;
        }
    }
}

/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_split_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    for ((xb, q), dv) in x
        .chunks_exact(32)
        .zip(qs.chunks_exact_mut(32))
        .zip(d.iter_mut())
    {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
        // Any NaN/inf: scalar reference (its C `MAX` and casts are order- and NaN-sensitive).
        let mut m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)),
        );
        let bad = v.iter().fold(_mm256_setzero_ps(), |a, &vi| {
            _mm256_or_ps(a, _mm256_cmp_ps::<_CMP_UNORD_Q>(vi, vi))
        });
        m = _mm256_max_ps(m, _mm256_permute2f128_ps::<1>(m, m));
        m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
        m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m));
        let amax = _mm256_cvtss_f32(m);
        if _mm256_movemask_ps(bad) != 0 || !amax.is_finite() {
            quantize_split_ref(xb, q, std::slice::from_mut(dv));
            continue;
        }
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        *dv = layout::f16_bits_to_f32(float16::f32_to_f16(dd));
        let idv = _mm256_set1_ps(id);
        let r: [__m256i; 4] = std::array::from_fn(|i| {
            let s = _mm256_mul_ps(v[i], idv);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
            let frac = _mm256_and_ps(_mm256_sub_ps(s, t), abs_mask);
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
            let step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(s, sign_mask)));
            _mm256_cvtps_epi32(_mm256_add_ps(t, step))
        });
        // i32 → i8 (values within ±127): packs work per 128-bit lane, then fix the order.
        let p01 = _mm256_packs_epi32(r[0], r[1]);
        let p23 = _mm256_packs_epi32(r[2], r[3]);
        let b = _mm256_packs_epi16(p01, p23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, b);
    }
}

/// Quantize whole rows `x` (`x.len()` a multiple of 256) to Q8_K blocks `out`: the bytes of
/// ggml `quantize_row_q8_K_ref` (infer-quant's), with an AVX2 copy (the K-quant products'
/// activations were quantized one value at a time on the calling thread, ~1% of a batched
/// decode step): the same f32 `iscale = −127/max` (`max` the first value of the largest
/// magnitude), multiply and `nearest_int` (the 1.5·2²³ addition and mantissa bits), group
/// sums and `d = 1/iscale`. Blocks holding NaN or ±inf take the reference.
pub(super) fn quantize_q8k(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_available() {
        // SAFETY: AVX2 is available.
        return unsafe { quantize_q8k_avx2(x, out) };
    }
    infer_quant::q8_k::quantize_row_ref(x, out)
}

/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8k_avx2(x: &[f32], out: &mut [u8]) {
    use infer_quant::q8_k;
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let inf = _mm256_set1_ps(f32::INFINITY);
    for (xb, yb) in x
        .chunks_exact(q8_k::BLOCK_ELEMS)
        .zip(out.chunks_exact_mut(q8_k::BLOCK_BYTES))
    {
        let v: [__m256; 32] = std::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
        let mut m = _mm256_setzero_ps();
        // |v| < ∞ (ordered) in every lane, else the reference.
        let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for vi in v {
            let a = _mm256_and_ps(vi, abs_mask);
            m = _mm256_max_ps(m, a);
            finite = _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf));
        }
        if _mm256_movemask_ps(finite) != 0xff {
            infer_quant::q8_k::quantize_row_ref(xb, yb);
            continue;
        }
        m = _mm256_max_ps(m, _mm256_permute2f128_ps::<1>(m, m));
        m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
        m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m));
        let amax = _mm256_cvtss_f32(m);
        if amax == 0.0 {
            yb.fill(0);
            continue;
        }
        // The reference keeps the first value of magnitude amax (a strict `>` scan).
        let am = _mm256_set1_ps(amax);
        let first = v
            .iter()
            .enumerate()
            .find_map(|(i, &vi)| {
                let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_and_ps(vi, abs_mask), am);
                let bits = _mm256_movemask_ps(eq);
                (bits != 0).then(|| 8 * i + bits.trailing_zeros() as usize)
            })
            .unwrap_or(0);
        let iscale = -127.0f32 / xb[first];
        let sv = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12582912.0);
        let mant = _mm256_set1_epi32(0x007f_ffff);
        let bias = _mm256_set1_epi32(0x0040_0000);
        let q: [__m256i; 32] = std::array::from_fn(|i| {
            let t = _mm256_add_ps(_mm256_mul_ps(sv, v[i]), magic);
            let n = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant), bias);
            _mm256_min_epi32(n, _mm256_set1_epi32(127))
        });
        let qs = yb.as_mut_ptr().add(q8_k::QS_OFFSET);
        let low = _mm256_set1_epi32(0xff);
        for c in 0..8 {
            // `as i8 as u8`: the low byte of each i32, packed without saturation.
            let r: [__m256i; 4] = std::array::from_fn(|k| _mm256_and_si256(q[4 * c + k], low));
            let p01 = _mm256_packus_epi32(r[0], r[1]);
            let p23 = _mm256_packus_epi32(r[2], r[3]);
            let b = _mm256_packus_epi16(p01, p23);
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qs.add(32 * c) as *mut __m256i, b);
        }
        for g in 0..16 {
            let lanes = std::slice::from_raw_parts(qs.add(16 * g) as *const i8, 16);
            let sum: i32 = lanes.iter().map(|&b| b as i32).sum();
            let o = q8_k::BSUMS_OFFSET + 2 * g;
            yb[o..o + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        yb[q8_k::D_OFFSET..q8_k::D_OFFSET + 4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avx2_quantization_equals_reference_bytes() {
        let mut state = 0x5eed_1234u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let n = 32 * 4000;
        let mut x: Vec<f32> = (0..n)
            .map(|i| {
                let u = (next() % 2_000_001) as f32 / 1e6 - 1.0;
                // Blocks of very different magnitudes.
                u * [1e-6f32, 1e-3, 1.0, 37.0, 1e4, 3e6][(i / 32) % 6]
            })
            .collect();
        // Exact ties: multiples of amax/254 (x·id lands on k + ½ up to the f32 rounding).
        for (j, v) in x[32..64].iter_mut().enumerate() {
            *v = (j as f32 - 16.0) * 0.5;
        }
        x[64..96].fill(0.0); // all-zero block
        x[96..128]
            .iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = if j == 3 { f32::NAN } else { j as f32 });
        x[128..160].iter_mut().enumerate().for_each(|(j, v)| {
            *v = if j == 5 {
                f32::NEG_INFINITY
            } else {
                -(j as f32)
            }
        });
        x[160] = -0.0;
        let (mut q1, mut d1) = (vec![0i8; n], vec![0f32; n / 32]);
        let (mut q2, mut d2) = (vec![0i8; n], vec![0f32; n / 32]);
        quantize_split(&x, &mut q1, &mut d1);
        quantize_split_ref(&x, &mut q2, &mut d2);
        assert_eq!(q1, q2);
        let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d1), bits(&d2));
    }

    /// The AVX2 Q8_K quantization writes the reference's bytes: blocks of very different
    /// magnitudes, ties of the largest magnitude of both signs, zeros, NaN and ±inf.
    #[test]
    fn avx2_q8k_quantization_equals_reference_bytes() {
        use infer_quant::q8_k;
        let mut state = 0x0dd_ba11u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let nb = 40;
        let mut x: Vec<f32> = (0..nb * 256)
            .map(|i| {
                let u = (next() % 2_000_001) as f32 / 1e6 - 1.0;
                u * [1e-6f32, 1e-3, 1.0, 37.0, 1e4, 3e6, 1e-30][(i / 256) % 7]
            })
            .collect();
        x[256 * 7..256 * 8].fill(0.0);
        x[256 * 8 + 17] = f32::NAN;
        x[256 * 9 + 3] = f32::INFINITY;
        x[256 * 10 + 200] = 5.0;
        x[256 * 10 + 100] = -5.0; // the same magnitude first, negative
        x[256 * 11 + 5] = -0.0;
        for (j, v) in x[256 * 12..256 * 13].iter_mut().enumerate() {
            *v = (j as f32 - 128.0) * 0.5; // exact halves of the scale
        }
        let mut a = vec![0u8; nb * q8_k::BLOCK_BYTES];
        let mut b = vec![0u8; nb * q8_k::BLOCK_BYTES];
        quantize_q8k(&x, &mut a);
        q8_k::quantize_row_ref(&x, &mut b);
        for (k, (ba, bb)) in a
            .chunks_exact(q8_k::BLOCK_BYTES)
            .zip(b.chunks_exact(q8_k::BLOCK_BYTES))
            .enumerate()
        {
            assert_eq!(ba, bb, "block {k}");
        }
    }
}
