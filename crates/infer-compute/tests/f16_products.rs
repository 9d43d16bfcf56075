//! `matmul_transb_f16` / `matmul_f16` (the vindex f16 tier) against an f64 reference over the
//! widened weights, for the SIMD and the scalar (`Isa::Generic`) backends, on random data of
//! many shapes (odd sizes, one to many activation rows, rows not divisible by the thread count).
//!
//! Tolerance: |got − ref| ≤ 1e-5 · Σ|aᵢ·bᵢ| + 1e-30: both sides multiply the same exactly
//! widened f32 weights; only the f32 summation order differs (relative error ≲ k·2⁻²⁴ of the
//! absolute sum, k ≤ 1000 here).

use half::f16;
use infer_compute::vec_dot::Isa;
use infer_compute::{axpy_f16, dot_f16, ComputeBackend, CpuBackend};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn random_f16(rng: &mut StdRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)))
        .collect()
}

/// Check `c` against Σₚ a[i,p]·B(p,j) in f64, where `b_at(p, j)` reads op(B).
fn check(
    what: &str,
    a: &[f32],
    c: &[f32],
    m: usize,
    k: usize,
    n: usize,
    b_at: impl Fn(usize, usize) -> f32,
) {
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut abs) = (0f64, 0f64);
            for p in 0..k {
                let t = a[i * k + p] as f64 * b_at(p, j) as f64;
                sum += t;
                abs += t.abs();
            }
            let got = c[i * n + j] as f64;
            assert!(
                (got - sum).abs() <= 1e-5 * abs + 1e-30,
                "{what} m={m} k={k} n={n} at ({i},{j}): got {got}, want {sum} (Σ|t| {abs})"
            );
        }
    }
}

fn backends() -> Vec<(&'static str, CpuBackend)> {
    let mut v = vec![(
        "generic",
        CpuBackend::with_isa(Isa::Generic).expect("generic"),
    )];
    if Isa::Avx2.is_available() {
        v.push(("avx2", CpuBackend::with_isa(Isa::Avx2).expect("avx2")));
    }
    v
}

/// The many-row shapes cover every tile remainder of the AVX-512 tiles (6 activation rows ×
/// 4 weight rows, k in steps of 16): m mod 6, n mod 4 and k mod 16 all nonzero, and whole
/// tiles only.
const SHAPES: [(usize, usize, usize); 12] = [
    (1, 1, 1),
    (1, 7, 3),
    (1, 64, 129),
    (1, 576, 1536),
    (2, 33, 65),
    (4, 640, 300),
    (5, 100, 257),
    (9, 576, 200),
    (37, 129, 131),
    (6, 16, 4),
    (13, 15, 7),
    (64, 1000, 70),
];

/// Both f16 products on every shape, backend and pool size; `transposed` picks
/// `matmul_transb_f16` (B `[n, k]`) or `matmul_f16` (B `[k, n]`).
fn check_products(transposed: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (name, be) in backends() {
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for &(m, k, n) in &SHAPES {
                let a = random(&mut rng, m * k);
                let b = random_f16(&mut rng, n * k);
                let mut c = vec![f32::NAN; m * n];
                let what = format!("{name}/{threads}t transposed={transposed}");
                if transposed {
                    pool.install(|| be.matmul_transb_f16(&a, &b, m, k, n, &mut c))
                        .unwrap();
                    check(&what, &a, &c, m, k, n, |p, j| b[j * k + p].to_f32());
                } else {
                    pool.install(|| be.matmul_f16(&a, &b, m, k, n, &mut c))
                        .unwrap();
                    check(&what, &a, &c, m, k, n, |p, j| b[p * n + j].to_f32());
                }
            }
        }
    }
}

#[test]
fn matmul_transb_f16_matches_f64_reference() {
    check_products(true, 16);
}

#[test]
fn matmul_f16_matches_f64_reference() {
    check_products(false, 17);
}

#[test]
fn f16_products_equal_f32_products_on_widened_weights() {
    // The f16 tier must give the f32 path's answer on the same (f16-rounded) weights.
    let mut rng = StdRng::seed_from_u64(18);
    let be = CpuBackend::new();
    let (m, k, n) = (3, 256, 96);
    let a = random(&mut rng, m * k);
    let b = random_f16(&mut rng, n * k);
    let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    let (mut c16, mut c32) = (vec![0.0; m * n], vec![0.0; m * n]);
    be.matmul_transb_f16(&a, &b, m, k, n, &mut c16).unwrap();
    be.matmul_transb(&a, &wide, m, k, n, &mut c32).unwrap();
    for (x, y) in c16.iter().zip(&c32) {
        assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{x} vs {y}");
    }
}

#[test]
fn dot_and_axpy_f16_match_scalar() {
    let mut rng = StdRng::seed_from_u64(19);
    for len in [0, 1, 7, 8, 31, 32, 33, 577] {
        let a = random(&mut rng, len);
        let b = random_f16(&mut rng, len);
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| *x as f64 * y.to_f32() as f64)
            .sum();
        let abs: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64 * y.to_f32() as f64).abs())
            .sum();
        let got = dot_f16(&a, &b) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * abs + 1e-30,
            "dot len {len}: {got} vs {want}"
        );
        let mut y = random(&mut rng, len);
        let y0 = y.clone();
        axpy_f16(0.75, &b, &mut y);
        for i in 0..len {
            let e = y0[i] + 0.75 * b[i].to_f32();
            assert!(
                (y[i] - e).abs() <= 1e-6 * e.abs().max(1.0),
                "axpy len {len} at {i}"
            );
        }
    }
}
