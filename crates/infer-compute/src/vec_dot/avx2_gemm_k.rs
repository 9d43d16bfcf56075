//! AVX2 products of Q4_K/Q6_K weight rows with four or more Q8_K activation rows (batched
//! decode, prompts), on CPUs without AVX-512 VNNI: the design of [`super::avx2_gemm`] (Q4_0 /
//! Q5_0) carried to the 256-value super-blocks.
//!
//! The activations are re-laid four rows to a register ([`pack_acts`]): for each 32-value
//! sub-block, four "steps" whose i32 lane `j < 4` holds four quants of row `j` from the first
//! 16 values and lane `4 + j` four from the last 16, so a product register accumulates one
//! (weight row, activation row) pair per lane with no horizontal sums. Each weight block pair
//! is unpacked once per pass ([`pack_weight_pair`]) to 32 bytes per sub-block and reused for
//! up to 64 activation rows; a register tile is two weight rows × eight activation rows.
//!
//! - Q4_K: unsigned nibbles against signed activations, `maddubs` summed over a sub-block in
//!   i16 (|Σ| ≤ 4·2·15·128), then `madd` with the sub-block's scale; the mins term
//!   `Σ_s min_s·Σ_{i∈s} a_i` from the activations' sub-block sums.
//! - Q6_K: the weight quants as signed `q − 32` against the activations shifted to unsigned
//!   `a + 128` (|two steps| ≤ 2·2·255·32 < 2¹⁵, then `madd` with the two 16-value scales of
//!   the register's halves); the shift is taken off exactly as `128·Σ_s scale_s·Σ_{i∈s}(q_i −
//!   32)`, a per-weight-row constant computed when the block is unpacked.
//!
//! Per pair the integer sums of a block are exact — Q4_K `isum = Σ_s scale_s·Σ q·a`,
//! `msum = Σ_s min_s·Σ a`; Q6_K `isum = Σ_s scale_s·Σ (q − 32)·a` — and the f32 part is that
//! of the mat-vec ([`super::avx512_q4k`], [`super::avx512_q6k`]) and of
//! [`super::kquant_row`]: `acc = fma(d·d_a, isum, acc)` (Q4_K then `acc = fma(−(dmin·d_a),
//! msum, acc)`) per block from `acc = 0`. Same bits as the mat-vec and any batch size.

use super::avx2_gemm::step_weights;
use super::avx2_pack::{put_row_pair, transpose_dwords, weight_row_pair, GROUP};
use super::vnni_gemm_k::KQuant;
use super::OutMat;
use infer_quant::{q4_k, q6_k, q8_k};
use std::arch::x86_64::*;

/// Activation groups per pass over a task's weight rows (64 rows: ~75 KB of re-laid
/// activations per 1536 columns, in L2 while each weight row pair is swept over them).
const CHUNK_GROUPS: usize = 16;

/// Bytes of one group's re-laid super-block: quants (8 sub-blocks × 4 steps × 32 bytes), the
/// scales (8 f32 lanes), the sub-block sums (4 registers of 16 i16; Q4_K only).
const ACT_QS: usize = 8 * 4 * 32;
const ACT_D: usize = 32;
const ACT_SUMS: usize = 4 * 32;
const ACT_BLOCK: usize = ACT_QS + ACT_D + ACT_SUMS;

/// Bytes of one unpacked super-block of a weight row pair: quants (8 sub-blocks × 2 rows × 32
/// bytes), scales (8 sub-blocks × 2 rows × one 16-lane i16 register), mins (Q4_K: 4
/// registers), `d` and `dmin` (Q4_K) or the shift correction (Q6_K, i32) as 8 lanes each.
const W_QS: usize = 8 * 2 * 32;
const W_SC: usize = 8 * 2 * 32;
const W_MIN: usize = 4 * 32;
const W_D: usize = 32;
const W_BLOCK: usize = W_QS + W_SC + W_MIN + 2 * W_D;

