//! Q4_1: 32 values per 20-byte block (ggml `block_q4_1`): `d` f16 at 0, `m` f16 at 2, 16 nibble
//! bytes at 4 (low nibbles = elements 0–15, high = 16–31). `y = q * d + m`.

use crate::search::{make_qkx3_quants, QkxSearch};
use crate::util::{c_cast_low_byte, for_each_block, for_each_block_mut, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 20;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 minimum `m`.
pub const M_OFFSET: usize = 2;
/// Byte offset of the 16 nibble bytes `qs`.
pub const QS_OFFSET: usize = 4;

/// Dequantize whole blocks (ggml `dequantize_row_q4_1`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let m = rd_f16(b, M_OFFSET);
        let qs = &b[QS_OFFSET..QS_OFFSET + 16];
        for j in 0..16 {
            y[j] = (qs[j] & 0x0F) as f32 * d + m;
            y[j + 16] = (qs[j] >> 4) as f32 * d + m;
        }
    });
}

/// Reference quantizer (ggml `quantize_row_q4_1_ref`).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(y, D_OFFSET, d);
        wr_f16(y, M_OFFSET, min);
        for j in 0..16 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[j + 16] - min) * id;
            let xi0 = (c_cast_low_byte(x0 + 0.5) as i8 as i32).min(15) as u32;
            let xi1 = (c_cast_low_byte(x1 + 0.5) as i8 as i32).min(15) as u32;
            y[QS_OFFSET + j] = ((xi0 & 0xFF) | ((xi1 & 0xFF) << 4)) as u8;
        }
    });
}

/// Importance-weighted quantizer for one row (ggml `quantize_row_q4_1_impl`).
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = sum_x2 / x.len() as f32;
    let mut weight = [0.0f32; BLOCK_ELEMS];
    let mut l = [0u8; BLOCK_ELEMS];
    let mut laux = [0u8; BLOCK_ELEMS];
    let p = QkxSearch {
        rmin: -0.9,
        rdelta: 0.05,
        nstep: 36,
        use_mad: false,
    };
    for (ib, (xb, y)) in x
        .chunks_exact(BLOCK_ELEMS)
        .zip(out.chunks_exact_mut(BLOCK_BYTES))
        .enumerate()
    {
        let qwb = &qw[ib * BLOCK_ELEMS..(ib + 1) * BLOCK_ELEMS];
        for j in 0..BLOCK_ELEMS {
            weight[j] = qwb[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        let (d, min) = make_qkx3_quants(15, xb, Some(&weight), &mut l, &mut laux, p);
        wr_f16(y, D_OFFSET, d);
        wr_f16(y, M_OFFSET, -min);
        for j in 0..16 {
            y[QS_OFFSET + j] = l[j] | (l[j + 16] << 4);
        }
    }
}
