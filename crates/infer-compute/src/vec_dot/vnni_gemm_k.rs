//! AVX-512 VNNI products of Q4_K / Q6_K weights with Q8_K activation rows, sixteen weight rows
//! at a time: the K-quant counterpart of [`super::vnni_gemm`] (same group layout, same reasons).
//!
//! A 256-value super-block is eight units of 32 values. Each unit of the sixteen rows is
//! transposed so that one `vpdpbusd` with a broadcast activation dword advances sixteen dots; a
//! unit's dot is then multiplied by its sub-block scale (Q4_K: one 6-bit scale per 32 values;
//! Q6_K: one signed 8-bit scale per 16, so two dots per unit) and summed in i32. The offset terms
//! come from the Q8_K group sums (`bsums`, 16 values each): Q4_K's `Σ min_s · Σ_{i∈s} a_i`
//! (scaled by `dmin`), Q6_K's `32 · Σ scale_s · Σ_{i∈s} a_i` (the quants are stored `q + 32`).
//!
//! Per (weight row, activation row) pair and super-block the integers are exact, then
//! `acc = fma(d_w·d_a, isum, acc)` (Q6_K: `isum` net of the offset term) and, for Q4_K,
//! `acc = fma(−(dmin_w·d_a), msum, acc)`, over the super-blocks in order from `acc = 0` — the same
//! f32 sequence for any number of activation rows, so a mat-vec and any row of a mat-mat give the
//! same bits. Fewer than [`MIN_ROWS`] activation rows go row by row straight from the weights
//! ([`super::kquant_row`]).

use super::layout::q4k_scales_mins;
use super::vnni_gemm::{prefetch_next_group, put_wide, transpose8, GROUP, WIDE};
use super::OutMat;
use crate::scratch;
use infer_quant::{q4_k, q6_k, q8_k};
use std::arch::x86_64::*;
use std::cell::Cell;

/// Activation rows per tile of the transposed path.
const TILE: usize = 8;
/// From this many activation rows on, the transposed group pays for itself; below it rows are
/// streamed one at a time ([`super::kquant_row`]; eight-row groups ran mat-vecs from memory ~20%
/// slower).
const MIN_ROWS: usize = 4;
/// 32-value units per super-block.
const UNITS: usize = 8;

/// The K-quant weight formats of this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KQuant {
    Q4K,
    Q6K,
}

impl KQuant {
    pub(super) const fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4K => q4_k::BLOCK_BYTES,
            KQuant::Q6K => q6_k::BLOCK_BYTES,
        }
    }
}

/// One super-block of a group of sixteen rows, transposed: unit `u`'s dword `k` of the rows at
/// `quants[8u + k]` (lane `r`: row `r`); the rows' sub-block scales as i32 lanes (Q4_K: 8,
/// Q6_K: 16); the i16 pairs the offset term multiplies with the activation sums (Q4_K: mins
/// `(m_2t, m_2t+1)`, t < 4; Q6_K: scales `(s_2t, s_2t+1)`, t < 8); `d` and `dmin` (Q4_K) as f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct KBlock {
    quants: [[u8; 64]; 64],
    scales: [[i32; WIDE]; 16],
    pairs: [[i32; WIDE]; 8],
    d: [f32; WIDE],
    dmin: [f32; WIDE],
}

impl Default for KBlock {
    fn default() -> Self {
        KBlock {
            quants: [[0; 64]; 64],
            scales: [[0; WIDE]; 16],
            pairs: [[0; WIDE]; 8],
            d: [0.0; WIDE],
            dmin: [0.0; WIDE],
        }
    }
}

thread_local! {
    /// The current group's transposed super-blocks.
    static BLOCKS: Cell<Vec<KBlock>> = const { Cell::new(Vec::new()) };
}

/// One weight row's super-block, unpacked: the eight units' unsigned quants, the sub-block
/// scales (Q4_K: 8 in 0..63; Q6_K: 16 signed) and Q4_K's 8 mins.
struct Unpacked {
    units: [__m256i; UNITS],
    scales: [i16; 16],
    mins: [i16; 8],
}

