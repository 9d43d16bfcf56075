//! Operand layouts of [`super::avx2_gemm`]: activation rows re-laid four at a time, so that one
//! register holds four quants of each of four rows from both halves of a block (lane = row,
//! no horizontal sums needed), and Q4_0/Q5_0 weight rows unpacked to 32 unsigned bytes per
//! block, two rows at a time. The layout follows the idea of ggml's `repack.cpp` (operands
//! interleaved so that the lanes of one product are independent dot products), with the
//! activations re-laid instead of the weights, so that the GGUF's blocks are read as stored.

use super::avx2_tile::{bytes_from_bits_32, bytes_from_nibbles_32, Q0};
use super::Q8Rows;
use infer_quant::{q4_0, q5_0};
use std::arch::x86_64::*;

/// Activation rows per group: one register holds 4 rows × 2 block halves × 4 quants.
pub(super) const GROUP: usize = 4;

/// Bytes of one group's block of quants (4 rows × 32 quants, as four registers).
pub(super) const GROUP_BLOCK: usize = GROUP * 32;

/// Weight rows `r0` and `r0 + 1` of `ws` (`row_bytes` each) as the batch kernels walk them in
/// pairs: the second row's index (an odd last row is paired with itself; its lanes are
/// dropped, [`put_row_pair`]) and both rows' first bytes, prefetched for the pair's unpacking
/// (decode reads each weight once per step, from memory: [`super::prefetch_stream`]).
///
/// # Safety
/// `r0 < ws.len() / row_bytes`.
#[inline(always)]
pub(super) unsafe fn weight_row_pair(
    ws: &[u8],
    row_bytes: usize,
    r0: usize,
) -> (usize, [*const u8; 2]) {
    let r1 = (r0 + 1).min(ws.len() / row_bytes - 1);
    let rows = [
        ws.as_ptr().add(r0 * row_bytes),
        ws.as_ptr().add(r1 * row_bytes),
    ];
    super::prefetch_stream(rows[0], 2 * row_bytes);
    (r1, rows)
}

/// The results of one weight-row pair × activation group of the batch kernels into `out`:
/// lanes j (weight row `r0`) and `GROUP + j` (row `r1`; dropped when `r1 == r0`, the last row of
/// an odd count) of `v` are outputs (r, `GROUP·g + j`) for every activation row below `m`.
///
/// # Safety
/// AVX available; `out` owns those elements ([`super::OutMat::put`]).
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn put_row_pair(
    out: super::OutMat,
    v: __m256,
    r0: usize,
    r1: usize,
    g: usize,
    m: usize,
) {
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), v);
    for j in 0..GROUP.min(m - GROUP * g) {
        out.put(r0, GROUP * g + j, l[j]);
        if r1 != r0 {
            out.put(r1, GROUP * g + j, l[GROUP + j]);
        }
    }
}

/// The offset of the stored unsigned quants: ggml's Q4_0 quant is `nibble − 8`, Q5_0's
/// `(nibble | fifth bit << 4) − 16`.
///
/// Panics for the Q8 formats (signed: not handled here).
pub(super) const fn weight_offset(fmt: Q0) -> i32 {
    match fmt {
        Q0::Q4_0 => 8,
        Q0::Q5_0 => 16,
        Q0::Q8_0 | Q0::Q8S => panic!("avx2_pack: Q8 weights are signed"),
    }
}

/// Where [`pack_groups`] writes activation groups (`ng = ⌈m/4⌉` groups of `nb` blocks; entry
/// `gb = g·nb + b` is group `g`'s block `b`; rows past `m` are zero):
/// - `qs[128·gb + 32·s ..][..32]`, step `s < 4`: bytes `4j..4j+4` (lane `j < 4`) = quants
///   `4s..4s+4` of row `4g+j`'s block `b`, lane `4+j` = its quants `16+4s..16+4s+4`;
/// - `d[8·gb + l]` = the f32 scale of row `4g + l%4`'s block `b`;
/// - `sums[8·gb + l]` = `offset · Σ` quants of row `4g + l%4`'s block `b` (the correction
///   of the unsigned weight quants).
pub(super) struct GroupsOut<'a> {
    pub qs: &'a mut [u8],
    pub d: &'a mut [f32],
    pub sums: &'a mut [i32],
}