thread_local! {
    /// Re-laid activation groups and the unpacked weight pair (`crate::scratch`).
    static ACTS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    static WPAIR: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Re-lay the `m` Q8_K activation rows `acts` (`nb` blocks each) into `out` (`⌈m/4⌉·nb`
/// entries of [`ACT_BLOCK`] bytes; entry `g·nb + b` = group `g`'s block `b`; rows past `m` are
/// zero):
/// - quants at `128·u + 32·s`, sub-block `u < 8`, step `s < 4`: bytes `4j..4j+4` (lane
///   `j < 4`) = quants `32u + 4s ..+4` of row `4g + j`, lane `4 + j` = its quants
///   `32u + 16 + 4s ..+4`; for Q6_K stored as `a + 128` (unsigned);
/// - at [`ACT_QS`]: 8 f32, lane `l` = row `4g + l%4`'s block scale;
/// - at [`ACT_QS`] + [`ACT_D`] (Q4_K): 4 registers of 16 i16, register `p`'s lane `l` (two
///   i16) = the sums of sub-blocks `2p`, `2p + 1` of row `4g + l%4` (ggml's `bsums` in pairs).
///
/// # Safety
/// AVX2 available; `acts` holds `m·nb` Q8_K blocks; `out` has room for the entries.
#[target_feature(enable = "avx2")]
unsafe fn pack_acts(kq: KQuant, acts: *const u8, m: usize, nb: usize, out: *mut u8) {
    let flip = _mm256_set1_epi8(if kq == KQuant::Q6K { -128 } else { 0 });
    for g in 0..m.div_ceil(GROUP) {
        for b in 0..nb {
            let dst = out.add((g * nb + b) * ACT_BLOCK);
            let block = |j: usize| {
                let i = GROUP * g + j;
                (i < m).then(|| acts.add((i * nb + b) * q8_k::BLOCK_BYTES))
            };
            let blocks = [block(0), block(1), block(2), block(3)];
            for u in 0..8 {
                let row = |j: usize| match blocks[j] {
                    Some(p) => {
                        _mm256_loadu_si256(p.add(q8_k::QS_OFFSET + 32 * u) as *const __m256i)
                    }
                    None => _mm256_setzero_si256(),
                };
                let steps = transpose_dwords([row(0), row(1), row(2), row(3)]);
                for (s, v) in steps.into_iter().enumerate() {
                    let p = dst.add(128 * u + 32 * s) as *mut __m256i;
                    _mm256_storeu_si256(p, _mm256_xor_si256(v, flip));
                }
            }
            let d = dst.add(ACT_QS) as *mut f32;
            let sums = dst.add(ACT_QS + ACT_D) as *mut i16;
            for l in 0..8 {
                let blk = blocks[l % GROUP];
                let dv = blk.map_or(0.0, |p| {
                    (p.add(q8_k::D_OFFSET) as *const f32).read_unaligned()
                });
                d.add(l).write_unaligned(dv);
                for sb in 0..8 {
                    // Sub-block `sb` of 32 values = Q8_K groups 2sb, 2sb + 1 (|Σ| ≤ 32·128).
                    let v = blk.map_or(0, |p| {
                        let bs = p.add(q8_k::BSUMS_OFFSET) as *const i16;
                        bs.add(2 * sb).read_unaligned() + bs.add(2 * sb + 1).read_unaligned()
                    });
                    sums.add(16 * (sb / 2) + 2 * l + sb % 2).write_unaligned(v);
                }
            }
        }
    }
}

/// Unpack blocks `0..nb` of the weight rows `rows` into `out` (`nb` entries of [`W_BLOCK`]
/// bytes): for block `b`, sub-block `u < 8` and row `k < 2`,
/// - quants at `64·u + 32·k`: the sub-block's 32 values in order (Q4_K: the nibbles; Q6_K:
///   `q − 32` as i8);
/// - scales at [`W_QS`] `+ 32·(2u + k)`: 16 i16 lanes, Q4_K: the sub-block's 6-bit scale in
///   every lane; Q6_K: the scales of its two 16-value halves, 8 lanes each;
/// - Q4_K mins at [`W_QS`] + [`W_SC`] `+ 32·p`: lanes `l` (two i16) = row `l / 4`'s mins of
///   sub-blocks `2p`, `2p + 1`;
/// - then 8 f32 lanes `d` of row `l / 4`, then 8 lanes of row `l / 4`'s `dmin` (Q4_K, f32) or
///   shift correction `128·Σ_s scale_s·Σ_{i∈s}(q_i − 32)` (Q6_K, i32).
///
/// # Safety
/// AVX2 and F16C available; both rows hold `nb` blocks of `kq`; `out` has room for `nb`
/// entries.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn pack_weight_pair(kq: KQuant, nb: usize, rows: [*const u8; 2], out: *mut u8) {
    let m4 = _mm256_set1_epi8(0xF);
    for b in 0..nb {
        let dst = out.add(b * W_BLOCK);
        let sc = dst.add(W_QS) as *mut __m256i;
        let lanes = dst.add(W_QS + W_SC + W_MIN);
        for (k, &row) in rows.iter().enumerate() {
            let quants = |u: usize, v: __m256i| {
                _mm256_storeu_si256(dst.add(64 * u + 32 * k) as *mut __m256i, v)
            };
            let (d, second): (f32, u32) = match kq {
                KQuant::Q4K => {
                    let xb = row.add(b * q4_k::BLOCK_BYTES);
                    let q = xb.add(q4_k::QS_OFFSET);
                    for c in 0..4 {
                        let bits = _mm256_loadu_si256(q.add(32 * c) as *const __m256i);
                        quants(2 * c, _mm256_and_si256(bits, m4));
                        quants(2 * c + 1, _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4));
                    }
                    // i16 lanes 0..8: the scales, 8..16: the mins.
                    let sm = _mm256_cvtepu8_epi16(super::kquant_row::scales_mins_q4k(xb));
                    let scales = _mm256_permute4x64_epi64::<0x44>(sm);
                    for u in 0..8 {
                        let pick = _mm256_set1_epi16((((2 * u + 1) << 8) | (2 * u)) as i16);
                        _mm256_storeu_si256(sc.add(2 * u + k), _mm256_shuffle_epi8(scales, pick));
                    }
                    let mins = _mm256_extracti128_si256::<1>(sm);
                    let dst_mins = dst.add(W_QS + W_SC + 16 * k) as *mut __m128i;
                    _mm_storeu_si128(dst_mins, _mm_shuffle_epi32::<0x00>(mins));
                    _mm_storeu_si128(dst_mins.add(2), _mm_shuffle_epi32::<0x55>(mins));
                    _mm_storeu_si128(dst_mins.add(4), _mm_shuffle_epi32::<0xAA>(mins));
                    _mm_storeu_si128(dst_mins.add(6), _mm_shuffle_epi32::<0xFF>(mins));
                    let dd = super::avx2::f16_pair(xb.add(q4_k::D_OFFSET));
                    let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
                    (_mm_cvtss_f32(dd), dmin.to_bits())
                }
                KQuant::Q6K => {
                    let xb = row.add(b * q6_k::BLOCK_BYTES);
                    let scales = _mm_loadu_si128(xb.add(q6_k::SCALES_OFFSET) as *const __m128i);
                    let m2 = _mm256_set1_epi8(3);
                    let mut corr = _mm256_setzero_si256();
                    for h in 0..2 {
                        let ql = xb.add(q6_k::QL_OFFSET + 64 * h);
                        let qh =
                            _mm256_loadu_si256(xb.add(q6_k::QH_OFFSET + 32 * h) as *const __m256i);
                        let b1 = _mm256_loadu_si256(ql as *const __m256i);
                        let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                        let hi = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, m2), 4);
                        // Values 128h + 32c.. (ggml's ql/qh split of a 128-value half).
                        let q = [
                            _mm256_or_si256(_mm256_and_si256(b1, m4), hi(qh)),
                            _mm256_or_si256(_mm256_and_si256(b2, m4), hi(_mm256_srli_epi16(qh, 2))),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                hi(_mm256_srli_epi16(qh, 4)),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                hi(_mm256_srli_epi16(qh, 6)),
                            ),
                        ];
                        for (c, qc) in q.into_iter().enumerate() {
                            let u = 4 * h + c;
                            let signed = _mm256_sub_epi8(qc, _mm256_set1_epi8(32));
                            quants(u, signed);
                            let shuf = _mm_loadu_si128(
                                super::avx512_q6k::SCALE_SHUFFLE[u].as_ptr() as *const __m128i,
                            );
                            let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf));
                            _mm256_storeu_si256(sc.add(2 * u + k), s);
                            // Σ_s scale_s · Σ_{i∈s} (q_i − 32), exact in i32.
                            let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), signed);
                            corr = _mm256_add_epi32(corr, _mm256_madd_epi16(pairs, s));
                        }
                    }
                    let c4 = _mm_add_epi32(
                        _mm256_castsi256_si128(corr),
                        _mm256_extracti128_si256::<1>(corr),
                    );
                    let c2 = _mm_add_epi32(c4, _mm_unpackhi_epi64(c4, c4));
                    let c1 = _mm_cvtsi128_si32(_mm_add_epi32(c2, _mm_shuffle_epi32::<1>(c2)));
                    let d = super::layout::f16_bits_to_f32(
                        (xb.add(q6_k::D_OFFSET) as *const u16).read_unaligned(),
                    );
                    (d, (c1 << 7) as u32)
                }
            };
            _mm_storeu_ps(lanes.add(16 * k) as *mut f32, _mm_set1_ps(d));
            let second = _mm_set1_epi32(second as i32);
            _mm_storeu_si128(lanes.add(W_D + 16 * k) as *mut __m128i, second);
        }
    }
}

