//! The decode (row-at-a-time) attention kernel: a run of one query row's heads (all of them, a
//! GQA group, or one head) against their kv heads' cached keys and values, each K/V row read
//! once for all the heads of the run.
//!
//! Per head `h` of the run, over the visible keys `j = lo..=hi`:
//! `s_j = scale · q_h·k_j` (soft-capped if configured), `p_j = exp(s_j − max) / Σ p`,
//! `o_h = Σ_j p_j · v_j` (HF `eager_attention_forward`, max-subtracted f32 softmax). The
//! arithmetic of one head never depends on the other heads of its run, so running a row's heads
//! together, by GQA group or one at a time gives the same bits:
//!
//! - `q_h·k_j`: `crate::cpu::dot`'s summation order (16 interleaved partial sums, reduced
//!   pairwise). With AVX2, eight keys at a time: two 8-lane accumulators per key, then one
//!   transposed reduction (`permute2f128`/`shuffle_ps` adds) that yields the eight sums in one
//!   register, in the same pairwise order as `dot`.
//! - `exp`: [`exp_poly`] (Cephes `expf`, ≈ 2 ulp), vectorised; `Σ p` in 8 interleaved partial
//!   sums reduced pairwise, then the remainder in key order, then a sink's `exp(sink − max)`.
//! - `o_h`: per element, from 0, `+= p_j · v_j` (a multiply and an add, no FMA) in key order.
//!
//! The AVX2 copy runs the same multiplies and adds in the same order as the generic one, so both
//! give the same bits (tested).
//!
//! The cached rows are f32 or f16 ([`KvElem`]); an f16 key or value is widened exactly to f32
//! as it is loaded (F16C `_mm256_cvtph_ps` on AVX2) and the arithmetic is the f32 one above, so
//! an f16 cache gives the bits of an f32 cache holding the same (f16-representable) values.

use crate::attention::AttentionParams;
#[cfg(target_arch = "x86_64")]
use crate::attention_blocked::avx2_fma;
#[cfg(target_arch = "x86_64")]
use crate::attention_blocked::f16c;
use crate::cpu::dot_generic;
use crate::kv_type::KvElem;
use crate::ops::exp_poly;

/// The kv heads of a run inside the cached rows: `k` and `v` are `[t_kv, row_len]` row-major,
/// f32 or f16 (`T`; `row_len = n_kv_heads · head_dim`). The run's kv heads are consecutive from
/// the one whose values start at column `col` (`col = g · head_dim` for kv head `g`): query head
/// `h` of the run reads kv head `h / group` of them, whose key/value at position `j` is
/// `k[j·row_len + col + (h / group)·head_dim..][..head_dim]` (likewise `v`).
#[derive(Clone, Copy)]
pub(crate) struct KvHeads<'a, T> {
    pub(crate) k: &'a [T],
    pub(crate) v: &'a [T],
    /// Values per cached row (all kv heads).
    pub(crate) row_len: usize,
    /// The run's first kv head's first value within a row.
    pub(crate) col: usize,
    /// Query heads of the run per kv head (the GQA group size, or 1 for a run of one head).
    pub(crate) group: usize,
    /// Read the run's rows once in address order before the passes ([`warm_rows`]): for a
    /// caller that runs all of a row's heads on one thread (batched decode).
    pub(crate) warm: bool,
}

impl<T> KvHeads<'_, T> {
    /// Column of query head `h`'s kv head within a row.
    #[inline(always)]
    fn col_of(&self, h: usize, hd: usize) -> usize {
        self.col + h / self.group * hd
    }

    /// Values of a row the run of `heads` query heads reads: its kv heads, from `col` on.
    #[inline(always)]
    fn span(&self, heads: usize, hd: usize) -> usize {
        heads.div_ceil(self.group) * hd
    }
}

/// A run of query heads of one row: `q` is `[heads, head_dim]` f32 (the heads' slices of the
/// query row, contiguous), `pos` the row's position in its sequence, and `sinks` the heads'
/// attention-sink logits (`heads` values) if the family has sinks (gpt-oss).
#[derive(Clone, Copy)]
pub(crate) struct GroupQuery<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) pos: usize,
    pub(crate) sinks: Option<&'a [f32]>,
}

/// Keys scored per transposed reduction.
const KEY_TILE: usize = 8;

