//! GGUF metadata for a model written back to GGUF (`infer export`): the inverse of
//! [`super::config_from_gguf`] ([`model_metadata`]) and of [`super::tokenizer_json_from_gguf`]
//! ([`tokenizer_metadata`]), with llama.cpp's keys (`gguf-py/gguf/constants.py`) and the
//! per-architecture tensor conventions of `convert_hf_to_gguf.py` ([`export_family`]).
//!
//! What llama.cpp cannot run as the vindex runs it is refused with the reason, never written
//! approximately: mixture-of-experts layers, Llama-3 RoPE scaling (llama.cpp keeps it in a
//! `rope_freqs` tensor that infer's GGUF reader does not read), sliding-window attention on an
//! architecture whose llama.cpp graph has none, a Gemma attention scale llama.cpp does not
//! derive, families outside infer's GGUF reader.

use serde_json::Value;

use super::family::{family, Family};
use super::pre_tokenizer::pre_tokenizer_name;
use super::{GgufArray, GgufValue};
use crate::tokenizer::{SpmSpec, SPM_KEY};
use crate::{LayerKind, ModelConfig, RopeScaling};

/// How a family is stored in GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportFamily {
    /// `general.architecture`.
    pub gguf_arch: &'static str,
    /// Q and K rows (weights and biases) are stored in llama.cpp's interleaved-RoPE order
    /// ([`super::permute_qk_rows`]).
    pub qk_permuted: bool,
    /// Every `*norm.weight` is stored as `1 + w` (Gemma).
    pub norm_plus_one: bool,
}

/// The GGUF family of HF `model_type`, `None` for a family infer's GGUF reader does not cover
/// or that has no export here (gpt-oss, qwen3_moe, mixtral: their stacked experts are read, not
/// written; `mistral` is written as llama.cpp's `llama`, as its converter does).
pub fn export_family(model_type: &str) -> Option<ExportFamily> {
    let mt = match model_type {
        "mistral" => "llama",
        "gemma3" => "gemma3_text",
        other => other,
    };
    let f: &Family = super::family::FAMILIES
        .iter()
        .find(|f| f.model_type == mt && f.moe.has_dense_form())?;
    Some(ExportFamily {
        gguf_arch: f.gguf_arch,
        qk_permuted: f.qk_permuted,
        norm_plus_one: f.norm_plus_one,
    })
}

/// The HF `model_type`s [`export_family`] covers, for messages.
pub fn exportable_model_types() -> String {
    let mut v: Vec<&str> = super::family::FAMILIES
        .iter()
        .filter(|f| f.moe.has_dense_form())
        .map(|f| f.model_type)
        .collect();
    v.insert(1, "mistral");
    v.join(", ")
}

fn u32v(what: &str, v: usize) -> Result<GgufValue, String> {
    u32::try_from(v)
        .map(GgufValue::U32)
        .map_err(|_| format!("{what} = {v} does not fit a GGUF u32"))
}

/// The sliding pattern llama.cpp assumes for `arch` (`set_swa_pattern(n)`: layer `i` slides
/// unless `(i + 1) % n == 0`).
fn default_pattern(n_layers: usize, n: usize) -> Vec<bool> {
    (0..n_layers).map(|i| (i + 1) % n != 0).collect()
}

