//! Per-operation parity of a [`ComputeBackend`]'s tensor operations (products, norms, RoPE,
//! batched attention with its KV store, activations, residual, bias, row gather, logit
//! post-processing, embedding lookup, argmax) with scalar references written here (plain
//! loops in f64, independent of the crate's own kernels), on random shapes: odd widths, GQA
//! ratios 1/2/4/8 and MQA, sliding windows at and around the window edge, soft-caps, batches
//! of several sequences at different cache positions. Inputs are uploaded into the backend's
//! own tensors ([`ComputeBackend::upload`]), so a device backend is checked on the device.
//! Like ggml's `test-backend-ops`: one checker, run for every backend (the CPU backend in CI,
//! the CUDA backend by `scripts/gpu-check.sh`).

use half::f16;
use infer_compute::ops::Activation;
use infer_compute::{
    Attend, AttentionParams, Chosen, ComputeBackend, ExpertRows, FloatTable, KvSlot, MatData,
    Matrix, Norm, NormKind, QuantFormat, ResidualNorm, RopeAttend, RopeConfig, RopeScaling,
    RoutedProj, Tensor, TensorProj,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Relative tolerance of every comparison: |got − want| ≤ TOL · (1 + |want|) (f32 arithmetic
/// against f64 references; the fast activations are within 1e-5 of the exact ones).
const TOL: f64 = 2e-5;

fn randv(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect()
}

/// `v` in a tensor of `b`.
pub fn up(b: &dyn ComputeBackend, v: &[f32]) -> Tensor {
    let mut t = Tensor::default();
    b.upload(v, &mut t).expect("upload");
    t
}

/// The values of a tensor of `b`.
pub fn down(b: &dyn ComputeBackend, t: &Tensor) -> Vec<f32> {
    let mut v = vec![f32::NAN; t.len()];
    b.download(t, &mut v).expect("download");
    v
}

fn close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= TOL * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w} (|Δ| {err:e})"
        );
    }
}

fn ref_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, kind: NormKind, eps: f32) -> Vec<f64> {
    let d = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let r: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        match kind {
            NormKind::Rms { offset } => {
                let ms = r.iter().map(|v| v * v).sum::<f64>() / d as f64;
                let s = 1.0 / (ms + eps as f64).sqrt();
                out.extend(r.iter().zip(w).map(|(v, &wi)| v * s * (wi + offset) as f64));
            }
            NormKind::Layer => {
                let mean = r.iter().sum::<f64>() / d as f64;
                let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
                let s = 1.0 / (var + eps as f64).sqrt();
                out.extend(
                    r.iter().enumerate().map(|(i, v)| {
                        (v - mean) * s * w[i] as f64 + b.map_or(0.0, |b| b[i] as f64)
                    }),
                );
            }
        }
    }
    out
}

fn check_norms(b: &dyn ComputeBackend, rng: &mut StdRng) {
    for &(rows, d) in &[(1, 1), (3, 7), (5, 64), (2, 576), (4, 1000)] {
        let x = randv(rng, rows * d);
        let w = randv(rng, d);
        let bias = randv(rng, d);
        for (kind, bias) in [
            (NormKind::Rms { offset: 0.0 }, None),
            (NormKind::Rms { offset: 1.0 }, None),
            (NormKind::Layer, Some(&bias[..])),
            (NormKind::Layer, None),
        ] {
            let n = Norm {
                kind,
                weight: &w,
                bias,
                eps: 1e-6,
            };
            let want = ref_norm(&x, &w, bias, kind, 1e-6);
            let xt = up(b, &x);
            let mut out = up(b, &[f32::NAN]);
            b.norm(&n, &xt, &mut out).expect("norm");
            close(
                &format!("norm {kind:?} [{rows}x{d}]"),
                &down(b, &out),
                &want,
            );
            let mut inplace = up(b, &x);
            b.norm_inplace(&n, &mut inplace).expect("norm_inplace");
            close(
                &format!("norm_inplace {kind:?} [{rows}x{d}]"),
                &down(b, &inplace),
                &want,
            );
        }
        let n = Norm {
            kind: NormKind::Rms { offset: 0.0 },
            weight: &w,
            bias: None,
            eps: 1e-6,
        };
        let short = up(b, &x[1..]);
        let mut out = Tensor::default();
        assert!(
            d == 1 || b.norm(&n, &short, &mut out).is_err(),
            "norm: an input of partial rows is an error"
        );
    }
}

fn check_rope(b: &dyn ComputeBackend, rng: &mut StdRng) {
    // YaRN of gpt-oss (factor 32 over an original 4096 positions, no truncation): frequencies
    // and cos/sin factor by HF `_compute_yarn_parameters`, worked out here independently.
    let yarn = RopeScaling::Yarn {
        factor: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max_position_embeddings: 4096,
        attention_factor: 0.1 * 32f64.ln() + 1.0,
        truncate: false,
    };
    let yarn_inv = |rot: usize, i: usize| {
        let d = rot as f64;
        let corr =
            |r: f64| d * (4096.0 / (r * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 1e4f64.ln());
        let (lo, hi) = (corr(32.0).max(0.0), corr(1.0).min(d - 1.0));
        let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
        let f = 1.0 / 1e4f64.powf(2.0 * i as f64 / d);
        f / 32.0 * ramp + f * (1.0 - ramp)
    };
    for &(heads, head_dim, rotary_dim, interleaved, scaling) in &[
        (1, 2, 2, false, RopeScaling::None),
        (3, 64, 64, false, RopeScaling::None),
        (2, 44, 28, false, RopeScaling::None),
        (4, 16, 16, true, RopeScaling::None),
        (3, 64, 64, false, yarn),
    ] {
        let positions = [0usize, 5, 6, 17, 3, 1000];
        let cfg = RopeConfig {
            head_dim,
            rotary_dim,
            base: 10000.0,
            scaling,
            interleaved,
        };
        let x = randv(rng, positions.len() * heads * head_dim);
        let is_yarn = scaling != RopeScaling::None;
        let inv: Vec<f64> = (0..rotary_dim / 2)
            .map(|i| {
                if is_yarn {
                    yarn_inv(rotary_dim, i)
                } else {
                    1.0 / 10000f64.powf(2.0 * i as f64 / rotary_dim as f64)
                }
            })
            .collect();
        let mscale = if is_yarn { 0.1 * 32f64.ln() + 1.0 } else { 1.0 };
        let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for (r, &pos) in positions.iter().enumerate() {
            for h in 0..heads {
                let base = (r * heads + h) * head_dim;
                for (i, f) in inv.iter().enumerate() {
                    let (a, c) = if interleaved {
                        (base + 2 * i, base + 2 * i + 1)
                    } else {
                        (base + i, base + i + rotary_dim / 2)
                    };
                    let (s, co) = (pos as f64 * f).sin_cos();
                    let (s, co) = (s * mscale, co * mscale);
                    let (xa, xc) = (x[a] as f64, x[c] as f64);
                    want[a] = xa * co - xc * s;
                    want[c] = xc * co + xa * s;
                }
            }
        }
        let mut gt = up(b, &x);
        b.rope(&mut gt, heads, &positions, &cfg).expect("rope");
        let got = down(b, &gt);
        let what =
            format!("rope heads {heads} head_dim {head_dim} rotary {rotary_dim} {scaling:?}");
        // sin/cos of large angles in f32 tables: absolute error grows with the position.
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{what}: element {i}: got {g}, want {w}"
            );
        }
        let mut short = up(b, &x[1..]);
        assert!(
            b.rope(&mut short, heads, &positions, &cfg).is_err(),
            "{what}: a wrong length is an error"
        );
    }
}

