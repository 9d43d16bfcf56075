//! Criterion benchmarks of the CPU kernels, reported in decimal GB/s of weight (or KV-cache)
//! bytes read per call (`Throughput::BytesDecimal`): `cargo bench -p infer-compute` (filter with
//! e.g. `cargo bench -p infer-compute -- quant_matvec/Q4_K`; set `RAYON_NUM_THREADS` to pin
//! threads).
//!
//! Shapes are `rows × cols` (out × in) of the real models' FFN projections:
//! SmolLM2-135M (hidden 576, intermediate 1536): gate/up 1536×576, down 576×1536;
//! Gemma-3-270M (hidden 640, intermediate 2048): gate/up 2048×640, down 640×2048.
//! K-quants (256-value blocks) run only where `cols` is a multiple of 256 (the down
//! projections); the gate/up shapes use Q4_0/Q5_0/Q8_0 as the vindex does.
//! Weights are random f32 rows quantized with `infer_quant::quantize` (reference quantizers).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use infer_compute::{
    attention, Attend, AttentionParams, ComputeBackend, CpuBackend, KvSlot, QuantFormat, Tensor,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

/// `(name, rows, cols)` of the benchmarked weight matrices.
const GATE_UP: [(&str, usize, usize); 2] =
    [("smollm2_gate", 1536, 576), ("gemma3_gate", 2048, 640)];
const DOWN: [(&str, usize, usize); 2] = [("smollm2_down", 576, 1536), ("gemma3_down", 640, 2048)];

/// `n` uniform values in `[-scale, scale)` from a fixed seed.
fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// `rows × cols` random weights quantized to `format`.
fn quantized(format: QuantFormat, rows: usize, cols: usize) -> Vec<u8> {
    let w = random(rows * cols, 1, 0.05);
    infer_quant::quantize(format, &w, cols, None).expect("quantize benchmark weights")
}

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g
}

fn bench_quant_matvec(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut g = configure(c, "quant_matvec");
    let mut cases: Vec<(QuantFormat, &str, usize, usize)> = Vec::new();
    for &(name, rows, cols) in &DOWN {
        for f in [QuantFormat::Q4_K, QuantFormat::Q6_K] {
            cases.push((f, name, rows, cols));
        }
    }
    for &(name, rows, cols) in GATE_UP.iter().chain(&DOWN) {
        for f in [QuantFormat::Q4_0, QuantFormat::Q5_0, QuantFormat::Q8_0] {
            cases.push((f, name, rows, cols));
        }
    }
    for (format, name, rows, cols) in cases {
        let bytes = quantized(format, rows, cols);
        let x = random(cols, 2, 1.0);
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::BytesDecimal(bytes.len() as u64));
        let id = BenchmarkId::new(format.name(), format!("{name}_{rows}x{cols}"));
        g.bench_function(id, |b| {
            b.iter(|| {
                be.linear(
                    &infer_compute::Matrix::blocks(format, black_box(&bytes), rows, cols),
                    black_box(&x),
                    1,
                    &mut y,
                )
                .expect("quant_matvec")
            })
        });
    }
    g.finish();
}

fn bench_quant_matmul(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut g = configure(c, "quant_matmul");
    let m = 64;
    let cases = [
        (QuantFormat::Q4_K, DOWN[1]),
        (QuantFormat::Q5_0, GATE_UP[1]),
    ];
    for (format, (name, rows, cols)) in cases {
        let bytes = quantized(format, rows, cols);
        let x = random(m * cols, 3, 1.0);
        let mut y = vec![0f32; m * rows];
        g.throughput(Throughput::BytesDecimal(bytes.len() as u64));
        let id = BenchmarkId::new(format.name(), format!("{name}_{rows}x{cols}_m{m}"));
        g.bench_function(id, |b| {
            b.iter(|| {
                be.linear(
                    &infer_compute::Matrix::blocks(format, black_box(&bytes), rows, cols),
                    black_box(&x),
                    m,
                    &mut y,
                )
                .expect("quant_matmul")
            })
        });
    }
    g.finish();
}

fn bench_f32(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut g = configure(c, "f32");
    let (name, n, k) = GATE_UP[0];
    let w = random(n * k, 1, 0.05);
    g.throughput(Throughput::BytesDecimal((w.len() * 4) as u64));

    let x = random(k, 2, 1.0);
    let mut y = vec![0f32; n];
    g.bench_function(BenchmarkId::new("gemv", format!("{name}_{n}x{k}")), |b| {
        b.iter(|| be.gemv(black_box(&w), black_box(&x), n, k, &mut y))
    });

    let m = 64;
    let a = random(m * k, 3, 1.0);
    let mut out = vec![0f32; m * n];
    let id = BenchmarkId::new("matmul_transb", format!("{name}_{n}x{k}_m{m}"));
    g.bench_function(id, |b| {
        b.iter(|| be.matmul_transb(black_box(&a), black_box(&w), m, k, n, &mut out))
    });
    g.finish();
}

