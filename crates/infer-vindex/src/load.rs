//! [`Vindex::open`]: map every file and check it against `index.json` and the manifests.
//!
//! Opening reads `index.json`, the JSON manifests and the small text files, and memory-maps every
//! `.bin`; it checks sizes, entry lengths (`QuantFormat::expected_bytes`), offsets and shapes,
//! and hashes nothing (see [`crate::verify`] for that) and copies no weights.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use infer_quant::QuantFormat;
use memmap2::Mmap;

use crate::files;
use crate::index::VindexIndex;
use crate::manifest::{parse_manifest, TensorEntry};
use crate::VindexError;

#[cfg(target_endian = "big")]
compile_error!(
    "vindex files are little-endian and are viewed in place; big-endian hosts are not supported"
);

/// Which kind of stored tensor a key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Embeddings, norms, attention, lm_head, other: reachable through `Vindex::tensor`.
    Plain,
    /// FFN gate/up/down (feature-major): reachable through the per-layer accessors.
    Ffn,
}

/// An opened vindex: memory maps of its `.bin` files plus the parsed index and manifests.
pub struct Vindex {
    pub(crate) path: PathBuf,
    pub(crate) index: VindexIndex,
    pub(crate) maps: HashMap<&'static str, Mmap>,
    /// Canonical key → (file, entry, kind).
    pub(crate) entries: HashMap<String, (&'static str, TensorEntry, Kind)>,
    pub(crate) tokenizer_config: Option<String>,
    pub(crate) chat_template: Option<String>,
}

fn read_text(path: &Path) -> Result<String, VindexError> {
    std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            VindexError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            VindexError::io(path, e)
        }
    })
}

impl Vindex {
    /// Open the vindex directory at `path`.
    ///
    /// Errors (each naming the file): [`VindexError::MissingFile`] (no index.json, or a listed
    /// file absent), [`VindexError::BadJson`] / [`VindexError::BadVersion`] (corrupt index.json or
    /// manifest), [`VindexError::SizeMismatch`] (a file whose size differs from index.json, e.g. a
    /// truncated `.bin`), [`VindexError::BadEntry`] (an entry whose length disagrees with
    /// shape × format, lies outside its file, is misaligned, has a non-float format in a float
    /// file, or a shape that disagrees with the model's dimensions).
    pub fn open(path: &Path) -> Result<Vindex, VindexError> {
        let index_path = path.join(files::INDEX_JSON);
        let index = VindexIndex::parse(&index_path, &read_text(&index_path)?)?;

        // Every listed file exists with its recorded size.
        for f in &index.files {
            let p = path.join(&f.name);
            let meta = std::fs::metadata(&p).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    VindexError::MissingFile { path: p.clone() }
                } else {
                    VindexError::io(&p, e)
                }
            })?;
            if meta.len() != f.bytes {
                return Err(VindexError::SizeMismatch {
                    path: p,
                    expected: f.bytes,
                    actual: meta.len(),
                });
            }
        }

        let mut maps = HashMap::new();
        for &name in files::BIN_FILES {
            if index.file(name).is_none() {
                continue;
            }
            let p = path.join(name);
            let file = File::open(&p).map_err(|e| VindexError::io(&p, e))?;
            // SAFETY: the map is read-only; a vindex is immutable once built (writers build a
            // new directory and rename it into place, never modify files in place).
            let map = unsafe { Mmap::map(&file) }.map_err(|e| VindexError::io(&p, e))?;
            if map.len() as u64 != index.file(name).map_or(0, |f| f.bytes) {
                return Err(VindexError::SizeMismatch {
                    path: p,
                    expected: index.file(name).map_or(0, |f| f.bytes),
                    actual: map.len() as u64,
                });
            }
            maps.insert(name, map);
        }

        let mut v = Vindex {
            path: path.to_path_buf(),
            index,
            maps,
            entries: HashMap::new(),
            tokenizer_config: None,
            chat_template: None,
        };
        v.load_entries()?;
        if v.index.file(files::TOKENIZER_CONFIG_JSON).is_some() {
            v.tokenizer_config = Some(read_text(&path.join(files::TOKENIZER_CONFIG_JSON))?);
        }
        if v.index.file(files::CHAT_TEMPLATE_JINJA).is_some() {
            v.chat_template = Some(read_text(&path.join(files::CHAT_TEMPLATE_JINJA))?);
        }
        if v.index.has_tokenizer && v.index.file(files::TOKENIZER_JSON).is_none() {
            return Err(VindexError::MissingFile {
                path: path.join(files::TOKENIZER_JSON),
            });
        }
        Ok(v)
    }

    /// Validate one entry against its mapped file and register it under its key.
    fn add_entry(
        &mut self,
        file: &'static str,
        e: TensorEntry,
        kind: Kind,
    ) -> Result<(), VindexError> {
        let p = self.path.join(file);
        let len = match self.maps.get(file) {
            Some(m) => m.len(),
            None => return Err(VindexError::MissingFile { path: p }),
        };
        e.validate(&p, len)?;
        let bad = |msg: String| VindexError::BadEntry {
            path: p.clone(),
            key: e.key.clone(),
            msg,
        };
        if !matches!(e.format, QuantFormat::F32 | QuantFormat::F16) {
            return Err(bad(format!(
                "format {} in a float-tier file (expected F32 or F16)",
                e.format
            )));
        }
        if self.entries.contains_key(&e.key) {
            return Err(bad("key appears twice".into()));
        }
        self.entries.insert(e.key.clone(), (file, e, kind));
        Ok(())
    }

    fn load_entries(&mut self) -> Result<(), VindexError> {
        let hidden = self.index.shapes.hidden_size;
        let vocab = self.index.shapes.vocab_size;
        let matrix_check =
            |file: &str, e: &TensorEntry, want: [usize; 2]| -> Result<(), VindexError> {
                if e.shape != want {
                    return Err(VindexError::BadEntry {
                        path: self.path.join(file),
                        key: e.key.clone(),
                        msg: format!("shape {:?}, expected {want:?}", e.shape),
                    });
                }
                Ok(())
            };
        let emb = self.index.embeddings.clone();
        matrix_check(files::EMBEDDINGS_BIN, &emb, [vocab, hidden])?;
        let lm = self.index.lm_head.clone();
        if let Some(lm) = &lm {
            matrix_check(files::LM_HEAD_BIN, lm, [vocab, hidden])?;
        }
        let mut ffn = Vec::new();
        for l in &self.index.layers {
            for (file, e) in [
                (files::GATE_VECTORS_BIN, &l.gate),
                (files::UP_FEATURES_BIN, &l.up),
                (files::DOWN_FEATURES_BIN, &l.down),
            ] {
                if let Some(e) = e {
                    let inter = e.shape.first().copied().unwrap_or(0);
                    matrix_check(file, e, [inter, hidden])?;
                    ffn.push((file, e.clone()));
                }
            }
        }
        self.add_entry(files::EMBEDDINGS_BIN, emb, Kind::Plain)?;
        if let Some(lm) = lm {
            self.add_entry(files::LM_HEAD_BIN, lm, Kind::Plain)?;
        }
        for (file, e) in ffn {
            self.add_entry(file, e, Kind::Ffn)?;
        }
        for &(bin, manifest) in files::MANIFESTED_BINS {
            if self.index.file(manifest).is_none() {
                continue;
            }
            let mp = self.path.join(manifest);
            for e in parse_manifest(&mp, &read_text(&mp)?)? {
                self.add_entry(bin, e, Kind::Plain)?;
            }
        }
        Ok(())
    }
}