/// Scalar causal attention (HF eager) of one sequence: query rows `q` at positions
/// `start..`, keys/values `k`, `v` for positions `0..start + rows`; per row and head, softmax
/// over the visible keys.
fn ref_attention(q: &[f32], k: &[f32], v: &[f32], start: usize, p: &AttentionParams) -> Vec<f64> {
    let (hd, nq, nkv) = (p.head_dim, p.n_q_heads, p.n_kv_heads);
    let group = nq / nkv;
    let mut out = vec![0.0; q.len()];
    for r in 0..q.len() / (nq * hd) {
        let pos = start + r;
        for h in 0..nq {
            let g = h / group;
            let qh = &q[(r * nq + h) * hd..(r * nq + h + 1) * hd];
            let visible: Vec<usize> = (0..=pos)
                .filter(|&j| p.sliding_window.is_none_or(|w| pos - j < w))
                .collect();
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let kj = &k[(j * nkv + g) * hd..(j * nkv + g + 1) * hd];
                    let s = p.scale as f64
                        * qh.iter()
                            .zip(kj)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum::<f64>();
                    match p.softcap {
                        Some(c) => c as f64 * (s / c as f64).tanh(),
                        None => s,
                    }
                })
                .collect();
            let sink = p.sinks.map(|s| s[h] as f64);
            let m = scores
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |k| (k - m).exp());
            let o = &mut out[(r * nq + h) * hd..(r * nq + h + 1) * hd];
            for (&j, w) in visible.iter().zip(&e) {
                let vj = &v[(j * nkv + g) * hd..(j * nkv + g + 1) * hd];
                for (oi, &vi) in o.iter_mut().zip(vj) {
                    *oi += w / z * vi as f64;
                }
            }
        }
    }
    out
}

/// (q heads, kv heads, head_dim, window, soft-cap, the batch's sequences as (cached
/// positions before the step, new rows)).
type AttnCase = (
    usize,
    usize,
    usize,
    Option<usize>,
    Option<f32>,
    Vec<(usize, usize)>,
);

fn check_attention(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let cases: &[AttnCase] = &[
        (1, 1, 8, None, None, vec![(0, 1)]),
        (4, 4, 16, None, None, vec![(8, 1)]),
        (8, 2, 64, None, None, vec![(30, 10)]),
        (6, 1, 32, Some(4), None, vec![(0, 12)]),
        (4, 2, 44, Some(5), Some(50.0), vec![(4, 3), (32, 1), (0, 5)]),
        (8, 1, 128, Some(1), None, vec![(6, 1), (2, 2)]),
        (
            16,
            2,
            64,
            None,
            Some(20.0),
            vec![(299, 1), (0, 17), (40, 1)],
        ),
        (8, 8, 64, None, None, vec![(100, 1); 5]),
        // Prompt chunks over several row and key tiles (the CUDA tiled kernel: 32 rows, 32
        // keys), windows that start inside a tile, head_dim 256.
        (8, 2, 128, Some(20), None, vec![(5, 70), (0, 33), (3, 1)]),
        (4, 1, 256, None, Some(30.0), vec![(40, 37)]),
        // Chunks of 128 rows and more that end at position 512 or later (CUDA: scores and
        // values as cuBLAS GEMMs in pieces of 512 rows, each over the keys its rows see; the
        // other sequences of the batch by tiles), with a window and soft-cap.
        (8, 2, 64, None, None, vec![(400, 200), (3, 1), (0, 130)]),
        (4, 1, 128, Some(50), Some(30.0), vec![(10, 600)]),
        // With attention sinks (the last three cases).
        (4, 2, 16, Some(8), None, vec![(10, 1), (0, 9)]),
        (8, 2, 64, None, None, vec![(30, 10), (5, 1)]),
        (4, 2, 64, Some(100), None, vec![(500, 129)]),
    ];
    let sink_cases = cases.len() - 3;
    for (ci, (nq, nkv, hd, window, softcap, seqs)) in cases.iter().enumerate() {
        let sinks: Vec<f32> = (0..*nq).map(|h| [-3.0, 0.0, 0.5, 4.0][h % 4]).collect();
        let p = AttentionParams {
            n_q_heads: *nq,
            n_kv_heads: *nkv,
            head_dim: *hd,
            scale: 1.0 / (*hd as f32).sqrt(),
            sliding_window: *window,
            softcap: *softcap,
            sinks: (ci >= sink_cases).then_some(&sinks[..]),
        };
        let (qd, kvd) = (nq * hd, nkv * hd);
        let rows: usize = seqs.iter().map(|s| s.1).sum();
        let q = randv(rng, rows * qd);
        let k = randv(rng, rows * kvd);
        let v = randv(rng, rows * kvd);
        // Each sequence's cache: random rows before `start`, room for 3 more after its rows.
        let caps: Vec<usize> = seqs.iter().map(|&(st, n)| st + n + 3).collect();
        let prior: Vec<(Vec<f32>, Vec<f32>)> = caps
            .iter()
            .map(|&c| (randv(rng, c * kvd), randv(rng, c * kvd)))
            .collect();
        let mut want = Vec::with_capacity(q.len());
        let mut row0 = 0;
        for (&(start, n), (pk, pv)) in seqs.iter().zip(&prior) {
            let (mut kc, mut vc) = (pk[..start * kvd].to_vec(), pv[..start * kvd].to_vec());
            kc.extend_from_slice(&k[row0 * kvd..(row0 + n) * kvd]);
            vc.extend_from_slice(&v[row0 * kvd..(row0 + n) * kvd]);
            want.extend(ref_attention(
                &q[row0 * qd..(row0 + n) * qd],
                &kc,
                &vc,
                start,
                &p,
            ));
            row0 += n;
        }
        let mut caches: Vec<(Tensor, Tensor)> = prior
            .iter()
            .map(|(pk, pv)| (up(b, pk), up(b, pv)))
            .collect();
        let (qt, kt, vt) = (up(b, &q), up(b, &k), up(b, &v));
        let mut out = Tensor::default();
        let mut slots = kv_slots(&mut caches, seqs);
        let mut a = Attend {
            q: &qt,
            k: &kt,
            v: &vt,
            seqs: &mut slots,
        };
        b.attend(&mut a, &p, &mut out).expect("attention");
        let what =
            format!("attention {nq}q/{nkv}kv×{hd} window {window:?} cap {softcap:?} seqs {seqs:?}");
        close(&what, &down(b, &out), &want);
        // The new rows are in each cache at their positions; the rows before are untouched.
        let mut row0 = 0;
        for ((kc, vc), (&(start, n), (pk, _))) in caches.iter().zip(seqs.iter().zip(&prior)) {
            let (kh, vh) = (down(b, kc), down(b, vc));
            assert_eq!(
                &kh[..start * kvd],
                &pk[..start * kvd],
                "{what}: cached keys kept"
            );
            assert_eq!(
                &kh[start * kvd..(start + n) * kvd],
                &k[row0 * kvd..(row0 + n) * kvd],
                "{what}: new keys stored"
            );
            assert_eq!(
                &vh[start * kvd..(start + n) * kvd],
                &v[row0 * kvd..(row0 + n) * kvd],
                "{what}: new values stored"
            );
            row0 += n;
        }
        // A cache without room for the new rows is an error.
        let (mut kc, mut vc) = (up(b, &k[..kvd]), up(b, &v[..kvd]));
        let mut slot = [KvSlot {
            k_cache: &mut kc,
            v_cache: &mut vc,
            row0: 0,
            rows: 1,
            start: 1,
        }];
        let (q1, k1, v1) = (up(b, &q[..qd]), up(b, &k[..kvd]), up(b, &v[..kvd]));
        let mut a = Attend {
            q: &q1,
            k: &k1,
            v: &v1,
            seqs: &mut slot,
        };
        assert!(
            b.attend(&mut a, &p, &mut out).is_err(),
            "{what}: a cache without room is an error"
        );
    }
}

