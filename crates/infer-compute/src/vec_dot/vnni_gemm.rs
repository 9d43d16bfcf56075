//! AVX-512 VNNI products of Q4_0 / Q5_0 / Q8_0 (and the seed's split Q8) weights with Q8_0
//! activation rows ([`super::Q8Rows`]), sixteen weight rows at a time.
//!
//! Sixteen rows' blocks are unpacked to unsigned bytes and transposed (once per group of rows
//! and product, into a per-thread buffer) so that dword lane `r` of 512-bit register `k` holds
//! row `r`'s quants `4k..4k+3`. One `vpdpbusd` with an activation dword broadcast then advances
//! the block dot of all sixteen rows, and one FMA per block and activation row scales and
//! accumulates the sixteen dots: the layout of llama.cpp's repacked `ggml_gemm_q4_0_8x8_q8_0`
//! (ggml-cpu `repack.cpp`) at twice its width, built per product instead of stored. (With eight
//! rows in 256-bit registers a Llama-3.2-1B Q4_0 prompt ran at 0.77–0.84× llama.cpp; the
//! sixteen-row groups use the full width of CPUs with 512-bit units.) Fewer than
//! [`DIRECT_BELOW`] activation rows take eight rows at a time straight from the weights
//! ([`group_direct`]).
//!
//! Signed weights become unsigned by an offset (Q4_0 `+8`, Q5_0 `+16`, Q8_0 `+128`); the offset
//! times the activation block's quant sum starts the integer accumulator, so every block dot is
//! the exact integer `Σ q_w·q_a`. Each output is then the same f32 sequence whatever the number
//! of activation rows or the row's place in a group: `acc = fma(d_w·d_a, dot_b, acc)` over the
//! blocks in order from `acc = 0` (ggml's scalar `vec_dot_q8_0_q8_0` order), so a mat-vec and
//! any row of a mat-mat give the same bits.

use super::avx2_tile::{block_bytes, bytes_from_nibbles_32, Q0};
use super::{OutMat, Q8Rows};
use crate::scratch;
use infer_quant::{q4_0, q5_0, q8_0};
use std::arch::x86_64::*;
use std::cell::Cell;

/// Weight rows per group of the direct path and per eight-row transpose ([`transpose8`]): one
/// dword lane per row of a 256-bit register.
pub(super) const GROUP: usize = 8;
/// Weight rows per transposed group: one dword lane per row of a 512-bit register.
pub(super) const WIDE: usize = 16;
/// Activation rows per tile: 16 accumulators + 8 weight registers of the 32.
pub(super) const TILE: usize = 16;
/// Below this many activation rows, groups are multiplied straight from the weight blocks
/// ([`group_direct`]); from it on, transposed once per group ([`prepare_group`]).
pub(super) const DIRECT_BELOW: usize = 4;

/// One transposed block of a group: eight 512-bit registers of unsigned quants (lane `r`:
/// row `r`), then the sixteen rows' f32 scales. 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct TBlock {
    pub(super) quants: [[u8; 64]; 8],
    pub(super) scales: [f32; WIDE],
}

impl Default for TBlock {
    fn default() -> Self {
        TBlock {
            quants: [[0; 64]; 8],
            scales: [0.0; WIDE],
        }
    }
}

thread_local! {
    /// The current group's transposed blocks, and the activation blocks' quant sums.
    static BLOCKS: Cell<Vec<TBlock>> = const { Cell::new(Vec::new()) };
    static SUMS: Cell<Vec<i32>> = const { Cell::new(Vec::new()) };
}

/// log2 of the offset that makes a weight quant of `fmt` unsigned.
const fn offset_shift(fmt: Q0) -> u32 {
    match fmt {
        Q0::Q4_0 => 3,
        Q0::Q5_0 => 4,
        Q0::Q8_0 | Q0::Q8S => 7,
    }
}

