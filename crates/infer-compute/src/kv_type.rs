//! [`KvType`]: the element type a backend stores KV cache rows in (llama.cpp's
//! `--cache-type-k/-v`, `-ctk/-ctv`).

use std::fmt;
use std::str::FromStr;

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
