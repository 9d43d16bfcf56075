//! The bodies of infer's fuzz targets (one function per target, called by
//! `fuzz_targets/*.rs`), and the helpers they share: a scratch folder per input for readers
//! that take a path (they memory-map it, as they do real models), and the small container
//! format of the `vindex_open` target.
//!
//! Every function must return normally for any input: a parser error is the expected outcome of
//! most inputs; a panic, an abort (e.g. a failed allocation), a sanitizer report or a timeout
//! is a bug.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use infer_models::gguf::{
    config_from_gguf, tokenizer_json_from_gguf, GgufFile, GgufHeader, GgufTensors,
};
use infer_models::hf::SafetensorsSource;
use infer_models::tokenizer::Tokenizer;
use infer_models::{architecture_for, ModelConfig, TensorSource};

/// Tensors with more values than this are not decoded (each decode allocates `4 × n` bytes;
/// the point is the view and the bounds checks, not decoding speed).
const MAX_DECODE_ELEMENTS: usize = 1 << 16;

/// Sparse `.bin` files the `vindex_open` target creates are capped at this size.
const MAX_SPARSE_BYTES: u64 = 1 << 30;

/// A fresh scratch folder for one input, removed when dropped (one per input rather than per
/// process: a process's folder kept in a static was never dropped, so every fuzzing run left
/// one behind in the temp folder).
fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("infer-fuzz-")
        .tempdir()
        .expect("scratch folder")
}

/// Write `data` to a file named `name` in a fresh scratch folder; returns the folder (removed,
/// with the file, when dropped: keep it while the file is read) and the file's path.
pub fn scratch_file(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = scratch_dir();
    let p = dir.path().join(name);
    std::fs::write(&p, data).expect("write scratch file");
    (dir, p)
}

/// `gguf_header`: header, metadata and tensor table parsed from memory, then the data-section
/// length and the metadata accessors.
pub fn gguf_header(data: &[u8]) {
    if let Ok(h) = GgufHeader::parse(Path::new("fuzz.gguf"), data) {
        let _ = h.data_len();
        for (k, v) in &h.metadata {
            let _ = (k.len(), v.type_name(), v.as_u64(), v.as_i64(), v.as_f64());
            if let Some(a) = v.as_array() {
                let _ = (a.len(), a.to_i64_vec());
            }
        }
        for t in &h.tensors {
            let _ = (t.n_elements(), t.hf_shape());
        }
    }
}

/// `gguf_tensors`: the file memory-mapped and validated (`GgufFile::open`), every tensor's
/// bytes viewed; when the metadata makes a config, the config, the architecture and the tensors
/// by HF name decoded to f32 (llama.cpp's Q/K row permutation undone), each tensor of at most
/// [`MAX_DECODE_ELEMENTS`] values.
pub fn gguf_tensors(data: &[u8]) {
    let (_scratch, path) = scratch_file("tensors.gguf", data);
    let Ok(g) = GgufFile::open(&path) else {
        return;
    };
    for t in g.tensor_infos() {
        let b = g.tensor_bytes(&t.name).expect("a listed tensor has bytes");
        assert_eq!(b.len(), t.n_bytes);
    }
    let Ok(config) = config_from_gguf(&g) else {
        return;
    };
    check_config(&config);
    let Ok(src) = GgufTensors::new(std::sync::Arc::new(g), &config) else {
        return;
    };
    decode_all(&src);
}

/// `safetensors_header`: a safetensors file memory-mapped and validated, every tensor decoded
/// to f32 (each of at most [`MAX_DECODE_ELEMENTS`] values).
pub fn safetensors_header(data: &[u8]) {
    let (_scratch, path) = scratch_file("model.safetensors", data);
    if let Ok(src) = SafetensorsSource::open(&[path]) {
        decode_all(&src);
    }
}

