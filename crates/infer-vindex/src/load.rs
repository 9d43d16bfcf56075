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
use crate::manifest::{parse_i8_manifest, parse_manifest, I8Entry, TensorEntry};
use crate::tier::Tier;
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
    /// Tiers listed in index.json (validated: known names, required files present).
    pub(crate) tiers: Vec<Tier>,
    /// Quantized files → key → entry (ggml block formats; F32 for the Q8 scales).
    pub(crate) quant: HashMap<&'static str, HashMap<String, TensorEntry>>,
    /// The Q8 tier's int8 plane: key → entry.
    pub(crate) q8_values: HashMap<String, I8Entry>,
}

fn read_text(path: &Path) -> Result<String, VindexError> {
    infer_models::text::read_utf8(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            VindexError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            VindexError::io(path, e)
        }
    })
}

/// Check that `path` is a vindex directory (a directory holding `index.json`) and return the
/// path of its `index.json`.
///
/// Errors: [`VindexError::NotAVindex`] when `path` does not exist, is a file (e.g. a GGUF given
/// where a vindex was expected), or is a directory without `index.json`; [`VindexError::Io`]
/// when it cannot be inspected.
pub(crate) fn index_json_path(path: &Path) -> Result<PathBuf, VindexError> {
    let not = |reason: &str| VindexError::NotAVindex {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => {
            let gguf = std::fs::File::open(path)
                .and_then(|mut f| {
                    let mut magic = [0u8; 4];
                    std::io::Read::read_exact(&mut f, &mut magic).map(|_| magic)
                })
                .is_ok_and(|m| &m == b"GGUF");
            return Err(not(if gguf {
                "is a file, not a vindex directory (a GGUF file: build a vindex from it with `infer extract FILE -o NAME.vindex`)"
            } else {
                "is a file, not a vindex directory"
            }));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not(
                "does not exist (expected a vindex directory; build one with `infer extract`)",
            ))
        }
        Err(e) => return Err(VindexError::io(path, e)),
    }
    let index_path = path.join(files::INDEX_JSON);
    match std::fs::metadata(&index_path) {
        Ok(_) => Ok(index_path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not(
            "is not a vindex (no index.json); build one with `infer extract`",
        )),
        Err(e) => Err(VindexError::io(&index_path, e)),
    }
}

impl Vindex {
    /// Open the vindex directory at `path`.
    ///
    /// Errors (each naming the file): [`VindexError::NotAVindex`] (`path` is missing, a file, or
    /// a directory without index.json), [`VindexError::MissingFile`] (a listed file absent),
    /// [`VindexError::Unlisted`] (a file the index refers to that `files` does not list),
    /// [`VindexError::Source`] (a config in index.json that fails [`infer_models::ModelConfig::check`]),
    /// [`VindexError::BadJson`] / [`VindexError::BadVersion`] (corrupt index.json or manifest,
    /// or a file name in index.json that is not a plain name inside the directory), [`VindexError::SizeMismatch`] (a file whose size differs from index.json, e.g. a
    /// truncated `.bin`), [`VindexError::BadEntry`] (an entry whose length disagrees with
    /// shape × format, lies outside its file, is misaligned, has a non-float format in a float
    /// file, or a shape that disagrees with the model's dimensions).
    ///
    /// When `index.json` records an `index_sha256` that its content no longer matches, a
    /// failure of any later check is reported as [`VindexError::IndexChanged`] naming that
    /// failure (the change of index.json is what happened); a changed index.json that passes
    /// every check opens (`verify` reports it).
    pub fn open(path: &Path) -> Result<Vindex, VindexError> {
        let index_path = index_json_path(path)?;
        let index = VindexIndex::parse(&index_path, &read_text(&index_path)?)?;
        let seal = index.seal_matches();
        Self::open_parsed(path, &index_path, index).map_err(|e| match seal {
            Some(false) => VindexError::IndexChanged {
                path: index_path.clone(),
                detail: format!("opening the vindex then failed: {e}"),
            },
            _ => e,
        })
    }

    /// [`Vindex::open`] after `index.json` parsed.
    fn open_parsed(
        path: &Path,
        index_path: &Path,
        index: VindexIndex,
    ) -> Result<Vindex, VindexError> {
        // The config checks extract applied (a hand-edited index.json is refused here).
        index.config.check(index_path)?;

        // Every file the index refers to is listed, and every listed file exists with its
        // recorded size.
        if let Some(name) = index
            .required_files()
            .into_iter()
            .find(|n| index.file(n).is_none())
        {
            return Err(VindexError::Unlisted {
                path: path.join(name),
            });
        }
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
        for &name in files::BIN_FILES.iter().chain(&[files::DOWN_META_BIN]) {
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
            tiers: Vec::new(),
            quant: HashMap::new(),
            q8_values: HashMap::new(),
        };
        v.load_entries()?;
        v.load_quant()?;
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
        // Block formats only for the embeddings (a vindex without a float tier stores them
        // quantized); BF16 never.
        let blocks_ok = file == files::EMBEDDINGS_BIN
            && e.format.is_quantized()
            && e.format != QuantFormat::Q8_1;
        if !matches!(e.format, QuantFormat::F32 | QuantFormat::F16) && !blocks_ok {
            return Err(bad(format!(
                "format {} in a float-tier file (expected F32 or F16{})",
                e.format,
                if file == files::EMBEDDINGS_BIN {
                    ", or a ggml block format"
                } else {
                    ""
                }
            )));
        }
        if self.entries.contains_key(&e.key) {
            return Err(bad("key appears twice".into()));
        }
        self.entries.insert(e.key.clone(), (file, e, kind));
        Ok(())
    }

