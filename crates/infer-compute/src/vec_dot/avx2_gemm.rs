//! AVX2 products of Q4_0/Q5_0 weight rows with four or more Q8_0 activation rows (batched
//! decode, prompts), on CPUs without AVX-512 VNNI.
//!
//! The activations are re-laid in groups of four rows ([`super::avx2_pack`]) so that each i32
//! lane of a product register accumulates one (weight row, activation row) pair over one half
//! of a block: the block's exact integer dot is two lanes added, with no horizontal sums
//! (the cost of [`super::avx2_tile`]'s gather of eight pair sums). The weight quants stay
//! unsigned (`q + 8`, `q + 16`), so one `maddubs` serves four products per lane with no sign
//! trick, and the offset is taken off as `offset·Σ q_a` (exact integers; llamafile's
//! `sgemm.cpp` does the same for Q4_0 on AVX-VNNI). Each weight block is unpacked once per
//! pass into a small buffer and reused for every activation row; a register tile is two weight
//! rows × eight activation rows. Batches of a multiple of eight rows ([`rows_times_acts8`]) take
//! groups of eight rows instead (lane = row over a whole block, eight steps of four quants, the
//! weight quants broadcast from memory): no in-lane shuffles and no halves to add, about 74
//! instead of 85 instructions per 512 products.
//!
//! Q8_0 weight rows ([`rows_times_acts_q8`]) take the same activation groups and register tile
//! with their signed quants read in place: the sign of each activation quant moves onto the
//! weight quant (`maddubs(|y|, sign(w, y))`, ggml's sign trick turned around), and each step's
//! i16 pair sums are widened before they are added. Against [`super::avx2_tile`]'s eight-row
//! Q8_0 tile this drops the eight-way transpose of the pair sums (about 110 instead of 126
//! instructions per 512 products; this host's cores retire about two vector instructions a
//! cycle in every mix measured, so the count is the cost).
//!
//! Per (weight row, activation row) pair the arithmetic is that of [`super::avx2_tile`] and
//! [`super::vnni_gemm`]: per block the exact integer dot `Σ q_w·q_a`, then
//! `acc = fma(d_w·d_a, dot, acc)` over the blocks in order from `acc = 0` — the same bits as
//! the mat-vec and as any other batch size.

use super::avx2_pack::{
    self, put_row_pair, weight_row_pair, GroupsOut, GROUP, GROUP8, GROUP8_BLOCK, GROUP_BLOCK,
};
use super::avx2_tile::q0_from_tag;
use super::{OutMat, Q8Rows};
use std::arch::x86_64::*;

/// Activation groups per pass over a task's weight rows: 64 rows, whose ~40 KB of quants
/// stay in L1/L2 while each weight row pair is swept over them.
const CHUNK_GROUPS: usize = 16;

