//! matmul_transb / matmul / gemv / quant_matvec of the CPU backend against a naive f64 reference.
//! Tolerance: |c − ref| ≤ 1e-5 · Σ_p |a_p·b_p| per element (relative to the magnitude of the
//! products summed, which bounds f32 rounding of any summation order).

use infer_compute::{ComputeBackend, ComputeError, CpuBackend, QuantFormat};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Naive `A·Bᵀ` in f64, plus the per-element scale Σ|a·b|.
fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0f64; m * n];
    let mut s = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let prod = a[i * k + p] as f64 * b[j * k + p] as f64;
                c[i * n + j] += prod;
                s[i * n + j] += prod.abs();
            }
        }
    }
    (c, s)
}

fn check(got: &[f32], want: &[f64], scale: &[f64], what: &str) {
    assert_eq!(got.len(), want.len());
    for (idx, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {idx} unwritten or not finite: {g}"
        );
        let err = (g as f64 - w).abs();
        assert!(
            err <= 1e-5 * s + 1e-30,
            "{what}: element {idx}: got {g}, want {w} (err {err:e}, scale {s:e})"
        );
    }
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1536, 576), // vecmat, parallel over column blocks
    (1, 100, 1000), // vecmat, ragged last block
    (1, 1, 1),
    (1, 7, 13),
    (1, 576, 1536),
    (2, 1, 1),
    (3, 17, 5),
    (5, 33, 64),
    (7, 129, 257),
    (16, 64, 48),
    (33, 300, 700), // parallel, split over columns
    (500, 300, 20), // parallel, split over rows
    (4, 1000, 3),
];

/// `[k, n]` row-major → `[n, k]` row-major.
fn transpose(b: &[f32], k: usize, n: usize) -> Vec<f32> {
    (0..n * k).map(|i| b[(i % k) * n + i / k]).collect()
}

fn run_matmul_cases() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(7);
    for &(m, k, n) in SHAPES {
        let a = random(&mut rng, m * k);
        let b = random(&mut rng, n * k);
        let (want, scale) = reference(&a, &b, m, k, n);
        let mut c = vec![f32::NAN; m * n];
        be.matmul_transb(&a, &b, m, k, n, &mut c).unwrap();
        check(
            &c,
            &want,
            &scale,
            &format!("matmul_transb m={m} k={k} n={n}"),
        );
        // Same product with B given as [k, n].
        let b_plain = transpose(&b, n, k);
        let mut c = vec![f32::NAN; m * n];
        be.matmul(&a, &b_plain, m, k, n, &mut c).unwrap();
        check(&c, &want, &scale, &format!("matmul m={m} k={k} n={n}"));
    }
}

#[test]
fn matmul_matches_naive_f64() {
    run_matmul_cases();
}

#[test]
fn matmul_matches_naive_f64_on_3_and_4_threads() {
    for threads in [3, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(run_matmul_cases);
    }
}

#[test]
fn matmuls_with_k_zero_are_all_zero() {
    for m in [1, 2] {
        let mut c = vec![f32::NAN; m * 3];
        CpuBackend::new()
            .matmul_transb(&[], &[], m, 0, 3, &mut c)
            .unwrap();
        assert_eq!(c, vec![0.0; m * 3]);
        let mut c = vec![f32::NAN; m * 3];
        CpuBackend::new().matmul(&[], &[], m, 0, 3, &mut c).unwrap();
        assert_eq!(c, vec![0.0; m * 3]);
    }
}

#[test]
fn gemv_matches_naive_f64() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(11);
    for &(n, k) in &[
        (1, 1),
        (1, 31),
        (5, 15),
        (13, 17),
        (64, 576),
        (1536, 576),
        (49152, 3),
        (3, 4099),
    ] {
        let b = random(&mut rng, n * k);
        let x = random(&mut rng, k);
        let mut y = vec![f32::NAN; n];
        be.gemv(&b, &x, n, k, &mut y).unwrap();
        let (want, scale) = reference(&x, &b, 1, k, n);
        check(&y, &want, &scale, &format!("gemv n={n} k={k}"));
    }
}

#[test]
fn gemv_bitwise_equals_matmul_row_one() {
    // m = 1 goes through gemv, so the two entry points agree exactly.
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(3);
    let (n, k) = (300, 131);
    let b = random(&mut rng, n * k);
    let x = random(&mut rng, k);
    let mut y1 = vec![0f32; n];
    let mut y2 = vec![0f32; n];
    be.gemv(&b, &x, n, k, &mut y1).unwrap();
    be.matmul_transb(&x, &b, 1, k, n, &mut y2).unwrap();
    assert_eq!(y1, y2);
}

#[test]
fn quant_matvec_f32_matches_gemv() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(5);
    let (rows, cols) = (37, 70);
    let w = random(&mut rng, rows * cols);
    let x = random(&mut rng, cols);
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut y = vec![f32::NAN; rows];
    be.linear(
        &infer_compute::Matrix::blocks(QuantFormat::F32, &bytes, rows, cols),
        &x,
        1,
        &mut y,
    )
    .expect("f32 matvec");
    let mut y_ref = vec![0f32; rows];
    be.gemv(&w, &x, rows, cols, &mut y_ref).unwrap();
    assert_eq!(y, y_ref);
}

#[test]
fn quant_matvec_rejects_bad_sizes() {
    let be = CpuBackend::new();
    let x = vec![0f32; 64];
    let mut y = vec![0f32; 2];
    // 2 rows of 64 Q4_0 values = 2 * 2 blocks * 18 bytes = 72; give 71.
    let err = be
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q4_0, &[0u8; 71], 2, 64),
            &x,
            1,
            &mut y,
        )
        .expect_err("short bytes must fail");
    assert!(
        matches!(
            err,
            ComputeError::ShapeMismatch {
                expected: 72,
                got: 71,
                ..
            }
        ),
        "{err}"
    );
    // 48 columns is not a whole number of 32-value blocks.
    let x = vec![0f32; 48];
    let err = be
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q4_0, &[0u8; 54], 2, 48),
            &x,
            1,
            &mut y,
        )
        .expect_err("unaligned row must fail");
    assert!(matches!(err, ComputeError::Quant(_)), "{err}");
}