fn check_products(b: &dyn ComputeBackend, rng: &mut StdRng) {
    for &(m, rows, cols) in &[(1, 5, 32), (3, 17, 64), (9, 64, 256), (33, 40, 512)] {
        let w = randv(rng, rows * cols);
        let x = randv(rng, m * cols);
        let want: Vec<f64> = (0..m)
            .flat_map(|i| {
                let (w, x) = (&w, &x);
                (0..rows).map(move |r| {
                    (0..cols)
                        .map(|c| x[i * cols + c] as f64 * w[r * cols + c] as f64)
                        .sum::<f64>()
                })
            })
            .collect();
        let mat = Matrix {
            data: MatData::F32(&w),
            rows,
            cols,
        };
        let xt = up(b, &x);
        let mut y = Tensor::default();
        b.project(&mat, &xt, m, &mut y).expect("project");
        let scale = want.iter().fold(1.0f64, |a, v| a.max(v.abs()));
        let got = down(b, &y);
        for (i, (&g, &wv)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - wv).abs() <= 1e-5 * scale,
                "project f32 [{m}x{cols}]·[{rows}x{cols}]ᵀ: element {i}: got {g}, want {wv}"
            );
        }
        // Quantized: the tensor products equal the host-slice products.
        for format in [
            infer_compute::QuantFormat::Q4_K,
            infer_compute::QuantFormat::Q8_0,
        ] {
            if !cols.is_multiple_of(format.block_elems()) {
                continue;
            }
            let bytes = infer_quant::quantize(format, &w, cols, None).expect("quantize");
            let mat = Matrix {
                data: MatData::Blocks {
                    format,
                    bytes: &bytes,
                },
                rows,
                cols,
            };
            let mut host = vec![0.0; m * rows];
            b.linear(&mat, &x, m, &mut host).expect("linear");
            let (mut y1, mut y2) = (Tensor::default(), Tensor::default());
            let mut projs = [
                TensorProj { w: mat, y: &mut y1 },
                TensorProj { w: mat, y: &mut y2 },
            ];
            b.project_many(&xt, m, &mut projs).expect("project_many");
            for (name, t) in [("project_many 0", &y1), ("project_many 1", &y2)] {
                let got = down(b, t);
                let scale = host.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                for (i, (&g, &h)) in got.iter().zip(&host).enumerate() {
                    assert!(
                        (g - h).abs() <= 1e-5 * scale,
                        "{name} {format:?} [{m}x{cols}]: element {i}: got {g}, host {h}"
                    );
                }
            }
        }
    }
}

fn check_rows_bias_softcap(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let (r, w) = (7, 11);
    let x = randv(rng, r * w);
    let xt = up(b, &x);
    let mut g = Tensor::default();
    b.copy_rows(&xt, w, &[6, 0, 3, 3], &mut g)
        .expect("copy_rows");
    let want: Vec<f64> = [6usize, 0, 3, 3]
        .iter()
        .flat_map(|&i| x[i * w..(i + 1) * w].iter().map(|&v| v as f64))
        .collect();
    close("copy_rows", &down(b, &g), &want);
    assert!(
        b.copy_rows(&xt, w, &[7], &mut g).is_err(),
        "copy_rows: a row past the end is an error"
    );
    // Scatter-add: three source rows into rows 5, 0, 2 of a copy of `x`.
    let src = randv(rng, 3 * w);
    let (rows, wts) = ([5usize, 0, 2], [0.5f32, -1.25, 2.0]);
    let mut dt = up(b, &x);
    b.add_rows_scaled(&up(b, &src), w, &rows, &wts, &mut dt)
        .expect("add_rows_scaled");
    let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (i, (&r, &a)) in rows.iter().zip(&wts).enumerate() {
        for c in 0..w {
            want[r * w + c] += a as f64 * src[i * w + c] as f64;
        }
    }
    close("add_rows_scaled", &down(b, &dt), &want);
    for (bad, what) in [
        (&[5usize, 7, 2][..], "past the end"),
        (&[5, 0, 5][..], "repeated"),
    ] {
        assert!(
            b.add_rows_scaled(&up(b, &src), w, bad, &wts, &mut dt)
                .is_err(),
            "add_rows_scaled: a row index {what} is an error"
        );
    }
    b.fill(&mut dt, 13, -2.5).expect("fill");
    close("fill", &down(b, &dt), &[-2.5; 13]);
    // add_gated: x += sigmoid(gate[r]) · y per row, gates far on both sides and at 0.
    let gates: Vec<f32> = (0..r)
        .map(|r| [-30.0, -1.5, 0.0, 2.0, 40.0][r % 5])
        .collect();
    let y = randv(rng, x.len());
    let mut xt = up(b, &x);
    b.add_gated(&mut xt, &up(b, &y), &up(b, &gates), w)
        .expect("add_gated");
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .enumerate()
        .map(|(i, (&v, &yv))| v as f64 + yv as f64 / (1.0 + (-(gates[i / w] as f64)).exp()))
        .collect();
    close("add_gated", &down(b, &xt), &want);
    assert!(
        b.add_gated(&mut xt, &up(b, &y[1..]), &up(b, &gates), w)
            .is_err()
            && b.add_gated(&mut xt, &up(b, &y), &up(b, &gates[1..]), w)
                .is_err()
            && b.add_gated(&mut xt, &up(b, &y), &up(b, &gates[..1]), w)
                .is_err()
            && b.add_gated(&mut xt, &up(b, &y), &up(b, &gates), w + 1)
                .is_err(),
        "add_gated: a branch or gates of another length are an error"
    );
    let bias = randv(rng, w);
    let mut yt = up(b, &x);
    b.add_bias(&mut yt, &bias).expect("add_bias");
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f64 + bias[i % w] as f64)
        .collect();
    close("add_bias", &down(b, &yt), &want);
    for (div, cap) in [(1.0, Some(3.0f32)), (2.5, None), (4.0, Some(30.0))] {
        let mut lt = up(b, &x);
        b.scale_softcap(&mut lt, div, cap).expect("scale_softcap");
        let want: Vec<f64> = x
            .iter()
            .map(|&v| {
                let z = v as f64 / div as f64;
                cap.map_or(z, |c| c as f64 * (z / c as f64).tanh())
            })
            .collect();
        close(
            &format!("scale_softcap {div} {cap:?}"),
            &down(b, &lt),
            &want,
        );
    }
}