/// `s[a][k] += maddubs` of step `S` of one sub-block: weight row `k`'s quants `w[k]` against
/// group `a`'s step at `y[a]` (Q4_K: weights unsigned; Q6_K: activations unsigned).
#[inline(always)]
unsafe fn step<const Q6: bool, const S: i32, const NA: usize>(
    w: [__m256i; 2],
    y: [*const u8; NA],
    s: &mut [[__m256i; 2]; NA],
) {
    let ws = [step_weights::<S>(w[0]), step_weights::<S>(w[1])];
    for a in 0..NA {
        let ya = _mm256_loadu_si256(y[a].add(32 * S as usize) as *const __m256i);
        for k in 0..2 {
            let p = if Q6 {
                _mm256_maddubs_epi16(ya, ws[k])
            } else {
                _mm256_maddubs_epi16(ws[k], ya)
            };
            s[a][k] = _mm256_add_epi16(s[a][k], p);
        }
    }
}

/// `NA` accumulators, lanes `j < 4` = weight row 0 · activation row `4g + j` of group `g`
/// (`groups[a]`, [`pack_acts`] entries of its block 0), lanes `4 + j` = weight row 1 · the same
/// row: the weight pair unpacked at `w` ([`pack_weight_pair`], `nb` blocks).
///
/// # Safety
/// AVX2, FMA and F16C available; `w` holds `nb` unpacked blocks and each group `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const Q6: bool, const NA: usize>(
    nb: usize,
    w: *const u8,
    groups: [*const u8; NA],
) -> [__m256; NA] {
    let mut acc = [_mm256_setzero_ps(); NA];
    for b in 0..nb {
        let wb = w.add(b * W_BLOCK);
        let yb: [*const u8; NA] = std::array::from_fn(|a| groups[a].add(b * ACT_BLOCK));
        let mut isum = [[_mm256_setzero_si256(); 2]; NA];
        for u in 0..8 {
            let wq = [
                _mm256_loadu_si256(wb.add(64 * u) as *const __m256i),
                _mm256_loadu_si256(wb.add(64 * u + 32) as *const __m256i),
            ];
            let sc = wb.add(W_QS + 64 * u) as *const __m256i;
            let y: [*const u8; NA] = std::array::from_fn(|a| yb[a].add(128 * u));
            let mut add_scaled = |s: [[__m256i; 2]; NA]| {
                for a in 0..NA {
                    for k in 0..2 {
                        let p = _mm256_madd_epi16(s[a][k], _mm256_loadu_si256(sc.add(k)));
                        isum[a][k] = _mm256_add_epi32(isum[a][k], p);
                    }
                }
            };
            let mut s = [[_mm256_setzero_si256(); 2]; NA];
            step::<Q6, 0, NA>(wq, y, &mut s);
            step::<Q6, 1, NA>(wq, y, &mut s);
            if Q6 {
                // Two steps of |2·255·32| each are the most an i16 lane holds.
                add_scaled(s);
                s = [[_mm256_setzero_si256(); 2]; NA];
            }
            step::<Q6, 2, NA>(wq, y, &mut s);
            step::<Q6, 3, NA>(wq, y, &mut s);
            add_scaled(s);
        }
        let lanes = wb.add(W_QS + W_SC + W_MIN);
        let dw = _mm256_loadu_ps(lanes as *const f32);
        for a in 0..NA {
            let [i0, i1] = isum[a];
            // [row 0: both halves added | row 1: both halves added].
            let mut dot = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(i0, i1),
                _mm256_permute2x128_si256::<0x31>(i0, i1),
            );
            if Q6 {
                let corr = _mm256_loadu_si256(lanes.add(W_D) as *const __m256i);
                dot = _mm256_sub_epi32(dot, corr);
            }
            let da = _mm256_loadu_ps(yb[a].add(ACT_QS) as *const f32);
            acc[a] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(dot), acc[a]);
            if !Q6 {
                let mins = wb.add(W_QS + W_SC) as *const __m256i;
                let sums = yb[a].add(ACT_QS + ACT_D) as *const __m256i;
                let mut msum = _mm256_setzero_si256();
                for p in 0..4 {
                    let t = _mm256_madd_epi16(
                        _mm256_loadu_si256(mins.add(p)),
                        _mm256_loadu_si256(sums.add(p)),
                    );
                    msum = _mm256_add_epi32(msum, t);
                }
                let dmin = _mm256_loadu_ps(lanes.add(W_D) as *const f32);
                // fnmadd(t, x, acc) = fma(−t, x, acc): the mat-vec's −(dmin·d_a), exactly.
                acc[a] =
                    _mm256_fnmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum), acc[a]);
            }
        }
    }
    acc
}

