//! `index.json`: the versioned description of a vindex (identity, provenance, the whole
//! [`ModelConfig`], shapes, per-layer FFN entries, tiers, dtype, sha256 of every file).

use std::path::Path;

use infer_models::ModelConfig;
use infer_quant::QuantFormat;
use serde::{Deserialize, Serialize};

use crate::manifest::TensorEntry;
use crate::VindexError;

/// The `format_version` this build writes and reads.
pub const FORMAT_VERSION: u64 = 1;

/// Float dtype of the matrices of the float tier (embeddings, attention and FFN matrices,
/// lm_head). 1-D tensors (norm weights, biases) are always stored as f32: they are tiny and
/// f16 rounding of them buys nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
}

impl Dtype {
    /// The manifest format tag of this dtype.
    pub fn format(self) -> QuantFormat {
        match self {
            Dtype::F32 => QuantFormat::F32,
            Dtype::F16 => QuantFormat::F16,
        }
    }

    /// `"f32"` / `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        }
    }
}

impl std::str::FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Dtype::F32),
            "f16" => Ok(Dtype::F16),
            other => Err(format!("unknown dtype '{other}' (expected f32 or f16)")),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the vindex came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Source path as given to the builder.
    pub source_path: String,
    /// `hf_folder` or `gguf`.
    pub source_kind: String,
    /// sha256 of the source's weight files (the GGUF, or every `*.safetensors` of the folder).
    pub source_sha256: Vec<FileHash>,
    /// `infer` version (`CARGO_PKG_VERSION` of infer-vindex) that built it.
    pub infer_version: String,
    /// Build time, seconds since the Unix epoch.
    pub created_unix: u64,
}

/// A file name with its sha256 (lowercase hex) and size in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHash {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// Headline shapes (copied from the config for readers that do not parse it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shapes {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
}

/// FFN entries of one layer; `None` where the layer has no dense FFN (MoE) for that role.
/// Offsets are into [`crate::files::GATE_VECTORS_BIN`], [`crate::files::UP_FEATURES_BIN`],
/// [`crate::files::DOWN_FEATURES_BIN`]; every shape is `[intermediate, hidden]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntries {
    pub gate: Option<TensorEntry>,
    pub up: Option<TensorEntry>,
    pub down: Option<TensorEntry>,
}

/// A quantized tensor whose ggml blocks were copied unchanged from the GGUF source (no
/// dequantize → requantize round trip; `infer extract --requantize` turns this off).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Passthrough {
    /// Vindex file holding the tensor (one of the quantized tier files).
    pub file: String,
    /// Canonical tensor key.
    pub key: String,
    /// Format of the copied blocks: the source tensor's type, or an interleaved layout of it
    /// (Q4_0x16 for a Q4_0 tensor: the same blocks re-laid, `infer_quant::interleave`).
    #[serde(with = "crate::manifest::format_tag")]
    pub format: QuantFormat,
    /// GGUF tensor name the blocks came from (for one expert of a stacked `ffn_*_exps`, that
    /// tensor: the key names the expert, whose blocks are its slice).
    pub source_tensor: String,
    /// True when whole rows were reordered to undo llama.cpp's Q/K row permutation.
    pub rows_unpermuted: bool,
}

/// The parsed `index.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VindexIndex {
    /// sha256 (lowercase hex) of this index's canonical JSON ([`VindexIndex::content_sha256`]),
    /// written by every build and checked by [`crate::verify`], so a changed byte of
    /// `index.json` itself is caught too. `None` in vindexes built before it existed. Written first, so even a
    /// truncated `index.json` shows that it records one (the hash covers no field order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_sha256: Option<String>,
    pub format_version: u64,
    /// Model identity: HF `model_type`.
    pub model_type: String,
    /// Model name (source file or folder stem).
    pub model_name: String,
    pub provenance: Provenance,
    /// The whole typed config (every field; see [`ModelConfig::EXEMPT_FIELDS`]).
    pub config: ModelConfig,
    pub shapes: Shapes,
    /// Dtype of the float tier's matrices.
    pub dtype: Dtype,
    /// Tiers present, by [`crate::Tier::name`]: the float tier (`"f32"` or `"f16"`), then any of
    /// `"q4k"`, `"q8"`, `"q4"`.
    pub tiers: Vec<String>,
    /// Quantized tensors copied unchanged from a GGUF source (empty when none, or for vindexes
    /// without quantized tiers).
    #[serde(default)]
    pub passthrough: Vec<Passthrough>,
    /// `embeddings.bin`'s one entry, `[vocab, hidden]`.
    pub embeddings: TensorEntry,
    /// `lm_head.bin`'s one entry, `[vocab, hidden]`; `None` when absent (tied).
    pub lm_head: Option<TensorEntry>,
    /// One per layer, `num_layers` long.
    pub layers: Vec<LayerEntries>,
    /// Whether `tokenizer.json` is present.
    pub has_tokenizer: bool,
    /// Every file of the vindex except `index.json` itself, with size and sha256.
    pub files: Vec<FileHash>,
}

