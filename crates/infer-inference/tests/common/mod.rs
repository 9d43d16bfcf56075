//! Test support: paths to shared reference data and real models, safetensors readers, and
//! vindex extraction into a temporary directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

/// `../shared` (or `INFER_SHARED`). Panics with a clear message when missing: CI always has it.
pub fn shared_dir() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        p.is_dir(),
        "shared reference data not found at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

/// Folder of the real GGUFs (`INFER_MODELS`, default `~/.cache/infer/models`).
pub fn models_dir() -> PathBuf {
    let p = std::env::var_os("INFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/infer/models")
        });
    assert!(
        p.is_dir(),
        "real models not found at {} (run scripts/fetch-models.sh or set INFER_MODELS)",
        p.display()
    );
    p
}

/// A safetensors file read into memory.
pub struct StFile {
    bytes: Vec<u8>,
}

impl StFile {
    pub fn open(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        StFile { bytes }
    }

    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("valid safetensors")
    }

    pub fn has(&self, name: &str) -> bool {
        self.st().names().iter().any(|n| *n == name)
    }

    pub fn shape(&self, name: &str) -> Vec<usize> {
        self.st()
            .tensor(name)
            .unwrap_or_else(|_| panic!("no tensor {name}"))
            .shape()
            .to_vec()
    }

    pub fn f32(&self, name: &str) -> Vec<f32> {
        let st = self.st();
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("no tensor {name}"));
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    pub fn i64_as_u32(&self, name: &str) -> Vec<u32> {
        let st = self.st();
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("no tensor {name}"));
        assert_eq!(t.dtype(), safetensors::Dtype::I64, "{name}");
        t.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as u32)
            .collect()
    }
}

/// Standard deviation of a slice (f64 accumulation).
pub fn std_dev(x: &[f32]) -> f64 {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    (x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

/// Extract `source` (HF folder or GGUF) into a fresh vindex under `dir` (float tier only).
pub fn extract(
    source: &Path,
    dir: &Path,
    name: &str,
    dtype: &str,
    tokenizer: Option<PathBuf>,
) -> PathBuf {
    extract_with(
        source,
        dir,
        name,
        dtype,
        tokenizer,
        infer_vindex::QuantTiers::NONE,
    )
}

/// As [`extract`], also writing the quantized tiers `quant`.
pub fn extract_with(
    source: &Path,
    dir: &Path,
    name: &str,
    dtype: &str,
    tokenizer: Option<PathBuf>,
    quant: infer_vindex::QuantTiers,
) -> PathBuf {
    let out = dir.join(format!("{name}.vindex"));
    let opts = infer_vindex::BuildOptions {
        dtype: dtype.parse().expect("dtype"),
        force: true,
        allow_no_tokenizer: tokenizer.is_none(),
        tokenizer,
        quant,
        ..Default::default()
    };
    infer_vindex::extract(source, &out, &opts)
        .unwrap_or_else(|e| panic!("extract {}: {e}", source.display()));
    out
}

/// The folder of archrefs case `case`: `INFER_SHARED/archrefs/CASE`, or
/// `INFER_SHARED/archrefs-next/CASE` (same layout) for the families added later.
pub fn archrefs_case_dir(case: &str) -> PathBuf {
    let first = shared_dir().join("archrefs").join(case);
    if first.is_dir() {
        return first;
    }
    let next = shared_dir().join("archrefs-next").join(case);
    assert!(
        next.is_dir(),
        "archrefs case '{case}' not found under {} or {}",
        first.display(),
        next.display()
    );
    next
}

/// Archrefs case `case` (its folder under `INFER_SHARED/archrefs` or `archrefs-next`) extracted into `dir` with the
/// f32 tier and the q4k tier: (the case folder, the vindex path).
pub fn archrefs_q4k(case: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let case_dir = archrefs_case_dir(case);
    let vindex = extract_with(
        &case_dir,
        dir,
        case,
        "f32",
        None,
        infer_vindex::QuantTiers::Q4K,
    );
    (case_dir, vindex)
}

/// Archrefs case `case` extracted into `dir` with the q4k tier and no float tier (`infer
/// extract --float none`, the CLI default): the vindex path.
pub fn archrefs_quantized_only(case: &str, dir: &Path) -> PathBuf {
    let case_dir = archrefs_case_dir(case);
    let out = dir.join(format!("{case}-q.vindex"));
    let opts = infer_vindex::BuildOptions {
        float_tier: false,
        force: true,
        allow_no_tokenizer: true,
        quant: infer_vindex::QuantTiers::Q4K,
        ..Default::default()
    };
    infer_vindex::extract(&case_dir, &out, &opts)
        .unwrap_or_else(|e| panic!("extract {}: {e}", case_dir.display()));
    out
}

/// The real SmolLM2-135M-Instruct GGUF (`INFER_MODELS`) extracted into `dir` with the f32 tier
/// and the quantized tiers `quant`; the vindex path.
pub fn smollm2_with(dir: &Path, quant: infer_vindex::QuantTiers) -> PathBuf {
    let gguf = models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    extract_with(&gguf, dir, "smollm2", "f32", None, quant)
}

/// The archrefs case folders (those with a `reference.safetensors`) other than `skip`, sorted;
/// panics unless all 19 cases are there (a newly added folder of the same shape is picked up).
pub fn archrefs_cases_except(skip: &[&str]) -> Vec<String> {
    let root = shared_dir().join("archrefs");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("reference.safetensors").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !skip.contains(&n.as_str()))
        .collect();
    names.sort();
    assert!(
        names.len() + skip.len() >= 19,
        "expected the 19 archrefs cases, found {}",
        names.len() + skip.len()
    );
    names
}
