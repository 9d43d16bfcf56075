//! Q8_0: 32 values per 34-byte block (ggml `block_q8_0`): `d` f16 at 0, 32 × i8 at 2.
//! `y = q * d`.

use crate::util::{
    c_cast_low_byte, for_each_block, for_each_block_mut, rd_f16, round_half_away, wr_f16,
};

/// Values per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the 32 signed quants `qs`.
pub const QS_OFFSET: usize = 2;

/// Dequantize whole blocks (ggml `dequantize_row_q8_0`).
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    for_each_block::<BLOCK_BYTES, BLOCK_ELEMS>(bytes, out, |b, y| {
        let d = rd_f16(b, D_OFFSET);
        for (o, &q) in y.iter_mut().zip(&b[QS_OFFSET..]) {
            *o = (q as i8) as f32 * d;
        }
    });
}

/// Reference quantizer (ggml `quantize_row_q8_0_ref`: `d = amax/127`, `q = roundf(x/d)`, half
/// away from zero). Importance weights do not apply to Q8_0 (ggml ignores them too).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for_each_block_mut::<BLOCK_BYTES, BLOCK_ELEMS>(x, out, |x, y| {
        let mut amax = 0.0f32;
        for &v in x {
            amax = crate::util::cmax(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(y, D_OFFSET, d);
        let q = &mut y[QS_OFFSET..QS_OFFSET + BLOCK_ELEMS];
        if id.is_finite() && x.iter().all(|v| v.is_finite()) {
            // Every |x * id| <= 127 (amax * id): the branch-free rounding below, which the
            // compiler vectorises, gives the same bytes.
            for (q, &v) in q.iter_mut().zip(x) {
                *q = round_small(v * id) as u8;
            }
        } else {
            for (q, &v) in q.iter_mut().zip(x) {
                *q = c_cast_low_byte(round_half_away(v * id));
            }
        }
    });
}

/// C `(int)roundf(v)` for `|v| < 2^31 - 1` without branches: truncate, then step away from
/// zero when the dropped fraction is at least one half (both steps exact at these magnitudes
/// for the values Q8_0 produces, |v| <= 127).
#[inline(always)]
fn round_small(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_free_rounding_equals_roundf_on_the_q8_0_range() {
        // Every f32 in [-128, 128] whose exponent makes the half-way cases interesting, plus
        // a dense sweep.
        let dense = (-2_560_000..=2_560_000).map(|i| i as f32 * 5e-5);
        let halves = (-256..=256).flat_map(|i| {
            let h = i as f32 * 0.5;
            [
                h,
                f32::from_bits(h.to_bits() + 1),
                f32::from_bits(h.to_bits().wrapping_sub(1)),
            ]
        });
        for v in dense.chain(halves).filter(|v| v.abs() <= 128.0) {
            assert_eq!(round_small(v), round_half_away(v) as i32, "{v:e}");
        }
    }
}
