//! Seeded random tensor values for `infer synth`, reproducible row by row.
//!
//! Every row of every tensor has its own generator, seeded from `(seed, tensor index, row)`
//! ([`row_key`]: SplitMix64 mixing), so the values do not depend on threads or chunking: float
//! values come from rand 0.8 `StdRng` ([`RowFill`]), the random bytes of `--random-blocks`
//! ([`super::blocks`]) from SplitMix64 itself ([`stream_bytes`]).

use anyhow::Context;
use infer_quant::QuantFormat;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// Half-width of the uniform noise around a norm weight's centre.
pub const NORM_NOISE: f32 = 0.05;
/// Half-width of the uniform values of a 1-D tensor that is not a norm weight (biases).
pub const BIAS_RANGE: f32 = 0.02;
/// Standard deviation of the normal values of matrices.
pub const MATRIX_STD: f32 = 0.02;

/// What kind of values a tensor gets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    /// Norm weight: `centre ± NORM_NOISE` (uniform). The centre is 1.0, or 0.0 for HF
    /// checkpoints of families whose norms are applied as `1 + w` (Gemma).
    Norm(f32),
    /// Bias or other 1-D tensor: uniform in `±BIAS_RANGE`.
    Bias,
    /// Matrix (2-D or more): normal, mean 0, standard deviation `MATRIX_STD`.
    Matrix,
}

impl Fill {
    /// The fill of a tensor named `name` with `n_dims` dimensions: matrices for ≥ 2-D; for 1-D,
    /// a `*.bias` is [`Fill::Bias`], a name containing `norm` is [`Fill::Norm`]`(norm_centre)`,
    /// anything else [`Fill::Bias`].
    pub fn for_tensor(name: &str, n_dims: usize, norm_centre: f32) -> Fill {
        if n_dims >= 2 {
            Fill::Matrix
        } else if !name.ends_with(".bias") && name.contains("norm") {
            Fill::Norm(norm_centre)
        } else {
            Fill::Bias
        }
    }
}

/// SplitMix64's increment (Steele et al., "Fast splittable pseudorandom number generators").
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's step and finaliser (Steele et al.): the output of the state `z` (before its
/// increment). Decorrelates the per-row seeds and is the byte generator of [`stream_bytes`].
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of row `row` of tensor number `tensor` under `seed`: every generator of that row
/// ([`RowFill`], [`stream_bytes`]) starts from it.
pub fn row_key(seed: u64, tensor: u64, row: u64) -> u64 {
    mix(mix(mix(seed) ^ tensor) ^ row)
}

/// Fill `out` with bytes `start .. start + out.len()` of the random byte stream of `key`:
/// SplitMix64 started at state `key`, its 64-bit outputs laid out little-endian. Word `i` is
/// computed from `key` and `i` alone, so any piece of the stream is drawn on its own, with the
/// bytes of the whole stream at its place.
pub fn stream_bytes(key: u64, start: u64, out: &mut [u8]) {
    let word = |i: u64| mix(key.wrapping_add(i.wrapping_mul(GAMMA))).to_le_bytes();
    let mut i = start / 8;
    let skip = (start % 8) as usize;
    let head = out.len().min((8 - skip) % 8);
    let (head_bytes, rest) = out.split_at_mut(head);
    if head > 0 {
        head_bytes.copy_from_slice(&word(i)[skip..skip + head]);
        i += 1;
    }
    let mut words = rest.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&word(i));
        i += 1;
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&word(i)[..n]);
    }
}

/// A row's value generator that can be drawn in pieces, so a row of any length is produced
/// without holding it whole: drawing a row in pieces of even length (the last may be odd) gives
/// exactly the values of one [`fill_row`] call over the whole row.
pub struct RowFill {
    rng: StdRng,
    fill: Fill,
}

impl RowFill {
    /// The generator of row `row` of tensor number `tensor`, deterministic in
    /// `(seed, tensor, row)`.
    pub fn new(seed: u64, tensor: u64, row: u64, fill: Fill) -> RowFill {
        RowFill {
            rng: StdRng::seed_from_u64(row_key(seed, tensor, row)),
            fill,
        }
    }

    /// Fill `out` with the next `out.len()` values of the row (keep every piece but the last of
    /// even length: matrices draw normal values in Box–Muller pairs).
    pub fn next_values(&mut self, out: &mut [f32]) {
        let rng = &mut self.rng;
        match self.fill {
            Fill::Norm(c) => out
                .iter_mut()
                .for_each(|v| *v = c + rng.gen_range(-NORM_NOISE..=NORM_NOISE)),
            Fill::Bias => out
                .iter_mut()
                .for_each(|v| *v = rng.gen_range(-BIAS_RANGE..=BIAS_RANGE)),
            Fill::Matrix => {
                // Box–Muller: two independent N(0, 1) per pair of uniforms.
                for pair in out.chunks_mut(2) {
                    let u1: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
                    let u2: f64 = rng.gen();
                    let r = (-2.0 * u1.ln()).sqrt();
                    let t = std::f64::consts::TAU * u2;
                    pair[0] = (r * t.cos()) as f32 * MATRIX_STD;
                    if let Some(v) = pair.get_mut(1) {
                        *v = (r * t.sin()) as f32 * MATRIX_STD;
                    }
                }
            }
        }
    }
}

/// Fill `out` (one whole row of tensor number `tensor`) with values of kind `fill`,
/// deterministic in `(seed, tensor, row)`.
pub fn fill_row(seed: u64, tensor: u64, row: u64, fill: Fill, out: &mut [f32]) {
    RowFill::new(seed, tensor, row, fill).next_values(out);
}

/// At most this many values are generated at a time (16 MiB of f32), so memory stays bounded
/// whatever the shapes (Gemma-3's 262144 × 640 embedding included).
pub const CHUNK_VALUES: usize = 1 << 22;

