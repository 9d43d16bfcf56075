//! AVX2 kernels for the Q8_0-activation family (Q4_0, Q5_0, Q8_0 weights and the seed's split
//! Q8 format) that unpack each weight block (nibbles, fifth bits, scale) once for several
//! activation rows. A CPU with AVX-512 VNNI takes [`super::vnni_gemm`] instead (see
//! [`rows_times_acts`]).
//!
//! Activations are pre-split ([`super::Q8Rows`]): int8 quants contiguous per row and the block
//! scales as f32. The arithmetic of one (weight row, activation row) pair is that of
//! [`super::vnni_gemm`]: per block the exact integer dot `Σ q_w·q_a` (ggml's `maddubs`/`madd`
//! with the sign trick, its eight lanes summed as integers), then `acc = fma(d_w·d_a, dot, acc)`
//! over the blocks in order from `acc = 0`. The integer sums of eight pairs are gathered into the
//! lanes of one register ([`lane_sums`]) so that the f32 part is one conversion and one FMA per
//! eight pairs: [`tile_acts`] puts eight activation rows in the lanes (one weight block unpacked
//! for all of them; batches of [`ACT_LANES_MIN`] rows or more), [`tile_rows`] eight weight rows
//! (one activation row, the mat-vec). Q4_0 and Q5_0 batches and Q8_0 batches of more than
//! eight rows take [`super::avx2_gemm`] instead (activation rows in the lanes of four- or
//! eight-row groups, no gather); the split Q8 format keeps [`tile_acts`]. All give every pair the same bits, so a mat-vec and any row of a
//! mat-mat agree bit for bit.

use infer_quant::{q4_0, q5_0, q8_0};
use std::arch::x86_64::*;

/// Weight formats with a tile kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Q0 {
    Q4_0,
    Q5_0,
    Q8_0,
    /// The seed's split Q8 format: 32 int8 values per block, the f32 scales in a separate array
    /// (`crate::q8_split`).
    Q8S,
}

/// Const-generic tags of [`Q0`] (the format is resolved at compile time inside the loops).
const F4_0: u8 = 0;
const F5_0: u8 = 1;
const F8_0: u8 = 2;
const F8S: u8 = 3;

/// The format of a const-generic tag.
pub(super) const fn q0_from_tag(tag: u8) -> Q0 {
    match tag {
        F4_0 => Q0::Q4_0,
        F5_0 => Q0::Q5_0,
        F8_0 => Q0::Q8_0,
        _ => Q0::Q8S,
    }
}

/// One 32-value weight block at `xb`: its scale (broadcast) and its 32 signed quants. `wd` is
/// the block's f32 scale for [`Q0::Q8S`] (not read for the other formats).
#[inline(always)]
unsafe fn unpack(fmt: Q0, xb: *const u8, wd: *const f32) -> (__m256, __m256i) {
    if fmt == Q0::Q8S {
        return (
            _mm256_set1_ps(*wd),
            _mm256_loadu_si256(xb as *const __m256i),
        );
    }
    // The f16 scale sits at offset 0 of every ggml format; one 32-bit load + vcvtph2ps (stays
    // inside the block: every block is ≥ 18 bytes).
    let d = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
    let d = _mm256_broadcastss_ps(d);
    let q = match fmt {
        Q0::Q4_0 => _mm256_sub_epi8(
            bytes_from_nibbles_32(xb.add(q4_0::QS_OFFSET)),
            _mm256_set1_epi8(8),
        ),
        Q0::Q5_0 => {
            let hi = _mm256_set1_epi8(0xF0u8 as i8);
            let bxhi = _mm256_andnot_si256(bytes_from_bits_32(xb.add(q5_0::QH_OFFSET)), hi);
            _mm256_or_si256(bytes_from_nibbles_32(xb.add(q5_0::QS_OFFSET)), bxhi)
        }
        Q0::Q8_0 | Q0::Q8S => _mm256_loadu_si256(xb.add(q8_0::QS_OFFSET) as *const __m256i),
    };
    (d, q)
}

/// ggml `bytes_from_nibbles_32`.
#[inline(always)]
pub(super) unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// ggml `bytes_from_bits_32`.
#[inline(always)]
pub(super) unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
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

