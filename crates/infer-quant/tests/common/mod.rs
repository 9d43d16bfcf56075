//! Shared helpers for the vector tests: locate `shared/`, read safetensors files and metadata.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

/// The shared reference-data folder: `$INFER_SHARED`, else `<CARGO_MANIFEST_DIR>/../../../shared`.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("INFER_SHARED") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

/// One vectors file loaded into memory.
pub struct Vectors {
    pub name: String,
    bytes: Vec<u8>,
    pub metadata: HashMap<String, String>,
}

/// Load `shared/vectors/quant/<file>`; panics with a clear message when it is missing.
pub fn load(file: &str) -> Vectors {
    let path = shared_dir().join("vectors/quant").join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "reference vectors missing: cannot read {} ({e}); set INFER_SHARED to the shared data folder",
            path.display()
        )
    });
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
        .unwrap_or_else(|e| panic!("{}: bad safetensors header: {e}", path.display()));
    let metadata = meta.metadata().clone().unwrap_or_default();
    Vectors {
        name: file.to_string(),
        bytes,
        metadata,
    }
}

impl Vectors {
    /// Raw bytes and shape of tensor `name`.
    pub fn raw(&self, name: &str) -> (Vec<u8>, Vec<usize>) {
        let st = safetensors::SafeTensors::deserialize(&self.bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: no tensor {name}: {e}", self.name));
        (t.data().to_vec(), t.shape().to_vec())
    }

    /// Tensor `name` as f32 values (little-endian) and its shape.
    pub fn f32s(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let (b, shape) = self.raw(name);
        let v = b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (v, shape)
    }

    /// A JSON list of strings from the header metadata (empty when absent).
    pub fn meta_list(&self, key: &str) -> Vec<String> {
        match self.metadata.get(key) {
            Some(s) => serde_json::from_str(s).unwrap_or_else(|e| {
                panic!("{}: metadata {key} is not a JSON list: {e}", self.name)
            }),
            None => Vec::new(),
        }
    }

    /// Row labels (`row_labels` metadata).
    pub fn row_labels(&self) -> Vec<String> {
        self.meta_list("row_labels")
    }
}

/// Compare f32 slices bit for bit. When `nan_as_equal` both-NaN counts as equal (rows whose NaNs
/// come from `inf*0`, whose payload is the hardware default NaN). Returns the mismatch count and
/// a description of the first one.
pub fn compare_bits(got: &[f32], want: &[f32], nan_as_equal: bool) -> (usize, Option<String>) {
    assert_eq!(got.len(), want.len());
    let mut n = 0;
    let mut first = None;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (nan_as_equal && g.is_nan() && w.is_nan());
        if !same {
            if first.is_none() {
                first = Some(format!(
                    "index {i}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
                    g.to_bits(),
                    w.to_bits()
                ));
            }
            n += 1;
        }
    }
    (n, first)
}