/// The batch kernel for `m` activation rows of `kq` weights where one serves, as
/// [`rows_times_acts`]: the VNNI tiles on hosts with AVX-512 VNNI, else this AVX2 kernel from
/// [`GROUP`] rows. Returns false when neither does (fewer rows on an AVX2 host: the caller's
/// mat-vec tile).
///
/// # Safety
/// As [`rows_times_acts`] (lengths checked by the caller).
pub(super) unsafe fn batch_rows(
    kq: KQuant,
    ws: &[u8],
    row_bytes: usize,
    nb: usize,
    acts: &[u8],
    m: usize,
    out: OutMat,
) -> bool {
    if super::avx2_tile::vnni_available() {
        super::vnni_gemm_k::rows_times_acts(kq, ws, row_bytes, nb, acts, m, out);
    } else if m >= GROUP {
        rows_times_acts(kq, ws, row_bytes, nb, acts, m, out);
    } else {
        return false;
    }
    true
}

/// Element (r, i) of `out` = `W_r · A_i` for the Q4_K or Q6_K (`kq`) weight rows `ws`
/// (`row_bytes` each, `nb` super-blocks) and the `m` Q8_K activation rows `acts` (`nb` blocks
/// each, ggml `block_q8_K`).
///
/// # Safety
/// AVX2, FMA and F16C available; `ws` holds whole rows of at least `nb` blocks; `acts` holds
/// `m·nb` Q8_K blocks; `out` owns elements (r, i) for every row r and i < `m`
/// ([`OutMat::put`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_times_acts(
    kq: KQuant,
    ws: &[u8],
    row_bytes: usize,
    nb: usize,
    acts: &[u8],
    m: usize,
    out: OutMat,
) {
    match kq {
        KQuant::Q4K => rows::<false>(ws, row_bytes, nb, acts, m, out),
        KQuant::Q6K => rows::<true>(ws, row_bytes, nb, acts, m, out),
    }
}

