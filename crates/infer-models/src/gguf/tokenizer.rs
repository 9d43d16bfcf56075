//! A vindex `tokenizer.json` built from GGUF `tokenizer.ggml.*` metadata alone, for the
//! vocabulary types of llama.cpp's `src/llama-vocab.cpp` that infer runs:
//!
//! - `llama` (SentencePiece: Llama-2, Mistral, Gemma-1..3, Phi-3): the `{"infer_spm": …}`
//!   document of [`crate::tokenizer::SpmSpec`] (llama.cpp's score-driven merges, byte fallback).
//! - `gpt2` (byte-level BPE: Llama-3, Qwen2/3, StarCoder, GPT-2, GPT-NeoX, OLMo, DeepSeek, …): a
//!   HF `tokenizer.json` with the merges, the pre-tokenizer `tokenizer.ggml.pre` selects
//!   ([`super::pre_tokenizer`]) and a ByteLevel decoder.
//! - `gemma4` (SentencePiece-style BPE over raw UTF-8 with `▁` spaces and explicit merges): a
//!   HF `tokenizer.json` with a `▁` normalizer, line splits and byte fallback.
//!
//! Everything is checked first: missing or mistyped arrays, arrays whose lengths disagree,
//! duplicate tokens, merges naming unknown tokens, special-token ids out of range — each an error
//! naming the key. Other types (`bert`, `t5`, `rwkv`, `plamo2`, …) are refused by name.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::pre_tokenizer::pre_tokenizer;
use super::GgufFile;
use crate::tokenizer::{spm_json, SpmSpec, TokenType};
use crate::ModelError;

/// The special-token id keys checked against the vocabulary size.
const SPECIAL_ID_KEYS: [&str; 9] = [
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.mask_token_id",
    "tokenizer.ggml.cls_token_id",
];

/// The validated vocabulary common to every type.
struct Vocab<'g> {
    g: &'g GgufFile,
    tokens: Vec<String>,
    types: Vec<i32>,
    index: HashMap<&'g str, u32>,
}

impl<'g> Vocab<'g> {
    fn err(&self, field: &str, msg: String) -> ModelError {
        bad(self.g, field, msg)
    }

    /// A special-token id key: absent → `None`; present → an id below the vocabulary size.
    fn id(&self, key: &str) -> Result<Option<u32>, ModelError> {
        match self.g.metadata(key) {
            None => Ok(None),
            Some(_) => {
                let id = self.g.get_u32(key).ok_or_else(|| missing(self.g, key))?;
                if id as usize >= self.tokens.len() {
                    return Err(self.err(
                        key,
                        format!(
                            "id {id} is outside the vocabulary ({} tokens)",
                            self.tokens.len()
                        ),
                    ));
                }
                Ok(Some(id))
            }
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.g.metadata(key) {
            None => Ok(default),
            Some(_) => self.g.get_bool(key).ok_or_else(|| missing(self.g, key)),
        }
    }
}

fn missing(g: &GgufFile, field: &str) -> ModelError {
    ModelError::MissingField {
        path: g.path().to_path_buf(),
        field: field.to_string(),
    }
}

fn bad(g: &GgufFile, field: &str, msg: String) -> ModelError {
    ModelError::BadField {
        path: g.path().to_path_buf(),
        field: field.to_string(),
        msg,
    }
}

/// Tokens (empty ones renamed `[EMPTY_i]` as llama.cpp does), token types and the text → id
/// index; errors on a missing/mistyped array, a length mismatch or a duplicate token.
fn vocab(g: &GgufFile) -> Result<Vocab<'_>, ModelError> {
    let key = "tokenizer.ggml.tokens";
    let raw = g.get_str_array(key).ok_or_else(|| missing(g, key))?;
    if raw.is_empty() {
        return Err(bad(g, key, "the vocabulary is empty".into()));
    }
    if raw.len() > u32::MAX as usize {
        return Err(bad(g, key, format!("{} tokens is too many", raw.len())));
    }
    let tokens: Vec<String> = raw
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            }
        })
        .collect();
    let tkey = "tokenizer.ggml.token_type";
    let types: Vec<i32> = match g.metadata(tkey) {
        None => vec![1; raw.len()],
        Some(_) => {
            let t = g.get_i64_array(tkey).ok_or_else(|| missing(g, tkey))?;
            if t.len() != raw.len() {
                return Err(bad(
                    g,
                    tkey,
                    format!("{} entries but {} tokens", t.len(), raw.len()),
                ));
            }
            t.into_iter().map(|v| v.clamp(0, 255) as i32).collect()
        }
    };
    let mut index = HashMap::with_capacity(raw.len());
    for (id, t) in raw.iter().enumerate() {
        if t.is_empty() {
            continue;
        }
        if let Some(first) = index.insert(t.as_str(), id as u32) {
            return Err(bad(
                g,
                key,
                format!("token {t:?} appears twice (ids {first} and {id})"),
            ));
        }
    }
    let v = Vocab {
        g,
        tokens,
        types,
        index,
    };
    for k in SPECIAL_ID_KEYS {
        v.id(k)?;
    }
    Ok(v)
}

