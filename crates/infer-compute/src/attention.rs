//! Scaled dot-product attention over a KV cache: one routine for prefill (many query rows) and
//! decode (one row), with GQA/MQA, causal and sliding-window masks and optional logit soft-cap.

use crate::attention_blocked::attention_blocked;
use crate::attention_group::{group_attention, scratch_len, GroupQuery, KvHeads};
#[cfg(test)]
use crate::cpu::dot_generic;
use crate::kv_type::KvElem;
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
/// - `k_cache`, `v_cache`: at least `t_kv` rows of `[n_kv_heads · head_dim]`, f32 or f16
///   ([`KvElem`]: an f16 value is widened exactly as it is read, never copied to an f32 cache);
///   cache row `j` holds the key/value at absolute position `j` (extra rows beyond `t_kv` are
///   ignored).
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
/// bit: per (row, kv head) the query heads sharing that kv head read its keys and values once
/// (`crate::attention_group`: scores in `crate::cpu::dot`'s summation order, eight keys per
/// transposed reduction on AVX2; `exp` a ≈2-ulp polynomial, vectorised; values summed per element
/// in key order). Several rows (prefill) run blocked matrix products (`crate::attention_blocked`:
/// per kv head and block of query rows, `S = Q·Kᵀ` and `O = P·V` through `matrixmultiply::sgemm`
/// over key tiles, with an online softmax using the same `exp`); only the summation order
/// differs from the row path, and results agree with it within 1e-5 of the row's largest
/// |output| (tested). A prefill row is
/// thus not bit-identical to the single-row decode of the same position. Neither path's result
/// depends on the number of threads. Temporaries live in per-thread buffers that grow to powers
/// of two (`crate::scratch`): the decode path allocates nothing after warm-up except when the
/// context crosses such a size on some thread (the prefill path's sgemm allocates its own
/// packing buffers per product).
///
/// Panics on inconsistent shapes (also sinks of another length than `n_q_heads`),
/// `n_kv_heads` not dividing `n_q_heads`, or a position `≥ t_kv` (its own key must be in the
/// cache).
pub fn attention<T: KvElem>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
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
    dispatch(q, caches, q_positions, params, out, Path::Auto);
}

/// [`attention`] for a caller that already runs sequences in parallel: the decode row path
/// (`t_q == 1`) runs on the calling thread, the prefill path as in [`attention`]. Same arguments,
/// result (bit for bit) and panics.
pub(crate) fn attention_in_task<T: KvElem>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
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
    dispatch(q, caches, q_positions, params, out, Path::SerialRows);
}

/// [`attention`] computed one query row at a time for every `t_q` (the decode path, also the
/// reference the blocked prefill path is tested against): per (row, head) the scores of the
/// visible keys in `crate::cpu::dot`'s summation order, softmax, and the weighted sum of values
/// in key order. Same arguments, result and panics as [`attention`]; a prefill row equals the
/// single-row decode at the same position bit for bit.
pub fn attention_reference<T: KvElem>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
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
    dispatch(q, caches, q_positions, params, out, Path::Rows);
}

/// Which implementation [`dispatch`] runs.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// Rows for `t_q == 1`, blocked products otherwise; parallel.
    Auto,
    /// As `Auto`, but the row path on the calling thread.
    SerialRows,
    /// The row path for every `t_q` ([`attention_reference`]); parallel.
    Rows,
}

/// The key and value caches [`attention`] reads: `k` and `v` each hold at least `t_kv` rows of
/// `n_kv_heads · head_dim` f32 or f16 values (row `j` = position `j`; rows beyond `t_kv` are
/// ignored).
#[derive(Clone, Copy)]
struct KvCaches<'a, T> {
    k: &'a [T],
    v: &'a [T],
    /// Cached positions attended over.
    t_kv: usize,
}

/// Shape checks of [`attention`], then the row path (`t_q == 1` or [`Path::Rows`]) or the
/// blocked one.
fn dispatch<T: KvElem>(
    q: &[f32],
    caches: KvCaches<'_, T>,
    q_positions: &[usize],
    params: &AttentionParams,
    out: &mut [f32],
    path: Path,
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
    if t_q == 1 || path == Path::Rows {
        attention_rows(q, k, v, q_positions, params, out, path != Path::SerialRows);
    } else {
        attention_blocked(q, k, v, q_positions, params, out);
    }
}

