//! Fused dot products and activation quantizers against ggml's vectors
//! (`shared/vectors/quant/vecdot.safetensors`, n = 4096, 16 rows per pair; see its README,
//! "dot-product" section).
//!
//! - Scalar kernels ([`Isa::Generic`]) mirror ggml's `*_generic` order without FMA: they must
//!   equal `<p>.result_generic` bit for bit.
//! - SIMD kernels and `quant_matvec`: `|got − result_exact| ≤ 1e-6 · abs_sum_f64` per row (the
//!   README's tolerance, > 10× the worst deviation of either ggml kernel).

mod common;

use infer_compute::vec_dot::{self, Isa};
use infer_compute::{ComputeBackend, CpuBackend, QuantFormat};

const N: usize = 4096;
const ROWS: usize = 16;

struct Pair {
    prefix: &'static str,
    weights: QuantFormat,
    act_tensor: &'static str,
}

const PAIRS: [Pair; 4] = [
    Pair {
        prefix: "q4_k",
        weights: QuantFormat::Q4_K,
        act_tensor: "act_q8k_blocks",
    },
    Pair {
        prefix: "q6_k",
        weights: QuantFormat::Q6_K,
        act_tensor: "act_q8k_blocks",
    },
    Pair {
        prefix: "q4_0",
        weights: QuantFormat::Q4_0,
        act_tensor: "act_q80_blocks",
    },
    Pair {
        prefix: "q8_0",
        weights: QuantFormat::Q8_0,
        act_tensor: "act_q80_blocks",
    },
];

struct Loaded {
    w: Vec<u8>,
    w_row: usize,
    a: Vec<u8>,
    a_row: usize,
    generic: Vec<f32>,
    exact: Vec<f64>,
    abs_sum: Vec<f64>,
}

fn load(t: &common::Tensors, p: &Pair) -> Loaded {
    let (w, ws) = t.raw(&format!("{}.weight_blocks", p.prefix));
    let (a, as_) = t.raw(&format!("{}.{}", p.prefix, p.act_tensor));
    assert_eq!((ws[0], as_[0]), (ROWS, ROWS), "{}: row counts", p.prefix);
    assert_eq!(
        ws[1],
        p.weights.bytes_for(N).unwrap(),
        "{}: weight row",
        p.prefix
    );
    let (generic, _) = t.f32s(&format!("{}.result_generic", p.prefix));
    Loaded {
        w,
        w_row: ws[1],
        a,
        a_row: as_[1],
        generic,
        exact: t.f64s(&format!("{}.result_exact", p.prefix)),
        abs_sum: t.f64s(&format!("{}.abs_sum_f64", p.prefix)),
    }
}

#[test]
fn generic_kernels_match_ggml_generic_bit_for_bit() {
    let t = common::load("vectors/quant/vecdot.safetensors");
    for p in &PAIRS {
        let l = load(&t, p);
        let k = vec_dot::kernel(p.weights, Isa::Generic).expect("generic kernel");
        for r in 0..ROWS {
            let got = k(
                N,
                &l.w[r * l.w_row..][..l.w_row],
                &l.a[r * l.a_row..][..l.a_row],
            );
            assert_eq!(
                got.to_bits(),
                l.generic[r].to_bits(),
                "{} row {r}: got {got:e}, ggml generic {:e}",
                p.prefix,
                l.generic[r]
            );
        }
    }
}

#[test]
fn best_kernels_within_tolerance_of_exact() {
    let t = common::load("vectors/quant/vecdot.safetensors");
    for isa in [Isa::Generic, Isa::best()] {
        for p in &PAIRS {
            let l = load(&t, p);
            let k = vec_dot::kernel(p.weights, isa).expect("kernel");
            let mut worst = 0f64;
            for r in 0..ROWS {
                let got = k(
                    N,
                    &l.w[r * l.w_row..][..l.w_row],
                    &l.a[r * l.a_row..][..l.a_row],
                ) as f64;
                let rel = (got - l.exact[r]).abs() / l.abs_sum[r];
                worst = worst.max(rel);
                assert!(
                    rel <= 1e-6,
                    "{isa:?} {} row {r}: got {got:e}, exact {:e}, err/abs_sum {rel:e}",
                    p.prefix,
                    l.exact[r]
                );
            }
            eprintln!(
                "{isa:?} {}: max |got − exact| / abs_sum = {worst:.2e}",
                p.prefix
            );
        }
    }
}

#[test]
fn activation_quantizers_reproduce_ggml_blocks() {
    let t = common::load("vectors/quant/vecdot.safetensors");
    let (act, shape) = t.f32s("act_input");
    assert_eq!(shape, vec![ROWS, N]);
    for (name, fmt) in [
        ("q4_k.act_q8k_blocks", QuantFormat::Q8_K),
        ("q6_k.act_q8k_blocks", QuantFormat::Q8_K),
        ("q4_0.act_q80_blocks", QuantFormat::Q8_0),
        ("q8_0.act_q80_blocks", QuantFormat::Q8_0),
    ] {
        let (want, ws) = t.raw(name);
        let row = ws[1];
        let mut got = vec![0u8; row];
        for r in 0..ROWS {
            vec_dot::quantize_activations(fmt, &act[r * N..(r + 1) * N], &mut got).unwrap();
            assert!(
                got == want[r * row..(r + 1) * row],
                "{name} row {r}: quantized activations differ from ggml's"
            );
        }
    }
}

/// The whole mat-vec (activation quantization + kernel + row split) on ggml's weight rows: the
/// 16 rows of each pair form one matrix; each activation row gives one column of results.
#[test]
fn quant_matvec_matches_exact_results() {
    let t = common::load("vectors/quant/vecdot.safetensors");
    let (act, _) = t.f32s("act_input");
    for be in [
        CpuBackend::new(),
        CpuBackend::with_isa(Isa::Generic).unwrap(),
    ] {
        for p in &PAIRS {
            let l = load(&t, p);
            for r in 0..ROWS {
                let mut y = vec![f32::NAN; ROWS];
                be.linear(
                    &infer_compute::Matrix::blocks(p.weights, &l.w, ROWS, N),
                    &act[r * N..(r + 1) * N],
                    1,
                    &mut y,
                )
                .unwrap();
                // Pair r of the file is weight row r × activation row r.
                let got = y[r] as f64;
                let rel = (got - l.exact[r]).abs() / l.abs_sum[r];
                assert!(
                    rel <= 1e-6,
                    "{:?} {} row {r}: got {got:e}, exact {:e}, err/abs_sum {rel:e}",
                    be.isa(),
                    p.prefix,
                    l.exact[r]
                );
            }
        }
    }
}
