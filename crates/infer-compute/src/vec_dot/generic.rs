//! Scalar reference dot products, ported from ggml `ggml/src/ggml-cpu/quants.c`
//! (`ggml_vec_dot_*_generic`, ggml commit 0253fb2). They define correctness for the SIMD
//! kernels.
//!
//! The integer sums are exact; the f32 operations keep ggml's order and use no fused
//! multiply-add, so the result equals ggml's scalar ("no-FMA", `-ffp-contract=off`) build bit for
//! bit (checked against `shared/vectors/quant/vecdot.safetensors` `*.result_generic`).
//!
//! Every function takes `n` (values in the row, a multiple of the block size), the weight blocks
//! `x` and the activation blocks `y` (raw ggml bytes, little-endian), and panics if `n` is not a
//! multiple of the block size or a slice holds fewer than `n / block` blocks (programmer errors:
//! the mat-vec entry points check byte counts from files before calling).

// The ports keep ggml's indexed loops so they can be checked line by line against the C source.
#![allow(clippy::needless_range_loop)]

use super::layout::{f16_at, f32_at, q4k_scales_mins, BlockPair};
use infer_quant::{q4_0, q4_k, q5_0, q6_k, q8_0, q8_k};

/// Q4_0 weights × Q8_0 activations (ggml `ggml_vec_dot_q4_0_q8_0_generic`):
/// per block `sumf += ((f32)sumi * d_x) * d_y`, `sumi = Σ (nibble − 8)·q8`.
pub fn vec_dot_q4_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = BlockPair::Q4_0_Q8_0.blocks(n, x, y);
    let mut sumf = 0.0f32;
    for ib in 0..nb {
        let xb = &x[ib * q4_0::BLOCK_BYTES..(ib + 1) * q4_0::BLOCK_BYTES];
        let yb = &y[ib * q8_0::BLOCK_BYTES..(ib + 1) * q8_0::BLOCK_BYTES];
        let qs = &xb[q4_0::QS_OFFSET..q4_0::QS_OFFSET + 16];
        let q8 = &yb[q8_0::QS_OFFSET..q8_0::QS_OFFSET + 32];
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..16 {
            let v0 = (qs[j] & 0x0F) as i32 - 8;
            let v1 = (qs[j] >> 4) as i32 - 8;
            sumi0 += v0 * q8[j] as i8 as i32;
            sumi1 += v1 * q8[j + 16] as i8 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += sumi as f32 * f16_at(xb, q4_0::D_OFFSET) * f16_at(yb, q8_0::D_OFFSET);
    }
    sumf
}

/// Q5_0 weights × Q8_0 activations (ggml `ggml_vec_dot_q5_0_q8_0_generic`):
/// per block `sumf += (d_x * d_y) * (f32)sumi`, `sumi = Σ ((nibble | bit<<4) − 16)·q8`.
pub fn vec_dot_q5_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = BlockPair::Q5_0_Q8_0.blocks(n, x, y);
    let mut sumf = 0.0f32;
    for ib in 0..nb {
        let xb = &x[ib * q5_0::BLOCK_BYTES..(ib + 1) * q5_0::BLOCK_BYTES];
        let yb = &y[ib * q8_0::BLOCK_BYTES..(ib + 1) * q8_0::BLOCK_BYTES];
        let o = q5_0::QH_OFFSET;
        let qh = u32::from_le_bytes([xb[o], xb[o + 1], xb[o + 2], xb[o + 3]]);
        let qs = &xb[q5_0::QS_OFFSET..q5_0::QS_OFFSET + 16];
        let q8 = &yb[q8_0::QS_OFFSET..q8_0::QS_OFFSET + 32];
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..16 {
            let xh0 = (((qh >> j) & 1) << 4) as u8;
            let xh1 = (((qh >> (j + 16)) & 1) << 4) as u8;
            let x0 = ((qs[j] & 0x0F) | xh0) as i32 - 16;
            let x1 = ((qs[j] >> 4) | xh1) as i32 - 16;
            sumi0 += x0 * q8[j] as i8 as i32;
            sumi1 += x1 * q8[j + 16] as i8 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_at(xb, q5_0::D_OFFSET) * f16_at(yb, q8_0::D_OFFSET)) * sumi as f32;
    }
    sumf
}

/// Q8_0 weights × Q8_0 activations (ggml `ggml_vec_dot_q8_0_q8_0_generic`):
/// per block `sumf += (f32)sumi * (d_x * d_y)`.
pub fn vec_dot_q8_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = BlockPair::Q8_0_Q8_0.blocks(n, x, y);
    let mut sumf = 0.0f32;
    for ib in 0..nb {
        let xb = &x[ib * q8_0::BLOCK_BYTES..(ib + 1) * q8_0::BLOCK_BYTES];
        let yb = &y[ib * q8_0::BLOCK_BYTES..(ib + 1) * q8_0::BLOCK_BYTES];
        let mut sumi = 0i32;
        for j in 0..32 {
            let o = q8_0::QS_OFFSET + j;
            sumi += xb[o] as i8 as i32 * yb[o] as i8 as i32;
        }
        sumf += sumi as f32 * (f16_at(xb, q8_0::D_OFFSET) * f16_at(yb, q8_0::D_OFFSET));
    }
    sumf
}