/// 32 signed bytes + 128, as unsigned bytes.
#[inline(always)]
unsafe fn flip(q: *const u8) -> __m256i {
    let q = _mm256_loadu_si256(q as *const __m256i);
    _mm256_xor_si256(q, _mm256_set1_epi8(i8::MIN))
}

/// The 32 quants of the block at `xb` plus the format's offset, as unsigned bytes.
/// (No closures in the kernels: a closure would not inherit the target features and its
/// intrinsics would not be inlined.)
#[inline(always)]
unsafe fn unpack_unsigned(fmt: Q0, xb: *const u8) -> __m256i {
    match fmt {
        Q0::Q4_0 => bytes_from_nibbles_32(xb.add(q4_0::QS_OFFSET)),
        Q0::Q5_0 => {
            // u = nibble + 16·(fifth bit).
            let hi = _cvtu32_mask32((xb.add(q5_0::QH_OFFSET) as *const u32).read_unaligned());
            let n = bytes_from_nibbles_32(xb.add(q5_0::QS_OFFSET));
            _mm256_mask_add_epi8(n, hi, n, _mm256_set1_epi8(16))
        }
        Q0::Q8_0 => flip(xb.add(q8_0::QS_OFFSET)),
        Q0::Q8S => flip(xb),
    }
}

/// The sum of the 32 signed bytes at `q`: `Σ (q + 128) − 4096` with `vpsadbw`.
#[inline(always)]
pub(super) unsafe fn block_sum(q: *const i8) -> i32 {
    let u = flip(q as *const u8);
    let s = _mm256_sad_epu8(u, _mm256_setzero_si256());
    let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as i32 - 4096
}

/// 8 × 8 transpose of 32-bit lanes: lane `r` of output `k` = lane `k` of input `r`.
#[inline(always)]
pub(super) unsafe fn transpose8(u: &[__m256i; 8]) -> [__m256i; 8] {
    // t: row pairs (0,1), (2,3), (4,5), (6,7) interleaved; lo = k ∈ {0,1 | 4,5}, hi = {2,3 | 6,7}.
    let (t0, t1) = (
        _mm256_unpacklo_epi32(u[0], u[1]),
        _mm256_unpackhi_epi32(u[0], u[1]),
    );
    let (t2, t3) = (
        _mm256_unpacklo_epi32(u[2], u[3]),
        _mm256_unpackhi_epi32(u[2], u[3]),
    );
    let (t4, t5) = (
        _mm256_unpacklo_epi32(u[4], u[5]),
        _mm256_unpackhi_epi32(u[4], u[5]),
    );
    let (t6, t7) = (
        _mm256_unpacklo_epi32(u[6], u[7]),
        _mm256_unpackhi_epi32(u[6], u[7]),
    );
    // s_k: rows 0-3 (or 4-7) at k (low 128 bits) and k + 4 (high 128 bits).
    let (s0, s1) = (_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2));
    let (s2, s3) = (_mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3));
    let (s4, s5) = (_mm256_unpacklo_epi64(t4, t6), _mm256_unpackhi_epi64(t4, t6));
    let (s6, s7) = (_mm256_unpacklo_epi64(t5, t7), _mm256_unpackhi_epi64(t5, t7));
    [
        _mm256_permute2x128_si256::<0x20>(s0, s4),
        _mm256_permute2x128_si256::<0x20>(s1, s5),
        _mm256_permute2x128_si256::<0x20>(s2, s6),
        _mm256_permute2x128_si256::<0x20>(s3, s7),
        _mm256_permute2x128_si256::<0x31>(s0, s4),
        _mm256_permute2x128_si256::<0x31>(s1, s5),
        _mm256_permute2x128_si256::<0x31>(s2, s6),
        _mm256_permute2x128_si256::<0x31>(s3, s7),
    ]
}

