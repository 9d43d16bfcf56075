//! The GGUF metadata `infer export` writes, read back by infer's own GGUF readers: the real
//! models' GGUF vocabularies (SentencePiece and byte-level BPE) give the same tokenizer.json
//! again, the Hugging Face SmolLM2 tokenizer.json (pre-tokenizer `smollm`) encodes every test
//! text to the same ids, and `model_metadata` gives the config back.

mod gguf_common;

use std::path::Path;

use gguf_common::{model_path, shared_config, shared_dir, GEMMA3, SMOLLM2};
use infer_models::gguf::{
    config_from_gguf, model_metadata, tokenizer_json_from_gguf, tokenizer_metadata, GgufFile,
    GgufHeader, GgufTensorInfo, GgufValue, GgufWriter,
};
use infer_models::tokenizer::Tokenizer;
use infer_models::ModelConfig;
use infer_quant::QuantFormat;

/// A GGUF with `metadata` and one F32 `token_embd.weight` of `[hidden, vocab]`, at `path`.
fn write_gguf(path: &Path, metadata: Vec<(String, GgufValue)>, hidden: usize, vocab: usize) {
    let n = hidden * vocab;
    let t = GgufTensorInfo {
        name: "token_embd.weight".into(),
        dims: vec![hidden, vocab],
        format: QuantFormat::F32,
        offset: 0,
        n_bytes: n * 4,
    };
    let h = GgufHeader {
        version: 3,
        metadata,
        tensors: vec![t],
        alignment: 32,
    };
    let f = std::fs::File::create(path).unwrap();
    let mut w = GgufWriter::new(f, &h, path).unwrap();
    w.write_data(&vec![0u8; n * 4]).unwrap();
    w.finish().unwrap();
}

/// Config and tokenizer.json of a real GGUF → export metadata → GGUF → the same config (the
/// fields GGUF holds) and byte-identical tokenizer.json.
#[test]
fn real_gguf_vocabularies_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for model in [SMOLLM2, GEMMA3] {
        let g = GgufFile::open(&model_path(model)).unwrap();
        let cfg = config_from_gguf(&g).unwrap();
        let tok = tokenizer_json_from_gguf(&g).unwrap();
        let template = g.get_str("tokenizer.chat_template");
        let mut md = model_metadata(&cfg, model).unwrap();
        md.extend(tokenizer_metadata(&tok, &cfg, template).unwrap());
        // A small embedding table: the config's vocab size comes from it, so use the real one.
        let p = dir.path().join(format!("{model}.gguf"));
        write_gguf(&p, md, 1, cfg.vocab_size);
        let back = GgufFile::open(&p).unwrap();
        assert_eq!(tokenizer_json_from_gguf(&back).unwrap(), tok, "{model}");
        assert_eq!(back.get_str("tokenizer.chat_template"), template, "{model}");
        let mut want = cfg.clone();
        let got = config_from_gguf(&back).unwrap();
        // The one-column table stands for the real weights: only the sizes it implies differ.
        want.tie_word_embeddings = got.tie_word_embeddings;
        assert_eq!(got, want, "{model}");
    }
}

/// The Hugging Face SmolLM2 tokenizer.json (not built from a GGUF) through GGUF metadata:
/// pre-tokenizer `smollm`, and the same ids for every test text, with and without specials.
#[test]
fn hf_byte_level_bpe_encodes_the_same() {
    let folder = shared_dir().join("models/smollm2-135m-instruct");
    let json = std::fs::read_to_string(folder.join("tokenizer.json")).unwrap();
    let cfg = ModelConfig::from_hf_json(
        &folder.join("config.json"),
        &shared_config("smollm2-135m-instruct"),
    )
    .unwrap();
    let md = tokenizer_metadata(&json, &cfg, None).unwrap();
    let pre = md
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.pre")
        .map(|(_, v)| v.clone());
    assert_eq!(pre, Some(GgufValue::String("smollm".into())));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v.gguf");
    let mut all = model_metadata(&cfg, "smollm2").unwrap();
    all.extend(md);
    write_gguf(&p, all, 1, cfg.vocab_size);
    let back = tokenizer_json_from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    let (a, b) = (
        Tokenizer::from_json(&json).unwrap(),
        Tokenizer::from_json(&back).unwrap(),
    );
    let texts = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer_mixed.txt"),
    )
    .unwrap();
    let mut n = 0;
    for line in texts
        .lines()
        .chain(["<|im_start|>user\nHi 123 4567<|im_end|>"])
    {
        for (special, parse) in [(true, true), (false, false)] {
            assert_eq!(
                a.encode_with(line, special, parse).unwrap(),
                b.encode_with(line, special, parse).unwrap(),
                "{line:?}"
            );
            n += 1;
        }
    }
    assert!(n >= 4);
}

/// What GGUF cannot hold as the vindex runs it is refused with the reason.
#[test]
fn refusals_name_the_reason() {
    let root = shared_dir().join("archrefs");
    let cfg = |d: &str| ModelConfig::from_hf_file(&root.join(d).join("config.json")).unwrap();
    let err = |d: &str| model_metadata(&cfg(d), d).unwrap_err();
    assert!(
        err("llama3-rope").contains("rope_freqs"),
        "{}",
        err("llama3-rope")
    );
    assert!(
        err("mistral-swa").contains("sliding-window"),
        "{}",
        err("mistral-swa")
    );
    assert!(err("gpt2").contains("--safetensors"), "{}", err("gpt2"));
    assert!(
        err("qwen2-moe").contains("no GGUF export"),
        "{}",
        err("qwen2-moe")
    );
    let mut g3 = cfg("gemma3");
    g3.query_pre_attn_scalar = Some(17.0);
    assert!(model_metadata(&g3, "g")
        .unwrap_err()
        .contains("query_pre_attn_scalar"));
    // Gemma-3's HF tokenizer.json is a SentencePiece-style BPE: no GGUF form without scores.
    let zst = shared_dir().join("models/gemma3-270m/tokenizer.json.zst");
    let json =
        String::from_utf8(zstd::decode_all(std::fs::File::open(zst).unwrap()).unwrap()).unwrap();
    let e = tokenizer_metadata(&json, &cfg("gemma3"), None).unwrap_err();
    assert!(e.contains("byte_fallback"), "{e}");
}