fn decode_all(src: &dyn TensorSource) {
    for t in src.tensors().to_vec() {
        let n: usize = t.shape.iter().product();
        if n <= MAX_DECODE_ELEMENTS {
            if let Ok(x) = src.read_f32(&t.name) {
                assert_eq!(x.data.len(), n, "{}: decoded length", t.name);
            }
        }
    }
}

/// The architecture answers of a config that parsed (what the forward pass asks per layer).
fn check_config(config: &ModelConfig) {
    if let Ok(a) = architecture_for(config) {
        for layer in 0..config.num_hidden_layers.min(64) {
            let _ = (
                a.head_dim_for_layer(layer),
                a.num_q_heads_for_layer(layer),
                a.num_kv_heads_for_layer(layer),
                a.intermediate_size_for_layer(layer),
                a.rope_base_for_layer(layer),
                a.attention_scale_for_layer(layer),
                a.sliding_window_for_layer(layer),
                a.rotary_fraction_for_layer(layer),
            );
        }
        let _ = infer_models::arch::expected_tensors(a.as_ref());
    }
}

/// `hf_config`: a `config.json` → [`ModelConfig`] → architecture; a config that parses must
/// also survive the vindex's round trip (serialize, re-read, re-check).
pub fn hf_config(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let path = Path::new("config.json");
    if let Ok(c) = ModelConfig::from_hf_json(path, &v) {
        check_config(&c);
        let text = serde_json::to_string(&c).expect("a config serializes");
        let back: ModelConfig = serde_json::from_str(&text).expect("and reads back");
        back.check(path)
            .expect("a config that parsed passes the vindex check");
    }
}

/// `gguf_tokenizer`: a GGUF's `tokenizer.ggml.*` metadata → vindex `tokenizer.json` →
/// tokenizer, which then encodes and decodes a fixed text (special markup included).
pub fn gguf_tokenizer(data: &[u8]) {
    let (_scratch, path) = scratch_file("tokenizer.gguf", data);
    let Ok(g) = GgufFile::open(&path) else {
        return;
    };
    let Ok(json) = tokenizer_json_from_gguf(&g) else {
        return;
    };
    let Ok(t) = Tokenizer::from_json(&json) else {
        return;
    };
    for (special, parse) in [(true, true), (false, false)] {
        if let Ok(ids) = t.encode_with("Hello, wörld! <s> 12 \u{1F600}\n\t x", special, parse) {
            let _ = t.decode(&ids, false);
            let _ = t.decode(&ids, true);
        }
    }
    let _ = t.decode(&[0, 1, 2, u32::MAX], false);
    let _ = (t.token_to_id("a"), t.id_to_token(0), t.id_bound());
}

/// `chat_template`: the first line of the input is a message text, the rest a Jinja template
/// compiled and rendered with a system, user and assistant message (under the fuel and output
/// caps of `infer_inference::chat`).
pub fn chat_template(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (content, template) = text.split_once('\n').unwrap_or(("hi", text));
    let Ok(t) = infer_inference::chat::ChatTemplate::new(template, "<s>", "</s>") else {
        return;
    };
    use infer_inference::chat::Message;
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", content),
        Message::new("assistant", "Ok."),
        Message::new("user", content),
    ];
    let _ = t.render(&messages, true);
    let _ = t.render(&messages[1..2], false);
}

/// Vocabulary size the `serve_request` target parses against (SmolLM2's: token ids and
/// `logit_bias` keys at or above it are refused).
const SERVE_VOCAB: usize = 49_152;

/// Sequences the `serve_request` target's server runs at once (`--parallel`: the bound of `n`).
const SERVE_PARALLEL: usize = 4;

