//! RoPE frequencies (HF formulas worked by hand) and rotations.

use infer_compute::{apply_rope, Rope, RopeConfig, RopeScaling};

fn cfg(
    head_dim: usize,
    rotary_dim: usize,
    base: f64,
    scaling: RopeScaling,
    interleaved: bool,
) -> RopeConfig {
    RopeConfig {
        head_dim,
        rotary_dim,
        base,
        scaling,
        interleaved,
    }
}

fn llama3(orig: usize) -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: orig,
    }
}

fn assert_rel(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(((g - w) / w).abs() < 1e-12, "inv_freq[{i}] = {g}, want {w}");
    }
}

#[test]
fn default_and_linear_inv_freq() {
    let c = cfg(8, 8, 10000.0, RopeScaling::None, false);
    assert_rel(&c.inv_freq(), &[1.0, 0.1, 0.01, 0.001]);
    let c = cfg(8, 8, 10000.0, RopeScaling::Linear { factor: 4.0 }, false);
    assert_rel(&c.inv_freq(), &[0.25, 0.025, 0.0025, 0.00025]);
    // Partial rotary: HF's dim is the rotary dim, not head_dim.
    let c = cfg(16, 4, 10000.0, RopeScaling::None, false);
    assert_rel(&c.inv_freq(), &[1.0, 0.01]);
}

#[test]
fn llama3_inv_freq_matches_hf_formula() {
    // head_dim 16, theta 5e5 (the archrefs/llama3-rope config). Default inv_freq_i = 5e5^(-2i/16),
    // wavelengths 2π/inv_freq = 6.28, 32.4, 167, ... Values from HF's `_compute_llama3_parameters`
    // evaluated in Python float64.
    let base = 5e5;
    // original_max_position_embeddings 16: low band edge 16, high edge 4. i=0 (λ=6.28) is in the
    // medium band: s = (16/λ − 1)/3, (1−s)·f/8 + s·f; the rest (λ > 16) are divided by 8.
    let f0 = 1.0f64;
    let s = (16.0 / (2.0 * std::f64::consts::PI) - 1.0) / 3.0;
    let want0 = (1.0 - s) * f0 / 8.0 + s * f0;
    let got = cfg(16, 16, base, llama3(16), false).inv_freq();
    assert!((got[0] - want0).abs() < 1e-15);
    assert_rel(
        &got,
        &[
            0.5760564010955116,
            0.02424034309358572,
            0.004700753866357992,
            0.0009115830921521386,
            0.00017677669529663688,
            3.428102195952591e-05,
            6.647869871181236e-06,
            1.2891731721515574e-06,
        ],
    );
    // original 64: edges 64 and 16, so i=0 is unchanged, i=1 (λ=32.4) smoothed, the rest / 8.
    let got = cfg(16, 16, base, llama3(64), false).inv_freq();
    assert_eq!(got[0], 1.0);
    assert_rel(&got[1..3], &[0.0794030091792082, 0.004700753866357992]);
}

/// YaRN as gpt-oss configures it (head_dim 16, theta 1.5e5, factor 32, beta_fast 32, beta_slow 1,
/// original context 4096), `truncate` false and true. Values from HF's
/// `_compute_yarn_parameters` (transformers 5) transcribed to Python float64: correction range
/// 2.0232..4.3495 (truncated: 2..5), dims below it kept, above it divided by 32.
#[test]
fn yarn_inv_freq_matches_hf_formula() {
    let yarn = |truncate| RopeScaling::Yarn {
        factor: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max_position_embeddings: 4096,
        attention_factor: 0.1 * 32f64.ln() + 1.0,
        truncate,
    };
    let got = cfg(16, 16, 150_000.0, yarn(false), false).inv_freq();
    assert_rel(
        &got,
        &[
            1.0,
            0.2254180002028708,
            0.050813274815461475,
            0.006794959489732219,
            0.00045648391922324086,
            1.818833668168956e-05,
            4.0999784818029795e-06,
            9.242089502428301e-07,
        ],
    );
    let got = cfg(16, 16, 150_000.0, yarn(true), false).inv_freq();
    assert_rel(&got[3..5], &[0.0077554660575303615, 0.0009144544011878624]);
    // cos/sin carry the attention factor: position 0 scales every rotated value by it.
    let c = cfg(16, 16, 150_000.0, yarn(false), false);
    assert!((c.attention_factor() - 1.3465735902799727).abs() < 1e-15);
    let mut x: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
    apply_rope(&mut x, 1, &[0], &c);
    for (i, v) in x.iter().enumerate() {
        let want = (i as f32 - 7.5) * 1.3465736;
        assert!((v - want).abs() < 1e-5, "dim {i}: {v} vs {want}");
    }
}