thread_local! {
    /// [`avx2_pack::GroupsOut`] buffers and the unpacked weight pair (`crate::scratch`).
    static QS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    static D: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    static SUMS: std::cell::Cell<Vec<i32>> = const { std::cell::Cell::new(Vec::new()) };
    static WQ: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    static WD: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// [`rows_times_acts_q8`]'s activation magnitudes.
    static QA: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One activation group's re-laid data ([`avx2_pack::GroupsOut`]) from its block 0.
#[derive(Clone, Copy)]
struct Group {
    q: *const u8,
    d: *const f32,
    sums: *const i32,
}

/// Broadcast dword `S` of each 128-bit half of `w` over that half: the weight quants that
/// meet step `S` of an activation group.
#[inline(always)]
pub(super) unsafe fn step_weights<const S: i32>(w: __m256i) -> __m256i {
    match S {
        0 => _mm256_shuffle_epi32::<0x00>(w),
        1 => _mm256_shuffle_epi32::<0x55>(w),
        2 => _mm256_shuffle_epi32::<0xAA>(w),
        _ => _mm256_shuffle_epi32::<0xFF>(w),
    }
}

/// Step `S` of a block: `s[a][k] += maddubs(weight row k's step quants, group a's step S)`,
/// i16 pairs (four steps of at most 2·31·128 stay below 2¹⁵). `w`: the two weight rows'
/// unpacked block; `y[a]`: group `a`'s block.
#[inline(always)]
unsafe fn step<const S: i32, const NA: usize>(
    w: [__m256i; 2],
    y: [*const u8; NA],
    s: &mut [[__m256i; 2]; NA],
) {
    let ws = [step_weights::<S>(w[0]), step_weights::<S>(w[1])];
    for a in 0..NA {
        let ya = _mm256_loadu_si256(y[a].add(32 * S as usize) as *const __m256i);
        for k in 0..2 {
            s[a][k] = _mm256_add_epi16(s[a][k], _mm256_maddubs_epi16(ws[k], ya));
        }
    }
}

/// `NA` accumulators, lanes `j < 4` = weight row 0 · activation row `4g + j` of group `g`
/// (`groups[a]`), lanes `4 + j` = weight row 1 · the same row: the two weight rows unpacked at
/// `wq`/`wd` ([`avx2_pack::pack_weight_pair`], `nb` blocks).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `wq`/`wd` must hold `nb` packed blocks and each group
/// `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const NA: usize>(
    nb: usize,
    wq: *const u8,
    wd: *const f32,
    groups: [Group; NA],
) -> [__m256; NA] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NA];
    // The integer sums of block `b`.
    let sums_of = |b: usize| {
        let w = [
            _mm256_loadu_si256(wq.add(64 * b) as *const __m256i),
            _mm256_loadu_si256(wq.add(64 * b + 32) as *const __m256i),
        ];
        let y: [*const u8; NA] = std::array::from_fn(|a| groups[a].q.add(GROUP_BLOCK * b));
        let mut s = [[_mm256_setzero_si256(); 2]; NA];
        step::<0, NA>(w, y, &mut s);
        step::<1, NA>(w, y, &mut s);
        step::<2, NA>(w, y, &mut s);
        step::<3, NA>(w, y, &mut s);
        s
    };
    // Block `b`'s dots into the accumulators.
    let mut finish = |b: usize, s: [[__m256i; 2]; NA]| {
        let dw = _mm256_loadu_ps(wd.add(8 * b));
        for a in 0..NA {
            let i0 = _mm256_madd_epi16(s[a][0], ones);
            let i1 = _mm256_madd_epi16(s[a][1], ones);
            // [row 0: both halves added | row 1: both halves added], the offset taken off.
            let dot = _mm256_sub_epi32(
                _mm256_add_epi32(
                    _mm256_permute2x128_si256::<0x20>(i0, i1),
                    _mm256_permute2x128_si256::<0x31>(i0, i1),
                ),
                _mm256_loadu_si256(groups[a].sums.add(8 * b) as *const __m256i),
            );
            let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(groups[a].d.add(8 * b)));
            acc[a] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[a]);
        }
    };
    if nb == 0 {
        return acc;
    }
    // Software-pipelined: block b's products are issued before block b − 1's reduction, so
    // that the long reduction chain overlaps the next block's multiplies.
    let mut prev = sums_of(0);
    for b in 1..nb {
        let s = sums_of(b);
        finish(b - 1, prev);
        prev = s;
    }
    finish(nb - 1, prev);
    acc
}