/// Key tiles [`dots_avx2`] prefetches ahead of the tile it scores.
#[cfg(target_arch = "x86_64")]
const KEY_AHEAD: usize = 2;

/// Interleaved partial sums of the softmax denominator.
const SUM_LANES: usize = 8;

/// Values of scratch [`group_attention`] needs for `heads` heads of `hd` values over up to
/// `keys` keys of `T`: the scores `[heads, keys]`, and for f16 a key tile widened to f32
/// (`8 · hd`).
pub(crate) fn scratch_len<T: KvElem>(heads: usize, keys: usize, hd: usize) -> usize {
    heads * keys + T::tile_buf(KEY_TILE, hd)
}

/// Attention of the run `query` (`heads = q.len() / head_dim` heads) over its kv heads `kv`, into
/// `o` (`[heads, head_dim]`, fully overwritten). `scores` is scratch of at least
/// [`scratch_len`]`(heads, pos + 1, head_dim)` values. A row that sees no key (window 0) gets
/// zeros.
///
/// Head dims 32, 64, 128 and 256 run copies specialised to the length; with AVX2, FMA and F16C
/// the key tiles and the weighted sum of values use 256-bit registers. Every copy gives the same
/// bits (see the module docs).
pub(crate) fn group_attention<T: KvElem>(
    query: GroupQuery<'_>,
    kv: KvHeads<'_, T>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() && f16c() {
        // SAFETY: AVX2, FMA and F16C are available (checked once at run time).
        unsafe {
            return match params.head_dim {
                32 => group_avx2::<T, 32>(query, kv, params, scores, o),
                64 => group_avx2::<T, 64>(query, kv, params, scores, o),
                128 => group_avx2::<T, 128>(query, kv, params, scores, o),
                256 => group_avx2::<T, 256>(query, kv, params, scores, o),
                _ => group_avx2::<T, 0>(query, kv, params, scores, o),
            };
        }
    }
    group_generic(query, kv, params, scores, o)
}

/// [`group_attention`] on the portable path (scalar dots, per-element value sums).
pub(crate) fn group_generic<T: KvElem>(
    query: GroupQuery<'_>,
    kv: KvHeads<'_, T>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let hd = params.head_dim;
    group_impl::<T, 0>(
        query,
        kv,
        params,
        scores,
        o,
        |q, kv, lo, s, _| dots_generic(q, hd, kv, lo, s),
        |w, kv, lo, o| values_generic(w, hd, kv, lo, o),
    )
}

/// [`group_impl`] compiled with AVX2, FMA and F16C, its key tiles and value sums in
/// intrinsics.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<T: KvElem, const HD: usize>(
    query: GroupQuery<'_>,
    kv: KvHeads<'_, T>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let hd = if HD == 0 { params.head_dim } else { HD };
    group_impl::<T, HD>(
        query,
        kv,
        params,
        scores,
        o,
        // SAFETY: AVX2 and F16C are available (this function's contract).
        |q, kv, lo, s, wide| unsafe { dots_avx2(q, hd, kv, lo, s, wide) },
        // SAFETY: as above.
        |w, kv, lo, o| unsafe { values_avx2(w, hd, kv, lo, o) },
    )
}

