//! Shared helpers of the GGUF tests: data locations and a tiny GGUF writer.
#![allow(dead_code)]

use std::path::PathBuf;

/// `$INFER_SHARED`, default `<workspace>/../shared`. Panics with a clear message when missing.
pub fn shared_dir() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        p.is_dir(),
        "shared test data not found at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

/// A model file under `$INFER_MODELS` (default `~/.cache/infer/models`); panics when missing.
pub fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("INFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/infer/models")
        });
    let p = dir.join(file);
    assert!(
        p.is_file(),
        "model {} not found (set INFER_MODELS; fetch per shared/models/README.md)",
        p.display()
    );
    p
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// Parsed `config.json` of a shared model folder (`smollm2-135m-instruct`, `gemma3-270m`).
pub fn shared_config(model: &str) -> serde_json::Value {
    let p = shared_dir().join("models").join(model).join("config.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Minimal GGUF v3 writer for synthetic test files.
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut buf = b"GGUF".to_vec();
        buf.extend(version.to_le_bytes());
        buf.extend(n_tensors.to_le_bytes());
        buf.extend(n_kv.to_le_bytes());
        Self { buf }
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend(v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend(v.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.buf.extend(s.as_bytes());
        self
    }
    /// A kv pair with a u32 value (type 4).
    pub fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k).u32(4).u32(v)
    }
    /// A kv pair with a string value (type 8).
    pub fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.str(k).u32(8).str(v)
    }
    /// A tensor info: name, dims (fastest first), ggml type, offset.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pad to `align` bytes (the data section start).
    pub fn pad(&mut self, align: usize) -> &mut Self {
        while self.buf.len() % align != 0 {
            self.buf.push(0);
        }
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend(b);
        self
    }
    /// Write to a temp file and return it (kept alive by the handle).
    pub fn file(&self) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, &self.buf).expect("write temp file");
        f
    }
}
