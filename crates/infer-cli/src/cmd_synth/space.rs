//! Checks on where `infer synth` writes: the output's directory exists, and the output fits in
//! the free space of its filesystem (POSIX `statvfs`: `f_bavail × f_frsize`, the bytes an
//! unprivileged process may still write).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The directory `target` is written into (`.` for a bare name).
pub fn output_dir(target: &Path) -> PathBuf {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Errors "output directory D does not exist" / "output directory D is not a directory" unless
/// the directory `target` goes into is a directory.
pub fn check_output_dir(target: &Path) -> anyhow::Result<()> {
    let dir = output_dir(target);
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("output directory {} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("output directory {} does not exist", dir.display())
        }
        Err(e) => Err(e).with_context(|| format!("inspecting output directory {}", dir.display())),
    }
}

/// Bytes free to unprivileged writers on the filesystem holding `dir` (`statvfs`).
/// Errors: `dir` not representable as a C string, or `statvfs` failing (naming `dir`).
pub fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .with_context(|| format!("{}: path contains a NUL byte", dir.display()))?;
    // SAFETY: `statvfs` is plain old data (all-zero is a valid value); the call only writes
    // into it and reads the NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid, writable `statvfs`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading the free space of {}", dir.display()));
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    let (blocks, size) = (s.f_bavail as u64, s.f_frsize as u64);
    Ok(blocks.saturating_mul(size))
}

/// Refuse to write `need` bytes to `target` when its filesystem has less free space; `what`
/// says what the bytes are (e.g. the `--like` file they come from).
pub fn check_fits(target: &Path, need: u64, what: &str) -> anyhow::Result<()> {
    let dir = output_dir(target);
    let free = free_bytes(&dir)?;
    if need > free {
        bail!(
            "{what}: the output needs {need} bytes ({:.1} GiB) but the filesystem of {} has only {free} bytes ({:.1} GiB) free; refusing to write {}",
            need as f64 / (1u64 << 30) as f64,
            dir.display(),
            free as f64 / (1u64 << 30) as f64,
            target.display()
        );
    }
    Ok(())
}
