//! Where the vindex's `tokenizer.json` comes from: `--tokenizer PATH` (wins), else the source's
//! own `tokenizer.json`, else (GGUF) one built from the `tokenizer.ggml.*` metadata, else an
//! error — or nothing, when a weights-only vindex was asked for (`skip_tokenizer`, or
//! `allow_no_tokenizer` when none is found).
//!
//! Whatever is chosen is loaded and checked before anything is written ([`check_tokenizer`]):
//! it must be a tokenizer, its ids must fit the embedding rows, the config's BOS/EOS ids must be
//! rows too, and the chat template must parse.

use std::path::{Path, PathBuf};

use infer_models::tokenizer::Tokenizer;
use infer_models::{ModelError, ModelSource};

use crate::build::BuildOptions;
use crate::VindexError;

/// The tokenizer.json text to store, or `None` for a weights-only vindex (always `None` with
/// `skip_tokenizer`).
///
/// Errors: [`VindexError::Io`] / [`VindexError::BadJson`] for an unreadable or non-JSON
/// `--tokenizer` file; [`VindexError::Source`] for GGUF tokenizer metadata that is malformed
/// (naming the key); [`VindexError::NoTokenizer`] when none is found and `allow_no_tokenizer`
/// is false; [`VindexError::BadTokenizer`] from [`check_tokenizer`].
pub fn resolve_tokenizer(
    source: &ModelSource,
    opts: &BuildOptions,
) -> Result<Option<String>, VindexError> {
    if opts.skip_tokenizer {
        return Ok(None);
    }
    check_template(source)?;
    if let Some(path) = &opts.tokenizer {
        let text = infer_models::text::read_utf8(path).map_err(|e| VindexError::io(path, e))?;
        serde_json::from_str::<serde_json::Value>(&text).map_err(|e| VindexError::BadJson {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        check_tokenizer(source, &text, path)?;
        return Ok(Some(text));
    }
    if let Some(text) = &source.tokenizer_json {
        check_tokenizer(source, text, &source.path)?;
        return Ok(Some(text.clone()));
    }
    let mut detail = String::new();
    if let Some(gguf) = &source.gguf {
        match infer_models::gguf::tokenizer_json_from_gguf(gguf) {
            Ok(text) => {
                check_tokenizer(source, &text, &source.path)?;
                return Ok(Some(text));
            }
            Err(ModelError::Unsupported { msg, .. }) => {
                detail = format!(" and none could be built from its GGUF metadata ({msg})")
            }
            Err(e) => return Err(e.into()),
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

/// Load `text` as a tokenizer and check it against the source's config (issue 15, bug 5): a
/// document that is not a tokenizer, a tokenizer with ids beyond the embedding rows (another
/// model's tokenizer), or config BOS/EOS ids beyond them are refused, naming `origin`.
pub fn check_tokenizer(source: &ModelSource, text: &str, origin: &Path) -> Result<(), VindexError> {
    let bad = |msg: String| VindexError::BadTokenizer {
        path: origin.to_path_buf(),
        msg,
    };
    let tok = Tokenizer::from_json(text).map_err(|e| {
        // Say whether the document is not JSON at all or JSON of another shape; the parser's
        // own message points inside a tokenizer.json's structure.
        let why = match serde_json::from_str::<serde_json::Value>(text) {
            Err(_) => format!("not JSON ({e})"),
            Ok(v) if v.get("model").is_none() => {
                "JSON without the `model` object of a Hugging Face tokenizer.json".to_string()
            }
            Ok(_) => e.to_string(),
        };
        bad(format!("not a usable tokenizer: {why}"))
    })?;
    let rows = source.config.vocab_size;
    let bound = tok.id_bound();
    if bound == 0 {
        return Err(bad("the tokenizer has no tokens".into()));
    }
    if bound > rows {
        return Err(bad(format!(
            "the tokenizer has ids up to {} but the model's embedding has {rows} rows (a tokenizer of another model?)",
            bound - 1
        )));
    }
    let cfg = &source.config;
    let ids = cfg
        .bos_token_id
        .map(|i| ("bos_token_id", i))
        .into_iter()
        .chain(cfg.eos_token_ids.iter().map(|&i| ("eos_token_id", i)));
    for (name, id) in ids {
        if id as usize >= rows {
            return Err(bad(format!(
                "{name} {id} is outside the embedding's {rows} rows"
            )));
        }
    }
    Ok(())
}

/// The chat template must compile (minijinja, as `chat` will render it).
fn check_template(source: &ModelSource) -> Result<(), VindexError> {
    let Some(src) = &source.chat_template else {
        return Ok(());
    };
    let env = minijinja::Environment::new();
    env.template_from_str(src)
        .map_err(|e| VindexError::BadTokenizer {
            path: template_origin(source),
            msg: format!("the chat template does not parse: {e}"),
        })?;
    Ok(())
}

/// The source path, with the GGUF key when the template came from GGUF metadata.
fn template_origin(source: &ModelSource) -> PathBuf {
    match &source.gguf {
        Some(_) => PathBuf::from(format!(
            "{} (tokenizer.chat_template)",
            source.path.display()
        )),
        None => source.path.clone(),
    }
}
