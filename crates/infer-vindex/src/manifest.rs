//! Tensor entries `{key, shape, format, offset, length}` (the manifest format of every `.bin`),
//! and their validation against the file they point into.

use std::path::Path;

use infer_quant::QuantFormat;
use serde::{Deserialize, Serialize};

use crate::VindexError;

/// Every tensor starts at a multiple of this many bytes in its file, so `f32`/`f16` slices taken
/// from a page-aligned mmap are aligned (and cache-line aligned for SIMD kernels).
pub const TENSOR_ALIGN: usize = 64;

/// One tensor inside a `.bin` file.
///
/// `format` is required in JSON (never defaulted) and parsed with [`QuantFormat::from_name`], so an
/// unknown tag is a load error. `length` must equal `format.expected_bytes(shape)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    /// Canonical (Llama-style HF) tensor name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub key: String,
    /// Row-major shape as stored (down_proj is stored transposed: `[intermediate, hidden]`).
    pub shape: Vec<usize>,
    /// Storage format tag (`"F32"`, `"F16"`, later quantized ggml formats).
    #[serde(with = "format_tag")]
    pub format: QuantFormat,
    /// Byte offset in the file; a multiple of [`TENSOR_ALIGN`].
    pub offset: usize,
    /// Byte length.
    pub length: usize,
}

impl TensorEntry {
    /// Number of values (`shape` product).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Check the entry against its file: known length for its shape and format
    /// ([`QuantFormat::expected_bytes`]), aligned offset, and `[offset, offset+length)` inside a
    /// file of `file_len` bytes. Errors: [`VindexError::BadEntry`] naming `file` and the key.
    pub fn validate(&self, file: &Path, file_len: usize) -> Result<(), VindexError> {
        let bad = |msg: String| VindexError::BadEntry {
            path: file.to_path_buf(),
            key: self.key.clone(),
            msg,
        };
        let expected = self.format.expected_bytes(&self.shape).map_err(|e| {
            bad(format!(
                "shape {:?} invalid for {}: {e}",
                self.shape, self.format
            ))
        })?;
        if expected != self.length {
            return Err(bad(format!(
                "length {} bytes but shape {:?} in {} needs {expected}",
                self.length, self.shape, self.format
            )));
        }
        if self.offset % TENSOR_ALIGN != 0 {
            return Err(bad(format!(
                "offset {} is not a multiple of {TENSOR_ALIGN}",
                self.offset
            )));
        }
        let end = self.offset.checked_add(self.length);
        match end {
            Some(end) if end <= file_len => Ok(()),
            _ => Err(bad(format!(
                "bytes {}..{} lie outside the file ({file_len} bytes)",
                self.offset,
                self.offset.saturating_add(self.length)
            ))),
        }
    }
}

/// Format tag of the int8 value plane of the Q8 attention tier (ggml's `GGML_TYPE_I8` name).
pub const I8_TAG: &str = "I8";

/// One tensor of the int8 value plane ([`crate::files::ATTN_Q8_BIN`]): the same
/// `{key, shape, format, offset, length}` as [`TensorEntry`], with `format` always `"I8"`
/// (one signed byte per value, so `length == numel`). Its f32 scales are a [`TensorEntry`] of
/// the same key in [`crate::files::ATTN_Q8_SCALES_BIN`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct I8Entry {
    /// Canonical tensor name.
    pub key: String,
    /// Row-major shape `[out, in]`.
    pub shape: Vec<usize>,
    /// Always [`I8_TAG`] (required in JSON).
    pub format: String,
    /// Byte offset in the file; a multiple of [`TENSOR_ALIGN`].
    pub offset: usize,
    /// Byte length (= number of values).
    pub length: usize,
}

