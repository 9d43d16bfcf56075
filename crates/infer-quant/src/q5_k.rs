//! Q5_K: 256 values per 176-byte super-block (ggml `block_q5_K`): `d` f16 at 0, `dmin` f16 at 2,
//! `scales[12]` at 4 (as Q4_K), `qh[32]` at 16, `qs[128]` at 48 (nibbles as Q4_K). The 5th bit of
//! element `32s + l` is bit `s` of `qh[l]`. `y = (d * sc) * (q + 16 * bit) - dmin * m`.

use crate::q4_k::{impl_scales, ref_scales, requantize_k};
use crate::search::QkxSearch;
use crate::util::{for_each_block, for_each_block_mut, get_scale_min_k4, rd_f16};

/// Values per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 176;
/// Byte offset of the f16 super-block scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 super-block min scale `dmin`.
pub const DMIN_OFFSET: usize = 2;
/// Byte offset of the 12 packed 6-bit scale/min bytes.
pub const SCALES_OFFSET: usize = 4;
/// Byte offset of the 32 high-bit bytes.
pub const QH_OFFSET: usize = 16;
/// Byte offset of the 128 nibble bytes.
pub const QS_OFFSET: usize = 48;

/// Dequantize whole blocks (ggml `dequantize_row_q5_K`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let min = rd_f16(b, DMIN_OFFSET);
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        let qh = &b[QH_OFFSET..QH_OFFSET + 32];
        let mut u1 = 1u8;
        let mut u2 = 2u8;
        for c in 0..4 {
            let ql = &b[QS_OFFSET + 32 * c..QS_OFFSET + 32 * c + 32];
            let (sc, m) = get_scale_min_k4(2 * c, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * c + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            let yc = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                yc[l] = d1 * ((ql[l] & 0xF) as i32 + h1) as f32 - m1;
                yc[l + 32] = d2 * ((ql[l] >> 4) as i32 + h2) as f32 - m2;
            }
            u1 = u1.wrapping_shl(2);
            u2 = u2.wrapping_shl(2);
        }
    });
}

fn pack(l: &[u8; 256], y: &mut [u8]) {
    y[QH_OFFSET..QH_OFFSET + 32].fill(0);
    let mut m1 = 1u8;
    let mut m2 = 2u8;
    for c in 0..4 {
        for j in 0..32 {
            let mut l1 = l[64 * c + j];
            if l1 > 15 {
                l1 -= 16;
                y[QH_OFFSET + j] |= m1;
            }
            let mut l2 = l[64 * c + j + 32];
            if l2 > 15 {
                l2 -= 16;
                y[QH_OFFSET + j] |= m2;
            }
            y[QS_OFFSET + 32 * c + j] = l1 | (l2 << 4);
        }
        m1 = m1.wrapping_shl(2);
        m2 = m2.wrapping_shl(2);
    }
}

/// Reference quantizer (ggml `quantize_row_q5_K_ref`).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; 256];
    let p = QkxSearch {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        ref_scales(x, y, 31, p, &mut l);
        requantize_k(x, y, 31, &mut l);
        pack(&l, y);
    });
}

/// Importance-weighted quantizer (ggml `quantize_row_q5_K_impl`); `qw` has `x.len()` weights.
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut l = [0u8; 256];
    let mut ib = 0;
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        impl_scales(x, y, 31, Some(&qw[256 * ib..256 * ib + 256]), true, &mut l);
        requantize_k(x, y, 31, &mut l);
        pack(&l, y);
        ib += 1;
    });
}
