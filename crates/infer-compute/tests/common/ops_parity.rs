//! Per-operation parity of a [`ComputeBackend`]'s whole operations (norms, RoPE, attention,
//! activations, residual, embedding lookup, argmax) with scalar references written here (plain
//! loops in f64, independent of the crate's own kernels), on random shapes: odd widths, GQA
//! ratios 1/2/4/8 and MQA, sliding windows at and around the window edge, soft-caps, rows of
//! several sequences at scattered positions. Like ggml's `test-backend-ops`: one checker, run
//! for every backend (the CPU backend in CI, the CUDA backend by `scripts/gpu-check.sh`).

use half::f16;
use infer_compute::ops::Activation;
use infer_compute::{
    AttentionInput, AttentionParams, ComputeBackend, FloatTable, Norm, NormKind, QuantFormat,
    RopeConfig, RopeScaling,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Relative tolerance of every comparison: |got − want| ≤ TOL · (1 + |want|) (f32 arithmetic
/// against f64 references; the fast activations are within 1e-5 of the exact ones).
const TOL: f64 = 2e-5;

fn randv(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect()
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
            let mut out = vec![f32::NAN; x.len()];
            b.norm(&n, &x, &mut out).expect("norm");
            close(&format!("norm {kind:?} [{rows}x{d}]"), &out, &want);
            let mut inplace = x.clone();
            b.norm_inplace(&n, &mut inplace).expect("norm_inplace");
            close(
                &format!("norm_inplace {kind:?} [{rows}x{d}]"),
                &inplace,
                &want,
            );
        }
        let n = Norm {
            kind: NormKind::Rms { offset: 0.0 },
            weight: &w,
            bias: None,
            eps: 1e-6,
        };
        let mut short = vec![0.0; x.len() + 1];
        assert!(
            b.norm(&n, &x, &mut short).is_err(),
            "norm: a wrong output length is an error"
        );
    }
}

fn check_rope(b: &dyn ComputeBackend, rng: &mut StdRng) {
    for &(heads, head_dim, rotary_dim, interleaved) in &[
        (1, 2, 2, false),
        (3, 64, 64, false),
        (2, 44, 28, false),
        (4, 16, 16, true),
    ] {
        let positions = [0usize, 5, 6, 17, 3, 1000];
        let cfg = RopeConfig {
            head_dim,
            rotary_dim,
            base: 10000.0,
            scaling: RopeScaling::None,
            interleaved,
        };
        let x = randv(rng, positions.len() * heads * head_dim);
        let inv: Vec<f64> = (0..rotary_dim / 2)
            .map(|i| 1.0 / 10000f64.powf(2.0 * i as f64 / rotary_dim as f64))
            .collect();
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
                    let (xa, xc) = (x[a] as f64, x[c] as f64);
                    want[a] = xa * co - xc * s;
                    want[c] = xc * co + xa * s;
                }
            }
        }
        let mut got = x.clone();
        b.rope(&mut got, heads, &positions, &cfg).expect("rope");
        let what = format!("rope heads {heads} head_dim {head_dim} rotary {rotary_dim}");
        // sin/cos of large angles in f32 tables: absolute error grows with the position.
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{what}: element {i}: got {g}, want {w}"
            );
        }
        assert!(
            b.rope(&mut got[1..], heads, &positions, &cfg).is_err(),
            "{what}: a wrong length is an error"
        );
    }
}

/// Scalar causal attention (HF eager): per row and head, softmax over visible keys.
fn ref_attention(a: &AttentionInput<'_>, p: &AttentionParams) -> Vec<f64> {
    let (hd, nq, nkv) = (p.head_dim, p.n_q_heads, p.n_kv_heads);
    let group = nq / nkv;
    let mut out = vec![0.0; a.q.len()];
    for (r, &pos) in a.positions.iter().enumerate() {
        for h in 0..nq {
            let g = h / group;
            let q = &a.q[(r * nq + h) * hd..(r * nq + h + 1) * hd];
            let visible: Vec<usize> = (0..=pos)
                .filter(|&j| p.sliding_window.is_none_or(|w| pos - j < w))
                .collect();
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let k = &a.k_cache[(j * nkv + g) * hd..(j * nkv + g + 1) * hd];
                    let s = p.scale as f64
                        * q.iter()
                            .zip(k)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum::<f64>();
                    match p.softcap {
                        Some(c) => c as f64 * (s / c as f64).tanh(),
                        None => s,
                    }
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(r * nq + h) * hd..(r * nq + h + 1) * hd];
            for (&j, w) in visible.iter().zip(&e) {
                let v = &a.v_cache[(j * nkv + g) * hd..(j * nkv + g + 1) * hd];
                for (oi, &vi) in o.iter_mut().zip(v) {
                    *oi += w / z * vi as f64;
                }
            }
        }
    }
    out
}

