//! Prefill attention (many query rows) as blocked matrix products: per (kv head, block of query
//! rows) the rows of all query heads of the GQA group are stacked, scores of a key tile are one
//! `matrixmultiply::sgemm` (`S = Q·Kᵀ`), the softmax runs online over key tiles (flash-attention
//! style: running max and sum per row, earlier output rescaled when the max grows), and the
//! weighted values are a second sgemm (`O += P·V`). Each K/V tile is read once per group and block.
//! An f16 cache's tile is widened to f32 (exactly) into per-thread scratch before each sgemm.

use crate::attention::AttentionParams;
use crate::kv_type::KvElem;
use crate::ops::exp_poly;
use crate::scratch;
use crate::shared_out::SharedOut;
use rayon::prelude::*;
use std::cell::Cell;

/// Stacked query rows (query positions × heads of a group) aimed at per block.
const ROWS_TARGET: usize = 128;
/// Keys per tile. Tiles start at absolute multiples of this, so a row's sequence of softmax
/// updates does not depend on which other rows share its block.
const KEY_TILE: usize = 256;
/// Below this many multiply-adds (upper bound) the blocks run on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;

thread_local! {
    /// Per-thread block scratch: stacked queries, score tile, output accumulator, row max, row
    /// sum (`crate::scratch`).
    static BLOCK: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Query positions per block for `group` query heads per kv head (at least 1).
fn positions_per_block(group: usize) -> usize {
    (ROWS_TARGET / group).max(1)
}

/// Blocked attention with the contract of [`crate::attention`] (shapes already checked by the
/// caller: `q`/`out` are `[t_q, n_q_heads · head_dim]`, `k`/`v` exactly `t_kv` rows of
/// `n_kv_heads · head_dim` f32 or f16 values, every position `< t_kv`, `head_dim > 0`,
/// `t_q > 0`).
///
/// Same semantics as the row-at-a-time path (scale, soft-cap, causal mask `j ≤ p`, sliding
/// window `p − j < w`, max-subtracted f32 softmax over the visible keys only, zero output for a
/// row that sees no key, a head's sink logit added to the denominator at the end); only the summation order differs (sgemm dot products, per-tile sums
/// rescaled by `exp(m_old − m_new)`, normalisation after the weighted sum), and `exp` of the
/// max-subtracted scores is a polynomial ([`exp_poly`], ≈ 2 ulp), so results agree with it to
/// about 1e-6 of the row's largest |output| (tested at 1e-5), not bit for bit. Results do not depend
/// on the number of threads, nor on which other rows are in the batch.
pub(crate) fn attention_blocked<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    q_positions: &[usize],
    params: &AttentionParams,
    out: &mut [f32],
) {
    let t_q = q_positions.len();
    let (n_q, n_kv, hd) = (params.n_q_heads, params.n_kv_heads, params.head_dim);
    let group = n_q / n_kv;
    let qb = positions_per_block(group);
    let n_blocks = t_q.div_ceil(qb);
    let rows = qb * group;
    let scratch_len = rows * (2 * hd + KEY_TILE + 2) + T::tile_buf(KEY_TILE, hd);
    let shared = SharedOut(out.as_mut_ptr());
    let task = |buf: &mut [f32], idx: usize| {
        let (b, g) = (idx / n_kv, idx % n_kv);
        let t0 = b * qb;
        let t1 = (t0 + qb).min(t_q);
        let ctx = Block {
            q,
            k,
            v,
            positions: &q_positions[t0..t1],
            t0,
            g,
            params,
        };
        // SAFETY: task (b, g) writes only query rows t0..t1, heads g·group..(g+1)·group of
        // `out`; tasks have distinct (b, g), so their writes are disjoint, and `out` outlives
        // the parallel loop.
        unsafe { ctx.run(buf, shared.get()) };
    };
    let max_keys = q_positions.iter().max().map_or(0, |&p| p + 1);
    let n_tasks = n_blocks * n_kv;
    if rayon::current_num_threads() <= 1 || t_q * n_q * max_keys * hd < PAR_MIN_WORK {
        scratch::with(&BLOCK, scratch_len, |buf| {
            for idx in 0..n_tasks {
                task(buf, idx);
            }
        });
    } else {
        // Later blocks see more keys (causal); hand them out first for balance.
        (0..n_tasks).into_par_iter().for_each(|i| {
            scratch::with(&BLOCK, scratch_len, |buf| task(buf, n_tasks - 1 - i));
        });
    }
}

