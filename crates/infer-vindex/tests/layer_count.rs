//! `extract` refuses sources whose declared layer count, context length or rotary dimension
//! disagree with the tensors or make no sense, naming the source and the field, and leaves
//! nothing at (or beside) the output path. Sources are doctored copies: an archrefs HF folder
//! with `config.json` edited, and the SmolLM2 GGUF with one header value rewritten.

mod common;

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use common::{model_file, shared_dir};
use infer_models::gguf::{encode_header, GgufHeader, GgufValue};
use infer_vindex::{extract, BuildOptions, QuantTiers};

fn opts() -> BuildOptions {
    BuildOptions {
        allow_no_tokenizer: true, // archrefs carry no tokenizer
        ..Default::default()
    }
}

/// Extract `src` into a fresh empty directory; the build must fail. Returns the error text
/// after checking that the output directory is still empty (no target, no temp directory).
fn extract_fails(src: &Path) -> String {
    extract_fails_with(src, &opts())
}

/// [`extract_fails`] with the given options.
fn extract_fails_with(src: &Path, opts: &BuildOptions) -> String {
    let out = tempfile::tempdir().expect("tempdir");
    let target = out.path().join("m.vindex");
    let err = match extract(src, &target, opts) {
        Ok(_) => panic!("{}: extract succeeded on a doctored source", src.display()),
        Err(e) => e.to_string(),
    };
    let left: Vec<_> = std::fs::read_dir(out.path())
        .expect("read out dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{err}: left behind {left:?}");
    assert!(
        err.contains(&src.display().to_string()),
        "error does not name the source {}: {err}",
        src.display()
    );
    err
}

/// A copy of archrefs/`case` in a temp dir with `config.json` edited by `edit`.
fn doctored_hf(case: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let from = shared_dir().join("archrefs").join(case);
    let dir = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let p = e.expect("dir entry").path();
        if p.is_file() {
            std::fs::copy(&p, dir.path().join(p.file_name().expect("file name"))).expect("copy");
        }
    }
    let cfg = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).expect("read config")).expect("json");
    edit(&mut v);
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).expect("json")).expect("write config");
    dir
}

#[test]
fn hf_layer_count_must_match_tensors() {
    // archrefs/llama has tensors for layers 0..2.
    for (n, want) in [
        (5, "config declares 5 layers (num_hidden_layers in config.json) but tensors exist for layers 0..2 (3 layers)"),
        (2, "config declares 2 layers (num_hidden_layers in config.json) but tensors exist for layers 0..2 (3 layers)"),
    ] {
        let src = doctored_hf("llama", |v| v["num_hidden_layers"] = serde_json::json!(n));
        let err = extract_fails(src.path());
        assert!(err.contains(want), "num_hidden_layers {n}: {err}");
    }
    // The undoctored copy builds (the check does not refuse a good source).
    let ok = doctored_hf("llama", |_| {});
    let out = tempfile::tempdir().expect("tempdir");
    let index = extract(ok.path(), &out.path().join("m.vindex"), &opts()).expect("good copy");
    assert_eq!(index.shapes.num_layers, 3);
}