/// Re-lay all rows of `acts` into `out` (see [`GroupsOut`]) for weights of offset `offset`
/// ([`weight_offset`]).
///
/// Panics if `out`'s buffers are shorter than `ng·nb·128` bytes / `ng·nb·8` values.
///
/// # Safety
/// AVX2 must be available; `acts` must hold `m·cols` quants and `m·cols/32` scales.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_groups(acts: &Q8Rows, offset: i32, out: GroupsOut<'_>) {
    let (m, cols) = (acts.m, acts.cols);
    let nb = cols / 32;
    let ng = m.div_ceil(GROUP);
    assert!(out.qs.len() >= ng * nb * GROUP_BLOCK);
    assert!(out.d.len() >= ng * nb * 8 && out.sums.len() >= ng * nb * 8);
    let qs = acts.qs.as_ptr();
    for g in 0..ng {
        for b in 0..nb {
            let gb = g * nb + b;
            let row = |j: usize| {
                let i = GROUP * g + j;
                if i < m {
                    _mm256_loadu_si256(qs.add(i * cols + 32 * b) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                }
            };
            let steps = transpose_dwords([row(0), row(1), row(2), row(3)]);
            let dst = out.qs.as_mut_ptr().add(gb * GROUP_BLOCK) as *mut __m256i;
            for (s, v) in steps.iter().enumerate() {
                _mm256_storeu_si256(dst.add(s), *v);
            }
            for l in 0..8 {
                let i = GROUP * g + l % GROUP;
                out.d[8 * gb + l] = if i < m { acts.d[i * nb + b] } else { 0.0 };
            }
            let s = _mm256_mullo_epi32(row_sums(steps), _mm256_set1_epi32(offset));
            _mm256_storeu_si256(out.sums.as_mut_ptr().add(8 * gb) as *mut __m256i, s);
        }
    }
}

/// The 4 × 4 dword transpose of each 128-bit half of rows `r0..r3`: step `s` = `[r0.s, r1.s,
/// r2.s, r3.s | r0.(4+s), r1.(4+s), r2.(4+s), r3.(4+s)]` (dwords).
#[inline(always)]
pub(super) unsafe fn transpose_dwords([r0, r1, r2, r3]: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(r0, r1);
    let t1 = _mm256_unpackhi_epi32(r0, r1);
    let t2 = _mm256_unpacklo_epi32(r2, r3);
    let t3 = _mm256_unpackhi_epi32(r2, r3);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Lane `l` = the sum of the 32 quants of row `l % 4` of one group block given as its four
/// steps (both halves hold the whole sum).
#[inline(always)]
unsafe fn row_sums(steps: [__m256i; 4]) -> __m256i {
    let ones8 = _mm256_set1_epi8(1);
    let p = |v| _mm256_maddubs_epi16(ones8, v);
    let t = _mm256_add_epi16(
        _mm256_add_epi16(p(steps[0]), p(steps[1])),
        _mm256_add_epi16(p(steps[2]), p(steps[3])),
    );
    let half = _mm256_madd_epi16(t, _mm256_set1_epi16(1));
    _mm256_add_epi32(half, _mm256_permute2x128_si256::<0x01>(half, half))
}

/// Unpack blocks `0..nb` of the Q4_0/Q5_0 weight rows `rows` into `q` (`64·nb` bytes: block
/// `b` of row `k` at `64·b + 32·k`, the unsigned quants `q + offset`) and `d` (`8·nb` f32:
/// `d[8b + l]` = the scale of block `b` of row `l / 4`).
///
/// # Safety
/// AVX2 and F16C must be available; both rows must hold `nb` blocks of `fmt`; `q` and `d` must
/// have room for `64·nb` bytes and `8·nb` f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack_weight_pair(
    fmt: Q0,
    nb: usize,
    rows: [*const u8; 2],
    q: *mut u8,
    d: *mut f32,
) {
    let bb = super::avx2_tile::block_bytes(fmt);
    for b in 0..nb {
        let mut dv = [0f32; 2];
        for (k, r) in rows.iter().enumerate() {
            let xb = r.add(b * bb);
            let h = (xb as *const u16).read_unaligned();
            dv[k] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))));
            let qk = match fmt {
                Q0::Q4_0 => bytes_from_nibbles_32(xb.add(q4_0::QS_OFFSET)),
                _ => _mm256_or_si256(
                    bytes_from_nibbles_32(xb.add(q5_0::QS_OFFSET)),
                    _mm256_and_si256(
                        bytes_from_bits_32(xb.add(q5_0::QH_OFFSET)),
                        _mm256_set1_epi8(0x10),
                    ),
                ),
            };
            _mm256_storeu_si256(q.add(64 * b + 32 * k) as *mut __m256i, qk);
        }
        let v = _mm256_setr_ps(dv[0], dv[0], dv[0], dv[0], dv[1], dv[1], dv[1], dv[1]);
        _mm256_storeu_ps(d.add(8 * b), v);
    }
}

