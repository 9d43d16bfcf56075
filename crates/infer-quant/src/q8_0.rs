//! Q8_0: 32 values per 34-byte block (ggml `block_q8_0`): `d` f16 at 0, 32 × i8 at 2.
//! `y = q * d`.

use crate::util::{c_cast_low_byte, for_each_block, for_each_block_mut, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the 32 signed quants `qs`.
pub const QS_OFFSET: usize = 2;

/// Dequantize whole blocks (ggml `dequantize_row_q8_0`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        for (o, &q) in y.iter_mut().zip(&b[QS_OFFSET..]) {
            *o = (q as i8) as f32 * d;
        }
    });
}

/// Reference quantizer (ggml `quantize_row_q8_0_ref`: `d = amax/127`, `q = roundf(x/d)`, half
/// away from zero). Importance weights do not apply to Q8_0 (ggml ignores them too).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut amax = 0.0f32;
        for &v in x {
            amax = crate::util::cmax(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(y, D_OFFSET, d);
        for j in 0..BLOCK_ELEMS {
            y[QS_OFFSET + j] = c_cast_low_byte((x[j] * id).round());
        }
    });
}
