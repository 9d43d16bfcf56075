//! [`verify`]: re-hash every file of a vindex against the sha256 recorded in `index.json`.

use std::path::Path;

use crate::hash::sha256_file;
use crate::index::VindexIndex;
use crate::load::index_json_path;
use crate::VindexError;

/// One file whose content differs from `index.json` (a missing file is in
/// [`VerifyReport::missing`] instead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMismatch {
    /// File name inside the vindex.
    pub file: String,
    pub expected_sha256: String,
    pub actual_sha256: String,
    pub expected_bytes: u64,
    pub actual_bytes: u64,
}

/// Result of [`verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Files hashed (every file listed in index.json that is present).
    pub checked: Vec<String>,
    /// Total bytes hashed.
    pub bytes: u64,
    /// Files present whose sha256 or size differ from index.json (changed since the build).
    pub mismatches: Vec<FileMismatch>,
    /// Files index.json lists that are not in the vindex directory (deleted, never copied).
    pub missing: Vec<String>,
    /// Files index.json does not list although it refers to them
    /// ([`VindexIndex::required_files`]) or they lie in the directory under a vindex file name:
    /// nothing records their size or hash.
    pub unlisted: Vec<String>,
    /// `index.json` itself: `Some(true)` when its content matches the `index_sha256` it
    /// records, `Some(false)` when it was changed after the build (its content differs, or the
    /// seal's own key was damaged: [`VerifyReport::index_json_change`]), `None` when it records
    /// none (built by an infer before `index_sha256` existed: it cannot be checked).
    pub index_json_ok: Option<bool>,
    /// What is known of a change of `index.json` beyond the hash differing (e.g. the key that
    /// should read `index_sha256`).
    pub index_json_change: Option<String>,
}

impl VerifyReport {
    /// True when every file matched and none is missing or unlisted.
    pub fn is_ok(&self) -> bool {
        self.problems() == 0
    }

    /// Number of problems: mismatched, missing and unlisted files, and an `index.json` that
    /// differs from (or records no) `index_sha256`.
    pub fn problems(&self) -> usize {
        self.mismatches.len()
            + self.missing.len()
            + self.unlisted.len()
            + usize::from(self.index_json_ok != Some(true))
    }

    /// The problems in one line, missing and unlisted files by name: `"index.json changed, 1
    /// mismatched, 2 missing (a.bin, b.json)"`; `"all match"` when there are none.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        match self.index_json_ok {
            Some(true) => {}
            Some(false) => parts.push("index.json changed".to_string()),
            None => parts.push("index.json unverified".to_string()),
        }
        if !self.mismatches.is_empty() {
            parts.push(format!("{} mismatched", self.mismatches.len()));
        }
        for (what, names) in [("missing", &self.missing), ("unlisted", &self.unlisted)] {
            if !names.is_empty() {
                parts.push(format!("{} {what} ({})", names.len(), names.join(", ")));
            }
        }
        if parts.is_empty() {
            "all match".to_string()
        } else {
            parts.join(", ")
        }
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // index.json first: when it changed, the records the data files are checked against
        // changed with it.
        match self.index_json_ok {
            Some(true) => {}
            Some(false) => writeln!(
                f,
                "MISMATCH index.json: changed after it was written (sha256 mismatch: its content no longer matches the index_sha256 it records{}); the files below are checked against the changed records",
                self.index_json_change
                    .as_deref()
                    .map(|c| format!("; {c}"))
                    .unwrap_or_default()
            )?,
            None => writeln!(
                f,
                "UNSEALED index.json: records no index_sha256 (built by an older infer), so it cannot be checked; rebuild with `infer extract`"
            )?,
        }
        for m in &self.mismatches {
            writeln!(
                f,
                "MISMATCH {}: sha256 {} ({} bytes), index.json says {} ({} bytes)",
                m.file, m.actual_sha256, m.actual_bytes, m.expected_sha256, m.expected_bytes
            )?;
        }
        for name in &self.missing {
            writeln!(
                f,
                "MISSING  {name}: listed in index.json but not in the vindex directory"
            )?;
        }
        for u in &self.unlisted {
            writeln!(
                f,
                "UNLISTED {u}: not in index.json files[] (no size or sha256 recorded)"
            )?;
        }
        write!(
            f,
            "{} files, {} bytes checked: {}",
            self.checked.len(),
            self.bytes,
            self.summary()
        )
    }
}

/// Re-hash (sha256) every file listed in `path/index.json` and report differences by file,
/// check `index.json` against the `index_sha256` it records ([`VerifyReport::index_json_ok`]),
/// and report as unlisted each file the index needs ([`VindexIndex::required_files`]) or that
/// lies in the directory under a vindex file name ([`crate::files::known_files`]) but is not
/// listed. A missing, changed or unlisted file is in the report, not an error.
/// Errors: [`VindexError::NotAVindex`] (`path` is missing, a file, or has no `index.json`);
/// [`VindexError::IndexChanged`] for an `index.json` that records its sha256 but no longer
/// parses or has infer's structure (it was changed after it was written);
/// [`VindexError::BadJson`] / [`VindexError::BadVersion`] for a corrupt `index.json`, one of
/// another version, or one listing a file name that is not a plain name inside the directory
/// (`../x`, `/etc/passwd`, …: such names are never hashed).
pub fn verify(path: &Path) -> Result<VerifyReport, VindexError> {
    let index_path = index_json_path(path)?;
    let text =
        infer_models::text::read_utf8(&index_path).map_err(|e| VindexError::io(&index_path, e))?;
    let index = VindexIndex::parse(&index_path, &text)?;
    let mut report = VerifyReport {
        index_json_ok: index.seal_matches(),
        ..VerifyReport::default()
    };
    if let Some(key) = index.damaged_seal_key(&text) {
        report.index_json_ok = Some(false);
        report.index_json_change = Some(format!(
            "its sha256 is recorded under the key {key:?}, not \"index_sha256\""
        ));
    }
    for f in &index.files {
        let p = path.join(&f.name);
        let (actual, bytes) = match sha256_file(&p) {
            Ok(hb) => hb,
            Err(VindexError::MissingFile { .. }) => {
                report.missing.push(f.name.clone());
                continue;
            }
            Err(e) => return Err(e),
        };
        report.checked.push(f.name.clone());
        report.bytes += bytes;
        if actual != f.sha256 || bytes != f.bytes {
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
