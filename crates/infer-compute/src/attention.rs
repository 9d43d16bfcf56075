//! Scaled dot-product attention over a KV cache: one routine for prefill (many query rows) and
//! decode (one row), with GQA/MQA, causal and sliding-window masks and optional logit soft-cap.

use crate::attention_blocked::attention_blocked;
use crate::cpu::dot_generic;
use crate::scratch;
use rayon::prelude::*;
use std::cell::Cell;

/// Below this many multiply-adds (`t_q · n_q_heads · t_kv · head_dim`, upper bound) the work
/// runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;

/// Geometry and options of one layer's attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams<'a> {
    /// Query heads.
    pub n_q_heads: usize,
    /// Key/value heads; divides `n_q_heads` (query head `h` reads kv head
    /// `h / (n_q_heads / n_kv_heads)`, HF `repeat_kv`).
    pub n_kv_heads: usize,
    /// Values per head (same for q, k and v).
    pub head_dim: usize,
    /// Multiplier of `q·k` (usually `head_dim^-0.5`; `query_pre_attn_scalar^-0.5` for Gemma).
    pub scale: f32,
    /// HF sliding window: key `j` is visible from position `p` iff `p − j < window`.
    pub sliding_window: Option<usize>,
    /// Attention logit soft-cap: `s ← cap · tanh(s / cap)` before masking and softmax
    /// (Gemma-2 `attn_logit_softcapping`).
    pub softcap: Option<f32>,
    /// Attention sinks, one learned logit per query head (`n_q_heads` values): each joins its
    /// head's softmax denominator as an extra key with no value (gpt-oss `self_attn.sinks`, HF
    /// `modeling_gpt_oss.py` `eager_attention_forward`: the sink is concatenated to the scaled,
    /// masked scores, softmaxed with them, and dropped).
    pub sinks: Option<&'a [f32]>,
}

/// Causal attention of `t_q` query rows over the first `t_kv` cached keys/values.
///
/// - `q`: `[t_q, n_q_heads · head_dim]` row-major, RoPE already applied.
/// - `k_cache`, `v_cache`: at least `t_kv` rows of `[n_kv_heads · head_dim]`; cache row `j` holds
///   the key/value at absolute position `j` (extra rows beyond `t_kv` are ignored).
/// - `q_positions`: absolute position of each query row (`t_q` values, each `< t_kv`).
/// - `out`: `[t_q, n_q_heads · head_dim]`, fully overwritten.
///
/// For query row `t` at position `p` and head `h` (kv head `g = h / (n_q/n_kv)`):
/// `s_j = scale · q_{t,h}·k_{j,g}`, soft-capped if configured, for visible keys `j` (`j ≤ p`,
/// and `p − j < window` if sliding); `out_{t,h} = Σ_j softmax(s)_j · v_{j,g}` (softmax in f32,
/// max-subtracted), as HF eager attention (`eager_attention_forward`). Masked keys are skipped,
/// not added as `−∞`, so a row's result depends only on its visible keys; a row that sees no key
/// (window 0) is zero. With sinks, head `h`'s softmax denominator also holds `exp(sink_h − max)`
/// (the max taken over the scores and the sink), so its weights sum to less than 1.
///
/// One query row (`t_q == 1`, decode) runs [`attention_reference`]'s row-at-a-time path, bit for
/// bit. Several rows (prefill) run blocked matrix products (`crate::attention_blocked`: per kv
/// head and block of query rows, `S = Q·Kᵀ` and `O = P·V` through `matrixmultiply::sgemm` over
/// key tiles, with an online softmax whose `exp` is a ≈2-ulp polynomial); only the summation
/// order and that `exp` differ from the row path, and results agree with it within 1e-5 of the
/// row's largest |output| (tested). A prefill row is
/// thus not bit-identical to the single-row decode of the same position. Neither path's result
/// depends on the number of threads. Temporaries live in per-thread buffers that grow to powers
/// of two (`crate::scratch`): the decode path allocates nothing after warm-up except when the
/// context crosses such a size on some thread (the prefill path's sgemm allocates its own
/// packing buffers per product).
///
/// Panics on inconsistent shapes (also sinks of another length than `n_q_heads`),
/// `n_kv_heads` not dividing `n_q_heads`, or a position `≥ t_kv` (its own key must be in the
/// cache).
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    q_positions: &[usize],
    t_kv: usize,
    params: &AttentionParams,
    out: &mut [f32],
) {
    let caches = KvCaches {
        k: k_cache,
        v: v_cache,
        t_kv,
    };
    dispatch(q, caches, q_positions, params, out, false);
}