fn bench_q8_split(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut g = configure(c, "q8_matmul");
    // SmolLM2 q_proj / o_proj: 576×576, one token.
    let (rows, cols, m) = (576, 576, 1);
    let mut rng = StdRng::seed_from_u64(4);
    let values: Vec<u8> = (0..rows * cols).map(|_| rng.gen::<u8>()).collect();
    let scales = random(rows * cols / 32, 5, 0.001);
    let x = random(m * cols, 6, 1.0);
    let mut y = vec![0f32; m * rows];
    g.throughput(Throughput::BytesDecimal(
        (values.len() + scales.len() * 4) as u64,
    ));
    let id = BenchmarkId::new("q8_split", format!("smollm2_q_{rows}x{cols}_m{m}"));
    g.bench_function(id, |b| {
        b.iter(|| {
            be.linear(
                &infer_compute::Matrix::split_q8(
                    black_box(&values),
                    black_box(&scales),
                    rows,
                    cols,
                ),
                black_box(&x),
                m,
                &mut y,
            )
            .expect("q8_matmul")
        })
    });
    g.finish();
}

/// SmolLM2-135M's attention: 9 query heads, 3 kv heads of 64 values.
fn smollm2_attention() -> AttentionParams<'static> {
    AttentionParams {
        n_q_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        scale: 1.0 / 8.0,
        sliding_window: None,
        softcap: None,
        sinks: None,
    }
}

fn bench_attention(c: &mut Criterion) {
    let mut g = configure(c, "attention");
    // SmolLM2-135M geometry: one decode step at position 511 over 512 cached positions.
    let params = smollm2_attention();
    let t_kv = 512;
    let kv_row = params.n_kv_heads * params.head_dim;
    let q = random(params.n_q_heads * params.head_dim, 7, 1.0);
    let k = random(t_kv * kv_row, 8, 1.0);
    let v = random(t_kv * kv_row, 9, 1.0);
    let mut out = vec![0f32; q.len()];
    let pos = [t_kv - 1];
    // Bytes of K and V cache read per step.
    g.throughput(Throughput::BytesDecimal((2 * t_kv * kv_row * 4) as u64));
    let id = BenchmarkId::new("decode", format!("h9_kv3_d64_t{t_kv}"));
    g.bench_function(id, |b| {
        b.iter(|| {
            attention(
                black_box(&q),
                black_box(&k),
                black_box(&v),
                &pos,
                t_kv,
                &params,
                &mut out,
            )
        })
    });
    bench_batched_decode_attention(&mut g);
    g.finish();
}

/// One batched decode step's attention as `infer bench -B 16` runs it on SmolLM2-135M (30
/// layers; per layer one [`ComputeBackend::attend`] of 16 sequences, each a new row at position
/// 159 over its own f16 cache of 256 positions): 59 MB of cache read per step, more than a
/// 32 MiB L3, so the rows come from memory as in the real step.
fn bench_batched_decode_attention(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    let (layers, seqs, pos, capacity) = (30usize, 16usize, 159usize, 256usize);
    let params = smollm2_attention();
    let q_row = params.n_q_heads * params.head_dim;
    let kv_row = params.n_kv_heads * params.head_dim;
    let mut caches: Vec<Vec<(Tensor, Tensor)>> = (0..layers)
        .map(|l| {
            (0..seqs)
                .map(|s| {
                    let seed = 100 + 2 * (l * seqs + s) as u64;
                    let cache = |seed| {
                        let mut t = Tensor::host_f16_zeros(capacity * kv_row);
                        let values = random(pos * kv_row, seed, 1.0);
                        let dst = t.host_f16_mut().expect("host f16 cache");
                        for (d, &x) in dst.iter_mut().zip(&values) {
                            *d = half::f16::from_f32(x);
                        }
                        t
                    };
                    (cache(seed), cache(seed + 1))
                })
                .collect()
        })
        .collect();
    let q = Tensor::host_from(random(seqs * q_row, 10, 1.0));
    let k = Tensor::host_from(random(seqs * kv_row, 11, 1.0));
    let v = Tensor::host_from(random(seqs * kv_row, 12, 1.0));
    let mut out = Tensor::default();
    let backend = CpuBackend::new();
    // Bytes of K and V cache read per step.
    let bytes = layers * seqs * (pos + 1) * kv_row * 2 * 2;
    g.throughput(Throughput::BytesDecimal(bytes as u64));
    let id = BenchmarkId::new(
        "decode_batch",
        format!("b{seqs}_l{layers}_h9_kv3_d64_t{}_f16", pos + 1),
    );
    g.bench_function(id, |b| {
        b.iter(|| {
            for layer in caches.iter_mut() {
                let mut slots: Vec<KvSlot<'_>> = layer
                    .iter_mut()
                    .enumerate()
                    .map(|(s, (kc, vc))| KvSlot {
                        k_cache: kc,
                        v_cache: vc,
                        row0: s,
                        rows: 1,
                        start: pos,
                    })
                    .collect();
                let mut a = Attend {
                    q: &q,
                    k: &k,
                    v: &v,
                    seqs: &mut slots,
                };
                backend.attend(&mut a, &params, &mut out).expect("attend");
            }
            black_box(&out);
        })
    });
}

criterion_group!(
    kernels,
    bench_quant_matvec,
    bench_quant_matmul,
    bench_f32,
    bench_q8_split,
    bench_attention
);
criterion_main!(kernels);