    /// Parse the tiers and every quantized manifest; validate each entry against its file
    /// (length = `QuantFormat::expected_bytes`, alignment, bounds, 2-D shape, format allowed in
    /// that file) and the Q8 value/scale pairing.
    fn load_quant(&mut self) -> Result<(), VindexError> {
        let index_path = self.path.join(files::INDEX_JSON);
        for name in &self.index.tiers {
            let t = Tier::from_name(name).ok_or_else(|| VindexError::BadJson {
                path: index_path.clone(),
                msg: format!("unknown tier '{name}' in 'tiers'"),
            })?;
            for f in t.required_files() {
                if self.index.file(f).is_none() {
                    return Err(VindexError::MissingFile {
                        path: self.path.join(f),
                    });
                }
            }
            self.tiers.push(t);
        }
        for &(bin, manifest) in files::QUANT_BINS {
            let (has_bin, has_manifest) = (
                self.index.file(bin).is_some(),
                self.index.file(manifest).is_some(),
            );
            if !has_bin && !has_manifest {
                continue;
            }
            let missing = if has_bin { manifest } else { bin };
            if !(has_bin && has_manifest) {
                return Err(VindexError::MissingFile {
                    path: self.path.join(missing),
                });
            }
            let p = self.path.join(bin);
            let len = self.maps.get(bin).map_or(0, |m| m.len());
            let mp = self.path.join(manifest);
            let mut map = HashMap::new();
            for e in parse_manifest(&mp, &read_text(&mp)?)? {
                e.validate(&p, len)?;
                let bad = |msg: String| VindexError::BadEntry {
                    path: p.clone(),
                    key: e.key.clone(),
                    msg,
                };
                // Block formats, or F16 for rows no block divides (the build's fallback);
                // the Q8 scales file holds F32 only.
                let allowed = if bin == files::ATTN_Q8_SCALES_BIN {
                    e.format == QuantFormat::F32
                } else {
                    !matches!(e.format, QuantFormat::F32 | QuantFormat::BF16)
                };
                if !allowed {
                    return Err(bad(format!(
                        "format {} is not allowed in this file (block formats or F16 only; F32 scales only in {})",
                        e.format,
                        files::ATTN_Q8_SCALES_BIN
                    )));
                }
                if e.shape.len() != 2 {
                    return Err(bad(format!("shape {:?} is not 2-D", e.shape)));
                }
                if map.contains_key(&e.key) {
                    return Err(bad("key appears twice".into()));
                }
                map.insert(e.key.clone(), e);
            }
            self.quant.insert(bin, map);
        }
        let (bin, manifest) = (files::ATTN_Q8_BIN, files::ATTN_Q8_MANIFEST);
        if self.index.file(bin).is_some() || self.index.file(manifest).is_some() {
            let p = self.path.join(bin);
            let mp = self.path.join(manifest);
            if self.index.file(bin).is_none() {
                return Err(VindexError::MissingFile { path: p });
            }
            let len = self.maps.get(bin).map_or(0, |m| m.len());
            let scales = self.quant.get(files::ATTN_Q8_SCALES_BIN);
            for e in parse_i8_manifest(&mp, &read_text(&mp)?)? {
                e.validate(&p, len)?;
                let bad = |msg: String| VindexError::BadEntry {
                    path: p.clone(),
                    key: e.key.clone(),
                    msg,
                };
                let [r, c] = e.shape[..] else {
                    return Err(bad(format!("shape {:?} is not 2-D", e.shape)));
                };
                if c % 32 != 0 {
                    return Err(bad(format!(
                        "rows of {c} values are not whole blocks of 32"
                    )));
                }
                match scales.and_then(|m| m.get(&e.key)) {
                    Some(s) if s.shape == [r, c / 32] => {}
                    Some(s) => {
                        return Err(bad(format!(
                            "scales in {} have shape {:?}, expected [{r}, {}]",
                            files::ATTN_Q8_SCALES_BIN,
                            s.shape,
                            c / 32
                        )))
                    }
                    None => {
                        return Err(bad(format!(
                            "no scales entry in {}",
                            files::ATTN_Q8_SCALES_BIN
                        )))
                    }
                }
                if self.q8_values.insert(e.key.clone(), e.clone()).is_some() {
                    return Err(bad("key appears twice".into()));
                }
            }
        }
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