/// The unsigned quants of block `b` of the eight rows `rows` (`bb` bytes per block).
#[inline(always)]
unsafe fn unpack8(fmt: Q0, rows: &[*const u8; GROUP], b: usize, bb: usize) -> [__m256i; 8] {
    let mut u = [_mm256_setzero_si256(); GROUP];
    for r in 0..GROUP {
        u[r] = unpack_unsigned(fmt, rows[r].add(b * bb));
    }
    u
}

/// The f32 scales of block `b` of the eight rows: f16 `d` widened, or the split Q8's f32 `wd`.
#[inline(always)]
unsafe fn scales_at(
    fmt: Q0,
    rows: &[*const u8; GROUP],
    wd: &[*const f32; GROUP],
    b: usize,
    bb: usize,
) -> __m256 {
    if fmt == Q0::Q8S {
        let f = |r: usize| *wd[r].add(b);
        return _mm256_setr_ps(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7));
    }
    let h = |r: usize| (rows[r].add(b * bb) as *const i16).read_unaligned();
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

/// The weights stream from memory and a group's rows are as many streams, which the hardware
/// prefetchers follow poorly: block `b` of a group fetches the `b`-th share of the next group
/// (the `n` rows after `rows`, `row_bytes` apart; `bb` bytes per block). A hint past the end
/// of the weights is dropped.
#[inline(always)]
pub(super) unsafe fn prefetch_next_group(
    rows: *const u8,
    (n, row_bytes): (usize, usize),
    b: usize,
    bb: usize,
) {
    let ahead = rows.wrapping_add(n * row_bytes + b * n * bb);
    let mut off = 0;
    while off < n * bb {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// Unpacks and transposes the `out.len()` blocks of the sixteen weight rows `rows` (`wd`: their
/// f32 scales for [`Q0::Q8S`]; `row_bytes`: the matrix's row stride) into `out`, as two
/// eight-row halves (rows 0-7 in the low 256 bits of each register, 8-15 in the high).
#[inline(always)]
unsafe fn prepare_group(
    fmt: Q0,
    rows: [*const u8; WIDE],
    wd: [*const f32; WIDE],
    row_bytes: usize,
    out: &mut [TBlock],
) {
    let bb = block_bytes(fmt);
    for (b, tb) in out.iter_mut().enumerate() {
        prefetch_next_group(rows[0], (WIDE, row_bytes), b, bb);
        for half in 0..2 {
            let r8: [*const u8; GROUP] = std::array::from_fn(|r| rows[GROUP * half + r]);
            let w8: [*const f32; GROUP] = std::array::from_fn(|r| wd[GROUP * half + r]);
            let t = transpose8(&unpack8(fmt, &r8, b, bb));
            _mm256_store_ps(
                tb.scales.as_mut_ptr().add(GROUP * half),
                scales_at(fmt, &r8, &w8, b, bb),
            );
            for (q, tk) in tb.quants.iter_mut().zip(t) {
                _mm256_store_si256(q.as_mut_ptr().add(32 * half) as *mut __m256i, tk);
            }
        }
    }
}

/// [`group_tile`] for few activation rows, straight from eight consecutive weight rows
/// (`rows`: the first, `row_bytes` apart; `wd`: the first row's f32 scales for [`Q0::Q8S`]):
/// rows `2k` and `2k + 1` share a 512-bit register ([`unpack_pair`]) and each row's block dot
/// is reduced across its half instead of transposing the weights first, so nothing is written;
/// blocks go two at a time through one reduction ([`reduce_pairs2`]). Same integers, same f32
/// sequence.
#[inline(always)]
unsafe fn group_direct<const N: usize>(
    fmt: Q0,
    (rows, wd, nb, row_bytes): (*const u8, *const f32, usize, usize),
    shift: u32,
    qs: [*const i8; N],
    d: [*const f32; N],
    sums: [*const i32; N],
) -> [__m256; N] {
    let bb = block_bytes(fmt);
    let mut acc = [_mm256_setzero_ps(); N];
    let load = |b: usize| {
        prefetch_next_group(rows, (GROUP, row_bytes), b, bb);
        direct_block(fmt, (rows, wd, nb, row_bytes), b)
    };
    // `acc = fma(d_w·d_a, dot, acc)` for block `b` of activation row `j`.
    let step = |acc: __m256, dots: __m256i, dw: __m256, j: usize, b: usize| {
        let s = _mm256_sub_epi32(dots, _mm256_set1_epi32(*sums[j].add(b) << shift));
        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d[j].add(b)));
        _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), acc)
    };
    let mut b = 0;
    while b + 2 <= nb {
        let ((u0, dw0), (u1, dw1)) = (load(b), load(b + 1));
        for j in 0..N {
            let (d0, d1) = reduce_pairs2(
                block_dots(&u0, qs[j].add(b * 32)),
                block_dots(&u1, qs[j].add((b + 1) * 32)),
            );
            acc[j] = step(acc[j], d0, dw0, j, b);
            acc[j] = step(acc[j], d1, dw1, j, b + 1);
        }
        b += 2;
    }
    if b < nb {
        let (u, dw) = load(b);
        for j in 0..N {
            acc[j] = step(
                acc[j],
                reduce_pairs(block_dots(&u, qs[j].add(b * 32))),
                dw,
                j,
                b,
            );
        }
    }
    acc
}

