//! Scaled dot-product attention over a KV cache: one routine for prefill (many query rows) and
//! decode (one row), with GQA/MQA, causal and sliding-window masks and optional logit soft-cap.

use crate::cpu::dot;
use rayon::prelude::*;

/// Below this many multiply-adds (`t_q · n_q_heads · t_kv · head_dim`, upper bound) the work
/// runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;

/// Geometry and options of one layer's attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
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
/// not added as `−∞`, so a row's result depends only on its visible keys: a prefill row equals
/// the single-row decode at the same position bit for bit.
///
/// Panics on inconsistent shapes, `n_kv_heads` not dividing `n_q_heads`, or a position
/// `≥ t_kv` (its own key must be in the cache).
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    q_positions: &[usize],
    t_kv: usize,
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
    if let Some(&p) = q_positions.iter().find(|&&p| p >= t_kv) {
        panic!("attention: query position {p} is not in the cache (t_kv = {t_kv})");
    }
    if head_dim == 0 || t_q == 0 {
        return;
    }
    let group = n_q_heads / n_kv_heads;
    let k = &k_cache[..t_kv * kv_row];
    let v = &v_cache[..t_kv * kv_row];
    // One task = one (query row, head); `idx = t * n_q_heads + h` is the chunk index of `out`.
    let task = |scores: &mut Vec<f32>, idx: usize, o: &mut [f32]| {
        let (t, h) = (idx / n_q_heads, idx % n_q_heads);
        let qh = &q[t * q_row + h * head_dim..][..head_dim];
        let g = h / group;
        head_attention(
            qh,
            k,
            v,
            kv_row,
            g * head_dim,
            q_positions[t],
            params,
            scores,
            o,
        );
    };
    let max_keys = q_positions.iter().max().map_or(0, |&p| p + 1);
    if rayon::current_num_threads() <= 1 || t_q * n_q_heads * max_keys * head_dim < PAR_MIN_WORK {
        let mut scores = Vec::with_capacity(max_keys);
        for (idx, o) in out.chunks_exact_mut(head_dim).enumerate() {
            task(&mut scores, idx, o);
        }
    } else {
        out.par_chunks_mut(head_dim)
            .enumerate()
            .with_min_len(2)
            .for_each_init(
                || Vec::with_capacity(max_keys),
                |scores, (idx, o)| task(scores, idx, o),
            );
    }
}

/// One query head against its kv head: keys/values at column offset `col` of rows of `kv_row`.
#[allow(clippy::too_many_arguments)]
fn head_attention(
    qh: &[f32],
    k: &[f32],
    v: &[f32],
    kv_row: usize,
    col: usize,
    pos: usize,
    params: &AttentionParams,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = qh.len();
    let hi = pos; // last visible key (inclusive); pos < t_kv checked by the caller
    let lo = match params.sliding_window {
        Some(w) => (pos + 1).saturating_sub(w), // p − j < w  ⇔  j > p − w
        None => 0,
    };
    o.fill(0.0);
    if lo > hi {
        return; // window 0: nothing visible
    }
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in lo..=hi {
        let kj = &k[j * kv_row + col..][..hd];
        let mut s = dot(qh, kj) * params.scale;
        if let Some(cap) = params.softcap {
            s = cap * (s / cap).tanh();
        }
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    for (j, &p) in (lo..=hi).zip(scores.iter()) {
        let w = p * inv;
        let vj = &v[j * kv_row + col..][..hd];
        for (oi, &vi) in o.iter_mut().zip(vj) {
            *oi += w * vi;
        }
    }
}
