//! A Hugging Face `tokenizer.json` built from GGUF `tokenizer.ggml.*` metadata.
//!
//! Supported: `tokenizer.ggml.model = gpt2` (byte-level BPE). The pre-tokenizer follows
//! `tokenizer.ggml.pre` as llama.cpp's `llama-vocab.cpp` does; the regexes are the ones the
//! corresponding HF `tokenizer.json` files carry (GPT-2 `ByteLevel`, SmolLM's single digits,
//! Llama-3 and Qwen2 splits).

use serde_json::{json, Map, Value};

use super::GgufFile;
use crate::ModelError;

/// llama.cpp `llama_token_type`: control tokens are special, user-defined ones are added.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama-3's split regex (HF `meta-llama/Llama-3.*` tokenizer.json; llama.cpp `llama-bpe`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex (HF `Qwen/Qwen2*` tokenizer.json; llama.cpp `qwen2`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// Pre-tokenizer for a `tokenizer.ggml.pre` value, and whether BPE ignores merges for whole
/// vocab words (Llama-3). `None` for a value this builder does not know.
fn pre_tokenizer(pre: &str) -> Option<(Value, bool)> {
    Some(match pre {
        "default" | "gpt-2" | "gpt2" => (byte_level(true), false),
        "smollm" => (
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            false,
        ),
        "llama-bpe" | "llama3" => (
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
            true,
        ),
        "qwen2" => (
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
            false,
        ),
        _ => return None,
    })
}

/// Build a HF `tokenizer.json` (as JSON text) from a byte-level-BPE GGUF's metadata:
/// vocab from `tokenizer.ggml.tokens` (id = position), merges from `tokenizer.ggml.merges`
/// (`"a b"` strings), added tokens from `tokenizer.ggml.token_type` (3 = control → special,
/// 4 = user-defined → added, not special), pre-tokenizer from `tokenizer.ggml.pre`, a
/// ByteLevel decoder, and a post-processor that prepends BOS / appends EOS per
/// `tokenizer.ggml.add_bos_token` / `add_eos_token`.
///
/// Errors: [`ModelError::Unsupported`] when `tokenizer.ggml.model` is not `gpt2` or
/// `tokenizer.ggml.pre` is unknown (a `tokenizer.json` is then needed: `--tokenizer PATH`);
/// [`ModelError::MissingField`] for absent or mistyped tokens/merges/token types.
pub fn tokenizer_json_from_gguf(g: &GgufFile) -> Result<String, ModelError> {
    let path = g.path().to_path_buf();
    let missing = |field: &str| ModelError::MissingField {
        path: path.clone(),
        field: field.to_string(),
    };
    let unsupported = |msg: String| ModelError::Unsupported {
        path: path.clone(),
        msg: format!("{msg}; a tokenizer.json is needed (--tokenizer PATH)"),
    };
    let model = g
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(unsupported(format!(
            "tokenizer.ggml.model '{model}' cannot be converted (only byte-level BPE 'gpt2')"
        )));
    }
    let pre = g.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre)
        .ok_or_else(|| unsupported(format!("unknown tokenizer.ggml.pre '{pre}'")))?;
    let tokens = g
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
    let merges = g
        .get_str_array("tokenizer.ggml.merges")
        .ok_or_else(|| missing("tokenizer.ggml.merges"))?;
    let types = match g.metadata("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(_) => g
            .get_i64_array("tokenizer.ggml.token_type")
            .filter(|t| t.len() == tokens.len())
            .ok_or_else(|| missing("tokenizer.ggml.token_type (one integer per token)"))?,
    };

    let mut vocab = Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(tok.clone(), json!(id));
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
            }));
        }
    }

    let special = |key: &str, flag: &str, default: bool| -> Option<(u32, &String)> {
        if !g.get_bool(flag).unwrap_or(default) {
            return None;
        }
        let id = g.get_u32(key)?;
        tokens.get(id as usize).map(|t| (id, t))
    };
    let bos = special(
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.add_bos_token",
        false,
    );
    let eos = special(
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.add_eos_token",
        false,
    );
    let mut single = Vec::new();
    let mut specials = Map::new();
    let mut push_special = |seq: &mut Vec<Value>, (id, tok): (u32, &String)| {
        seq.push(json!({"SpecialToken": {"id": tok, "type_id": 0}}));
        specials.insert(
            tok.clone(),
            json!({"id": tok, "ids": [id], "tokens": [tok]}),
        );
    };
    if let Some(b) = bos {
        push_special(&mut single, b);
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some(e) = eos {
        push_special(&mut single, e);
    }
    let mut pair = single.clone();
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": pair,
                           "special_tokens": specials},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges,
        },
    });
    serde_json::to_string(&tokenizer).map_err(|e| ModelError::Json {
        path: path.clone(),
        msg: e.to_string(),
    })
}