/// `general.*` and `{arch}.*` metadata of `cfg` (after `general.architecture`, in the order
/// llama.cpp's converter writes them), `name` as `general.name`.
///
/// Errors (as a message saying why llama.cpp could not run it as the vindex does): a family
/// [`export_family`] does not cover, MoE, Llama-3 RoPE scaling, a sliding window on an
/// architecture other than gemma2/gemma3, a Gemma-2/3 `query_pre_attn_scalar` llama.cpp does
/// not derive from the head size, an attention soft-cap outside Gemma-2, or a size above u32.
pub fn model_metadata(cfg: &ModelConfig, name: &str) -> Result<Vec<(String, GgufValue)>, String> {
    let mt = cfg.model_type.as_str();
    let fam = export_family(mt).ok_or_else(|| {
        format!(
            "model_type '{mt}' has no GGUF export (infer reads and writes GGUF for {}); export it with --safetensors",
            exportable_model_types()
        )
    })?;
    let arch = fam.gguf_arch;
    let fam_info = family(arch).ok_or_else(|| format!("no GGUF family '{arch}'"))?;
    if cfg.num_experts > 0 {
        return Err(
            "mixture-of-experts models have no GGUF export here; export with --safetensors".into(),
        );
    }
    let n = cfg.num_hidden_layers;
    let k = |s: &str| format!("{arch}.{s}");
    let mut md: Vec<(String, GgufValue)> = vec![
        (
            "general.architecture".into(),
            GgufValue::String(arch.into()),
        ),
        ("general.type".into(), GgufValue::String("model".into())),
        ("general.name".into(), GgufValue::String(name.into())),
        (
            k("context_length"),
            u32v("max_position_embeddings", cfg.max_position_embeddings)?,
        ),
        (k("embedding_length"), u32v("hidden_size", cfg.hidden_size)?),
        (k("block_count"), u32v("num_hidden_layers", n)?),
        (
            k("feed_forward_length"),
            u32v("intermediate_size", cfg.intermediate_size)?,
        ),
        (
            k("attention.head_count"),
            u32v("num_attention_heads", cfg.num_attention_heads)?,
        ),
        (
            k("attention.head_count_kv"),
            u32v("num_key_value_heads", cfg.num_key_value_heads)?,
        ),
        (k("attention.key_length"), u32v("head_dim", cfg.head_dim)?),
        (k("attention.value_length"), u32v("head_dim", cfg.head_dim)?),
        (
            k("rope.dimension_count"),
            u32v(
                "rotary dimension",
                crate::config::rotary_dim(cfg.head_dim, cfg.partial_rotary_factor),
            )?,
        ),
        (k("rope.freq_base"), GgufValue::F32(cfg.rope_theta as f32)),
        (
            fam_info_eps(arch, fam_info),
            GgufValue::F32(cfg.norm_eps as f32),
        ),
        (k("vocab_size"), u32v("vocab_size", cfg.vocab_size)?),
    ];
    match &cfg.rope_scaling {
        None => {}
        Some(RopeScaling::Linear { factor }) => {
            md.push((k("rope.scaling.type"), GgufValue::String("linear".into())));
            md.push((k("rope.scaling.factor"), GgufValue::F32(*factor as f32)));
        }
        Some(RopeScaling::Llama3 { .. }) => {
            return Err("Llama-3 RoPE scaling is stored by llama.cpp as a rope_freqs tensor, which infer's GGUF reader does not read; export with --safetensors".into())
        }
        Some(RopeScaling::Yarn { .. }) => {
            return Err("YaRN RoPE scaling has no GGUF export here; export with --safetensors".into())
        }
    }

    // Sliding-window attention: only the Gemma-2/3 and Cohere-2 graphs of llama.cpp run it.
    let sliding: Vec<bool> = cfg
        .layer_types
        .iter()
        .map(|t| *t == LayerKind::Sliding)
        .collect();
    if let Some(w) = cfg.sliding_window.filter(|_| sliding.contains(&true)) {
        let Some(p) = fam_info.sliding_pattern else {
            return Err(format!(
                "sliding-window attention (window {w}): llama.cpp's '{arch}' architecture has none; export with --safetensors"
            ));
        };
        md.push((k("attention.sliding_window"), u32v("sliding_window", w)?));
        if sliding != default_pattern(n, p) {
            md.push((
                k("attention.sliding_window_pattern"),
                GgufValue::Array(GgufArray::Bool(sliding.clone())),
            ));
        }
        if let (Some(local), Some(default)) = (cfg.rope_local_theta, fam_info.rope_local_theta) {
            if local != default {
                md.push((k("rope.freq_base_swa"), GgufValue::F32(local as f32)));
            }
        }
    } else if arch == "gemma2" {
        return Err(
            "no layer slides, but llama.cpp's 'gemma2' architecture always runs its sliding-window pattern; export with --safetensors".into(),
        );
    }

    if fam_info.query_pre_attn_scalar {
        let derived = if fam_info.scale_by_hidden_per_head_at_layers == Some(n) {
            (cfg.hidden_size / cfg.num_attention_heads) as f64
        } else {
            cfg.head_dim as f64
        };
        if cfg.query_pre_attn_scalar != Some(derived) {
            return Err(format!(
                "query_pre_attn_scalar {:?}: llama.cpp's '{arch}' derives the attention scale from {derived} (the head size); export with --safetensors",
                cfg.query_pre_attn_scalar
            ));
        }
    }
    if let Some(scale) = cfg.logit_scale {
        if arch != "cohere2" {
            return Err(format!(
                "logit_scale {scale}: llama.cpp applies it only for cohere2; export with --safetensors"
            ));
        }
        md.push((k("logit_scale"), GgufValue::F32(scale as f32)));
    }
    if let Some(c) = cfg.attn_logit_softcapping {
        if arch != "gemma2" {
            return Err(format!(
                "attention logit soft-capping ({c}): llama.cpp applies it only for gemma2; export with --safetensors"
            ));
        }
        md.push((k("attn_logit_softcapping"), GgufValue::F32(c as f32)));
    }
    if let Some(c) = cfg.final_logit_softcapping {
        if !matches!(arch, "gemma2" | "gemma3") {
            return Err(format!(
                "final logit soft-capping ({c}): llama.cpp applies it only for gemma2/gemma3; export with --safetensors"
            ));
        }
        md.push((k("final_logit_softcapping"), GgufValue::F32(c as f32)));
    }
    Ok(md)
}