/// Block `b` of the eight rows of [`group_direct`]: the unsigned quants of rows `2k`, `2k + 1`
/// in register `k`, and the rows' f32 scales.
#[inline(always)]
unsafe fn direct_block(
    fmt: Q0,
    (rows, wd, nb, row_bytes): (*const u8, *const f32, usize, usize),
    b: usize,
) -> ([__m512i; GROUP / 2], __m256) {
    let p = rows.add(b * block_bytes(fmt));
    let mut u = [_mm512_setzero_si512(); GROUP / 2];
    let mut h = [0i16; GROUP];
    for (k, uk) in u.iter_mut().enumerate() {
        let (r0, r1) = (p.add(2 * k * row_bytes), p.add((2 * k + 1) * row_bytes));
        *uk = unpack_pair(fmt, r0, r1);
        h[2 * k] = (r0 as *const i16).read_unaligned();
        h[2 * k + 1] = (r1 as *const i16).read_unaligned();
    }
    let dw = if fmt == Q0::Q8S {
        let f = |r: usize| *wd.add(r * nb + b);
        _mm256_setr_ps(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7))
    } else {
        _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
    };
    (u, dw)
}

/// The eight rows' lane partial dots of one block with the 32 activation quants at `a`.
#[inline(always)]
unsafe fn block_dots(u: &[__m512i; GROUP / 2], a: *const i8) -> [__m512i; GROUP / 2] {
    let a = _mm512_broadcast_i64x4(_mm256_loadu_si256(a as *const __m256i));
    let mut v = [_mm512_setzero_si512(); GROUP / 2];
    for (vk, uk) in v.iter_mut().zip(u) {
        *vk = _mm512_dpbusd_epi32(*vk, *uk, a);
    }
    v
}

/// The unsigned quants of the blocks at `r0` (low 256 bits) and `r1` (high), both rows
/// unpacked in one register: as [`unpack_unsigned`] of each.
#[inline(always)]
unsafe fn unpack_pair(fmt: Q0, r0: *const u8, r1: *const u8) -> __m512i {
    match fmt {
        Q0::Q4_0 => nibbles_pair(r0.add(q4_0::QS_OFFSET), r1.add(q4_0::QS_OFFSET)),
        Q0::Q5_0 => {
            // u = nibble + 16·(fifth bit); bit j of a row's qh is its value j.
            let qh = |r: *const u8| (r.add(q5_0::QH_OFFSET) as *const u32).read_unaligned() as u64;
            let n = nibbles_pair(r0.add(q5_0::QS_OFFSET), r1.add(q5_0::QS_OFFSET));
            _mm512_mask_add_epi8(
                n,
                _cvtu64_mask64(qh(r0) | qh(r1) << 32),
                n,
                _mm512_set1_epi8(16),
            )
        }
        Q0::Q8_0 | Q0::Q8S => {
            let off = if fmt == Q0::Q8_0 { q8_0::QS_OFFSET } else { 0 };
            let q = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(r0.add(off) as *const __m256i)),
                _mm256_loadu_si256(r1.add(off) as *const __m256i),
            );
            _mm512_xor_si512(q, _mm512_set1_epi8(i8::MIN))
        }
    }
}