fn check_elementwise(b: &dyn ComputeBackend, rng: &mut StdRng) {
    for &n in &[1usize, 7, 64, 1537] {
        let gate = randv(rng, n);
        let up = randv(rng, n);
        for act in [Activation::Silu, Activation::GeluTanh, Activation::Gelu] {
            let want: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| act_ref(act, g as f64) * u as f64)
                .collect();
            let mut got = self::up(b, &up);
            b.gated_activation(act, &self::up(b, &gate), &mut got)
                .expect("gated");
            close(&format!("gated {act:?} n {n}"), &down(b, &got), &want);
            let want: Vec<f64> = gate.iter().map(|&g| act_ref(act, g as f64)).collect();
            let mut got = self::up(b, &gate);
            b.activation(act, &mut got).expect("activation");
            close(&format!("activation {act:?} n {n}"), &down(b, &got), &want);
        }
        let mut x = self::up(b, &up);
        b.add_scaled(&mut x, &self::up(b, &gate), 0.5)
            .expect("add_scaled");
        let want: Vec<f64> = up
            .iter()
            .zip(&gate)
            .map(|(&a, &c)| a as f64 + 0.5 * c as f64)
            .collect();
        close(&format!("add_scaled n {n}"), &down(b, &x), &want);
        assert!(b.add_scaled(&mut x, &self::up(b, &gate[1..]), 1.0).is_err() || n == 1);
    }
}

fn act_ref(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
            0.5 * x * (1.0 + u.tanh())
        }
        Activation::Gelu => 0.5 * x * (1.0 + infer_compute::ops::erf(x / 2f64.sqrt())),
    }
}

fn check_embed_argmax(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let (rows, h) = (37, 13);
    let table = randv(rng, rows * h);
    let half: Vec<f16> = table.iter().map(|&v| f16::from_f32(v)).collect();
    let ids = [0u32, 36, 5, 5, 17];
    for (t, name) in [
        (FloatTable::F32(&table), "f32"),
        (FloatTable::F16(&half), "f16"),
    ] {
        let mut out = Tensor::default();
        b.embed(t, h, &ids, 2.5, &mut out).expect("embed");
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| (0..h).map(move |c| i as usize * h + c))
            .map(|k| match t {
                FloatTable::F32(v) => v[k] as f64 * 2.5,
                FloatTable::F16(v) => v[k].to_f64() * 2.5,
                FloatTable::Blocks { .. } => unreachable!("float tables only here"),
            })
            .collect();
        close(&format!("embed {name}"), &down(b, &out), &want);
        assert!(
            b.embed(t, h, &[rows as u32], 1.0, &mut out).is_err(),
            "embed: an id past the table is an error"
        );
    }
    // A quantized table (ggml blocks; a vindex without a float tier): each looked-up row is
    // the ggml dequantization of its blocks, times the scale.
    let (rows, h) = (9, 256);
    let values = randv(rng, rows * h);
    for format in [
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q5_0,
        // No device kernel: looked up on the host.
        QuantFormat::Q5_K,
    ] {
        let bytes = infer_quant::quantize(format, &values, h, None).expect("quantize");
        let deq = infer_quant::dequantize_to_vec(format, &bytes, rows * h).expect("dequantize");
        let t = FloatTable::Blocks {
            format,
            bytes: &bytes,
        };
        let ids = [8u32, 0, 3, 3];
        let mut out = Tensor::default();
        b.embed(t, h, &ids, 2.5, &mut out).expect("embed blocks");
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| (0..h).map(move |c| i as usize * h + c))
            .map(|k| deq[k] as f64 * 2.5)
            .collect();
        close(&format!("embed {format}"), &down(b, &out), &want);
        assert!(
            b.embed(t, h, &[rows as u32], 1.0, &mut out).is_err(),
            "embed {format}: an id past the table is an error"
        );
    }
    let mut logits = randv(rng, 1001);
    logits[500] = 9.0;
    logits[700] = 9.0;
    let a = b.argmax(&logits).expect("argmax");
    assert_eq!(
        (a.token, a.all_finite),
        (500, true),
        "argmax: ties to the smaller id"
    );
    logits[3] = f32::NAN;
    logits[4] = f32::INFINITY;
    let a = b.argmax(&logits).expect("argmax");
    assert_eq!(
        (a.token, a.all_finite),
        (500, false),
        "argmax: non-finite values flagged, not chosen"
    );
    assert!(b.argmax(&[]).is_err(), "argmax of nothing is an error");
}

/// Every whole operation of `b` against the scalar references (random inputs, fixed seed).
pub fn check_backend_ops(b: &dyn ComputeBackend) {
    let mut rng = StdRng::seed_from_u64(14);
    check_norms(b, &mut rng);
    check_rope(b, &mut rng);
    check_attention(b, &mut rng);
    check_products(b, &mut rng);
    check_rows_bias_softcap(b, &mut rng);
    check_elementwise(b, &mut rng);
    check_embed_argmax(b, &mut rng);
    check_add_norm(b, &mut rng);
    check_rope_attend(b, &mut rng);
    check_act_then_product(b, &mut rng);
    check_argmax_rows(b, &mut rng);
    check_chosen(b, &mut rng);
    check_moe_routing(b, &mut rng);
    check_moe_grouped(b, &mut rng);
}

