//! Throughput of the quantized mat-vec / mat-mul kernels, in GB/s of weight bytes read:
//! `RAYON_NUM_THREADS=1 cargo run --release -p infer-compute --example quant_speed`
//! (and `=2`, …). Shapes are `rows × cols` (out × in); Gemma-3-270M's FFN down projection is
//! Q4_K 640×2048, its gate/up projections (640 columns, not a multiple of 256) are Q5_0 2048×640.

mod common;

use common::fill;
use infer_compute::{ComputeBackend, CpuBackend, Isa, QuantFormat};

fn main() {
    let threads = rayon::current_num_threads();
    println!(
        "rayon threads: {threads} (set RAYON_NUM_THREADS), best ISA: {:?}",
        Isa::best()
    );
    let shapes: &[(QuantFormat, usize, usize)] = &[
        (QuantFormat::Q4_K, 640, 2048),
        (QuantFormat::Q4_K, 4096, 4096),
        (QuantFormat::Q6_K, 4096, 4096),
        (QuantFormat::Q5_0, 2048, 640),
        (QuantFormat::Q4_0, 4096, 4096),
        (QuantFormat::Q8_0, 4096, 4096),
        (QuantFormat::Q5_K, 4096, 4096),
    ];
    let mut isas = vec![Isa::best()];
    if Isa::best() != Isa::Generic {
        isas.push(Isa::Generic);
    }
    for &(fmt, rows, cols) in shapes {
        let w = fill(rows * cols, 1);
        let bytes = infer_quant::quantize(fmt, &w, cols, None).expect("quantize");
        let x = fill(cols, 2);
        let mut y = vec![0f32; rows];
        for &isa in &isas {
            let be = CpuBackend::with_isa(isa).expect("isa");
            let s = common::best_time(0.1, || {
                be.linear(
                    &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                    &x,
                    1,
                    &mut y,
                )
                .expect("matvec")
            });
            println!(
                "matvec {fmt:<5} {rows:>5}x{cols:<5} {isa:<8?} {:>8.1} us  {:>6.2} GB/s",
                s * 1e6,
                bytes.len() as f64 / s / 1e9
            );
        }
        // Prefill: 32 activation rows.
        let m = 32;
        let xm = fill(m * cols, 3);
        let mut ym = vec![0f32; m * rows];
        let be = CpuBackend::new();
        let s = common::best_time(0.1, || {
            be.linear(
                &infer_compute::Matrix::blocks(fmt, &bytes, rows, cols),
                &xm,
                m,
                &mut ym,
            )
            .expect("matmul")
        });
        println!(
            "matmul {fmt:<5} {rows:>5}x{cols:<5} m={m} {:>8.1} us  {:>6.1} GFLOP/s",
            s * 1e6,
            2.0 * (m * rows * cols) as f64 / s / 1e9
        );
    }
    // f32 gemv on the same 4096x4096 shape, for scale.
    let (rows, cols) = (4096, 4096);
    let w = fill(rows * cols, 1);
    let x = fill(cols, 2);
    let mut y = vec![0f32; rows];
    let be = CpuBackend::new();
    let s = common::best_time(0.1, || be.gemv(&w, &x, rows, cols, &mut y).unwrap());
    println!(
        "gemv   F32   {rows:>5}x{cols:<5}          {:>8.1} us  {:>6.2} GB/s",
        s * 1e6,
        (rows * cols * 4) as f64 / s / 1e9
    );
}
