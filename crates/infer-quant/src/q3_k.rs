//! Q3_K: 256 values per 110-byte super-block (ggml `block_q3_K`): `hmask[32]` at 0 (high bits),
//! `qs[64]` at 32 (low 2 bits), `scales[12]` at 96 (16 packed 6-bit signed scales), `d` f16 at
//! 108. `y = (d * (sc - 32)) * (q2 - (hbit ? 0 : 4))`.

use crate::search::{make_q3_quants, make_qx_quants};
use crate::util::{for_each_block, for_each_block_mut, nearest_int, rd_f16, wr_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 110;
/// Byte offset of the 32 high-bit mask bytes.
pub const HMASK_OFFSET: usize = 0;
/// Byte offset of the 64 bytes of low 2-bit quants.
pub const QS_OFFSET: usize = 32;
/// Byte offset of the 12 packed scale bytes.
pub const SCALES_OFFSET: usize = 96;
/// Byte offset of the f16 super-block scale `d`.
pub const D_OFFSET: usize = 108;

/// The 16 unpacked 6-bit scales (`0..64`, before the `- 32`) of a block's `scales[12]`.
fn unpack_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (lo | (hi << 4)) as i8;
    }
    out
}

/// Dequantize whole blocks (ggml `dequantize_row_q3_K`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d_all = rd_f16(b, D_OFFSET);
        let scales = unpack_scales(&b[SCALES_OFFSET..SCALES_OFFSET + 12]);
        let hm = &b[HMASK_OFFSET..HMASK_OFFSET + 32];
        let mut m = 1u8;
        let mut is = 0;
        let mut yi = 0;
        for h in 0..2 {
            let q = &b[QS_OFFSET + 32 * h..QS_OFFSET + 32 * h + 32];
            for j in 0..4 {
                let shift = 2 * j;
                for k in 0..2 {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let q2 = ((q[16 * k + l] >> shift) & 3) as i32;
                        let sub = if hm[16 * k + l] & m != 0 { 0 } else { 4 };
                        y[yi] = dl * (q2 - sub) as f32;
                        yi += 1;
                    }
                }
                m <<= 1;
            }
        }
    });
}

/// The 12 `scales` bytes of a Q3_K block holding the 16 6-bit sub-block scale levels
/// `levels[j] ∈ 0..64` (scale `levels[j] - 32`; higher bits are dropped), packed as ggml does:
/// the low nibble of level `j` in byte `j % 8` (levels 8–15 in the high nibbles), its top two
/// bits in byte `8 + j % 4` at bit `2 * (j / 4)`.
pub fn pack_scales(levels: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in levels.iter().enumerate() {
        let l = l & 63;
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    s
}

/// Write the 16 6-bit scale levels `ls(j) ∈ 0..64` into the block's `scales[12]`
/// ([`pack_scales`]).
fn write_scales(ls: impl Fn(usize) -> i32, y: &mut [u8]) {
    let levels: [u8; 16] = std::array::from_fn(|j| ls(j) as u8);
    y[SCALES_OFFSET..SCALES_OFFSET + 12].copy_from_slice(&pack_scales(&levels));
}

/// Requantize against the stored scales, then write `hmask` and `qs` (shared by both paths).
fn finish(x: &[f32; 256], y: &mut [u8], l: &mut [i8; 256]) {
    let d_all = rd_f16(y, D_OFFSET);
    let scales = unpack_scales(&y[SCALES_OFFSET..SCALES_OFFSET + 12]);
    for j in 0..16 {
        let sc = scales[j].wrapping_sub(32);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    let hmask = &mut y[HMASK_OFFSET..HMASK_OFFSET + 32];
    hmask.fill(0);
    let mut m = 0;
    let mut hm = 1u8;
    for lj in l.iter_mut() {
        if *lj > 3 {
            hmask[m] |= hm;
            *lj -= 4;
        }
        m += 1;
        if m == 32 {
            m = 0;
            hm = hm.wrapping_shl(1);
        }
    }
    for j in (0..256).step_by(128) {
        for i in 0..32 {
            let v = l[j + i] as u8
                | ((l[j + i + 32] as u8) << 2)
                | ((l[j + i + 64] as u8) << 4)
                | ((l[j + i + 96] as u8) << 6);
            y[QS_OFFSET + j / 4 + i] = v;
        }
    }
}

/// Reference quantizer (ggml `quantize_row_q3_K_ref`).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    let mut l = [0i8; 256];
    let mut scales = [0.0f32; 16];
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..], true);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            write_scales(
                |j| {
                    let q = nearest_int(iscale * scales[j]) as i8 as i32;
                    q.clamp(-32, 31) + 32
                },
                y,
            );
            wr_f16(y, D_OFFSET, 1.0 / iscale);
        } else {
            y[SCALES_OFFSET..SCALES_OFFSET + 12].fill(0);
            wr_f16(y, D_OFFSET, 0.0);
        }
        finish(x, y, &mut l);
    });
}

/// Importance-weighted quantizer (ggml `quantize_row_q3_K_impl`); `qw` has `x.len()` weights.
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut l = [0i8; 256];
    let mut scales = [0.0f32; 16];
    let mut weight = [0.0f32; 16];
    let mut sw = [0.0f32; 16];
    let mut ls = [0i8; 16];
    let mut ib = 0;
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut sumx2 = 0.0f32;
        for &v in x.iter() {
            sumx2 += v * v;
        }
        let sigma2 = 2.0 * sumx2 / 256.0;
        for j in 0..16 {
            let qwb = &qw[256 * ib + 16 * j..256 * ib + 16 * j + 16];
            for i in 0..16 {
                let v = x[16 * j + i];
                weight[i] = qwb[i] * (sigma2 + v * v).sqrt();
            }
            let mut sumw = 0.0f32;
            for &w in &weight {
                sumw += w;
            }
            sw[j] = sumw;
            scales[j] = make_qx_quants(
                4,
                &x[16 * j..16 * j + 16],
                &mut l[16 * j..],
                1,
                Some(&weight),
            );
        }
        let d_block = make_qx_quants(32, &scales, &mut ls, 1, Some(&sw));
        write_scales(|j| ls[j] as i32, y);
        wr_f16(y, D_OFFSET, d_block);
        finish(x, y, &mut l);
        ib += 1;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`pack_scales`] is the inverse of the dequantizer's unpacking for every level.
    #[test]
    fn pack_scales_round_trips() {
        let levels: [u8; 16] = std::array::from_fn(|j| ((j * 37 + 5) % 64) as u8);
        let unpacked = unpack_scales(&pack_scales(&levels));
        assert_eq!(unpacked.map(|l| l as u8), levels);
    }
}