/// [`attention`] computed one query row at a time for every `t_q` (the decode path, also the
/// reference the blocked prefill path is tested against): per (row, head) the scores of the
/// visible keys in `crate::cpu::dot`'s summation order, softmax, and the weighted sum of values
/// in key order. Same arguments, result and panics as [`attention`]; a prefill row equals the
/// single-row decode at the same position bit for bit.
pub fn attention_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    q_positions: &[usize],
    t_kv: usize,
    params: &AttentionParams,
    out: &mut [f32],
) {
    let caches = KvCaches {
        k: k_cache,
        v: v_cache,
        t_kv,
    };
    dispatch(q, caches, q_positions, params, out, true);
}

/// The key and value caches [`attention`] reads: `k` and `v` each hold at least `t_kv` rows of
/// `n_kv_heads · head_dim` f32 (row `j` = position `j`; rows beyond `t_kv` are ignored).
#[derive(Clone, Copy)]
struct KvCaches<'a> {
    k: &'a [f32],
    v: &'a [f32],
    /// Cached positions attended over.
    t_kv: usize,
}

/// Shape checks of [`attention`], then the row path (`t_q == 1` or `force_rows`) or the blocked one.
fn dispatch(
    q: &[f32],
    caches: KvCaches<'_>,
    q_positions: &[usize],
    params: &AttentionParams,
    out: &mut [f32],
    force_rows: bool,
) {
    let KvCaches {
        k: k_cache,
        v: v_cache,
        t_kv,
    } = caches;
    let &AttentionParams {
        n_q_heads,
        n_kv_heads,
        head_dim,
        ..
    } = params;
    let t_q = q_positions.len();
    let q_row = n_q_heads * head_dim;
    let kv_row = n_kv_heads * head_dim;
    assert!(
        n_kv_heads > 0 && n_q_heads % n_kv_heads == 0,
        "attention: n_kv_heads {n_kv_heads} must divide n_q_heads {n_q_heads}"
    );
    assert_eq!(
        q.len(),
        t_q * q_row,
        "attention: q has {} values, want t_q*n_q*head_dim",
        q.len()
    );
    assert_eq!(
        out.len(),
        t_q * q_row,
        "attention: out has {} values, want t_q*n_q*head_dim",
        out.len()
    );
    assert!(
        k_cache.len() >= t_kv * kv_row && v_cache.len() >= t_kv * kv_row,
        "attention: k/v caches ({}, {} values) hold fewer than t_kv={t_kv} rows of {kv_row}",
        k_cache.len(),
        v_cache.len()
    );
    if let Some(s) = params.sinks {
        assert_eq!(
            s.len(),
            n_q_heads,
            "attention: {} sinks for {n_q_heads} query heads",
            s.len()
        );
    }
    if let Some(&p) = q_positions.iter().find(|&&p| p >= t_kv) {
        panic!("attention: query position {p} is not in the cache (t_kv = {t_kv})");
    }
    if head_dim == 0 || t_q == 0 {
        return;
    }
    let k = &k_cache[..t_kv * kv_row];
    let v = &v_cache[..t_kv * kv_row];
    if t_q == 1 || force_rows {
        attention_rows(q, k, v, q_positions, params, out);
    } else {
        attention_blocked(q, k, v, q_positions, params, out);
    }
}