/// One tensor of random data: tensor number `index` (its generators' key, with the seed),
/// `rows` rows of `row_len` values drawn as `fill`, stored in `format`; `name` names it in
/// errors.
#[derive(Clone, Copy, Debug)]
pub struct RandomTensor<'a> {
    pub name: &'a str,
    pub index: usize,
    pub format: QuantFormat,
    pub fill: Fill,
    pub rows: usize,
    /// Values per row (the innermost dimension).
    pub row_len: usize,
}

/// Stream the random data of `tensor` under `seed`, encoded in its format by
/// `infer_quant::quantize` (ggml's reference quantizer, or the plain F32 / BF16 bytes), into
/// `sink`, generating at most `chunk` values at a time (`chunk`: an even multiple of the
/// format's block size). Rows up to `chunk` values are generated several at a time in parallel;
/// a longer row is generated and encoded piece by piece (the reference quantizers work block by
/// block, so the bytes are those of the whole row).
pub fn stream_tensor(
    tensor: &RandomTensor<'_>,
    seed: u64,
    chunk: usize,
    sink: &mut dyn FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let &RandomTensor {
        name,
        index,
        format,
        fill,
        rows,
        row_len,
    } = tensor;
    let encode = |v: &[f32]| {
        infer_quant::quantize(format, v, v.len(), None)
            .with_context(|| format!("quantizing tensor '{name}' to {format}"))
    };
    if row_len <= chunk {
        let step = (chunk / row_len.max(1)).max(1);
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + step).min(rows);
            let blocks: Vec<Vec<u8>> = (r0..r1)
                .into_par_iter()
                .map(|r| {
                    let mut v = vec![0.0f32; row_len];
                    fill_row(seed, index as u64, r as u64, fill, &mut v);
                    encode(&v)
                })
                .collect::<anyhow::Result<_>>()?;
            for b in blocks {
                sink(&b)?;
            }
            r0 = r1;
        }
        return Ok(());
    }
    let mut v = vec![0.0f32; chunk];
    for r in 0..rows {
        let mut g = RowFill::new(seed, index as u64, r as u64, fill);
        let mut left = row_len;
        while left > 0 {
            let piece = &mut v[..left.min(chunk)];
            g.next_values(piece);
            sink(&encode(piece)?)?;
            left -= piece.len();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let mut a = vec![0.0f32; 4096];
        let mut b = vec![0.0f32; 4096];
        fill_row(7, 3, 11, Fill::Matrix, &mut a);
        fill_row(7, 3, 11, Fill::Matrix, &mut b);
        assert_eq!(a, b);
        fill_row(7, 3, 12, Fill::Matrix, &mut b);
        assert_ne!(a, b);
        let n = a.len() as f64;
        let mean = a.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (a.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        // 4096 samples: the std of the sample std is ~1.1% of 0.02.
        assert!(
            (std - 0.02).abs() < 0.001 && mean.abs() < 0.001,
            "{mean} {std}"
        );
        fill_row(1, 0, 0, Fill::Norm(1.0), &mut a);
        assert!(a.iter().all(|v| (v - 1.0).abs() <= NORM_NOISE + 1e-6));
        fill_row(1, 0, 0, Fill::Bias, &mut a);
        assert!(a.iter().all(|v| v.abs() <= BIAS_RANGE));
        assert_eq!(
            Fill::for_tensor("blk.0.attn_norm.weight", 1, 1.0),
            Fill::Norm(1.0)
        );
        assert_eq!(Fill::for_tensor("model.norm.bias", 1, 1.0), Fill::Bias);
        assert_eq!(
            Fill::for_tensor("blk.0.attn_q.weight", 2, 1.0),
            Fill::Matrix
        );
    }

    /// A row drawn in even pieces equals the row drawn whole, for every fill.
    #[test]
    fn pieces_equal_whole_row() {
        for fill in [Fill::Matrix, Fill::Norm(1.0), Fill::Bias] {
            let mut whole = vec![0.0f32; 1000];
            fill_row(5, 2, 9, fill, &mut whole);
            let mut g = RowFill::new(5, 2, 9, fill);
            let mut pieces = Vec::new();
            for n in [256, 2, 500, 242] {
                let mut p = vec![0.0f32; n];
                g.next_values(&mut p);
                pieces.extend(p);
            }
            assert_eq!(pieces, whole, "{fill:?}");
        }
    }

    /// Pieces of a byte stream at any offsets are the whole stream's bytes at those places.
    #[test]
    fn byte_stream_pieces_equal_whole_stream() {
        let mut whole = vec![0u8; 203];
        stream_bytes(42, 0, &mut whole);
        for (start, len) in [
            (0, 0),
            (0, 5),
            (3, 2),
            (3, 5),
            (5, 24),
            (7, 100),
            (16, 187),
            (200, 3),
        ] {
            let mut piece = vec![0u8; len];
            stream_bytes(42, start as u64, &mut piece);
            assert_eq!(piece, whole[start..start + len], "bytes {start}+{len}");
        }
        // Roughly uniform bytes: each bit set about half the time, and keys differ.
        let mut big = vec![0u8; 1 << 16];
        stream_bytes(row_key(1, 2, 3), 0, &mut big);
        let ones: u32 = big.iter().map(|b| b.count_ones()).sum();
        let frac = ones as f64 / (8 << 16) as f64;
        assert!((frac - 0.5).abs() < 0.005, "{frac}");
        let mut other = vec![0u8; 1 << 16];
        stream_bytes(row_key(1, 2, 4), 0, &mut other);
        let same = big.iter().zip(&other).filter(|(a, b)| a == b).count();
        assert!(same < 1 << 9, "{same} equal bytes across keys");
    }
}