/// The body of [`group_attention`]. `HD`: the head dim when known at compile time, 0 for any.
/// `dots(q, kv, lo, s, wide)` fills `s` (`[heads, n]`) with `q_h·k_{lo+i}` in `dot`'s order
/// (`wide`: the rest of the scratch, for a widened key tile);
/// `values(w, kv, lo, o)` writes `o_h = Σ_i w[h, i] · v_{lo+i}` (`w` is `[heads, n]`).
#[inline(always)]
fn group_impl<T: KvElem, const HD: usize>(
    query: GroupQuery<'_>,
    kv: KvHeads<'_, T>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
    dots: impl Fn(&[f32], KvHeads<'_, T>, usize, &mut [f32], &mut [f32]),
    values: impl Fn(&[f32], KvHeads<'_, T>, usize, &mut [f32]),
) {
    let GroupQuery { q, pos, sinks } = query;
    let hd = if HD == 0 { params.head_dim } else { HD };
    let heads = q.len() / hd;
    let hi = pos; // last visible key (inclusive); pos < t_kv checked by the caller
    let lo = match params.sliding_window {
        Some(w) => (pos + 1).saturating_sub(w), // p − j < w  ⇔  j > p − w
        None => 0,
    };
    if lo > hi {
        o[..heads * hd].fill(0.0);
        return; // window 0: nothing visible
    }
    let n = hi - lo + 1;
    if kv.warm {
        warm_rows(kv, lo, n, kv.span(heads, hd));
    }
    let (scores, wide) = scores.split_at_mut(heads * n);
    dots(&q[..heads * hd], kv, lo, scores, wide);
    for (h, s) in scores.chunks_exact_mut(n).enumerate() {
        softmax_weights(s, params.scale, params.softcap, sinks.map(|x| x[h]));
    }
    values(scores, kv, lo, &mut o[..heads * hd]);
}

/// Bytes of a run's visible key and value rows up to which [`warm_rows`] reads them first.
const WARM_BYTES: usize = 256 << 10;

/// The run's visible rows (`lo..lo + n`, its `span` columns from `kv.col`), keys then values,
/// read once in address order, one value per 64-byte line, when together they fit in
/// [`WARM_BYTES`] (well inside L2): the hardware prefetchers follow that sequential stream
/// (they do not follow the per-head slices the passes read, one or two lines of every row, and
/// the passes' software prefetches did not keep up), so the passes find the rows in cache (in
/// batched decode every sequence's rows come from memory; `attention/decode_batch` in
/// `benches/kernels.rs` times that step). No effect on any result.
#[inline(always)]
fn warm_rows<T: KvElem>(kv: KvHeads<'_, T>, lo: usize, n: usize, span: usize) {
    if 2 * n * span * size_of::<T>() > WARM_BYTES {
        return;
    }
    let step = (64 / size_of::<T>()).max(1);
    for cache in [kv.k, kv.v] {
        for i in lo..lo + n {
            let row = &cache[i * kv.row_len + kv.col..][..span];
            for e in (0..span).step_by(step) {
                // The load must happen (its value is otherwise unused).
                std::hint::black_box(row[e]);
            }
        }
    }
}

/// One head's raw scores `s` (`q·k_j` of the visible keys) turned into its softmax weights, in
/// place: `s ← scale·s`, soft-capped (`cap·tanh(s/cap)`) if configured, then
/// `s ← exp(s − m) / (Σ exp(s − m) + exp(sink − m))` with `m` the max of the scores and the
/// sink (no sink term without one). Written in lanes so that it vectorises; `exp` is
/// [`exp_poly`].
#[inline(always)]
fn softmax_weights(s: &mut [f32], scale: f32, softcap: Option<f32>, sink: Option<f32>) {
    match softcap {
        Some(cap) => s
            .iter_mut()
            .for_each(|x| *x = cap * (*x * scale / cap).tanh()),
        None => s.iter_mut().for_each(|x| *x *= scale),
    }
    let mut mx = [f32::NEG_INFINITY; SUM_LANES];
    let mut chunks = s.chunks_exact(SUM_LANES);
    for c in &mut chunks {
        for (m, &x) in mx.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut max = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    max = mx.iter().fold(max, |m, &x| m.max(x));
    if let Some(sk) = sink {
        max = max.max(sk);
    }
    let mut acc = [0f32; SUM_LANES];
    let mut chunks = s.chunks_exact_mut(SUM_LANES);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c.iter_mut()) {
            *x = exp_poly(*x - max);
            *a += *x;
        }
    }
    let mut width = SUM_LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for x in chunks.into_remainder() {
        *x = exp_poly(*x - max);
        sum += *x;
    }
    if let Some(sk) = sink {
        sum += exp_poly(sk - max);
    }
    let inv = 1.0 / sum;
    s.iter_mut().for_each(|x| *x *= inv);
}

/// `s[h·n + i] = q_h · k_{lo+i}` (`q`: `[heads, hd]`, `s`: `[heads, n]`), one
/// [`dot_generic`] per pair.
#[inline(always)]
fn dots_generic<T: KvElem>(q: &[f32], hd: usize, kv: KvHeads<'_, T>, lo: usize, s: &mut [f32]) {
    let n = s.len() / (q.len() / hd);
    for (h, (qh, sh)) in q.chunks_exact(hd).zip(s.chunks_exact_mut(n)).enumerate() {
        let col = kv.col_of(h, hd);
        for (i, si) in sh.iter_mut().enumerate() {
            *si = dot_generic(qh, &kv.k[(lo + i) * kv.row_len + col..][..hd]);
        }
    }
}

/// `o[h, :] = Σ_i w[h·n + i] · v_{lo+i}` (`w`: `[heads, n]`, `o`: `[heads, hd]`), per element
/// from 0 in key order.
#[inline(always)]
fn values_generic<T: KvElem>(w: &[f32], hd: usize, kv: KvHeads<'_, T>, lo: usize, o: &mut [f32]) {
    let n = w.len() / (o.len() / hd);
    for (h, (wh, oh)) in w.chunks_exact(n).zip(o.chunks_exact_mut(hd)).enumerate() {
        let col = kv.col_of(h, hd);
        oh.fill(0.0);
        for (i, &wi) in wh.iter().enumerate() {
            let vj = &kv.v[(lo + i) * kv.row_len + col..][..hd];
            for (a, &x) in oh.iter_mut().zip(vj) {
                *a += wi * x.widen();
            }
        }
    }
}

/// Prefetch (into L1) the `span` values from column `kv.col` (the run's kv heads) of the
/// [`KEY_TILE`] key rows from `j0`.
/// Hints only: no architectural effect, and an address past the cache is never dereferenced.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_key_tile<T: KvElem>(kv: KvHeads<'_, T>, j0: usize, span: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let kp = kv.k.as_ptr() as *const i8;
    for u in 0..KEY_TILE {
        let row = kp.wrapping_add(((j0 + u) * kv.row_len + kv.col) * size_of::<T>());
        for line in (0..span * size_of::<T>()).step_by(64) {
            // SAFETY: a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line)) };
        }
    }
}

