//! Products of Q4_0x16 weights (Q4_0 re-laid sixteen rows per group, `infer_quant::interleave`)
//! with Q8_0 activation rows ([`Q8Rows`]), group by group. Every output is bit for bit the one
//! the same rows give as plain Q4_0 on the same CPU (the kernels repeat that CPU's integers and
//! f32 order):
//! - AVX-512 VNNI (the f32 order of [`super::vnni_gemm`]: exact integer block dots, then
//!   `acc = fma(d_w·d_a, dot, acc)` over the blocks in order): fewer than
//!   [`vnni_gemm::DIRECT_BELOW`] activation rows read the stored chunks straight into
//!   `vpdpbusd` (dword lane `r` = row `r`: four loads per block and sixteen rows, no transpose,
//!   no reduction across lanes); more rows unpack each group block into the transposed blocks
//!   the int8 tile GEMM reads (two masks per chunk where plain rows need a transpose).
//! - AVX2 (the same f32 order, [`super::avx2_tile`]): one activation row keeps each row's block
//!   dot in a lane of a register whose lanes are eight rows ([`half_avx2`]); several rows un-lay
//!   each group into plain rows for the tile kernel (the same kernel, the same bits).

use super::avx2_tile::{self, Q0};
use super::vnni_gemm::{self, TBlock, WIDE};
use super::{OutMat, Q8Rows};
use crate::scratch;
use infer_quant::q4_0;
use std::arch::x86_64::*;
use std::cell::Cell;

/// Rows per group.
pub(crate) const ROWS: usize = 16;
/// Bytes of one group block: sixteen f16 scales, then four chunks of sixteen dwords.
pub(crate) const GROUP_BLOCK: usize = ROWS * q4_0::BLOCK_BYTES;
/// Byte offset of chunk 0 in a group block.
const CHUNKS: usize = 2 * ROWS;

thread_local! {
    static BLOCKS: Cell<Vec<TBlock>> = const { Cell::new(Vec::new()) };
    static SUMS: Cell<Vec<i32>> = const { Cell::new(Vec::new()) };
    static PLAIN: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Element (r, i) of `out` = `W_r · A_i` for the whole groups `ws` (`ws.len() / (nb ·`
/// [`GROUP_BLOCK`]`)` groups of `nb = acts.cols / 32` blocks) and every activation row of
/// `acts`.
///
/// Panics if `ws` is not whole groups of `acts.cols / 32` blocks.
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`super::avx2_available`]); `out` must own elements
/// (r, i) for every r < 16 · groups and i < `acts.m` ([`OutMat::put`]).
pub(crate) unsafe fn groups_times_acts(ws: &[u8], acts: &Q8Rows, out: OutMat) {
    let nb = acts.cols / 32;
    let gb = nb * GROUP_BLOCK;
    assert!(
        gb > 0 && ws.len().is_multiple_of(gb),
        "Q4_0x16: {} bytes are not whole groups of {nb} blocks",
        ws.len()
    );
    assert!(acts.qs.len() >= acts.m * acts.cols && acts.d.len() >= acts.m * nb);
    if acts.m == 0 {
        return;
    }
    if avx2_tile::vnni_available() {
        return groups_vnni(ws, nb, acts, out);
    }
    if acts.m == 1 {
        return groups_avx2_one(ws, nb, acts, out);
    }
    // Several activation rows: the plain tile kernel on each group un-laid.
    let rb = nb * q4_0::BLOCK_BYTES;
    let mut plain = scratch::take(&PLAIN, ROWS * rb);
    for (g, group) in ws.chunks_exact(gb).enumerate() {
        let plain = &mut plain[..ROWS * rb];
        unlay_group(group, nb, plain);
        avx2_tile::rows_times_acts(Q0::Q4_0, plain, rb, acts, out.at_row(g * ROWS));
    }
    scratch::give(&PLAIN, plain);
}

/// The sixteen plain Q4_0 rows (`nb` blocks each) of one group, into `out`.
fn unlay_group(group: &[u8], nb: usize, out: &mut [u8]) {
    let rb = nb * q4_0::BLOCK_BYTES;
    for (b, gblk) in group.chunks_exact(GROUP_BLOCK).enumerate() {
        for r in 0..ROWS {
            let blk = &mut out[r * rb + b * q4_0::BLOCK_BYTES..][..q4_0::BLOCK_BYTES];
            blk[..2].copy_from_slice(&gblk[2 * r..2 * r + 2]);
            for k in 0..4 {
                let at = CHUNKS + 64 * k + 4 * r;
                blk[2 + 4 * k..6 + 4 * k].copy_from_slice(&gblk[at..at + 4]);
            }
        }
    }
}