/// Lanes of the vectorised loops below (two AVX2 registers).
const LANES: usize = 16;

/// One row's visible scores of a key tile, in place: `s ← scale·s`, soft-capped
/// (`cap·tanh(s/cap)`) if configured, then `s ← exp(s − m_new)` with `m_new = max(m_old, max s)`.
/// Returns `(m_new, Σ s)`. `exp` is [`exp_poly`]; runs AVX2+FMA code when the CPU has it.
fn softmax_tile(s: &mut [f32], scale: f32, softcap: Option<f32>, m_old: f32) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA are available (checked at run time).
        return unsafe { softmax_tile_avx2(s, scale, softcap, m_old) };
    }
    softmax_tile_impl(s, scale, softcap, m_old)
}

/// Whether the CPU has AVX2 and FMA (detected once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_fma() -> bool {
    use std::sync::OnceLock;
    static A: OnceLock<bool> = OnceLock::new();
    *A.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// Whether the CPU has F16C (the f16 ↔ f32 conversions; detected once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn f16c() -> bool {
    use std::sync::OnceLock;
    static A: OnceLock<bool> = OnceLock::new();
    *A.get_or_init(|| std::arch::is_x86_feature_detected!("f16c"))
}

/// [`softmax_tile_impl`] compiled with AVX2 and FMA.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_tile_avx2(
    s: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
    m_old: f32,
) -> (f32, f32) {
    softmax_tile_impl(s, scale, softcap, m_old)
}

/// The body of [`softmax_tile`], written in lanes so that it vectorises.
#[inline(always)]
fn softmax_tile_impl(s: &mut [f32], scale: f32, softcap: Option<f32>, m_old: f32) -> (f32, f32) {
    let mut mx = [f32::NEG_INFINITY; LANES];
    match softcap {
        Some(cap) => {
            for x in s.iter_mut() {
                *x = cap * (*x * scale / cap).tanh();
            }
        }
        None => s.iter_mut().for_each(|x| *x *= scale),
    }
    let mut chunks = s.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &x) in mx.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut m_new = chunks.remainder().iter().fold(m_old, |m, &x| m.max(x));
    m_new = mx.iter().fold(m_new, |m, &x| m.max(x));
    let mut acc = [0f32; LANES];
    let mut chunks = s.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c.iter_mut()) {
            *x = exp_poly(*x - m_new);
            *a += *x;
        }
    }
    let mut sum = 0f32;
    for x in chunks.into_remainder() {
        *x = exp_poly(*x - m_new);
        sum += *x;
    }
    (m_new, acc.iter().sum::<f32>() + sum)
}

/// One (block of query positions, kv head) task.
struct Block<'a, T> {
    q: &'a [f32],
    k: &'a [T],
    v: &'a [T],
    /// Positions of this block's query rows `t0..t0 + positions.len()`.
    positions: &'a [usize],
    t0: usize,
    /// The kv head.
    g: usize,
    params: &'a AttentionParams<'a>,
}