/// A prompt chunk's expert products: `project_grouped` (groups of 5, 70 and 1 rows in no
/// expert order — 70 is two row tiles of a device — over experts of 136 rows, two products
/// at once of the two activation families, every format with a grouped device kernel) equals
/// `linear` of each group's rows by its expert within 1e-5 of the largest output, and f32
/// experts an f64 reference;
/// `combine_rows` sums each token's slots (a slot repeated) with their weights; an expert out
/// of range, an empty group, `x` of other rows and a slot past `y` are errors.
fn check_moe_grouped(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let (n, rows, cols) = (5usize, 136usize, 512usize);
    let groups = [
        ExpertRows { expert: 3, rows: 5 },
        ExpertRows {
            expert: 0,
            rows: 70,
        },
        ExpertRows { expert: 4, rows: 1 },
    ];
    let total: usize = groups.iter().map(|g| g.rows).sum();
    let x = randv(rng, total * cols);
    let xt = up(b, &x);
    let experts = |rng: &mut StdRng, format: QuantFormat| -> Vec<Vec<u8>> {
        (0..n)
            .map(|_| {
                infer_quant::quantize(format, &randv(rng, rows * cols), cols, None)
                    .expect("quantize")
            })
            .collect()
    };
    fn mats(bytes: &[Vec<u8>], format: QuantFormat, rows: usize, cols: usize) -> Vec<Matrix<'_>> {
        bytes
            .iter()
            .map(|bytes| Matrix {
                data: MatData::Blocks { format, bytes },
                rows,
                cols,
            })
            .collect()
    }
    let pairs = [
        (QuantFormat::Q4_K, QuantFormat::Q8_0),
        (QuantFormat::Q6_K, QuantFormat::Q4_0),
        (QuantFormat::Q5_0, QuantFormat::Q4_K),
    ];
    for (fa, fb) in pairs {
        let (ba, bb) = (experts(rng, fa), experts(rng, fb));
        let (ma, mb) = (mats(&ba, fa, rows, cols), mats(&bb, fb, rows, cols));
        let (mut ya, mut yb) = (Tensor::default(), Tensor::default());
        b.project_grouped(
            &xt,
            &mut [
                RoutedProj {
                    experts: &ma,
                    y: &mut ya,
                },
                RoutedProj {
                    experts: &mb,
                    y: &mut yb,
                },
            ],
            &groups,
        )
        .expect("project_grouped");
        for (format, mats, y) in [(fa, &ma, &ya), (fb, &mb, &yb)] {
            let got = down(b, y);
            assert_eq!(
                got.len(),
                total * rows,
                "project_grouped {format:?}: length"
            );
            let mut row0 = 0;
            for g in &groups {
                let xs = &x[row0 * cols..(row0 + g.rows) * cols];
                let mut host = vec![0.0; g.rows * rows];
                b.linear(&mats[g.expert], xs, g.rows, &mut host)
                    .expect("linear");
                let scale = host.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                let part = &got[row0 * rows..(row0 + g.rows) * rows];
                for (i, (&gv, &h)) in part.iter().zip(&host).enumerate() {
                    assert!(
                        (gv - h).abs() <= 1e-5 * scale,
                        "project_grouped {format:?} expert {}: element {i}: got {gv}, host {h}",
                        g.expert
                    );
                }
                row0 += g.rows;
            }
        }
        let mut bad = Tensor::default();
        for (what, xs, gs) in [
            (
                "an expert out of range",
                &xt,
                vec![ExpertRows {
                    expert: n,
                    rows: total,
                }],
            ),
            (
                "an empty group",
                &xt,
                vec![ExpertRows { expert: 0, rows: 0 }],
            ),
            (
                "x of other rows",
                &xt,
                vec![ExpertRows {
                    expert: 0,
                    rows: total - 1,
                }],
            ),
        ] {
            assert!(
                b.project_grouped(
                    xs,
                    &mut [RoutedProj {
                        experts: &ma,
                        y: &mut bad
                    }],
                    &gs
                )
                .is_err(),
                "project_grouped: {what} is an error"
            );
        }
    }
    // f32 experts (no grouped kernel: one product per group on a device; the 70-row group
    // past the one-row kernels) against an f64 reference.
    let wf: Vec<Vec<f32>> = (0..n).map(|_| randv(rng, rows * cols)).collect();
    let mf: Vec<Matrix<'_>> = wf
        .iter()
        .map(|w| Matrix {
            data: MatData::F32(w),
            rows,
            cols,
        })
        .collect();
    let mut yf = Tensor::default();
    b.project_grouped(
        &xt,
        &mut [RoutedProj {
            experts: &mf,
            y: &mut yf,
        }],
        &groups,
    )
    .expect("project_grouped f32");
    // Within 1e-6 of Σ|xᵢwᵢ| (f32 sums of 512 terms in any order).
    let got = down(b, &yf);
    assert_eq!(got.len(), total * rows, "project_grouped f32: length");
    let mut i = 0;
    let mut row0 = 0;
    for g in &groups {
        for xr in x[row0 * cols..(row0 + g.rows) * cols].chunks_exact(cols) {
            for wr in wf[g.expert].chunks_exact(cols) {
                let terms = xr.iter().zip(wr).map(|(&a, &w)| a as f64 * w as f64);
                let (want, abs) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                assert!(
                    (got[i] as f64 - want).abs() <= 1e-6 * abs,
                    "project_grouped f32 expert {}: element {i}: got {}, want {want}",
                    g.expert,
                    got[i]
                );
                i += 1;
            }
        }
        row0 += g.rows;
    }
    let (r, width, k) = (7usize, 40usize, 2usize);
    let yv = randv(rng, r * width);
    let slots = [0usize, 5, 6, 1, 2, 2];
    let weights = randv(rng, slots.len());
    let mut out = Tensor::default();
    b.combine_rows(&up(b, &yv), width, &slots, &weights, k, &mut out)
        .expect("combine_rows");
    let want: Vec<f64> = (0..slots.len() / k)
        .flat_map(|t| {
            let (slots, weights, yv) = (&slots, &weights, &yv);
            (0..width).map(move |i| {
                (0..k)
                    .map(|j| weights[t * k + j] as f64 * yv[slots[t * k + j] * width + i] as f64)
                    .sum()
            })
        })
        .collect();
    close("combine_rows", &down(b, &out), &want);
    assert!(
        b.combine_rows(&up(b, &yv), width, &[0, 7], &weights[..2], k, &mut out)
            .is_err(),
        "combine_rows: a slot past y is an error"
    );
    assert!(
        b.combine_rows(&up(b, &yv), width, &slots[..3], &weights[..3], k, &mut out)
            .is_err(),
        "combine_rows: slots not k per token is an error"
    );
}

/// The router's choice where the backend keeps it: `moe_route` against
/// [`infer_compute::ops::moe_route`] (indices equal, weights within 1e-6; one row, then five
/// rows at once); `project_routed`
/// (Q4_K and Q8_0 experts; two products of one shared row, then one product of a row per
/// slot) equals `linear` by each slot's expert within 1e-5 of the largest output;
/// `combine_routed` sums the slots with the chosen weights; k above the experts, k past the
/// choice and an input of neither width are errors.
fn check_moe_routing(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let (n, rows, cols) = (6usize, 24usize, 256usize);
    for (k, norm, bias) in [(2usize, true, false), (3, false, true)] {
        let logits = randv(rng, n);
        let bias_v = randv(rng, n);
        let bias = bias.then_some(&bias_v[..]);
        let mut sel = Tensor::default();
        assert!(
            b.moe_route(&up(b, &logits), n, None, n + 1, norm, &mut sel)
                .is_err(),
            "moe_route: k above the experts is an error"
        );
        b.moe_route(&up(b, &logits), n, bias, k, norm, &mut sel)
            .expect("moe_route");
        let got = down(b, &sel);
        let want = infer_compute::ops::moe_route(&mut logits.clone(), bias, k, norm);
        for (j, &(e, w)) in want.iter().enumerate() {
            assert_eq!(got[j], e as f32, "moe_route k={k}: slot {j}'s expert");
            assert!(
                (got[k + j] - w).abs() <= 1e-6,
                "moe_route k={k}: slot {j}'s weight {} (want {w})",
                got[k + j]
            );
        }
        // Five rows at once (a prompt chunk's router), each as the one-row choice.
        let many = randv(rng, 5 * n);
        let mut sel5 = Tensor::default();
        b.moe_route(&up(b, &many), n, bias, k, norm, &mut sel5)
            .expect("moe_route of rows");
        let got5 = down(b, &sel5);
        assert_eq!(got5.len(), 5 * 2 * k, "moe_route of rows: length");
        for (r, (row, g)) in many
            .chunks_exact(n)
            .zip(got5.chunks_exact(2 * k))
            .enumerate()
        {
            let want = infer_compute::ops::moe_route(&mut row.to_vec(), bias, k, norm);
            for (j, &(e, w)) in want.iter().enumerate() {
                assert_eq!(g[j], e as f32, "moe_route row {r}: slot {j}'s expert");
                assert!(
                    (g[k + j] - w).abs() <= 1e-6,
                    "moe_route row {r}: slot {j}'s weight"
                );
            }
        }
        assert!(
            b.moe_route(&up(b, &many[..5 * n - 1]), n, bias, k, norm, &mut sel5)
                .is_err(),
            "moe_route: logits not whole rows is an error"
        );
        for format in [QuantFormat::Q4_K, QuantFormat::Q8_0] {
            let ws: Vec<Vec<f32>> = (0..n).map(|_| randv(rng, rows * cols)).collect();
            let bytes: Vec<Vec<u8>> = ws
                .iter()
                .map(|w| infer_quant::quantize(format, w, cols, None).expect("quantize"))
                .collect();
            let mats: Vec<Matrix<'_>> = bytes
                .iter()
                .map(|bytes| Matrix {
                    data: MatData::Blocks { format, bytes },
                    rows,
                    cols,
                })
                .collect();
            // Each slot's rows of `y` against `linear` of its input by its expert.
            let check = |what: &str, y: &Tensor, x: &[f32], per_slot: bool| {
                let got_y = down(b, y);
                assert_eq!(got_y.len(), k * rows, "{what}: length");
                for (s, &(e, _)) in want.iter().enumerate() {
                    let xs = if per_slot {
                        &x[s * cols..(s + 1) * cols]
                    } else {
                        x
                    };
                    let mut host = vec![0.0; rows];
                    b.linear(&mats[e], xs, 1, &mut host).expect("linear");
                    let scale = host.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                    for (i, (&g, &h)) in got_y[s * rows..(s + 1) * rows]
                        .iter()
                        .zip(&host)
                        .enumerate()
                    {
                        assert!(
                            (g - h).abs() <= 1e-5 * scale,
                            "{what} {format:?} slot {s} (expert {e}): element {i}: got {g}, host {h}"
                        );
                    }
                }
            };
            let x = randv(rng, cols);
            let xt = up(b, &x);
            let (mut y1, mut y2) = (Tensor::default(), Tensor::default());
            b.project_routed(
                &xt,
                &mut [
                    RoutedProj {
                        experts: &mats,
                        y: &mut y1,
                    },
                    RoutedProj {
                        experts: &mats,
                        y: &mut y2,
                    },
                ],
                &sel,
                k,
            )
            .expect("project_routed");
            check("project_routed shared row 0", &y1, &x, false);
            check("project_routed shared row 1", &y2, &x, false);
            let xk = randv(rng, k * cols);
            let mut y3 = Tensor::default();
            b.project_routed(
                &up(b, &xk),
                &mut [RoutedProj {
                    experts: &mats,
                    y: &mut y3,
                }],
                &sel,
                k,
            )
            .expect("project_routed per slot");
            check("project_routed per slot", &y3, &xk, true);
            let mut bad = Tensor::default();
            assert!(
                b.project_routed(
                    &up(b, &x[..cols - 32]),
                    &mut [RoutedProj {
                        experts: &mats,
                        y: &mut bad
                    }],
                    &sel,
                    k
                )
                .is_err(),
                "project_routed: an input of neither width is an error"
            );
            assert!(
                b.project_routed(
                    &xt,
                    &mut [RoutedProj {
                        experts: &mats,
                        y: &mut bad
                    }],
                    &sel,
                    k + 1
                )
                .is_err(),
                "project_routed: more slots than chosen is an error"
            );
        }
        let yv = randv(rng, k * 40);
        let mut out = Tensor::default();
        b.combine_routed(&up(b, &yv), &sel, k, &mut out)
            .expect("combine_routed");
        let want_out: Vec<f64> = (0..40)
            .map(|i| {
                (0..k)
                    .map(|s| got[k + s] as f64 * yv[s * 40 + i] as f64)
                    .sum()
            })
            .collect();
        close("combine_routed", &down(b, &out), &want_out);
        assert!(
            b.combine_routed(&up(b, &yv[..k * 40 - 1]), &sel, k, &mut out)
                .is_err(),
            "combine_routed: y not k whole rows is an error"
        );
    }
}