/// The row-at-a-time path: one task per (query row, head), [`head_attention`] each. Shapes
/// checked by [`dispatch`]; `k`/`v` hold exactly the `t_kv` cached rows.
fn attention_rows(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    q_positions: &[usize],
    params: &AttentionParams,
    out: &mut [f32],
) {
    let &AttentionParams {
        n_q_heads,
        n_kv_heads,
        head_dim,
        ..
    } = params;
    let t_q = q_positions.len();
    let q_row = n_q_heads * head_dim;
    let kv_row = n_kv_heads * head_dim;
    let group = n_q_heads / n_kv_heads;
    // One task = one (query row, head); `idx = t * n_q_heads + h` is the chunk index of `out`.
    let task = |scores: &mut [f32], idx: usize, o: &mut [f32]| {
        let (t, h) = (idx / n_q_heads, idx % n_q_heads);
        let qh = &q[t * q_row + h * head_dim..][..head_dim];
        let g = h / group;
        let kv = KvHead {
            k,
            v,
            row_len: kv_row,
            col: g * head_dim,
        };
        let query = HeadQuery {
            q: qh,
            pos: q_positions[t],
            sink: params.sinks.map(|s| s[h]),
        };
        head_attention(query, kv, params, scores, o);
    };
    let max_keys = q_positions.iter().max().map_or(0, |&p| p + 1);
    if rayon::current_num_threads() <= 1 || t_q * n_q_heads * max_keys * head_dim < PAR_MIN_WORK {
        scratch::with(&SCORES, max_keys, |scores| {
            for (idx, o) in out.chunks_exact_mut(head_dim).enumerate() {
                task(scores, idx, o);
            }
        });
    } else {
        out.par_chunks_mut(head_dim)
            .enumerate()
            .with_min_len(2)
            .for_each(|(idx, o)| {
                scratch::with(&SCORES, max_keys, |scores| task(scores, idx, o));
            });
    }
}

thread_local! {
    /// Attention scores of one (query row, head), reused across calls (`crate::scratch`).
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// One kv head's keys and values inside the cached rows: `k` and `v` are `[t_kv, row_len]`
/// row-major f32 (`row_len = n_kv_heads · head_dim`), and the head's key/value at position `j`
/// is `k[j·row_len + col..][..head_dim]` (likewise `v`), `col = g · head_dim` for kv head `g`.
#[derive(Clone, Copy)]
struct KvHead<'a> {
    k: &'a [f32],
    v: &'a [f32],
    /// Values per cached row (all kv heads).
    row_len: usize,
    /// The head's first value within a row.
    col: usize,
}

/// One query head's row: `q` (`[head_dim]` f32), its position `pos` in the sequence, and the
/// head's attention-sink logit `sink`, if the family has sinks (gpt-oss).
#[derive(Clone, Copy)]
struct HeadQuery<'a> {
    q: &'a [f32],
    pos: usize,
    sink: Option<f32>,
}

/// One query head against its kv head `kv` (scores scratch of at least `pos + 1` values, output
/// `o` of `head_dim` values).
/// Head dims 32, 64, 128 and 256 run a copy specialised to the length (the query and the output
/// accumulator stay in registers, no call per key), compiled for AVX2 when present; the
/// arithmetic is the same in every copy (see [`head_attention_impl`]), so results are bitwise
/// identical to the generic one.
fn head_attention(
    query: HeadQuery<'_>,
    kv: KvHead<'_>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 is available (checked once at run time).
        unsafe {
            return match query.q.len() {
                32 => head_avx2::<32>(query, kv, params, scores, o),
                64 => head_avx2::<64>(query, kv, params, scores, o),
                128 => head_avx2::<128>(query, kv, params, scores, o),
                256 => head_avx2::<256>(query, kv, params, scores, o),
                _ => head_avx2::<0>(query, kv, params, scores, o),
            };
        }
    }
    head_attention_impl::<0>(query, kv, params, scores, o, dot_generic)
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    use std::sync::OnceLock;
    static A: OnceLock<bool> = OnceLock::new();
    *A.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
}

/// [`head_attention_impl`] compiled with AVX2 enabled.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn head_avx2<const HD: usize>(
    query: HeadQuery<'_>,
    kv: KvHead<'_>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
) {
    // SAFETY: AVX2 is available (this function's contract).
    let dot = |a: &[f32], b: &[f32]| unsafe { crate::cpu::dot_avx2(a, b) };
    head_attention_impl::<HD>(query, kv, params, scores, o, dot)
}