/// Unpacks the super-block at `xb` (ggml `block_q4_K` / `block_q6_K` layouts).
#[inline(always)]
unsafe fn unpack(fmt: KQuant, xb: *const u8) -> Unpacked {
    let m4 = _mm256_set1_epi8(0xF);
    let mut units = [_mm256_setzero_si256(); UNITS];
    let mut scales = [0i16; 16];
    let mut mins = [0i16; 8];
    match fmt {
        KQuant::Q4K => {
            let sm = q4k_scales_mins(std::slice::from_raw_parts(xb.add(q4_k::SCALES_OFFSET), 12));
            for s in 0..8 {
                scales[s] = sm[s] as i16;
                mins[s] = sm[8 + s] as i16;
            }
            let q = xb.add(q4_k::QS_OFFSET);
            for t in 0..4 {
                let bits = _mm256_loadu_si256(q.add(32 * t) as *const __m256i);
                units[2 * t] = _mm256_and_si256(bits, m4);
                units[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            }
        }
        KQuant::Q6K => {
            for (s, v) in scales.iter_mut().enumerate() {
                *v = *(xb.add(q6_k::SCALES_OFFSET + s) as *const i8) as i16;
            }
            let m2 = _mm256_set1_epi8(3);
            for h in 0..2 {
                let ql = xb.add(q6_k::QL_OFFSET + 64 * h);
                let qh = _mm256_loadu_si256(xb.add(q6_k::QH_OFFSET + 32 * h) as *const __m256i);
                let b1 = _mm256_loadu_si256(ql as *const __m256i);
                let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                let hi0 = _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4);
                let hi2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4);
                let hi4 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4);
                let hi6 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4);
                units[4 * h] = _mm256_or_si256(_mm256_and_si256(b1, m4), hi0);
                units[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(b2, m4), hi2);
                units[4 * h + 2] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), hi4);
                units[4 * h + 3] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), hi6);
            }
        }
    }
    Unpacked {
        units,
        scales,
        mins,
    }
}

/// The f16 `d` and (Q4_K) `dmin` of the super-block at `xb`, as f32.
#[inline(always)]
unsafe fn d_dmin(fmt: KQuant, xb: *const u8) -> (f32, f32) {
    let f =
        |off: usize| super::layout::f16_bits_to_f32((xb.add(off) as *const u16).read_unaligned());
    match fmt {
        KQuant::Q4K => (f(q4_k::D_OFFSET), f(q4_k::DMIN_OFFSET)),
        KQuant::Q6K => (f(q6_k::D_OFFSET), 0.0),
    }
}

/// Unpacks and transposes the `out.len()` super-blocks of the sixteen rows `rows` into `out`
/// (two eight-row transposes per unit: rows 0-7 in the low 256 bits, 8-15 in the high).
#[inline(always)]
unsafe fn prepare_group(
    fmt: KQuant,
    rows: [*const u8; WIDE],
    row_bytes: usize,
    out: &mut [KBlock],
) {
    let bb = fmt.block_bytes();
    for (b, kb) in out.iter_mut().enumerate() {
        prefetch_next_group(rows[0], (WIDE, row_bytes), b, bb);
        let xb: [*const u8; WIDE] = std::array::from_fn(|r| rows[r].add(b * bb));
        let mut units = [[_mm256_setzero_si256(); WIDE]; UNITS];
        for r in 0..WIDE {
            let un = unpack(fmt, xb[r]);
            for (unit, v) in units.iter_mut().zip(un.units) {
                unit[r] = v;
            }
            for (s, sc) in un.scales.iter().enumerate() {
                kb.scales[s][r] = *sc as i32;
            }
            for t in 0..8 {
                let (a, b2) = match fmt {
                    KQuant::Q4K if t < 4 => (un.mins[2 * t], un.mins[2 * t + 1]),
                    KQuant::Q4K => (0, 0),
                    KQuant::Q6K => (un.scales[2 * t], un.scales[2 * t + 1]),
                };
                kb.pairs[t][r] = (a as u16 as u32 | ((b2 as u16 as u32) << 16)) as i32;
            }
        }
        for (unit, q) in units.iter().zip(kb.quants.chunks_exact_mut(8)) {
            for half in 0..2 {
                let rows8: [__m256i; GROUP] = std::array::from_fn(|r| unit[GROUP * half + r]);
                for (qk, tk) in q.iter_mut().zip(transpose8(&rows8)) {
                    _mm256_store_si256(qk.as_mut_ptr().add(32 * half) as *mut __m256i, tk);
                }
            }
        }
        for (r, x) in xb.iter().enumerate() {
            (kb.d[r], kb.dmin[r]) = d_dmin(fmt, *x);
        }
    }
}

