//! Helpers shared by the CLI tests: the real models, running the `infer` binary, its output.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

/// The shared reference data (`INFER_SHARED`, default `../shared` next to the workspace);
/// panics with the fix when its archrefs are missing.
pub fn shared_dir() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
        });
    assert!(
        p.join("archrefs").is_dir(),
        "shared reference data not found at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

/// A real model file from `INFER_MODELS` (default `~/.cache/infer/models`); panics with the fix
/// when it is missing (CI always has it).
pub fn model_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("INFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/infer/models")
        });
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "model {} not found (set INFER_MODELS; see shared/models/README.md)",
        p.display()
    );
    p
}

/// Run the `infer` binary of this build with `args`.
pub fn infer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .output()
        .expect("run infer")
}

/// stdout followed by stderr, lossily decoded.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
