//! Parity of every CUDA kernel with the CPU scalar reference (`CpuBackend::with_isa(Isa::Generic)`)
//! on random inputs of many shapes: odd row counts, rows not a multiple of the 8 rows per block,
//! activation counts not a multiple of the 4 per warp, and the real models' shapes (SmolLM2-135M:
//! 576×576, 192×576, 1536×576, 576×1536, 49152×576 lm_head; Gemma-3-270m: 640×640, 2048×640,
//! 640×2048), and 8461×4096 (several staged chunks of weights per row).
//!
//! Tolerance: |gpu − cpu| ≤ 1e-5 · Σ|terms| per output. Quantized products: the device quantizes
//! the activations to the CPU's activation format with the same f32 operations (same int8 values
//! and scales), each block's integer sum is exact on both sides, so the two results differ only
//! in the order of the f32 additions of the block terms (and in FMA contraction): a few ulp of
//! the partial sums, ~1e-7 of Σ|terms| (printed per test as "max err/Σ|terms|").
//! Σ|terms| = Σ_c |w_c|·|x_c| with |w_c| the magnitude of each decoded weight's parts (Q4_K:
//! |d·sc·q| + |dmin·m|, the two sums that are subtracted). f32/f16 products: f32 sums in another
//! order, same bound with Σ|a·b|.
//!
//! The tests need a CUDA device and are `#[ignore]`d so the CPU CI does not run them; run them
//! with `scripts/gpu-check.sh` (`--ignored`). Without a device they fail with the reason.

#![cfg(feature = "cuda")]

use half::f16;
use infer_compute::cuda::CudaBackend;
use infer_compute::{
    Attend, AttentionParams, ComputeBackend, ComputeError, CpuBackend, Isa, KvType, QuantFormat,
    RopeAttend, Tensor,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

const TOL: f64 = 1e-5;

fn gpu() -> CudaBackend {
    CudaBackend::new(0).unwrap_or_else(|e| {
        panic!("the CUDA parity tests need a CUDA device (scripts/gpu-check.sh runs them): {e}")
    })
}

fn cpu() -> CpuBackend {
    CpuBackend::with_isa(Isa::Generic).expect("the generic ISA is always available")
}

fn gauss(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * std)
        .collect()
}

/// Random block bytes (every quant pattern) with finite f16 scales in [-2, 2]; Q8_0 quants avoid
/// −128, which ggml's quantizers never emit (as tests/quant_matvec.rs).
fn random_blocks(rng: &mut StdRng, fmt: QuantFormat, n_blocks: usize) -> Vec<u8> {
    let bb = fmt.block_bytes();
    let mut out = vec![0u8; n_blocks * bb];
    rng.fill(&mut out[..]);
    for b in out.chunks_exact_mut(bb) {
        for &o in f16_fields(fmt) {
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

fn f16_fields(fmt: QuantFormat) -> &'static [usize] {
    match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q4_K => &[0, 2],
        QuantFormat::Q6_K => &[208],
        _ => unreachable!("not a fused format"),
    }
}

/// |w| per element, `[rows, cols]`; for Q4_K the sum of the magnitudes of the scale part and
/// the min part (dequantized from copies with dmin = 0 and with d = 0).
fn weight_magnitudes(fmt: QuantFormat, bytes: &[u8], n: usize) -> Vec<f32> {
    let deq = |b: &[u8]| {
        let mut v = vec![0f32; n];
        infer_quant::dequantize(fmt, b, &mut v).expect("dequantize");
        v
    };
    if fmt != QuantFormat::Q4_K {
        return deq(bytes).iter().map(|v| v.abs()).collect();
    }
    let zero = |off: usize| {
        let mut b = bytes.to_vec();
        for blk in b.chunks_exact_mut(fmt.block_bytes()) {
            blk[off..off + 2].copy_from_slice(&[0, 0]);
        }
        b
    };
    let scale_part = deq(&zero(2));
    let min_part = deq(&zero(0));
    scale_part
        .iter()
        .zip(&min_part)
        .map(|(a, b)| a.abs() + b.abs())
        .collect()
}

/// Σ_c |w[r,c]|·|x[i,c]| as `[m, rows]`.
fn term_sums(wabs: &[f32], x: &[f32], m: usize, rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0f64; m * rows];
    for i in 0..m {
        let xi = &x[i * cols..(i + 1) * cols];
        for r in 0..rows {
            let wr = &wabs[r * cols..(r + 1) * cols];
            out[i * rows + r] = wr
                .iter()
                .zip(xi)
                .map(|(&w, &v)| w as f64 * v.abs() as f64)
                .sum();
        }
    }
    out
}