/// Quantized products of `x` (`m × cols`, a tensor just written by a fused operation, which a
/// device backend may have quantized for them) equal the host-slice products of its values
/// within 1e-5 of the largest output (the tolerance of [`check_products`]).
fn check_products_of(b: &dyn ComputeBackend, rng: &mut StdRng, what: &str, x: &Tensor, m: usize) {
    let cols = x.len() / m;
    let rows = 24;
    let w = randv(rng, rows * cols);
    let formats: Vec<QuantFormat> = [QuantFormat::Q4_K, QuantFormat::Q8_0]
        .into_iter()
        .filter(|f| cols.is_multiple_of(f.block_elems()))
        .collect();
    let bytes: Vec<Vec<u8>> = formats
        .iter()
        .map(|&f| infer_quant::quantize(f, &w, cols, None).expect("quantize"))
        .collect();
    let mats: Vec<Matrix<'_>> = formats
        .iter()
        .zip(&bytes)
        .map(|(&format, bytes)| Matrix {
            data: MatData::Blocks { format, bytes },
            rows,
            cols,
        })
        .collect();
    let mut ys: Vec<Tensor> = mats.iter().map(|_| Tensor::default()).collect();
    let mut projs: Vec<TensorProj<'_>> = mats
        .iter()
        .zip(ys.iter_mut())
        .map(|(&w, y)| TensorProj { w, y })
        .collect();
    // Right after the fused operation (no operation in between).
    b.project_many(x, m, &mut projs).expect("project_many");
    let xh = down(b, x);
    for (mat, y) in mats.iter().zip(&ys) {
        let mut host = vec![0.0; m * rows];
        b.linear(mat, &xh, m, &mut host).expect("linear");
        let got = down(b, y);
        let scale = host.iter().fold(1.0f32, |a, v| a.max(v.abs()));
        let format = match mat.data {
            MatData::Blocks { format, .. } => format,
            _ => unreachable!("quantized matrices only"),
        };
        for (i, (&g, &h)) in got.iter().zip(&host).enumerate() {
            assert!(
                (g - h).abs() <= 1e-5 * scale,
                "{what}: {format:?} product element {i}: got {g}, host {h}"
            );
        }
    }
}

/// `add_norm`: `x += alpha · post(branch)`, `out = next(x)` against [`ref_norm`] (RMS with and
/// without a post norm, Gemma's offset, a LayerNorm next norm, several rows), then the
/// products of `out`.
fn check_add_norm(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let rms0 = NormKind::Rms { offset: 0.0 };
    let rms1 = NormKind::Rms { offset: 1.0 };
    for &(rows, d, post, kind, alpha) in &[
        (1, 576, false, rms0, 1.0f32),
        (3, 256, true, rms1, 0.5),
        (2, 64, true, NormKind::Layer, 1.0),
        (1, 1000, false, rms1, 1.0),
        (4, 512, true, rms0, 0.22),
    ] {
        let x = randv(rng, rows * d);
        let branch = randv(rng, rows * d);
        let (pw, nw, nb) = (randv(rng, d), randv(rng, d), randv(rng, d));
        let post_norm = Norm {
            kind: if kind == NormKind::Layer { rms0 } else { kind },
            weight: &pw,
            bias: None,
            eps: 1e-6,
        };
        let next = Norm {
            kind,
            weight: &nw,
            bias: (kind == NormKind::Layer).then_some(&nb[..]),
            eps: 1e-5,
        };
        let br: Vec<f64> = if post {
            ref_norm(&branch, &pw, None, post_norm.kind, 1e-6)
        } else {
            branch.iter().map(|&v| v as f64).collect()
        };
        let x_want: Vec<f64> = x
            .iter()
            .zip(&br)
            .map(|(&a, &c)| a as f64 + alpha as f64 * c)
            .collect();
        let x_f32: Vec<f32> = x_want.iter().map(|&v| v as f32).collect();
        let out_want = ref_norm(&x_f32, &nw, next.bias, kind, 1e-5);
        let rn = ResidualNorm {
            post: post.then_some(post_norm),
            alpha,
            next,
        };
        let (mut xt, mut bt) = (up(b, &x), up(b, &branch));
        let mut out = Tensor::default();
        b.add_norm(&mut xt, &mut bt, &rn, &mut out)
            .expect("add_norm");
        let what = format!("add_norm [{rows}x{d}] post {post} {kind:?} alpha {alpha}");
        check_products_of(b, rng, &what, &out, rows);
        close(&format!("{what}: x"), &down(b, &xt), &x_want);
        close(&format!("{what}: out"), &down(b, &out), &out_want);
        let mut short = up(b, &branch[1..]);
        assert!(
            b.add_norm(&mut xt, &mut short, &rn, &mut out).is_err(),
            "{what}: a branch of another length is an error"
        );
    }
}

