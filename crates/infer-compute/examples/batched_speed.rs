//! Throughput of the quantized products at batched-decode shapes (SmolLM2-135M Q4_K_M:
//! Q5_0 / Q8_0 matrices of 576 columns, the Q4_K / Q6_K FFN down projection of 1536 columns,
//! the Q8_0 tied output projection), for 1, 4, 16 and 64 activation rows, in GMAC/s
//! (multiply-adds of weight × activation values per second, activation quantization
//! included): `RAYON_NUM_THREADS=2 cargo run --release -p infer-compute --example batched_speed`.

mod common;

use common::fill;
use infer_compute::{ComputeBackend, CpuBackend, Matrix, QuantFormat};

fn main() {
    println!("rayon threads: {}", rayon::current_num_threads());
    let shapes: &[(QuantFormat, usize, usize)] = &[
        (QuantFormat::Q5_0, 1536, 576),
        (QuantFormat::Q5_0, 576, 576),
        (QuantFormat::Q8_0, 192, 576),
        (QuantFormat::Q4_K, 576, 1536),
        (QuantFormat::Q6_K, 576, 1536),
        (QuantFormat::Q8_0, 49152, 576),
    ];
    let be = CpuBackend::new();
    for &(fmt, rows, cols) in shapes {
        let w = fill(rows * cols, 1);
        let bytes = infer_quant::quantize(fmt, &w, cols, None).expect("quantize");
        let mat = Matrix::blocks(fmt, &bytes, rows, cols);
        let mut line = format!("{fmt:<5} {rows:>5}x{cols:<5}");
        for m in [1usize, 4, 16, 64] {
            let x = fill(m * cols, 3);
            let mut y = vec![0f32; m * rows];
            let s = common::best_time(0.05, || be.linear(&mat, &x, m, &mut y).expect("product"));
            line += &format!(
                "  m={m:<2} {:>8.1} us {:>6.1} GMAC/s",
                s * 1e6,
                (m * rows * cols) as f64 / s / 1e9
            );
        }
        println!("{line}");
    }
}