/// Element (r, i) of `out` = `W_r · A_i` for the Q4_0 or Q5_0 weight rows `ws` (format tag
/// `F`; `row_bytes` each, `nb = acts.cols / 32` blocks) and every row of `acts`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `ws` must be whole rows of at least `nb` blocks,
/// `acts` must hold `m·cols` quants and `m·nb` scales, and `out` must own elements (r, i) for
/// every row r and i < `acts.m` ([`OutMat::put`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_times_acts<const F: u8>(
    ws: &[u8],
    row_bytes: usize,
    acts: &Q8Rows,
    out: OutMat,
) {
    let fmt = q0_from_tag(F);
    let (m, nb) = (acts.m, acts.cols / 32);
    let ng = m.div_ceil(GROUP);
    let n_rows = ws.len() / row_bytes;
    let mut qs = crate::scratch::take(&QS, ng * nb * GROUP_BLOCK);
    let mut d = crate::scratch::take(&D, ng * nb * 8);
    let mut sums = crate::scratch::take(&SUMS, ng * nb * 8);
    let mut wq = crate::scratch::take(&WQ, 64 * nb);
    let mut wd = crate::scratch::take(&WD, 8 * nb);
    let out_groups = GroupsOut {
        qs: &mut qs,
        d: &mut d,
        sums: &mut sums,
    };
    avx2_pack::pack_groups(acts, avx2_pack::weight_offset(fmt), out_groups);
    let group = |g: usize| Group {
        q: qs.as_ptr().add(g * nb * GROUP_BLOCK),
        d: d.as_ptr().add(g * nb * 8),
        sums: sums.as_ptr().add(g * nb * 8),
    };
    let put = |v: __m256, r0: usize, r1: usize, g: usize| put_row_pair(out, v, r0, r1, g, m);
    for g0 in (0..ng).step_by(CHUNK_GROUPS) {
        let g1 = (g0 + CHUNK_GROUPS).min(ng);
        for r0 in (0..n_rows).step_by(2) {
            let (r1, rows) = weight_row_pair(ws, row_bytes, r0);
            avx2_pack::pack_weight_pair(fmt, nb, rows, wq.as_mut_ptr(), wd.as_mut_ptr());
            let mut g = g0;
            while g1 - g >= 2 {
                let v = tile::<2>(nb, wq.as_ptr(), wd.as_ptr(), [group(g), group(g + 1)]);
                put(v[0], r0, r1, g);
                put(v[1], r0, r1, g + 1);
                g += 2;
            }
            if g < g1 {
                let [v] = tile::<1>(nb, wq.as_ptr(), wd.as_ptr(), [group(g)]);
                put(v, r0, r1, g);
            }
        }
    }
    crate::scratch::give(&QS, qs);
    crate::scratch::give(&D, d);
    crate::scratch::give(&SUMS, sums);
    crate::scratch::give(&WQ, wq);
    crate::scratch::give(&WD, wd);
}

/// Step `S` of a Q8_0 block: `s[a][k] += madd(maddubs(|y_a|, sign(w_k, y_a)), 1)` — the sign
/// of each activation quant moved onto the (signed) weight quant, so that `maddubs` sees the
/// unsigned `|y|`; its i16 pair sums (at most 2·127·127) are widened before they are added.
/// `w`: the two weight rows' block quants; `y[a]`: group `a`'s block, `ya[a]` its magnitudes.
#[inline(always)]
unsafe fn step_q8<const S: i32, const NA: usize>(
    w: [__m256i; 2],
    y: [*const u8; NA],
    ya: [*const u8; NA],
    s: &mut [[__m256i; 2]; NA],
) {
    let ones = _mm256_set1_epi16(1);
    let ws = [step_weights::<S>(w[0]), step_weights::<S>(w[1])];
    for a in 0..NA {
        let abs = _mm256_loadu_si256(ya[a].add(32 * S as usize) as *const __m256i);
        for k in 0..2 {
            let ys = _mm256_loadu_si256(y[a].add(32 * S as usize) as *const __m256i);
            let p = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(ws[k], ys));
            s[a][k] = _mm256_add_epi32(s[a][k], _mm256_madd_epi16(p, ones));
        }
    }
}