/// The 32 nibbles of each of two blocks (16 bytes at `q0`, at `q1`) as bytes: values 0-15 the
/// low nibbles, 16-31 the high ones (ggml's order), `q0`'s block in the low 256 bits.
#[inline(always)]
unsafe fn nibbles_pair(q0: *const u8, q1: *const u8) -> __m512i {
    let q = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_loadu_si128(q0 as *const __m128i)),
        _mm_loadu_si128(q1 as *const __m128i),
    );
    // 128-bit lanes [q0 low nibbles, q1 low, q0 high, q1 high] → [q0 low, q0 high, q1 low, q1 high].
    let both = _mm512_and_si512(
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), _mm256_srli_epi16::<4>(q)),
        _mm512_set1_epi8(0xF),
    );
    _mm512_shuffle_i64x2::<0b11_01_10_00>(both, both)
}

/// Lane `r` = the sum of row `r`'s eight lanes, where row `2k` is the low half of `v[k]` and
/// row `2k + 1` its high half (exact, wrapping i32).
#[inline(always)]
unsafe fn reduce_pairs(v: [__m512i; 4]) -> __m256i {
    let h = half_sums(v);
    _mm512_castsi512_si256(order_rows(hadd_lanes(h, h)))
}

/// [`reduce_pairs`] of two blocks at once, sharing the last two steps (whose registers are
/// half idle for one block): the first result is `v`'s, the second `w`'s.
#[inline(always)]
unsafe fn reduce_pairs2(v: [__m512i; 4], w: [__m512i; 4]) -> (__m256i, __m256i) {
    let both = order_rows(hadd_lanes(half_sums(v), half_sums(w)));
    (
        _mm512_castsi512_si256(both),
        _mm512_extracti64x4_epi64::<1>(both),
    )
}

/// The first reduction steps of [`reduce_pairs`]: 128-bit lane i holds two partial sums of
/// row i, then two of row 4 + i.
#[inline(always)]
unsafe fn half_sums(v: [__m512i; 4]) -> __m512i {
    // s[m]: 128-bit lane i holds row 4m + i's four partial sums.
    let s: [__m512i; 2] = std::array::from_fn(|m| {
        let (a, b) = (v[2 * m], v[2 * m + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i64x2::<0b11_01_11_01>(a, b),
        )
    });
    hadd_lanes(s[0], s[1])
}

/// From 128-bit lanes `[x row i, x row 4 + i, y row i, y row 4 + i]` (i = 0..4) to x's rows
/// 0..8 in the low 256 bits and y's in the high.
#[inline(always)]
unsafe fn order_rows(f: __m512i) -> __m512i {
    const ORDER: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];
    _mm512_permutexvar_epi32(_mm512_loadu_si512(ORDER.as_ptr() as *const __m512i), f)
}

/// `vphaddd` on each 128-bit lane of two 512-bit registers (AVX-512 has no 512-bit form):
/// lane i = `[a₀+a₁, a₂+a₃, b₀+b₁, b₂+b₃]` of the lanes i of `a` and `b`.
#[inline(always)]
unsafe fn hadd_lanes(a: __m512i, b: __m512i) -> __m512i {
    let (a, b) = (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b));
    _mm512_add_epi32(
        _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(a, b)),
        _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(a, b)),
    )
}

