//! What `--like` names, recognised by content rather than by extension.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The model `--like` names.
pub enum Like {
    /// A GGUF file (or header-only skeleton).
    Gguf(PathBuf),
    /// A HF `config.json` (given directly, or the one inside a given HF folder).
    HfConfig(PathBuf),
}

/// Why a path is not one of the accepted kinds.
fn unknown(p: &Path, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: unknown kind of --like file ({why}; expected a GGUF file (starting with the magic \
         \"GGUF\"), a HF config.json (*.json), or a HF folder holding config.json)",
        p.display()
    )
}

/// Recognise `p`: a file starting with the GGUF magic is a GGUF whatever its name; a directory
/// holding `config.json` is a HF folder (its `config.json` is used); a `*.json` file is a
/// config; a `*.gguf` file without the magic goes to the GGUF reader, which says what is wrong
/// (bad magic, truncated). Errors: missing path, or none of these kinds (naming the three).
pub fn recognise(p: &Path) -> anyhow::Result<Like> {
    let meta = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{}: no such file or directory", p.display())
        }
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", p.display())),
    };
    if meta.is_dir() {
        let cfg = p.join("config.json");
        if cfg.is_file() {
            return Ok(Like::HfConfig(cfg));
        }
        return Err(unknown(p, "a directory without config.json"));
    }
    let mut magic = [0u8; 4];
    let n = std::fs::File::open(p)
        .and_then(|mut f| f.read(&mut magic))
        .with_context(|| format!("reading {}", p.display()))?;
    if n == 4 && &magic == b"GGUF" {
        return Ok(Like::Gguf(p.to_path_buf()));
    }
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "json" => Ok(Like::HfConfig(p.to_path_buf())),
        "gguf" => Ok(Like::Gguf(p.to_path_buf())),
        _ => Err(unknown(p, "no GGUF magic and not a .json file")),
    }
}
