//! AVX2 + FMA + F16C dot products, ported from the `__AVX2__` paths of ggml
//! `ggml/src/ggml-cpu/arch/x86/quants.c` (same integer pipelines: `maddubs`/`madd` on 8-bit quants,
//! one f32 FMA per block). The integer part of each block is exact; only the f32 accumulation
//! order differs from the scalar reference, so results agree with it to a few ulps of the sum
//! of |terms|.
//!
//! The `unsafe` kernels need AVX2, FMA and F16C; the safe wrappers here are `pub(crate)` and are
//! only handed out by [`super::kernel`] after run-time detection ([`super::Isa::Avx2`]).

use super::layout::{f16_bits_to_f32, BlockPair};
use infer_quant::{q4_0, q4_k, q5_0, q6_k, q8_0, q8_k};
use std::arch::x86_64::*;

/// True when this CPU can run the kernels of this module.
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

macro_rules! safe_wrapper {
    ($(#[$doc:meta])* $name:ident, $pair:expr, $kernel:ident) => {
        $(#[$doc])*
        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let nb = $pair.blocks(n, x, y);
            debug_assert!(detected());
            // SAFETY: `blocks` checked both slices hold `nb` blocks; this wrapper is only reachable
            // through `super::kernel(_, Isa::Avx2)`, which requires `detected()`.
            unsafe { $kernel(nb, x.as_ptr(), y.as_ptr()) }
        }
    };
}

safe_wrapper!(
    /// AVX2 Q4_0 × Q8_0 (ggml `ggml_vec_dot_q4_0_q8_0`, `__AVX2__` path).
    vec_dot_q4_0_q8_0, BlockPair::Q4_0_Q8_0, q4_0_q8_0
);
safe_wrapper!(
    /// AVX2 Q5_0 × Q8_0 (ggml `ggml_vec_dot_q5_0_q8_0`, `__AVX2__` path).
    vec_dot_q5_0_q8_0, BlockPair::Q5_0_Q8_0, q5_0_q8_0
);
safe_wrapper!(
    /// AVX2 Q8_0 × Q8_0 (ggml `ggml_vec_dot_q8_0_q8_0`, `__AVX2__` path).
    vec_dot_q8_0_q8_0, BlockPair::Q8_0_Q8_0, q8_0_q8_0
);
safe_wrapper!(
    /// AVX2 Q4_K × Q8_K (ggml `ggml_vec_dot_q4_K_q8_K`, `__AVX2__` path).
    vec_dot_q4_k_q8_k, BlockPair::Q4_K_Q8_K, q4_k_q8_k
);
safe_wrapper!(
    /// AVX2 Q6_K × Q8_K (ggml `ggml_vec_dot_q6_K_q8_K`, `__AVX2__` path).
    vec_dot_q6_k_q8_k, BlockPair::Q6_K_Q8_K, q6_k_q8_k
);

/// The two consecutive f16 at `p` (unaligned, little-endian) as f32 lanes 0 and 1, with F16C.
/// One 32-bit load + `vcvtph2ps`: a 16-bit load would become a `vpinsrw` merging into an
/// arbitrary register (often the loop's accumulator), a false dependency across iterations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_pair(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()))
}