/// The row-at-a-time path: tasks of (query row, run of heads), each one [`group_attention`].
/// Shapes checked by [`dispatch`]; `k`/`v` hold exactly the `t_kv` cached rows. On the calling
/// thread a task holds all the row's heads (each cached row read in address order, once for
/// all of them, and the rows warmed first: [`KvHeads::warm`]); in parallel a whole GQA group
/// (its K/V read once for all its heads) unless that leaves fewer than two tasks per thread,
/// then single heads. All give the same bits (the arithmetic of a head does not depend on its
/// run). `parallel: false` runs every task on the calling thread.
fn attention_rows<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    q_positions: &[usize],
    params: &AttentionParams,
    out: &mut [f32],
    parallel: bool,
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
    let max_keys = q_positions.iter().max().map_or(0, |&p| p + 1);
    let threads = rayon::current_num_threads();
    let serial = !parallel || threads <= 1 || t_q * n_q_heads * max_keys * head_dim < PAR_MIN_WORK;
    let heads = if serial {
        n_q_heads
    } else if t_q * n_kv_heads >= 2 * threads {
        group
    } else {
        1
    };
    let runs_per_row = n_q_heads / heads;
    // One task = one run of `heads` heads of one query row; `idx = t · runs_per_row + r` is the
    // chunk index of `out` (chunks of `heads · head_dim`).
    let task = |scores: &mut [f32], idx: usize, o: &mut [f32]| {
        let (t, h0) = (idx / runs_per_row, idx % runs_per_row * heads);
        let kv = KvHeads {
            k,
            v,
            row_len: kv_row,
            col: h0 / group * head_dim,
            group: group.min(heads),
            warm: serial,
        };
        let query = GroupQuery {
            q: &q[t * q_row + h0 * head_dim..][..heads * head_dim],
            pos: q_positions[t],
            sinks: params.sinks.map(|s| &s[h0..h0 + heads]),
        };
        group_attention(query, kv, params, scores, o);
    };
    let scratch_len = scratch_len::<T>(heads, max_keys, head_dim);
    if serial {
        scratch::with(&SCORES, scratch_len, |scores| {
            for (idx, o) in out.chunks_exact_mut(heads * head_dim).enumerate() {
                task(scores, idx, o);
            }
        });
    } else {
        out.par_chunks_mut(heads * head_dim)
            .enumerate()
            .for_each(|(idx, o)| {
                scratch::with(&SCORES, scratch_len, |scores| task(scores, idx, o));
            });
    }
}

thread_local! {
    /// Attention scores of one task's heads (`[heads, keys]`, then an f16 cache's widened key
    /// tile), reused across calls (`crate::scratch`).
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
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

    /// The decode row path gives the same bits whether it runs in parallel (runs of single
    /// heads or whole groups) or on the calling thread.
    #[test]
    fn parallel_and_serial_rows_agree_bitwise() {
        let mut state = 0x5eed_u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let (n_q, n_kv, hd, t_kv) = (9usize, 3usize, 64usize, 700usize);
        let k: Vec<f32> = (0..t_kv * n_kv * hd).map(|_| next()).collect();
        let v: Vec<f32> = (0..t_kv * n_kv * hd).map(|_| next()).collect();
        let p = AttentionParams {
            n_q_heads: n_q,
            n_kv_heads: n_kv,
            head_dim: hd,
            scale: 0.125,
            sliding_window: None,
            softcap: None,
            sinks: None,
        };
        for pos in [vec![699usize], vec![3, 699, 250, 64, 65, 600, 1, 0]] {
            let q: Vec<f32> = (0..pos.len() * n_q * hd).map(|_| next() * 4.0).collect();
            let mut par = vec![f32::NAN; q.len()];
            let mut ser = vec![f32::NAN; q.len()];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(4)
                .build()
                .unwrap();
            pool.install(|| attention_reference(&q, &k, &v, &pos, t_kv, &p, &mut par));
            attention_rows(&q, &k, &v, &pos, &p, &mut ser, false);
            assert_eq!(par, ser);
        }
    }
}