/// Per-row reference of `rope_attend`'s preparation: rows of `x` (`[R, heads · hd]`) normalised
/// by `norm` (over the norm's width) and rotated at `positions` (inverse frequencies `inv`,
/// cos/sin times `mscale`), in f64.
fn ref_norm_rope(
    x: &[f32],
    norm: Option<&Norm<'_>>,
    positions: &[usize],
    cfg: &RopeConfig,
    inv: &[f64],
    mscale: f64,
) -> Vec<f64> {
    let mut v: Vec<f64> = match norm {
        Some(n) => ref_norm(x, n.weight, None, n.kind, n.eps),
        None => x.iter().map(|&v| v as f64).collect(),
    };
    let width = x.len() / positions.len();
    let hd = cfg.head_dim;
    for (r, &pos) in positions.iter().enumerate() {
        for h in 0..width / hd {
            let base = r * width + h * hd;
            for (i, f) in inv.iter().enumerate() {
                let (a, c) = if cfg.interleaved {
                    (base + 2 * i, base + 2 * i + 1)
                } else {
                    (base + i, base + i + cfg.rotary_dim / 2)
                };
                let (s, co) = (pos as f64 * f).sin_cos();
                let (s, co) = (s * mscale, co * mscale);
                let (xa, xc) = (v[a], v[c]);
                v[a] = xa * co - xc * s;
                v[c] = xc * co + xa * s;
            }
        }
    }
    v
}

/// A bias-free RMSNorm with Gemma's weight offset 1 and eps 1e-6.
fn rms1_norm(w: &[f32]) -> Norm<'_> {
    Norm {
        kind: NormKind::Rms { offset: 1.0 },
        weight: w,
        bias: None,
        eps: 1e-6,
    }
}

/// (q heads, kv heads, head_dim, window, soft-cap, sinks, q/k norm: per head, whole
/// projection or none (`Some(true)`, `Some(false)`, `None`), interleaved RoPE, the
/// sequences as (cached positions, new rows)).
type RopeAttnCase = (
    usize,
    usize,
    usize,
    Option<usize>,
    Option<f32>,
    bool,
    Option<bool>,
    bool,
    Vec<(usize, usize)>,
);

/// `rope_attend`: q/k norms, RoPE and attention of decode rows (one new row per sequence: the
/// fused path of a device backend) and of prompt rows, against f64 references within the RoPE
/// check's 1e-4 (cos/sin are f32), the cache rows it stores, then the o products of its output.
fn check_rope_attend(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let cases: &[RopeAttnCase] = &[
        (
            4,
            2,
            64,
            None,
            None,
            false,
            Some(true),
            false,
            vec![(5, 1), (0, 1), (17, 1)],
        ),
        (
            8,
            1,
            256,
            Some(4),
            Some(30.0),
            false,
            Some(true),
            false,
            vec![(10, 1)],
        ),
        (4, 2, 32, None, None, true, None, true, vec![(3, 1), (9, 1)]),
        (
            4,
            4,
            64,
            Some(1),
            None,
            false,
            Some(true),
            false,
            vec![(40, 1), (1, 1)],
        ),
        (
            4,
            2,
            64,
            None,
            None,
            false,
            Some(true),
            false,
            vec![(2, 3), (0, 1)],
        ),
        (
            2,
            2,
            16,
            None,
            None,
            false,
            Some(false),
            false,
            vec![(6, 1)],
        ),
        // Caches of more than 512 positions (a device backend splits the keys over blocks):
        // eight query heads per kv head, rows far apart in one batch; a sliding window of
        // more than 512 keys with a soft-cap.
        (
            16,
            2,
            128,
            None,
            None,
            false,
            Some(true),
            false,
            vec![(700, 1), (3, 1), (1030, 1)],
        ),
        (
            8,
            2,
            64,
            Some(600),
            Some(30.0),
            false,
            None,
            false,
            vec![(900, 1), (20, 1)],
        ),
    ];
    for (nq, nkv, hd, window, softcap, with_sinks, qk, interleaved, seqs) in cases {
        let (nq, nkv, hd) = (*nq, *nkv, *hd);
        let sinks: Vec<f32> = (0..nq).map(|h| [-3.0, 0.0, 0.5, 4.0][h % 4]).collect();
        let p = AttentionParams {
            n_q_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            sliding_window: *window,
            softcap: *softcap,
            sinks: with_sinks.then_some(&sinks[..]),
        };
        // YaRN on the interleaved case (gpt-oss style scaled cos/sin), plain RoPE otherwise.
        let scaling = if *interleaved {
            RopeScaling::Yarn {
                factor: 32.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: 4096,
                attention_factor: 0.1 * 32f64.ln() + 1.0,
                truncate: false,
            }
        } else {
            RopeScaling::None
        };
        let cfg = RopeConfig {
            head_dim: hd,
            rotary_dim: if *interleaved { hd / 2 } else { hd },
            base: 10000.0,
            scaling,
            interleaved: *interleaved,
        };
        let inv = cfg.inv_freq();
        let mscale = cfg.attention_factor();
        let (qd, kvd) = (nq * hd, nkv * hd);
        let rows: usize = seqs.iter().map(|s| s.1).sum();
        let positions: Vec<usize> = seqs.iter().flat_map(|&(st, n)| st..st + n).collect();
        let (q, k, v) = (
            randv(rng, rows * qd),
            randv(rng, rows * kvd),
            randv(rng, rows * kvd),
        );
        let (qw, kw) = match qk {
            Some(false) => (randv(rng, qd), randv(rng, kvd)),
            _ => (randv(rng, hd), randv(rng, hd)),
        };
        let (q_norm, k_norm) = match qk {
            Some(_) => (Some(rms1_norm(&qw)), Some(rms1_norm(&kw))),
            None => (None, None),
        };
        let qr = ref_norm_rope(&q, q_norm.as_ref(), &positions, &cfg, &inv, mscale);
        let kr = ref_norm_rope(&k, k_norm.as_ref(), &positions, &cfg, &inv, mscale);
        let caps: Vec<usize> = seqs.iter().map(|&(st, n)| st + n + 2).collect();
        let prior: Vec<(Vec<f32>, Vec<f32>)> = caps
            .iter()
            .map(|&c| (randv(rng, c * kvd), randv(rng, c * kvd)))
            .collect();
        let mut want = Vec::with_capacity(q.len());
        let mut row0 = 0;
        for (&(start, n), (pk, pv)) in seqs.iter().zip(&prior) {
            let mut kc = pk[..start * kvd].to_vec();
            kc.extend(kr[row0 * kvd..(row0 + n) * kvd].iter().map(|&x| x as f32));
            let mut vc = pv[..start * kvd].to_vec();
            vc.extend_from_slice(&v[row0 * kvd..(row0 + n) * kvd]);
            let qrows: Vec<f32> = qr[row0 * qd..(row0 + n) * qd]
                .iter()
                .map(|&x| x as f32)
                .collect();
            want.extend(ref_attention(&qrows, &kc, &vc, start, &p));
            row0 += n;
        }
        let mut caches: Vec<(Tensor, Tensor)> = prior
            .iter()
            .map(|(pk, pv)| (up(b, pk), up(b, pv)))
            .collect();
        let (mut qt, mut kt, vt) = (up(b, &q), up(b, &k), up(b, &v));
        let mut out = Tensor::default();
        let mut slots = kv_slots(&mut caches, seqs);
        let mut a = RopeAttend {
            q: &mut qt,
            k: &mut kt,
            v: &vt,
            q_norm,
            k_norm,
            rope: Some(&cfg),
            positions: &positions,
            seqs: &mut slots,
        };
        b.rope_attend(&mut a, &p, &mut out).expect("rope_attend");
        let what = format!(
            "rope_attend {nq}q/{nkv}kv×{hd} window {window:?} cap {softcap:?} sinks {with_sinks} \
             qk norm {qk:?} interleaved {interleaved} seqs {seqs:?}"
        );
        check_products_of(b, rng, &what, &out, rows);
        let near = |what: &str, got: &[f32], want: &[f64]| {
            assert_eq!(got.len(), want.len(), "{what}: length");
            for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{what}: element {i}: got {g}, want {w}"
                );
            }
        };
        near(&what, &down(b, &out), &want);
        let mut row0 = 0;
        for ((kc, vc), (&(start, n), (pk, _))) in caches.iter().zip(seqs.iter().zip(&prior)) {
            let (kh, vh) = (down(b, kc), down(b, vc));
            assert_eq!(&kh[..start * kvd], &pk[..start * kvd], "{what}: keys kept");
            near(
                &format!("{what}: stored keys"),
                &kh[start * kvd..(start + n) * kvd],
                &kr[row0 * kvd..(row0 + n) * kvd],
            );
            assert_eq!(
                &vh[start * kvd..(start + n) * kvd],
                &v[row0 * kvd..(row0 + n) * kvd],
                "{what}: values stored"
            );
            row0 += n;
        }
    }
}

