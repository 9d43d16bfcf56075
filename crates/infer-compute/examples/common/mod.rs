//! What the kernel examples share.

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
