//! [`KvType`]: the element type a backend stores KV cache rows in (llama.cpp's
//! `--cache-type-k/-v`, `-ctk/-ctv`).

use std::fmt;
use std::str::FromStr;

use half::f16;

use crate::ComputeError;

/// How a backend stores the values of KV cache rows. The forward pass sees f32 values either
/// way: keys and values are rounded when they are stored and widened when they are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// 4 bytes per value, exact.
    #[default]
    F32,
    /// IEEE half precision, 2 bytes per value (round to nearest even; llama.cpp's default).
    F16,
    /// ggml `block_q8_0`: per 32 values an f16 scale `d = amax / 127` and 32 int8
    /// `round(x / d)` (34 bytes, ggml `quantize_row_q8_0_ref`). A block never straddles two
    /// heads, so head_dim must be a multiple of 32.
    Q8_0,
}

impl KvType {
    /// Every type, in the order of the `--kv-type` help.
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// The name `--kv-type` takes: `f32`, `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one cache row of `width` values (`width` a multiple of 32 for Q8_0).
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvType::F32 => 4 * width,
            KvType::F16 => 2 * width,
            KvType::Q8_0 => width / 32 * 34,
        }
    }

    /// Error unless rows of heads of `head_dim` values can be stored in this type: Q8_0 needs
    /// head_dim a multiple of 32 (a block within one head), F16 an even head_dim (the kernels
    /// read value pairs). Errors: [`ComputeError::KvType`] naming head_dim.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), ComputeError> {
        let need = match self {
            KvType::F32 => 1,
            KvType::F16 => 2,
            KvType::Q8_0 => 32,
        };
        if head_dim == 0 || !head_dim.is_multiple_of(need) {
            return Err(ComputeError::KvType {
                kv: self,
                reason: format!(
                    "head_dim {head_dim} is not a multiple of {need} (use --kv-type f32 or f16)"
                ),
            });
        }
        Ok(())
    }
}

/// An element type of KV cache rows that the CPU attention kernels ([`crate::attention`]) read
/// in place: `f32`, or `half::f16` widened exactly to f32 as it is loaded (F16C
/// `_mm256_cvtph_ps` on AVX2), so that attention over an f16 cache is attention over the
/// f32 values it holds. Sealed: implemented for those two types only.
pub trait KvElem: sealed::Elem {}

impl KvElem for f32 {}
impl KvElem for f16 {}

pub(crate) mod sealed {
    use half::f16;
    use half::slice::HalfFloatSliceExt;

    /// The loads the attention kernels need of a KV element type (see [`super::KvElem`]).
    pub trait Elem: Copy + Send + Sync + fmt::Debug + 'static {
        /// The value as f32 (exact).
        fn widen(self) -> f32;

        /// Keys or values `j0..j0 + n` of one head (values `col..col + hd` of rows `row_len`
        /// wide, `src` `[rows, row_len]`) as an f32 matrix `[n, hd]` for `sgemm`: its first
        /// value and row stride (in values). f32: a pointer into `src`, stride `row_len` (no
        /// copy); f16: the rows widened into `buf` (at least `n · hd` values), stride `hd`.
        /// Panics if the rows lie outside `src` or `buf` is short.
        fn tile(
            src: &[Self],
            j0: usize,
            n: usize,
            row_len: usize,
            col: usize,
            hd: usize,
            buf: &mut [f32],
        ) -> (*const f32, usize);

        /// Values `buf` must hold for [`Elem::tile`] of `n` rows of `hd` (0 for f32).
        fn tile_buf(n: usize, hd: usize) -> usize;

        /// Eight key rows of `hd` values (`hd` a multiple of 8) as f32 rows: f32 returns
        /// `rows` (no copy); f16 widens them into `wide` (at least `8 · hd` values, row `u` at
        /// `u · hd`) and returns pointers to those, so that a key tile scored for several query
        /// heads is converted once.
        ///
        /// # Safety
        /// AVX2 and F16C must be available; `rows[u]..rows[u] + hd` must be readable.
        #[cfg(target_arch = "x86_64")]
        unsafe fn keys8(rows: [*const Self; 8], hd: usize, wide: &mut [f32]) -> [*const f32; 8];

