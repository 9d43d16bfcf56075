//! `quant_matvec` / `quant_matmul` of the CPU backend for every weight format, and the SIMD
//! kernels against the scalar reference kernels, on random data of many shapes.
//!
//! Reference: Σ f64(dequant(w)) · f64(x̃), where x̃ = dequant(quantize(x)) in the activation format
//! paired with the weights (Q8_K for Q4_K/Q6_K, Q8_0 for Q4_0/Q5_0/Q8_0) and x̃ = x for the
//! dequantize-then-dot formats. Tolerance: |got − ref| ≤ 2e-6 · Σ|terms| (f32 rounding of block
//! scales and of the accumulation; one quant level of one element moves a dot by ≥ 3e-6·Σ|terms|
//! at n = 4096, and by much more at the sizes used here).

use infer_compute::vec_dot::{self, Isa};
use infer_compute::{ComputeBackend, ComputeError, CpuBackend, QuantFormat};
use rand::{rngs::StdRng, Rng, SeedableRng};

const ALL: [QuantFormat; 14] = [
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q8_0,
    QuantFormat::Q2_K,
    QuantFormat::Q3_K,
    QuantFormat::Q4_K,
    QuantFormat::Q5_K,
    QuantFormat::Q6_K,
    QuantFormat::Q8_K,
    QuantFormat::F16,
    QuantFormat::BF16,
    QuantFormat::F32,
];

const FUSED: [QuantFormat; 5] = [
    QuantFormat::Q4_0,
    QuantFormat::Q5_0,
    QuantFormat::Q8_0,
    QuantFormat::Q4_K,
    QuantFormat::Q6_K,
];

fn gauss(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            // Sum of uniforms: cheap, bell-shaped, with a few larger values.
            let s: f32 = (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum();
            s * std
        })
        .collect()
}

fn backends() -> Vec<CpuBackend> {
    let mut v = vec![CpuBackend::with_isa(Isa::Generic).unwrap()];
    if Isa::best() != Isa::Generic {
        v.push(CpuBackend::new());
    }
    v
}

/// Reference `y = W·x̃` in f64 and Σ|terms| per row.
fn reference(
    fmt: QuantFormat,
    w: &[u8],
    x: &[f32],
    rows: usize,
    cols: usize,
) -> (Vec<f64>, Vec<f64>) {
    let wf = infer_quant::dequantize_to_vec(fmt, w, rows * cols).unwrap();
    let xt = match vec_dot::activation_format(fmt) {
        Some(af) => {
            let mut q = vec![0u8; af.bytes_for(cols).unwrap()];
            vec_dot::quantize_activations(af, x, &mut q).unwrap();
            infer_quant::dequantize_to_vec(af, &q, cols).unwrap()
        }
        None => x.to_vec(),
    };
    let mut y = vec![0f64; rows];
    let mut s = vec![0f64; rows];
    for r in 0..rows {
        for c in 0..cols {
            let t = wf[r * cols + c] as f64 * xt[c] as f64;
            y[r] += t;
            s[r] += t.abs();
        }
    }
    (y, s)
}

fn block_cols(fmt: QuantFormat) -> &'static [usize] {
    match fmt.block_elems() {
        256 => &[256, 512, 1280, 2048],
        32 => &[32, 96, 256, 576, 2048],
        _ => &[1, 7, 64, 576],
    }
}