/// The activation-side i16 pairs of the offset term for super-block `yb` (Q8_K), dword `t` of
/// the result broadcast by the caller: Q4_K `(Σ_32 a of sub-block 2t, of 2t + 1)`, Q6_K the
/// `bsums` themselves.
#[inline(always)]
unsafe fn act_pairs(fmt: KQuant, yb: *const u8) -> [__m512i; 8] {
    let bs = yb.add(q8_k::BSUMS_OFFSET);
    let mut out = [_mm512_setzero_si512(); 8];
    match fmt {
        KQuant::Q4K => {
            let lo = _mm_loadu_si128(bs as *const __m128i);
            let hi = _mm_loadu_si128(bs.add(16) as *const __m128i);
            let s32 = _mm_hadd_epi16(lo, hi);
            let mut w = [0i32; 4];
            _mm_storeu_si128(w.as_mut_ptr() as *mut __m128i, s32);
            for t in 0..4 {
                out[t] = _mm512_set1_epi32(w[t]);
            }
        }
        KQuant::Q6K => {
            for (t, o) in out.iter_mut().enumerate() {
                *o = _mm512_set1_epi32((bs.add(4 * t) as *const i32).read_unaligned());
            }
        }
    }
    out
}

/// Activation dword `k` at `y`, broadcast. (No closures in the kernels: a closure would not
/// inherit the target features and its intrinsics would not be inlined.)
#[inline(always)]
unsafe fn bcast(y: *const i32, k: usize) -> __m512i {
    _mm512_set1_epi32(y.add(k).read_unaligned())
}

/// Sixteen i32 lanes from an aligned array.
#[inline(always)]
unsafe fn lanes(v: &[i32; WIDE]) -> __m512i {
    debug_assert!((v.as_ptr() as usize).is_multiple_of(64));
    _mm512_load_si512(v.as_ptr() as *const __m512i)
}

/// Folds one super-block's integers into the accumulator: `fma(d·d_a, isum − Q6_K's 32·corr)`,
/// then Q4_K's `fma(−(dmin·d_a), corr)`.
#[inline(always)]
unsafe fn accumulate(
    fmt: KQuant,
    acc: __m512,
    (d, dmin): (__m512, __m512),
    da: f32,
    isum: __m512i,
    corr: __m512i,
) -> __m512 {
    let da = _mm512_set1_ps(da);
    match fmt {
        KQuant::Q4K => {
            let acc = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum), acc);
            _mm512_fnmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(corr), acc)
        }
        KQuant::Q6K => {
            let s = _mm512_sub_epi32(isum, _mm512_slli_epi32(corr, 5));
            _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s), acc)
        }
    }
}

/// The sixteen outputs of a group for `N` activation rows `a[j]` (Q8_K rows of `blocks.len()`
/// super-blocks): lane `r` of result `j` = row `r` · act `j`.
#[inline(always)]
unsafe fn group_tile<const N: usize>(
    fmt: KQuant,
    blocks: &[KBlock],
    a: [*const u8; N],
) -> [__m512; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    let n_pairs = if fmt == KQuant::Q4K { 4 } else { 8 };
    for (b, kb) in blocks.iter().enumerate() {
        let mut isum = [_mm512_setzero_si512(); N];
        for u in 0..UNITS {
            let mut w = [_mm512_setzero_si512(); 8];
            for (k, wk) in w.iter_mut().enumerate() {
                *wk = _mm512_load_si512(kb.quants[8 * u + k].as_ptr() as *const __m512i);
            }
            for j in 0..N {
                let y = a[j].add(b * q8_k::BLOCK_BYTES + q8_k::QS_OFFSET + 32 * u) as *const i32;
                let z = _mm512_setzero_si512();
                let lo = _mm512_dpbusd_epi32(z, w[0], bcast(y, 0));
                let lo = _mm512_dpbusd_epi32(lo, w[1], bcast(y, 1));
                let lo = _mm512_dpbusd_epi32(lo, w[2], bcast(y, 2));
                let lo = _mm512_dpbusd_epi32(lo, w[3], bcast(y, 3));
                if fmt == KQuant::Q4K {
                    let dot = _mm512_dpbusd_epi32(lo, w[4], bcast(y, 4));
                    let dot = _mm512_dpbusd_epi32(dot, w[5], bcast(y, 5));
                    let dot = _mm512_dpbusd_epi32(dot, w[6], bcast(y, 6));
                    let dot = _mm512_dpbusd_epi32(dot, w[7], bcast(y, 7));
                    isum[j] =
                        _mm512_add_epi32(isum[j], _mm512_mullo_epi32(dot, lanes(&kb.scales[u])));
                } else {
                    let hi = _mm512_dpbusd_epi32(z, w[4], bcast(y, 4));
                    let hi = _mm512_dpbusd_epi32(hi, w[5], bcast(y, 5));
                    let hi = _mm512_dpbusd_epi32(hi, w[6], bcast(y, 6));
                    let hi = _mm512_dpbusd_epi32(hi, w[7], bcast(y, 7));
                    let p = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo, lanes(&kb.scales[2 * u])),
                        _mm512_mullo_epi32(hi, lanes(&kb.scales[2 * u + 1])),
                    );
                    isum[j] = _mm512_add_epi32(isum[j], p);
                }
            }
        }
        let d = _mm512_load_ps(kb.d.as_ptr());
        let dmin = _mm512_load_ps(kb.dmin.as_ptr());
        for j in 0..N {
            let yb = a[j].add(b * q8_k::BLOCK_BYTES);
            let ap = act_pairs(fmt, yb);
            let mut corr = _mm512_setzero_si512();
            for (wp, apt) in kb.pairs.iter().zip(ap).take(n_pairs) {
                corr = _mm512_add_epi32(corr, _mm512_madd_epi16(lanes(wp), apt));
            }
            let da = (yb.add(q8_k::D_OFFSET) as *const f32).read_unaligned();
            acc[j] = accumulate(fmt, acc[j], (d, dmin), da, isum[j], corr);
        }
    }
    acc
}

