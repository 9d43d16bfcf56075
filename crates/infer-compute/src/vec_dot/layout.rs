//! Block-pair geometry and little-endian field readers shared by the scalar and SIMD kernels.

use infer_quant::{q4_0, q4_k, q5_0, q6_k, q8_0, q8_k};

/// Read the little-endian f16 at `b[off..off + 2]` as f32 (bit-identical to
/// `infer_quant::float16::f16_to_f32`; inlined scalar code).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Read the little-endian f32 at `b[off..off + 4]`.
#[inline(always)]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// f16 bits to f32 without F16C and without subnormal f32 arithmetic (which costs a microcode
/// assist on x86), bit-identical to `half` / F16C: normals by rebasing the exponent in integer
/// arithmetic, subnormals as `mantissa · 2⁻²⁴` (exact), ±inf kept, NaN quieted
/// (`sign | 0x7FC00000 | mantissa << 13`). Used where a vector conversion of one scalar would
/// create a false dependency (see `avx2::q6_k_q8_k`).
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let bits = if em < 0x0400 {
        (em as f32 * (1.0 / 16_777_216.0)).to_bits()
    } else if em < 0x7c00 {
        (em << 13) + ((127 - 15) << 23)
    } else {
        let nan = if em > 0x7c00 { 0x0040_0000 } else { 0 };
        0x7f80_0000 | ((em & 0x3ff) << 13) | nan
    };
    f32::from_bits(bits | sign)
}

/// The 8 six-bit scales (bytes 0..8) and 8 six-bit mins (bytes 8..16) of a Q4_K/Q5_K block from
/// its 12 packed bytes, by ggml's `utmp`/`kmask` shuffle (equal to `get_scale_min_k4(j)` for
/// j = 0..8).
#[inline(always)]
pub(crate) fn q4k_scales_mins(s: &[u8]) -> [u8; 16] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let u1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let u2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let t3 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let t1 = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let t2 = u1 & KMASK1;
    let t0 = u0 & KMASK1;
    let mut out = [0u8; 16];
    for (o, t) in out.chunks_exact_mut(4).zip([t0, t1, t2, t3]) {
        o.copy_from_slice(&t.to_le_bytes());
    }
    out
}

/// A (weight format, activation format) pair with a fused dot-product kernel.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockPair {
    Q4_0_Q8_0,
    Q5_0_Q8_0,
    Q8_0_Q8_0,
    Q4_K_Q8_K,
    Q6_K_Q8_K,
}

impl BlockPair {
    /// (values per block, weight block bytes, activation block bytes).
    pub(crate) const fn geometry(self) -> (usize, usize, usize) {
        match self {
            BlockPair::Q4_0_Q8_0 => (32, q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES),
            BlockPair::Q5_0_Q8_0 => (32, q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES),
            BlockPair::Q8_0_Q8_0 => (32, q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES),
            BlockPair::Q4_K_Q8_K => (256, q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES),
            BlockPair::Q6_K_Q8_K => (256, q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES),
        }
    }

    /// Number of blocks in `n` values; panics (programmer error) if `n` is not a multiple of the
    /// block size or a slice is too short for `n` values.
    #[inline]
    pub(crate) fn blocks(self, n: usize, x: &[u8], y: &[u8]) -> usize {
        let (be, xb, yb) = self.geometry();
        assert!(
            n.is_multiple_of(be),
            "{self:?} dot: n = {n} is not a multiple of {be}"
        );
        let nb = n / be;
        assert!(
            x.len() >= nb * xb && y.len() >= nb * yb,
            "{self:?} dot: n = {n} needs {} weight and {} activation bytes, got {} and {}",
            nb * xb,
            nb * yb,
            x.len(),
            y.len()
        );
        nb
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_quant::float16::f16_to_f32;

    /// ggml `get_scale_min_k4`, straight from its definition.
    fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    #[test]
    fn scalar_f16_conversion_matches_half_for_all_patterns() {
        for h in 0..=u16::MAX {
            let want = f16_to_f32(h).to_bits();
            assert_eq!(f16_bits_to_f32(h).to_bits(), want, "f16 bits {h:#06x}");
        }
    }

    #[test]
    fn scales_mins_shuffle_matches_get_scale_min_k4() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..1000 {
            let mut s = [0u8; 12];
            for b in s.iter_mut() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (state >> 56) as u8;
            }
            let sm = q4k_scales_mins(&s);
            for j in 0..8 {
                assert_eq!((sm[j], sm[8 + j]), get_scale_min_k4(j, &s), "j = {j}");
            }
        }
    }
}
