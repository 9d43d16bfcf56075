//! Q2_K: 256 values per 84-byte super-block (ggml `block_q2_K`): `scales[16]` at 0 (low nibble =
//! 4-bit scale, high nibble = 4-bit min of each 16-value sub-block), `qs[64]` at 16 (2-bit
//! quants), `d` f16 at 80, `dmin` f16 at 82. `y = (d * (sc & 15)) * q - dmin * (sc >> 4)`.

use crate::search::{make_qkx2_quants, make_qkx3_quants, make_qp_quants, QkxSearch};
use crate::util::{for_each_block, for_each_block_mut, nearest_int, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 84;
/// Byte offset of the 16 packed scale/min bytes.
pub const SCALES_OFFSET: usize = 0;
/// Byte offset of the 64 bytes of 2-bit quants.
pub const QS_OFFSET: usize = 16;
/// Byte offset of the f16 super-block scale `d`.
pub const D_OFFSET: usize = 80;
/// Byte offset of the f16 super-block min scale `dmin`.
pub const DMIN_OFFSET: usize = 82;

/// Dequantize whole blocks (ggml `dequantize_row_q2_K`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let min = rd_f16(b, DMIN_OFFSET);
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 16];
        let mut is = 0;
        let mut yi = 0;
        for h in 0..2 {
            let q = &b[QS_OFFSET + 32 * h..QS_OFFSET + 32 * h + 32];
            for j in 0..4 {
                let shift = 2 * j;
                for k in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for l in 0..16 {
                        y[yi] = dl * ((q[16 * k + l] >> shift) & 3) as f32 - ml;
                        yi += 1;
                    }
                }
            }
        }
    });
}

/// Pack 256 levels in `0..4` into `qs`.
fn pack_qs(l: &[u8; 256], y: &mut [u8]) {
    for j in (0..256).step_by(128) {
        for i in 0..32 {
            y[QS_OFFSET + j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// Final pass shared by both quantizers: requantize each sub-block against the stored scales.
fn requantize(x: &[f32; 256], y: &mut [u8], dm: f32, mm: f32, l: &mut [u8; 256]) {
    for j in 0..16 {
        let sc = y[SCALES_OFFSET + j];
        let d = dm * (sc & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let m = mm * (sc >> 4) as f32;
        for ii in 0..16 {
            let q = nearest_int((x[16 * j + ii] + m) / d);
            l[16 * j + ii] = q.clamp(0, 3) as u8;
        }
    }
}

/// Reference quantizer (ggml `quantize_row_q2_K_ref`).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; 256];
    let mut weights = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let mut scales = [0.0f32; 16];
    let q4scale = 15.0f32;
    let p = QkxSearch {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for i in 0..16 {
                weights[i] = xs[i].abs();
            }
            let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], p);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        if max_scale > 0.0 {
            let iscale = q4scale / max_scale;
            for j in 0..16 {
                y[SCALES_OFFSET + j] = nearest_int(iscale * scales[j]) as u8;
            }
            wr_f16(y, D_OFFSET, max_scale / q4scale);
        } else {
            y[SCALES_OFFSET..SCALES_OFFSET + 16].fill(0);
            wr_f16(y, D_OFFSET, 0.0);
        }
        if max_min > 0.0 {
            let iscale = q4scale / max_min;
            for j in 0..16 {
                let q = nearest_int(iscale * mins[j]);
                y[SCALES_OFFSET + j] |= (q << 4) as u8;
            }
            wr_f16(y, DMIN_OFFSET, max_min / q4scale);
        } else {
            wr_f16(y, DMIN_OFFSET, 0.0);
        }
        let dm = rd_f16(y, D_OFFSET);
        let mm = rd_f16(y, DMIN_OFFSET);
        requantize(x, y, dm, mm, &mut l);
        pack_qs(&l, y);
    });
}

/// Importance-weighted quantizer (ggml `quantize_row_q2_K_impl`); `qw` has `x.len()` weights.
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut l = [0u8; 256];
    let mut laux = [0u8; 16];
    let mut mins = [0.0f32; 16];
    let mut scales = [0.0f32; 16];
    let mut sw = [0.0f32; 16];
    let mut weight = [0.0f32; 16];
    let mut ls = [0u8; 16];
    let mut lm = [0u8; 16];
    let p = QkxSearch {
        rmin: -0.9,
        rdelta: 0.05,
        nstep: 36,
        use_mad: false,
    };
    let mut ib = 0;
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        sw.fill(0.0);
        let mut sumx2 = 0.0f32;
        for &v in x.iter() {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / 256.0;
        for j in 0..16 {
            let qwb = &qw[256 * ib + 16 * j..256 * ib + 16 * j + 16];
            for i in 0..16 {
                let v = x[16 * j + i];
                weight[i] = qwb[i] * (sigma2 + v * v).sqrt();
            }
            for i in 0..16 {
                sw[j] += weight[i];
            }
            let xs = &x[16 * j..16 * j + 16];
            let (s, m) = make_qkx3_quants(
                3,
                xs,
                Some(&weight),
                &mut l[16 * j..16 * j + 16],
                &mut laux,
                p,
            );
            scales[j] = s;
            mins[j] = m;
        }
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        wr_f16(y, D_OFFSET, dm);
        wr_f16(y, DMIN_OFFSET, mm);
        let dm = rd_f16(y, D_OFFSET);
        let mm = rd_f16(y, DMIN_OFFSET);
        for j in 0..16 {
            y[SCALES_OFFSET + j] = ls[j] | (lm[j] << 4);
        }
        requantize(x, y, dm, mm, &mut l);
        pack_qs(&l, y);
        ib += 1;
    });
}