/// [`tile`] for Q8_0 weight rows read in place (`rows[k]`: row `k`'s block 0; the quants of
/// block `b` at `34·b + 2`), their scales unpacked at `wd` ([`pack_q8_scales`]): `NA`
/// accumulators, lanes `j < 4` = weight row 0 · activation row `4g + j` of group `g`
/// (`groups[a]`), lanes `4 + j` = weight row 1 · the same row. No offset: the quants are signed.
///
/// # Safety
/// AVX2, FMA and F16C must be available; each row must hold `nb` Q8_0 blocks, `wd` `8·nb`
/// scales and each group `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q8<const NA: usize>(
    nb: usize,
    rows: [*const u8; 2],
    wd: *const f32,
    groups: [Group; NA],
    abs: [*const u8; NA],
) -> [__m256; NA] {
    const BB: usize = infer_quant::q8_0::BLOCK_BYTES;
    const QS: usize = infer_quant::q8_0::QS_OFFSET;
    let mut acc = [_mm256_setzero_ps(); NA];
    // The integer sums of block `b`.
    let sums_of = |b: usize| {
        let w = [
            _mm256_loadu_si256(rows[0].add(BB * b + QS) as *const __m256i),
            _mm256_loadu_si256(rows[1].add(BB * b + QS) as *const __m256i),
        ];
        let (mut y, mut ya) = ([std::ptr::null::<u8>(); NA], [std::ptr::null::<u8>(); NA]);
        for a in 0..NA {
            y[a] = groups[a].q.add(GROUP_BLOCK * b);
            ya[a] = abs[a].add(GROUP_BLOCK * b);
        }
        let mut s = [[_mm256_setzero_si256(); 2]; NA];
        step_q8::<0, NA>(w, y, ya, &mut s);
        step_q8::<1, NA>(w, y, ya, &mut s);
        step_q8::<2, NA>(w, y, ya, &mut s);
        step_q8::<3, NA>(w, y, ya, &mut s);
        s
    };
    // Block `b`'s dots into the accumulators.
    let mut finish = |b: usize, s: [[__m256i; 2]; NA]| {
        let dw = _mm256_loadu_ps(wd.add(8 * b));
        for a in 0..NA {
            // [row 0: both halves added | row 1: both halves added].
            let dot = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(s[a][0], s[a][1]),
                _mm256_permute2x128_si256::<0x31>(s[a][0], s[a][1]),
            );
            let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(groups[a].d.add(8 * b)));
            acc[a] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[a]);
        }
    };
    if nb == 0 {
        return acc;
    }
    // Software-pipelined as `tile`.
    let mut prev = sums_of(0);
    for b in 1..nb {
        let s = sums_of(b);
        finish(b - 1, prev);
        prev = s;
    }
    finish(nb - 1, prev);
    acc
}

/// The scales of blocks `0..nb` of the Q8_0 rows `rows` as `d[8b + l]` = block `b`'s scale of
/// row `l / 4` (the layout of [`avx2_pack::pack_weight_pair`]'s scales).
///
/// # Safety
/// F16C must be available; both rows must hold `nb` Q8_0 blocks and `d` room for `8·nb` f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn pack_q8_scales(nb: usize, rows: [*const u8; 2], d: *mut f32) {
    const BB: usize = infer_quant::q8_0::BLOCK_BYTES;
    let pick = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for b in 0..nb {
        let h0 = u32::from((rows[0].add(BB * b) as *const u16).read_unaligned());
        let h1 = u32::from((rows[1].add(BB * b) as *const u16).read_unaligned());
        let v = _mm256_cvtph_ps(_mm_cvtsi32_si128((h0 | h1 << 16) as i32));
        _mm256_storeu_ps(d.add(8 * b), _mm256_permutevar8x32_ps(v, pick));
    }
}