/// [`groups_times_acts`] with AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn groups_vnni(ws: &[u8], nb: usize, acts: &Q8Rows, out: OutMat) {
    let mut sums = scratch::take(&SUMS, acts.m * nb);
    for (s, q) in sums
        .iter_mut()
        .zip(acts.qs[..acts.m * acts.cols].chunks_exact(32))
    {
        *s = vnni_gemm::block_sum(q.as_ptr());
    }
    let gb = nb * GROUP_BLOCK;
    if acts.m < vnni_gemm::DIRECT_BELOW {
        for (g, group) in ws.chunks_exact(gb).enumerate() {
            match acts.m {
                1 => direct_vnni::<1>(group.as_ptr(), nb, acts, &sums, (out, g * ROWS)),
                2 => direct_vnni::<2>(group.as_ptr(), nb, acts, &sums, (out, g * ROWS)),
                _ => direct_vnni::<3>(group.as_ptr(), nb, acts, &sums, (out, g * ROWS)),
            }
        }
    } else {
        // Q4_0's offset (+8) as the tile GEMM's shift: log2(8).
        const SHIFT: u32 = 3;
        let mut blocks = scratch::take(&BLOCKS, nb);
        for (g, group) in ws.chunks_exact(gb).enumerate() {
            unpack_group_vnni(group.as_ptr(), &mut blocks[..nb]);
            let bl = &blocks[..nb];
            let at = (out, g * ROWS, WIDE);
            let i = vnni_gemm::tiles::<{ vnni_gemm::TILE }>(bl, SHIFT, acts, &sums, 0, at);
            let i = vnni_gemm::tiles::<4>(bl, SHIFT, acts, &sums, i, at);
            vnni_gemm::tiles::<1>(bl, SHIFT, acts, &sums, i, at);
        }
        scratch::give(&BLOCKS, blocks);
    }
    scratch::give(&SUMS, sums);
}

/// The group's blocks as the tile GEMM's transposed blocks: register `k < 4` = chunk `k`'s low
/// nibbles (values `4k..4k+4` of every row), `4 + k` its high nibbles (`16+4k..`); the scales
/// widened.
#[inline(always)]
unsafe fn unpack_group_vnni(group: *const u8, out: &mut [TBlock]) {
    let nibble = _mm512_set1_epi8(0x0f);
    for (b, tb) in out.iter_mut().enumerate() {
        let p = group.add(b * GROUP_BLOCK);
        for k in 0..4 {
            let x = _mm512_loadu_si512(p.add(CHUNKS + 64 * k) as *const _);
            let lo = _mm512_and_si512(x, nibble);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), nibble);
            _mm512_store_si512(tb.quants[k].as_mut_ptr() as *mut _, lo);
            _mm512_store_si512(tb.quants[4 + k].as_mut_ptr() as *mut _, hi);
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
        _mm512_store_ps(tb.scales.as_mut_ptr(), d);
    }
}

/// Group blocks prefetched ahead of the one being read.
const AHEAD: usize = 16;

/// The sixteen outputs of the group at `group` for the `N` activation rows of `acts` (`sums`:
/// their block quant sums), straight from the stored chunks.
#[inline(always)]
unsafe fn direct_vnni<const N: usize>(
    group: *const u8,
    nb: usize,
    acts: &Q8Rows,
    sums: &[i32],
    (out, g): (OutMat, usize),
) {
    let nibble = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let p = group.add(b * GROUP_BLOCK);
        let ahead = p.wrapping_add(AHEAD * GROUP_BLOCK);
        for line in 0..GROUP_BLOCK.div_ceil(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
        }
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
        let mut w = [_mm512_setzero_si512(); 8];
        for k in 0..4 {
            let x = _mm512_loadu_si512(p.add(CHUNKS + 64 * k) as *const _);
            w[k] = _mm512_and_si512(x, nibble);
            w[4 + k] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), nibble);
        }
        for (j, acc) in acc.iter_mut().enumerate() {
            let a = acts.qs.as_ptr().add(j * acts.cols + b * 32) as *const i32;
            let act = |k: usize| _mm512_set1_epi32(a.add(k).read_unaligned());
            // Two chains of four: the same exact integer as one chain of eight.
            let mut s = [
                _mm512_set1_epi32(-(sums[j * nb + b] << 3)),
                _mm512_setzero_si512(),
            ];
            for (k, wk) in w.iter().enumerate() {
                s[k & 1] = _mm512_dpbusd_epi32(s[k & 1], *wk, act(k));
            }
            let dot = _mm512_add_epi32(s[0], s[1]);
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(acts.d[j * nb + b]));
            *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), *acc);
        }
    }
    for (j, v) in acc.into_iter().enumerate() {
        vnni_gemm::put_wide(out, g, j, WIDE, v);
    }
}

