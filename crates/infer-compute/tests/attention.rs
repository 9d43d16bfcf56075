//! Attention against a naive f64 implementation, and prefill against decode.

use infer_compute::{attention, attention_reference, AttentionParams};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn params(
    n_q: usize,
    n_kv: usize,
    hd: usize,
    window: Option<usize>,
    cap: Option<f32>,
) -> AttentionParams<'static> {
    AttentionParams {
        n_q_heads: n_q,
        n_kv_heads: n_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        sliding_window: window,
        softcap: cap,
        sinks: None,
    }
}

/// HF eager attention in f64: full score row, additive −∞ mask, the head's sink logit appended
/// (gpt-oss), softmax, the sink dropped, weighted sum.
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos: &[usize],
    t_kv: usize,
    p: &AttentionParams,
) -> Vec<f64> {
    let (nq, nkv, hd) = (p.n_q_heads, p.n_kv_heads, p.head_dim);
    let mut out = vec![0f64; pos.len() * nq * hd];
    for (t, &qp) in pos.iter().enumerate() {
        for h in 0..nq {
            let g = h * nkv / nq;
            let mut s: Vec<f64> = (0..t_kv)
                .map(|j| {
                    let mut d = 0f64;
                    for i in 0..hd {
                        d += q[t * nq * hd + h * hd + i] as f64
                            * k[j * nkv * hd + g * hd + i] as f64;
                    }
                    d *= p.scale as f64;
                    if let Some(c) = p.softcap {
                        d = c as f64 * (d / c as f64).tanh();
                    }
                    let visible = j <= qp && p.sliding_window.is_none_or(|w| qp - j < w);
                    if visible {
                        d
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let sink = p.sinks.map(|s| s[h] as f64);
            let m = s
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s
                .iter_mut()
                .map(|x| {
                    *x = (*x - m).exp();
                    *x
                })
                .sum::<f64>()
                + sink.map_or(0.0, |k| (k - m).exp());
            for (j, w) in s.iter().enumerate() {
                for i in 0..hd {
                    out[t * nq * hd + h * hd + i] += w / sum * v[j * nkv * hd + g * hd + i] as f64;
                }
            }
        }
    }
    out
}

fn check(got: &[f32], want: &[f64], what: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() < 2e-6,
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

/// (n_q_heads, n_kv_heads, head_dim, sliding_window, softcap)
type Case = (usize, usize, usize, Option<usize>, Option<f32>);

const CASES: &[Case] = &[
    (4, 4, 8, None, None),          // MHA
    (6, 2, 16, None, None),         // GQA, 3 q heads per kv head
    (4, 1, 12, None, None),         // MQA
    (4, 2, 8, Some(3), None),       // sliding window
    (8, 4, 32, Some(5), Some(2.0)), // window + soft-cap (large logits: scale is 1)
    (2, 1, 7, None, Some(0.5)),     // odd head_dim, strong cap
];

#[test]
fn prefill_matches_naive_reference() {
    let mut rng = StdRng::seed_from_u64(42);
    for &(nq, nkv, hd, w, cap) in CASES {
        let mut p = params(nq, nkv, hd, w, cap);
        if cap.is_some() {
            p.scale = 1.0; // logits well beyond the cap, so the cap matters
        }
        for t in [1usize, 9, 70] {
            let q: Vec<f32> = random(&mut rng, t * nq * hd)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let k = random(&mut rng, t * nkv * hd);
            let v = random(&mut rng, t * nkv * hd);
            let pos: Vec<usize> = (0..t).collect();
            let mut out = vec![f32::NAN; q.len()];
            attention(&q, &k, &v, &pos, t, &p, &mut out);
            check(
                &out,
                &naive(&q, &k, &v, &pos, t, &p),
                &format!("case {nq}/{nkv}/{hd} w={w:?} cap={cap:?} T={t}"),
            );
        }
    }
}

/// Prefill rows (blocked path) against row-by-row decode: within 1e-5 of the row's largest
/// |output| (only the summation order differs); the row path (`attention_reference`) run as a
/// prefill equals the decode bit for bit, and a chunked prefill equals the full one bit for bit.
#[test]
fn prefill_matches_row_by_row_decode() {
    let mut rng = StdRng::seed_from_u64(9);
    for &(nq, nkv, hd, w, cap) in CASES {
        let p = params(nq, nkv, hd, w, cap);
        let t = 40;
        let (qr, kr) = (nq * hd, nkv * hd);
        let q = random(&mut rng, t * qr);
        let k = random(&mut rng, t * kr);
        let v = random(&mut rng, t * kr);
        let pos: Vec<usize> = (0..t).collect();
        let mut prefill = vec![0f32; q.len()];
        attention(&q, &k, &v, &pos, t, &p, &mut prefill);
        let mut rows = vec![0f32; q.len()];
        attention_reference(&q, &k, &v, &pos, t, &p, &mut rows);
        for s in 0..t {
            let mut one = vec![f32::NAN; qr];
            // Decode: cache holds rows 0..=s only.
            attention(
                &q[s * qr..(s + 1) * qr],
                &k[..(s + 1) * kr],
                &v[..(s + 1) * kr],
                &[s],
                s + 1,
                &p,
                &mut one,
            );
            assert_eq!(
                &rows[s * qr..(s + 1) * qr],
                &one[..],
                "row {s}, case {nq}/{nkv}/{hd} w={w:?}"
            );
            for (h, (a, b)) in prefill[s * qr..(s + 1) * qr]
                .chunks_exact(hd)
                .zip(one.chunks_exact(hd))
                .enumerate()
            {
                let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= 1e-5 * scale,
                        "row {s} head {h}, case {nq}/{nkv}/{hd} w={w:?}: {x} vs {y}"
                    );
                }
            }
        }
        // Chunked prefill: the last 7 rows against the full cache.
        let mut chunk = vec![0f32; 7 * qr];
        attention(&q[(t - 7) * qr..], &k, &v, &pos[t - 7..], t, &p, &mut chunk);
        assert_eq!(&prefill[(t - 7) * qr..], &chunk[..]);
    }
}

/// Attention sinks (gpt-oss): prefill (blocked) and decode (row path) against the f64
/// reference within 2e-6, with sinks from far below to far above the scores, GQA and a window.
#[test]
fn sinks_match_naive_reference() {
    let mut rng = StdRng::seed_from_u64(77);
    for &(nq, nkv, hd, w) in &[(4usize, 2usize, 16usize, None), (6, 3, 8, Some(4))] {
        let sinks: Vec<f32> = (0..nq).map(|h| [-8.0, 0.0, 0.7, 6.0][h % 4]).collect();
        let mut p = params(nq, nkv, hd, w, None);
        p.sinks = Some(&sinks);
        let t = 33;
        let q: Vec<f32> = random(&mut rng, t * nq * hd)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let k = random(&mut rng, t * nkv * hd);
        let v = random(&mut rng, t * nkv * hd);
        let pos: Vec<usize> = (0..t).collect();
        let want = naive(&q, &k, &v, &pos, t, &p);
        let mut out = vec![f32::NAN; q.len()];
        attention(&q, &k, &v, &pos, t, &p, &mut out);
        check(
            &out,
            &want,
            &format!("sinks prefill {nq}/{nkv}/{hd} w={w:?}"),
        );
        attention_reference(&q, &k, &v, &pos, t, &p, &mut out);
        check(&out, &want, &format!("sinks rows {nq}/{nkv}/{hd} w={w:?}"));
        // Without sinks the result differs (the sinks are not ignored).
        let mut plain = vec![0f32; q.len()];
        attention(
            &q,
            &k,
            &v,
            &pos,
            t,
            &params(nq, nkv, hd, w, None),
            &mut plain,
        );
        let diff = plain
            .iter()
            .zip(&out)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff > 1e-2, "sinks changed nothing ({diff})");
    }
}

#[test]
fn gqa_reads_the_right_kv_head() {
    // kv head g's values are all g+1, so every output of query head h must be h/(nq/nkv) + 1.
    let (nq, nkv, hd, t) = (6, 3, 4, 5);
    let p = params(nq, nkv, hd, None, None);
    let mut rng = StdRng::seed_from_u64(1);
    let q = random(&mut rng, t * nq * hd);
    let k = random(&mut rng, t * nkv * hd);
    let v: Vec<f32> = (0..t * nkv * hd)
        .map(|i| ((i / hd) % nkv + 1) as f32)
        .collect();
    let mut out = vec![f32::NAN; q.len()];
    attention(&q, &k, &v, &(0..t).collect::<Vec<_>>(), t, &p, &mut out);
    for (i, &o) in out.iter().enumerate() {
        let h = (i / hd) % nq;
        assert!(
            (o - (h / 2 + 1) as f32).abs() < 1e-5,
            "element {i} (head {h}) = {o}"
        );
    }
}

#[test]
fn sliding_window_hides_old_keys() {
    // Window 2: position 4 sees keys 3 and 4 only. Values of keys 0..=2 are huge, so any leak shows.
    let (hd, t) = (2, 5);
    let p = params(1, 1, hd, Some(2), None);
    let q = vec![0f32; t * hd]; // uniform weights over visible keys
    let k = vec![0f32; t * hd];
    let v = vec![1e6, 1e6, 1e6, 1e6, 1e6, 1e6, 1.0, 2.0, 3.0, 4.0];
    let mut out = vec![f32::NAN; t * hd];
    attention(&q, &k, &v, &(0..t).collect::<Vec<_>>(), t, &p, &mut out);
    assert_eq!(&out[8..10], &[2.0, 3.0]);
    assert_eq!(&out[6..8], &[(1e6 + 1.0) / 2.0, (1e6 + 2.0) / 2.0]);
}

#[test]
fn parallel_and_serial_paths_agree() {
    // Large enough to take the rayon path; one-thread pool forces the serial path.
    let mut rng = StdRng::seed_from_u64(5);
    let (nq, nkv, hd, t) = (8, 2, 64, 96);
    let p = params(nq, nkv, hd, Some(50), None);
    let q = random(&mut rng, t * nq * hd);
    let k = random(&mut rng, t * nkv * hd);
    let v = random(&mut rng, t * nkv * hd);
    let pos: Vec<usize> = (0..t).collect();
    let mut par = vec![f32::NAN; q.len()];
    attention(&q, &k, &v, &pos, t, &p, &mut par);
    let mut ser = vec![f32::NAN; q.len()];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    pool.install(|| attention(&q, &k, &v, &pos, t, &p, &mut ser));
    assert_eq!(par, ser);
    check(&par, &naive(&q, &k, &v, &pos, t, &p), "parallel");
}