/// [`dots_generic`] with AVX2: for `hd` a multiple of 16, tiles of [`KEY_TILE`] keys, each key's
/// 16 partial sums in two registers (`dot`'s lanes), then [`reduce8`]; the keys after the last
/// whole tile (and every key when `hd` is not a multiple of 16) through `dot_avx2_kv`. Same bits as
/// [`dots_generic`]. A tile is scored for every kv head of the run before the next tile (its rows'
/// columns of the run read in order, a stream the prefetchers follow); an f16 tile of one kv head
/// is widened once into `wide` (at least `8 · hd` values) for all the heads that score it.
///
/// # Safety
/// AVX2 and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn dots_avx2<T: KvElem>(
    q: &[f32],
    hd: usize,
    kv: KvHeads<'_, T>,
    lo: usize,
    s: &mut [f32],
    wide: &mut [f32],
) {
    use std::arch::x86_64::*;
    let heads = q.len() / hd;
    let n = s.len() / heads;
    let span = kv.span(heads, hd);
    let tiles = if hd.is_multiple_of(16) {
        n / KEY_TILE
    } else {
        0
    };
    // Every key row read below lies in `kv.k`: rows lo..lo+n are visible keys (< t_kv).
    assert!((lo + n - 1) * kv.row_len + kv.col + span <= kv.k.len() && s.len() == heads * n);
    // Key rows KEY_AHEAD tiles ahead of the one being widened, toward L1: in batched decode
    // the cache rows come from memory, and the widening waited on each tile's first loads.
    for t in 0..KEY_AHEAD.min(tiles) {
        prefetch_key_tile(kv, lo + t * KEY_TILE, span);
    }
    for t in 0..tiles {
        if t + KEY_AHEAD < tiles {
            prefetch_key_tile(kv, lo + (t + KEY_AHEAD) * KEY_TILE, span);
        }
        let j0 = lo + t * KEY_TILE;
        // The same keys' value rows, toward L2 for the value pass: the hardware prefetchers do
        // not cover them on their own (the value pass spent most of its time waiting on them).
        for u in 0..KEY_TILE {
            let vp = kv.v[(j0 + u) * kv.row_len + kv.col..].as_ptr() as *const i8;
            for line in (0..span * std::mem::size_of::<T>()).step_by(64) {
                // A hint only (no architectural effect); the address is inside `v`.
                _mm_prefetch::<_MM_HINT_T1>(vp.wrapping_add(line));
            }
        }
        for h0 in (0..heads).step_by(kv.group) {
            let col = kv.col_of(h0, hd);
            let rows: [*const T; KEY_TILE] =
                std::array::from_fn(|u| kv.k[(j0 + u) * kv.row_len + col..].as_ptr());
            // SAFETY: each row's hd values lie in `kv.k` (asserted above); hd is a multiple of
            // 16; AVX2 and F16C are available.
            let kp = unsafe { T::keys8(rows, hd, wide) };
            for h in h0..(h0 + kv.group).min(heads) {
                let qp = q[h * hd..].as_ptr();
                let mut sums = [_mm256_setzero_ps(); KEY_TILE];
                for half in 0..2 {
                    let (mut lo4, mut hi4) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
                    for c in (0..hd).step_by(16) {
                        // SAFETY: c + 16 <= hd: inside q's head h and each key's head slice
                        // (bounds asserted above); AVX2 and F16C are available.
                        unsafe {
                            let (qa, qb) =
                                (_mm256_loadu_ps(qp.add(c)), _mm256_loadu_ps(qp.add(c + 8)));
                            for u in 0..4 {
                                let p = kp[half * 4 + u].add(c);
                                lo4[u] =
                                    _mm256_add_ps(lo4[u], _mm256_mul_ps(qa, _mm256_loadu_ps(p)));
                                hi4[u] = _mm256_add_ps(
                                    hi4[u],
                                    _mm256_mul_ps(qb, _mm256_loadu_ps(p.add(8))),
                                );
                            }
                        }
                    }
                    for u in 0..4 {
                        // 16 → 8: acc[i] += acc[i + 8].
                        sums[half * 4 + u] = _mm256_add_ps(lo4[u], hi4[u]);
                    }
                }
                let r = reduce8(sums);
                // SAFETY: h·n + t·8 + 8 <= (h + 1)·n, inside `s`.
                unsafe { _mm256_storeu_ps(s.as_mut_ptr().add(h * n + t * KEY_TILE), r) };
            }
        }
    }
    for (h, (qh, sh)) in q.chunks_exact(hd).zip(s.chunks_exact_mut(n)).enumerate() {
        let col = kv.col_of(h, hd);
        for (i, si) in sh.iter_mut().enumerate().skip(tiles * KEY_TILE) {
            let kj = &kv.k[(lo + i) * kv.row_len + col..][..hd];
            // SAFETY: AVX2 and F16C are available (this function's contract); equal lengths.
            *si = unsafe { crate::cpu::dot_avx2_kv(qh, kj) };
        }
    }
}

