//! Q4_K: 256 values per 144-byte super-block (ggml `block_q4_K`): `d` f16 at 0, `dmin` f16 at 2,
//! `scales[12]` at 4 (8 packed 6-bit scales and mins, see `get_scale_min_k4`), `qs[128]` at 16.
//! Element `64c + l` (l < 32) is the low nibble of `qs[32c + l]`, element `64c + 32 + l` the high
//! nibble. `y = (d * sc) * q - dmin * m`.

use crate::search::{make_qkx2_quants, make_qkx3_quants, make_qp_quants, QkxSearch};
use crate::util::{
    for_each_block, for_each_block_mut, get_scale_min_k4, nearest_int, put_scale_min_k4, rd_f16,
    wr_f16,
};

/// Values per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block (the canonical ggml layout; not the non-canonical 148).
pub const BLOCK_BYTES: usize = 144;
/// Byte offset of the f16 super-block scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 super-block min scale `dmin`.
pub const DMIN_OFFSET: usize = 2;
/// Byte offset of the 12 packed 6-bit scale/min bytes.
pub const SCALES_OFFSET: usize = 4;
/// Byte offset of the 128 nibble bytes.
pub const QS_OFFSET: usize = 16;

/// The 12 `scales` bytes of a Q4_K/Q5_K block holding the 6-bit sub-block scales `sc` and
/// mins `m` (each `0..64`; higher bits are dropped), packed as ggml does (the inverse of
/// ggml's `get_scale_min_k4`).
pub fn pack_scale_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for j in 0..8 {
        put_scale_min_k4(j, sc[j] & 63, m[j] & 63, &mut out);
    }
    out
}

/// Dequantize whole blocks (ggml `dequantize_row_q4_K`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        let min = rd_f16(b, DMIN_OFFSET);
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        for c in 0..4 {
            let q = &b[QS_OFFSET + 32 * c..QS_OFFSET + 32 * c + 32];
            let (sc, m) = get_scale_min_k4(2 * c, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * c + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            let yc = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                yc[l] = d1 * (q[l] & 0xF) as f32 - m1;
                yc[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    });
}

/// Requantize against the stored scales (levels `0..=nmax`), shared with Q5_K.
pub(crate) fn requantize_k(x: &[f32; 256], y: &[u8], nmax: i32, l: &mut [u8; 256]) {
    let scales = &y[SCALES_OFFSET..SCALES_OFFSET + 12];
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let d = rd_f16(y, D_OFFSET) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = rd_f16(y, DMIN_OFFSET) * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d);
            l[32 * j + ii] = q.min(nmax).max(0) as u8;
        }
    }
}

/// The `_ref` scale search shared with Q5_K: per 32-value sub-block `make_qkx2_quants` with
/// weights `av_x + |x|`, then 6-bit scales/mins relative to the maxima. Writes `d`, `dmin`,
/// `scales` and leaves the levels in `l`.
pub(crate) fn ref_scales(x: &[f32; 256], y: &mut [u8], nmax: i32, p: QkxSearch, l: &mut [u8; 256]) {
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for i in 0..32 {
            weights[i] = av_x + xs[i].abs();
        }
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], p);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut y[SCALES_OFFSET..SCALES_OFFSET + 12];
    sc.fill(0);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        put_scale_min_k4(j, ls, lm, sc);
    }
    wr_f16(y, D_OFFSET, max_scale / 63.0);
    wr_f16(y, DMIN_OFFSET, max_min / 63.0);
}

/// The `_impl` scale search shared with Q5_K (`make_qkx3_quants` + `make_qp_quants`).
/// `qw` are this block's 256 importance weights (or `None`: `av_x + |x|`).
pub(crate) fn impl_scales(
    x: &[f32; 256],
    y: &mut [u8],
    nmax: i32,
    qw: Option<&[f32]>,
    clamp63: bool,
    l: &mut [u8; 256],
) {
    let mut laux = [0u8; 32];
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let mut weights = [0.0f32; 32];
    let mut sw = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let p = QkxSearch {
        rmin: -0.9,
        rdelta: 0.05,
        nstep: 36,
        use_mad: false,
    };
    let mut sum_x2 = 0.0f32;
    for &v in x.iter() {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / 256.0;
    let av_x = sigma2.sqrt();
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        match qw {
            Some(qw) => {
                for i in 0..32 {
                    weights[i] = qw[32 * j + i] * (sigma2 + xs[i] * xs[i]).sqrt();
                }
            }
            None => {
                for i in 0..32 {
                    weights[i] = av_x + xs[i].abs();
                }
            }
        }
        let mut sumw = 0.0f32;
        for &w in &weights {
            sumw += w;
        }
        sw[j] = sumw;
        let (s, m) = make_qkx3_quants(
            nmax,
            xs,
            Some(&weights),
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            p,
        );
        scales[j] = s;
        mins[j] = m;
    }
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    let sc = &mut y[SCALES_OFFSET..SCALES_OFFSET + 12];
    sc.fill(0);
    for j in 0..8 {
        let (a, b) = if clamp63 {
            (ls[j].min(63), lm[j].min(63))
        } else {
            (ls[j], lm[j])
        };
        put_scale_min_k4(j, a, b, sc);
    }
    wr_f16(y, D_OFFSET, d_block);
    wr_f16(y, DMIN_OFFSET, m_block);
}

fn pack_qs(l: &[u8; 256], y: &mut [u8]) {
    for c in 0..4 {
        for i in 0..32 {
            y[QS_OFFSET + 32 * c + i] = l[64 * c + i] | (l[64 * c + i + 32] << 4);
        }
    }
}

/// Reference quantizer (ggml `quantize_row_q4_K_ref`).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; 256];
    let p = QkxSearch {
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        ref_scales(x, y, 15, p, &mut l);
        requantize_k(x, y, 15, &mut l);
        pack_qs(&l, y);
    });
}

/// Importance-weighted quantizer (ggml `quantize_row_q4_K_impl`); `qw` has `x.len()` weights.
pub fn quantize_row_impl(x: &[f32], out: &mut [u8], qw: &[f32]) {
    let mut l = [0u8; 256];
    let mut ib = 0;
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        impl_scales(x, y, 15, Some(&qw[256 * ib..256 * ib + 256]), false, &mut l);
        requantize_k(x, y, 15, &mut l);
        pack_qs(&l, y);
        ib += 1;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`pack_scale_mins`] is the inverse of ggml's `get_scale_min_k4` for every sub-block.
    #[test]
    fn pack_scale_mins_round_trips() {
        let sc: [u8; 8] = std::array::from_fn(|j| (j as u8 * 29 + 3) % 64);
        let m: [u8; 8] = std::array::from_fn(|j| 63 - (j as u8 * 11) % 64);
        let packed = pack_scale_mins(&sc, &m);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }
}