#[test]
fn hf_zero_context_and_rotary_are_refused() {
    let src = doctored_hf("llama", |v| {
        v["max_position_embeddings"] = serde_json::json!(0)
    });
    let err = extract_fails(src.path());
    assert!(
        err.contains("'max_position_embeddings': the context length must be at least 1"),
        "{err}"
    );
    let src = doctored_hf("phi3-partial", |v| {
        v["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(0.0)
    });
    let err = extract_fails(src.path());
    assert!(
        err.contains("'partial_rotary_factor': rotary dimension 0"),
        "{err}"
    );
}

/// Copy the GGUF at `from` to `to` with the integer metadata value `key` set to `value` (same
/// value type, so the header keeps its length and the tensor data its offsets).
fn doctored_gguf(from: &Path, to: &Path, key: &str, value: u64) {
    doctored_gguf_with(from, to, key, |old| match old {
        GgufValue::U32(_) => GgufValue::U32(value as u32),
        GgufValue::U64(_) => GgufValue::U64(value),
        GgufValue::I32(_) => GgufValue::I32(value as i32),
        other => panic!("{key}: unexpected value type {other:?}"),
    })
}

/// Copy the GGUF at `from` to `to` with the metadata value `key` replaced by `set(old)` (of the
/// same type, so the header keeps its length and the tensor data its offsets).
fn doctored_gguf_with(
    from: &Path,
    to: &Path,
    key: &str,
    set: impl FnOnce(&GgufValue) -> GgufValue,
) {
    let mut h = GgufHeader::read(from).unwrap_or_else(|e| panic!("{e}"));
    let old_len = encode_header(&h, from).expect("encode").len();
    let slot = h
        .metadata
        .iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{}: no key {key}", from.display()));
    slot.1 = set(&slot.1);
    let header = encode_header(&h, to).expect("encode doctored");
    assert_eq!(header.len(), old_len, "{key}: header length changed");
    let mut src = File::open(from).expect("open gguf");
    src.seek(SeekFrom::Start(old_len as u64)).expect("seek");
    let mut dst = File::create(to).expect("create copy");
    dst.write_all(&header).expect("write header");
    std::io::copy(&mut src, &mut dst).expect("copy data");
}

#[test]
fn gguf_doctored_metadata_is_refused() {
    let orig = model_file("SmolLM2-135M-Instruct.Q4_1.gguf"); // 30 layers
    let dir = tempfile::tempdir().expect("tempdir");
    let copy: PathBuf = dir.path().join("doctored.gguf");
    for (key, value, want) in [
        (
            "llama.block_count",
            40,
            "config declares 40 layers (llama.block_count) but tensors exist for layers 0..29 (30 layers)",
        ),
        (
            "llama.block_count",
            20,
            "config declares 20 layers (llama.block_count) but tensors exist for layers 0..29 (30 layers)",
        ),
        (
            "llama.context_length",
            0,
            "config field 'llama.context_length': the context length must be at least 1 position (got 0)",
        ),
        (
            "llama.rope.dimension_count",
            0,
            "config field 'llama.rope.dimension_count': rotary dimension 0 (head_dim 64",
        ),
        (
            "llama.rope.dimension_count",
            63,
            "config field 'llama.rope.dimension_count': rotary dimension 63 (head_dim 64",
        ),
    ] {
        doctored_gguf(&orig, &copy, key, value);
        let err = extract_fails(&copy);
        assert!(err.contains(want), "{key} = {value}: {err}");
    }
}

/// Issue 15 bug 4: extract reported success (writing ~500 MB) on configs `run` then refused
/// or ran wrongly: NaN or non-positive eps, an FFN width of 0 or 2^50, KV heads that do not
/// divide the heads or disagree with `attn_k`'s shape, a `head_dim` that disagrees with the
/// q/k/v shapes, a `model_type` whose tensors the weights lack. Each is now refused before
/// anything is written, naming the source and the field or tensor.
#[test]
fn extract_refuses_configs_the_loader_cannot_run() {
    let orig = model_file("SmolLM2-135M-Instruct.Q4_1.gguf"); // 9 heads, 3 KV heads, dim 64
    let dir = tempfile::tempdir().expect("tempdir");
    let copy: PathBuf = dir.path().join("doctored.gguf");
    let eps = "llama.attention.layer_norm_rms_epsilon";
    for (value, want) in [
        (
            f32::NAN,
            "the norm epsilon must be a positive number (got NaN)",
        ),
        (0.0, "the norm epsilon must be a positive number (got 0)"),
        (
            -1e-5,
            "the norm epsilon must be a positive number (got -0.00001)",
        ),
    ] {
        doctored_gguf_with(&orig, &copy, eps, |_| GgufValue::F32(value));
        let err = extract_fails(&copy);
        assert!(
            err.contains(&format!("config field '{eps}': {want}")),
            "{value}: {err}"
        );
    }
    for (key, value, want) in [
        (
            "llama.feed_forward_length",
            0,
            "config field 'llama.feed_forward_length': the FFN width must be at least 1 (got 0)",
        ),
        (
            "llama.attention.head_count_kv",
            2,
            "config field 'llama.attention.head_count_kv': 2 KV heads do not divide the 9 attention heads",
        ),
        (
            "llama.attention.head_count_kv",
            9,
            "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [192, 576], but the config (hidden_size 576, 9 heads, 9 KV heads, head_dim 64, intermediate_size 1536) implies [576, 576]",
        ),
        (
            "llama.feed_forward_length",
            1 << 30,
            "implies [1073741824, 576]",
        ),
    ] {
        doctored_gguf(&orig, &copy, key, value);
        let err = extract_fails(&copy);
        assert!(err.contains(want), "{key} = {value}: {err}");
    }

    // archrefs/llama: hidden 64, 4 heads, 2 KV heads, head_dim 16, intermediate 128.
    use serde_json::json;
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        (
            json!(0.0),
            "rms_norm_eps",
            "config field 'rms_norm_eps': the norm epsilon must be a positive number (got 0)",
        ),
        (
            json!(0),
            "intermediate_size",
            "config field 'intermediate_size': the FFN width must be at least 1 (got 0)",
        ),
        (
            json!(1u64 << 50),
            "intermediate_size",
            // Refused by the config's size limits (config/limits.rs) before any shape check.
            "config field 'intermediate_size': 1125899906842624 is absurdly large (at most 2147483648",
        ),
        (
            json!(8),
            "head_dim",
            "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [64, 64], but the config (hidden_size 64, 4 heads, 2 KV heads, head_dim 8, intermediate_size 128) implies [32, 64]",
        ),
        (
            json!("gemma3_text"),
            "model_type",
            "which model_type 'gemma3_text' needs: the config does not match the weights",
        ),
    ];
    for (value, field, want) in cases {
        let src = doctored_hf("llama", |v| v[field] = value.clone());
        let err = extract_fails(src.path());
        assert!(err.contains(want), "{field} = {value}: {err}");
    }
}