/// Eight keys' 8-lane partial sums `v[j]` to the eight sums `Σ v[j]` in one register, lane `j`,
/// in `dot`'s pairwise order: `a[i] = v[i] + v[i+4]`, `b[i] = a[i] + a[i+2]`, `s = b[0] + b[1]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn reduce8(v: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // w[j] = [a_j | a_{j+4}] (a_j = v_j.lo128 + v_j.hi128, i.e. v[i] + v[i+4]).
    let w: [__m256; 4] = std::array::from_fn(|j| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(v[j], v[j + 4]),
            _mm256_permute2f128_ps::<0x31>(v[j], v[j + 4]),
        )
    });
    // x = [b_0 (2 lanes), b_1 | b_4, b_5], z = [b_2, b_3 | b_6, b_7] (b[i] = a[i] + a[i+2]).
    let pair = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let (x, z) = (pair(w[0], w[1]), pair(w[2], w[3]));
    // s_j = b_j[0] + b_j[1], lanes in key order.
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(x, z),
        _mm256_shuffle_ps::<0b11_01_11_01>(x, z),
    )
}

/// [`values_generic`] with AVX2: for `hd` a multiple of 16, 16 columns at a time for up to four
/// heads (their sums in registers), every value row read once per column chunk for those heads;
/// same multiplies and adds per element, so the same bits.
///
/// # Safety
/// AVX2 and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn values_avx2<T: KvElem>(
    w: &[f32],
    hd: usize,
    kv: KvHeads<'_, T>,
    lo: usize,
    o: &mut [f32],
) {
    let heads = o.len() / hd;
    let n = w.len() / heads;
    if !hd.is_multiple_of(16) {
        return values_generic(w, hd, kv, lo, o);
    }
    let span = kv.span(heads, hd);
    assert!((lo + n - 1) * kv.row_len + kv.col + span <= kv.v.len() && w.len() == heads * n);
    // Per kv head of the run, its heads in runs of at most four.
    let mut h0 = 0;
    while h0 < heads {
        let kv_end = (h0 / kv.group + 1) * kv.group;
        let g = (heads.min(kv_end) - h0).min(4);
        let one = KvHeads {
            col: kv.col_of(h0, hd),
            ..kv
        };
        let (w, o) = (&w[h0 * n..(h0 + g) * n], &mut o[h0 * hd..(h0 + g) * hd]);
        // SAFETY: AVX2 and F16C are available; bounds asserted above.
        unsafe {
            match g {
                1 => values_heads_avx2::<T, 1>(w, hd, one, lo, o),
                2 => values_heads_avx2::<T, 2>(w, hd, one, lo, o),
                3 => values_heads_avx2::<T, 3>(w, hd, one, lo, o),
                _ => values_heads_avx2::<T, 4>(w, hd, one, lo, o),
            }
        }
        h0 += g;
    }
}

