//! Q5_1: 32 values per 24-byte block (ggml `block_q5_1`): `d` f16 at 0, `m` f16 at 2, `qh` u32
//! (LE) at 4, 16 nibble bytes at 8 (Q4_0 element order). `y = q * d + m`.

use crate::search::{make_qkx3_quants, QkxSearch};
use crate::util::{c_cast_low_byte, for_each_block, for_each_block_mut, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 24;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 minimum `m`.
pub const M_OFFSET: usize = 2;
/// Byte offset of the little-endian u32 of high bits `qh`.
pub const QH_OFFSET: usize = 4;
/// Byte offset of the 16 nibble bytes `qs`.
pub const QS_OFFSET: usize = 8;

/// Dequantize whole blocks (ggml `dequantize_row_q5_1`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let m = rd_f16(b, M_OFFSET);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let qs = &b[QS_OFFSET..QS_OFFSET + 16];
        for j in 0..16 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = (qs[j] as u32 & 0x0F) | xh0;
            let x1 = (qs[j] as u32 >> 4) | xh1;
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    });
}

fn pack(l: impl Fn(usize) -> u32, y: &mut [u8; BLOCK_BYTES]) {
    let mut qh = 0u32;
    for j in 0..16 {
        let xi0 = l(j);
        let xi1 = l(j + 16);
        y[QS_OFFSET + j] = ((xi0 & 0x0F) | ((xi1 & 0x0F) << 4)) as u8;
        qh |= ((xi0 & 0x10) >> 4) << j;
        qh |= ((xi1 & 0x10) >> 4) << (j + 16);
    }
    y[QH_OFFSET..QH_OFFSET + 4].copy_from_slice(&qh.to_le_bytes());
}

/// Reference quantizer (ggml `quantize_row_q5_1_ref`).
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(y, D_OFFSET, d);
        wr_f16(y, M_OFFSET, min);
        // uint8_t xi = (uint8_t)((x - min)*id + 0.5f)
        let q = |j: usize| c_cast_low_byte((x[j] - min) * id + 0.5) as u32;
        pack(q, y);
    });
}

/// Importance-weighted quantizer for one row (ggml `quantize_row_q5_1_impl`).
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
        let (d, min) = make_qkx3_quants(31, xb, Some(&weight), &mut l, &mut laux, p);
        if let Ok(y) = <&mut [u8; BLOCK_BYTES]>::try_from(y) {
            wr_f16(y, D_OFFSET, d);
            wr_f16(y, M_OFFSET, -min);
            pack(|j| l[j] as u32, y);
        }
    }
}