/// `serve_request`: a request body read as `infer serve` reads one for each endpoint
/// (`/v1/chat/completions`, `/v1/completions`): JSON, every field's type and range, messages
/// and content parts, prompts as text or token ids, stop strings, logit biases, sampling. A
/// request that parses must hold what the parser promises (ranges, counts, ids below the
/// vocabulary); a chat request's messages are then rendered through ChatML, as the server
/// renders them through the model's template.
pub fn serve_request(data: &[u8]) {
    use infer_cli::serve::params::{parse, Endpoint, Input, MAX_STOPS, MAX_TOP_LOGPROBS};
    static CHATML: OnceLock<infer_inference::chat::ChatTemplate> = OnceLock::new();
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        let Ok(r) = parse(data, endpoint, SERVE_VOCAB, SERVE_PARALLEL) else {
            continue;
        };
        assert!((1..=SERVE_PARALLEL).contains(&r.n), "n = {}", r.n);
        assert!(r.stop.len() <= MAX_STOPS && r.stop.iter().all(|s| !s.is_empty()));
        assert!(r.logprobs.is_none_or(|k| k <= MAX_TOP_LOGPROBS));
        assert!(r.max_tokens.is_none_or(|m| m >= 1));
        let p = &r.sampling.params;
        assert!((0.0..=2.0).contains(&p.temperature), "{}", p.temperature);
        assert!(p.top_p > 0.0 && p.top_p <= 1.0 && (0.0..=1.0).contains(&p.min_p));
        assert!(p.top_k <= SERVE_VOCAB && p.repeat_penalty > 0.0);
        for (id, bias) in &r.sampling.logit_bias {
            assert!((*id as usize) < SERVE_VOCAB && (-100.0..=100.0).contains(bias));
        }
        match &r.input {
            Input::Messages(messages) => {
                assert!(endpoint == Endpoint::Chat && !messages.is_empty());
                let t = CHATML.get_or_init(|| {
                    infer_inference::chat::ChatTemplate::new(
                        infer_inference::chat::CHATML_TEMPLATE,
                        "",
                        "<|im_end|>",
                    )
                    .expect("ChatML compiles")
                });
                let prompt = t
                    .render(messages, true)
                    .expect("ChatML renders any messages");
                assert!(prompt.ends_with("<|im_start|>assistant\n"));
            }
            Input::Text(text) => assert!(endpoint == Endpoint::Completion && !text.is_empty()),
            Input::Ids(ids) => {
                assert!(!ids.is_empty() && ids.iter().all(|&i| (i as usize) < SERVE_VOCAB))
            }
        }
    }
}

/// Pack `(name, content)` pairs into the `vindex_open` container: per file, a one-byte name
/// length, the name, a little-endian u32 content length, the content.
pub fn pack_files(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content) in files {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(content.len() as u32).to_le_bytes());
        out.extend_from_slice(content);
    }
    out
}