/// [`values_avx2`] for `G` heads of one kv head (`kv.col`; `w`: `[G, n]`, `o`: `[G, hd]`, `hd` a
/// multiple of 16).
///
/// # Safety
/// AVX2 and F16C must be available; value rows `lo..lo + n` of the kv head lie in `kv.v`;
/// `w.len() == G · n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn values_heads_avx2<T: KvElem, const G: usize>(
    w: &[f32],
    hd: usize,
    kv: KvHeads<'_, T>,
    lo: usize,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = w.len() / G;
    let base = kv.v[lo * kv.row_len + kv.col..].as_ptr();
    for c in (0..hd).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for i in 0..n {
            // SAFETY: row lo+i, columns col+c..col+c+16 of `v` (the caller's contract); AVX2
            // and F16C are available.
            let (va, vb) = unsafe {
                let p = base.add(i * kv.row_len + c);
                (T::load8(p), T::load8(p.add(8)))
            };
            for (g, a) in acc.iter_mut().enumerate() {
                // SAFETY: g < G and i < n: inside `w` (`[G, n]`).
                let wg = _mm256_set1_ps(unsafe { *w.get_unchecked(g * n + i) });
                a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(wg, va));
                a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(wg, vb));
            }
        }
        for (g, a) in acc.iter().enumerate() {
            // SAFETY: 16 floats at o[g·hd + c..], c + 16 <= hd.
            unsafe {
                let p = o.as_mut_ptr().add(g * hd + c);
                _mm256_storeu_ps(p, a[0]);
                _mm256_storeu_ps(p.add(8), a[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        }
    }

    /// The dispatched copies (AVX2 tiles when present, head-dim specialisations) equal the
    /// generic body bit for bit, and a run of heads equals each head alone.
    #[test]
    fn copies_and_runs_give_the_same_bits() {
        copies_and_runs_agree::<f32>(|x| x);
    }

    /// As [`copies_and_runs_give_the_same_bits`] on an f16 cache (the AVX2 copy widening with
    /// F16C, the generic one with `half`).
    #[test]
    fn f16_copies_and_runs_give_the_same_bits() {
        copies_and_runs_agree::<half::f16>(half::f16::from_f32);
    }

    /// An f16 cache gives the bits of an f32 cache holding its values widened.
    #[test]
    fn f16_cache_equals_f32_cache_of_the_widened_values() {
        use half::f16;
        let mut next = rng(0xf16);
        for hd in [32usize, 48, 64, 128] {
            let (n_kv, t, heads) = (2usize, 45usize, 3usize);
            let kv_row = n_kv * hd;
            let k16: Vec<f16> = (0..t * kv_row).map(|_| f16::from_f32(next())).collect();
            let v16: Vec<f16> = (0..t * kv_row).map(|_| f16::from_f32(next())).collect();
            let (k32, v32): (Vec<f32>, Vec<f32>) = (
                k16.iter().map(|x| x.to_f32()).collect(),
                v16.iter().map(|x| x.to_f32()).collect(),
            );
            let q: Vec<f32> = (0..heads * hd).map(|_| next() * 4.0).collect();
            let params = AttentionParams {
                n_q_heads: heads * n_kv,
                n_kv_heads: n_kv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                sliding_window: Some(30),
                softcap: None,
                sinks: None,
            };
            for pos in [0usize, 9, 44] {
                let query = GroupQuery {
                    q: &q,
                    pos,
                    sinks: None,
                };
                let mut s = vec![0f32; scratch_len::<f16>(heads, t, hd)];
                let (mut a, mut b) = (vec![f32::NAN; heads * hd], vec![f32::NAN; heads * hd]);
                let kv16 = KvHeads {
                    k: &k16[..],
                    v: &v16[..],
                    row_len: kv_row,
                    col: hd,
                    group: heads,
                    warm: false,
                };
                let kv32 = KvHeads {
                    k: &k32[..],
                    v: &v32[..],
                    row_len: kv_row,
                    col: hd,
                    group: heads,
                    warm: false,
                };
                group_attention(query, kv16, &params, &mut s, &mut a);
                group_attention(query, kv32, &params, &mut s, &mut b);
                assert_eq!(a, b, "hd {hd} pos {pos}");
            }
        }
    }

    /// The body of the tests above for a cache of `T` (`to` converts a random f32 into it).
    fn copies_and_runs_agree<T: KvElem>(to: fn(f32) -> T) {
        let mut next = rng(0x1234_5678);
        for hd in [32usize, 40, 48, 64, 80, 128, 256] {
            let sinks = [0.5f32, -1.0, 0.25, 2.0, -0.5];
            for (window, softcap, sinks) in [
                (None, None, None),
                (Some(5), Some(30.0f32), None),
                (Some(20), None, Some(&sinks[..])),
            ] {
                let (n_kv, t) = (2usize, 45usize);
                for heads in 1..=5usize {
                    let kv_row = n_kv * hd;
                    let k: Vec<T> = (0..t * kv_row).map(|_| to(next())).collect();
                    let v: Vec<T> = (0..t * kv_row).map(|_| to(next())).collect();
                    let q: Vec<f32> = (0..heads * hd).map(|_| next() * 4.0).collect();
                    let params = AttentionParams {
                        n_q_heads: heads * n_kv,
                        n_kv_heads: n_kv,
                        head_dim: hd,
                        scale: 1.0 / (hd as f32).sqrt(),
                        sliding_window: window,
                        softcap,
                        sinks: None,
                    };
                    let kv = KvHeads {
                        k: &k,
                        v: &v,
                        row_len: kv_row,
                        col: hd,
                        group: heads,
                        warm: true,
                    };
                    for pos in [0usize, 3, 8, 17, 44] {
                        let sinks = sinks.map(|s| &s[..heads]);
                        let query = GroupQuery { q: &q, pos, sinks };
                        let mut s = vec![0f32; scratch_len::<T>(heads, t, hd)];
                        let mut got = vec![f32::NAN; heads * hd];
                        group_attention(query, kv, &params, &mut s, &mut got);
                        let mut want = vec![f32::NAN; heads * hd];
                        group_generic(query, kv, &params, &mut s, &mut want);
                        let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "hd {hd} heads {heads} pos {pos}");
                        for h in 0..heads {
                            let one = GroupQuery {
                                q: &q[h * hd..][..hd],
                                pos,
                                sinks: sinks.map(|s| &s[h..h + 1]),
                            };
                            let mut alone = vec![f32::NAN; hd];
                            group_attention(one, kv, &params, &mut s, &mut alone);
                            assert_eq!(bits(&alone), bits(&got[h * hd..][..hd]), "head {h}");
                        }
                    }
                }
            }
        }
    }

    /// A run over several kv heads (a whole row: GQA groups of 1, 3 and 4 heads over three kv
    /// heads) equals each group run on its own kv head, bit for bit, on f32 and f16 caches,
    /// with the rows warmed first (short caches) and not (long ones).
    #[test]
    fn a_row_run_equals_its_groups() {
        row_equals_groups::<f32>(|x| x);
        row_equals_groups::<half::f16>(half::f16::from_f32);
    }

    fn row_equals_groups<T: KvElem>(to: fn(f32) -> T) {
        let mut next = rng(7);
        let n_kv = 3usize;
        for (hd, group, t) in [
            (64usize, 3usize, 45usize),
            (128, 4, 700),
            (32, 1, 20),
            (40, 2, 33),
        ] {
            let kv_row = n_kv * hd;
            let k: Vec<T> = (0..t * kv_row).map(|_| to(next())).collect();
            let v: Vec<T> = (0..t * kv_row).map(|_| to(next())).collect();
            let heads = n_kv * group;
            let q: Vec<f32> = (0..heads * hd).map(|_| next() * 4.0).collect();
            let params = AttentionParams {
                n_q_heads: heads,
                n_kv_heads: n_kv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                sliding_window: None,
                softcap: None,
                sinks: None,
            };
            let kv = |col: usize, group: usize, warm: bool| KvHeads {
                k: &k,
                v: &v,
                row_len: kv_row,
                col,
                group,
                warm,
            };
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for pos in [0usize, 7, 16, t - 1] {
                let mut s = vec![0f32; scratch_len::<T>(heads, t, hd)];
                let mut row = vec![f32::NAN; heads * hd];
                let query = GroupQuery {
                    q: &q,
                    pos,
                    sinks: None,
                };
                group_attention(query, kv(0, group, true), &params, &mut s, &mut row);
                for g in 0..n_kv {
                    let one = GroupQuery {
                        q: &q[g * group * hd..][..group * hd],
                        pos,
                        sinks: None,
                    };
                    let mut got = vec![f32::NAN; group * hd];
                    group_attention(one, kv(g * hd, group, false), &params, &mut s, &mut got);
                    let want = &row[g * group * hd..][..group * hd];
                    assert_eq!(
                        bits(&got),
                        bits(want),
                        "hd {hd} group {group} kv {g} pos {pos}"
                    );
                    let mut generic = vec![f32::NAN; group * hd];
                    group_generic(one, kv(g * hd, group, true), &params, &mut s, &mut generic);
                    assert_eq!(
                        bits(&generic),
                        bits(want),
                        "generic, hd {hd} kv {g} pos {pos}"
                    );
                }
            }
        }
    }

    /// Against an f64 evaluation of the formula: within 1e-5 of the head's largest |output|.
    #[test]
    fn matches_f64_attention() {
        let mut next = rng(42);
        let (hd, t, heads) = (64usize, 300usize, 3usize);
        let k: Vec<f32> = (0..t * hd).map(|_| next()).collect();
        let v: Vec<f32> = (0..t * hd).map(|_| next()).collect();
        let q: Vec<f32> = (0..heads * hd).map(|_| next() * 8.0).collect();
        let sinks = [0.3f32, -2.0, 1.5];
        for sink in [None, Some(&sinks[..])] {
            let params = AttentionParams {
                n_q_heads: heads,
                n_kv_heads: 1,
                head_dim: hd,
                scale: 0.125,
                sliding_window: None,
                softcap: None,
                sinks: None,
            };
            let kv = KvHeads {
                k: &k,
                v: &v,
                row_len: hd,
                col: 0,
                group: heads,
                warm: false,
            };
            let pos = t - 1;
            let mut s = vec![0f32; heads * t];
            let mut got = vec![0f32; heads * hd];
            let query = GroupQuery {
                q: &q,
                pos,
                sinks: sink,
            };
            group_attention(query, kv, &params, &mut s, &mut got);
            for h in 0..heads {
                let sc: Vec<f64> = (0..t)
                    .map(|j| {
                        (0..hd)
                            .map(|e| q[h * hd + e] as f64 * k[j * hd + e] as f64)
                            .sum::<f64>()
                            * 0.125
                    })
                    .collect();
                let sk = sink.map(|s| s[h] as f64);
                let m = sc.iter().copied().fold(sk.unwrap_or(f64::MIN), f64::max);
                let z = sc.iter().map(|x| (x - m).exp()).sum::<f64>()
                    + sk.map_or(0.0, |s| (s - m).exp());
                let want: Vec<f64> = (0..hd)
                    .map(|e| {
                        (0..t)
                            .map(|j| (sc[j] - m).exp() / z * v[j * hd + e] as f64)
                            .sum()
                    })
                    .collect();
                let scale = want.iter().fold(0f64, |a, x| a.max(x.abs()));
                for (e, w) in want.iter().enumerate() {
                    let err = (got[h * hd + e] as f64 - w).abs();
                    assert!(err <= 1e-5 * scale, "head {h} elem {e}: {err} vs {scale}");
                }
            }
        }
    }
}
