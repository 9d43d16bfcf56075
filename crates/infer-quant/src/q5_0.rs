//! Q5_0: 32 values per 22-byte block (ggml `block_q5_0`): `d` f16 at 0, `qh` u32 (LE) at 2 holding
//! the 5th bit of element j in bit j, 16 nibble bytes at 6 (Q4_0 element order).
//! `y = (q - 16) * d`.

use crate::search::make_qx_quants;
use crate::util::{c_cast_low_byte, for_each_block, for_each_block_mut, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 22;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the little-endian u32 of high bits `qh`.
pub const QH_OFFSET: usize = 2;
/// Byte offset of the 16 nibble bytes `qs`.
pub const QS_OFFSET: usize = 6;

/// Dequantize whole blocks (ggml `dequantize_row_q5_0`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[QS_OFFSET..QS_OFFSET + 16];
        for j in 0..16 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((qs[j] as u32 & 0x0F) | xh0) as i32 - 16;
            let x1 = ((qs[j] as u32 >> 4) | xh1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    });
}

/// Pack 32 5-bit levels (`l[j] ∈ 0..32`) into `qh` and `qs` of one block.
fn pack(l0: impl Fn(usize) -> u32, y: &mut [u8; BLOCK_BYTES]) {
    let mut qh = 0u32;
    for j in 0..16 {
        let xi0 = l0(j);
        let xi1 = l0(j + 16);
        y[QS_OFFSET + j] = ((xi0 & 0x0F) | ((xi1 & 0x0F) << 4)) as u8;
        qh |= ((xi0 & 0x10) >> 4) << j;
        qh |= ((xi1 & 0x10) >> 4) << (j + 16);
    }
    y[QH_OFFSET..QH_OFFSET + 4].copy_from_slice(&qh.to_le_bytes());
}

/// Reference quantizer (ggml `quantize_row_q5_0_ref`).
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
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(y, D_OFFSET, d);
        // uint8_t xi = MIN(31, (int8_t)(x*id + 16.5f))
        let q = |j: usize| ((c_cast_low_byte(x[j] * id + 16.5) as i8 as i32).min(31) as u32) & 0xFF;
        pack(q, y);
    });
}

/// Importance-weighted quantizer for one row (ggml `quantize_row_q5_0_impl`).
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
        let d = make_qx_quants(16, xb, &mut l, 1, Some(&weight));
        if let Ok(y) = <&mut [u8; BLOCK_BYTES]>::try_from(y) {
            wr_f16(y, D_OFFSET, d);
            pack(|j| l[j] as u8 as u32, y);
        }
    }
}