/// Build the vindex `tokenizer.json` text for a GGUF's vocabulary (see the module doc).
///
/// Errors: [`ModelError::MissingField`] for an absent or mistyped key,
/// [`ModelError::BadField`] for inconsistent values (each naming the key),
/// [`ModelError::Unsupported`] for a vocabulary type or pre-tokenizer infer does not handle.
pub fn tokenizer_json_from_gguf(g: &GgufFile) -> Result<String, ModelError> {
    let unsupported = |msg: String| ModelError::Unsupported {
        path: g.path().to_path_buf(),
        msg: format!("{msg}; a tokenizer.json is needed (--tokenizer PATH)"),
    };
    let model_key = "tokenizer.ggml.model";
    let model = g.get_str(model_key).ok_or_else(|| missing(g, model_key))?;
    match model {
        "llama" => spm(&vocab(g)?),
        "gpt2" => {
            let pre = g.get_str("tokenizer.ggml.pre").unwrap_or("default");
            let p = pre_tokenizer(pre).ok_or_else(|| {
                unsupported(format!("tokenizer.ggml.pre '{pre}' is not supported"))
            })?;
            let v = vocab(g)?;
            let parts = HfParts {
                normalizer: Value::Null,
                pre_tokenizer: p.json,
                decoder: json!({"type": "ByteLevel", "add_prefix_space": true,
                                "trim_offsets": true, "use_regex": true}),
                ignore_merges: p.ignore_merges,
                byte_fallback: false,
                default_add_bos: p.default_add_bos,
            };
            hf_bpe(&v, &parts)
        }
        "gemma4" => {
            let v = vocab(g)?;
            let parts = HfParts {
                normalizer: json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
                pre_tokenizer: split_lines(),
                decoder: json!({"type": "Sequence", "decoders": [
                    {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                    {"type": "ByteFallback"}, {"type": "Fuse"}]}),
                ignore_merges: false,
                byte_fallback: true,
                default_add_bos: false,
            };
            hf_bpe(&v, &parts)
        }
        other => {
            let kind = match other {
                "bert" => " (WordPiece)",
                "t5" => " (Unigram)",
                "rwkv" => " (RWKV)",
                "plamo2" => " (PLaMo-2)",
                "none" | "no_vocab" => " (no vocabulary)",
                _ => "",
            };
            Err(unsupported(format!(
                "tokenizer.ggml.model '{other}'{kind} is not supported (infer handles llama, gpt2 and gemma4)"
            )))
        }
    }
}

/// `tokenizer.ggml.model = llama`: the SPM document.
fn spm(v: &Vocab<'_>) -> Result<String, ModelError> {
    let key = "tokenizer.ggml.scores";
    let scores = v.g.get_f32_array(key).ok_or_else(|| missing(v.g, key))?;
    if scores.len() != v.tokens.len() {
        return Err(v.err(
            key,
            format!("{} entries but {} tokens", scores.len(), v.tokens.len()),
        ));
    }
    if let Some(i) = scores.iter().position(|s| s.is_nan()) {
        return Err(v.err(key, format!("the score of token {i} is NaN")));
    }
    let spec = SpmSpec {
        tokens: v.tokens.clone(),
        scores: scores.to_vec(),
        token_type: v.types.clone(),
        bos: v.id("tokenizer.ggml.bos_token_id")?,
        eos: v.id("tokenizer.ggml.eos_token_id")?,
        unk: v.id("tokenizer.ggml.unknown_token_id")?,
        add_bos: v.flag("tokenizer.ggml.add_bos_token", true)?,
        add_eos: v.flag("tokenizer.ggml.add_eos_token", false)?,
        add_space_prefix: v.flag("tokenizer.ggml.add_space_prefix", true)?,
    };
    check_add_ids(v, &spec.bos, spec.add_bos, &spec.eos, spec.add_eos)?;
    Ok(spm_json(&spec))
}

/// `add_bos`/`add_eos` need the id they add.
fn check_add_ids(
    v: &Vocab<'_>,
    bos: &Option<u32>,
    add_bos: bool,
    eos: &Option<u32>,
    add_eos: bool,
) -> Result<(), ModelError> {
    if add_bos && bos.is_none() {
        return Err(missing(
            v.g,
            "tokenizer.ggml.bos_token_id (add_bos_token is true)",
        ));
    }
    if add_eos && eos.is_none() {
        return Err(missing(
            v.g,
            "tokenizer.ggml.eos_token_id (add_eos_token is true)",
        ));
    }
    Ok(())
}

/// Gemma-4's split: runs of non-newlines and runs of newlines (llama.cpp
/// `LLAMA_VOCAB_PRE_TYPE_GEMMA4`).
fn split_lines() -> Value {
    json!({"type": "Split", "pattern": {"Regex": "[^\\n]+|[\\n]+"}, "behavior": "Isolated", "invert": false})
}

/// The parts of a HF BPE tokenizer.json that differ by vocabulary type.
struct HfParts {
    normalizer: Value,
    pre_tokenizer: Value,
    decoder: Value,
    ignore_merges: bool,
    byte_fallback: bool,
    default_add_bos: bool,
}

/// Merges `"a b"` → `[a, b]`, checked against the vocabulary (llama.cpp splits at the first
/// space after the first byte).
fn merges(v: &Vocab<'_>) -> Result<Vec<Value>, ModelError> {
    let key = "tokenizer.ggml.merges";
    let raw = v.g.get_str_array(key).ok_or_else(|| missing(v.g, key))?;
    let mut out = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        let pos = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
        let Some(pos) = pos else {
            return Err(v.err(
                key,
                format!("merge {i} {m:?} is not two tokens separated by a space"),
            ));
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        for part in [a, b] {
            if !v.index.contains_key(part) {
                return Err(v.err(
                    key,
                    format!("merge {i} {m:?} names {part:?}, which is not a token"),
                ));
            }
        }
        let merged = format!("{a}{b}");
        if !v.index.contains_key(merged.as_str()) {
            return Err(v.err(
                key,
                format!("merge {i} {m:?} makes {merged:?}, which is not a token"),
            ));
        }
        out.push(json!([a, b]));
    }
    Ok(out)
}

/// A HF BPE `tokenizer.json`: vocab (id = position), merges, added tokens from the token types
/// (control and unknown → special, user-defined → added, not special), and a post-processor
/// adding BOS/EOS per `tokenizer.ggml.add_bos_token` / `add_eos_token`.
fn hf_bpe(v: &Vocab<'_>, parts: &HfParts) -> Result<String, ModelError> {
    let merges = merges(v)?;
    let mut vocab = Map::with_capacity(v.tokens.len());
    let mut added = Vec::new();
    for (id, (tok, &ty)) in v.tokens.iter().zip(&v.types).enumerate() {
        vocab.insert(tok.clone(), json!(id));
        let ty = TokenType::from(ty);
        if ty.is_special_or_user() {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty != TokenType::UserDefined,
            }));
        }
    }
    let bos = v.id("tokenizer.ggml.bos_token_id")?;
    let eos = v.id("tokenizer.ggml.eos_token_id")?;
    let add_bos = v.flag("tokenizer.ggml.add_bos_token", parts.default_add_bos)?;
    let add_eos = v.flag("tokenizer.ggml.add_eos_token", false)?;
    check_add_ids(v, &bos, add_bos, &eos, add_eos)?;
    let mut single = Vec::new();
    let mut specials = Map::new();
    let mut push_special = |seq: &mut Vec<Value>, id: u32| {
        let tok = &v.tokens[id as usize];
        seq.push(json!({"SpecialToken": {"id": tok, "type_id": 0}}));
        specials.insert(
            tok.clone(),
            json!({"id": tok, "ids": [id], "tokens": [tok]}),
        );
    };
    if let (true, Some(b)) = (add_bos, bos) {
        push_special(&mut single, b);
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let (true, Some(e)) = (add_eos, eos) {
        push_special(&mut single, e);
    }
    let mut pair = single.clone();
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": parts.normalizer,
        "pre_tokenizer": parts.pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": pair,
                           "special_tokens": specials},
        "decoder": parts.decoder,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": parts.byte_fallback, "ignore_merges": parts.ignore_merges,
            "vocab": vocab, "merges": merges,
        },
    });
    serde_json::to_string(&tokenizer).map_err(|e| ModelError::Json {
        path: v.g.path().to_path_buf(),
        msg: e.to_string(),
    })
}
