//! Kernel benchmark of the CUDA backend (not a correctness test; `#[ignore]`d, run by
//! `scripts/gpu-check.sh`): device time of one quantized mat-vec kernel (activations quantized
//! before; weights resident, rotated among copies larger than the L2 cache) per format
//! at the real models' shapes, as GB/s of weight bytes, next to the device copy bandwidth
//! (read + write, the memory floor) and the empty-launch time (the launch floor).
//!
//! Prints one line per case and a table last. Random weights with finite scales (speed does not
//! depend on the values).

#![cfg(feature = "cuda")]

use infer_compute::cuda::CudaBackend;
use infer_compute::{ComputeBackend, Matrix, QuantFormat};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random_blocks(rng: &mut StdRng, fmt: QuantFormat, n_blocks: usize) -> Vec<u8> {
    let bb = fmt.block_bytes();
    let mut out = vec![0u8; n_blocks * bb];
    rng.fill(&mut out[..]);
    let fields: &[usize] = match fmt {
        QuantFormat::Q4_K => &[0, 2],
        QuantFormat::Q6_K => &[208],
        _ => &[0],
    };
    for b in out.chunks_exact_mut(bb) {
        for &o in fields {
            let v: f32 = rng.gen_range(-2.0f32..2.0);
            b[o..o + 2].copy_from_slice(&infer_quant::float16::f32_to_f16(v).to_le_bytes());
        }
    }
    out
}

/// `(format, rows, cols, what)`: SmolLM2-135M and Gemma-3-270m matrices in the formats the
/// vindex stores them in (rows of 576 / 640 values cannot hold K-quant blocks: Q5_0 / Q8_0),
/// plus one large matrix per format for the bandwidth ceiling.
const CASES: &[(QuantFormat, usize, usize, &str)] = &[
    (QuantFormat::Q5_0, 576, 576, "smollm2 q/o"),
    (QuantFormat::Q5_0, 1536, 576, "smollm2 gate/up"),
    (QuantFormat::Q4_K, 576, 1536, "smollm2 down"),
    (QuantFormat::Q6_K, 576, 1536, "smollm2 down"),
    (QuantFormat::Q8_0, 576, 576, "smollm2 v (q8_0)"),
    (QuantFormat::Q4_0, 49152, 576, "smollm2 lm_head"),
    (QuantFormat::Q8_0, 49152, 576, "smollm2 lm_head"),
    (QuantFormat::Q5_0, 2048, 640, "gemma3 gate/up"),
    (QuantFormat::Q4_K, 640, 2048, "gemma3 down"),
    (QuantFormat::Q6_K, 640, 2048, "gemma3 down"),
    (QuantFormat::Q4_0, 2048, 640, "gemma3 gate/up"),
    (QuantFormat::Q4_0, 16384, 4096, "large"),
    (QuantFormat::Q5_0, 16384, 4096, "large"),
    (QuantFormat::Q8_0, 16384, 4096, "large"),
    (QuantFormat::Q4_K, 16384, 4096, "large"),
    (QuantFormat::Q6_K, 16384, 4096, "large"),
    // Llama-3.1-8B in a Q4_K_M file (issue 16's decode target: >= 70% of the copy bandwidth).
    (QuantFormat::Q4_K, 4096, 4096, "8b q/o"),
    (QuantFormat::Q4_K, 14336, 4096, "8b gate/up"),
    (QuantFormat::Q4_K, 4096, 14336, "8b down (q4_k)"),
    (QuantFormat::Q6_K, 4096, 14336, "8b down (q6_k)"),
    (QuantFormat::Q6_K, 128256, 4096, "8b lm_head"),
];

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn kernel_bandwidth_table() {
    let gpu = CudaBackend::new(0)
        .unwrap_or_else(|e| panic!("the CUDA benchmark needs a CUDA device: {e}"));
    println!("device: {}", gpu.name());
    let copy = gpu.time_copy(1 << 30, 20).expect("copy timing");
    let launch = gpu.time_empty_launch(2000).expect("launch timing");
    let graph_launch = gpu.time_graph_launch(256).expect("graph launch timing");
    let mut rng = StdRng::seed_from_u64(1);
    let mut table = Vec::new();
    for &(fmt, rows, cols, what) in CASES {
        let bytes = random_blocks(&mut rng, fmt, rows * cols / fmt.block_elems());
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let iters = (2_000_000_000 / bytes.len()).clamp(20, 2000);
        let w = Matrix::blocks(fmt, &bytes, rows, cols);
        let time = |fused| {
            gpu.time_quant_matvec(&w, &x, fused, iters)
                .unwrap_or_else(|e| panic!("{fmt} {rows}x{cols}: {e}"))
        };
        let (single, fused) = (time(false), time(true));
        let line = format!(
            "{:<6} {:>6}x{:<5} {:<18} {:>9.3} MB  single {:>8.2} us {:>7.1} GB/s {:>5.1}%  decoder {:>8.2} us {:>7.1} GB/s {:>5.1}% of copy",
            fmt.name(),
            rows,
            cols,
            what,
            bytes.len() as f64 / 1e6,
            single.seconds * 1e6,
            single.gb_per_s(),
            100.0 * single.gb_per_s() / copy.gb_per_s(),
            fused.seconds * 1e6,
            fused.gb_per_s(),
            100.0 * fused.gb_per_s() / copy.gb_per_s()
        );
        table.push(line);
    }
    println!();
    println!("== CUDA quantized mat-vec (m = 1, the kernel alone, device time: the single product's, and the decode step's dec_mv_multi) ==");
    println!(
        "device copy bandwidth (1 GiB dtod, read+write): {:.0} GB/s; empty launch: {:.2} us; \
         empty kernel in a PDL graph: {:.2} us",
        copy.gb_per_s(),
        launch * 1e6,
        graph_launch * 1e6
    );
    for l in &table {
        println!("{l}");
    }
    product_paths(&gpu, &mut rng);
}