/// Assert |got − want| ≤ TOL·mag everywhere (and every output written, finite); returns the
/// largest err/mag.
fn compare(what: &str, got: &[f32], want: &[f32], mag: &[f64]) -> f64 {
    let mut worst = 0f64;
    for (j, ((&g, &w), &s)) in got.iter().zip(want).zip(mag).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: output {j} not written or not finite: {g}"
        );
        let err = (g as f64 - w as f64).abs();
        assert!(
            err <= TOL * s + 1e-30,
            "{what}: output {j}: gpu {g} vs cpu {w}, |diff| {err:e} > {TOL:e} · Σ|terms| {s:e}"
        );
        if s > 0.0 {
            worst = worst.max(err / s);
        }
    }
    worst
}

/// One quantized product on both backends; returns max err/Σ|terms|.
fn quant_case(
    gpu: &CudaBackend,
    rng: &mut StdRng,
    fmt: QuantFormat,
    m: usize,
    rows: usize,
    cols: usize,
) -> f64 {
    let bytes = random_blocks(rng, fmt, rows * cols / fmt.block_elems());
    let x = gauss(rng, m * cols, 1.0);
    let mut want = vec![f32::NAN; m * rows];
    let mut got = vec![f32::NAN; m * rows];
    if m == 1 {
        cpu()
            .linear(
                &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                &x,
                1,
                &mut want,
            )
            .unwrap();
        gpu.linear(
            &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
            &x,
            1,
            &mut got,
        )
        .unwrap_or_else(|e| panic!("{fmt} {rows}x{cols}: {e}"));
    } else {
        cpu()
            .linear(
                &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                &x,
                m,
                &mut want,
            )
            .unwrap();
        gpu.linear(
            &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
            &x,
            m,
            &mut got,
        )
        .unwrap_or_else(|e| panic!("{fmt} m={m} {rows}x{cols}: {e}"));
    }
    let mag = term_sums(
        &weight_magnitudes(fmt, &bytes, rows * cols),
        &x,
        m,
        rows,
        cols,
    );
    compare(&format!("{fmt} m={m} {rows}x{cols}"), &got, &want, &mag)
}

