//! [`VindexError`]: every failure of building, opening, reading or verifying a vindex. Each
//! variant names the file (or tensor key) and what is wrong.

use std::path::PathBuf;

/// Errors of infer-vindex.
#[derive(Debug, thiserror::Error)]
pub enum VindexError {
    /// An I/O error on a file or directory.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file listed in `index.json` (or required by it) is not in the vindex directory.
    #[error("{path}: missing file (listed in index.json)")]
    MissingFile { path: PathBuf },
    /// A file the index refers to (see [`crate::VindexIndex::required_files`]) that its
    /// `files` list lacks, so its size and hash are unknown.
    #[error("{path}: needed by index.json but not listed in its files[] (no size or sha256 recorded; rebuild the vindex with `infer extract`)")]
    Unlisted { path: PathBuf },
    /// `index.json` or a manifest is not valid JSON or not the expected structure.
    #[error("{path}: corrupt JSON: {msg}")]
    BadJson { path: PathBuf, msg: String },
    /// `index.json` was changed after infer wrote it: it records its own sha256
    /// (`index_sha256`) but no longer matches it — it fails to parse, lacks what infer writes,
    /// or fails a check while its content differs from the seal. `detail` says what is wrong.
    #[error("{path}: changed after it was written (sha256 mismatch: its content no longer matches the index_sha256 it records): {detail}; restore it from a copy or rebuild the vindex with `infer extract`")]
    IndexChanged { path: PathBuf, detail: String },
    /// `index.json` has a `format_version` this build cannot read; `built_by` is the infer
    /// version its provenance records (or "an unknown version").
    #[error(
        "{path}: vindex format_version {found}, written by infer {built_by}, cannot be read by this infer {} (it reads format_version {expected}); rebuild the vindex with `infer extract`",
        crate::index::INFER_VERSION
    )]
    BadVersion {
        path: PathBuf,
        found: u64,
        expected: u64,
        built_by: String,
    },
    /// A file's size differs from what `index.json` records (e.g. a truncated `.bin`).
    #[error(
        "{path}: size is {actual} bytes but index.json records {expected} (truncated or replaced?)"
    )]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    /// A tensor entry is inconsistent: length vs shape × format, offset outside the file,
    /// misalignment, or a shape that does not fit the config.
    #[error("{path}: tensor '{key}': {msg}")]
    BadEntry {
        path: PathBuf,
        key: String,
        msg: String,
    },
    /// A non-tensor binary file (e.g. `down_meta.bin`) whose header or contents are invalid.
    #[error("{path}: corrupt file: {msg}")]
    Corrupt { path: PathBuf, msg: String },
    /// A layer index past the model's last layer.
    #[error("layer {layer} out of range (the vindex has {num_layers} layers)")]
    LayerOutOfRange { layer: usize, num_layers: usize },
    /// No tensor with this canonical key in any manifest.
    #[error("{path}: no tensor with key '{key}'")]
    NoSuchTensor { path: PathBuf, key: String },
    /// The vindex stores this data in another dtype than the accessor returns.
    #[error("{path}: {what} is stored as {stored}; {hint}")]
    WrongDtype {
        path: PathBuf,
        what: String,
        stored: String,
        hint: String,
    },
    /// The vindex does not hold this item (e.g. no FFN for a MoE layer, no tokenizer).
    #[error("{path}: {what} is not present in this vindex")]
    Absent { path: PathBuf, what: String },
    /// The source checkpoint could not be read.
    #[error(transparent)]
    Source(#[from] infer_models::ModelError),
    /// The build target already exists and `--force` was not given.
    #[error("{path}: already exists (use --force to replace it)")]
    TargetExists { path: PathBuf },
    /// The build target's parent folder does not exist (nothing is created above the target).
    #[error("{path}: the folder it would go in, {parent}, does not exist (create it first)")]
    MissingParent { path: PathBuf, parent: PathBuf },
    /// `--force` was given but the existing target is a regular file, a symbolic link or other
    /// non-directory: only a directory can be replaced by a vindex.
    #[error("{path} exists and is not a directory; refusing to replace it")]
    TargetNotDir { path: PathBuf },
    /// `--force` was given but the existing target directory is neither a vindex (it has no
    /// `index.json`) nor empty: replacing it would delete the user's data.
    #[error("{path} exists and is not a vindex (no index.json) nor an empty directory; refusing to replace it (--force only replaces a vindex)")]
    TargetNotVindex { path: PathBuf },
    /// [`crate::Vindex::open`] / [`crate::verify`] on a path that is not a vindex directory:
    /// `reason` says what it is instead (a file, a directory without `index.json`, nothing).
    #[error("{path} {reason}")]
    NotAVindex { path: PathBuf, reason: String },
    /// The source has a tensor the builder cannot place (wrong shape for its role, …) or lacks
    /// one it needs.
    #[error("{path}: {msg}")]
    BadSource { path: PathBuf, msg: String },
    /// No tokenizer could be found for the source.
    #[error("{path}: no tokenizer: the source has no tokenizer.json{detail}; pass --tokenizer PATH (a tokenizer.json) or --no-tokenizer")]
    NoTokenizer { path: PathBuf, detail: String },
    /// The tokenizer or chat template to store is unusable for this model: not a tokenizer,
    /// ids beyond the embedding rows, special-token ids out of range, a template that does not
    /// parse. `path` names where it came from (the `--tokenizer` file or the source).
    #[error("{path}: {msg}")]
    BadTokenizer { path: PathBuf, msg: String },
}

impl VindexError {
    /// Wrap an `std::io::Error` with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        VindexError::Io {
            path: path.into(),
            source,
        }
    }
}