/// `(format, rows, cols, what)`: the Llama-3.1-8B products of a Q4_K_M file, and the small
/// models' largest, for the tiles vs dequantize + cuBLAS table.
const PRODUCT_CASES: &[(QuantFormat, usize, usize, &str)] = &[
    (QuantFormat::Q4_K, 4096, 4096, "8b q/o"),
    (QuantFormat::Q4_K, 1024, 4096, "8b k"),
    (QuantFormat::Q6_K, 1024, 4096, "8b v"),
    (QuantFormat::Q4_K, 14336, 4096, "8b gate/up"),
    (QuantFormat::Q6_K, 4096, 14336, "8b down"),
    (QuantFormat::Q5_0, 1536, 576, "smollm2 gate/up"),
    (QuantFormat::Q5_0, 2048, 640, "gemma3 gate/up"),
];
/// Activation rows of the table: batched decode sizes and prompt chunks.
const PRODUCT_MS: &[usize] = &[4, 8, 16, 32, 64, 128, 256, 512, 2048];

/// Device time of each many-row product on the tensor-core tiles (`mmq_*`) and as dequantize
/// + cuBLAS bf16 GEMM, with the GEMM's rate (TFLOP/s): where the forward pass should switch.
fn product_paths(gpu: &CudaBackend, rng: &mut StdRng) {
    let mut lines = Vec::new();
    for &(fmt, rows, cols, what) in PRODUCT_CASES {
        let bytes = random_blocks(rng, fmt, rows * cols / fmt.block_elems());
        for &m in PRODUCT_MS {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let w = Matrix::blocks(fmt, &bytes, rows, cols);
            let time = |gemm: bool| {
                gpu.time_quant_product(&w, &x, m, gemm, 20)
                    .unwrap_or_else(|e| panic!("{fmt} {rows}x{cols} m={m} gemm={gemm}: {e}"))
                    .seconds
            };
            let (tiles, gemm) = (time(false), time(true));
            let flop = 2.0 * (m * rows * cols) as f64;
            lines.push(format!(
                "{:<6} {:>6}x{:<6} {:<16} m={:<5} tiles {:>9.1} us ({:>6.1} TFLOP/s)  gemm {:>9.1} us ({:>6.1} TFLOP/s)  tiles/gemm {:>5.2}",
                fmt.name(),
                rows,
                cols,
                what,
                m,
                tiles * 1e6,
                flop / tiles / 1e12,
                gemm * 1e6,
                flop / gemm / 1e12,
                tiles / gemm
            ));
        }
    }
    println!();
    println!(
        "== CUDA many-row products: tensor-core tiles vs dequantize + cuBLAS bf16 (device time) =="
    );
    for l in &lines {
        println!("{l}");
    }
}