/// [`rows_times_acts`] for Q8_0 weight rows (`row_bytes` each, `nb = acts.cols / 32` blocks):
/// the same activation groups (no offset), each row pair's quants read in place and reused for
/// every group of a pass.
///
/// # Safety
/// As [`rows_times_acts`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_times_acts_q8(ws: &[u8], row_bytes: usize, acts: &Q8Rows, out: OutMat) {
    let (m, nb) = (acts.m, acts.cols / 32);
    let ng = m.div_ceil(GROUP);
    let n_rows = ws.len() / row_bytes;
    let mut qs = crate::scratch::take(&QS, ng * nb * GROUP_BLOCK);
    let mut d = crate::scratch::take(&D, ng * nb * 8);
    let mut sums = crate::scratch::take(&SUMS, ng * nb * 8);
    let mut wd = crate::scratch::take(&WD, 8 * nb);
    let out_groups = GroupsOut {
        qs: &mut qs,
        d: &mut d,
        sums: &mut sums,
    };
    avx2_pack::pack_groups(acts, 0, out_groups);
    // The magnitudes of the re-laid quants (`maddubs`'s unsigned operand), once per product.
    let mut qa = crate::scratch::take(&QA, ng * nb * GROUP_BLOCK);
    for (a, q) in qa[..ng * nb * GROUP_BLOCK]
        .chunks_exact_mut(32)
        .zip(qs.chunks_exact(32))
    {
        let v = _mm256_loadu_si256(q.as_ptr() as *const __m256i);
        _mm256_storeu_si256(a.as_mut_ptr() as *mut __m256i, _mm256_sign_epi8(v, v));
    }
    let abs = |g: usize| qa.as_ptr().add(g * nb * GROUP_BLOCK);
    let group = |g: usize| Group {
        q: qs.as_ptr().add(g * nb * GROUP_BLOCK),
        d: d.as_ptr().add(g * nb * 8),
        sums: sums.as_ptr().add(g * nb * 8),
    };
    let put = |v: __m256, r0: usize, r1: usize, g: usize| put_row_pair(out, v, r0, r1, g, m);
    for g0 in (0..ng).step_by(CHUNK_GROUPS) {
        let g1 = (g0 + CHUNK_GROUPS).min(ng);
        for r0 in (0..n_rows).step_by(2) {
            let (r1, rows) = weight_row_pair(ws, row_bytes, r0);
            pack_q8_scales(nb, rows, wd.as_mut_ptr());
            let mut g = g0;
            while g1 - g >= 2 {
                let v = tile_q8::<2>(
                    nb,
                    rows,
                    wd.as_ptr(),
                    [group(g), group(g + 1)],
                    [abs(g), abs(g + 1)],
                );
                put(v[0], r0, r1, g);
                put(v[1], r0, r1, g + 1);
                g += 2;
            }
            if g < g1 {
                let [v] = tile_q8::<1>(nb, rows, wd.as_ptr(), [group(g)], [abs(g)]);
                put(v, r0, r1, g);
            }
        }
    }
    crate::scratch::give(&QS, qs);
    crate::scratch::give(&D, d);
    crate::scratch::give(&SUMS, sums);
    crate::scratch::give(&WD, wd);
    crate::scratch::give(&QA, qa);
}