/// The exact integer dot of one 32-value block pair, in eight i32 lanes: weight quants `qx`
/// (`ax = |qx|`) against the activation quants `y` (ggml's `mul_sum_i8_pairs` without the float
/// conversion; the sign moves onto the activations, so `maddubs` sees an unsigned operand and
/// its i16 pair sums cannot saturate: |q| ≤ 128, |y| ≤ 127).
#[inline(always)]
unsafe fn pair_dot(ax: __m256i, qx: __m256i, y: __m256i) -> __m256i {
    let sy = _mm256_sign_epi8(y, qx);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Lane `j` = the sum of the eight i32 lanes of `s[j]` (exact: the block sums stay far below
/// 2³¹). A transpose-and-add: 12 + 6 + 3 single-cycle shuffles and adds for eight sums.
#[inline(always)]
unsafe fn lane_sums(s: [__m256i; 8]) -> __m256i {
    // [a0+a2, b0+b2, a1+a3, b1+b3 | a4+a6, b4+b6, a5+a7, b5+b7]
    let l1 = |a, b| _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    // [Σa0..3, Σb0..3, Σc0..3, Σd0..3 | Σa4..7, Σb4..7, Σc4..7, Σd4..7]
    let l2 = |x, y| _mm256_add_epi32(_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y));
    let u0 = l2(l1(s[0], s[1]), l1(s[2], s[3]));
    let u1 = l2(l1(s[4], s[5]), l1(s[6], s[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// Lane `j < N` = `W_row · A_j` for one weight row `w` of `nb` blocks of format `F` (`wd`: the
/// row's f32 scales for [`Q0::Q8S`], else unused) and `N ≤ 8` activation rows (quants `qs[j]`,
/// `nb·32` values); `dt` holds the activation scales transposed, `dt[8·b + j]` = row `j`'s scale
/// of block `b` (`nb · 8` f32, lanes `j ≥ N` zero). Lanes `j ≥ N` are 0 for finite weights.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` must hold `nb` blocks, each `qs[j]` `nb·32` bytes,
/// `dt` `8·nb` f32 (and `wd` `nb` f32 for Q8S).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_acts<const F: u8, const N: usize>(
    nb: usize,
    w: *const u8,
    wd: *const f32,
    qs: [*const i8; N],
    dt: *const f32,
) -> __m256 {
    let fmt = q0_from_tag(F);
    let bb = block_bytes(fmt);
    let mut acc = _mm256_setzero_ps();
    // Block `ib`'s weight scale and its eight integer dots.
    let dots = |ib: usize| {
        let (dw, qx) = unpack(fmt, w.add(ib * bb), wd.wrapping_add(ib));
        let ax = _mm256_sign_epi8(qx, qx);
        let mut s = [_mm256_setzero_si256(); 8];
        for j in 0..N {
            let y = _mm256_loadu_si256(qs[j].add(ib * 32) as *const __m256i);
            s[j] = pair_dot(ax, qx, y);
        }
        (dw, lane_sums(s))
    };
    if nb == 0 {
        return acc;
    }
    // Software-pipelined: block ib's dots are issued before block ib − 1's conversion and FMA.
    let mut prev = dots(0);
    for ib in 1..=nb {
        let next = if ib < nb { dots(ib) } else { prev };
        let (dw, d) = prev;
        let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(dt.add(8 * (ib - 1))));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(d), acc);
        prev = next;
    }
    acc
}

/// The scales of block `ib` of the weight rows `w[k]` (`wd[k]` for [`Q0::Q8S`]) as the f32
/// lanes `k < R` (lanes `k ≥ R` are 0). The f16 scales are packed into one register as integers
/// and converted together (lane-by-lane inserts or a store and a reload cost more).
#[inline(always)]
unsafe fn row_scales<const R: usize>(
    fmt: Q0,
    w: [*const u8; R],
    wd: [*const f32; R],
    ib: usize,
) -> __m256 {
    if fmt == Q0::Q8S {
        let f: [f32; 8] = std::array::from_fn(|k| if k < R { *wd[k].add(ib) } else { 0.0 });
        return _mm256_setr_ps(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
    }
    let bb = block_bytes(fmt);
    let h = |k: usize| {
        if k < R {
            u64::from((w[k].add(ib * bb) as *const u16).read_unaligned())
        } else {
            0
        }
    };
    let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// Lane `k < R` = `W_k · A` for `R ≤ 8` weight rows `w[k]` of `nb` blocks of format `F`
/// (`wd[k]`: row `k`'s f32 scales for [`Q0::Q8S`], else unused) and one activation row (quants
/// `qy`, `nb·32` values; scales `d`, `nb` f32). Lanes `k ≥ R` are 0.
///
/// # Safety
/// As [`tile_acts`]: each `w[k]` holds `nb` blocks, `qy` `nb·32` bytes, `d` `nb` f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_rows<const F: u8, const R: usize>(
    nb: usize,
    w: [*const u8; R],
    wd: [*const f32; R],
    qy: *const i8,
    d: *const f32,
) -> __m256 {
    let fmt = q0_from_tag(F);
    let bb = block_bytes(fmt);
    let mut acc = _mm256_setzero_ps();
    for ib in 0..nb {
        let y = _mm256_loadu_si256(qy.add(ib * 32) as *const __m256i);
        let mut s = [_mm256_setzero_si256(); 8];
        for k in 0..R {
            let xb = w[k].add(ib * bb);
            // Decode streams every weight once: hint the rows' bytes ahead (see
            // `super::prefetch_stream`).
            super::prefetch_stream(xb, 1);
            let (_, qx) = unpack(fmt, xb, wd[k].wrapping_add(ib));
            s[k] = pair_dot(_mm256_sign_epi8(qx, qx), qx, y);
        }
        let dw = row_scales::<R>(fmt, w, wd, ib);
        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(ib)));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lane_sums(s)), acc);
    }
    acc
}

