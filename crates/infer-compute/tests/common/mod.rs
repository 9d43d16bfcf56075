//! Shared helpers for tests that read reference data from `shared/`.
#![allow(dead_code)]

pub mod ops_parity;

use std::path::PathBuf;

/// The shared reference-data folder: `$INFER_SHARED`, else `<CARGO_MANIFEST_DIR>/../../../shared`.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("INFER_SHARED") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

/// A safetensors file loaded into memory.
pub struct Tensors {
    path: PathBuf,
    bytes: Vec<u8>,
}

/// Load `shared/<rel>`; panics with a clear message when it is missing (CI always has the data).
pub fn load(rel: &str) -> Tensors {
    let path = shared_dir().join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "reference data missing: cannot read {} ({e}); set INFER_SHARED to the shared data folder",
            path.display()
        )
    });
    Tensors { path, bytes }
}

impl Tensors {
    /// Raw bytes and shape of tensor `name`.
    pub fn raw(&self, name: &str) -> (Vec<u8>, Vec<usize>) {
        let st = safetensors::SafeTensors::deserialize(&self.bytes)
            .unwrap_or_else(|e| panic!("{}: bad safetensors file: {e}", self.path.display()));
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: no tensor {name}: {e}", self.path.display()));
        (t.data().to_vec(), t.shape().to_vec())
    }

    /// Tensor `name` as little-endian f32 values, with its shape.
    pub fn f32s(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let (b, shape) = self.raw(name);
        let v = b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (v, shape)
    }

    /// Tensor `name` as little-endian f64 values.
    pub fn f64s(&self, name: &str) -> Vec<f64> {
        let (b, _) = self.raw(name);
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()
    }
}
