//! Q4_K and Q6_K weight rows against one to three Q8_K activation rows, one weight row at a
//! time, on 512-bit registers (AVX-512BW + VNNI): the mat-vec path of [`super::vnni_gemm_k`].
//!
//! Same integers and the same f32 sequence as the sixteen-row groups of `vnni_gemm_k` (so a
//! mat-vec and any row of a mat-mat give the same bits): per super-block the exact integer sums
//! — Q4_K: `isum = Σ_s scale_s · Σ_{i∈s} q_i·a_i` and `msum = Σ_s min_s · Σ_{i∈s} a_i`; Q6_K:
//! `isum = Σ_s scale_s · Σ_{i∈s} (q_i − 32)·a_i` — then `acc = fma(d·d_a, isum, acc)` (and for
//! Q4_K `acc = fma(−(dmin·d_a), msum, acc)`) from `acc = 0`.
//!
//! Why kernels of their own: the 256-bit row kernels (`maddubs` + `madd` + `add` per 32 values,
//! ggml's AVX2 shape) ran at ~22 (Q4_K) and ~33 (Q6_K) GB/s with the weights in L2, under this
//! CPU's ~37 GB/s read from memory on one core. Here each 512-bit unit of 64 values is
//! `maddubs` + `vpdpwssd` with its sub-block scales spread by one `vpermw`, and a block's sums
//! are reduced together. Q4_K's nibbles pair with activations 64 values apart, so its
//! activations are re-laid once per product ([`Q4kAct`], with the sub-block sums
//! precomputed); Q6_K's units pair with 64 consecutive activations as stored.

use infer_quant::{q4_k, q6_k, q8_k};
use std::arch::x86_64::*;
use std::cell::Cell;

/// One Q8_K activation block re-laid for [`row_q4k`]: unit `u` (`h = u / 2`, `odd = u % 2`) holds
/// the quants `[128h + 32·odd, +32)` then `[128h + 64 + 32·odd, +32)` — the values that the low
/// (`odd = 0`) or high nibbles of quant bytes `[64h, 64h + 64)` multiply; the eight 32-value
/// sums (exact in i16: |Σ| ≤ 32 · 128); the block's scale.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Q4kAct {
    y: [[i8; 64]; 4],
    asum: [i16; 8],
    d: f32,
}

impl Default for Q4kAct {
    fn default() -> Self {
        Q4kAct {
            y: [[0; 64]; 4],
            asum: [0; 8],
            d: 0.0,
        }
    }
}

thread_local! {
    /// The re-laid activation rows of the current product.
    static ACTS: Cell<Vec<Q4kAct>> = const { Cell::new(Vec::new()) };
}

/// Sub-block scale index of each 16-bit lane, per unit: unit `u` covers sub-blocks
/// `4h + odd` (lanes 0..16) and `4h + odd + 2` (lanes 16..32).
const SCALE_LANES: [[i16; 32]; 4] = {
    let mut t = [[0i16; 32]; 4];
    let mut u = 0;
    while u < 4 {
        let first = (4 * (u / 2) + u % 2) as i16;
        let mut l = 0;
        while l < 32 {
            t[u][l] = if l < 16 { first } else { first + 2 };
            l += 1;
        }
        u += 1;
    }
    t
};

/// Re-lay the Q8_K block at `yb` (ggml `block_q8_K`) for [`row_q4k`].
///
/// # Safety
/// `yb` points at a whole Q8_K block.
unsafe fn relay(yb: *const u8) -> Q4kAct {
    let qs = yb.add(q8_k::QS_OFFSET) as *const i8;
    let mut a = Q4kAct::default();
    for (u, unit) in a.y.iter_mut().enumerate() {
        let (h, odd) = (u / 2, u % 2);
        for half in 0..2 {
            let src = qs.add(128 * h + 64 * half + 32 * odd);
            std::ptr::copy_nonoverlapping(src, unit.as_mut_ptr().add(32 * half), 32);
        }
    }
    let bsums = yb.add(q8_k::BSUMS_OFFSET) as *const i16;
    for (s, v) in a.asum.iter_mut().enumerate() {
        *v = bsums.add(2 * s).read_unaligned() + bsums.add(2 * s + 1).read_unaligned();
    }
    a.d = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned();
    a
}

