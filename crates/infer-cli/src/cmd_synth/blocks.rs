//! `infer synth --random-blocks`: the blocks of quantized matrices drawn directly instead of
//! quantizing drawn values, so a model is written at about the speed of the disk.
//!
//! Each row of a matrix is random bytes ([`stream_bytes`], keyed by `(seed, tensor, row)` as
//! the default mode's values are, so the bytes depend on neither threads nor chunking); then
//! every block gets fixed, per-format scale fields ([`BlockDrawer`]). The quants are thus
//! uniform over their range and the dequantized values uniform-ish (a few scaled uniform
//! levels, not a normal distribution; the engines' speed does not depend on it), with
//! standard deviation [`MATRIX_STD`] like the default mode's normal values and mean about 0.
//! Block layouts (field offsets, scale packing) are infer_quant's, which follow ggml's
//! `block_*` structs (`ggml-common.h`); block sizes come from its format table.
//!
//! Per format, `q` the drawn quant, all `d`/`dmin` positive normal f16 (Q8_K: f32):
//! - Q4_0, Q5_0, Q8_0 (ggml `block_q4_0`, `block_q5_0`, `block_q8_0`): `y = d * q`, `q` in
//!   `-8..8`, `-16..16`, `-128..128`: mean `-d/2` (-0.0022, -0.0011, -0.0001).
//! - Q4_1, Q5_1 (`block_q4_1`, `block_q5_1`): `y = d * q + m`, `m = -d * (levels - 1) / 2`
//!   (centred).
//! - Q8_K (`block_q8_K`): as Q8_0 with an f32 `d`; its `bsums` are the sums of the drawn quants.
//! - Q2_K, Q4_K, Q5_K (`block_q2_K`, `block_q4_K`, `block_q5_K`): `y = d * sc * q - dmin * m`
//!   with every sub-block scale and min level [`SUB_LEVEL`] and `dmin * m = d * sc * mean(q)`
//!   (centred).
//! - Q3_K, Q6_K (`block_q3_K`, `block_q6_K`): `y = d * sc * q` with signed sub-block scales
//!   `±SUB_LEVEL` alternating, so the sub-blocks' `-d * sc / 2` offsets cancel.

use anyhow::Context;
use infer_quant::float16::f32_to_f16;
use infer_quant::{q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_k, QuantFormat};
use rayon::prelude::*;

use super::random::{row_key, stream_bytes, RandomTensor, MATRIX_STD};

/// How the blocks of quantized matrices are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockMode {
    /// Quantize drawn normal values with ggml's reference quantizer (the default).
    Quantize,
    /// Draw the blocks directly (`--random-blocks`, [`BlockDrawer`]).
    Draw,
}

/// Magnitude of the K-quants' sub-block scale and min levels (fits Q2_K's 4 bits; keeps every
/// `d` and `dmin` a normal f16).
const SUB_LEVEL: u8 = 8;

/// Standard deviation of a quant uniform over `levels` consecutive integers.
fn uniform_std(levels: u32) -> f32 {
    (((levels * levels - 1) as f32) / 12.0).sqrt()
}

/// Root mean square of a quant uniform over `-levels/2 .. levels/2` (mean -1/2): the standard
/// deviation of such quants under sub-block scales of alternating sign, whose means cancel.
fn signed_rms(levels: u32) -> f32 {
    (uniform_std(levels).powi(2) + 0.25).sqrt()
}

/// Mean of a quant uniform over `0..levels`.
fn uniform_mean(levels: u32) -> f32 {
    (levels - 1) as f32 / 2.0
}

/// Little-endian f16 bytes of `x`.
fn f16(x: f32) -> Vec<u8> {
    f32_to_f16(x).to_le_bytes().to_vec()
}

/// Fixed fields of a block: `(byte offset, bytes)`.
type Fields = Vec<(usize, Vec<u8>)>;

/// `y = d * q + m` formats (Q4_1, Q5_1) with `levels` quant levels: `d`, and `m` centring.
fn offset_fields(d_at: usize, m_at: usize, levels: u32) -> Fields {
    let d = MATRIX_STD / uniform_std(levels);
    vec![(d_at, f16(d)), (m_at, f16(-d * uniform_mean(levels)))]
}