        /// Eight values from `p` widened to f32.
        ///
        /// # Safety
        /// AVX2 and F16C must be available; `p..p + 8` must be readable.
        #[cfg(target_arch = "x86_64")]
        unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    }

    use std::fmt;

    impl Elem for f32 {
        #[inline(always)]
        fn widen(self) -> f32 {
            self
        }

        fn tile(
            src: &[f32],
            j0: usize,
            n: usize,
            row_len: usize,
            col: usize,
            hd: usize,
            _buf: &mut [f32],
        ) -> (*const f32, usize) {
            assert!(n == 0 || (j0 + n - 1) * row_len + col + hd <= src.len());
            (src[j0 * row_len + col..].as_ptr(), row_len)
        }

        fn tile_buf(_n: usize, _hd: usize) -> usize {
            0
        }

        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn keys8(rows: [*const f32; 8], _hd: usize, _wide: &mut [f32]) -> [*const f32; 8] {
            rows
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx")]
        #[inline]
        unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
            // SAFETY: 8 floats readable at p (the caller's contract).
            unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
        }
    }

    impl Elem for f16 {
        #[inline(always)]
        fn widen(self) -> f32 {
            self.to_f32()
        }

        fn tile(
            src: &[f16],
            j0: usize,
            n: usize,
            row_len: usize,
            col: usize,
            hd: usize,
            buf: &mut [f32],
        ) -> (*const f32, usize) {
            for (i, dst) in buf[..n * hd].chunks_exact_mut(hd).enumerate() {
                src[(j0 + i) * row_len + col..][..hd].convert_to_f32_slice(dst);
            }
            (buf.as_ptr(), hd)
        }

        fn tile_buf(n: usize, hd: usize) -> usize {
            n * hd
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx,f16c")]
        #[inline]
        unsafe fn keys8(rows: [*const f16; 8], hd: usize, wide: &mut [f32]) -> [*const f32; 8] {
            use std::arch::x86_64::*;
            let wide = &mut wide[..8 * hd];
            for (u, &row) in rows.iter().enumerate() {
                for c in (0..hd).step_by(8) {
                    // SAFETY: c + 8 <= hd (a multiple of 8): inside row `u` (the caller's
                    // contract) and inside `wide`'s row `u`; F16C is available.
                    unsafe {
                        let x = _mm256_cvtph_ps(_mm_loadu_si128(row.add(c) as *const __m128i));
                        _mm256_storeu_ps(wide.as_mut_ptr().add(u * hd + c), x);
                    }
                }
            }
            std::array::from_fn(|u| wide[u * hd..].as_ptr())
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx,f16c")]
        #[inline]
        unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
            use std::arch::x86_64::*;
            // SAFETY: 8 halves (16 bytes) readable at p (the caller's contract).
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    /// `f32`, `f16` or `q8_0` (also `q8`), case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            _ => Err(format!("'{s}': expected f32, f16 or q8_0")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_ggml() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
        assert_eq!("Q8".parse::<KvType>(), Ok(KvType::Q8_0));
        assert!("q4_0".parse::<KvType>().is_err());
        // ggml: sizeof(block_q8_0) = 34 for 32 values; f16 2 bytes.
        assert_eq!(KvType::Q8_0.row_bytes(1024), 1088);
        assert_eq!(KvType::F16.row_bytes(1024), 2048);
        assert_eq!(KvType::F32.row_bytes(1024), 4096);
        assert!(KvType::Q8_0.check_head_dim(64).is_ok());
        let e = KvType::Q8_0.check_head_dim(16).unwrap_err().to_string();
        assert!(e.contains("head_dim 16"), "{e}");
        assert!(KvType::F16.check_head_dim(7).is_err());
        assert!(KvType::F32.check_head_dim(7).is_ok());
    }
}
