//! Small helpers shared by the block formats: little-endian field access, ggml's `nearest_int`,
//! C float-to-small-int casts, and the K-quant 6-bit scale packing.

use crate::float16::{f16_to_f32, f32_to_f16};

/// Read the little-endian f16 at `b[off..off + 2]` as f32.
#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Write `x` as a little-endian f16 (ggml `GGML_FP32_TO_FP16`) at `b[off..off + 2]`.
#[inline(always)]
pub(crate) fn wr_f16(b: &mut [u8], off: usize, x: f32) {
    b[off..off + 2].copy_from_slice(&f32_to_f16(x).to_le_bytes());
}

/// ggml `nearest_int`: round half to even via the `+ 12582912.0f` bit trick. ggml asserts
/// `|f| <= 4194303`; release builds skip that check and return this deterministic value, which
/// we reproduce.
#[inline(always)]
pub(crate) fn nearest_int(f: f32) -> i32 {
    let val = f + 12582912.0f32;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// C `roundf`: round half away from zero, bit for bit (signed zeros, NaN and values of 2^23
/// and more pass through), without the libm call `f32::round` becomes on baseline x86-64.
#[inline(always)]
pub(crate) fn round_half_away(f: f32) -> f32 {
    if f.is_nan() || f.abs() >= 8_388_608.0 {
        return f; // already an integer, or infinite, or NaN
    }
    // |f| < 2^23: the truncation and the difference are exact.
    let t = ((f as i32) as f32).copysign(f);
    if (f - t).abs() >= 0.5 {
        t + 1.0f32.copysign(f)
    } else {
        t
    }
}

/// A C `(int8_t)f` / `(uint8_t)f` conversion as x86-64 GCC compiles it (`cvttss2si` to i32,
/// then the low byte). Finite values in i32 range truncate toward zero and wrap; non-finite or
/// out-of-range values (undefined behaviour in C) give the "integer indefinite" 0x80000000,
/// whose low byte is 0. This reproduces ggml's bytes for the `rows_c_undefined_behaviour` rows.
#[inline(always)]
pub(crate) fn c_cast_low_byte(f: f32) -> u8 {
    if f > -2_147_483_904.0 && f < 2_147_483_648.0 {
        (f as i32) as u8
    } else {
        0
    }
}

/// C `MIN(a, b)` = `a < b ? a : b` on floats (the order matters for NaN and signed zeros).
#[inline(always)]
pub(crate) fn cmin(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// C `MAX(a, b)` = `a > b ? a : b` on floats.
#[inline(always)]
pub(crate) fn cmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// ggml `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed
/// bytes of a Q4_K/Q5_K block.
#[inline(always)]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Pack 6-bit scale `ls` and min `lm` of sub-block `j` into Q4_K/Q5_K `scales[12]`
/// (the inverse of [`get_scale_min_k4`]; `scales` must start zeroed for `j >= 4` packing).
#[inline(always)]
pub(crate) fn put_scale_min_k4(j: usize, ls: u8, lm: u8, scales: &mut [u8]) {
    if j < 4 {
        scales[j] = ls;
        scales[j + 4] = lm;
    } else {
        scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
        scales[j - 4] |= (ls >> 4) << 6;
        scales[j] |= (lm >> 4) << 6;
    }
}

/// Run `f` on every (block bytes, block output) pair. The caller has checked that
/// `bytes.len() / BB == out.len() / BE`.
#[inline(always)]
pub(crate) fn for_each_block<const BB: usize, const BE: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; BB], &mut [f32; BE]),
) {
    for (b, o) in bytes.chunks_exact(BB).zip(out.chunks_exact_mut(BE)) {
        if let (Ok(b), Ok(o)) = (<&[u8; BB]>::try_from(b), <&mut [f32; BE]>::try_from(o)) {
            f(b, o);
        }
    }
}

/// Run `f` on every (input block, output block bytes) pair for quantization.
#[inline(always)]
pub(crate) fn for_each_block_mut<const BB: usize, const BE: usize>(
    x: &[f32],
    out: &mut [u8],
    mut f: impl FnMut(&[f32; BE], &mut [u8; BB]),
) {
    for (xb, o) in x.chunks_exact(BE).zip(out.chunks_exact_mut(BB)) {
        if let (Ok(xb), Ok(o)) = (<&[f32; BE]>::try_from(xb), <&mut [u8; BB]>::try_from(o)) {
            f(xb, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::round_half_away;

    #[test]
    fn round_half_away_equals_roundf() {
        let edges = [
            0.0f32,
            -0.0,
            0.5,
            -0.5,
            1.5,
            2.5,
            -2.5,
            0.49999997,
            -0.49999997,
            8_388_607.5,
            -8_388_607.5,
            8_388_608.0,
            16_777_217.0,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            f32::NAN,
        ];
        // Plus a sweep of bit patterns across the whole range, both signs.
        let sweep = (0..1u32 << 20).map(|i| f32::from_bits(i.wrapping_mul(4099) ^ (i << 31)));
        for f in edges.into_iter().chain(sweep) {
            let (got, want) = (round_half_away(f), f.round());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{f:e}: {got:e} vs roundf {want:e}"
            );
        }
    }
}