/// `d` and `dmin` of a K-quant with `levels` quant levels whose sub-block scale and min
/// levels are both [`SUB_LEVEL`]: standard deviation [`MATRIX_STD`], and centred
/// (`dmin * m = d * sc * mean(q)`, so `dmin = d * mean(q)`).
fn k_scales(levels: u32) -> (f32, f32) {
    let d = MATRIX_STD / (f32::from(SUB_LEVEL) * uniform_std(levels));
    (d, d * uniform_mean(levels))
}

/// The fixed fields of a drawn block of `format`; `None` for float formats and those synth
/// cannot draw (Q8_1).
fn fields(format: QuantFormat) -> Option<Fields> {
    use QuantFormat as F;
    let sub = f32::from(SUB_LEVEL);
    // Sub-block scales of alternating sign: the -1/2 mean of a signed quant (an even number of
    // levels about 0) cancels between neighbouring sub-blocks.
    let alternating = |j: usize| if j % 2 == 0 { 1 } else { -1 };
    Some(match format {
        F::Q4_0 => vec![(q4_0::D_OFFSET, f16(MATRIX_STD / uniform_std(16)))],
        F::Q5_0 => vec![(q5_0::D_OFFSET, f16(MATRIX_STD / uniform_std(32)))],
        F::Q8_0 => vec![(q8_0::D_OFFSET, f16(MATRIX_STD / uniform_std(256)))],
        F::Q4_1 => offset_fields(q4_1::D_OFFSET, q4_1::M_OFFSET, 16),
        F::Q5_1 => offset_fields(q5_1::D_OFFSET, q5_1::M_OFFSET, 32),
        F::Q8_K => {
            let d = MATRIX_STD / uniform_std(256);
            vec![(q8_k::D_OFFSET, d.to_le_bytes().to_vec())]
        }
        F::Q2_K => {
            // Each of the 16 scale bytes: scale in the low nibble, min in the high one.
            let (d, dmin) = k_scales(4);
            vec![
                (q2_k::SCALES_OFFSET, vec![SUB_LEVEL | SUB_LEVEL << 4; 16]),
                (q2_k::D_OFFSET, f16(d)),
                (q2_k::DMIN_OFFSET, f16(dmin)),
            ]
        }
        F::Q4_K | F::Q5_K => {
            // Q5_K packs its scales and mins as Q4_K does.
            let (q_levels, d_at, dmin_at, scales_at) = match format {
                F::Q4_K => (16, q4_k::D_OFFSET, q4_k::DMIN_OFFSET, q4_k::SCALES_OFFSET),
                _ => (32, q5_k::D_OFFSET, q5_k::DMIN_OFFSET, q5_k::SCALES_OFFSET),
            };
            let (d, dmin) = k_scales(q_levels);
            let sub = [SUB_LEVEL; 8];
            vec![
                (d_at, f16(d)),
                (dmin_at, f16(dmin)),
                (scales_at, q4_k::pack_scale_mins(&sub, &sub).to_vec()),
            ]
        }
        F::Q3_K => {
            // Stored levels are the scale + 32; q is in -4..4 (2 low bits and the hmask bit).
            let levels: [u8; 16] =
                std::array::from_fn(|j| (32 + alternating(j) * i32::from(SUB_LEVEL)) as u8);
            let d = MATRIX_STD / (sub * signed_rms(8));
            vec![
                (q3_k::SCALES_OFFSET, q3_k::pack_scales(&levels).to_vec()),
                (q3_k::D_OFFSET, f16(d)),
            ]
        }
        F::Q6_K => {
            // int8 scales; q is in -32..32 (4 low bits in ql, 2 high bits in qh).
            let scales: Vec<u8> = (0..16)
                .map(|j| (alternating(j) * i32::from(SUB_LEVEL)) as i8 as u8)
                .collect();
            let d = MATRIX_STD / (sub * signed_rms(64));
            vec![(q6_k::SCALES_OFFSET, scales), (q6_k::D_OFFSET, f16(d))]
        }
        // Synth writes GGUFs: ggml types only (an interleaved layout is made by extract).
        F::F32 | F::F16 | F::BF16 | F::Q8_1 | F::Q4_0x16 => return None,
    })
}