/// The body of [`head_attention`]. `HD`: the head dim when known at compile time (`qh.len()`),
/// 0 for any length. Scores are `scale · dot(q, k_j)` with `crate::cpu::dot`'s summation order
/// (`dot`: [`crate::cpu::dot_generic`] or its bit-identical AVX2 copy), soft-capped; softmax with the max subtracted, sums in key order; the
/// output is `Σ_j (p_j / Σp) · v_j` accumulated in key order from 0 with a multiply and an add
/// (no FMA), per element. A `sink` joins the max and adds `exp(sink − max)` to `Σp` last.
#[inline(always)]
fn head_attention_impl<const HD: usize>(
    query: HeadQuery<'_>,
    kv: KvHead<'_>,
    params: &AttentionParams,
    scores: &mut [f32],
    o: &mut [f32],
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let HeadQuery { q: qh, pos, sink } = query;
    let KvHead {
        k,
        v,
        row_len: kv_row,
        col,
    } = kv;
    let hd = if HD == 0 { qh.len() } else { HD };
    let qh = &qh[..hd];
    let hi = pos; // last visible key (inclusive); pos < t_kv checked by the caller
    let lo = match params.sliding_window {
        Some(w) => (pos + 1).saturating_sub(w), // p − j < w  ⇔  j > p − w
        None => 0,
    };
    if lo > hi {
        o.fill(0.0);
        return; // window 0: nothing visible
    }
    let scores = &mut scores[..hi - lo + 1];
    let mut max = f32::NEG_INFINITY;
    for (j, sj) in (lo..=hi).zip(scores.iter_mut()) {
        let kj = &k[j * kv_row + col..][..hd];
        let mut s = dot(qh, kj) * params.scale;
        if let Some(cap) = params.softcap {
            s = cap * (s / cap).tanh();
        }
        max = max.max(s);
        *sj = s;
    }
    if let Some(sk) = sink {
        max = max.max(sk);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    if let Some(sk) = sink {
        sum += (sk - max).exp();
    }
    let inv = 1.0 / sum;
    if HD == 0 {
        o.fill(0.0);
        for (j, &p) in (lo..=hi).zip(scores.iter()) {
            let w = p * inv;
            let vj = &v[j * kv_row + col..][..hd];
            for (oi, &vi) in o.iter_mut().zip(vj) {
                *oi += w * vi;
            }
        }
    } else {
        let mut acc = [0f32; HD];
        for (j, &p) in (lo..=hi).zip(scores.iter()) {
            let w = p * inv;
            let vj = &v[j * kv_row + col..][..HD];
            for (a, &vi) in acc.iter_mut().zip(vj) {
                *a += w * vi;
            }
        }
        o[..HD].copy_from_slice(&acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::dot;

    #[test]
    fn dot_generic_equals_dot_bitwise() {
        let mut state = 0x9e37_79b9u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for n in [0usize, 1, 7, 16, 31, 32, 64, 100, 128, 256] {
            let a: Vec<f32> = (0..n).map(|_| next()).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            assert_eq!(
                dot_generic(&a, &b).to_bits(),
                dot(&a, &b).to_bits(),
                "n = {n}"
            );
        }
    }

    #[test]
    fn specialised_head_dims_equal_the_generic_body_bitwise() {
        let mut state = 0x1234_5678u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for hd in [32usize, 48, 64, 128, 256] {
            let sinks = [0.5f32, -1.0];
            for (window, softcap, sinks) in [
                (None, None, None),
                (Some(5), Some(30.0f32), None),
                (Some(4), None, Some(&sinks[..])),
            ] {
                let (n_kv, t) = (2usize, 37usize);
                let kv_row = n_kv * hd;
                let k: Vec<f32> = (0..t * kv_row).map(|_| next()).collect();
                let v: Vec<f32> = (0..t * kv_row).map(|_| next()).collect();
                let q: Vec<f32> = (0..hd).map(|_| next() * 4.0).collect();
                let params = AttentionParams {
                    n_q_heads: 2,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    sliding_window: window,
                    softcap,
                    sinks,
                };
                let sink = sinks.map(|s| s[1]);
                for pos in [0usize, 3, 36] {
                    let mut s = vec![0f32; t];
                    let mut got = vec![f32::NAN; hd];
                    let kv = KvHead {
                        k: &k,
                        v: &v,
                        row_len: kv_row,
                        col: hd,
                    };
                    let query = HeadQuery { q: &q, pos, sink };
                    head_attention(query, kv, &params, &mut s, &mut got);
                    let mut want = vec![f32::NAN; hd];
                    head_attention_impl::<0>(query, kv, &params, &mut s, &mut want, dot_generic);
                    let (g, w): (Vec<u32>, Vec<u32>) = (
                        got.iter().map(|x| x.to_bits()).collect(),
                        want.iter().map(|x| x.to_bits()).collect(),
                    );
                    assert_eq!(g, w, "hd {hd} pos {pos} window {window:?}");
                }
            }
        }
    }
}