/// `(rows, cols)` per format family: 32-value blocks and K-quants (cols a multiple of 256).
const SHAPES_32: &[(usize, usize)] = &[
    (1, 32),
    (7, 64),
    (33, 96),
    (67, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (576, 1536),
    (640, 640),
    (2048, 640),
    (640, 2048),
    (37, 4096),
    // Split-K with a partial last K step (9.25 steps of 128 values in 2 shares).
    (40, 1184),
    // Several staged chunks per row, many blocks.
    (8461, 4096),
];
const SHAPES_K: &[(usize, usize)] = &[
    (1, 256),
    (5, 512),
    (33, 768),
    (67, 1536),
    (576, 1536),
    (640, 2048),
    (2048, 2048),
    (37, 4096),
    // Split-K over an odd number of super-blocks (3 shares of 3, 3 and 1).
    (40, 1792),
    (8461, 4096),
];
/// Activation rows: the mat-vecs (below 8) and the tensor-core tiles (16-token tiles partial
/// and full, 32-token tiles partial and full, two tiles of 64 and a partial third).
const MS: &[usize] = &[1, 2, 3, 5, 8, 16, 17, 32, 64, 130];

fn quant_format_parity(fmt: QuantFormat, seed: u64) {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let shapes = if fmt.block_elems() == 256 {
        SHAPES_K
    } else {
        SHAPES_32
    };
    let mut worst = 0f64;
    for &(rows, cols) in shapes {
        let ms: &[usize] = if rows * cols > 1 << 20 {
            &[1, 5, 16, 70]
        } else {
            MS
        };
        for &m in ms {
            worst = worst.max(quant_case(&gpu, &mut rng, fmt, m, rows, cols));
        }
    }
    if fmt == QuantFormat::Q4_0 || fmt == QuantFormat::Q8_0 {
        // SmolLM2's lm_head.
        worst = worst.max(quant_case(&gpu, &mut rng, fmt, 1, 49152, 576));
    }
    println!("parity {fmt}: max err/Σ|terms| = {worst:.3e} (tolerance {TOL:e})");
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn q4_0_matches_cpu() {
    quant_format_parity(QuantFormat::Q4_0, 40);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn q5_0_matches_cpu() {
    quant_format_parity(QuantFormat::Q5_0, 50);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn q8_0_matches_cpu() {
    quant_format_parity(QuantFormat::Q8_0, 80);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn q4_k_matches_cpu() {
    quant_format_parity(QuantFormat::Q4_K, 44);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn q6_k_matches_cpu() {
    quant_format_parity(QuantFormat::Q6_K, 66);
}

/// `linear_many` (activations quantized once per family, one download) on mixed formats
/// sharing `cols`: every output bit-equal to the single-matrix GPU product and within TOL of
/// the CPU's fused call; an empty (0-row) projection is allowed.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn fused_products_equal_single_products() {
    use infer_compute::{Matrix, Proj};
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(77);
    let mut worst = 0f64;
    for &(m, cols) in &[(1usize, 1536usize), (5, 1536), (1, 4096), (3, 256)] {
        let specs = [
            (QuantFormat::Q4_K, 67usize),
            (QuantFormat::Q5_0, 33),
            (QuantFormat::Q6_K, 5),
            (QuantFormat::Q8_0, 192),
            (QuantFormat::Q4_0, 0),
            (QuantFormat::Q4_K, 9),
        ];
        let weights: Vec<Vec<u8>> = specs
            .iter()
            .map(|&(f, r)| random_blocks(&mut rng, f, r * cols / f.block_elems()))
            .collect();
        let x = gauss(&mut rng, m * cols, 1.0);
        let mut got: Vec<Vec<f32>> = specs.iter().map(|&(_, r)| vec![f32::NAN; m * r]).collect();
        let mut want: Vec<Vec<f32>> = specs.iter().map(|&(_, r)| vec![f32::NAN; m * r]).collect();
        {
            let mut projs: Vec<Proj<'_>> = specs
                .iter()
                .zip(&weights)
                .zip(got.iter_mut())
                .map(|((&(format, rows), bytes), y)| Proj {
                    w: Matrix::blocks(format, bytes, rows, cols),
                    y,
                })
                .collect();
            gpu.linear_many(&x, m, &mut projs)
                .unwrap_or_else(|e| panic!("fused m={m} cols={cols}: {e}"));
            let mut projs: Vec<Proj<'_>> = specs
                .iter()
                .zip(&weights)
                .zip(want.iter_mut())
                .map(|((&(format, rows), bytes), y)| Proj {
                    w: Matrix::blocks(format, bytes, rows, cols),
                    y,
                })
                .collect();
            cpu().linear_many(&x, m, &mut projs).unwrap();
        }
        for (i, &(fmt, rows)) in specs.iter().enumerate() {
            let mut single = vec![f32::NAN; m * rows];
            gpu.linear(
                &infer_compute::Matrix::blocks(fmt, &weights[i], rows, cols),
                &x,
                m,
                &mut single,
            )
            .unwrap_or_else(|e| panic!("{fmt} m={m} {rows}x{cols}: {e}"));
            assert!(
                single
                    .iter()
                    .zip(&got[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "fused {fmt} m={m} {rows}x{cols} differs from the single product"
            );
            let mag = term_sums(
                &weight_magnitudes(fmt, &weights[i], rows * cols),
                &x,
                m,
                rows,
                cols,
            );
            let what = format!("fused {fmt} m={m} {rows}x{cols}");
            worst = worst.max(compare(&what, &got[i], &want[i], &mag));
        }
    }
    println!("parity fused quant_matmul_many: max err/Σ|terms| = {worst:.3e} (tolerance {TOL:e})");
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn q8_attention_format_matches_cpu() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(8);
    let mut worst = 0f64;
    for &(rows, cols) in SHAPES_32 {
        for &m in MS {
            let nb = cols / 32;
            let values: Vec<u8> = (0..rows * cols)
                .map(|_| rng.gen_range(-127i32..=127) as i8 as u8)
                .collect();
            let scales: Vec<f32> = (0..rows * nb)
                .map(|_| rng.gen_range(-0.02f32..0.02))
                .collect();
            let x = gauss(&mut rng, m * cols, 1.0);
            let mut want = vec![f32::NAN; m * rows];
            let mut got = vec![f32::NAN; m * rows];
            cpu()
                .linear(
                    &infer_compute::Matrix::split_q8(&values, &scales, rows, cols),
                    &x,
                    m,
                    &mut want,
                )
                .unwrap();
            gpu.linear(
                &infer_compute::Matrix::split_q8(&values, &scales, rows, cols),
                &x,
                m,
                &mut got,
            )
            .unwrap();
            let wabs: Vec<f32> = (0..rows * cols)
                .map(|j| ((values[j] as i8) as f32 * scales[j / 32]).abs())
                .collect();
            let mag = term_sums(&wabs, &x, m, rows, cols);
            worst = worst.max(compare(
                &format!("q8 m={m} {rows}x{cols}"),
                &got,
                &want,
                &mag,
            ));
        }
    }
    println!("parity Q8 (int8 + f32 scales): max err/Σ|terms| = {worst:.3e} (tolerance {TOL:e})");
}

/// `(m, k, n)` of the f32/f16 products.
const FLOAT_SHAPES: &[(usize, usize, usize)] = &[
    (1, 7, 3),
    (1, 576, 576),
    (1, 640, 2048),
    (3, 576, 1536),
    (8, 1536, 576),
    (9, 33, 65),
    (17, 640, 2048),
    (65, 100, 130),
    (70, 2048, 640),
];

/// Σ|a·b| per output for `C = A·Bᵀ` (`bt` = B is `[n, k]`) or `C = A·B` (B `[k, n]`).
fn float_mag(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, bt: bool) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| {
                    let bv = if bt { b[j * k + p] } else { b[p * n + j] };
                    (a[i * k + p] as f64 * bv as f64).abs()
                })
                .sum();
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn f32_and_f16_products_match_cpu() {
    let gpu = gpu();
    let cpu = cpu();
    let mut rng = StdRng::seed_from_u64(32);
    let mut worst = [0f64; 5];
    for &(m, k, n) in FLOAT_SHAPES {
        let a = gauss(&mut rng, m * k, 1.0);
        let b = gauss(&mut rng, n * k, 0.1);
        let bh: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
        let bw: Vec<f32> = bh.iter().map(|v| v.to_f32()).collect();
        let mag_t = float_mag(&a, &b, m, k, n, true);
        let mag_n = float_mag(&a, &b, m, k, n, false);
        let mag_th = float_mag(&a, &bw, m, k, n, true);
        let mag_nh = float_mag(&a, &bw, m, k, n, false);
        let run = |f: &dyn Fn(&dyn ComputeBackend, &mut [f32])| {
            let (mut g, mut c) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            f(&gpu, &mut g);
            f(&cpu, &mut c);
            (g, c)
        };
        let s = format!("m={m} k={k} n={n}");
        let (g, c) = run(&|be, out| be.matmul_transb(&a, &b, m, k, n, out).expect("product"));
        worst[0] = worst[0].max(compare(&format!("matmul_transb {s}"), &g, &c, &mag_t));
        let (g, c) = run(&|be, out| be.matmul(&a, &b, m, k, n, out).expect("product"));
        worst[1] = worst[1].max(compare(&format!("matmul {s}"), &g, &c, &mag_n));
        let (g, c) = run(&|be, out| {
            be.matmul_transb_f16(&a, &bh, m, k, n, out)
                .expect("product")
        });
        worst[2] = worst[2].max(compare(&format!("matmul_transb_f16 {s}"), &g, &c, &mag_th));
        let (g, c) = run(&|be, out| be.matmul_f16(&a, &bh, m, k, n, out).expect("product"));
        worst[3] = worst[3].max(compare(&format!("matmul_f16 {s}"), &g, &c, &mag_nh));
        if m == 1 {
            let (g, c) = run(&|be, out| be.gemv(&b, &a, n, k, out).expect("product"));
            worst[4] = worst[4].max(compare(&format!("gemv {s}"), &g, &c, &mag_t));
        }
    }
    let names = [
        "matmul_transb",
        "matmul",
        "matmul_transb_f16",
        "matmul_f16",
        "gemv",
    ];
    for (n, w) in names.iter().zip(worst) {
        println!("parity {n}: max err/Σ|terms| = {w:.3e} (tolerance {TOL:e})");
    }
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn weights_are_cached_and_reuploaded_when_changed() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(5);
    let (rows, cols) = (67, 576);
    let mut bytes = random_blocks(&mut rng, QuantFormat::Q8_0, rows * cols / 32);
    let x = gauss(&mut rng, cols, 1.0);
    let (mut y1, mut y2, mut want) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
    gpu.linear(
        &infer_compute::Matrix::blocks(QuantFormat::Q8_0, &bytes, rows, cols),
        &x,
        1,
        &mut y1,
    )
    .unwrap();
    assert_eq!(gpu.cached_weight_bytes(), bytes.len());
    gpu.linear(
        &infer_compute::Matrix::blocks(QuantFormat::Q8_0, &bytes, rows, cols),
        &x,
        1,
        &mut y2,
    )
    .unwrap();
    assert_eq!(
        gpu.cached_weight_bytes(),
        bytes.len(),
        "second call re-uploaded"
    );
    assert_eq!(y1, y2);
    // Rewrite the weights in place (same address and length): the fingerprint sees it.
    let fresh = random_blocks(&mut rng, QuantFormat::Q8_0, rows * cols / 32);
    bytes.copy_from_slice(&fresh);
    gpu.linear(
        &infer_compute::Matrix::blocks(QuantFormat::Q8_0, &bytes, rows, cols),
        &x,
        1,
        &mut y2,
    )
    .unwrap();
    cpu()
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q8_0, &bytes, rows, cols),
            &x,
            1,
            &mut want,
        )
        .unwrap();
    let mag = term_sums(
        &weight_magnitudes(QuantFormat::Q8_0, &bytes, rows * cols),
        &x,
        1,
        rows,
        cols,
    );
    compare("rewritten weights", &y2, &want, &mag);
    gpu.clear_weight_cache();
    assert_eq!(gpu.cached_weight_bytes(), 0);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn bad_inputs_are_errors_on_the_device_backend() {
    let gpu = gpu();
    let mut y = vec![0f32; 2];
    let x = vec![0f32; 32];
    let err = gpu
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q4_1, &[0u8; 40], 2, 32),
            &x,
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(
        matches!(err, ComputeError::UnsupportedFormat { .. }),
        "{err}"
    );
    let err = gpu
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q8_0, &[0u8; 67], 2, 32),
            &x,
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ComputeError::ShapeMismatch {
                expected: 68,
                got: 67,
                ..
            }
        ),
        "{err}"
    );
    let x31 = vec![0f32; 31];
    let err = gpu
        .linear(
            &infer_compute::Matrix::blocks(QuantFormat::Q8_0, &[0u8; 68], 2, 31),
            &x31,
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(matches!(err, ComputeError::Quant(_)), "{err}");
    let err = gpu
        .linear(
            &infer_compute::Matrix::split_q8(&[0u8; 64], &[1.0; 1], 2, 32),
            &x,
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(matches!(err, ComputeError::ShapeMismatch { .. }), "{err}");
}

/// Runs everywhere (CPU CI included): opening a device that does not exist is an error that
/// says why, never a panic — no driver library, or no such device.
#[test]
fn missing_device_is_an_error() {
    let err = CudaBackend::new(4096).expect_err("there is no CUDA device 4096");
    match &err {
        ComputeError::Device { backend, message } => {
            assert_eq!(*backend, "cuda");
            assert!(
                message.contains("libcuda")
                    || message.contains("no usable CUDA device")
                    || message.contains("no CUDA device 4096"),
                "unexpected message: {message}"
            );
        }
        other => panic!("expected ComputeError::Device, got {other:?}"),
    }
}

/// Runs everywhere (CPU CI included, where scripts/test.sh puts NVRTC from the
/// `nvidia-cuda-nvrtc` wheel on LD_LIBRARY_PATH): every kernel compiles for sm_90 (H100/H200,
/// through ptxas), so a kernel that does not compile fails here and not first on the GPU
/// machine; the CUBIN lands in the kernel cache (`INFER_CACHE`), which `scripts/gpu-check.sh
/// build` carries to the device.
#[test]
fn kernels_compile_with_nvrtc() {
    let (file, cubin) = infer_compute::cuda::check_kernels_compile()
        .unwrap_or_else(|e| panic!("{e} (scripts/fetch-nvrtc.sh fetches it)"));
    assert!(cubin > 10_000, "CUBIN of {cubin} bytes");
    println!("kernels: {cubin} bytes of CUBIN for sm_90 in {file:?}");
}

mod common;

/// Bound of the many-row products' dequantize + cuBLAS path (`cuda/blas.rs`) per output,
/// relative to Σ|wᵢxᵢ| of the exact (f32-dequantized) weights: each weight and activation is
/// rounded once to bf16 (≤ 2⁻⁹ relative each, 2⁻⁸ + 2⁻¹⁸ for their product), plus f32
/// accumulation.
const BF16_TOL: f64 = 4.5e-3;

/// The tensor products from 128 activation rows, or 16 for a matrix of 4–16 Mi values
/// (`project`, `project_many`), run as bf16 GEMMs on dequantized weights: every output within [`BF16_TOL`]·Σ|terms| of the f64 product of the
/// exactly dequantized weights, and the RMS error under 1% of the outputs' RMS (a rounding
/// error of ~0.2%; a wrong row, chunk or layout is off by about the output itself). Every
/// format with a dequantization kernel, odd row counts, m not a multiple of any tile, a mixed
/// Q4_K + Q6_K `project_many` (Q4_K_M's attention), and a matrix over the 64 Mi-value scratch
/// (two chunks of rows; outputs checked on three activation rows).
#[test]
#[ignore]
fn many_row_products_run_on_dequantized_bf16_within_the_rounding_bound() {
    let gpu = gpu();
    assert!(
        gpu.uses_cublas(),
        "libcublas is not on the loader path: the many-row products would not run on cuBLAS"
    );
    let b: &dyn ComputeBackend = &gpu;
    let mut rng = StdRng::seed_from_u64(77);
    let up = |v: &[f32]| {
        let mut t = infer_compute::Tensor::default();
        b.upload(v, &mut t).expect("upload");
        t
    };
    let down = |t: &infer_compute::Tensor| {
        let mut v = vec![f32::NAN; t.len()];
        b.download(t, &mut v).expect("download");
        v
    };
    // Checks outputs `[m, rows]` on activation rows `check` against the exact product.
    let verify = |what: &str,
                  fmt: QuantFormat,
                  bytes: &[u8],
                  x: &[f32],
                  got: &[f32],
                  rows: usize,
                  cols: usize,
                  check: &[usize]| {
        let mut w = vec![0f32; rows * cols];
        infer_quant::dequantize(fmt, bytes, &mut w).expect("dequantize");
        let (mut err2, mut ref2, mut worst) = (0f64, 0f64, 0f64);
        for &i in check {
            let xi = &x[i * cols..(i + 1) * cols];
            for r in 0..rows {
                let wr = &w[r * cols..(r + 1) * cols];
                let (mut dot, mut mag) = (0f64, 0f64);
                for (&a, &c) in wr.iter().zip(xi) {
                    dot += a as f64 * c as f64;
                    mag += (a as f64 * c as f64).abs();
                }
                let g = got[i * rows + r] as f64;
                assert!(g.is_finite(), "{what}: output ({i}, {r}) not finite: {g}");
                let err = (g - dot).abs();
                assert!(
                    err <= BF16_TOL * mag + 1e-30,
                    "{what}: output ({i}, {r}): gpu {g} vs exact {dot}, |diff| {err:e} > {BF16_TOL:e} · Σ|terms| {mag:e}"
                );
                worst = worst.max(err / mag.max(1e-30));
                err2 += err * err;
                ref2 += dot * dot;
            }
        }
        let rel_rms = (err2 / ref2).sqrt();
        assert!(
            rel_rms < 0.01,
            "{what}: RMS error {rel_rms:e} of the outputs' RMS"
        );
        println!("bf16 gemm {what}: max err/Σ|terms| {worst:.2e}, RMS err/RMS {rel_rms:.2e}");
    };
    let formats = [
        QuantFormat::Q4_0,
        QuantFormat::Q5_0,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ];
    // `(format, m, rows, cols, activation rows checked (all when empty), what)`.
    type Case = (
        QuantFormat,
        usize,
        usize,
        usize,
        &'static [usize],
        &'static str,
    );
    let mut cases: Vec<Case> = Vec::new();
    for fmt in formats {
        cases.push((fmt, 128, 67, 512, &[], ""));
        cases.push((fmt, 300, 257, 1536, &[], ""));
    }
    // A mid-sized matrix (4 Mi values) runs as a GEMM from 16 rows.
    cases.push((QuantFormat::Q4_K, 16, 2048, 2048, &[], " (mid-sized)"));
    // Over the dequantization scratch: 8200 × 8192 values, two chunks of rows.
    cases.push((
        QuantFormat::Q4_K,
        128,
        8200,
        8192,
        &[0, 77, 127],
        " (chunked)",
    ));
    for (fmt, m, rows, cols, check, note) in cases {
        let bytes = random_blocks(&mut rng, fmt, rows * cols / fmt.block_elems());
        let x = gauss(&mut rng, m * cols, 1.0);
        let mat = infer_compute::Matrix::blocks(fmt, &bytes, rows, cols);
        let mut y = infer_compute::Tensor::default();
        b.project(&mat, &up(&x), m, &mut y).expect("project");
        let all: Vec<usize> = (0..m).collect();
        let check = if check.is_empty() { &all[..] } else { check };
        let what = format!("{fmt} m={m} {rows}x{cols}{note}");
        verify(&what, fmt, &bytes, &x, &down(&y), rows, cols, check);
    }
    // Q4_K_M's attention: Q4_K q/k with a Q6_K v, one project_many.
    let (m, cols) = (160, 1024);
    let shapes = [(QuantFormat::Q4_K, 96), (QuantFormat::Q6_K, 33)];
    let ws: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(f, rows)| random_blocks(&mut rng, f, rows * cols / f.block_elems()))
        .collect();
    let x = gauss(&mut rng, m * cols, 1.0);
    let xt = up(&x);
    let mut ys = vec![
        infer_compute::Tensor::default(),
        infer_compute::Tensor::default(),
    ];
    {
        let mut projs: Vec<infer_compute::TensorProj<'_>> = shapes
            .iter()
            .zip(&ws)
            .zip(ys.iter_mut())
            .map(|((&(f, rows), bytes), y)| infer_compute::TensorProj {
                w: infer_compute::Matrix::blocks(f, bytes, rows, cols),
                y,
            })
            .collect();
        b.project_many(&xt, m, &mut projs).expect("project_many");
    }
    let all: Vec<usize> = (0..m).collect();
    for ((&(f, rows), bytes), y) in shapes.iter().zip(&ws).zip(&ys) {
        verify(
            &format!("project_many {f} m={m} {rows}x{cols}"),
            f,
            bytes,
            &x,
            &down(y),
            rows,
            cols,
            &all,
        );
    }
}

/// The whole operations (norms, RoPE, attention, activations, residual, embedding, argmax) of
/// the CUDA backend against the same scalar references as the CPU's (`tests/backend_ops.rs`).
#[test]
#[ignore]
fn cuda_backend_operations_match_scalar_references() {
    common::ops_parity::check_backend_ops(&gpu());
}

/// `x` as a KV cache of type `kv` holds it: f16 rounded to nearest even, or ggml
/// `quantize_row_q8_0_ref` then `dequantize_row_q8_0` (x.len() a multiple of 32).
fn kv_rounded(kv: KvType, x: &[f32]) -> Vec<f32> {
    match kv {
        KvType::F32 => x.to_vec(),
        KvType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        KvType::Q8_0 => {
            let b = infer_quant::quantize(QuantFormat::Q8_0, x, x.len(), None).expect("q8_0");
            infer_quant::dequantize_to_vec(QuantFormat::Q8_0, &b, x.len()).expect("q8_0")
        }
    }
}

use common::ops_parity::{down, kv_slots, up};

/// Attention of `nq` query heads over `nkv` kv heads of `hd` values, scale `hd^-0.5`, no
/// soft-cap or sinks.
fn plain_attention(
    nq: usize,
    nkv: usize,
    hd: usize,
    window: Option<usize>,
) -> AttentionParams<'static> {
    AttentionParams {
        n_q_heads: nq,
        n_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        sliding_window: window,
        softcap: None,
        sinks: None,
    }
}

/// The K/V caches `prior` twice: in `typed`'s KV type, and as f32 tensors of `reference`
/// holding the values that type stores ([`kv_rounded`]).
#[allow(clippy::type_complexity)]
fn typed_and_rounded(
    typed: &CudaBackend,
    reference: &CudaBackend,
    prior: &[(Vec<f32>, Vec<f32>)],
    hd: usize,
) -> (Vec<(Tensor, Tensor)>, Vec<(Tensor, Tensor)>) {
    let kv = typed.kv_type();
    prior
        .iter()
        .map(|(pk, pv)| {
            (
                (kv_tensor(typed, pk, hd), kv_tensor(typed, pv, hd)),
                (
                    up(reference, &kv_rounded(kv, pk)),
                    up(reference, &kv_rounded(kv, pv)),
                ),
            )
        })
        .unzip()
}

/// max |got − want| / (1 + |want|), asserted within 2e-5 (`what` names the case).
fn kv_close(what: &str, got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() as f64 / (1.0 + w.abs() as f64);
        worst = worst.max(err);
        assert!(err <= 2e-5, "{what}: output {i}: got {g}, want {w}");
    }
    worst
}