#[test]
fn quant_matvec_matches_f64_reference_for_every_format() {
    let mut rng = StdRng::seed_from_u64(11);
    for be in backends() {
        for fmt in ALL {
            let mut worst = 0f64;
            for &cols in block_cols(fmt) {
                for rows in [1usize, 3, 17, 67, 300] {
                    let w = gauss(&mut rng, rows * cols, 0.05);
                    let bytes = infer_quant::quantize(fmt, &w, cols, None).unwrap();
                    let x = gauss(&mut rng, cols, 1.0);
                    let mut y = vec![f32::NAN; rows];
                    be.linear(
                        &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                        &x,
                        1,
                        &mut y,
                    )
                    .unwrap_or_else(|e| panic!("{fmt} {rows}x{cols}: {e}"));
                    let (want, scale) = reference(fmt, &bytes, &x, rows, cols);
                    for r in 0..rows {
                        let err = (y[r] as f64 - want[r]).abs();
                        let rel = err / scale[r].max(1e-30);
                        worst = worst.max(rel);
                        assert!(
                            y[r].is_finite() && rel <= 2e-6,
                            "{:?} {fmt} {rows}x{cols} row {r}: got {}, want {}, err/Σ|t| {rel:e}",
                            be.isa(),
                            y[r],
                            want[r]
                        );
                    }
                }
            }
            eprintln!("{:?} {fmt}: max err/Σ|terms| = {worst:.2e}", be.isa());
        }
    }
}

/// Random bytes (not only quantizer output) with finite f16 scales, so the kernels see every
/// quant pattern. Q8 bytes avoid −128, which ggml's quantizers never emit and its `sign` trick
/// cannot represent (|−128| overflows i8), as in ggml.
fn random_blocks(rng: &mut StdRng, fmt: QuantFormat, n_blocks: usize) -> Vec<u8> {
    let bb = fmt.block_bytes();
    let mut out = vec![0u8; n_blocks * bb];
    rng.fill(&mut out[..]);
    let f16_fields: &[usize] = match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q4_K => &[0, 2],
        QuantFormat::Q6_K => &[208],
        _ => unreachable!(),
    };
    for b in out.chunks_exact_mut(bb) {
        for &o in f16_fields {
            let v: f32 = rng.gen_range(-2.0f32..2.0);
            b[o..o + 2].copy_from_slice(&infer_quant::float16::f32_to_f16(v).to_le_bytes());
        }
        if fmt == QuantFormat::Q8_0 {
            for q in &mut b[2..] {
                if *q == 0x80 {
                    *q = 0x81;
                }
            }
        }
    }
    out
}

#[test]
fn simd_kernels_match_scalar_kernels() {
    let Some(_) = vec_dot::kernel(QuantFormat::Q4_K, Isa::Avx2) else {
        assert!(!Isa::Avx2.is_available());
        eprintln!("AVX2 not available on this CPU: only the scalar kernels exist here");
        return;
    };
    let mut rng = StdRng::seed_from_u64(12);
    for fmt in FUSED {
        let act = vec_dot::activation_format(fmt).unwrap();
        let scalar = vec_dot::kernel(fmt, Isa::Generic).unwrap();
        let simd = vec_dot::kernel(fmt, Isa::Avx2).unwrap();
        let mut worst = 0f64;
        for n_blocks in [1usize, 2, 3, 7, 16, 64] {
            let n = n_blocks * fmt.block_elems();
            for trial in 0..20 {
                let w = random_blocks(&mut rng, fmt, n_blocks);
                let x = gauss(&mut rng, n, if trial % 2 == 0 { 1.0 } else { 1e-3 });
                let mut a = vec![0u8; act.bytes_for(n).unwrap()];
                vec_dot::quantize_activations(act, &x, &mut a).unwrap();
                let s = scalar(n, &w, &a) as f64;
                let v = simd(n, &w, &a) as f64;
                // Σ|terms| from the dequantized operands.
                let wf = infer_quant::dequantize_to_vec(fmt, &w, n).unwrap();
                let af = infer_quant::dequantize_to_vec(act, &a, n).unwrap();
                let abs: f64 = wf
                    .iter()
                    .zip(&af)
                    .map(|(p, q)| (*p as f64 * *q as f64).abs())
                    .sum();
                let rel = (s - v).abs() / abs.max(1e-30);
                worst = worst.max(rel);
                assert!(
                    rel <= 1e-6,
                    "{fmt} n={n} trial {trial}: scalar {s:e}, simd {v:e}, diff/Σ|t| {rel:e}"
                );
            }
        }
        eprintln!("{fmt}: max |simd − scalar| / Σ|terms| = {worst:.2e}");
    }
}