#[test]
fn position_zero_is_identity() {
    for interleaved in [false, true] {
        let c = cfg(8, 6, 10000.0, llama3(16), interleaved);
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.37 - 2.0).collect();
        let mut y = x.clone();
        apply_rope(&mut y, 2, &[0], &c);
        assert_eq!(x, y);
    }
}

#[test]
fn rotate_half_and_interleaved_known_vector() {
    // head_dim 4, base 100 → inv_freq [1, 0.1]; position 1 → angles 1 and 0.1.
    let (c1, s1, c2, s2) = (1f64.cos(), 1f64.sin(), 0.1f64.cos(), 0.1f64.sin());
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let close = |got: &[f32], want: [f64; 4]| {
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    };
    // rotate_half pairs (0,2) at angle 1 and (1,3) at angle 0.1.
    let mut y = x;
    apply_rope(&mut y, 1, &[1], &cfg(4, 4, 100.0, RopeScaling::None, false));
    close(
        &y,
        [
            1.0 * c1 - 3.0 * s1,
            2.0 * c2 - 4.0 * s2,
            3.0 * c1 + 1.0 * s1,
            4.0 * c2 + 2.0 * s2,
        ],
    );
    // GPT-J pairs (0,1) at angle 1 and (2,3) at angle 0.1.
    let mut y = x;
    apply_rope(&mut y, 1, &[1], &cfg(4, 4, 100.0, RopeScaling::None, true));
    close(
        &y,
        [
            1.0 * c1 - 2.0 * s1,
            2.0 * c1 + 1.0 * s1,
            3.0 * c2 - 4.0 * s2,
            4.0 * c2 + 3.0 * s2,
        ],
    );
    // Partial rotary: head_dim 6, rotary_dim 4 (inv_freq [1, 0.01] for base 100, dim 4... here
    // base 100 over dim 4 gives [1, 0.1]); the last 2 dims of each head pass through.
    let mut y = [
        1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 7.0, 8.0,
    ];
    apply_rope(&mut y, 2, &[1], &cfg(6, 4, 100.0, RopeScaling::None, false));
    let want = [
        1.0 * c1 - 3.0 * s1,
        2.0 * c2 - 4.0 * s2,
        3.0 * c1 + 1.0 * s1,
        4.0 * c2 + 2.0 * s2,
    ];
    close(&y[0..4], want);
    close(&y[6..10], want);
    assert_eq!(&y[4..6], &[5.0, 6.0]);
    assert_eq!(&y[10..12], &[7.0, 8.0]);
}

#[test]
fn cached_table_equals_on_the_fly_and_preserves_norm() {
    let c = cfg(64, 64, 10000.0, RopeScaling::Linear { factor: 2.0 }, false);
    let rope = Rope::new(c, 8);
    let positions = [0usize, 3, 7, 8, 500, 4095];
    let x: Vec<f32> = (0..positions.len() * 3 * 64)
        .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0)
        .collect();
    let mut a = x.clone();
    let mut b = x.clone();
    rope.apply(&mut a, 3, &positions);
    apply_rope(&mut b, 3, &positions, &c);
    assert_eq!(a, b);
    for (hx, ha) in x.chunks(64).zip(a.chunks(64)) {
        let n0: f64 = hx.iter().map(|&v| (v as f64).powi(2)).sum();
        let n1: f64 = ha.iter().map(|&v| (v as f64).powi(2)).sum();
        assert!((n0 - n1).abs() < 1e-5 * n0);
    }
}

/// `apply_rope` remembers recent positions' cos/sin per thread: repeated positions, positions
/// that share a memo slot (128 apart) and a configuration switch in between all give the bits
/// of the cached table.
#[test]
fn on_the_fly_memo_equals_the_table() {
    let c1 = cfg(64, 64, 10000.0, RopeScaling::None, false);
    let c2 = cfg(64, 32, 500000.0, RopeScaling::Linear { factor: 4.0 }, true);
    let (r1, r2) = (Rope::new(c1, 1000), Rope::new(c2, 1000));
    let positions = [5usize, 133, 5, 261, 133, 900, 5, 772];
    let x: Vec<f32> = (0..positions.len() * 2 * 64)
        .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0)
        .collect();
    for round in 0..3 {
        for (c, r) in [(&c1, &r1), (&c2, &r2)] {
            let (mut a, mut b) = (x.clone(), x.clone());
            r.apply(&mut a, 2, &positions);
            apply_rope(&mut b, 2, &positions, c);
            assert_eq!(a, b, "round {round}");
        }
    }
}
