//! Where the vindex's `tokenizer.json` comes from: `--tokenizer PATH` (wins), else the source's
//! own `tokenizer.json`, else (GGUF) one built from the `tokenizer.ggml.*` metadata, else an
//! error — or nothing, when a weights-only vindex was asked for (`skip_tokenizer`, or
//! `allow_no_tokenizer` when none is found).

use infer_models::ModelSource;

use crate::build::BuildOptions;
use crate::VindexError;

/// The tokenizer.json text to store, or `None` for a weights-only vindex (always `None` with
/// `skip_tokenizer`).
///
/// Errors: [`VindexError::Io`] / [`VindexError::BadJson`] for an unreadable or non-JSON
/// `--tokenizer` file; [`VindexError::NoTokenizer`] when none is found and
/// `allow_no_tokenizer` is false.
pub fn resolve_tokenizer(
    source: &ModelSource,
    opts: &BuildOptions,
) -> Result<Option<String>, VindexError> {
    if opts.skip_tokenizer {
        return Ok(None);
    }
    if let Some(path) = &opts.tokenizer {
        let text = std::fs::read_to_string(path).map_err(|e| VindexError::io(path, e))?;
        serde_json::from_str::<serde_json::Value>(&text).map_err(|e| VindexError::BadJson {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        return Ok(Some(text));
    }
    if let Some(text) = &source.tokenizer_json {
        return Ok(Some(text.clone()));
    }
    let mut detail = String::new();
    if let Some(gguf) = &source.gguf {
        match from_gguf(gguf) {
            Ok(text) => return Ok(Some(text)),
            Err(msg) => detail = format!(" and none could be built from its GGUF metadata ({msg})"),
        }
    }
    if opts.allow_no_tokenizer {
        return Ok(None);
    }
    Err(VindexError::NoTokenizer {
        path: source.path.clone(),
        detail,
    })
}

/// Build tokenizer.json from GGUF `tokenizer.ggml.*` metadata
/// ([`infer_models::gguf::tokenizer_json_from_gguf`]: byte-level BPE only).
fn from_gguf(gguf: &infer_models::gguf::GgufFile) -> Result<String, String> {
    infer_models::gguf::tokenizer_json_from_gguf(gguf).map_err(|e| e.to_string())
}
