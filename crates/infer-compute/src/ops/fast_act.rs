//! Vectorisable f32 activations for the quantized FFN path: SiLU and tanh-GELU through a
//! polynomial `exp` (Cephes `expf`: `2ⁿ · p(r)`, |r| ≤ ln2/2, degree-5 minimax + 1, max relative
//! error ≈ 2 ulp), written as straight-line f32 code that LLVM vectorises (AVX2 + FMA when the
//! CPU has it, selected at run time). The exact f64 versions ([`super::silu`],
//! [`super::gelu_tanh`]) stay the reference; these agree with them to ≤ 4e-7 relative (SiLU) and
//! ≤ 1e-5 (tanh-GELU), checked over a dense grid in the tests.

use super::Activation;

/// `e^x` for |x| ≤ 88 (clamped outside), Cephes `expf` (`2ⁿ · p(r)`, |r| ≤ ln2/2, max relative
/// error ≈ 2 ulp), with 2ⁿ built from the bits of the rounding sum so that loops over it
/// vectorise. Shared by the activations and the prefill attention's softmax.
#[inline(always)]
pub(crate) fn exp_poly(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4; // ln2 high part (exact in few bits)
    const C2: f32 = -2.121_944_4e-4; // ln2 − C1
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³: adding rounds to an integer (nearest even)
    let x = x.clamp(-88.0, 88.0);
    let t = x * LOG2E + MAGIC; // bits: MAGIC's + n, n = round(x·log2 e) ∈ [−127, 127]
    let n = t - MAGIC;
    let r = x - n * C1 - n * C2;
    let r2 = r * r;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5e-1;
    let e = p * r2 + r + 1.0;
    // 2ⁿ for n in [−127, 127] from the exponent bits n + 127 (n = −127 gives 0, only reached at
    // x = −88), taken from `t`'s low bits: no float→int conversion, so the loop vectorises.
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(MAGIC.to_bits() - 127) << 23);
    e * pow2
}

/// `x·σ(x)`.
#[inline(always)]
fn silu_f(x: f32) -> f32 {
    x / (1.0 + exp_poly(-x))
}

/// `0.5·x·(1 + tanh(u))` with `u = √(2/π)(x + 0.044715x³)`, as `x / (1 + e^(−2u))`.
#[inline(always)]
fn gelu_tanh_f(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // √(2/π)
    let u = C * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp_poly(-2.0 * u))
}

#[inline(always)]
fn gated_generic(act: Activation, gate: &[f32], up: &mut [f32]) {
    match act {
        Activation::Silu => up.iter_mut().zip(gate).for_each(|(u, &g)| *u *= silu_f(g)),
        Activation::GeluTanh => up
            .iter_mut()
            .zip(gate)
            .for_each(|(u, &g)| *u *= gelu_tanh_f(g)),
        Activation::Gelu => up
            .iter_mut()
            .zip(gate)
            .for_each(|(u, &g)| *u *= super::gelu(g)),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2(act: Activation, gate: &[f32], up: &mut [f32]) {
    gated_generic(act, gate, up)
}

/// Gated FFN combination in place, fast: `up[i] = act(gate[i]) · up[i]` with the polynomial
/// `exp` above for [`Activation::Silu`] and [`Activation::GeluTanh`] (exact erf GELU for
/// [`Activation::Gelu`]). Relative difference from `act.apply(gate[i]) · up[i]`: ≤ 4e-7 for SiLU,
/// ≤ 1e-5 for tanh-GELU (its f32 argument `u` is rounded; the value is then below 1e-6
/// absolute), plus one rounding. Panics if the lengths differ.
pub fn gated_mul_fast(act: Activation, gate: &[f32], up: &mut [f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "gated_mul_fast: gate/up length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were just detected.
        unsafe { gated_avx2(act, gate, up) };
        return;
    }
    gated_generic(act, gate, up)
}

/// In place `x[i] = act(x[i])` (non-gated FFN), fast as [`gated_mul_fast`].
pub fn act_fast_inplace(act: Activation, x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = match act {
            Activation::Silu => silu_f(*v),
            Activation::GeluTanh => gelu_tanh_f(*v),
            Activation::Gelu => super::gelu(*v),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_activations_match_exact_ones() {
        let xs: Vec<f32> = (-200_000..=200_000).map(|i| i as f32 * 1e-4).collect();
        for act in [Activation::Silu, Activation::GeluTanh, Activation::Gelu] {
            let ones = vec![1.0f32; xs.len()];
            let mut got = ones.clone();
            gated_mul_fast(act, &xs, &mut got);
            let mut worst = 0f64;
            for (&x, &g) in xs.iter().zip(&got) {
                let want = act.apply(x) as f64;
                // Relative, with an absolute floor where the value underflows towards 0.
                let err = (g as f64 - want).abs() / want.abs().max(1e-30);
                let abs_err = (g as f64 - want).abs();
                if abs_err > 1e-30 {
                    worst = worst.max(err);
                }
                // tanh-GELU: u = √(2/π)(x + 0.044715x³) is itself rounded in f32, so e^(−2u)
                // carries ≈ |2u|·2⁻²⁴ relative error (≤ 1e-5 where |2u| ≤ 88).
                let tol = if act == Activation::GeluTanh {
                    1e-5
                } else {
                    4e-7
                };
                assert!(
                    err <= tol || abs_err <= 1e-12,
                    "{act:?}({x}): fast {g}, exact {want}, rel {err:e}"
                );
            }
            eprintln!("{act:?}: max rel err {worst:.2e}");
            let mut g2 = xs.clone();
            act_fast_inplace(act, &mut g2);
            assert_eq!(g2, got, "{act:?}: act_fast_inplace vs gated_mul_fast");
        }
        // Extremes: no NaN; saturation as the exact functions (e^x is clamped at x = −88, so
        // the negative side gives |y| < 1e-30 instead of an exact 0).
        let mut e = vec![1.0f32; 4];
        gated_mul_fast(Activation::Silu, &[-1e4, 1e4, -100.0, 100.0], &mut e);
        assert!(e[0].abs() < 1e-30 && e[2].abs() < 1e-30, "{e:?}");
        assert_eq!((e[1], e[3]), (1e4, 100.0));
    }
}