/// The eight 6-bit scales then the eight mins of the Q4_K block at `xb`, as bytes: ggml's
/// `get_scale_min_k4` unpacking ([`super::layout::q4k_scales_mins`]) on the three little-endian
/// words `u0, u1, u2` of the 12 scale bytes, in vector registers (the scalar version's four
/// stores and one wide reload stalled store-to-load forwarding once per block).
///
/// # Safety
/// AVX2 available; `xb` points at a whole Q4_K block (16 bytes are read from its scales).
#[inline(always)]
pub(super) unsafe fn scales_mins_q4k(xb: *const u8) -> __m128i {
    const _: () = assert!(q4_k::SCALES_OFFSET + 16 <= q4_k::BLOCK_BYTES);
    // [u0, u1, u2, (quants)]
    let v = _mm_loadu_si128(xb.add(q4_k::SCALES_OFFSET) as *const __m128i);
    // [u0 & K1, u1 & K1]: the scales 0-3 and mins 0-3.
    let low = _mm_and_si128(v, _mm_set1_epi32(0x3f3f_3f3f));
    // [u2 & K2, (u2 >> 4) & K2] | [(u0 >> 6) & K3, (u1 >> 6) & K3] << 4
    let u2 = _mm_srlv_epi32(
        _mm_shuffle_epi32::<0b10_10_10_10>(v),
        _mm_setr_epi32(0, 4, 0, 0),
    );
    let high = _mm_or_si128(
        _mm_and_si128(u2, _mm_set1_epi32(0x0f0f_0f0f)),
        _mm_and_si128(_mm_srli_epi32::<2>(v), _mm_set1_epi32(0x3030_3030)),
    );
    // [scales 0-3, scales 4-7, mins 0-3, mins 4-7]
    _mm_unpacklo_epi32(low, high)
}

/// One Q4_K weight row (`acts.len()` super-blocks at `w`) · one re-laid activation row.
///
/// # Safety
/// AVX2, FMA, F16C, AVX512F/BW/VNNI available; `w` holds `acts.len()` Q4_K blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn row_q4k(w: *const u8, acts: &[Q4kAct]) -> f32 {
    let m4 = _mm512_set1_epi8(0xF);
    let lanes: [__m512i; 4] =
        std::array::from_fn(|u| _mm512_loadu_si512(SCALE_LANES[u].as_ptr() as *const __m512i));
    let mut acc = 0f32;
    for (b, a) in acts.iter().enumerate() {
        let xb = w.add(b * q4_k::BLOCK_BYTES);
        super::prefetch_stream(xb, q4_k::BLOCK_BYTES);
        // Lanes 0..8: the scales, 8..16: the mins (i16).
        let scales_mins = _mm256_cvtepu8_epi16(scales_mins_q4k(xb));
        let wide = _mm512_castsi256_si512(scales_mins);
        let q = xb.add(q4_k::QS_OFFSET);
        let mut sum = _mm512_setzero_si512();
        for h in 0..2 {
            let bits = _mm512_loadu_si512(q.add(64 * h) as *const __m512i);
            let nibbles = [
                _mm512_and_si512(bits, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4),
            ];
            for (odd, nib) in nibbles.into_iter().enumerate() {
                let u = 2 * h + odd;
                let y = _mm512_load_si512(a.y[u].as_ptr() as *const __m512i);
                let sc = _mm512_permutexvar_epi16(lanes[u], wide);
                sum = _mm512_dpwssd_epi32(sum, sc, _mm512_maddubs_epi16(nib, y));
            }
        }
        let mins = _mm256_extracti128_si256::<1>(scales_mins);
        let msum = _mm_madd_epi16(mins, _mm_load_si128(a.asum.as_ptr() as *const __m128i));
        // Both sums reduced together: [isum, msum, isum, msum].
        let s8 = _mm256_add_epi32(
            _mm512_castsi512_si256(sum),
            _mm512_extracti64x4_epi64::<1>(sum),
        );
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(s8),
            _mm256_extracti128_si256::<1>(s8),
        );
        let t = _mm_hadd_epi32(s4, msum);
        let im = _mm_cvtepi32_ps(_mm_hadd_epi32(t, t));
        // [d·d_a, dmin·d_a]
        let dd = _mm_mul_ps(
            super::avx2::f16_pair(xb.add(q4_k::D_OFFSET)),
            _mm_set1_ps(a.d),
        );
        const _: () = assert!(q4_k::DMIN_OFFSET == q4_k::D_OFFSET + 2);
        acc = _mm_cvtss_f32(dd).mul_add(_mm_cvtss_f32(im), acc);
        acc =
            (-_mm_cvtss_f32(_mm_movehdup_ps(dd))).mul_add(_mm_cvtss_f32(_mm_movehdup_ps(im)), acc);
    }
    acc
}