/// The sixteen outputs of a group for `N` activation rows (quants `qs[j]`, scales `d[j]`,
/// block quant sums `sums[j]`, `blocks.len()` blocks each): lane `r` of result `j` = row `r` ·
/// act `j`.
#[inline(always)]
unsafe fn group_tile<const N: usize>(
    blocks: &[TBlock],
    shift: u32,
    qs: [*const i8; N],
    d: [*const f32; N],
    sums: [*const i32; N],
) -> [__m512; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    for (b, tb) in blocks.iter().enumerate() {
        let mut w = [_mm512_setzero_si512(); 8];
        for (wk, q) in w.iter_mut().zip(&tb.quants) {
            *wk = _mm512_load_si512(q.as_ptr() as *const __m512i);
        }
        let dw = _mm512_load_ps(tb.scales.as_ptr());
        for j in 0..N {
            let a = qs[j].add(b * 32) as *const i32;
            let mut s = _mm512_set1_epi32(-(*sums[j].add(b) << shift));
            for (k, wk) in w.iter().enumerate() {
                s = _mm512_dpbusd_epi32(s, *wk, _mm512_set1_epi32(a.add(k).read_unaligned()));
            }
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*d[j].add(b)));
            acc[j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[j]);
        }
    }
    acc
}

/// Stores lanes `..valid` of `v` as outputs (g + r, i) of `out`.
#[inline(always)]
pub(super) unsafe fn put_lanes(out: OutMat, g: usize, i: usize, valid: usize, v: __m256) {
    let mut lanes = [0f32; GROUP];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    put_first(out, g, i, &lanes[..valid]);
}

/// Stores lanes `..valid` of the sixteen-lane `v` as outputs (g + r, i) of `out`.
#[inline(always)]
pub(super) unsafe fn put_wide(out: OutMat, g: usize, i: usize, valid: usize, v: __m512) {
    let mut lanes = [0f32; WIDE];
    _mm512_storeu_ps(lanes.as_mut_ptr(), v);
    put_first(out, g, i, &lanes[..valid]);
}

/// Outputs (g + r, i) of `out` = `lanes[r]`.
#[inline(always)]
unsafe fn put_first(out: OutMat, g: usize, i: usize, lanes: &[f32]) {
    for (r, &x) in lanes.iter().enumerate() {
        out.put(g + r, i, x);
    }
}

/// Runs `group_tile::<N>` over activation rows `i..` while `N` of them remain; returns the
/// next row.
#[inline(always)]
pub(super) unsafe fn tiles<const N: usize>(
    blocks: &[TBlock],
    shift: u32,
    acts: &Q8Rows,
    sums: &[i32],
    mut i: usize,
    (out, g, valid): (OutMat, usize, usize),
) -> usize {
    let nb = blocks.len();
    while i + N <= acts.m {
        let v = group_tile::<N>(
            blocks,
            shift,
            std::array::from_fn(|j| acts.qs.as_ptr().add((i + j) * acts.cols)),
            std::array::from_fn(|j| acts.d.as_ptr().add((i + j) * nb)),
            std::array::from_fn(|j| sums.as_ptr().add((i + j) * nb)),
        );
        for (j, x) in v.into_iter().enumerate() {
            put_wide(out, g, i + j, valid, x);
        }
        i += N;
    }
    i
}

/// [`group_direct`] for all `N` activation rows of `acts` and the full group starting at
/// weight row `g`.
#[inline(always)]
unsafe fn direct_rows<const N: usize>(
    fmt: Q0,
    group: (*const u8, *const f32, usize, usize),
    shift: u32,
    acts: &Q8Rows,
    sums: &[i32],
    (out, g): (OutMat, usize),
) {
    let nb = group.2;
    let v = group_direct::<N>(
        fmt,
        group,
        shift,
        std::array::from_fn(|j| acts.qs.as_ptr().add(j * acts.cols)),
        std::array::from_fn(|j| acts.d.as_ptr().add(j * nb)),
        std::array::from_fn(|j| sums.as_ptr().add(j * nb)),
    );
    for (j, x) in v.into_iter().enumerate() {
        put_lanes(out, g, j, GROUP, x);
    }
}

