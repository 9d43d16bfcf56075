//! Property test of the formats the quantized tiers store: for random rows (gaussian-like at
//! random scales, zeros, constants, huge outliers, f32 subnormals, subnormals mixed with normals),
//! all finite and within f16 range (|x| ≤ 65504), `dequantize(quantize(x))` is finite and each
//! value's error is within the format's bound: `|deq − x| ≤ c · amax(block) + slack`, where
//! `block` is the value's 32-value block (Q4_0, Q5_0, Q8_0) or 256-value super-block (Q4_K,
//! Q6_K) and `c` the format's worst-case step (Q8_0: 1/254 rounding plus f16 rounding of `d`;
//! Q4_0: 1/8 — the clamp at +7 of a block whose extreme is negative; Q5_0: 1/16; Q6_K, Q4_K:
//! sub-block step plus 6/8-bit scale rounding), plus an absolute slack for f16 underflow of the
//! block scale `d` (ggml stores `d` as f16; a tiny block quantizes to zeros, see [`slack`]).

use infer_quant::{dequantize_to_vec, QuantFormat};
use infer_vindex::quant_build::{quantize_rows_par, Values};
use proptest::prelude::*;

const N: usize = 512;

fn coefficient(f: QuantFormat) -> f32 {
    match f {
        QuantFormat::Q8_0 => 0.006,
        QuantFormat::Q4_0 => 0.126,
        QuantFormat::Q5_0 => 0.064,
        QuantFormat::Q6_K => 0.04,
        QuantFormat::Q4_K => 0.2,
        _ => unreachable!(),
    }
}

/// Absolute slack for f16 underflow of the block scale `d` (smallest f16 subnormal 5.96e-8):
/// about 4 × the amax below which `d` rounds to 0, i.e. 4 × 2.98e-8 × (amax / d): Q4_0 8,
/// Q5_0 16, Q8_0 127, Q4_K 15·63, Q6_K 32·128.
fn slack(f: QuantFormat) -> f32 {
    let ratio = match f {
        QuantFormat::Q8_0 => 127.0,
        QuantFormat::Q4_0 => 8.0,
        QuantFormat::Q5_0 => 16.0,
        QuantFormat::Q6_K => 32.0 * 128.0,
        QuantFormat::Q4_K => 15.0 * 63.0,
        _ => unreachable!(),
    };
    4.0 * 2.98e-8 * ratio
}

/// One row of a chosen kind.
fn row() -> impl Strategy<Value = Vec<f32>> {
    let gauss = (proptest::collection::vec(-1.0f32..1.0, N), -30i32..=12).prop_map(|(v, e)| {
        v.into_iter()
            .map(|x| x * 2f32.powi(e))
            .collect::<Vec<f32>>()
    });
    let zeros = prop_oneof![Just(vec![0.0f32; N]), Just(vec![-0.0f32; N])];
    let constant = (-60000.0f32..60000.0).prop_map(|c| vec![c; N]);
    let outlier = (
        proptest::collection::vec(-1.0f32..1.0, N),
        0..N,
        1e3f32..65504.0,
        any::<bool>(),
    )
        .prop_map(|(mut v, i, big, neg)| {
            v[i] = if neg { -big } else { big };
            v
        });
    let subnormal = proptest::collection::vec(1u32..0x007F_FFFF, N).prop_map(|bits| {
        bits.into_iter()
            .enumerate()
            .map(|(i, b)| {
                let x = f32::from_bits(b);
                if i % 3 == 0 {
                    -x
                } else {
                    x
                }
            })
            .collect::<Vec<f32>>()
    });
    let mixed = (
        proptest::collection::vec(1u32..0x007F_FFFF, N),
        proptest::collection::vec(-1e-3f32..1e-3, N / 32),
    )
        .prop_map(|(bits, normals)| {
            let mut v: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
            for (k, n) in normals.into_iter().enumerate() {
                v[k * 32 + k % 32] = n;
            }
            v
        });
    prop_oneof![gauss, zeros, constant, outlier, subnormal, mixed]
}

fn check(f: QuantFormat, x: &[f32]) -> Result<(), TestCaseError> {
    let q =
        quantize_rows_par(f, Values::F32(x), N).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let d = dequantize_to_vec(f, &q, N).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let block = if matches!(f, QuantFormat::Q4_K | QuantFormat::Q6_K) {
        256
    } else {
        32
    };
    let (c, abs) = (coefficient(f), slack(f));
    for (b, (xs, ds)) in x.chunks(block).zip(d.chunks(block)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (&xi, &di)) in xs.iter().zip(ds).enumerate() {
            prop_assert!(
                di.is_finite(),
                "{f}: non-finite {di} at block {b} elem {i} (x = {xi})"
            );
            let err = (di - xi).abs();
            prop_assert!(
                err <= c * amax + abs,
                "{f}: |{di} - {xi}| = {err} > {c} * amax {amax} + {abs} (block {b}, elem {i})"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn roundtrip_is_finite_and_bounded(x in row()) {
        for f in [
            QuantFormat::Q4_0,
            QuantFormat::Q5_0,
            QuantFormat::Q8_0,
            QuantFormat::Q4_K,
            QuantFormat::Q6_K,
        ] {
            check(f, &x)?;
        }
    }
}