/// Issue 15: `extract some.vindex` said "config.json: No such file"; it now says the source
/// is a vindex and what extract reads.
#[test]
fn extract_of_a_vindex_says_it_is_one() {
    let src = doctored_hf("llama", |_| {});
    let out = tempfile::tempdir().expect("tempdir");
    let first = out.path().join("first.vindex");
    extract(src.path(), &first, &opts()).expect("good copy");
    let err = extract_fails(&first);
    assert!(
        err.contains("is a vindex (it holds index.json), not a checkpoint"),
        "{err}"
    );
}

/// Issue 15: NaN/Inf weights were stored silently (run then said only "non-finite logits");
/// extract now refuses them, naming the tensor.
#[test]
fn extract_names_a_tensor_with_non_finite_weights() {
    let src = doctored_hf("llama", |_| {});
    let st_path = src.path().join("model.safetensors");
    let bytes = std::fs::read(&st_path).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let name = "model.layers.1.mlp.up_proj.weight";
    let header_len = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let t = st.tensor(name).expect("tensor");
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let offset = t.data().as_ptr() as usize - bytes.as_ptr() as usize;
    assert!(offset >= header_len);
    let mut patched = bytes.clone();
    patched[offset + 40..offset + 44].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&st_path, patched).expect("write");
    // With a float tier the tensor is read whole in f32; without one (the CLI default) it is
    // decoded and quantized in row chunks: both name it and the first bad value.
    let quantized_only = BuildOptions {
        float_tier: false,
        quant: QuantTiers::Q4K,
        ..opts()
    };
    for o in [opts(), quantized_only] {
        let err = extract_fails_with(src.path(), &o);
        assert!(
            err.contains(&format!("tensor '{name}' holds 1 non-finite values"))
                && err.contains("index 10"),
            "float tier {}: {err}",
            o.float_tier
        );
    }
}
