//! IEEE binary16 (`f16`) and bfloat16 (`bf16`) conversions, bit-exact with ggml.
//!
//! Values are passed as raw `u16` bit patterns (the on-disk little-endian encoding), since that is
//! how ggml blocks and GGUF tensors store them.

/// f16 bits -> f32, exact (ggml `GGML_FP16_TO_FP32`). NaNs are quieted: `sign | 0x7FC00000 |
/// mantissa << 13`.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 -> f16 bits, round-to-nearest-even with overflow to ±inf (ggml `GGML_FP32_TO_FP16`,
/// `ggml_compute_fp32_to_fp16`). Every NaN becomes `0x7E00 | sign` (payload dropped), as in ggml;
/// `half::f16::from_f32` alone would keep payload bits.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        return 0x7E00 | sign;
    }
    half::f16::from_f32(x).to_bits()
}

/// bf16 bits -> f32: `bits << 16`, no quieting (ggml `GGML_BF16_TO_FP32`).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 -> bf16 bits (ggml `ggml_compute_fp32_to_bf16`, used by `ggml_fp32_to_bf16_row_ref`):
/// NaN -> `(bits >> 16) | 0x40`; otherwise round-to-nearest-even on the upper 16 bits,
/// `(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16`. Subnormals are not flushed.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Decode little-endian f16 values (`bytes.len() == 2 * out.len()`, checked by the caller).
/// Through `half`'s slice conversion (F16C, eight values at a time, where the CPU has it; the
/// same exact widening as [`f16_to_f32`]), via a stack buffer since `bytes` need not be
/// 2-aligned.
pub(crate) fn f16_row_to_f32(bytes: &[u8], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let mut buf = [half::f16::ZERO; 1024];
    for (b, o) in bytes.chunks(2 * buf.len()).zip(out.chunks_mut(buf.len())) {
        let h = &mut buf[..o.len()];
        for (x, p) in h.iter_mut().zip(b.chunks_exact(2)) {
            *x = half::f16::from_le_bytes([p[0], p[1]]);
        }
        h.convert_to_f32_slice(o);
    }
}

#[cfg(test)]
fn f16_row_to_f32_scalar(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes.chunks_exact(2).zip(out.iter_mut()) {
        *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Decode little-endian bf16 values (`bytes.len() == 2 * out.len()`, checked by the caller).
pub(crate) fn bf16_row_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes.chunks_exact(2).zip(out.iter_mut()) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Decode little-endian f32 values (`bytes.len() == 4 * out.len()`, checked by the caller).
pub(crate) fn f32_le_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_widening_equals_the_scalar_one() {
        // Every f16 bit pattern (NaNs, infinities, subnormals), at an odd length so the tail
        // runs too.
        let bytes: Vec<u8> = (0..=u16::MAX)
            .chain(0..3)
            .flat_map(u16::to_le_bytes)
            .collect();
        let n = bytes.len() / 2;
        let (mut fast, mut slow) = (vec![0f32; n], vec![0f32; n]);
        f16_row_to_f32(&bytes, &mut fast);
        f16_row_to_f32_scalar(&bytes, &mut slow);
        for (i, (a, b)) in fast.iter().zip(&slow).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "f16 bits {i:#06x}");
        }
    }

    #[test]
    fn nan_handling_matches_ggml() {
        assert_eq!(f32_to_f16(f32::from_bits(0x7FA1_2345)), 0x7E00);
        assert_eq!(f32_to_f16(f32::from_bits(0xFFA1_2345)), 0xFE00);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7FA1_2345)), 0x7FE1);
        assert_eq!(f32_to_bf16(f32::from_bits(0xFF80_0001)), 0xFFC0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
        assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xFF80);
        // ties to even: 1 + 2^-8 lies halfway between two bf16 values.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_f16(65520.0), 0x7C00);
        assert_eq!(bf16_to_f32(0x7F81).to_bits(), 0x7F81_0000);
    }
}