/// A KV cache tensor of `b` (stored as its KV type) holding `v`.
fn kv_tensor(b: &CudaBackend, v: &[f32], head_dim: usize) -> Tensor {
    let mut t = Tensor::default();
    b.fit_kv(&mut t, v.len(), head_dim).expect("fit_kv");
    b.write_at(v, &mut t, 0).expect("write_at");
    t
}

/// KV caches stored as f16 and q8_0 (`CudaBackend::with_kv_type`, `--kv-type`): `attend` —
/// decode rows (`t_attention`), prompt tiles, and long chunks through cuBLAS (the cache widened
/// to f32 first) — and `rope_attend`'s decode rows (the row's own key and value rounded in the
/// kernel) equal an f32 cache's on the same keys and values rounded on the host as the cache
/// stores them, within 2e-5 · (1 + |want|) (same kernels, f32 sums in the same order but for
/// cuBLAS's); the new rows read back are exactly the rounded values (the kernels' f16 and
/// q8_0 encoders equal the host's, ggml `quantize_row_q8_0_ref`); q8_0 refuses a head_dim that
/// is not a multiple of 32.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn kv_cache_types_equal_f32_on_the_rounded_values() {
    let reference = gpu();
    let mut rng = StdRng::seed_from_u64(21);
    let mut worst = 0f64;
    type Case = (usize, usize, usize, Option<usize>, Vec<(usize, usize)>);
    let cases: [Case; 4] = [
        (8, 2, 64, None, vec![(37, 1), (0, 1), (300, 1)]),
        (8, 2, 128, Some(40), vec![(5, 70), (0, 33)]),
        (8, 2, 64, None, vec![(400, 200)]),
        (4, 1, 128, Some(50), vec![(10, 600)]),
    ];
    for kv in [KvType::F16, KvType::Q8_0] {
        let typed = gpu().with_kv_type(kv);
        assert_eq!(typed.kv_type(), kv);
        for (nq, nkv, hd, window, seqs) in &cases {
            let (nq, nkv, hd) = (*nq, *nkv, *hd);
            let p = plain_attention(nq, nkv, hd, *window);
            let (qd, kvd) = (nq * hd, nkv * hd);
            let rows: usize = seqs.iter().map(|s| s.1).sum();
            let (q, k, v) = (
                gauss(&mut rng, rows * qd, 1.0),
                gauss(&mut rng, rows * kvd, 1.0),
                gauss(&mut rng, rows * kvd, 1.0),
            );
            let prior: Vec<(Vec<f32>, Vec<f32>)> = seqs
                .iter()
                .map(|&(st, n)| {
                    let c = (st + n + 2) * kvd;
                    (gauss(&mut rng, c, 1.0), gauss(&mut rng, c, 1.0))
                })
                .collect();
            let what = format!("{kv} cache, {nq}q/{nkv}kv×{hd} window {window:?} seqs {seqs:?}");
            let run =
                |b: &CudaBackend, caches: &mut Vec<(Tensor, Tensor)>, k: &[f32], v: &[f32]| {
                    let (qt, kt, vt) = (up(b, &q), up(b, k), up(b, v));
                    let mut slots = kv_slots(caches, seqs);
                    let mut a = Attend {
                        q: &qt,
                        k: &kt,
                        v: &vt,
                        seqs: &mut slots,
                    };
                    let mut out = Tensor::default();
                    b.attend(&mut a, &p, &mut out).expect("attend");
                    down(b, &out)
                };
            let (mut tc, mut rc) = typed_and_rounded(&typed, &reference, &prior, hd);
            let got = run(&typed, &mut tc, &k, &v);
            let want = run(
                &reference,
                &mut rc,
                &kv_rounded(kv, &k),
                &kv_rounded(kv, &v),
            );
            worst = worst.max(kv_close(&what, &got, &want));
            let mut row0 = 0;
            for ((kc, vc), &(start, n)) in tc.iter().zip(seqs) {
                let mut back = vec![0f32; n * kvd];
                let rk = kv_rounded(kv, &k[row0 * kvd..(row0 + n) * kvd]);
                typed
                    .read_at(kc, start * kvd, &mut back)
                    .expect("read keys");
                assert_eq!(back, rk, "{what}: stored keys are the rounded keys");
                let rv = kv_rounded(kv, &v[row0 * kvd..(row0 + n) * kvd]);
                typed
                    .read_at(vc, start * kvd, &mut back)
                    .expect("read values");
                assert_eq!(back, rv, "{what}: stored values are the rounded values");
                row0 += n;
            }
        }
        // Decode rows through rope_attend (no norms, no RoPE: the kernel's own key is the
        // input row, rounded as the cache stores it).
        let (nq, nkv, hd) = (8, 2, 128);
        let kvd = nkv * hd;
        let seqs = [(9usize, 1usize), (700, 1)];
        let p = plain_attention(nq, nkv, hd, None);
        let q = gauss(&mut rng, 2 * nq * hd, 1.0);
        let (k, v) = (gauss(&mut rng, 2 * kvd, 1.0), gauss(&mut rng, 2 * kvd, 1.0));
        let prior: Vec<(Vec<f32>, Vec<f32>)> = seqs
            .iter()
            .map(|&(st, _)| {
                (
                    gauss(&mut rng, (st + 2) * kvd, 1.0),
                    gauss(&mut rng, (st + 2) * kvd, 1.0),
                )
            })
            .collect();
        let positions: Vec<usize> = seqs.iter().map(|s| s.0).collect();
        let run = |b: &CudaBackend, caches: &mut Vec<(Tensor, Tensor)>, k: &[f32], v: &[f32]| {
            let (mut qt, mut kt, vt) = (up(b, &q), up(b, k), up(b, v));
            let mut slots = kv_slots(caches, &seqs);
            let mut a = RopeAttend {
                q: &mut qt,
                k: &mut kt,
                v: &vt,
                q_norm: None,
                k_norm: None,
                rope: None,
                positions: &positions,
                seqs: &mut slots,
            };
            let mut out = Tensor::default();
            b.rope_attend(&mut a, &p, &mut out).expect("rope_attend");
            down(b, &out)
        };
        let (mut tc, mut rc) = typed_and_rounded(&typed, &reference, &prior, hd);
        let got = run(&typed, &mut tc, &k, &v);
        let want = run(
            &reference,
            &mut rc,
            &kv_rounded(kv, &k),
            &kv_rounded(kv, &v),
        );
        worst = worst.max(kv_close(
            &format!("{kv} rope_attend decode rows"),
            &got,
            &want,
        ));
        let mut back = vec![0f32; kvd];
        typed
            .read_at(&tc[1].0, seqs[1].0 * kvd, &mut back)
            .expect("read keys");
        assert_eq!(
            back,
            kv_rounded(kv, &k[kvd..]),
            "{kv} rope_attend: stored key"
        );
    }
    let q8 = gpu().with_kv_type(KvType::Q8_0);
    let e = q8
        .fit_kv(&mut Tensor::default(), 4 * 48, 48)
        .expect_err("q8_0 with head_dim 48");
    assert!(e.to_string().contains("head_dim 48"), "{e}");
    println!("parity KV cache types: max |Δ|/(1+|want|) = {worst:.3e} (tolerance 2e-5)");
}