impl I8Entry {
    /// Check tag, length (= numel), alignment and bounds against a file of `file_len` bytes.
    /// Errors: [`VindexError::BadEntry`] naming `file` and the key.
    pub fn validate(&self, file: &Path, file_len: usize) -> Result<(), VindexError> {
        let bad = |msg: String| VindexError::BadEntry {
            path: file.to_path_buf(),
            key: self.key.clone(),
            msg,
        };
        if self.format != I8_TAG {
            return Err(bad(format!(
                "format '{}' in the int8 plane (expected {I8_TAG})",
                self.format
            )));
        }
        let Some(numel) = self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) else {
            return Err(bad(format!("shape {:?} is too large", self.shape)));
        };
        if self.length != numel {
            return Err(bad(format!(
                "length {} bytes but shape {:?} in I8 needs {numel}",
                self.length, self.shape
            )));
        }
        if self.offset % TENSOR_ALIGN != 0 {
            return Err(bad(format!(
                "offset {} is not a multiple of {TENSOR_ALIGN}",
                self.offset
            )));
        }
        match self.offset.checked_add(self.length) {
            Some(end) if end <= file_len => Ok(()),
            _ => Err(bad(format!(
                "bytes {}..{} lie outside the file ({file_len} bytes)",
                self.offset,
                self.offset.saturating_add(self.length)
            ))),
        }
    }
}

/// Parse the int8-plane manifest's text. Errors: [`VindexError::BadJson`] naming `path`.
pub fn parse_i8_manifest(path: &Path, text: &str) -> Result<Vec<I8Entry>, VindexError> {
    serde_json::from_str(text).map_err(|e| VindexError::BadJson {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// A manifest file: the entries of one `.bin`, in file order.
pub type Manifest = Vec<TensorEntry>;

/// Parse a manifest file's text. Errors: [`VindexError::BadJson`] naming `path`.
pub fn parse_manifest(path: &Path, text: &str) -> Result<Manifest, VindexError> {
    serde_json::from_str(text).map_err(|e| VindexError::BadJson {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// Serde for [`QuantFormat`] as its ggml name (`"F32"`, `"Q4_K"`).
pub(crate) mod format_tag {
    use infer_quant::QuantFormat;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(f: &QuantFormat, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(f.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QuantFormat, D::Error> {
        let name = String::deserialize(d)?;
        QuantFormat::from_name(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> TensorEntry {
        TensorEntry {
            key: "k".into(),
            shape: vec![2, 3],
            format: QuantFormat::F32,
            offset: 64,
            length: 24,
        }
    }

    #[test]
    fn format_is_required_and_checked() {
        let ok = r#"[{"key":"k","shape":[2,3],"format":"F32","offset":0,"length":24}]"#;
        let m = parse_manifest(Path::new("m.json"), ok).unwrap();
        assert_eq!(m[0].format, QuantFormat::F32);
        let missing = r#"[{"key":"k","shape":[2,3],"offset":0,"length":24}]"#;
        let e = parse_manifest(Path::new("m.json"), missing).unwrap_err();
        assert!(e.to_string().contains("format"), "{e}");
        let unknown = r#"[{"key":"k","shape":[2,3],"format":"Q4_K_148","offset":0,"length":24}]"#;
        assert!(parse_manifest(Path::new("m.json"), unknown).is_err());
    }

    #[test]
    fn validate_checks_length_alignment_and_bounds() {
        let p = Path::new("x.bin");
        entry().validate(p, 88).unwrap();
        assert!(entry().validate(p, 87).is_err());
        let mut e = entry();
        e.length = 20;
        assert!(e
            .validate(p, 1000)
            .unwrap_err()
            .to_string()
            .contains("needs 24"));
        let mut e = entry();
        e.offset = 8;
        assert!(e.validate(p, 1000).is_err());
        let mut e = entry();
        e.format = QuantFormat::F16;
        e.length = 12;
        e.validate(p, 1000).unwrap();
    }

    #[test]
    fn shapes_whose_byte_count_overflows_are_errors() {
        let p = Path::new("x.bin");
        for (format, shape) in [
            (QuantFormat::Q5_0, vec![1usize << 40, 1 << 40]),
            (QuantFormat::F32, vec![1 << 62, 8]),
            (QuantFormat::Q4_K, vec![usize::MAX / 2, 256]),
        ] {
            let mut e = entry();
            e.format = format;
            e.shape = shape.clone();
            e.length = 0;
            let msg = e.validate(p, 1000).unwrap_err().to_string();
            assert!(msg.contains("too large"), "{format} {shape:?}: {msg}");
        }
    }
}