/// `f16(a) * f16(b)` broadcast to 8 lanes. Both halves go through one `vmovd` + `vcvtph2ps`, so
/// the conversion has no false dependency on another register (a lone `vpinsrw` would merge into
/// whatever register the compiler picks, often the loop's accumulator).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_product_x8(a: *const u8, b: *const u8) -> __m256 {
    let ha = (a as *const u16).read_unaligned() as u32;
    let hb = (b as *const u16).read_unaligned() as u32;
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((ha | (hb << 16)) as i32));
    _mm256_broadcastss_ps(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

/// Horizontal sum of 8 f32 (ggml `hsum_float_8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// Σ of adjacent signed-byte products, four per i32 lane, as f32 (ggml
/// `mul_sum_i8_pairs_float`: `sign` trick + `maddubs` + `madd` with ones).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// 16 bytes of nibbles at `p` to 32 bytes in 0..16: low nibbles first, then high nibbles
/// (ggml `bytes_from_nibbles_32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// The 32 bits at `p` spread to 32 bytes of 0x00 / 0xFF (ggml `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let off = _mm256_set1_epi8(8);
    for ib in 0..nb {
        let xb = x.add(ib * q4_0::BLOCK_BYTES);
        let yb = y.add(ib * q8_0::BLOCK_BYTES);
        let d = f16_product_x8(xb.add(q4_0::D_OFFSET), yb.add(q8_0::D_OFFSET));
        let qx = _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(q4_0::QS_OFFSET)), off);
        let qy = _mm256_loadu_si256(yb.add(q8_0::QS_OFFSET) as *const __m256i);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let hi = _mm256_set1_epi8(0xF0u8 as i8);
    for ib in 0..nb {
        let xb = x.add(ib * q5_0::BLOCK_BYTES);
        let yb = y.add(ib * q8_0::BLOCK_BYTES);
        let d = f16_product_x8(xb.add(q5_0::D_OFFSET), yb.add(q8_0::D_OFFSET));
        // Missing 5th bit → OR 0xF0, i.e. (nibble − 16) as i8; present → nibble (= q − 16 + 16).
        let bxhi = _mm256_andnot_si256(bytes_from_bits_32(xb.add(q5_0::QH_OFFSET)), hi);
        let qx = _mm256_or_si256(bytes_from_nibbles_32(xb.add(q5_0::QS_OFFSET)), bxhi);
        let qy = _mm256_loadu_si256(yb.add(q8_0::QS_OFFSET) as *const __m256i);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for ib in 0..nb {
        let xb = x.add(ib * q8_0::BLOCK_BYTES);
        let yb = y.add(ib * q8_0::BLOCK_BYTES);
        let d = f16_product_x8(xb.add(q8_0::D_OFFSET), yb.add(q8_0::D_OFFSET));
        let qx = _mm256_loadu_si256(xb.add(q8_0::QS_OFFSET) as *const __m256i);
        let qy = _mm256_loadu_si256(yb.add(q8_0::QS_OFFSET) as *const __m256i);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q8_k(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        let xb = x.add(i * q4_k::BLOCK_BYTES);
        let yb = y.add(i * q8_k::BLOCK_BYTES);
        let yd = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned();
        // d and dmin are adjacent f16 fields.
        const _: () = assert!(q4_k::DMIN_OFFSET == q4_k::D_OFFSET + 2);
        let dd = f16_pair(xb.add(q4_k::D_OFFSET));
        let d = yd * _mm_cvtss_f32(dd);
        let dmin = -yd * _mm_cvtss_f32(_mm_movehdup_ps(dd));

        let sc = std::slice::from_raw_parts(xb.add(q4_k::SCALES_OFFSET), 12);
        let utmp = super::layout::q4k_scales_mins(sc);
        // 8 scales (i16, low half) and 8 mins (i16, high half).
        let mins_and_scales =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(utmp.as_ptr() as *const __m128i));

        let q8sums = _mm256_loadu_si256(yb.add(q8_k::BSUMS_OFFSET) as *const __m256i);
        let q8s = _mm_hadd_epi16(
            _mm256_extracti128_si256(q8sums, 0),
            _mm256_extracti128_si256(q8sums, 1),
        );
        let prod = _mm_madd_epi16(_mm256_extracti128_si256(mins_and_scales, 1), q8s);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

        let sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
        let scales = _mm256_inserti128_si256(_mm256_castsi128_si256(sc128), sc128, 1);

        let mut q4 = xb.add(q4_k::QS_OFFSET);
        let mut q8 = yb.add(q8_k::QS_OFFSET);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j));
            let scale_h = _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j + 1));

            let q4bits = _mm256_loadu_si256(q4 as *const __m256i);
            q4 = q4.add(32);
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);

            let q8l = _mm256_loadu_si256(q8 as *const __m256i);
            q8 = q8.add(32);
            let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));

            let q8h = _mm256_loadu_si256(q8 as *const __m256i);
            q8 = q8.add(32);
            let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));

            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

