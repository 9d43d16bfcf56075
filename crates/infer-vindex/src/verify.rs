//! [`verify`]: re-hash every file of a vindex against the sha256 recorded in `index.json`.

use std::path::Path;

use crate::hash::sha256_file;
use crate::index::VindexIndex;
use crate::load::index_json_path;
use crate::VindexError;

/// One file whose content differs from `index.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMismatch {
    /// File name inside the vindex.
    pub file: String,
    pub expected_sha256: String,
    /// `None` when the file is missing.
    pub actual_sha256: Option<String>,
    pub expected_bytes: u64,
    pub actual_bytes: Option<u64>,
}

/// Result of [`verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Files hashed (every file listed in index.json).
    pub checked: Vec<String>,
    /// Total bytes hashed.
    pub bytes: u64,
    /// Files whose sha256 or size differ, or that are missing.
    pub mismatches: Vec<FileMismatch>,
    /// Files index.json does not list although it refers to them
    /// ([`VindexIndex::required_files`]) or they lie in the directory under a vindex file name:
    /// nothing records their size or hash.
    pub unlisted: Vec<String>,
    /// `index.json` itself: `Some(true)` when its content matches the `index_sha256` it
    /// records, `Some(false)` when it was changed after the build, `None` when it records none
    /// (built by an infer before `index_sha256` existed: it cannot be checked).
    pub index_json_ok: Option<bool>,
}

impl VerifyReport {
    /// True when every file matched and none is unlisted.
    pub fn is_ok(&self) -> bool {
        self.problems() == 0
    }

    /// Number of problems: mismatched, missing and unlisted files, and an `index.json` that
    /// differs from (or records no) `index_sha256`.
    pub fn problems(&self) -> usize {
        self.mismatches.len() + self.unlisted.len() + usize::from(self.index_json_ok != Some(true))
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for m in &self.mismatches {
            match &m.actual_sha256 {
                None => writeln!(f, "MISSING  {}", m.file)?,
                Some(a) => writeln!(
                    f,
                    "MISMATCH {}: sha256 {a} ({} bytes), index.json says {} ({} bytes)",
                    m.file,
                    m.actual_bytes.unwrap_or(0),
                    m.expected_sha256,
                    m.expected_bytes
                )?,
            }
        }
        for u in &self.unlisted {
            writeln!(
                f,
                "UNLISTED {u}: not in index.json files[] (no size or sha256 recorded)"
            )?;
        }
        match self.index_json_ok {
            Some(true) => {}
            Some(false) => writeln!(
                f,
                "MISMATCH index.json: its content differs from the index_sha256 it records (edited or corrupted)"
            )?,
            None => writeln!(
                f,
                "UNSEALED index.json: records no index_sha256 (built by an older infer), so it cannot be checked; rebuild with `infer extract`"
            )?,
        }
        write!(
            f,
            "{} files, {} bytes checked: {}",
            self.checked.len(),
            self.bytes,
            if self.is_ok() {
                "all match".to_string()
            } else {
                let mut parts = Vec::new();
                if !self.mismatches.is_empty() {
                    parts.push(format!("{} mismatched", self.mismatches.len()));
                }
                if !self.unlisted.is_empty() {
                    parts.push(format!("{} unlisted", self.unlisted.len()));
                }
                if self.index_json_ok != Some(true) {
                    parts.push("index.json unverified".to_string());
                }
                parts.join(", ")
            }
        )
    }
}

/// Re-hash (sha256) every file listed in `path/index.json` and report differences by file,
/// check `index.json` against the `index_sha256` it records ([`VerifyReport::index_json_ok`]),
/// and report as unlisted each file the index needs ([`VindexIndex::required_files`]) or that
/// lies in the directory under a vindex file name ([`crate::files::known_files`]) but is not
/// listed. A missing, changed or unlisted file is in the report, not an error.
/// Errors: [`VindexError::NotAVindex`] (`path` is missing, a file, or has no `index.json`);
/// [`VindexError::BadJson`] / [`VindexError::BadVersion`] for a corrupt `index.json`, one of
/// another version, or one listing a file name that is not a plain name inside the directory
/// (`../x`, `/etc/passwd`, …: such names are never hashed).
pub fn verify(path: &Path) -> Result<VerifyReport, VindexError> {
    let index_path = index_json_path(path)?;
    let text =
        infer_models::text::read_utf8(&index_path).map_err(|e| VindexError::io(&index_path, e))?;
    let index = VindexIndex::parse(&index_path, &text)?;
    let mut report = VerifyReport {
        index_json_ok: index
            .index_sha256
            .as_ref()
            .map(|h| *h == index.content_sha256()),
        ..VerifyReport::default()
    };
    for f in &index.files {
        let p = path.join(&f.name);
        let (actual, bytes) = match sha256_file(&p) {
            Ok((h, b)) => (Some(h), Some(b)),
            Err(VindexError::MissingFile { .. }) => (None, None),
            Err(e) => return Err(e),
        };
        report.checked.push(f.name.clone());
        report.bytes += bytes.unwrap_or(0);
        if actual.as_deref() != Some(f.sha256.as_str()) || bytes != Some(f.bytes) {
            report.mismatches.push(FileMismatch {
                file: f.name.clone(),
                expected_sha256: f.sha256.clone(),
                actual_sha256: actual,
                expected_bytes: f.bytes,
                actual_bytes: bytes,
            });
        }
    }
    for name in index.required_files().into_iter().chain(
        crate::files::known_files()
            .into_iter()
            .filter(|n| path.join(n).exists()),
    ) {
        if index.file(name).is_none() && !report.unlisted.iter().any(|u| u == name) {
            report.unlisted.push(name.to_string());
        }
    }
    Ok(report)
}