#[test]
fn quant_matmul_rows_equal_quant_matvec() {
    let mut rng = StdRng::seed_from_u64(13);
    for be in backends() {
        for fmt in ALL {
            let cols = block_cols(fmt)[1];
            for (m, rows) in [(2usize, 5usize), (5, 64), (33, 70), (40, 300)] {
                let w = gauss(&mut rng, rows * cols, 0.05);
                let bytes = infer_quant::quantize(fmt, &w, cols, None).unwrap();
                let x = gauss(&mut rng, m * cols, 1.0);
                let mut y = vec![f32::NAN; m * rows];
                be.linear(
                    &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                    &x,
                    m,
                    &mut y,
                )
                .unwrap_or_else(|e| panic!("{fmt} m={m} {rows}x{cols}: {e}"));
                for i in 0..m {
                    let mut yi = vec![f32::NAN; rows];
                    be.linear(
                        &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                        &x[i * cols..(i + 1) * cols],
                        1,
                        &mut yi,
                    )
                    .unwrap();
                    assert_eq!(
                        &y[i * rows..(i + 1) * rows],
                        &yi[..],
                        "{:?} {fmt} m={m} {rows}x{cols}: row {i}",
                        be.isa()
                    );
                }
            }
        }
    }
}

/// A backend with only the required methods, to exercise the trait's default `linear_many`
/// (one `linear` per matrix) against the CPU's fused one.
struct OnlyLinear(CpuBackend);

impl ComputeBackend for OnlyLinear {
    fn name(&self) -> &str {
        "only-linear"
    }
    fn matmul_transb(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.0.matmul_transb(a, b, m, k, n, c)
    }
    fn matmul(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.0.matmul(a, b, m, k, n, c)
    }
    fn gemv(
        &self,
        b: &[f32],
        x: &[f32],
        n: usize,
        k: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.0.gemv(b, x, n, k, y)
    }
    fn linear(
        &self,
        w: &infer_compute::Matrix<'_>,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.0.linear(w, x, m, y)
    }
}

#[test]
fn default_linear_many_equals_cpu_linear_many() {
    let mut rng = StdRng::seed_from_u64(14);
    let (m, cols) = (3, 512);
    let cpu = CpuBackend::new();
    let def = OnlyLinear(cpu);
    let mats: Vec<(QuantFormat, usize, Vec<u8>)> = [
        (QuantFormat::Q4_K, 9),
        (QuantFormat::Q5_K, 5),
        (QuantFormat::Q8_0, 7),
    ]
    .iter()
    .map(|&(fmt, rows)| {
        let w = gauss(&mut rng, rows * cols, 0.05);
        (
            fmt,
            rows,
            infer_quant::quantize(fmt, &w, cols, None).unwrap(),
        )
    })
    .collect();
    let x = gauss(&mut rng, m * cols, 1.0);
    let run = |be: &dyn ComputeBackend| -> Vec<Vec<f32>> {
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|(_, r, _)| vec![f32::NAN; m * r]).collect();
        let mut projs: Vec<infer_compute::Proj<'_>> = mats
            .iter()
            .zip(outs.iter_mut())
            .map(|((f, r, b), y)| infer_compute::Proj {
                w: infer_compute::Matrix::blocks(*f, b, *r, cols),
                y,
            })
            .collect();
        be.linear_many(&x, m, &mut projs).unwrap();
        outs
    };
    assert_eq!(
        run(&cpu),
        run(&def),
        "default linear_many differs from the CPU's fused one"
    );
}

