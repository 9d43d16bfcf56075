//! Q4_0: 32 values per 18-byte block (ggml `block_q4_0`): `d` f16 at byte 0, then 16 bytes of
//! nibbles — low nibbles hold elements 0–15, high nibbles elements 16–31. `y = (q - 8) * d`.

use crate::search::make_qx_quants;
use crate::util::{c_cast_low_byte, for_each_block, for_each_block_mut, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the 16 nibble bytes `qs`.
pub const QS_OFFSET: usize = 2;

/// Dequantize whole blocks (ggml `dequantize_row_q4_0`); `out.len() / 32 == bytes.len() / 18`.
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let qs = &b[QS_OFFSET..QS_OFFSET + 16];
        for j in 0..16 {
            let x0 = (qs[j] & 0x0F) as i32 - 8;
            let x1 = (qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    });
}

/// Reference quantizer (ggml `quantize_row_q4_0_ref`): `x.len()` a multiple of 32, `out` the
/// matching number of blocks.
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(y, D_OFFSET, d);
        for j in 0..16 {
            let x0 = x[j] * id;
            let x1 = x[j + 16] * id;
            let xi0 = (c_cast_low_byte(x0 + 8.5) as i8 as i32).min(15) as u32;
            let xi1 = (c_cast_low_byte(x1 + 8.5) as i8 as i32).min(15) as u32;
            y[QS_OFFSET + j] = ((xi0 & 0xFF) | ((xi1 & 0xFF) << 4)) as u8;
        }
    });
}

/// Importance-weighted quantizer for one row (ggml `quantize_row_q4_0_impl`); `qw` has
/// `x.len()` weights. `sigma2` is taken over the whole row, so `x` must be exactly one row.
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = sum_x2 / x.len() as f32;
    let mut weight = [0.0f32; BLOCK_ELEMS];
    let mut l = [0i8; BLOCK_ELEMS];
    for (ib, (xb, y)) in x
        .chunks_exact(BLOCK_ELEMS)
        .zip(out.chunks_exact_mut(BLOCK_BYTES))
        .enumerate()
    {
        let qwb = &qw[ib * BLOCK_ELEMS..(ib + 1) * BLOCK_ELEMS];
        for j in 0..BLOCK_ELEMS {
            weight[j] = qwb[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&weight));
        wr_f16(y, D_OFFSET, d);
        for j in 0..16 {
            y[QS_OFFSET + j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
        }
    }
}