/// `{arch}.` + the family's norm-epsilon key.
fn fam_info_eps(arch: &str, f: &Family) -> String {
    format!("{arch}.{}", f.eps_key)
}

/// A token's text and llama.cpp type.
struct Tok {
    text: String,
    ty: i32,
}

/// `tokens` padded to `n` with llama.cpp's converter's `[PAD{i}]` (type unused).
fn pad_tokens(tokens: &mut Vec<Option<Tok>>, n: usize) -> Result<(), String> {
    if tokens.len() > n {
        return Err(format!(
            "the tokenizer has {} tokens but the model only {n} embedding rows (vocab_size)",
            tokens.len()
        ));
    }
    tokens.resize_with(n, || None);
    for (i, t) in tokens.iter_mut().enumerate() {
        if t.is_none() {
            *t = Some(Tok {
                text: format!("[PAD{i}]"),
                ty: 5,
            });
        }
    }
    Ok(())
}

fn strings(v: Vec<String>) -> GgufValue {
    GgufValue::Array(GgufArray::String(v))
}

/// `tokenizer.ggml.*` metadata and `tokenizer.chat_template` for a vindex `tokenizer.json`
/// (the inverse of [`super::tokenizer_json_from_gguf`]):
///
/// - an `{"infer_spm": …}` document ([`SpmSpec`], a GGUF SentencePiece vocabulary): model
///   `llama`, its tokens, scores, token types, BOS/EOS/UNK ids and `add_bos_token` /
///   `add_eos_token` / `add_space_prefix`, exactly as read;
/// - a byte-level BPE `tokenizer.json` (from a GGUF `gpt2` vocabulary, or a Hugging Face one
///   whose pre-tokenizer is one llama.cpp has a `tokenizer.ggml.pre` for): model `gpt2`, the
///   `pre` name, tokens by id (added tokens included; special → control, other added →
///   user-defined; ids no token has become `[PAD{i}]`, unused, up to `vocab_size`), merges
///   `"a b"`, and `add_bos_token` / `add_eos_token` from its post-processor.
///
/// BOS, EOS and padding ids come from `cfg` where the tokenizer has none; further end ids of
/// `cfg.eos_token_ids` become `eot_token_id` then `eom_token_id` (the order the GGUF reader
/// reads them back in).
///
/// Errors (as a message): other tokenizer types (SentencePiece-style BPE with byte fallback,
/// WordPiece, Unigram, a pre-tokenizer llama.cpp has no name for), malformed documents, more
/// tokens than `vocab_size`, more than three end-of-generation ids.
pub fn tokenizer_metadata(
    tokenizer_json: &str,
    cfg: &ModelConfig,
    chat_template: Option<&str>,
) -> Result<Vec<(String, GgufValue)>, String> {
    let doc: Value =
        serde_json::from_str(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
    let mut md: Vec<(String, GgufValue)> = Vec::new();
    let put = |md: &mut Vec<(String, GgufValue)>, k: &str, v: GgufValue| {
        md.push((format!("tokenizer.ggml.{k}"), v));
    };
    let (bos, eos, add_bos, add_eos);
    if let Some(spec) = doc.get(SPM_KEY) {
        let spec: SpmSpec = serde_json::from_value(spec.clone())
            .map_err(|e| format!("tokenizer.json: \"{SPM_KEY}\": {e}"))?;
        let n = spec.tokens.len();
        if spec.scores.len() != n || spec.token_type.len() != n {
            return Err(format!(
                "tokenizer.json: {n} tokens but {} scores and {} token types",
                spec.scores.len(),
                spec.token_type.len()
            ));
        }
        if n != cfg.vocab_size {
            return Err(format!(
                "the SentencePiece vocabulary has {n} tokens but the model {} embedding rows",
                cfg.vocab_size
            ));
        }
        put(&mut md, "model", GgufValue::String("llama".into()));
        put(&mut md, "tokens", strings(spec.tokens));
        put(
            &mut md,
            "scores",
            GgufValue::Array(GgufArray::F32(spec.scores)),
        );
        put(
            &mut md,
            "token_type",
            GgufValue::Array(GgufArray::I32(spec.token_type)),
        );
        bos = spec.bos.or(cfg.bos_token_id);
        eos = spec.eos;
        if let Some(u) = spec.unk {
            md.push(("tokenizer.ggml.unknown_token_id".into(), GgufValue::U32(u)));
        }
        add_bos = spec.add_bos;
        add_eos = spec.add_eos;
        put(
            &mut md,
            "add_space_prefix",
            GgufValue::Bool(spec.add_space_prefix),
        );
    } else {
        let bpe = byte_level_bpe(&doc, cfg.vocab_size)?;
        put(&mut md, "model", GgufValue::String("gpt2".into()));
        put(&mut md, "pre", GgufValue::String(bpe.pre.into()));
        put(
            &mut md,
            "tokens",
            strings(bpe.tokens.iter().map(|t| t.text.clone()).collect()),
        );
        put(
            &mut md,
            "token_type",
            GgufValue::Array(GgufArray::I32(bpe.tokens.iter().map(|t| t.ty).collect())),
        );
        put(&mut md, "merges", strings(bpe.merges));
        bos = bpe.bos.or(cfg.bos_token_id);
        eos = bpe.eos;
        add_bos = bpe.bos.is_some();
        add_eos = bpe.eos.is_some();
    }
    if let Some(b) = bos {
        put(&mut md, "bos_token_id", GgufValue::U32(b));
    }
    // End ids: the tokenizer's EOS first, then the config's others.
    let mut ends: Vec<u32> = eos.into_iter().collect();
    for &e in &cfg.eos_token_ids {
        if !ends.contains(&e) {
            ends.push(e);
        }
    }
    if ends.len() > 3 {
        return Err(format!(
            "{} end-of-generation ids {ends:?}: GGUF holds three (eos, eot, eom)",
            ends.len()
        ));
    }
    for (id, key) in ends
        .iter()
        .zip(["eos_token_id", "eot_token_id", "eom_token_id"])
    {
        put(&mut md, key, GgufValue::U32(*id));
    }
    if let Some(p) = cfg.pad_token_id {
        put(&mut md, "padding_token_id", GgufValue::U32(p));
    }
    put(&mut md, "add_bos_token", GgufValue::Bool(add_bos));
    put(&mut md, "add_eos_token", GgufValue::Bool(add_eos));
    if let Some(t) = chat_template {
        md.push((
            "tokenizer.chat_template".into(),
            GgufValue::String(t.to_string()),
        ));
    }
    Ok(md)
}

/// What a byte-level BPE `tokenizer.json` gives GGUF.
struct Bpe {
    pre: &'static str,
    tokens: Vec<Tok>,
    merges: Vec<String>,
    /// The BOS / EOS id the post-processor adds, if it adds one.
    bos: Option<u32>,
    eos: Option<u32>,
}

fn as_id(v: &Value, what: &str) -> Result<u32, String> {
    v.as_u64()
        .and_then(|u| u32::try_from(u).ok())
        .ok_or_else(|| format!("tokenizer.json: {what} is not a token id: {v}"))
}

/// Read a byte-level BPE `tokenizer.json` (see [`tokenizer_metadata`]).
fn byte_level_bpe(doc: &Value, vocab_size: usize) -> Result<Bpe, String> {
    let model = doc
        .get("model")
        .ok_or("tokenizer.json: no \"model\" object")?;
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "BPE" {
        return Err(format!(
            "tokenizer.json: a '{kind}' model has no GGUF export (byte-level BPE and infer's SentencePiece vocabularies do)"
        ));
    }
    if model.get("byte_fallback").and_then(Value::as_bool) == Some(true) {
        return Err("tokenizer.json: a SentencePiece-style BPE (byte_fallback) has no GGUF export: llama.cpp needs its SentencePiece scores; rebuild the vindex from the model's GGUF, or export with --no-tokenizer".into());
    }
    match doc.get("normalizer") {
        None | Some(Value::Null) => {}
        Some(n) if n.get("type").and_then(Value::as_str) == Some("NFC") => {}
        Some(n) => {
            return Err(format!(
                "tokenizer.json: normalizer {n} has no llama.cpp byte-level BPE equivalent"
            ))
        }
    }
    let pre_json = doc.get("pre_tokenizer").cloned().unwrap_or(Value::Null);
    let ignore_merges = model
        .get("ignore_merges")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let pre = pre_tokenizer_name(&pre_json, ignore_merges).ok_or_else(|| {
        format!("tokenizer.json: pre-tokenizer {pre_json} (ignore_merges {ignore_merges}) is none that llama.cpp names in tokenizer.ggml.pre")
    })?;

    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or("tokenizer.json: model.vocab is not an object")?;
    let mut tokens: Vec<Option<Tok>> = Vec::new();
    let set = |id: u32, text: &str, ty: i32, tokens: &mut Vec<Option<Tok>>| {
        let i = id as usize;
        if i >= tokens.len() {
            tokens.resize_with(i + 1, || None);
        }
        tokens[i] = Some(Tok {
            text: text.to_string(),
            ty,
        });
    };
    let limit = vocab_size.max(1) as u64 * 4;
    for (text, id) in vocab {
        let id = as_id(id, &format!("model.vocab[{text:?}]"))?;
        if u64::from(id) >= limit {
            return Err(format!(
                "tokenizer.json: token {text:?} has id {id}, far beyond vocab_size {vocab_size}"
            ));
        }
        set(id, text, 1, &mut tokens);
    }
    for a in doc
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let id = as_id(a.get("id").unwrap_or(&Value::Null), "added_tokens[].id")?;
        let text = a
            .get("content")
            .and_then(Value::as_str)
            .ok_or("tokenizer.json: added_tokens[].content is not a string")?;
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        if u64::from(id) >= limit {
            return Err(format!(
                "tokenizer.json: added token {text:?} has id {id}, far beyond vocab_size {vocab_size}"
            ));
        }
        set(id, text, if special { 3 } else { 4 }, &mut tokens);
    }
    pad_tokens(&mut tokens, vocab_size)?;
    let tokens: Vec<Tok> = tokens.into_iter().flatten().collect();

    let merges = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or("tokenizer.json: model.merges is not a list")?
        .iter()
        .enumerate()
        .map(|(i, m)| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(p) => match p.as_slice() {
                [Value::String(a), Value::String(b)] => Ok(format!("{a} {b}")),
                _ => Err(format!("tokenizer.json: merge {i} is not two strings: {m}")),
            },
            _ => Err(format!("tokenizer.json: merge {i} is not a merge: {m}")),
        })
        .collect::<Result<Vec<_>, _>>()?;

    let (bos, eos) = post_processor_ids(doc, vocab)?;
    Ok(Bpe {
        pre,
        tokens,
        merges,
        bos,
        eos,
    })
}

