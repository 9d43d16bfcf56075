//! Rough throughput of the CPU kernels on SmolLM2-135M-sized shapes:
//! `cargo run --release -p infer-compute --example kernel_speed`.

use infer_compute::{attention, AttentionParams, ComputeBackend, CpuBackend};
use std::time::Instant;

fn time(what: &str, flops: f64, reps: usize, mut f: impl FnMut()) {
    f();
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    let s = t.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{what:<40} {:>9.3} ms  {:>7.2} GFLOP/s",
        s * 1e3,
        flops / s / 1e9
    );
}

fn main() {
    let be = CpuBackend::new();
    let fill = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    };
    for &(n, k) in &[(1536usize, 576usize), (576, 1536), (49152, 576)] {
        let b = fill(n * k);
        let x = fill(k);
        let mut y = vec![0f32; n];
        time(
            &format!("gemv n={n} k={k}"),
            2.0 * (n * k) as f64,
            50,
            || be.gemv(&b, &x, n, k, &mut y).unwrap(),
        );
    }
    {
        let (k, n) = (1536usize, 576usize);
        let b = fill(k * n);
        let x = fill(k);
        let mut y = vec![0f32; n];
        time(
            &format!("matmul (plain B) m=1 n={n} k={k}"),
            2.0 * (n * k) as f64,
            50,
            || be.matmul(&x, &b, 1, k, n, &mut y).unwrap(),
        );
        let mut c = vec![0f32; 64 * n];
        let a = fill(64 * k);
        time(
            &format!("matmul (plain B) m=64 n={n} k={k}"),
            2.0 * (64 * n * k) as f64,
            20,
            || be.matmul(&a, &b, 64, k, n, &mut c).unwrap(),
        );
    }
    for &(m, n, k) in &[
        (64usize, 1536usize, 576usize),
        (64, 576, 1536),
        (256, 576, 576),
    ] {
        let a = fill(m * k);
        let b = fill(n * k);
        let mut c = vec![0f32; m * n];
        time(
            &format!("matmul m={m} n={n} k={k}"),
            2.0 * (m * n * k) as f64,
            20,
            || be.matmul_transb(&a, &b, m, k, n, &mut c).unwrap(),
        );
    }
    let p = AttentionParams {
        n_q_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        sliding_window: None,
        softcap: None,
        sinks: None,
    };
    for &(t_q, t_kv) in &[(1usize, 1024usize), (256, 256)] {
        let q = fill(t_q * 9 * 64);
        let kv = fill(t_kv * 3 * 64);
        let pos: Vec<usize> = (t_kv - t_q..t_kv).collect();
        let mut out = vec![0f32; q.len()];
        time(
            &format!("attention t_q={t_q} t_kv={t_kv}"),
            4.0 * (t_q * 9 * t_kv * 64) as f64,
            20,
            || attention(&q, &kv, &kv, &pos, t_kv, &p, &mut out),
        );
    }
}