/// Q6_K sub-block (16 values) of each 16-bit lane of a unit's `maddubs` pairs: unit `u`
/// (`h = u / 2`, `odd = u % 2`) covers values `[128h + 64·odd, +64)`, sub-blocks
/// `8h + 4·odd + lane / 8`.
const Q6K_SCALE_LANES: [[i16; 32]; 4] = {
    let mut t = [[0i16; 32]; 4];
    let mut u = 0;
    while u < 4 {
        let mut l = 0;
        while l < 32 {
            t[u][l] = (8 * (u / 2) + 4 * (u % 2) + l / 8) as i16;
            l += 1;
        }
        u += 1;
    }
    t
};

/// One Q6_K weight row (`nb` super-blocks at `w`) · one Q8_K activation row `a` (ggml
/// `block_q8_K`s). The stored quants `q + 32` (0..63) go through `maddubs`; the offset
/// `32 · Σ_s scale_s · Σ_{i∈s} a_i` comes from the activation's 16-value sums.
///
/// # Safety
/// AVX2, FMA, F16C, AVX512F/BW/VNNI available; `w` and `a` hold `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn row_q6k(w: *const u8, nb: usize, a: *const u8) -> f32 {
    let m4 = _mm512_set1_epi8(0xF);
    let m30 = _mm512_set1_epi8(0x30);
    let lanes: [__m512i; 4] =
        std::array::from_fn(|u| _mm512_loadu_si512(Q6K_SCALE_LANES[u].as_ptr() as *const __m512i));
    // Left shifts 4 / 2 for the first / second 32 bytes (low nibbles), right 0 / 2 (high).
    let halves = |first: i16, second: i16| {
        _mm512_inserti64x4::<1>(_mm512_set1_epi16(first), _mm256_set1_epi16(second))
    };
    let (low_shift, high_shift) = (halves(4, 2), halves(0, 2));
    let mut acc = 0f32;
    for b in 0..nb {
        let xb = w.add(b * q6_k::BLOCK_BYTES);
        super::prefetch_stream(xb, q6_k::BLOCK_BYTES);
        let yb = a.add(b * q8_k::BLOCK_BYTES);
        let y = yb.add(q8_k::QS_OFFSET);
        // The 16 sub-block scales as i16.
        let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(
            xb.add(q6_k::SCALES_OFFSET) as *const __m128i
        ));
        let wide = _mm512_castsi256_si512(scales);
        let mut sum = _mm512_setzero_si512();
        for h in 0..2 {
            // ql bytes l < 32 hold values 128h + l (low nibble) and 128h + 64 + l (high);
            // bytes 32 + l hold 128h + 32 + l and 128h + 96 + l. Their high two bits are qh
            // byte l's bits 0-1, 2-3 (low nibbles) and 4-5, 6-7 (high), moved to bits 4-5 by
            // per-half shifts of qh repeated in both halves (16-bit shifts: the bits a byte
            // takes from its neighbour land outside 0x30).
            let ql = _mm512_loadu_si512(xb.add(q6_k::QL_OFFSET + 64 * h) as *const __m512i);
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                xb.add(q6_k::QH_OFFSET + 32 * h) as *const __m256i
            ));
            let units = [
                _mm512_or_si512(
                    _mm512_and_si512(ql, m4),
                    _mm512_and_si512(_mm512_sllv_epi16(qh, low_shift), m30),
                ),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    _mm512_and_si512(_mm512_srlv_epi16(qh, high_shift), m30),
                ),
            ];
            for (odd, q) in units.into_iter().enumerate() {
                let u = 2 * h + odd;
                let yv = _mm512_loadu_si512(y.add(64 * u) as *const __m512i);
                let sc = _mm512_permutexvar_epi16(lanes[u], wide);
                sum = _mm512_dpwssd_epi32(sum, sc, _mm512_maddubs_epi16(q, yv));
            }
        }
        let bsums = _mm256_loadu_si256(yb.add(q8_k::BSUMS_OFFSET) as *const __m256i);
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(scales, bsums));
        let s8 = _mm256_sub_epi32(
            _mm256_add_epi32(
                _mm512_castsi512_si256(sum),
                _mm512_extracti64x4_epi64::<1>(sum),
            ),
            offset,
        );
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(s8),
            _mm256_extracti128_si256::<1>(s8),
        );
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
        // d is the block's last two bytes: a 2-byte read (a wider one would pass the weights' end).
        let d =
            super::layout::f16_bits_to_f32((xb.add(q6_k::D_OFFSET) as *const u16).read_unaligned());
        let da = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned();
        acc = (d * da).mul_add(_mm_cvtsi128_si32(s1) as f32, acc);
    }
    acc
}

