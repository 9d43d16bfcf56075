//! llama.cpp's own tokenizer test vectors (`tests/test-tokenizer-0.cpp`): each vocabulary-only
//! GGUF `ggml-vocab-NAME.gguf` with its `.gguf.inp` texts and `.gguf.out` ids, tokenized with no
//! BOS/EOS and no special-token parsing, as that test does. The files come from the
//! llama-cpp-python sdist pinned in `scripts/lib/llamacpp.sh`, fetched by
//! `scripts/fetch-vocabs.sh` (run by `scripts/test.sh`) into `$INFER_VOCABS` (default
//! `~/.cache/infer/vocabs`). Missing files fail the test.

use std::path::PathBuf;

use infer_models::gguf::{tokenizer_json_from_gguf, GgufFile};
use infer_models::tokenizer::Tokenizer;
use infer_models::ModelError;

fn vocabs_dir() -> PathBuf {
    match std::env::var_os("INFER_VOCABS") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").expect("HOME or INFER_VOCABS must be set");
            PathBuf::from(home).join(".cache/infer/vocabs")
        }
    }
}

fn gguf(name: &str) -> GgufFile {
    let path = vocabs_dir().join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-vocabs.sh (scripts/test.sh does)",
        path.display()
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The (text, ids) pairs of `ggml-vocab-NAME.gguf.inp` / `.out`.
fn vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocabs_dir().join(format!("ggml-vocab-{name}.gguf"));
    let read = |ext: &str| {
        let p = base.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let inp = read("inp");
    let out = read("out");
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                texts.push(rest[..i].to_string());
                rest = &rest[i + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree");
    assert!(texts.len() > 10, "{name}: only {} vectors", texts.len());
    texts.into_iter().zip(ids).collect()
}

/// Every vector of `name` tokenizes to llama.cpp's ids.
fn check(name: &str) {
    let g = gguf(name);
    let json = tokenizer_json_from_gguf(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
    let tok = Tokenizer::from_json(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut failures = Vec::new();
    let cases = vectors(name);
    for (text, want) in &cases {
        let got = tok.encode_with(text, false, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n    got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} vectors differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $( #[test] fn $test() { check($name); } )*
    };
}

vocab_tests! {
    llama_spm => "llama-spm",
    llama_bpe => "llama-bpe",
    gpt_2 => "gpt-2",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    phi_3 => "phi-3",
    starcoder => "starcoder",
    falcon => "falcon",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    command_r => "command-r",
    mpt => "mpt",
    refact => "refact",
    gemma_4 => "gemma-4",
}

/// Vocabularies with no vectors in the sdist still convert and round-trip plain text.
#[test]
fn vocabularies_without_vectors_load() {
    for name in ["gpt-neox", "aquila", "baichuan"] {
        let g = gguf(name);
        let json = tokenizer_json_from_gguf(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tok = Tokenizer::from_json(&json).unwrap();
        let text = "Hello world, 123!";
        let ids = tok.encode_with(text, false, false).unwrap();
        assert!(ids.len() >= 4, "{name}: {ids:?}");
        assert_eq!(tok.decode(&ids, true).unwrap(), text, "{name}");
    }
}

/// Types infer does not run are refused by name, not mis-tokenized.
#[test]
fn unsupported_vocabulary_types_are_refused_by_name() {
    for (name, model) in [
        ("bert-bge", "'bert' (WordPiece)"),
        ("nomic-bert-moe", "'t5' (Unigram)"),
    ] {
        let err = tokenizer_json_from_gguf(&gguf(name)).unwrap_err();
        assert!(
            matches!(err, ModelError::Unsupported { .. }),
            "{name}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("tokenizer.ggml.model {model} is not supported")),
            "{name}: {msg}"
        );
    }
}