/// Set Q8_K's `bsums` (16 little-endian i16, the sums of each 16 quants) of `block`.
fn set_q8_k_bsums(block: &mut [u8]) {
    for g in 0..16 {
        let qs = &block[q8_k::QS_OFFSET + 16 * g..q8_k::QS_OFFSET + 16 * g + 16];
        let sum: i16 = qs.iter().map(|&q| i16::from(q as i8)).sum();
        let at = q8_k::BSUMS_OFFSET + 2 * g;
        block[at..at + 2].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Draws the blocks of one quantized format: random bytes with the format's fixed scale
/// fields (see the module docs).
pub struct BlockDrawer {
    block_bytes: usize,
    fields: Fields,
    /// Q8_K: recompute `bsums` from the drawn quants.
    bsums: bool,
}

impl BlockDrawer {
    /// The drawer of `format`; `None` for float formats and Q8_1 (not drawn).
    pub fn new(format: QuantFormat) -> Option<BlockDrawer> {
        Some(BlockDrawer {
            block_bytes: format.block_bytes(),
            fields: fields(format)?,
            bsums: format == QuantFormat::Q8_K,
        })
    }

    /// Fill `out` (whole blocks) with the bytes at `start .. start + out.len()` of the row
    /// keyed `key` (`start`: a multiple of the block size).
    pub fn draw(&self, key: u64, start: u64, out: &mut [u8]) {
        debug_assert!(start % self.block_bytes as u64 == 0 && out.len() % self.block_bytes == 0);
        stream_bytes(key, start, out);
        for block in out.chunks_exact_mut(self.block_bytes) {
            for (at, bytes) in &self.fields {
                block[*at..*at + bytes.len()].copy_from_slice(bytes);
            }
            if self.bsums {
                set_q8_k_bsums(block);
            }
        }
    }
}

/// Stream drawn blocks of the quantized `tensor` under `seed` into `sink` ([`BlockDrawer`]),
/// at most `chunk` values' worth at a time (`chunk`: a multiple of the block size). Rows up to
/// `chunk` values are drawn several at a time in parallel, a longer row piece by piece; the
/// bytes are the same either way. Errors: a format synth cannot draw, a row length the block
/// does not divide (both name the tensor), or the sink's.
pub fn stream_blocks(
    tensor: &RandomTensor<'_>,
    seed: u64,
    chunk: usize,
    sink: &mut dyn FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let &RandomTensor {
        name,
        index,
        format,
        rows,
        row_len,
        ..
    } = tensor;
    let drawer = BlockDrawer::new(format)
        .with_context(|| format!("tensor '{name}': synth cannot draw {format} blocks"))?;
    let row_bytes = format
        .bytes_for(row_len)
        .with_context(|| format!("tensor '{name}'"))?;
    let key = |r: usize| row_key(seed, index as u64, r as u64);
    if row_len <= chunk {
        let step = (chunk / row_len.max(1)).clamp(1, rows.max(1));
        let mut buf = vec![0u8; step * row_bytes];
        for r0 in (0..rows).step_by(step) {
            let part = &mut buf[..(step.min(rows - r0)) * row_bytes];
            part.par_chunks_mut(row_bytes)
                .enumerate()
                .for_each(|(i, row)| drawer.draw(key(r0 + i), 0, row));
            sink(part)?;
        }
        return Ok(());
    }
    let piece = (chunk / format.block_elems()).max(1) * format.block_bytes();
    let mut buf = vec![0u8; piece];
    for r in 0..rows {
        for start in (0..row_bytes).step_by(piece) {
            let part = &mut buf[..piece.min(row_bytes - start)];
            drawer.draw(key(r), start as u64, part);
            sink(part)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd_synth::random::Fill;

    /// Every block format synth quantizes to.
    const DRAWN: [QuantFormat; 11] = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q8_0,
        QuantFormat::Q2_K,
        QuantFormat::Q3_K,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
        QuantFormat::Q8_K,
    ];

    fn tensor(format: QuantFormat, rows: usize, row_len: usize) -> RandomTensor<'static> {
        RandomTensor {
            name: "blk.0.ffn_up.weight",
            index: 5,
            format,
            fill: Fill::Matrix,
            rows,
            row_len,
        }
    }

    fn bytes_of(t: &RandomTensor<'_>, seed: u64, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        stream_blocks(t, seed, chunk, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        out
    }

    /// Every block format of infer_quant's table that synth can quantize is drawn; the float
    /// formats and Q8_1 (not quantized) are not.
    #[test]
    fn drawable_formats() {
        let all: Vec<QuantFormat> = (0..64)
            .filter_map(|id| QuantFormat::from_ggml_type_id(id).ok())
            .collect();
        assert_eq!(all.len(), 15);
        for f in all {
            let n = f.block_elems();
            let quantizes = infer_quant::quantize(f, &vec![0.0; n], n, None).is_ok();
            let drawn = BlockDrawer::new(f).is_some();
            assert_eq!(drawn, f.is_quantized() && quantizes, "{f}");
            assert_eq!(drawn, DRAWN.contains(&f), "{f}");
        }
    }

    /// Drawn blocks dequantize (infer_quant, ggml's dequantizers) to finite values with
    /// standard deviation within 1% of MATRIX_STD and mean within 0.12 of it (Q4_0's `-d/2`
    /// is 0.11 of it), bounded like scaled uniform values (|y| < 2.5 std); the K-quants'
    /// `d` / `dmin` are positive normal f16.
    #[test]
    fn drawn_blocks_have_the_matrix_spread() {
        for f in DRAWN {
            let t = tensor(f, 64, 4096);
            let bytes = bytes_of(&t, 1, 1 << 22);
            assert_eq!(bytes.len(), f.bytes_for(64 * 4096).unwrap(), "{f}");
            let v = infer_quant::dequantize_to_vec(f, &bytes, 64 * 4096).unwrap();
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
            let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            let std = MATRIX_STD as f64;
            assert!(
                (sd / std - 1.0).abs() < 0.01 && mean.abs() < 0.12 * std,
                "{f}: mean {mean} std {sd}"
            );
            let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(
                max.is_finite() && max < 2.5 * MATRIX_STD,
                "{f}: max |y| {max}"
            );
        }
        for (f, d_at, dmin_at) in [
            (QuantFormat::Q2_K, q2_k::D_OFFSET, Some(q2_k::DMIN_OFFSET)),
            (QuantFormat::Q3_K, q3_k::D_OFFSET, None),
            (QuantFormat::Q4_K, q4_k::D_OFFSET, Some(q4_k::DMIN_OFFSET)),
            (QuantFormat::Q5_K, q5_k::D_OFFSET, Some(q5_k::DMIN_OFFSET)),
            (QuantFormat::Q6_K, q6_k::D_OFFSET, None),
        ] {
            let block = bytes_of(&tensor(f, 1, 256), 1, 256);
            for at in std::iter::once(d_at).chain(dmin_at) {
                let h = half::f16::from_le_bytes([block[at], block[at + 1]]);
                assert!(h.is_normal() && h.is_sign_positive(), "{f} at {at}: {h}");
            }
        }
    }

    /// Q8_K's `bsums` are the sums of its quants.
    #[test]
    fn q8_k_bsums_sum_the_quants() {
        let bytes = bytes_of(&tensor(QuantFormat::Q8_K, 2, 512), 3, 1 << 20);
        for block in bytes.chunks_exact(q8_k::BLOCK_BYTES) {
            for g in 0..16 {
                let at = q8_k::QS_OFFSET + 16 * g;
                let sum: i32 = block[at..at + 16].iter().map(|&q| q as i8 as i32).sum();
                let b = q8_k::BSUMS_OFFSET + 2 * g;
                assert_eq!(i16::from_le_bytes([block[b], block[b + 1]]) as i32, sum);
            }
        }
    }

    /// Same seed, same bytes, whatever the chunk (rows in pieces included); another seed or
    /// another row, other quants.
    #[test]
    fn deterministic_and_chunk_independent() {
        for f in [QuantFormat::Q6_K, QuantFormat::Q4_0, QuantFormat::Q4_K] {
            let t = tensor(f, 3, 1024);
            let whole = bytes_of(&t, 9, 1 << 16);
            assert_eq!(bytes_of(&t, 9, 1 << 16), whole, "{f}");
            assert_eq!(bytes_of(&t, 9, 256), whole, "{f} in pieces");
            let other = bytes_of(&t, 10, 1 << 16);
            let same = whole.iter().zip(&other).filter(|(a, b)| a == b).count();
            assert!(
                same < whole.len() / 4,
                "{f}: {same} of {} bytes",
                whole.len()
            );
            let row = whole.len() / 3;
            assert_ne!(whole[..row], whole[row..2 * row], "{f}: rows repeat");
        }
    }
}