/// Element (r, i) of `out` = `W_r · A_i` for the `fmt` weight rows `ws` (`row_bytes` each,
/// `nb` super-blocks) and the `m` Q8_K activation rows `acts` (`nb` blocks each), weight rows
/// streamed one at a time.
///
/// # Safety
/// AVX2, FMA, F16C, AVX512F/VL/BW/VNNI available; `ws` holds whole rows of at least `nb`
/// super-blocks; `acts` holds `m · nb` Q8_K blocks; `out` owns elements (r, i) for every
/// r < `ws.len() / row_bytes`, i < `m`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(super) unsafe fn rows_times_acts(
    fmt: super::vnni_gemm_k::KQuant,
    ws: &[u8],
    row_bytes: usize,
    nb: usize,
    acts: &[u8],
    m: usize,
    out: super::OutMat,
) {
    let ar = nb * q8_k::BLOCK_BYTES;
    if fmt == super::vnni_gemm_k::KQuant::Q6K {
        for (r, w) in ws.chunks_exact(row_bytes).enumerate() {
            for i in 0..m {
                out.put(r, i, row_q6k(w.as_ptr(), nb, acts.as_ptr().add(i * ar)));
            }
        }
        return;
    }
    let mut relaid = crate::scratch::take(&ACTS, m * nb);
    for (k, a) in relaid[..m * nb].iter_mut().enumerate() {
        *a = relay(acts.as_ptr().add(k * q8_k::BLOCK_BYTES));
    }
    for (r, w) in ws.chunks_exact(row_bytes).enumerate() {
        for i in 0..m {
            out.put(r, i, row_q4k(w.as_ptr(), &relaid[i * nb..(i + 1) * nb]));
        }
    }
    crate::scratch::give(&ACTS, relaid);
}
