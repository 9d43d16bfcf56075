//! Norms, activations, erf and softmax against f64 references and known values.

use infer_compute::ops::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(rng: &mut StdRng, n: usize, r: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-r..r)).collect()
}

fn assert_close(got: f32, want: f64, rel: f64, what: &str) {
    let err = (got as f64 - want).abs();
    assert!(
        err <= rel * want.abs().max(1e-30),
        "{what}: got {got}, want {want}, rel err {:e}",
        err / want.abs()
    );
}

#[test]
fn rms_norm_matches_f64_reference() {
    let mut rng = StdRng::seed_from_u64(1);
    let d = 67;
    let x = random(&mut rng, 3 * d, 3.0);
    let w = random(&mut rng, d, 1.0);
    for offset in [0.0f32, 1.0] {
        let mut out = vec![f32::NAN; x.len()];
        rms_norm(&x, &w, 1e-6, offset, &mut out);
        let mut inplace = x.clone();
        rms_norm_inplace(&mut inplace, &w, 1e-6, offset);
        assert_eq!(out, inplace);
        for r in 0..3 {
            let row = &x[r * d..(r + 1) * d];
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            for i in 0..d {
                let want = row[i] as f64 * inv * (w[i] as f64 + offset as f64);
                let err = (out[r * d + i] as f64 - want).abs();
                assert!(
                    err <= 1e-6 * want.abs() + 1e-7,
                    "rms_norm offset {offset} [{r},{i}]: {} vs {want}",
                    out[r * d + i]
                );
            }
        }
    }
}

#[test]
fn layer_norm_matches_f64_reference() {
    let mut rng = StdRng::seed_from_u64(2);
    let d = 45;
    let x: Vec<f32> = random(&mut rng, 2 * d, 2.0)
        .iter()
        .map(|v| v + 5.0)
        .collect();
    let w = random(&mut rng, d, 1.0);
    let b = random(&mut rng, d, 0.5);
    for bias in [None, Some(&b[..])] {
        let mut out = vec![f32::NAN; x.len()];
        layer_norm(&x, &w, bias, 1e-5, &mut out);
        for r in 0..2 {
            let row = &x[r * d..(r + 1) * d];
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                let bi = bias.map_or(0.0, |b| b[i] as f64);
                let want = (row[i] as f64 - mean) / (var + 1e-5).sqrt() * w[i] as f64 + bi;
                let err = (out[r * d + i] as f64 - want).abs();
                assert!(
                    err <= 1e-6 * want.abs() + 1e-6,
                    "layer_norm [{r},{i}]: {} vs {want}",
                    out[r * d + i]
                );
            }
        }
    }
}

#[test]
fn activations_match_known_values() {
    // Values from Python's math module (erf-based GELU) and the tanh formula in f64.
    assert_close(gelu(1.0), 0.8413447460685429, 1e-7, "gelu(1)");
    assert_close(gelu_tanh(1.0), 0.8411919906082768, 1e-7, "gelu_tanh(1)");
    assert_close(gelu(-5.0), -1.4332578593959731e-06, 1e-6, "gelu(-5)");
    assert_close(silu(1.0), 0.7310585786300049, 1e-7, "silu(1)");
    assert_close(silu(-2.0), -0.2384058440442351, 1e-7, "silu(-2)");
    assert_eq!(gelu(0.0), 0.0);
    assert_eq!(Activation::GeluTanh.apply(1.0), gelu_tanh(1.0));
    let mut g = vec![1.0f32, -2.0];
    Activation::Silu.gated_inplace(&mut g, &[2.0, 3.0]);
    assert_eq!(g, vec![silu(1.0) * 2.0, silu(-2.0) * 3.0]);
}

#[test]
fn erf_matches_known_values() {
    // (z, erf or erfc, which) from Python's math.erf / math.erfc.
    let cases = [
        (0.5, 0.5204998778130465, false),
        (1.0 / std::f64::consts::SQRT_2, 0.6826894921370859, false),
        (2.9, 0.9999589021219005, false),
        (1e-3, 0.0011283787909692365, false),
        (3.5, 7.430983723414128e-07, true),
        (6.0, 2.1519736712498916e-17, true),
    ];
    for (z, want, is_erfc) in cases {
        let got = if is_erfc { erfc(z) } else { erf(z) };
        assert!(
            ((got - want) / want).abs() < 1e-13,
            "erf{}({z}) = {got}, want {want}",
            if is_erfc { "c" } else { "" }
        );
    }
    assert_eq!(erf(-0.5), -erf(0.5));
    assert_eq!(erf(0.0), 0.0);
    // Continuity at the series / continued-fraction boundary.
    let (below, at) = (erfc(3.0 - 1e-12), erfc(3.0));
    assert!(
        ((below - at) / at).abs() < 1e-10,
        "erfc jumps at 3: {below} vs {at}"
    );
    assert!(
        ((at - 2.209049699858544e-05) / at).abs() < 1e-12,
        "erfc(3) = {at}"
    );
}

#[test]
fn softmax_and_softcap() {
    let mut x = vec![1000.0f32, 1001.0, 999.0, f32::NEG_INFINITY];
    softmax_inplace(&mut x);
    let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
    let s: f64 = e.iter().sum();
    for i in 0..3 {
        assert_close(x[i], e[i] / s, 1e-6, "softmax");
    }
    assert_eq!(x[3], 0.0);
    assert_close(softcap(100.0, 50.0), 50.0 * 2f64.tanh(), 1e-6, "softcap");
    let mut v = vec![1.0f32, 2.0];
    add_inplace(&mut v, &[0.5, -1.0]);
    scale_inplace(&mut v, 2.0);
    assert_eq!(v, vec![3.0, 2.0]);
}

/// gpt-oss's clamped SwiGLU (HF `GptOssExperts`, limit 7, alpha 1.702) against the formula in
/// f64: gate clamped above at the limit, up to ±limit, `(up + 1) · gate · σ(alpha · gate)`;
/// worked values where each clamp bites, then random pairs within 1e-6 relative.
#[test]
fn clamped_swiglu_matches_hf_formula() {
    let reference = |g: f32, u: f32| -> f64 {
        let g = (g as f64).min(7.0);
        let u = (u as f64).clamp(-7.0, 7.0);
        (u + 1.0) * g / (1.0 + (-1.702 * g).exp())
    };
    // gate 9 → 7 (σ(11.914) ≈ 1), up 9 → 7: ≈ 8 · 7 = 56; up −9 → −7: ≈ −42.
    assert_close(
        clamped_swiglu(9.0, 9.0, 7.0, 1.702),
        55.99962502642654,
        1e-6,
        "both clamped",
    );
    assert_close(
        clamped_swiglu(9.0, -9.0, 7.0, 1.702),
        -41.99971876981991,
        1e-6,
        "up clamped below",
    );
    // Negative gates are not clamped below: gate −9, up 0 → −9·σ(−15.318) ≈ −2.0e-6.
    assert_close(
        clamped_swiglu(-9.0, 0.0, 7.0, 1.702),
        reference(-9.0, 0.0),
        1e-6,
        "gate < 0",
    );
    assert_eq!(clamped_swiglu(0.0, 3.0, 7.0, 1.702), 0.0);
    let mut rng = StdRng::seed_from_u64(5);
    for (g, u) in random(&mut rng, 500, 12.0)
        .into_iter()
        .zip(random(&mut rng, 500, 12.0))
    {
        assert_close(
            clamped_swiglu(g, u, 7.0, 1.702),
            reference(g, u),
            1e-6,
            "random",
        );
    }
}