/// [`rows_times_acts`] for one format (`Q6`: Q6_K, else Q4_K).
///
/// # Safety
/// As [`rows_times_acts`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const Q6: bool>(
    ws: &[u8],
    row_bytes: usize,
    nb: usize,
    acts: &[u8],
    m: usize,
    out: OutMat,
) {
    let kq = if Q6 { KQuant::Q6K } else { KQuant::Q4K };
    let ng = m.div_ceil(GROUP);
    let n_rows = ws.len() / row_bytes;
    let mut packed = crate::scratch::take(&ACTS, ng * nb * ACT_BLOCK);
    let mut wpair = crate::scratch::take(&WPAIR, nb * W_BLOCK);
    pack_acts(kq, acts.as_ptr(), m, nb, packed.as_mut_ptr());
    let group = |g: usize| packed.as_ptr().add(g * nb * ACT_BLOCK);
    let put = |v: __m256, r0: usize, r1: usize, g: usize| put_row_pair(out, v, r0, r1, g, m);
    for g0 in (0..ng).step_by(CHUNK_GROUPS) {
        let g1 = (g0 + CHUNK_GROUPS).min(ng);
        for r0 in (0..n_rows).step_by(2) {
            let (r1, rows) = weight_row_pair(ws, row_bytes, r0);
            pack_weight_pair(kq, nb, rows, wpair.as_mut_ptr());
            let w = wpair.as_ptr();
            let mut g = g0;
            while g1 - g >= 2 {
                let v = tile::<Q6, 2>(nb, w, [group(g), group(g + 1)]);
                put(v[0], r0, r1, g);
                put(v[1], r0, r1, g + 1);
                g += 2;
            }
            if g < g1 {
                let [v] = tile::<Q6, 1>(nb, w, [group(g)]);
                put(v, r0, r1, g);
            }
        }
    }
    crate::scratch::give(&ACTS, packed);
    crate::scratch::give(&WPAIR, wpair);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` random weight blocks of `kq` (f16 scales finite and moderate).
    fn weights(next: &mut impl FnMut() -> u64, kq: KQuant, n: usize) -> Vec<u8> {
        let bb = kq.block_bytes();
        let mut w: Vec<u8> = (0..n * bb).map(|_| next() as u8).collect();
        for blk in w.chunks_exact_mut(bb) {
            match kq {
                KQuant::Q4K => {
                    blk[q4_k::D_OFFSET + 1] &= 0x3b;
                    blk[q4_k::DMIN_OFFSET + 1] &= 0x3b;
                }
                KQuant::Q6K => blk[q6_k::D_OFFSET + 1] &= 0x3b,
            }
        }
        w
    }

    /// The exact model of a pair: per block the integer sums from the stored quants, then
    /// `acc = fma(d·d_a, isum, acc)` (Q4_K: and `acc = fma(−(dmin·d_a), msum, acc)`); and
    /// `Σ |d·d_a·scale·q·a|` (+ the mins' terms), the scale of a rounding difference.
    fn model(kq: KQuant, w: &[u8], a: &[u8]) -> (f32, f32) {
        let bb = kq.block_bytes();
        let (mut acc, mut mag) = (0f32, 0f32);
        for (x, y) in w.chunks_exact(bb).zip(a.chunks_exact(q8_k::BLOCK_BYTES)) {
            let ya: Vec<i64> = y[q8_k::QS_OFFSET..q8_k::QS_OFFSET + 256]
                .iter()
                .map(|&v| v as i8 as i64)
                .collect();
            let da = f32::from_le_bytes(y[0..4].try_into().unwrap());
            let f16 =
                |o: usize| half::f16::from_bits(u16::from_le_bytes([x[o], x[o + 1]])).to_f32();
            match kq {
                KQuant::Q4K => {
                    let sm = crate::vec_dot::layout::q4k_scales_mins(&x[4..16]);
                    let (mut isum, mut msum, mut iabs, mut mabs) = (0i64, 0i64, 0i64, 0i64);
                    for s in 0..8 {
                        let (c, hi) = (s / 2, s % 2);
                        let mut dot = 0i64;
                        let mut asum = 0i64;
                        for l in 0..32 {
                            let q = (x[q4_k::QS_OFFSET + 32 * c + l] >> (4 * hi)) & 15;
                            dot += q as i64 * ya[32 * s + l];
                            asum += ya[32 * s + l];
                            iabs += (sm[s] as i64 * q as i64 * ya[32 * s + l]).abs();
                            mabs += (sm[8 + s] as i64 * ya[32 * s + l]).abs();
                        }
                        isum += sm[s] as i64 * dot;
                        msum += sm[8 + s] as i64 * asum;
                    }
                    let (d, dmin) = (f16(q4_k::D_OFFSET), f16(q4_k::DMIN_OFFSET));
                    acc = (d * da).mul_add(isum as i32 as f32, acc);
                    acc = (-(dmin * da)).mul_add(msum as i32 as f32, acc);
                    mag += (d * da).abs() * iabs as f32 + (dmin * da).abs() * mabs as f32;
                }
                KQuant::Q6K => {
                    let (mut isum, mut iabs) = (0i64, 0i64);
                    for v in 0..256 {
                        let (h, r) = (v / 128, v % 128);
                        let (c, l) = (r / 32, r % 32);
                        let ql = x[q6_k::QL_OFFSET + 64 * h + 32 * (c % 2) + l] >> (4 * (c / 2));
                        let qh = x[q6_k::QH_OFFSET + 32 * h + l] >> (2 * c);
                        let q = ((ql & 15) | (qh & 3) << 4) as i64 - 32;
                        let sc = x[q6_k::SCALES_OFFSET + v / 16] as i8 as i64;
                        isum += sc * q * ya[v];
                        iabs += (sc * q * ya[v]).abs();
                    }
                    let d = f16(q6_k::D_OFFSET);
                    acc = (d * da).mul_add(isum as i32 as f32, acc);
                    mag += (d * da).abs() * iabs as f32;
                }
            }
        }
        (acc, mag)
    }

    /// Every product of the batch kernel (one and two groups per tile, padded last groups,
    /// odd weight row counts, more than one pass of 64 activation rows) and of the mat-vec
    /// tile kernels (1–3 activation rows) equals the exact model bit for bit, for Q4_K and
    /// Q6_K, through `avx512_q4k` / `avx512_q6k`'s dispatch (this kernel for 4+ rows without
    /// VNNI); and the scalar ggml kernel within 1e-6 of the terms' magnitudes.
    #[test]
    fn products_equal_the_exact_model_bit_for_bit() {
        if !crate::vec_dot::avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut next = super::super::xorshift(0x2545_f491_4f6c_dd1d);
        for kq in [KQuant::Q4K, KQuant::Q6K] {
            for (nb, rows, m) in [
                (1usize, 3usize, 1usize),
                (2, 5, 2),
                (1, 4, 3),
                (1, 1, 4),
                (2, 3, 5),
                (6, 7, 8),
                (3, 4, 9),
                (6, 6, 16),
                (2, 3, 17),
                (1, 5, 64),
                (2, 3, 70),
            ] {
                let cols = nb * 256;
                let bb = kq.block_bytes();
                let rb = nb * bb;
                let w = weights(&mut next, kq, rows * nb);
                let x: Vec<f32> = (0..m * cols)
                    .map(|_| ((next() % 2001) as f32 - 1000.0) * 1e-3)
                    .collect();
                let ar = nb * q8_k::BLOCK_BYTES;
                let mut acts = vec![0u8; m * ar];
                for (xr, ab) in x.chunks_exact(cols).zip(acts.chunks_exact_mut(ar)) {
                    infer_quant::q8_k::quantize_row_ref(xr, ab);
                }
                let mut got = vec![f32::NAN; m * rows];
                // SAFETY: whole rows of nb blocks, m activation rows; out is [m, rows].
                unsafe {
                    let o = OutMat::rows_last(&mut got, m, rows);
                    match kq {
                        KQuant::Q4K => {
                            super::super::avx512_q4k::rows_times_acts(&w, rb, cols, &acts, m, o)
                        }
                        KQuant::Q6K => {
                            super::super::avx512_q6k::rows_times_acts(&w, rb, cols, &acts, m, o)
                        }
                    }
                }
                for r in 0..rows {
                    let wr = &w[r * rb..(r + 1) * rb];
                    for i in 0..m {
                        let a = &acts[i * ar..(i + 1) * ar];
                        let g = got[i * rows + r];
                        let (want, mag) = model(kq, wr, a);
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{kq:?} nb={nb} m={m} row {r} act {i}: {g} vs {want}"
                        );
                        let scalar = match kq {
                            KQuant::Q4K => super::super::generic::vec_dot_q4_k_q8_k(cols, wr, a),
                            KQuant::Q6K => super::super::generic::vec_dot_q6_k_q8_k(cols, wr, a),
                        };
                        assert!(
                            (g - scalar).abs() <= 1e-6 * mag,
                            "{kq:?} nb={nb} m={m} row {r} act {i}: {g} vs scalar {scalar}, Σ|terms| {mag}"
                        );
                    }
                }
            }
        }
    }
}