/// The eight f32 lanes of `v`.
#[inline(always)]
unsafe fn lanes(v: __m256) -> [f32; 8] {
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), v);
    l
}

/// True when this CPU has AVX512F/VL/BW/VNNI (checked once).
pub(crate) fn vnni_available() -> bool {
    use std::sync::OnceLock;
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| {
        super::avx2_available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// The tile kernel for the ggml block format `fmt`, if any.
pub(crate) fn q0_of(fmt: infer_quant::QuantFormat) -> Option<Q0> {
    match fmt {
        infer_quant::QuantFormat::Q4_0 => Some(Q0::Q4_0),
        infer_quant::QuantFormat::Q5_0 => Some(Q0::Q5_0),
        infer_quant::QuantFormat::Q8_0 => Some(Q0::Q8_0),
        _ => None,
    }
}

/// Bytes per block of `fmt` (values only for [`Q0::Q8S`]).
pub(crate) const fn block_bytes(fmt: Q0) -> usize {
    match fmt {
        Q0::Q4_0 => q4_0::BLOCK_BYTES,
        Q0::Q5_0 => q5_0::BLOCK_BYTES,
        Q0::Q8_0 => q8_0::BLOCK_BYTES,
        Q0::Q8S => 32,
    }
}

/// Element (r, i) of `out` = `W_r · A_i` for the weight rows `ws` (`row_bytes` each,
/// `acts.cols / 32` blocks of the ggml format `fmt`) and every activation row `i` of `acts`:
/// tiles of activation rows, then the remainder one by one (same arithmetic per pair).
///
/// Panics if `ws` is not whole rows of at least a row's blocks, or `fmt` is [`Q0::Q8S`]
/// (see [`rows_times_acts_q8s`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`super::avx2_available`]); `out` must own elements
/// (r, i) for every r < `ws.len() / row_bytes` and i < `acts.m` (see [`super::OutMat::put`]).
pub(crate) unsafe fn rows_times_acts(
    fmt: Q0,
    ws: &[u8],
    row_bytes: usize,
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    let nb = acts.cols / 32;
    let m = acts.m;
    assert!(fmt != Q0::Q8S, "split Q8 goes through rows_times_acts_q8s");
    assert!(
        row_bytes >= nb * block_bytes(fmt) && row_bytes > 0 && ws.len().is_multiple_of(row_bytes),
        "tile: weight rows of {row_bytes} bytes, {} bytes given",
        ws.len()
    );
    assert!(acts.qs.len() >= m * acts.cols && acts.d.len() >= m * nb);
    debug_assert!(super::avx2_available());
    rows_dispatch(fmt, ws, row_bytes, std::ptr::null(), acts, out)
}

/// [`rows_times_acts`] for the split Q8 format: int8 `values` (`acts.cols` per row) with f32
/// `scales` (`acts.cols / 32` per row, `crate::q8_split`).
///
/// Panics if `values` is not whole rows or `scales` has not one scale per 32 values.
///
/// # Safety
/// As [`rows_times_acts`].
pub(crate) unsafe fn rows_times_acts_q8s(
    values: &[u8],
    scales: &[f32],
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    let cols = acts.cols;
    assert!(
        cols > 0 && cols.is_multiple_of(32) && values.len().is_multiple_of(cols),
        "split Q8 tile: partial row"
    );
    assert_eq!(scales.len(), values.len() / 32, "split Q8 tile: scales");
    assert!(acts.qs.len() >= acts.m * cols && acts.d.len() >= acts.m * (cols / 32));
    debug_assert!(super::avx2_available());
    rows_dispatch(Q0::Q8S, values, cols, scales.as_ptr(), acts, out)
}

/// Picks the row loop for `fmt` and the CPU: [`super::vnni_gemm`] with AVX-512 VNNI, else the
/// AVX2 tiles.
///
/// # Safety
/// As [`rows_times_acts`]; `wd` holds the rows' f32 scales for [`Q0::Q8S`].
unsafe fn rows_dispatch(
    fmt: Q0,
    ws: &[u8],
    row_bytes: usize,
    wd: *const f32,
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    if vnni_available() {
        return super::vnni_gemm::rows_times_acts(fmt, ws, row_bytes, wd, acts, out);
    }
    match fmt {
        Q0::Q4_0 => rows_avx2::<F4_0>(ws, row_bytes, wd, acts, out),
        Q0::Q5_0 => rows_avx2::<F5_0>(ws, row_bytes, wd, acts, out),
        Q0::Q8_0 => rows_avx2::<F8_0>(ws, row_bytes, wd, acts, out),
        Q0::Q8S => rows_avx2::<F8S>(ws, row_bytes, wd, acts, out),
    }
}

/// Activation rows from which a product puts activation rows in the lanes ([`tile_acts`]);
/// fewer take the weight-row lanes of [`tile_rows`] per activation row (same bits).
pub(crate) const ACT_LANES_MIN: usize = 4;

/// Q8_0 products of more than this many activation rows take [`super::avx2_gemm`]'s four-row
/// groups; up to it, [`tile_acts`].
const Q8_GEMM_AFTER: usize = 8;

thread_local! {
    /// Transposed activation scales of [`rows_avx2`] (`crate::scratch`).
    static DT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The row loop of [`rows_times_acts`] for format tag `F`: batches of [`ACT_LANES_MIN`] rows or
/// more of Q4_0 and Q5_0, of more than [`Q8_GEMM_AFTER`] of Q8_0, through [`super::avx2_gemm`];
/// otherwise activation rows in
/// groups of eight (the last group of [`ACT_LANES_MIN`] to eight rows too) through
/// [`tile_acts`], the rest one by one through [`tile_rows`], eight weight rows at a time.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<const F: u8>(
    ws: &[u8],
    row_bytes: usize,
    wd: *const f32,
    acts: &super::Q8Rows,
    out: super::OutMat,
) {
    let nb = acts.cols / 32;
    let (m, cols) = (acts.m, acts.cols);
    let qs = acts.qs.as_ptr();
    let ds = acts.d.as_ptr();
    let n_rows = ws.len() / row_bytes;
    if m >= ACT_LANES_MIN && matches!(q0_from_tag(F), Q0::Q4_0 | Q0::Q5_0) {
        if m.is_multiple_of(8) {
            return super::avx2_gemm::rows_times_acts8::<F>(ws, row_bytes, acts, out);
        }
        return super::avx2_gemm::rows_times_acts::<F>(ws, row_bytes, acts, out);
    }
    // Q8_0 from nine rows (A/B on the 49152 × 576 output matrix, old/new: 4 rows 0.83, 8 rows
    // 0.98, 12 rows 1.17, 16 rows 1.05, 32 and 64 rows 1.06): up to eight rows the four-row
    // groups amortize each weight pair's scale unpacking and shuffles over too few products.
    if m > Q8_GEMM_AFTER && q0_from_tag(F) == Q0::Q8_0 {
        return super::avx2_gemm::rows_times_acts_q8(ws, row_bytes, acts, out);
    }
    let mut i = 0;
    if m >= ACT_LANES_MIN {
        let mut dt = crate::scratch::take(&DT, 8 * nb);
        while m - i >= ACT_LANES_MIN {
            let n = (m - i).min(8);
            // `take` may hand back a longer buffer (one a wider product left): only the first
            // 8 · nb scales are this product's; reading on would run past the activations.
            for (ib, lane) in dt[..8 * nb].chunks_exact_mut(8).enumerate() {
                for (j, v) in lane.iter_mut().enumerate() {
                    *v = if j < n {
                        *ds.add((i + j) * nb + ib)
                    } else {
                        0.0
                    };
                }
            }
            macro_rules! acts_n {
                ($n:literal) => {
                    for (r, w) in ws.chunks_exact(row_bytes).enumerate() {
                        let v = tile_acts::<F, $n>(
                            nb,
                            w.as_ptr(),
                            wd.wrapping_add(r * nb),
                            std::array::from_fn(|j| qs.add((i + j) * cols)),
                            dt.as_ptr(),
                        );
                        for (j, x) in lanes(v).into_iter().take($n).enumerate() {
                            out.put(r, i + j, x);
                        }
                    }
                };
            }
            match n {
                8 => acts_n!(8),
                7 => acts_n!(7),
                6 => acts_n!(6),
                5 => acts_n!(5),
                _ => acts_n!(4),
            }
            i += n;
        }
        crate::scratch::give(&DT, dt);
    }
    for i in i..m {
        let (qy, d) = (qs.add(i * cols), ds.add(i * nb));
        let mut r0 = 0;
        macro_rules! rows_r {
            ($r:literal) => {{
                let v = tile_rows::<F, $r>(
                    nb,
                    std::array::from_fn(|k| ws.as_ptr().add((r0 + k) * row_bytes)),
                    std::array::from_fn(|k| wd.wrapping_add((r0 + k) * nb)),
                    qy,
                    d,
                );
                for (k, x) in lanes(v).into_iter().take($r).enumerate() {
                    out.put(r0 + k, i, x);
                }
            }};
        }
        while n_rows - r0 >= 8 {
            rows_r!(8);
            r0 += 8;
        }
        match n_rows - r0 {
            0 => {}
            1 => rows_r!(1),
            2 => rows_r!(2),
            3 => rows_r!(3),
            4 => rows_r!(4),
            5 => rows_r!(5),
            6 => rows_r!(6),
            _ => rows_r!(7),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random weight rows (`rows` rows of `nb` blocks of `fmt`; quants avoid −128, as ggml's
    /// quantizers do; f16 scales finite and moderate), their f32 scales for Q8S, and `m`
    /// random activation rows.
    fn case(
        next: &mut impl FnMut() -> u64,
        fmt: Q0,
        nb: usize,
        rows: usize,
        m: usize,
    ) -> (Vec<u8>, Vec<f32>, super::super::Q8Rows) {
        let bb = block_bytes(fmt);
        let w: Vec<u8> = (0..rows * nb * bb)
            .map(|k| {
                let r = next() as u8;
                if fmt != Q0::Q8S && k % bb == 1 {
                    r & 0x3b
                } else if r == 0x80 && matches!(fmt, Q0::Q8_0 | Q0::Q8S) {
                    0x81
                } else {
                    r
                }
            })
            .collect();
        let wd: Vec<f32> = (0..rows * nb)
            .map(|_| (next() % 1000) as f32 * 1e-4)
            .collect();
        let x: Vec<f32> = (0..m * nb * 32)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let acts = super::super::Q8Rows::quantize(&x, m, nb * 32).unwrap();
        (w, wd, acts)
    }

    /// The exact model of a pair: integer block dots of the unpacked quants, then
    /// `acc = fma(d_w·d_a, dot, acc)` in block order.
    fn model(fmt: Q0, w: &[u8], wd: &[f32], qa: &[i8], da: &[f32]) -> f32 {
        let bb = block_bytes(fmt);
        let mut acc = 0f32;
        for (b, (blk, a)) in w.chunks_exact(bb).zip(qa.chunks_exact(32)).enumerate() {
            let (dw, q): (f32, Vec<i32>) = match fmt {
                Q0::Q8S => (wd[b], blk.iter().map(|&v| v as i8 as i32).collect()),
                _ => {
                    let dw = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
                    let q = match fmt {
                        Q0::Q4_0 => (0..32)
                            .map(|k| ((blk[2 + k % 16] >> (4 * (k / 16))) & 15) as i32 - 8)
                            .collect(),
                        Q0::Q5_0 => {
                            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                            (0..32)
                                .map(|k| {
                                    let lo = (blk[6 + k % 16] >> (4 * (k / 16))) & 15;
                                    (lo as i32 | (((qh >> k) & 1) as i32) << 4) - 16
                                })
                                .collect()
                        }
                        _ => blk[2..34].iter().map(|&v| v as i8 as i32).collect(),
                    };
                    (dw, q)
                }
            };
            let dot: i32 = q.iter().zip(a).map(|(&x, &y)| x * y as i32).sum();
            acc = (dw * da[b]).mul_add(dot as f32, acc);
        }
        acc
    }

    /// Every product of [`rows_times_acts`] (activation rows in lanes for batches of four or
    /// more, weight rows in lanes below, every remainder width; for Q4_0/Q5_0 batches
    /// and Q8_0 batches from nine rows `avx2_gemm`'s groups of four rows (of eight for Q4_0/Q5_0
    /// batches of a multiple of eight rows), padded last groups, odd weight row counts and more than one pass of 64
    /// activation rows; every batch size from 1 to 17) equals the exact
    /// model bit for bit, for every format and odd and even block counts.
    #[test]
    fn products_equal_the_exact_model_bit_for_bit() {
        if !crate::vec_dot::avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut next = super::super::xorshift(0x9e37_79b9_7f4a_7c15);
        for fmt in [Q0::Q4_0, Q0::Q5_0, Q0::Q8_0, Q0::Q8S] {
            for (nb, rows, m) in [
                (1usize, 3usize, 1usize),
                (2, 9, 2),
                (3, 17, 4),
                (18, 8, 13),
                (20, 11, 23),
                (5, 16, 8),
                (1, 1, 4),
                (7, 5, 5),
                (3, 3, 6),
                (2, 7, 7),
                (9, 2, 9),
                (2, 3, 70),
                (3, 4, 129),
            ]
            .into_iter()
            // Every batch size to 17 and a few past two groups of eight (64 and 72: one and
            // two passes of the Q4_0/Q5_0 eight-row groups), against 13 weight rows (one group
            // of eight weight-row lanes and a remainder of five).
            .chain((1..=17).chain([31, 33, 40, 64, 72]).map(|m| (3, 13, m)))
            {
                let (w, wd, acts) = case(&mut next, fmt, nb, rows, m);
                let rb = nb * block_bytes(fmt);
                let mut got = vec![f32::NAN; m * rows];
                let out = super::super::OutMat::rows_last(&mut got, m, rows);
                // SAFETY: AVX2 detected; whole rows of nb blocks; outputs m × rows.
                unsafe {
                    if fmt == Q0::Q8S {
                        rows_times_acts_q8s(&w, &wd, &acts, out);
                    } else {
                        rows_times_acts(fmt, &w, rb, &acts, out);
                    }
                }
                for i in 0..m {
                    for r in 0..rows {
                        let want = model(
                            fmt,
                            &w[r * rb..(r + 1) * rb],
                            &wd[r * nb..(r + 1) * nb],
                            &acts.qs[i * nb * 32..(i + 1) * nb * 32],
                            &acts.d[i * nb..(i + 1) * nb],
                        );
                        let g = got[i * rows + r];
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{fmt:?} nb={nb} m={m} row {r} act {i}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
