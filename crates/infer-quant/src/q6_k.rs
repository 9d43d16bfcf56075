//! Q6_K: 256 values per 210-byte super-block (ggml `block_q6_K`): `ql[128]` at 0 (low 4 bits),
//! `qh[64]` at 128 (high 2 bits), `scales[16]` i8 at 192, `d` f16 at 208 (last).
//! `y = (d * scales[s]) * (q - 32)`.

use crate::search::{make_qx_quants, GROUP_MAX_EPS};
use crate::util::{for_each_block, for_each_block_mut, nearest_int, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 210;
/// Byte offset of the 128 low-nibble bytes `ql`.
pub const QL_OFFSET: usize = 0;
/// Byte offset of the 64 high-bit bytes `qh`.
pub const QH_OFFSET: usize = 128;
/// Byte offset of the 16 signed 8-bit sub-block scales.
pub const SCALES_OFFSET: usize = 192;
/// Byte offset of the f16 super-block scale `d`.
pub const D_OFFSET: usize = 208;

/// Dequantize whole blocks (ggml `dequantize_row_q6_K`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        for h in 0..2 {
            let ql = &b[QL_OFFSET + 64 * h..QL_OFFSET + 64 * h + 64];
            let qh = &b[QH_OFFSET + 32 * h..QH_OFFSET + 32 * h + 32];
            let sc = &b[SCALES_OFFSET + 8 * h..SCALES_OFFSET + 8 * h + 8];
            let yh = &mut y[128 * h..128 * h + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                yh[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                yh[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                yh[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                yh[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    });
}

/// Shared tail of both quantizers: given the 16 sub-block scales and their levels `l`, write the
/// block (ggml `quantize_row_q6_K_ref` after the scale search).
fn finish(x: &[f32; 256], y: &mut [u8; BLOCK_BYTES], scales: &[f32; 16], l: &mut [i8; 256]) {
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for &s in scales {
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        wr_f16(y, D_OFFSET, 0.0);
        return;
    }
    let iscale = -128.0f32 / max_scale;
    wr_f16(y, D_OFFSET, 1.0 / iscale);
    for ib in 0..16 {
        y[SCALES_OFFSET + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let dd = rd_f16(y, D_OFFSET);
    for j in 0..16 {
        let d = dd * (y[SCALES_OFFSET + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    for h in 0..2 {
        let lb = &l[128 * h..128 * h + 128];
        for i in 0..32 {
            let q1 = lb[i] as u8 & 0xF;
            let q2 = lb[i + 32] as u8 & 0xF;
            let q3 = lb[i + 64] as u8 & 0xF;
            let q4 = lb[i + 96] as u8 & 0xF;
            y[QL_OFFSET + 64 * h + i] = q1 | (q3 << 4);
            y[QL_OFFSET + 64 * h + i + 32] = q2 | (q4 << 4);
            y[QH_OFFSET + 32 * h + i] = ((lb[i] >> 4) as u8)
                | (((lb[i + 32] >> 4) as u8) << 2)
                | (((lb[i + 64] >> 4) as u8) << 4)
                | (((lb[i + 96] >> 4) as u8) << 6);
        }
    }
}

/// Reference quantizer (ggml `quantize_row_q6_K_ref`).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    let mut l = [0i8; 256];
    let mut scales = [0.0f32; 16];
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        for ib in 0..16 {
            scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..], 1, None);
        }
        finish(x, y, &scales, &mut l);
    });
}

/// Importance-weighted quantizer (ggml `quantize_row_q6_K_impl`); `qw` has `x.len()` weights.
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut l = [0i8; 256];
    let mut scales = [0.0f32; 16];
    let mut i = 0;
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        for ib in 0..16 {
            let w = &qw[256 * i + 16 * ib..256 * i + 16 * ib + 16];
            scales[ib] =
                make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..], 1, Some(w));
        }
        finish(x, y, &scales, &mut l);
        i += 1;
    });
}