/// Two weight rows (unpacked at `wq`/`wd`, [`avx2_pack::pack_weight_pair`]) against one group of
/// eight activation rows ([`avx2_pack::pack_groups8`]): lane `j` of result `k` = weight row `k`
/// · activation row `8g + j`. Eight steps of four quants per block, the weight quants
/// broadcast from memory; the i16 sums of steps 0–3 and 4–7 kept apart (eight steps of
/// `2·31·128` would overflow).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `wq`/`wd` must hold `nb` packed blocks and the group
/// `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile8(nb: usize, wq: *const u8, wd: *const f32, g: Group) -> [__m256; 2] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 2];
    let sums_of = |b: usize| {
        let w = wq.add(64 * b);
        let y = g.q.add(GROUP8_BLOCK * b);
        let mut s = [[_mm256_setzero_si256(); 2]; 2];
        for st in 0..8 {
            let ys = _mm256_loadu_si256(y.add(32 * st) as *const __m256i);
            for (k, sk) in s[st / 4].iter_mut().enumerate() {
                let wb = _mm256_set1_epi32((w.add(32 * k + 4 * st) as *const i32).read_unaligned());
                *sk = _mm256_add_epi16(*sk, _mm256_maddubs_epi16(wb, ys));
            }
        }
        s
    };
    let mut finish = |b: usize, s: [[__m256i; 2]; 2]| {
        let da = _mm256_loadu_ps(g.d.add(8 * b));
        let off = _mm256_loadu_si256(g.sums.add(8 * b) as *const __m256i);
        for k in 0..2 {
            let dot = _mm256_sub_epi32(
                _mm256_add_epi32(
                    _mm256_madd_epi16(s[0][k], ones),
                    _mm256_madd_epi16(s[1][k], ones),
                ),
                off,
            );
            let scale = _mm256_mul_ps(_mm256_broadcast_ss(&*wd.add(8 * b + 4 * k)), da);
            acc[k] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[k]);
        }
    };
    if nb == 0 {
        return acc;
    }
    let mut prev = sums_of(0);
    for b in 1..nb {
        let s = sums_of(b);
        finish(b - 1, prev);
        prev = s;
    }
    finish(nb - 1, prev);
    acc
}

/// [`rows_times_acts`] through groups of eight activation rows ([`tile8`]); `acts.m` must be a
/// multiple of eight.
///
/// # Safety
/// As [`rows_times_acts`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_times_acts8<const F: u8>(
    ws: &[u8],
    row_bytes: usize,
    acts: &Q8Rows,
    out: OutMat,
) {
    let fmt = q0_from_tag(F);
    let (m, nb) = (acts.m, acts.cols / 32);
    debug_assert!(m % GROUP8 == 0);
    let ng = m / GROUP8;
    let n_rows = ws.len() / row_bytes;
    let mut qs = crate::scratch::take(&QS, ng * nb * GROUP8_BLOCK);
    let mut d = crate::scratch::take(&D, ng * nb * 8);
    let mut sums = crate::scratch::take(&SUMS, ng * nb * 8);
    let mut wq = crate::scratch::take(&WQ, 64 * nb);
    let mut wd = crate::scratch::take(&WD, 8 * nb);
    let out_groups = GroupsOut {
        qs: &mut qs,
        d: &mut d,
        sums: &mut sums,
    };
    avx2_pack::pack_groups8(acts, avx2_pack::weight_offset(fmt), out_groups);
    let group = |g: usize| Group {
        q: qs.as_ptr().add(g * nb * GROUP8_BLOCK),
        d: d.as_ptr().add(g * nb * 8),
        sums: sums.as_ptr().add(g * nb * 8),
    };
    const CHUNK8: usize = CHUNK_GROUPS * GROUP / GROUP8;
    for g0 in (0..ng).step_by(CHUNK8) {
        let g1 = (g0 + CHUNK8).min(ng);
        for r0 in (0..n_rows).step_by(2) {
            let (r1, rows) = weight_row_pair(ws, row_bytes, r0);
            avx2_pack::pack_weight_pair(fmt, nb, rows, wq.as_mut_ptr(), wd.as_mut_ptr());
            for g in g0..g1 {
                let v = tile8(nb, wq.as_ptr(), wd.as_ptr(), group(g));
                let (mut l0, mut l1) = ([0f32; 8], [0f32; 8]);
                _mm256_storeu_ps(l0.as_mut_ptr(), v[0]);
                _mm256_storeu_ps(l1.as_mut_ptr(), v[1]);
                for j in 0..GROUP8 {
                    out.put(r0, GROUP8 * g + j, l0[j]);
                    if r1 != r0 {
                        out.put(r1, GROUP8 * g + j, l1[j]);
                    }
                }
            }
        }
    }
    crate::scratch::give(&QS, qs);
    crate::scratch::give(&D, d);
    crate::scratch::give(&SUMS, sums);
    crate::scratch::give(&WQ, wq);
    crate::scratch::give(&WD, wd);
}