#[test]
fn zero_sized_products_write_every_output() {
    let be = CpuBackend::new();
    let mut y = vec![f32::NAN; 3];
    be.linear(
        &infer_compute::Matrix::blocks(QuantFormat::Q4_K, &[], 3, 0),
        &[],
        1,
        &mut y,
    )
    .unwrap();
    assert_eq!(y, vec![0.0; 3]);
    let mut y = vec![f32::NAN; 6];
    be.linear(
        &infer_compute::Matrix::blocks(QuantFormat::Q4_0, &[], 3, 0),
        &[],
        2,
        &mut y,
    )
    .unwrap();
    assert_eq!(y, vec![0.0; 6]);
    let mut y: Vec<f32> = vec![];
    be.linear(
        &infer_compute::Matrix::blocks(QuantFormat::Q4_0, &[], 0, 32),
        &[0.0; 64],
        2,
        &mut y,
    )
    .unwrap();
}

#[test]
fn bad_inputs_are_errors() {
    let be = CpuBackend::new();
    let x = vec![0.5f32; 256];
    let mut y = vec![0f32; 2];
    // Q8_1 has no kernel and no dequantizer.
    let err = be
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q8_1, &[0u8; 2 * 8 * 36], 2, 256),
            &x,
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ComputeError::UnsupportedFormat {
                format: QuantFormat::Q8_1,
                ..
            }
        ),
        "{err}"
    );
    // 2 rows of 256 Q4_K values = 288 bytes; one short, one long.
    for len in [287usize, 289] {
        let err = be
            .linear(
                &infer_compute::Matrix::blocks(QuantFormat::Q4_K, &vec![0u8; len], 2, 256),
                &x,
                1,
                &mut y,
            )
            .unwrap_err();
        assert!(
            matches!(err, ComputeError::ShapeMismatch { expected: 288, got, .. } if got == len),
            "{err}"
        );
        let mut y2 = vec![0f32; 4];
        let x2 = vec![0.5f32; 512];
        let err = be
            .linear(
                &infer_compute::Matrix::blocks(QuantFormat::Q4_K, &vec![0u8; len], 2, 256),
                &x2,
                2,
                &mut y2,
            )
            .unwrap_err();
        assert!(
            matches!(err, ComputeError::ShapeMismatch { expected: 288, .. }),
            "{err}"
        );
    }
    // 288 columns: not a whole number of 256-value super-blocks.
    let x = vec![0.5f32; 288];
    let err = be
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q6_K, &[0u8; 420], 2, 288),
            &x,
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(matches!(err, ComputeError::Quant(_)), "{err}");
    let mut y2 = vec![0f32; 4];
    let x2 = vec![0.5f32; 576];
    let err = be
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q6_K, &[0u8; 420], 2, 288),
            &x2,
            2,
            &mut y2,
        )
        .unwrap_err();
    assert!(matches!(err, ComputeError::Quant(_)), "{err}");
}

#[test]
fn wrong_activation_or_output_length_is_an_error() {
    let be = CpuBackend::new();
    let w = infer_compute::Matrix::blocks(QuantFormat::Q4_0, &[0u8; 18], 1, 32);
    let mut y = vec![0f32; 1];
    let err = be.linear(&w, &[0.0; 10], 1, &mut y).unwrap_err();
    assert!(
        matches!(
            err,
            ComputeError::ShapeMismatch {
                expected: 32,
                got: 10,
                ..
            }
        ),
        "{err}"
    );
    let mut y2 = vec![0f32; 2];
    let err = be.linear(&w, &[0.0; 32], 1, &mut y2).unwrap_err();
    assert!(
        matches!(
            err,
            ComputeError::ShapeMismatch {
                expected: 1,
                got: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn isa_selection() {
    assert!(Isa::Generic.is_available());
    assert_eq!(
        CpuBackend::with_isa(Isa::Generic).unwrap().isa(),
        Isa::Generic
    );
    assert_eq!(CpuBackend::new().isa(), Isa::best());
    for fmt in ALL {
        assert_eq!(
            vec_dot::kernel(fmt, Isa::Generic).is_some(),
            FUSED.contains(&fmt),
            "{fmt}"
        );
        assert_eq!(
            vec_dot::activation_format(fmt).is_some(),
            FUSED.contains(&fmt),
            "{fmt}"
        );
    }
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        Isa::Avx2.is_available(),
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    );
}
