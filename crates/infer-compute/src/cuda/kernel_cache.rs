//! The compiled kernels, cached on disk: NVRTC turns `KERNELS_CU` into a CUBIN for the device's
//! own architecture (`sm_90` for an H100/H200) once, and every later start loads that file
//! instead of compiling again (NVRTC alone takes tens of seconds for this source, and a PTX
//! module adds the driver's JIT on a machine whose own cache is cold).
//!
//! Cache folder: `$INFER_CACHE/kernels`, else `$HOME/.cache/infer/kernels` (the folder the
//! scripts download into; no home: compile every time). A file is named by the SHA-256 of
//! the source, the architecture and NVRTC's major version (a CUBIN made by another minor
//! release of the same major loads on the driver as one of this release would), and ends with
//! the SHA-256 of its CUBIN bytes: a truncated or corrupt file, or one the driver refuses, is
//! recompiled and replaced.
//! The cache is an optimisation only: a folder that cannot be written costs the compile, not
//! an error.

use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};

use super::device::{dev_err, KERNELS_CU};
use crate::ComputeError;

/// Bytes of the SHA-256 trailer that follows the CUBIN in a cache file.
const TRAILER: usize = 32;

/// The real architecture NVRTC should compile for on a device of compute capability `cc`
/// (`sm_90` for (9, 0)), when this NVRTC can generate code for it; `None` otherwise (the
/// caller falls back to PTX for a virtual architecture, which the driver JIT-compiles).
pub(super) fn real_arch(cc: (i32, i32)) -> Option<String> {
    let want = cc.0 * 10 + cc.1;
    supported_archs()
        .contains(&want)
        .then(|| format!("sm_{want}"))
}

/// The `sm_XY` numbers (XY = 10 major + minor) this NVRTC compiles for (empty on an error).
fn supported_archs() -> Vec<c_int> {
    let mut n: c_int = 0;
    // SAFETY: NVRTC writes one int; the library was checked to be loadable by the caller.
    if unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) } != sys::nvrtcResult::NVRTC_SUCCESS
        || n <= 0
    {
        return Vec::new();
    }
    let mut archs = vec![0 as c_int; n as usize];
    // SAFETY: `archs` holds the `n` ints NVRTC reported.
    if unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) } != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return Vec::new();
    }
    archs
}

/// NVRTC's version, (major, minor).
fn nvrtc_version() -> (c_int, c_int) {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// The cache folder (see the module documentation), or `None` when no home is known.
pub(super) fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let root =
        var("INFER_CACHE").or_else(|| var("HOME").map(|h| h.join(".cache").join("infer")))?;
    Some(root.join("kernels"))
}

/// The cache file of `KERNELS_CU` compiled for `arch` under `dir`.
fn cache_file(dir: &Path, arch: &str) -> PathBuf {
    let mut h = Sha256::new();
    let major = nvrtc_version().0.to_string();
    for part in [KERNELS_CU, "\0", arch, "\0", &major] {
        h.update(part.as_bytes());
    }
    let key: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join(format!("kernels-{key}-{arch}.cubin"))
}

/// The CUBIN stored at `path`, when the file exists and its trailer matches its bytes.
fn read_cached(path: &Path) -> Option<Vec<u8>> {
    let mut bytes = std::fs::read(path).ok()?;
    if bytes.len() <= TRAILER {
        return None;
    }
    let body = bytes.len() - TRAILER;
    if Sha256::digest(&bytes[..body]).as_slice() != &bytes[body..] {
        return None;
    }
    bytes.truncate(body);
    Some(bytes)
}

/// Store `cubin` at `path` (written beside it, then renamed, so a reader never sees half a
/// file). Failures are ignored: the cache only saves time.
fn write_cached(path: &Path, cubin: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("kernels"),
        std::process::id()
    ));
    let mut data = Vec::with_capacity(cubin.len() + TRAILER);
    data.extend_from_slice(cubin);
    data.extend_from_slice(&Sha256::digest(cubin));
    if std::fs::write(&tmp, &data).is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Compile `KERNELS_CU` with NVRTC for the real architecture `arch` (`sm_90`): the CUBIN.
/// Errors: NVRTC's log on a compile error.
fn compile_cubin(arch: &str) -> Result<Vec<u8>, ComputeError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        dev_err(format!("NVRTC failed to {what} kernels.cu for {arch}: {e}"))
    };
    let src = CString::new(KERNELS_CU).map_err(|e| fail("read", &e))?;
    let name = CString::new("infer_kernels.cu").map_err(|e| fail("name", &e))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| fail("create", &e))?;
    let opts = [format!("--gpu-architecture={arch}")];
    // SAFETY: `prog` was created above and is destroyed once below.
    let out = unsafe {
        match result::compile_program(prog, &opts) {
            Ok(()) => {
                let mut size = 0usize;
                match sys::nvrtcGetCUBINSize(prog, &mut size).result() {
                    Ok(()) => {
                        let mut cubin = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char)
                            .result()
                            .map(|()| cubin)
                            .map_err(|e| fail("return", &e))
                    }
                    Err(e) => Err(fail("size", &e)),
                }
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default();
                Err(fail("compile", &format!("{e}\n{log}")))
            }
        }
    };
    // SAFETY: `prog` is not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The kernels as a CUBIN for `arch` (`sm_90`), handed to `load`: from the cache when present
/// and intact, otherwise compiled and stored there; a cached file `load` rejects (e.g. the
/// driver refuses it) is recompiled once.
pub(super) fn load_cubin<M>(
    arch: &str,
    mut load: impl FnMut(Vec<u8>) -> Result<M, ComputeError>,
) -> Result<M, ComputeError> {
    let file = cache_dir().map(|d| cache_file(&d, arch));
    if let Some(cubin) = file.as_deref().and_then(read_cached) {
        if let Ok(m) = load(cubin) {
            return Ok(m);
        }
    }
    let cubin = compile_cubin(arch)?;
    if let Some(f) = &file {
        write_cached(f, &cubin);
    }
    load(cubin)
}

/// Compile the kernels for compute capability `cc` without a GPU and store them in the cache
/// (e.g. `(9, 0)` on a build machine, so an H100/H200 starts without compiling). Returns the
/// cache file and the CUBIN's size in bytes. Errors: NVRTC cannot generate code for `cc`, or
/// its compile log.
pub fn prepare(cc: (i32, i32)) -> Result<(Option<PathBuf>, usize), ComputeError> {
    let arch = real_arch(cc).ok_or_else(|| {
        let (major, minor) = nvrtc_version();
        dev_err(format!(
            "this NVRTC ({major}.{minor}) cannot compile for compute capability {}.{}",
            cc.0, cc.1
        ))
    })?;
    let size = load_cubin(&arch, |cubin| Ok(cubin.len()))?;
    Ok((cache_dir().map(|d| cache_file(&d, &arch)), size))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_cubin_round_trips_and_damage_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("infer-kcache-{}", std::process::id()));
        let path = dir.join("k.cubin");
        let cubin: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        write_cached(&path, &cubin);
        assert_eq!(read_cached(&path).as_deref(), Some(&cubin[..]));
        // Truncated (a crash mid-copy, a full disk): a miss, not a bad module.
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() - 1]).unwrap();
        assert_eq!(read_cached(&path), None);
        // One byte changed.
        let mut bad = whole.clone();
        bad[10] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(read_cached(&path), None);
        // Shorter than the trailer, and absent.
        std::fs::write(&path, [1u8; 5]).unwrap();
        assert_eq!(read_cached(&path), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_cached(&path), None);
    }
}
