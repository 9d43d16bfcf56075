//! sha256 of files (streamed, constant memory) as lowercase hex.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};

use crate::VindexError;

/// Lowercase hex of a finished digest.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 and byte count of the file at `path`, read in 1 MiB chunks.
/// Errors: [`VindexError::Io`] / [`VindexError::MissingFile`] naming `path`.
pub fn sha256_file(path: &Path) -> Result<(String, u64), VindexError> {
    sha256_file_until(path, &AtomicBool::new(false))
}

/// [`sha256_file`] that another thread can cut short: `stop` set ends the read at the next
/// chunk (the result is then meaningless; the caller discards it).
pub fn sha256_file_until(path: &Path, stop: &AtomicBool) -> Result<(String, u64), VindexError> {
    let mut f = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            VindexError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            VindexError::io(path, e)
        }
    })?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| VindexError::io(path, e))?;
        if n == 0 || stop.load(Ordering::Relaxed) {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex(&hasher.finalize()), total))
}