/// The special token ids a `TemplateProcessing` post-processor (alone or in a `Sequence`)
/// puts before and after a single sequence.
fn post_processor_ids(
    doc: &Value,
    vocab: &serde_json::Map<String, Value>,
) -> Result<(Option<u32>, Option<u32>), String> {
    let Some(pp) = doc.get("post_processor").filter(|p| !p.is_null()) else {
        return Ok((None, None));
    };
    let template = match pp.get("type").and_then(Value::as_str) {
        Some("TemplateProcessing") => Some(pp),
        Some("Sequence") => pp
            .get("processors")
            .and_then(Value::as_array)
            .and_then(|ps| {
                ps.iter()
                    .find(|p| p.get("type").and_then(Value::as_str) == Some("TemplateProcessing"))
            }),
        _ => None,
    };
    let Some(t) = template else {
        return Ok((None, None));
    };
    let single = t
        .get("single")
        .and_then(Value::as_array)
        .ok_or("tokenizer.json: post_processor.single is not a list")?;
    let id_of = |piece: &Value| -> Result<Option<u32>, String> {
        let Some(tok) = piece.pointer("/SpecialToken/id").and_then(Value::as_str) else {
            return Ok(None);
        };
        let from_map = t
            .pointer(&format!(
                "/special_tokens/{}/ids/0",
                tok.replace('~', "~0").replace('/', "~1")
            ))
            .map(|v| as_id(v, "post_processor special token"))
            .transpose()?;
        let from_vocab = vocab
            .get(tok)
            .map(|v| as_id(v, "post_processor special token"))
            .transpose()?;
        from_map
            .or(from_vocab)
            .map(Some)
            .ok_or_else(|| format!("tokenizer.json: post-processor token {tok:?} has no id"))
    };
    let bos = match single.first() {
        Some(p) => id_of(p)?,
        None => None,
    };
    let eos = match single.last() {
        Some(p) if single.len() > 1 => id_of(p)?,
        _ => None,
    };
    Ok((bos, eos))
}
