//! The tiled quantized products (tile kernels for Q4_0/Q5_0/Q8_0 and Q6_K, one weight row against
//! several activation rows) and `linear_many` (fused QKV / gate+up) against the scalar
//! reference backend, on random data of many shapes: odd activation-row counts (tiles of 4
//! plus remainders), odd weight-row counts, rows not divisible by the thread count.
//!
//! Tolerance: |simd − scalar| ≤ 2e-6 · Σ|terms| per output (both use the same integer block
//! dots; only the f32 order of the per-block accumulation differs).

use infer_compute::vec_dot::Isa;
use infer_compute::{ComputeBackend, CpuBackend, Matrix, Proj, QuantFormat};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn gauss(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * std)
        .collect()
}

/// Σ|w·x| per output `[m, rows]` from the dequantized weights and the raw activations (a scale
/// for the tolerance).
fn abs_terms(
    fmt: QuantFormat,
    w: &[u8],
    x: &[f32],
    m: usize,
    rows: usize,
    cols: usize,
) -> Vec<f64> {
    let wf = infer_quant::dequantize_to_vec(fmt, w, rows * cols).unwrap();
    let mut s = vec![0f64; m * rows];
    for i in 0..m {
        for r in 0..rows {
            s[i * rows + r] = (0..cols)
                .map(|c| (wf[r * cols + c] as f64 * x[i * cols + c] as f64).abs())
                .sum();
        }
    }
    s
}

fn check(what: &str, got: &[f32], want: &[f32], scale: &[f64]) -> f64 {
    let mut worst = 0f64;
    for (k, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let rel = (*g as f64 - *w as f64).abs() / s.max(1e-30);
        worst = worst.max(rel);
        assert!(
            g.is_finite() && rel <= 2e-6,
            "{what} output {k}: simd {g}, scalar {w}, diff/Σ|t| {rel:e}"
        );
    }
    worst
}

#[test]
fn tiled_quant_matmul_matches_scalar_backend() {
    let scalar = CpuBackend::with_isa(Isa::Generic).unwrap();
    let best = CpuBackend::new();
    if best.isa() == Isa::Generic {
        eprintln!("no SIMD kernels on this CPU: nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(21);
    for fmt in [
        QuantFormat::Q4_0,
        QuantFormat::Q5_0,
        QuantFormat::Q8_0,
        QuantFormat::Q6_K,
    ] {
        let mut worst = 0f64;
        let all_cols: &[usize] = if fmt.block_elems() == 256 {
            &[256, 512, 1536, 2048]
        } else {
            &[32, 64, 96, 576, 640, 2048]
        };
        for &cols in all_cols {
            for (m, rows) in [
                (1usize, 1usize),
                (1, 67),
                (2, 5),
                (3, 33),
                (4, 9),
                (5, 300),
                (9, 64),
                (13, 7),
            ] {
                let w = gauss(&mut rng, rows * cols, 0.05);
                let bytes = infer_quant::quantize(fmt, &w, cols, None).unwrap();
                let x = gauss(&mut rng, m * cols, if m % 2 == 0 { 1.0 } else { 1e-3 });
                let mut want = vec![f32::NAN; m * rows];
                scalar
                    .linear(&Matrix::blocks(fmt, &bytes, rows, cols), &x, m, &mut want)
                    .unwrap();
                let mut got = vec![f32::NAN; m * rows];
                best.linear(&Matrix::blocks(fmt, &bytes, rows, cols), &x, m, &mut got)
                    .unwrap();
                let scale = abs_terms(fmt, &bytes, &x, m, rows, cols);
                let what = format!("{fmt} m={m} {rows}x{cols}");
                worst = worst.max(check(&what, &got, &want, &scale));
            }
        }
        eprintln!("{fmt}: max |tiled − scalar| / Σ|terms| = {worst:.2e}");
    }
}

#[test]
fn quant_matmul_many_equals_separate_products() {
    let mut rng = StdRng::seed_from_u64(22);
    let mut backends = vec![CpuBackend::with_isa(Isa::Generic).unwrap()];
    if Isa::best() != Isa::Generic {
        backends.push(CpuBackend::new());
    }
    // A QKV-like mix (tile, K-quant and dequantize-then-dot formats) over shared activations.
    let mixes: [&[(QuantFormat, usize)]; 3] = [
        &[
            (QuantFormat::Q5_0, 576),
            (QuantFormat::Q5_0, 192),
            (QuantFormat::Q8_0, 193),
        ],
        &[
            (QuantFormat::Q4_K, 37),
            (QuantFormat::Q6_K, 300),
            (QuantFormat::Q4_0, 11),
        ],
        &[
            (QuantFormat::Q4_1, 9),
            (QuantFormat::Q4_K, 64),
            (QuantFormat::F16, 5),
        ],
    ];
    for be in &backends {
        for mix in mixes {
            for m in [1usize, 2, 7] {
                let cols = 512;
                let ws: Vec<Vec<u8>> = mix
                    .iter()
                    .map(|&(f, rows)| {
                        infer_quant::quantize(f, &gauss(&mut rng, rows * cols, 0.05), cols, None)
                            .unwrap()
                    })
                    .collect();
                let x = gauss(&mut rng, m * cols, 1.0);
                let mut outs: Vec<Vec<f32>> = mix
                    .iter()
                    .map(|&(_, rows)| vec![f32::NAN; m * rows])
                    .collect();
                let mut projs: Vec<Proj<'_>> = mix
                    .iter()
                    .zip(&ws)
                    .zip(outs.iter_mut())
                    .map(|((&(format, rows), bytes), y)| Proj {
                        w: Matrix::blocks(format, bytes, rows, cols),
                        y,
                    })
                    .collect();
                be.linear_many(&x, m, &mut projs).unwrap();
                for ((&(f, rows), bytes), got) in mix.iter().zip(&ws).zip(&outs) {
                    let mut want = vec![f32::NAN; m * rows];
                    be.linear(&Matrix::blocks(f, bytes, rows, cols), &x, m, &mut want)
                        .unwrap();
                    assert_eq!(got, &want, "{:?} {f} m={m} rows={rows}", be.isa());
                }
            }
        }
    }
}

#[test]
fn quant_matmul_many_reports_bad_bytes() {
    let be = CpuBackend::new();
    let x = vec![0.5f32; 64];
    let bytes = vec![0u8; 10];
    let mut y = vec![0f32; 2];
    let mut projs = [Proj {
        w: Matrix::blocks(QuantFormat::Q5_0, &bytes, 2, 64),
        y: &mut y,
    }];
    let err = be.linear_many(&x, 1, &mut projs).unwrap_err();
    assert!(err.to_string().contains("bytes"), "{err}");
}