/// Element (r, i) of `out` = `W_r · A_i` for the `fmt` weight rows `ws` (`row_bytes` each, `nb`
/// super-blocks) and the `m` Q8_K activation rows `acts` (`nb` blocks each).
///
/// # Safety
/// AVX2, FMA, F16C, AVX512F/VL/BW/VNNI must be available (`super::avx2_tile::vnni_available`);
/// `ws` holds whole rows of at least `nb` super-blocks; `acts` holds `m · nb` Q8_K blocks; `out`
/// must own elements (r, i) for every r < `ws.len() / row_bytes`, i < `m`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn rows_times_acts(
    fmt: KQuant,
    ws: &[u8],
    row_bytes: usize,
    nb: usize,
    acts: &[u8],
    m: usize,
    out: OutMat,
) {
    // One copy of the loops per format (the format a constant inside).
    match fmt {
        KQuant::Q4K => rows_for::<true>(ws, row_bytes, nb, acts, m, out),
        KQuant::Q6K => rows_for::<false>(ws, row_bytes, nb, acts, m, out),
    }
}

/// [`rows_times_acts`] for Q4_K (`Q4`) or Q6_K.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn rows_for<const Q4: bool>(
    ws: &[u8],
    row_bytes: usize,
    nb: usize,
    acts: &[u8],
    m: usize,
    out: OutMat,
) {
    let fmt = if Q4 { KQuant::Q4K } else { KQuant::Q6K };
    let n_rows = ws.len() / row_bytes;
    if nb == 0 || n_rows == 0 || m == 0 {
        return;
    }
    let ar = nb * q8_k::BLOCK_BYTES;
    let ap = acts.as_ptr();
    if m < MIN_ROWS {
        return super::kquant_row::rows_times_acts(fmt, ws, row_bytes, nb, acts, m, out);
    }
    let mut blocks = scratch::take(&BLOCKS, nb);
    for g in (0..n_rows).step_by(WIDE) {
        let valid = WIDE.min(n_rows - g);
        // A short last group repeats its last row in the unused lanes (never stored).
        let rows = std::array::from_fn(|r| ws.as_ptr().add((g + r).min(n_rows - 1) * row_bytes));
        prepare_group(fmt, rows, row_bytes, &mut blocks[..nb]);
        let bl = &blocks[..nb];
        let mut i = 0;
        while i + TILE <= m {
            let v = group_tile::<TILE>(fmt, bl, std::array::from_fn(|j| ap.add((i + j) * ar)));
            for (j, x) in v.into_iter().enumerate() {
                put_wide(out, g, i + j, valid, x);
            }
            i += TILE;
        }
        while i < m {
            let v = group_tile::<1>(fmt, bl, [ap.add(i * ar)]);
            put_wide(out, g, i, valid, v[0]);
            i += 1;
        }
    }
    scratch::give(&BLOCKS, blocks);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arithmetic the kernel promises, in scalar code, from ggml's block layouts.
    fn reference(fmt: KQuant, w: &[u8], a: &[u8], nb: usize) -> f32 {
        let f16 = |b: &[u8], o: usize| super::super::layout::f16_at(b, o);
        let mut acc = 0f32;
        for b in 0..nb {
            let x = &w[b * fmt.block_bytes()..(b + 1) * fmt.block_bytes()];
            let y = &a[b * q8_k::BLOCK_BYTES..(b + 1) * q8_k::BLOCK_BYTES];
            let da = f32::from_le_bytes(y[0..4].try_into().unwrap());
            let q8 = |i: usize| y[q8_k::QS_OFFSET + i] as i8 as i32;
            let asum = |lo: usize, n: usize| (lo..lo + n).map(q8).sum::<i32>();
            match fmt {
                KQuant::Q4K => {
                    let sm = q4k_scales_mins(&x[q4_k::SCALES_OFFSET..q4_k::SCALES_OFFSET + 12]);
                    let (mut isum, mut msum) = (0i32, 0i32);
                    for s in 0..8 {
                        let dot: i32 = (0..32)
                            .map(|i| {
                                let byte = x[q4_k::QS_OFFSET + 32 * (s / 2) + i];
                                let q = if s % 2 == 0 { byte & 0xF } else { byte >> 4 };
                                q as i32 * q8(32 * s + i)
                            })
                            .sum();
                        isum += sm[s] as i32 * dot;
                        msum += sm[8 + s] as i32 * asum(32 * s, 32);
                    }
                    let (d, dmin) = (f16(x, q4_k::D_OFFSET), f16(x, q4_k::DMIN_OFFSET));
                    acc = (d * da).mul_add(isum as f32, acc);
                    acc = (-(dmin * da)).mul_add(msum as f32, acc);
                }
                KQuant::Q6K => {
                    let mut isum = 0i32;
                    for i in 0..256 {
                        // ggml dequantize_row_q6_K's index map.
                        let (h, l) = (i / 128, i % 128);
                        let ql = x[q6_k::QL_OFFSET + 64 * h + l % 64];
                        let lo = if l < 64 { ql & 0xF } else { ql >> 4 };
                        let qh = x[q6_k::QH_OFFSET + 32 * h + l % 32] >> (2 * (l / 32)) & 3;
                        let q = (lo | qh << 4) as i32 - 32;
                        let sc = x[q6_k::SCALES_OFFSET + i / 16] as i8 as i32;
                        isum += sc * q * q8(i);
                    }
                    acc = (f16(x, q6_k::D_OFFSET) * da).mul_add(isum as f32, acc);
                }
            }
        }
        acc
    }

    /// Every output equals the scalar reference bit for bit, for both formats, numbers of
    /// weight rows that leave short groups, and numbers of activation rows that take the direct
    /// path, full tiles and remainders.
    #[test]
    fn gemm_equals_scalar_arithmetic_bit_for_bit() {
        if !super::super::avx2_tile::vnni_available() {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to run");
            return;
        }
        let mut next = super::super::xorshift(0x0123_4567_89ab_cdef);
        for fmt in [KQuant::Q4K, KQuant::Q6K] {
            for (nb, n_rows, m) in [
                (1usize, 8usize, 1usize),
                (2, 16, 3),
                (1, 5, 2),
                (3, 11, 13),
                (2, 8, 8),
                (8, 3, 1),
                (2, 33, 9),
            ] {
                let bb = fmt.block_bytes();
                let cols = nb * 256;
                let mut w: Vec<u8> = (0..n_rows * nb * bb).map(|_| next() as u8).collect();
                for blk in w.chunks_exact_mut(bb) {
                    match fmt {
                        KQuant::Q4K => {
                            blk[q4_k::D_OFFSET + 1] &= 0x3b;
                            blk[q4_k::DMIN_OFFSET + 1] &= 0x3b;
                        }
                        KQuant::Q6K => blk[q6_k::D_OFFSET + 1] &= 0x3b,
                    }
                }
                let x: Vec<f32> = (0..m * cols)
                    .map(|_| ((next() % 2001) as f32 - 1000.0) * 1e-3)
                    .collect();
                let mut acts = vec![0u8; m * nb * q8_k::BLOCK_BYTES];
                for (xr, ab) in x
                    .chunks_exact(cols)
                    .zip(acts.chunks_exact_mut(nb * q8_k::BLOCK_BYTES))
                {
                    infer_quant::q8_k::quantize_row_ref(xr, ab);
                }
                let mut y = vec![f32::NAN; m * n_rows];
                let out = OutMat::rows_last(&mut y, m, n_rows);
                // SAFETY: VNNI detected; `w` is n_rows rows of nb super-blocks, `acts` m rows.
                unsafe { rows_times_acts(fmt, &w, nb * bb, nb, &acts, m, out) };
                for r in 0..n_rows {
                    for i in 0..m {
                        let ar = nb * q8_k::BLOCK_BYTES;
                        let want = reference(
                            fmt,
                            &w[r * nb * bb..(r + 1) * nb * bb],
                            &acts[i * ar..(i + 1) * ar],
                            nb,
                        );
                        let got = y[i * n_rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{fmt:?} nb={nb} m={m} row {r} act {i}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