/// Q4_K weights × Q8_K activations (ggml `ggml_vec_dot_q4_K_q8_K_generic`). Per super-block:
/// `d = f16(d)·y.d`; eight lane sums `sums[l] += d·(f32)aux32[l]` where `aux32[l]` is the integer
/// Σ sc·q·q8 over elements ≡ l (mod 8); `sumf -= (f16(dmin)·y.d)·(f32)Σ_g bsums[g]·m[g/2]`.
/// At the end `sumf += sums[0..8]` in order.
pub fn vec_dot_q4_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = BlockPair::Q4_K_Q8_K.blocks(n, x, y);
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    let mut aux8 = [0i8; 256];
    for i in 0..nb {
        let xb = &x[i * q4_k::BLOCK_BYTES..(i + 1) * q4_k::BLOCK_BYTES];
        let yb = &y[i * q8_k::BLOCK_BYTES..(i + 1) * q8_k::BLOCK_BYTES];
        let q4 = &xb[q4_k::QS_OFFSET..q4_k::QS_OFFSET + 128];
        let q8 = &yb[q8_k::QS_OFFSET..q8_k::QS_OFFSET + 256];
        for j in 0..4 {
            for l in 0..32 {
                aux8[64 * j + l] = (q4[32 * j + l] & 0xF) as i8;
                aux8[64 * j + 32 + l] = (q4[32 * j + l] >> 4) as i8;
            }
        }
        let sm = q4k_scales_mins(&xb[q4_k::SCALES_OFFSET..q4_k::SCALES_OFFSET + 12]);
        let (scales, mins) = sm.split_at(8);
        let mut sumi = 0i32;
        for g in 0..16 {
            let o = q8_k::BSUMS_OFFSET + 2 * g;
            let bsum = i16::from_le_bytes([yb[o], yb[o + 1]]) as i32;
            sumi += bsum * mins[g / 2] as i32;
        }
        let mut aux32 = [0i32; 8];
        for j in 0..8 {
            let scale = scales[j] as i32;
            for k in 0..4 {
                for l in 0..8 {
                    let e = 32 * j + 8 * k + l;
                    // ggml computes q8*a in int16 (exact: |q8·a| ≤ 128·15), then scale·aux16.
                    let aux16 = (q8[e] as i8 as i16) * (aux8[e] as i16);
                    aux32[l] += scale * aux16 as i32;
                }
            }
        }
        let yd = f32_at(yb, q8_k::D_OFFSET);
        let d = f16_at(xb, q4_k::D_OFFSET) * yd;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_at(xb, q4_k::DMIN_OFFSET) * yd;
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// Q6_K weights × Q8_K activations (ggml `ggml_vec_dot_q6_K_q8_K_generic`): the eight-lane
/// scheme of [`vec_dot_q4_k_q8_k`] with `sc·(q − 32)·q8` (16-value sub-blocks, i8 scales) and no
/// min term.
pub fn vec_dot_q6_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = BlockPair::Q6_K_Q8_K.blocks(n, x, y);
    let mut sums = [0.0f32; 8];
    let mut aux8 = [0i8; 256];
    for i in 0..nb {
        let xb = &x[i * q6_k::BLOCK_BYTES..(i + 1) * q6_k::BLOCK_BYTES];
        let yb = &y[i * q8_k::BLOCK_BYTES..(i + 1) * q8_k::BLOCK_BYTES];
        let q8 = &yb[q8_k::QS_OFFSET..q8_k::QS_OFFSET + 256];
        for h in 0..2 {
            let ql = &xb[q6_k::QL_OFFSET + 64 * h..q6_k::QL_OFFSET + 64 * h + 64];
            let qh = &xb[q6_k::QH_OFFSET + 32 * h..q6_k::QH_OFFSET + 32 * h + 32];
            let a = &mut aux8[128 * h..128 * h + 128];
            for l in 0..32 {
                a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let sc = &xb[q6_k::SCALES_OFFSET..q6_k::SCALES_OFFSET + 16];
        let mut aux32 = [0i32; 8];
        for j in 0..16 {
            let scale = sc[j] as i8 as i32;
            for k in 0..2 {
                for l in 0..8 {
                    let e = 16 * j + 8 * k + l;
                    let aux16 = (q8[e] as i8 as i16) * (aux8[e] as i16);
                    aux32[l] += scale * aux16 as i32;
                }
            }
        }
        let d = f16_at(xb, q6_k::D_OFFSET) * f32_at(yb, q8_k::D_OFFSET);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}