/// [`groups_times_acts`] for one activation row with AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_avx2_one(ws: &[u8], nb: usize, acts: &Q8Rows, out: OutMat) {
    // 8 · (the sum of activation quants 4l..4l+4) for lane l of each block: Q4_0's offset.
    let mut sums = scratch::take(&SUMS, nb * 8);
    for (s, q) in sums.iter_mut().zip(acts.qs[..acts.cols].chunks_exact(4)) {
        *s = 8 * q.iter().map(|&v| v as i32).sum::<i32>();
    }
    let gb = nb * GROUP_BLOCK;
    for (g, group) in ws.chunks_exact(gb).enumerate() {
        for half in 0..2 {
            let v = half_avx2(group.as_ptr(), nb, half, acts, &sums);
            put8(out, g * ROWS + 8 * half, v);
        }
    }
    scratch::give(&SUMS, sums);
}

/// Outputs (r0 + r, 0) of `out` = lane `r` of `v`.
#[inline(always)]
unsafe fn put8(out: OutMat, r0: usize, v: __m256) {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    for (r, &x) in lanes.iter().enumerate() {
        out.put(r0 + r, 0, x);
    }
}

/// Rows `8·half..8·half + 8` of a group times one activation row, lane `r` = row `8·half + r`:
/// the arithmetic of `avx2_tile` per row (the exact integer block dot, then
/// `acc = fma(d_w·d_a, dot, acc)` over the blocks in order). Register `l` of a block holds the
/// exact integer `Σ q_w·q_a` over values `4l..4l+4` of the block's unpacked order (chunk `l`'s
/// low nibbles for `l < 4`, chunk `l − 4`'s high ones after); their sum is the block dot.
#[inline(always)]
unsafe fn half_avx2(
    group: *const u8,
    nb: usize,
    half: usize,
    acts: &Q8Rows,
    sums: &[i32],
) -> __m256 {
    let nibble = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let aq = acts.qs.as_ptr() as *const i32;
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = group.add(b * GROUP_BLOCK);
        if half == 0 {
            super::prefetch_stream(blk, GROUP_BLOCK);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i));
        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(acts.d[b]));
        let mut dot = [_mm256_setzero_si256(); 2];
        for k in 0..4 {
            let x = _mm256_loadu_si256(blk.add(CHUNKS + 64 * k + 32 * half) as *const __m256i);
            let lo = _mm256_and_si256(x, nibble);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), nibble);
            for (c, (l, u)) in [(k, lo), (4 + k, hi)].into_iter().enumerate() {
                let a = _mm256_set1_epi32(aq.add(b * 8 + l).read_unaligned());
                let d = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones);
                dot[c] = _mm256_add_epi32(
                    dot[c],
                    _mm256_sub_epi32(d, _mm256_set1_epi32(sums[b * 8 + l])),
                );
            }
        }
        let dot = _mm256_add_epi32(dot[0], dot[1]);
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every output of the group kernels equals the plain Q4_0 tile kernel's on the same rows un-laid,
    /// bit for bit, for 1 to 21 activation rows and odd and even block counts (whatever
    /// instruction set this CPU takes: VNNI or AVX2).
    #[test]
    fn groups_equal_plain_q4_0_bit_for_bit() {
        if !super::super::avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut next = super::super::xorshift(0x2545_f491_4f6c_dd1d);
        for (nb, groups, m) in [
            (1usize, 1usize, 1usize),
            (3, 2, 1),
            (18, 1, 2),
            (5, 3, 3),
            (4, 2, 4),
            (2, 1, 21),
        ] {
            let rows = groups * ROWS;
            let cols = nb * 32;
            let plain: Vec<u8> = (0..rows * nb * 18)
                .map(|k| {
                    if k % 18 == 1 {
                        next() as u8 & 0x3b
                    } else {
                        next() as u8
                    }
                })
                .collect();
            let x = infer_quant::interleave::from_rows(
                infer_quant::QuantFormat::Q4_0x16,
                &plain,
                rows,
                cols,
            )
            .unwrap();
            let xs: Vec<f32> = (0..m * cols)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let acts = Q8Rows::quantize(&xs, m, cols).unwrap();
            let (mut want, mut got) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
            // SAFETY: AVX2 detected; whole rows/groups of nb blocks; outputs m × rows.
            unsafe {
                avx2_tile::rows_times_acts(
                    Q0::Q4_0,
                    &plain,
                    nb * 18,
                    &acts,
                    OutMat::rows_last(&mut want, m, rows),
                );
                groups_times_acts(&x, &acts, OutMat::rows_last(&mut got, m, rows));
            }
            for (k, (a, b)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "nb={nb} m={m} output {k}: {a} vs {b}"
                );
            }
        }
    }
}
