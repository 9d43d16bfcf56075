//! Q8_K: 256 values per 292-byte block (ggml `block_q8_K`), used for activations only:
//! `d` **f32** at 0, 256 × i8 at 4, 16 × i16 `bsums` at 260 (`bsums[g] = Σ qs[16g..16g+16]`).
//! `y = d * q`.

use crate::util::{for_each_block, for_each_block_mut, nearest_int};

/// Values per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 292;
/// Byte offset of the f32 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the 256 signed quants.
pub const QS_OFFSET: usize = 4;
/// Byte offset of the 16 little-endian i16 group sums.
pub const BSUMS_OFFSET: usize = 260;

/// Dequantize whole blocks (ggml `dequantize_row_q8_K`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (o, &q) in y.iter_mut().zip(&b[QS_OFFSET..QS_OFFSET + 256]) {
            *o = d * (q as i8) as f32;
        }
    });
}

/// Reference quantizer (ggml `quantize_row_q8_K_ref`: `iscale = -127/max`, `q = nearest_int`,
/// `d = 1/iscale`). For an all-zero block ggml leaves `bsums` unwritten; we write zeros.
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            y.fill(0);
            return;
        }
        let iscale = -127.0f32 / max;
        for j in 0..256 {
            let v = nearest_int(iscale * x[j]);
            y[QS_OFFSET + j] = v.min(127) as i8 as u8;
        }
        for g in 0..16 {
            let mut sum = 0i32;
            for ii in 0..16 {
                sum += (y[QS_OFFSET + 16 * g + ii] as i8) as i32;
            }
            let o = BSUMS_OFFSET + 2 * g;
            y[o..o + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        y[D_OFFSET..D_OFFSET + 4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    });
}