/// (q heads, kv heads, head_dim, window, soft-cap, t_kv, query positions).
type AttnCase = (
    usize,
    usize,
    usize,
    Option<usize>,
    Option<f32>,
    usize,
    Vec<usize>,
);

fn check_attention(b: &dyn ComputeBackend, rng: &mut StdRng) {
    // (q heads, kv heads, head_dim, window, soft-cap, t_kv, query positions)
    let cases: &[AttnCase] = &[
        (1, 1, 8, None, None, 1, vec![0]),
        (4, 4, 16, None, None, 9, vec![8]),
        (8, 2, 64, None, None, 40, (30..40).collect()),
        (6, 1, 32, Some(4), None, 12, (0..12).collect()),
        (4, 2, 44, Some(5), Some(50.0), 33, vec![4, 5, 6, 32]),
        (8, 1, 128, Some(1), None, 7, vec![6]),
        (16, 2, 64, None, Some(20.0), 300, vec![299]),
    ];
    for (nq, nkv, hd, window, softcap, t_kv, positions) in cases {
        let p = AttentionParams {
            n_q_heads: *nq,
            n_kv_heads: *nkv,
            head_dim: *hd,
            scale: 1.0 / (*hd as f32).sqrt(),
            sliding_window: *window,
            softcap: *softcap,
        };
        let q = randv(rng, positions.len() * nq * hd);
        let k = randv(rng, t_kv * nkv * hd);
        let v = randv(rng, t_kv * nkv * hd);
        let a = AttentionInput {
            q: &q,
            k_cache: &k,
            v_cache: &v,
            positions,
            t_kv: *t_kv,
        };
        let want = ref_attention(&a, &p);
        let mut out = vec![f32::NAN; q.len()];
        b.attention(&a, &p, &mut out).expect("attention");
        close(
            &format!("attention {nq}q/{nkv}kv×{hd} window {window:?} cap {softcap:?} t_kv {t_kv}"),
            &out,
            &want,
        );
        let late = AttentionInput {
            positions: &[*t_kv],
            q: &q[..nq * hd],
            ..a
        };
        assert!(
            b.attention(&late, &p, &mut out[..nq * hd]).is_err(),
            "attention: a query position past t_kv is an error"
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
            let mut got = up.clone();
            b.gated_activation(act, &gate, &mut got).expect("gated");
            close(&format!("gated {act:?} n {n}"), &got, &want);
            let want: Vec<f64> = gate.iter().map(|&g| act_ref(act, g as f64)).collect();
            let mut got = gate.clone();
            b.activation(act, &mut got).expect("activation");
            close(&format!("activation {act:?} n {n}"), &got, &want);
        }
        let mut x = up.clone();
        b.add_scaled(&mut x, &gate, 0.5).expect("add_scaled");
        let want: Vec<f64> = up
            .iter()
            .zip(&gate)
            .map(|(&a, &c)| a as f64 + 0.5 * c as f64)
            .collect();
        close(&format!("add_scaled n {n}"), &x, &want);
        assert!(b.add_scaled(&mut x, &gate[1..], 1.0).is_err() || n == 1);
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
        let mut out = vec![f32::NAN; ids.len() * h];
        b.embed(t, &ids, 2.5, &mut out).expect("embed");
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| (0..h).map(move |c| i as usize * h + c))
            .map(|k| match t {
                FloatTable::F32(v) => v[k] as f64 * 2.5,
                FloatTable::F16(v) => v[k].to_f64() * 2.5,
                FloatTable::Blocks { .. } => unreachable!("float tables only here"),
            })
            .collect();
        close(&format!("embed {name}"), &out, &want);
        assert!(
            b.embed(t, &[rows as u32], 1.0, &mut out[..h]).is_err(),
            "embed: an id past the table is an error"
        );
    }
    // A quantized table (ggml blocks; a vindex without a float tier): each looked-up row is
    // the ggml dequantization of its blocks, times the scale.
    let (rows, h) = (9, 256);
    let values = randv(rng, rows * h);
    for format in [QuantFormat::Q4_K, QuantFormat::Q6_K, QuantFormat::Q8_0] {
        let bytes = infer_quant::quantize(format, &values, h, None).expect("quantize");
        let deq = infer_quant::dequantize_to_vec(format, &bytes, rows * h).expect("dequantize");
        let t = FloatTable::Blocks {
            format,
            bytes: &bytes,
        };
        let ids = [8u32, 0, 3, 3];
        let mut out = vec![f32::NAN; ids.len() * h];
        b.embed(t, &ids, 2.5, &mut out).expect("embed blocks");
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| (0..h).map(move |c| i as usize * h + c))
            .map(|k| deq[k] as f64 * 2.5)
            .collect();
        close(&format!("embed {format}"), &out, &want);
        assert!(
            b.embed(t, &[rows as u32], 1.0, &mut out[..h]).is_err(),
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
    check_elementwise(b, &mut rng);
    check_embed_argmax(b, &mut rng);
}