/// 64 lowercase hex digits (a sha256 as index.json records it).
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The `index_sha256` that `text` records, found without parsing it as JSON (for a text that
/// does not parse): `"index_sha256"`, optional whitespace, `:`, optional whitespace, then a
/// quoted sha256; or, the seal being written first, a quoted sha256 before the first
/// `"format_version"` (the seal under a damaged key).
fn recorded_seal(text: &str) -> Option<&str> {
    const KEY: &str = "\"index_sha256\"";
    if let Some(at) = text.find(KEY) {
        let rest = text[at + KEY.len()..].trim_start();
        if let Some(hex) = rest
            .strip_prefix(':')
            .and_then(|r| quoted_hex(r.trim_start()))
        {
            return Some(hex);
        }
    }
    let head = &text[..text.find("\"format_version\"")?];
    head.match_indices('"')
        .find_map(|(i, _)| quoted_hex(&head[i..]))
}

/// The sha256 in quotes at the start of `s` (`"` + 64 lowercase hex digits + `"`).
fn quoted_hex(s: &str) -> Option<&str> {
    let hex = s.strip_prefix('"')?.get(..64)?;
    (is_sha256_hex(hex) && s.get(65..).is_some_and(|r| r.starts_with('"'))).then_some(hex)
}

/// The infer version of this build (`CARGO_PKG_VERSION`), as provenance records it.
pub const INFER_VERSION: &str = env!("CARGO_PKG_VERSION");

impl VindexIndex {
    /// Parse `index.json` text: valid JSON, `format_version == FORMAT_VERSION`, the full structure.
    /// Errors: [`VindexError::BadJson`] or [`VindexError::BadVersion`] naming `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, VindexError> {
        let bad = |msg: String| VindexError::BadJson {
            path: path.to_path_buf(),
            msg,
        };
        let changed = |detail: String| VindexError::IndexChanged {
            path: path.to_path_buf(),
            detail,
        };
        let value: serde_json::Value = match serde_json::from_str(text) {
            Ok(v) => v,
            // No infer writes invalid JSON (and writes are atomic): with a seal it was changed.
            Err(e) if recorded_seal(text).is_some() => {
                return Err(changed(format!("it no longer parses as JSON: {e}")))
            }
            Err(e) => return Err(bad(e.to_string())),
        };
        // Which infer wrote it, read before the structure is trusted (for the messages).
        let written_by = value
            .pointer("/provenance/infer_version")
            .and_then(|v| v.as_str());
        let built_by = written_by.map_or_else(
            || "an unknown version".to_string(),
            infer_models::text::shown,
        );
        // A sealed index that fails a check and was not written by another infer (whose
        // structure may differ) was changed after it was written: this infer writes none such.
        let sealed_here = value
            .get("index_sha256")
            .and_then(|v| v.as_str())
            .is_some_and(is_sha256_hex)
            && !matches!(written_by, Some(v) if v != INFER_VERSION);
        let version = match value.get("format_version").and_then(|v| v.as_u64()) {
            Some(v) => v,
            None if sealed_here => {
                return Err(changed("it has no integer 'format_version'".into()))
            }
            None => {
                return Err(bad(format!(
                    "no integer 'format_version' (written by infer {built_by})"
                )))
            }
        };
        if version != FORMAT_VERSION {
            if sealed_here {
                return Err(changed(format!(
                    "it records format_version {version}, but its provenance says this infer \
                     {INFER_VERSION} wrote it, which writes format_version {FORMAT_VERSION}"
                )));
            }
            return Err(VindexError::BadVersion {
                path: path.to_path_buf(),
                found: version,
                expected: FORMAT_VERSION,
                built_by,
            });
        }
        let index: VindexIndex = serde_json::from_value(value).map_err(|e| {
            if sealed_here {
                changed(format!("it no longer has the structure infer writes: {e}"))
            } else if built_by == INFER_VERSION {
                bad(e.to_string())
            } else {
                bad(format!(
                    "{e} (written by infer {built_by}; this is infer {INFER_VERSION}: rebuild it with `infer extract`)"
                ))
            }
        })?;
        // From here the content can be hashed: a failed check of a sealed index whose content
        // no longer matches its seal is reported as that change.
        let bad = |msg: String| {
            if index.seal_matches() == Some(false) {
                changed(msg)
            } else {
                bad(msg)
            }
        };
        if index.layers.len() != index.shapes.num_layers {
            return Err(bad(format!(
                "{} layer entries but num_layers is {}",
                index.layers.len(),
                index.shapes.num_layers
            )));
        }
        for (i, f) in index.files.iter().enumerate() {
            if !crate::files::is_plain_file_name(&f.name) {
                return Err(bad(format!(
                    "files[{i}].name {:?} is not a plain file name inside the vindex (no '/', '\\', '..', absolute or empty names)",
                    f.name
                )));
            }
        }
        for (i, p) in index.passthrough.iter().enumerate() {
            if !crate::files::is_plain_file_name(&p.file) {
                return Err(bad(format!(
                    "passthrough[{i}].file {:?} is not a plain file name inside the vindex",
                    p.file
                )));
            }
        }
        Ok(index)
    }

    /// Whether the content matches the recorded `index_sha256`: `None` when none is recorded.
    pub fn seal_matches(&self) -> Option<bool> {
        self.index_sha256
            .as_ref()
            .map(|h| *h == self.content_sha256())
    }

    /// For an index that records no `index_sha256` ([`VindexIndex::parse`] of `text`): a
    /// top-level key of `text` that is no field of the index but holds a sha256 (64 lowercase
    /// hex digits) — the seal under a damaged key name. `None` when there is no such key.
    pub fn damaged_seal_key(&self, text: &str) -> Option<String> {
        if self.index_sha256.is_some() {
            return None;
        }
        let serde_json::Value::Object(file) = serde_json::from_str(text).ok()? else {
            return None;
        };
        let serde_json::Value::Object(known) = serde_json::to_value(self).ok()? else {
            return None;
        };
        file.into_iter()
            .find(|(k, v)| !known.contains_key(k) && v.as_str().is_some_and(is_sha256_hex))
            .map(|(k, _)| k)
    }

    /// sha256 (lowercase hex) of the compact JSON serialization of this index with
    /// `index_sha256` left out: the same for any `index.json` text that parses to this index
    /// (whitespace and key order aside), different after any change of a value.
    pub fn content_sha256(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut unsealed = self.clone();
        unsealed.index_sha256 = None;
        let bytes = serde_json::to_vec(&unsealed).expect("an index serializes");
        crate::hash::hex(&Sha256::digest(bytes))
    }

    /// This index with `index_sha256` set to its [`VindexIndex::content_sha256`] (what a build
    /// writes).
    pub fn sealed(&self) -> VindexIndex {
        let mut s = self.clone();
        s.index_sha256 = Some(self.content_sha256());
        s
    }

    /// Recorded size and hash of `name`, if the index lists it.
    pub fn file(&self, name: &str) -> Option<&FileHash> {
        self.files.iter().find(|f| f.name == name)
    }

    /// The files the rest of this index refers to, each of which `files` must list (with its
    /// size and hash) for the vindex to open: `embeddings.bin`; `lm_head.bin` when there is an
    /// lm_head entry; the FFN files the layer entries point into; `tokenizer.json` when
    /// `has_tokenizer`; every file of each listed tier; the files passthrough records name; and
    /// the other half of each data file / manifest pair of which one half is listed.
    pub fn required_files(&self) -> Vec<&'static str> {
        use crate::files as f;
        let mut v = vec![f::EMBEDDINGS_BIN];
        if self.lm_head.is_some() {
            v.push(f::LM_HEAD_BIN);
        }
        for (bin, has) in [
            (
                f::GATE_VECTORS_BIN,
                self.layers.iter().any(|l| l.gate.is_some()),
            ),
            (
                f::UP_FEATURES_BIN,
                self.layers.iter().any(|l| l.up.is_some()),
            ),
            (
                f::DOWN_FEATURES_BIN,
                self.layers.iter().any(|l| l.down.is_some()),
            ),
        ] {
            if has {
                v.push(bin);
            }
        }
        if self.has_tokenizer {
            v.push(f::TOKENIZER_JSON);
        }
        for t in self.tiers.iter().filter_map(|t| crate::Tier::from_name(t)) {
            v.extend_from_slice(t.required_files());
        }
        for p in &self.passthrough {
            if let Some(&name) = f::BIN_FILES.iter().find(|&&b| b == p.file) {
                v.push(name);
            }
        }
        let pairs = f::QUANT_BINS
            .iter()
            .chain(f::MANIFESTED_BINS)
            .chain(&[(f::ATTN_Q8_BIN, f::ATTN_Q8_MANIFEST)]);
        for &(bin, manifest) in pairs {
            if self.file(bin).is_some() || self.file(manifest).is_some() {
                v.extend([bin, manifest]);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with every optional field set, so a dropped field would show.
    fn full_config() -> ModelConfig {
        serde_json::from_value(serde_json::json!({
            "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
            "norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_theta": 1e4,
            "rope_scaling": {"type": "linear", "factor": 8.0},
            "partial_rotary_factor": 1.0, "sliding_window": 8,
            "layer_types": ["sliding", "full"], "hidden_act": "gelu_pytorch_tanh",
            "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
            "query_pre_attn_scalar": 16.0, "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0, "embedding_multiplier": 2.0,
            "attention_multiplier": 0.5, "residual_multiplier": 0.3, "logits_scaling": 4.0,
            "use_parallel_residual": false, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
            "norm_topk_prob": true, "bos_token_id": 2, "eos_token_ids": [1, 106],
            "pad_token_id": 0
        }))
        .expect("test config matches ModelConfig")
    }

    /// Fails when a `ModelConfig` field is neither persisted in index.json nor exempt, or when the
    /// persisted config does not round-trip to an equal one.
    #[test]
    fn every_config_field_is_persisted_or_exempt() {
        let config = full_config();
        let persisted = serde_json::to_value(&config).unwrap();
        let persisted = persisted.as_object().unwrap();
        // Field names as serde sees them: serialize, and also compare against Debug output so a
        // `#[serde(skip)]` field (absent from JSON) is still caught.
        let debug = format!("{config:?}");
        let debug_fields: Vec<&str> = debug
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .filter_map(|tok| tok.strip_suffix(':'))
            .filter(|t| t.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
            .collect();
        assert!(debug_fields.len() >= 30, "parsed {debug_fields:?}");
        for field in debug_fields {
            if ["factor", "type"].contains(&field) {
                continue; // fields of nested RopeScaling, not of ModelConfig
            }
            assert!(
                persisted.contains_key(field) || ModelConfig::EXEMPT_FIELDS.contains(&field),
                "ModelConfig field '{field}' is neither persisted nor in EXEMPT_FIELDS"
            );
        }
        let back: ModelConfig =
            serde_json::from_value(serde_json::Value::Object(persisted.clone())).unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn wrong_version_and_bad_json_are_named_errors() {
        let p = Path::new("/v/index.json");
        let e = VindexIndex::parse(p, "{not json").unwrap_err();
        assert!(matches!(e, VindexError::BadJson { .. }), "{e}");
        assert!(e.to_string().contains("/v/index.json"));
        let e = VindexIndex::parse(p, r#"{"format_version": 99}"#).unwrap_err();
        assert!(
            matches!(e, VindexError::BadVersion { found: 99, .. }),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("written by infer an unknown version"),
            "{e}"
        );
        let newer = r#"{"format_version": 2, "provenance": {"infer_version": "7.1.0"}}"#;
        let e = VindexIndex::parse(p, newer).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "/v/index.json: vindex format_version 2, written by infer 7.1.0, cannot be read \
                 by this infer {INFER_VERSION} (it reads format_version {FORMAT_VERSION}); \
                 rebuild the vindex with `infer extract`"
            )
        );
        // Same format_version, another structure: the message says who wrote it.
        let odd = r#"{"format_version": 1, "provenance": {"infer_version": "0.0.9"}}"#;
        let e = VindexIndex::parse(p, odd).unwrap_err().to_string();
        assert!(e.contains("written by infer 0.0.9; this is infer"), "{e}");
    }
}
