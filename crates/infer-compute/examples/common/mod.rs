//! What the kernel examples share.

use std::time::Instant;

/// `n` deterministic pseudo-random values in [-0.05, 0.05) (an LCG seeded with `seed`): weights
/// and activations of a plausible scale.
pub fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

/// Best time per call of `f` over 5 batches of about `batch_s` seconds each, in seconds (one
/// warm-up call first).
#[allow(dead_code)] // interleaved_q4_0 times rotating copies its own way
pub fn best_time(batch_s: f64, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((batch_s / once) as usize).clamp(1, 10_000);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}