impl<T: KvElem> Block<'_, T> {
    /// Visible keys `lo..=hi` of a query at position `p` (`lo > hi`: none).
    fn visible(&self, p: usize) -> (usize, usize) {
        let lo = match self.params.sliding_window {
            Some(w) => (p + 1).saturating_sub(w), // p − j < w  ⇔  j > p − w
            None => 0,
        };
        (lo, p)
    }

    /// Attention of this block's rows for the heads of kv head `g`, written into `out`.
    ///
    /// # Safety
    /// `out` points at the `[t_q, n_q_heads · head_dim]` output, valid for writes of this
    /// block's rows and group heads, which nobody else reads or writes meanwhile.
    unsafe fn run(&self, buf: &mut [f32], out: *mut f32) {
        let p = self.params;
        let (hd, group) = (p.head_dim, p.n_q_heads / p.n_kv_heads);
        let (q_row, kv_row) = (p.n_q_heads * hd, p.n_kv_heads * hd);
        let n_rows = self.positions.len() * group;
        let (qs, rest) = buf.split_at_mut(n_rows * hd);
        let (acc, rest) = rest.split_at_mut(n_rows * hd);
        let (maxes, rest) = rest.split_at_mut(n_rows);
        let (sums, rest) = rest.split_at_mut(n_rows);
        let (s_tile, rest) = rest.split_at_mut(n_rows * KEY_TILE);
        // An f16 tile widened (K, then V into the same values); empty for f32.
        let kv_tile = &mut rest[..T::tile_buf(KEY_TILE, hd)];

        // Stack the group's heads: row r = tt·group + hi holds query row t0+tt, head g·group+hi.
        let gw = group * hd;
        for (tt, dst) in qs.chunks_exact_mut(gw).enumerate() {
            dst.copy_from_slice(&self.q[(self.t0 + tt) * q_row + self.g * gw..][..gw]);
        }
        acc.fill(0.0);
        maxes.fill(f32::NEG_INFINITY);
        sums.fill(0.0);

        // Keys any row of the block sees.
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for &pos in self.positions {
            let (l, h) = self.visible(pos);
            if l <= h {
                lo = lo.min(l);
                hi = hi.max(h);
            }
        }
        if lo <= hi {
            let col = self.g * hd;
            let mut tile0 = lo / KEY_TILE * KEY_TILE;
            while tile0 <= hi {
                let js = tile0.max(lo);
                let je = (tile0 + KEY_TILE).min(hi + 1);
                let n = je - js;
                let s = &mut s_tile[..n_rows * n];
                // S[r, j] = q_r · k_{js+j}: K tile read as [hd, n] (strides 1, kv_row in
                // place for f32; 1, hd widened for f16).
                let (kt, ks) = T::tile(self.k, js, n, kv_row, col, hd, kv_tile);
                // SAFETY: the K tile (rows js..je < t_kv, checked by `tile`) is [n, hd] at
                // `kt` with row stride `ks`; `qs` is [n_rows, hd] and `s` [n_rows, n].
                matrixmultiply::sgemm(
                    n_rows,
                    hd,
                    n,
                    1.0,
                    qs.as_ptr(),
                    hd as isize,
                    1,
                    kt,
                    1,
                    ks as isize,
                    0.0,
                    s.as_mut_ptr(),
                    n as isize,
                    1,
                );
                for (r, s_row) in s.chunks_exact_mut(n).enumerate() {
                    let (vl, vh) = self.visible(self.positions[r / group]);
                    let a = vl.max(js);
                    let b = (vh + 1).min(je);
                    if a >= b {
                        s_row.fill(0.0);
                        continue;
                    }
                    let (a, b) = (a - js, b - js);
                    s_row[..a].fill(0.0);
                    s_row[b..].fill(0.0);
                    let m_old = maxes[r];
                    let (m_new, sum) = softmax_tile(&mut s_row[a..b], p.scale, p.softcap, m_old);
                    if m_new > m_old && m_old > f32::NEG_INFINITY {
                        let alpha = (m_old - m_new).exp();
                        sums[r] *= alpha;
                        for o in &mut acc[r * hd..][..hd] {
                            *o *= alpha;
                        }
                    }
                    sums[r] += sum;
                    maxes[r] = m_new;
                }
                // acc[r, :] += Σ_j P[r, j] · v_{js+j}: V tile read as [n, hd] (in place for
                // f32, widened for f16; the K tile's values are no longer read).
                let (vt, vs) = T::tile(self.v, js, n, kv_row, col, hd, kv_tile);
                // SAFETY: the V tile is [n, hd] at `vt` with row stride `vs`; `s` is
                // [n_rows, n] and `acc` [n_rows, hd].
                matrixmultiply::sgemm(
                    n_rows,
                    n,
                    hd,
                    1.0,
                    s.as_ptr(),
                    n as isize,
                    1,
                    vt,
                    vs as isize,
                    1,
                    1.0,
                    acc.as_mut_ptr(),
                    hd as isize,
                    1,
                );
                tile0 += KEY_TILE;
            }
        }

        for (r, a) in acc.chunks_exact(hd).enumerate() {
            let (tt, hi) = (r / group, r % group);
            // A sink joins the denominator: Σ exp(s − m) + exp(sink − m), rescaled to the
            // larger max (acc / sum is invariant under the common factor).
            let (mut acc_scale, mut sum) = (1.0f32, sums[r]);
            if let Some(sinks) = p.sinks {
                let sink = sinks[self.g * group + hi];
                if sums[r] > 0.0 {
                    let m = maxes[r].max(sink);
                    acc_scale = (maxes[r] - m).exp();
                    sum = sums[r] * acc_scale + (sink - m).exp();
                }
            }
            let inv = if sum > 0.0 { acc_scale / sum } else { 0.0 };
            // SAFETY: row t0+tt, head g·group+hi of `out` belongs to this task (see `# Safety`).
            let o = std::slice::from_raw_parts_mut(
                out.add((self.t0 + tt) * q_row + (self.g * group + hi) * hd),
                hd,
            );
            for (oi, &ai) in o.iter_mut().zip(a) {
                *oi = ai * inv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{attention, attention_reference, AttentionParams, KvElem};
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn random(rng: &mut StdRng, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-amp..amp)).collect()
    }

    /// Blocked vs row path: every (row, head) slice within `1e-5 · max |slice of the row path|`.
    fn compare<T: KvElem>(
        q: &[f32],
        k: &[T],
        v: &[T],
        pos: &[usize],
        t_kv: usize,
        p: &AttentionParams,
    ) {
        let mut got = vec![f32::NAN; q.len()];
        attention(q, k, v, pos, t_kv, p, &mut got);
        let mut want = vec![f32::NAN; q.len()];
        attention_reference(q, k, v, pos, t_kv, p, &mut want);
        for (i, (g, w)) in got
            .chunks_exact(p.head_dim)
            .zip(want.chunks_exact(p.head_dim))
            .enumerate()
        {
            let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-5 * scale,
                "row {} head {}: max err {err} vs max |out| {scale} ({p:?}, t_q {}, t_kv {t_kv})",
                i / p.n_q_heads,
                i % p.n_q_heads,
                pos.len()
            );
        }
    }

    #[test]
    fn blocked_matches_row_path_over_many_shapes() {
        let mut rng = StdRng::seed_from_u64(0xb10c);
        let ratios = [1usize, 3, 4, 8];
        let dims = [32usize, 64, 80, 128, 256];
        let mut case = 0usize;
        for t in [2usize, 7, 33, 100, 513] {
            for &hd in &dims {
                case += 1;
                let ratio = ratios[case % ratios.len()];
                let n_kv = 1 + case % 2;
                let start = [0usize, 5, 300][case % 3];
                let window = match case % 4 {
                    0 => None,
                    1 => Some(1 + t / 3),      // smaller than T
                    2 => Some(t + start + 50), // larger than the context
                    _ => Some(17),
                };
                let softcap = (case % 3 == 1).then_some(5.0f32);
                // Sinks on some cases, around the scores' size (some dominate the softmax).
                let sink_vals = random(&mut rng, n_kv * ratio, 4.0);
                let p = AttentionParams {
                    n_q_heads: n_kv * ratio,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    scale: if softcap.is_some() {
                        0.5
                    } else {
                        1.0 / (hd as f32).sqrt()
                    },
                    sliding_window: window,
                    softcap,
                    sinks: (case % 5 < 2).then_some(&sink_vals[..]),
                };
                let t_kv = start + t;
                let q = random(&mut rng, t * p.n_q_heads * hd, 2.0);
                let k = random(&mut rng, t_kv * n_kv * hd, 1.0);
                let v = random(&mut rng, t_kv * n_kv * hd, 1.0);
                let pos: Vec<usize> = (start..t_kv).collect();
                compare(&q, &k, &v, &pos, t_kv, &p);
            }
        }
    }

    /// An f16 cache: the blocked path (tiles widened into scratch) against the row path
    /// (widened as loaded), same tolerance as f32; GQA, a window, a soft-cap and sinks.
    #[test]
    fn blocked_matches_row_path_on_an_f16_cache() {
        use half::f16;
        let mut rng = StdRng::seed_from_u64(0xf16);
        let to16 = |x: Vec<f32>| x.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        for (i, (t, hd, ratio, start)) in [
            (7usize, 64usize, 3usize, 0usize),
            (300, 64, 3, 5),
            (100, 128, 4, 300),
            (33, 80, 1, 0),
        ]
        .into_iter()
        .enumerate()
        {
            let n_kv = 1 + i % 2;
            let sink_vals = random(&mut rng, n_kv * ratio, 4.0);
            let p = AttentionParams {
                n_q_heads: n_kv * ratio,
                n_kv_heads: n_kv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                sliding_window: (i == 1).then_some(50),
                softcap: (i == 2).then_some(5.0),
                sinks: (i == 3).then_some(&sink_vals[..]),
            };
            let t_kv = start + t;
            let q = random(&mut rng, t * p.n_q_heads * hd, 2.0);
            let k = to16(random(&mut rng, t_kv * n_kv * hd, 1.0));
            let v = to16(random(&mut rng, t_kv * n_kv * hd, 1.0));
            let pos: Vec<usize> = (start..t_kv).collect();
            compare(&q, &k, &v, &pos, t_kv, &p);
        }
    }

    #[test]
    fn blocked_handles_unsorted_positions_and_empty_windows() {
        let mut rng = StdRng::seed_from_u64(7);
        let (n_q, n_kv, hd, t_kv) = (6usize, 2usize, 64usize, 600usize);
        let k = random(&mut rng, t_kv * n_kv * hd, 1.0);
        let v = random(&mut rng, t_kv * n_kv * hd, 1.0);
        let pos = [599usize, 0, 257, 256, 255, 3, 511, 512, 40, 599];
        let q = random(&mut rng, pos.len() * n_q * hd, 2.0);
        for window in [None, Some(1), Some(300)] {
            let p = AttentionParams {
                n_q_heads: n_q,
                n_kv_heads: n_kv,
                head_dim: hd,
                scale: 0.125,
                sliding_window: window,
                softcap: None,
                sinks: None,
            };
            compare(&q, &k, &v, &pos, t_kv, &p);
        }
        // Window 0: nothing visible, output zero on both paths.
        let p = AttentionParams {
            n_q_heads: n_q,
            n_kv_heads: n_kv,
            head_dim: hd,
            scale: 0.125,
            sliding_window: Some(0),
            softcap: None,
            sinks: None,
        };
        let mut got = vec![f32::NAN; q.len()];
        attention(&q, &k, &v, &pos, t_kv, &p, &mut got);
        assert!(got.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn exp_poly_is_within_3_ulp_of_exp() {
        assert_eq!(super::exp_poly(0.0), 1.0);
        assert_eq!(super::exp_poly(-1000.0), 0.0); // clamped to −88, then 2⁻¹²⁷ → 0
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 87.0 * i as f32 / 200_000.0; // softmax arguments are ≤ 0
            let want = (x as f64).exp();
            let got = super::exp_poly(x) as f64;
            worst = worst.max((got - want).abs() / want);
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "max relative error {worst}"
        );
    }

    #[test]
    fn a_row_does_not_depend_on_its_batch() {
        // Chunked prefill (rows 300..340 after 300 cached) equals the same rows of a full
        // prefill bit for bit: tiles are aligned to absolute key positions.
        let mut rng = StdRng::seed_from_u64(11);
        let (n_q, n_kv, hd, t) = (9usize, 3usize, 64usize, 340usize);
        let p = AttentionParams {
            n_q_heads: n_q,
            n_kv_heads: n_kv,
            head_dim: hd,
            scale: 0.125,
            sliding_window: None,
            softcap: None,
            sinks: None,
        };
        let q = random(&mut rng, t * n_q * hd, 2.0);
        let k = random(&mut rng, t * n_kv * hd, 1.0);
        let v = random(&mut rng, t * n_kv * hd, 1.0);
        let pos: Vec<usize> = (0..t).collect();
        let mut full = vec![0f32; q.len()];
        attention(&q, &k, &v, &pos, t, &p, &mut full);
        let qr = n_q * hd;
        let mut chunk = vec![0f32; 40 * qr];
        attention(&q[300 * qr..], &k, &v, &pos[300..], t, &p, &mut chunk);
        assert_eq!(&full[300 * qr..], &chunk[..]);
    }
}