/// Inverse of [`pack_files`]; a truncated last record keeps the bytes that are there.
pub fn unpack_files(mut data: &[u8]) -> Vec<(String, &[u8])> {
    let mut files = Vec::new();
    while let Some((&n, rest)) = data.split_first() {
        let n = (n as usize).min(rest.len());
        let name = String::from_utf8_lossy(&rest[..n]).into_owned();
        let rest = &rest[n..];
        let len = rest
            .get(..4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
        let rest = rest.get(4..).unwrap_or(&[]);
        let len = len.min(rest.len());
        files.push((name, &rest[..len]));
        data = &rest[len..];
    }
    files
}

/// `vindex_open`: the input is a [`pack_files`] container of a vindex's small files
/// (`index.json`, manifests, tokenizer and template files, `down_meta.bin`); every other file
/// `index.json` lists is created as a sparse file (zeros) of the recorded size (at most
/// [`MAX_SPARSE_BYTES`]), so sizes agree and opening gets past them. Then `Vindex::open` and,
/// when it opens, every accessor: tensor views, per-layer FFN and quantized views, tokenizer.
pub fn vindex_open(data: &[u8]) {
    let scratch = scratch_dir();
    let dir = scratch.path().join("v.vindex");
    std::fs::create_dir(&dir).expect("scratch vindex folder");
    let files = unpack_files(data);
    for (name, content) in &files {
        // Names the file system refuses (too long, …) are the harness's problem: skipped.
        if infer_vindex::files::is_plain_file_name(name) {
            let _ = std::fs::write(dir.join(name), content);
        }
    }
    if let Some((_, index)) = files.iter().find(|(n, _)| n == "index.json") {
        create_listed_files(&dir, index);
    }
    let Ok(v) = infer_vindex::Vindex::open(&dir) else {
        return;
    };
    exercise_vindex(&v);
}

/// Sparse files for every `files[]` entry of `index` not written from the input.
fn create_listed_files(dir: &Path, index: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(index) else {
        return;
    };
    let Some(list) = v.get("files").and_then(|f| f.as_array()) else {
        return;
    };
    for f in list {
        let (Some(name), Some(bytes)) = (
            f.get("name").and_then(|n| n.as_str()),
            f.get("bytes").and_then(|b| b.as_u64()),
        ) else {
            continue;
        };
        let p = dir.join(name);
        if !infer_vindex::files::is_plain_file_name(name) || p.exists() {
            continue;
        }
        if let Ok(file) = std::fs::File::create(&p) {
            let _ = file.set_len(bytes.min(MAX_SPARSE_BYTES));
        }
    }
}

fn exercise_vindex(v: &infer_vindex::Vindex) {
    use infer_vindex::files;
    let touch = |s: infer_vindex::FloatSlice<'_>| {
        let _ = (s.len(), s.format(), s.as_f32().map(|x| x.first().copied()));
    };
    let (emb, _) = v.embeddings();
    touch(emb);
    if let Some((lm, _)) = v.lm_head() {
        touch(lm);
    }
    let keys: Vec<String> = v.keys().map(str::to_string).collect();
    for k in &keys {
        if let Ok((t, shape)) = v.tensor(k) {
            touch(t);
            let _ = shape.iter().product::<usize>();
        }
    }
    for layer in 0..v.num_layers().min(64) {
        let _ = v.intermediate_size(layer);
        for s in [v.gate_layer(layer), v.up_layer(layer), v.down_layer(layer)]
            .into_iter()
            .flatten()
        {
            touch(s);
        }
        let _ = v.attn_q4k_layer_data(layer);
        let _ = v.attn_q8_layer_data(layer);
        let _ = v.ffn_q4k_layer_data(layer);
        let _ = v.ffn_q4_layer_data(layer);
        let _ = v.gate_q4_data(layer);
    }
    for &(bin, _) in files::QUANT_BINS {
        for e in v.quant_entries(bin) {
            let _ = v.quant_tensor(bin, &e.key);
        }
    }
    let _ = v.lm_head_q4_data();
    let _ = v.lm_head_q6k_data();
    if let Ok(Some(_)) = v.down_meta_header() {
        for layer in 0..v.num_layers().min(64) {
            let _ = v.down_meta(layer);
        }
    }
    if let Ok(json) = v.tokenizer_json() {
        let _ = Tokenizer::from_json(&json);
    }
    if let Some(t) = v.chat_template() {
        let _ = infer_inference::chat::ChatTemplate::new(t, "<s>", "</s>");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_round_trips_and_tolerates_truncation() {
        let packed = pack_files(&[("index.json", b"{}"), ("norms.bin", b"")]);
        let files = unpack_files(&packed);
        assert_eq!(files.len(), 2);
        assert_eq!(files[0], ("index.json".to_string(), &b"{}"[..]));
        assert_eq!(files[1], ("norms.bin".to_string(), &b""[..]));
        // 12 of the second record's 14 bytes cut: its name-length byte and one byte of the
        // name are left, kept as a record named "n" with no content.
        let cut = unpack_files(&packed[..packed.len() - 12]);
        assert_eq!(
            cut,
            vec![
                ("index.json".to_string(), &b"{}"[..]),
                ("n".to_string(), &b""[..])
            ]
        );
        assert_eq!(unpack_files(&[200]), vec![(String::new(), &[][..])]);
    }
}
