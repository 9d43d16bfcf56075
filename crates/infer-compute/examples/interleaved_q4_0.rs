//! Q4_0 against Q4_0x16 (the same blocks re-laid sixteen rows per group, as `infer extract
//! --q4-layout x16` stores them) through the backend's products: one activation row (decode)
//! and 512 (a prompt) against a Q4_0 matrix, same integers and same f32 sequence, so the
//! outputs must be equal bit for bit. Whatever the CPU takes (AVX-512 VNNI, AVX2); matrices
//! rotated past the caches:
//! `RAYON_NUM_THREADS=1 cargo run --release -p infer-compute --example interleaved_q4_0`.

mod common;

use common::fill;
use infer_compute::{ComputeBackend, CpuBackend, Matrix, QuantFormat};
use std::time::Instant;

/// Best time per call over 5 rounds of `4 n` calls (call `i` gets `i`), seconds.
fn best_time(mut f: impl FnMut(usize), n: usize) -> f64 {
    (0..n).for_each(&mut f);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        (0..4 * n).for_each(&mut f);
        best = best.min(t.elapsed().as_secs_f64() / (4 * n) as f64);
    }
    best
}

fn main() {
    let be = CpuBackend::new();
    // (rows, cols, copies, activation rows): Llama-3.2-1B-like, SmolLM2's output matrix, its
    // FFN gate and down; one and 512 activation rows.
    for (rows, cols, copies, m) in [
        (4096usize, 4096usize, 8usize, 1usize),
        (49152, 576, 6, 1),
        (1536, 576, 64, 1),
        (576, 1536, 64, 1),
        (1536, 576, 2, 512),
        (576, 1536, 2, 512),
    ] {
        let q = infer_quant::quantize(QuantFormat::Q4_0, &fill(rows * cols, 1), cols, None)
            .expect("q4_0");
        let x16 = infer_quant::interleave::from_rows(QuantFormat::Q4_0x16, &q, rows, cols)
            .expect("re-lay");
        let plain: Vec<Vec<u8>> = vec![q.clone(); copies];
        let packed: Vec<Vec<u8>> = vec![x16; copies];
        let x = fill(m * cols, 2);
        let (mut y_plain, mut y_packed) = (vec![0f32; m * rows], vec![0f32; m * rows]);
        let time = |f: QuantFormat, ws: &[Vec<u8>], y: &mut [f32]| {
            best_time(
                |i| {
                    let w = Matrix::blocks(f, &ws[i % copies], rows, cols);
                    be.linear(&w, &x, m, y).expect("linear");
                },
                copies,
            )
        };
        let t_plain = time(QuantFormat::Q4_0, &plain, &mut y_plain);
        let t_packed = time(QuantFormat::Q4_0x16, &packed, &mut y_packed);
        let equal = y_plain
            .iter()
            .zip(&y_packed)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        let gbs = |t: f64| q.len() as f64 / t / 1e9;
        println!(
            "Q4_0 {rows:>5} x {cols:<5} m={m:<3} Q4_0 {:>8.1} us {:>5.1} GB/s | Q4_0x16 {:>8.1} us {:>5.1} GB/s ({:.2}x) | bit-equal {equal}/{}",
            t_plain * 1e6,
            gbs(t_plain),
            t_packed * 1e6,
            gbs(t_packed),
            t_plain / t_packed,
            m * rows,
        );
    }
}