/// ggml `get_scale_shuffle_k4(i)`: the i16 lane `i` of each 128-bit half broadcast to 8 lanes.
const SCALE_SHUFFLE_K4: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut i = 0;
    while i < 8 {
        let mut k = 0;
        while k < 32 {
            t[i][k] = (2 * i + k % 2) as u8;
            k += 1;
        }
        i += 1;
    }
    t
};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scale_shuffle_k4(i: usize) -> __m256i {
    _mm256_loadu_si256(SCALE_SHUFFLE_K4[i].as_ptr() as *const __m256i)
}

/// ggml `get_scale_shuffle(i)`: bytes `2i` ×8 then `2i + 1` ×8.
const SCALE_SHUFFLE: [[u8; 16]; 8] = {
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_q8_k(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let m32s = _mm256_set1_epi8(32);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let xb = x.add(i * q6_k::BLOCK_BYTES);
        let yb = y.add(i * q8_k::BLOCK_BYTES);
        // Scalar conversion: a lone F16C conversion compiles to a `vpinsrw` merging into the
        // accumulator register, a false loop-carried dependency.
        let xd = f16_bits_to_f32((xb.add(q6_k::D_OFFSET) as *const u16).read_unaligned());
        let d = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned() * xd;

        let mut q4 = xb.add(q6_k::QL_OFFSET);
        let mut qh = xb.add(q6_k::QH_OFFSET);
        let mut q8 = yb.add(q8_k::QS_OFFSET);
        let scales = _mm_loadu_si128(xb.add(q6_k::SCALES_OFFSET) as *const __m128i);

        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let is = 4 * j;
            let shuf = |k: usize| _mm_loadu_si128(SCALE_SHUFFLE[is + k].as_ptr() as *const __m128i);
            let scale_0 = _mm_shuffle_epi8(scales, shuf(0));
            let scale_1 = _mm_shuffle_epi8(scales, shuf(1));
            let scale_2 = _mm_shuffle_epi8(scales, shuf(2));
            let scale_3 = _mm_shuffle_epi8(scales, shuf(3));

            let q4bits1 = _mm256_loadu_si256(q4 as *const __m256i);
            let q4bits2 = _mm256_loadu_si256(q4.add(32) as *const __m256i);
            q4 = q4.add(64);
            let q4bits_h = _mm256_loadu_si256(qh as *const __m256i);
            qh = qh.add(32);

            let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m2), 4);
            let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 2), m2), 4);
            let q4h_2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 4), m2), 4);
            let q4h_3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 6), m2), 4);

            let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m4), q4h_0);
            let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m4), q4h_1);
            let q4_2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m4), q4h_2);
            let q4_3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m4), q4h_3);

            let q8_0 = _mm256_loadu_si256(q8 as *const __m256i);
            let q8_1 = _mm256_loadu_si256(q8.add(32) as *const __m256i);
            let q8_2 = _mm256_loadu_si256(q8.add(64) as *const __m256i);
            let q8_3 = _mm256_loadu_si256(q8.add(96) as *const __m256i);
            q8 = q8.add(128);

            // (q − 32)·q8 = q·q8 − 32·q8, both in i16 without saturation.
            let p16_0 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q4_0, q8_0),
                _mm256_maddubs_epi16(m32s, q8_0),
            );
            let p16_1 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q4_1, q8_1),
                _mm256_maddubs_epi16(m32s, q8_1),
            );
            let p16_2 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q4_2, q8_2),
                _mm256_maddubs_epi16(m32s, q8_2),
            );
            let p16_3 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q4_3, q8_3),
                _mm256_maddubs_epi16(m32s, q8_3),
            );

            let p16_0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_0), p16_0);
            let p16_1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_1), p16_1);
            let p16_2 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_2), p16_2);
            let p16_3 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_3), p16_3);

            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_2, p16_3));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}