/// The gated activation, then the down products of its output (which a device backend may
/// have quantized with the activation).
fn check_act_then_product(b: &dyn ComputeBackend, rng: &mut StdRng) {
    for &(m, n) in &[(1usize, 1536usize), (2, 256), (3, 96)] {
        let gate = randv(rng, m * n);
        let upv = randv(rng, m * n);
        let want: Vec<f64> = gate
            .iter()
            .zip(&upv)
            .map(|(&g, &u)| act_ref(Activation::Silu, g as f64) * u as f64)
            .collect();
        let mut got = up(b, &upv);
        b.gated_activation(Activation::Silu, &up(b, &gate), &mut got)
            .expect("gated");
        let what = format!("gated SiLU [{m}x{n}] then products");
        check_products_of(b, rng, &what, &got, m);
        close(&what, &down(b, &got), &want);
    }
}

/// `argmax_rows_later`, `take_chosen` and `embed_chosen`: the choices those of `argmax_rows`
/// (a row of NaN flagged, and looked up as some row of the table), the lookup that of `embed`
/// of the chosen ids, for the last choices and for those of the step before (held in turn).
fn check_chosen(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let (rows, h) = (11, 256);
    let values = randv(rng, rows * h);
    let bytes = infer_quant::quantize(QuantFormat::Q4_K, &values, h, None).expect("quantize");
    let tables = [
        FloatTable::F32(&values),
        FloatTable::Blocks {
            format: QuantFormat::Q4_K,
            bytes: &bytes,
        },
    ];
    let mut logits = randv(rng, 3 * rows);
    logits[rows + 4] = 7.0;
    for v in &mut logits[2 * rows..] {
        *v = f32::NAN;
    }
    let first = up(b, &logits);
    let second = up(b, &randv(rng, 2 * rows));
    let mut want_first = Vec::new();
    b.argmax_rows(&first, rows, &mut want_first)
        .expect("argmax_rows");
    let mut want_second = Vec::new();
    b.argmax_rows(&second, rows, &mut want_second)
        .expect("argmax_rows");
    let (mut c1, mut c2) = (Chosen::default(), Chosen::default());
    let mut got = Vec::new();
    for table in tables {
        b.argmax_rows_later(&first, rows, &mut c1)
            .expect("argmax_rows_later");
        assert_eq!(c1.rows, 3, "argmax_rows_later: rows");
        let mut out = Tensor::default();
        b.embed_chosen(table, h, &c1, 2.5, &mut out)
            .expect("embed_chosen");
        let via_chosen = down(b, &out);
        let ids: Vec<u32> = want_first.iter().map(|a| a.token).collect();
        b.embed(table, h, &ids[..2], 2.5, &mut out).expect("embed");
        assert_eq!(
            via_chosen[..2 * h],
            down(b, &out)[..],
            "embed_chosen of the last choices: the rows of the chosen ids"
        );
        b.take_chosen(&c1, &mut got).expect("take_chosen");
        assert_eq!(got, want_first, "take_chosen: the choices of argmax_rows");
        // A second step's choices; the first ones are still held and looked up.
        b.argmax_rows_later(&second, rows, &mut c2)
            .expect("argmax_rows_later");
        b.embed_chosen(table, h, &c1, 2.5, &mut out)
            .expect("embed_chosen of the step before");
        assert_eq!(
            down(b, &out)[..2 * h],
            via_chosen[..2 * h],
            "embed_chosen of the step before"
        );
        b.take_chosen(&c2, &mut got).expect("take_chosen");
        assert_eq!(got, want_second, "take_chosen of the second step");
        b.take_chosen(&c1, &mut got).expect("take_chosen");
        assert_eq!(got, want_first, "take_chosen of the step before");
    }
}

/// `argmax_rows`: per row the largest finite logit, ties to the smaller id, non-finite rows
/// flagged.
fn check_argmax_rows(b: &dyn ComputeBackend, rng: &mut StdRng) {
    let width = 5003;
    let mut logits = randv(rng, 3 * width);
    logits[100] = 9.0;
    logits[4000] = 9.0;
    logits[width + 7] = 5.0;
    logits[width + 8] = f32::NAN;
    logits[2 * width + 5002] = 3.0;
    logits[2 * width] = f32::NEG_INFINITY;
    let t = up(b, &logits);
    let mut got = Vec::new();
    b.argmax_rows(&t, width, &mut got).expect("argmax_rows");
    let got: Vec<(u32, bool)> = got.iter().map(|a| (a.token, a.all_finite)).collect();
    assert_eq!(
        got,
        vec![(100, true), (7, false), (5002, false)],
        "argmax_rows: ties to the smaller id, non-finite values flagged"
    );
    assert!(
        b.argmax_rows(&t, width + 1, &mut Vec::new()).is_err(),
        "argmax_rows: not whole rows is an error"
    );
}

/// One [`KvSlot`] per sequence of `seqs` (`(start, rows)`: its cache's length before the batch
/// and its rows, laid end to end in the batch) over the matching pair of `caches`.
pub fn kv_slots<'a>(
    caches: &'a mut [(Tensor, Tensor)],
    seqs: &[(usize, usize)],
) -> Vec<KvSlot<'a>> {
    let mut row0 = 0;
    caches
        .iter_mut()
        .zip(seqs)
        .map(|((kc, vc), &(start, n))| {
            row0 += n;
            KvSlot {
                k_cache: kc,
                v_cache: vc,
                row0: row0 - n,
                rows: n,
                start,
            }
        })
        .collect()
}
