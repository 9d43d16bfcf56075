//! The tokenizer.json built from SmolLM2's GGUF metadata tokenizes like the shared
//! tokenizer.json (itself checked against llama.cpp) and reproduces the reference prompts' ids.

mod gguf_common;

use gguf_common::{model_path, shared_dir, GEMMA3, SMOLLM2};
use infer_models::gguf::{tokenizer_json_from_gguf, GgufFile};
use infer_models::ModelError;
use tokenizers::Tokenizer;

fn built() -> Tokenizer {
    let g = GgufFile::open(&model_path(SMOLLM2)).unwrap();
    let json = tokenizer_json_from_gguf(&g).unwrap();
    json.parse::<Tokenizer>().unwrap()
}

fn oracle() -> Tokenizer {
    let p = shared_dir().join("models/smollm2-135m-instruct/tokenizer.json");
    Tokenizer::from_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn ids(t: &Tokenizer, s: &str) -> Vec<u32> {
    t.encode(s, true).unwrap().get_ids().to_vec()
}

#[test]
fn smollm2_matches_shared_tokenizer_json() {
    let (ours, want) = (built(), oracle());
    let cases = [
        "Hello, world! This is a test.",
        "12345",
        "The year 2024 had 366 days; π≈3.14159.",
        "Grüße aus Köln — naïve café, 東京, Привет мир 🙂🚀",
        "<|im_start|>user\nHi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
        "def f(x):\n    return x**2  # square\n\n\n\ttab",
        "  leading and trailing spaces   ",
        "<|endoftext|><repo_name>x<file_sep>",
        "",
    ];
    for s in cases {
        let got = ids(&ours, s);
        assert_eq!(got, ids(&want, s), "{s:?}");
        let back = ours.decode(&got, false).unwrap();
        assert_eq!(back, s, "decode of {s:?}");
    }
    // Digits split one per token; special tokens are single ids, no BOS added.
    assert_eq!(ids(&ours, "12345").len(), 5);
    assert_eq!(ids(&ours, "<|im_start|>user\nHi<|im_end|>")[0], 1);
    assert_eq!(
        *ids(&ours, "<|im_start|>user\nHi<|im_end|>").last().unwrap(),
        2
    );
    assert_eq!(ours.get_vocab_size(true), 49152);
}

#[test]
fn smollm2_reproduces_reference_prompt_ids() {
    let p = shared_dir().join("reference/smollm2-135m-instruct/index.json");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let ours = built();
    let prompts = index["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 5);
    for pr in prompts {
        let want: Vec<u32> = pr["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            ids(&ours, pr["text"].as_str().unwrap()),
            want,
            "{}",
            pr["name"]
        );
    }
}

#[test]
fn sentencepiece_gguf_needs_a_tokenizer_json() {
    let g = GgufFile::open(&model_path(GEMMA3)).unwrap();
    match tokenizer_json_from_gguf(&g) {
        Err(ModelError::Unsupported { msg, .. }) => {
            assert!(
                msg.contains("'llama'") && msg.contains("--tokenizer PATH"),
                "{msg}"
            )
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("SentencePiece GGUF converted"),
    }
}
