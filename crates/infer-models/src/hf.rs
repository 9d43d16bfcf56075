//! Hugging Face folder source: `config.json`, `model.safetensors` or sharded safetensors
//! (`model.safetensors.index.json` `weight_map`), tokenizer and chat-template files.

mod st;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use st::{safetensors_error_text, SafetensorsSource};

use crate::{ModelConfig, ModelError, ModelSource, SourceKind};

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = crate::text::read_utf8(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// Text of `path` if the file exists; other I/O errors are returned naming the file.
fn read_optional(path: &Path) -> Result<Option<String>, ModelError> {
    match crate::text::read_utf8(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// The safetensors files of a folder and, when sharded, the index's `(tensor, file)` pairs:
/// `model.safetensors`, else the distinct files of `model.safetensors.index.json`'s
/// `weight_map` (in order of first appearance).
/// Errors: neither file present ([`ModelError::Io`] naming `model.safetensors`), or an index
/// without a `weight_map` object of plain file names.
pub fn safetensors_files(dir: &Path) -> Result<(Vec<PathBuf>, WeightMap), ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single], Vec::new()));
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(ModelError::Io {
            path: single,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "neither model.safetensors nor model.safetensors.index.json exists",
            ),
        });
    }
    let json = read_json(&index)?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ModelError::MissingField {
            path: index.clone(),
            field: "weight_map".into(),
        })?;
    let mut seen = BTreeSet::new();
    let mut files = Vec::new();
    let mut weight_map = Vec::with_capacity(map.len());
    for (name, file) in map {
        let bad = |msg: String| ModelError::BadField {
            path: index.clone(),
            field: format!("weight_map.{name}"),
            msg,
        };
        let file = file
            .as_str()
            .ok_or_else(|| bad("expected a file name".into()))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(bad(format!(
                "file name '{file}' must be a plain name in the folder"
            )));
        }
        let path = dir.join(file);
        if seen.insert(file.to_string()) {
            files.push(path.clone());
        }
        weight_map.push((name.clone(), path));
    }
    Ok((files, weight_map))
}

/// `(tensor name, shard file)` pairs of a sharded folder's index (empty for one file).
pub type WeightMap = Vec<(String, PathBuf)>;

/// Check every `weight_map` entry is in the file it names.
fn check_weight_map(weight_map: &WeightMap, src: &SafetensorsSource) -> Result<(), ModelError> {
    for (name, file) in weight_map {
        if src.file_of(name) != Some(file.as_path()) {
            return Err(ModelError::BadTensor {
                path: file.clone(),
                name: name.clone(),
                msg: "listed in model.safetensors.index.json but not in this file".into(),
            });
        }
    }
    Ok(())
}

/// The chat template: `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`
/// (a string, or a list of `{name, template}` from which `default` is taken).
fn chat_template(dir: &Path, tokenizer_config: Option<&str>) -> Result<Option<String>, ModelError> {
    if let Some(t) = read_optional(&dir.join("chat_template.jinja"))? {
        return Ok(Some(t));
    }
    let Some(text) = tokenizer_config else {
        return Ok(None);
    };
    let path = dir.join("tokenizer_config.json");
    let json: Value = serde_json::from_str(text).map_err(|e| ModelError::Json {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    Ok(match json.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(items)) => items
            .iter()
            .find(|i| i.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|i| i.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    })
}

/// Open a Hugging Face folder (`config.json` + safetensors) as a [`ModelSource`] of kind
/// [`SourceKind::HfFolder`]. Tensor names are the HF names as stored (e.g. GPT-2's with or
/// without `transformer.`); each safetensors file is memory-mapped once and tensors are decoded
/// to `f32` on demand.
///
/// Errors: a missing `config.json` or safetensors file ([`ModelError::Io`] naming it), config
/// errors of [`ModelConfig::from_hf_file`], [`ModelError::BadSafetensors`] for a corrupt header
/// or one whose offsets run past the data, [`ModelError::BadTensor`] for unsupported dtypes or
/// an index entry missing from its shard.
pub fn open_hf_folder(path: &Path) -> Result<ModelSource, ModelError> {
    let config = ModelConfig::from_hf_file(&path.join("config.json"))?;
    let (files, weight_map) = safetensors_files(path)?;
    let tensors = SafetensorsSource::open(&files)?;
    check_weight_map(&weight_map, &tensors)?;
    let tokenizer_json = read_optional(&path.join("tokenizer.json"))?;
    let tokenizer_config_json = read_optional(&path.join("tokenizer_config.json"))?;
    let chat_template = chat_template(path, tokenizer_config_json.as_deref())?;
    Ok(ModelSource {
        path: path.to_path_buf(),
        kind: SourceKind::HfFolder,
        config,
        tensors: Box::new(tensors),
        tokenizer_json,
        tokenizer_config_json,
        chat_template,
        gguf: None,
    })
}