/// Activation rows per group of [`pack_groups8`]: one register holds 8 rows × 4 quants.
pub(super) const GROUP8: usize = 8;

/// Bytes of one [`pack_groups8`] group's block of quants (8 rows × 32 quants, as eight
/// registers).
pub(super) const GROUP8_BLOCK: usize = GROUP8 * 32;

/// [`pack_groups`] for groups of eight rows (`ng = ⌈m/8⌉`; entry `gb = g·nb + b`):
/// `qs[256·gb + 32·s ..][..32]`, step `s < 8`: bytes `4j..4j+4` (lane `j`) = quants
/// `4s..4s+4` of row `8g+j`'s block `b`; `d[8·gb + j]` its scale; `sums[8·gb + j]` = `offset ·
/// Σ` its quants. Rows past `m` are zero.
///
/// Panics if `out`'s buffers are shorter than `ng·nb·256` bytes / `ng·nb·8` values.
///
/// # Safety
/// AVX2 must be available; `acts` must hold `m·cols` quants and `m·cols/32` scales.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_groups8(acts: &Q8Rows, offset: i32, out: GroupsOut<'_>) {
    let (m, cols) = (acts.m, acts.cols);
    let nb = cols / 32;
    let ng = m.div_ceil(GROUP8);
    assert!(out.qs.len() >= ng * nb * GROUP8_BLOCK);
    assert!(out.d.len() >= ng * nb * 8 && out.sums.len() >= ng * nb * 8);
    let qs = acts.qs.as_ptr();
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    for g in 0..ng {
        for b in 0..nb {
            let gb = g * nb + b;
            let mut r = [_mm256_setzero_si256(); 8];
            for (j, v) in r.iter_mut().enumerate() {
                let i = GROUP8 * g + j;
                if i < m {
                    *v = _mm256_loadu_si256(qs.add(i * cols + 32 * b) as *const __m256i);
                }
            }
            // 8 × 8 dword transpose: step s = dword s of every row.
            let [a0, a1, a2, a3] = transpose_dwords([r[0], r[1], r[2], r[3]]);
            let [b0, b1, b2, b3] = transpose_dwords([r[4], r[5], r[6], r[7]]);
            // a_k = [r0..3 dword k | r0..3 dword 4+k], b_k likewise for rows 4..7.
            let steps = [
                _mm256_permute2x128_si256::<0x20>(a0, b0),
                _mm256_permute2x128_si256::<0x20>(a1, b1),
                _mm256_permute2x128_si256::<0x20>(a2, b2),
                _mm256_permute2x128_si256::<0x20>(a3, b3),
                _mm256_permute2x128_si256::<0x31>(a0, b0),
                _mm256_permute2x128_si256::<0x31>(a1, b1),
                _mm256_permute2x128_si256::<0x31>(a2, b2),
                _mm256_permute2x128_si256::<0x31>(a3, b3),
            ];
            let dst = out.qs.as_mut_ptr().add(gb * GROUP8_BLOCK) as *mut __m256i;
            let mut t = _mm256_setzero_si256();
            for (s, v) in steps.iter().enumerate() {
                _mm256_storeu_si256(dst.add(s), *v);
                t = _mm256_add_epi32(
                    t,
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, *v), ones16),
                );
            }
            for j in 0..8 {
                let i = GROUP8 * g + j;
                out.d[8 * gb + j] = if i < m { acts.d[i * nb + b] } else { 0.0 };
            }
            let s = _mm256_mullo_epi32(t, _mm256_set1_epi32(offset));
            _mm256_storeu_si256(out.sums.as_mut_ptr().add(8 * gb) as *mut __m256i, s);
        }
    }
}