/// Element (r, i) of `out` = `W_r · A_i` for the weight rows `ws` (`row_bytes` each; `wd`: their
/// f32 scales, `cols / 32` per row, for [`Q0::Q8S`]) and every activation row of `acts`.
///
/// # Safety
/// AVX2, FMA, AVX512F/VL/BW/VNNI must be available (`super::avx2_tile::vnni_available`); `ws`
/// holds whole rows of at least `acts.cols / 32` blocks of `fmt` (and `wd` their scales for
/// Q8S); `out` must own elements (r, i) for every r < `ws.len() / row_bytes`, i < `acts.m`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(super) unsafe fn rows_times_acts(
    fmt: Q0,
    ws: &[u8],
    row_bytes: usize,
    wd: *const f32,
    acts: &Q8Rows,
    out: OutMat,
) {
    let nb = acts.cols / 32;
    let n_rows = ws.len() / row_bytes;
    if nb == 0 || n_rows == 0 || acts.m == 0 {
        return;
    }
    let mut sums = scratch::take(&SUMS, acts.m * nb);
    for (s, q) in sums
        .iter_mut()
        .zip(acts.qs[..acts.m * acts.cols].chunks_exact(32))
    {
        *s = block_sum(q.as_ptr());
    }
    let shift = offset_shift(fmt);
    // Few activation rows: whole groups of eight straight from the weights (sixteen at once ran
    // decode ~15% slower: twice the streams); what is left (all rows otherwise) in transposed
    // groups of sixteen.
    let mut first = 0;
    if acts.m < DIRECT_BELOW {
        first = n_rows / GROUP * GROUP;
        for g in (0..first).step_by(GROUP) {
            let group = (
                ws.as_ptr().add(g * row_bytes),
                wd.wrapping_add(g * nb),
                nb,
                row_bytes,
            );
            match acts.m {
                1 => direct_rows::<1>(fmt, group, shift, acts, &sums, (out, g)),
                2 => direct_rows::<2>(fmt, group, shift, acts, &sums, (out, g)),
                _ => direct_rows::<3>(fmt, group, shift, acts, &sums, (out, g)),
            }
        }
    }
    let mut blocks = scratch::take(&BLOCKS, nb);
    for g in (first..n_rows).step_by(WIDE) {
        let valid = WIDE.min(n_rows - g);
        // A short last group repeats its last row in the unused lanes (never stored).
        let row = |r: usize| (g + r).min(n_rows - 1);
        let rows = std::array::from_fn(|r| ws.as_ptr().add(row(r) * row_bytes));
        let wds = std::array::from_fn(|r| wd.wrapping_add(row(r) * nb));
        prepare_group(fmt, rows, wds, row_bytes, &mut blocks[..nb]);
        let bl = &blocks[..nb];
        let at = (out, g, valid);
        let i = tiles::<TILE>(bl, shift, acts, &sums, 0, at);
        let i = tiles::<4>(bl, shift, acts, &sums, i, at);
        tiles::<1>(bl, shift, acts, &sums, i, at);
    }
    scratch::give(&BLOCKS, blocks);
    scratch::give(&SUMS, sums);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arithmetic the kernel promises, in scalar code: exact integer block dots, then
    /// `acc = fma(d_w·d_a, dot, acc)` over the blocks in order.
    fn reference(fmt: Q0, w: &[u8], wd: &[f32], qs: &[i8], d: &[f32], nb: usize) -> f32 {
        let bb = block_bytes(fmt);
        let mut acc = 0f32;
        for b in 0..nb {
            let blk = &w[b * bb..(b + 1) * bb];
            let dw = match fmt {
                Q0::Q8S => wd[b],
                _ => super::super::layout::f16_at(blk, 0),
            };
            let q: Vec<i32> = (0..32)
                .map(|i| match fmt {
                    Q0::Q4_0 => {
                        let byte = blk[q4_0::QS_OFFSET + i % 16];
                        (if i < 16 { byte & 0xF } else { byte >> 4 }) as i32 - 8
                    }
                    Q0::Q5_0 => {
                        let byte = blk[q5_0::QS_OFFSET + i % 16];
                        let nib = (if i < 16 { byte & 0xF } else { byte >> 4 }) as i32;
                        let qh = u32::from_le_bytes(
                            blk[q5_0::QH_OFFSET..q5_0::QH_OFFSET + 4]
                                .try_into()
                                .unwrap(),
                        );
                        nib + 16 * ((qh >> i) & 1) as i32 - 16
                    }
                    Q0::Q8_0 => blk[q8_0::QS_OFFSET + i] as i8 as i32,
                    Q0::Q8S => blk[i] as i8 as i32,
                })
                .collect();
            let dot: i32 = (0..32).map(|i| q[i] * qs[b * 32 + i] as i32).sum();
            acc = (dw * d[b]).mul_add(dot as f32, acc);
        }
        acc
    }

    /// Every output equals the scalar reference bit for bit, for every format, for numbers of
    /// weight rows that leave short groups and numbers of activation rows that use every tile
    /// width; weight quants include −128.
    #[test]
    fn gemm_equals_scalar_arithmetic_bit_for_bit() {
        if !super::super::avx2_tile::vnni_available() {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to run");
            return;
        }
        let mut next = super::super::xorshift(0x2545_f491_4f6c_dd1d);
        for fmt in [Q0::Q4_0, Q0::Q5_0, Q0::Q8_0, Q0::Q8S] {
            for (nb, n_rows, m) in [
                (1usize, 1usize, 1usize),
                (2, 16, 1),
                (4, 17, 3),
                (3, 9, 21),
                (18, 8, 16),
                (5, 13, 5),
                (3, 35, 2),
                (2, 35, 21),
            ] {
                let bb = block_bytes(fmt);
                let row_bytes = nb * bb;
                let w: Vec<u8> = (0..n_rows * row_bytes)
                    .map(|k| {
                        let r = next() as u8;
                        // f16 scales finite and moderate.
                        if fmt != Q0::Q8S && k % bb == 1 {
                            r & 0x3b
                        } else {
                            r
                        }
                    })
                    .collect();
                let wd: Vec<f32> = (0..n_rows * nb)
                    .map(|_| (next() % 1000) as f32 * 1e-4)
                    .collect();
                let acts = Q8Rows {
                    qs: (0..m * nb * 32).map(|_| (next() % 255) as i8).collect(),
                    d: (0..m * nb).map(|_| (next() % 1000) as f32 * 1e-4).collect(),
                    m,
                    cols: nb * 32,
                };
                let mut y = vec![f32::NAN; m * n_rows];
                let out = OutMat::rows_last(&mut y, m, n_rows);
                // SAFETY: VNNI detected; `w` is n_rows whole rows of nb blocks, `wd` their
                // scales; `out` covers m × n_rows.
                unsafe { rows_times_acts(fmt, &w, row_bytes, wd.as_ptr(), &acts, out) };
                for r in 0..n_rows {
                    for i in 0..m {
                        let want = reference(
                            fmt,
                            &w[r * row_bytes..(r + 1) * row_bytes],
                            &wd[r * nb..(r + 1) * nb],
                            &acts.qs[i * nb * 32..(i + 1) * nb * 32],
                            &acts.d[i * nb..(i + 1) * nb],
                            nb,
                        );
                        let got = y[i * n_rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{fmt:?} nb={nb} row {r} act {i}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
