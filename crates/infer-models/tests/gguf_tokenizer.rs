//! The tokenizers built from the two real GGUFs' metadata alone give the same ids as the models'
//! Hugging Face tokenizer.json files (shared/models) — on the perplexity text, on the reference
//! prompts, and on a multilingual / emoji / code / whitespace-heavy text (tests/data) — and
//! Gemma's follows llama.cpp where that tokenizer.json does not (runs of ≥ 32 spaces).

mod gguf_common;

use gguf_common::{model_path, shared_dir, GEMMA3, SMOLLM2};
use infer_models::gguf::{tokenizer_json_from_gguf, GgufFile};
use infer_models::tokenizer::Tokenizer;

/// The tokenizer built from a GGUF's metadata.
fn built(file: &str) -> Tokenizer {
    let g = GgufFile::open(&model_path(file)).unwrap();
    let json = tokenizer_json_from_gguf(&g).unwrap_or_else(|e| panic!("{file}: {e}"));
    Tokenizer::from_json(&json).unwrap()
}

/// The model's HF tokenizer.json (Gemma's is zstd-compressed in shared/models).
fn oracle(model: &str) -> Tokenizer {
    let dir = shared_dir().join("models").join(model);
    let plain = dir.join("tokenizer.json");
    let json = if plain.is_file() {
        std::fs::read_to_string(&plain).unwrap()
    } else {
        let z = dir.join("tokenizer.json.zst");
        let bytes = std::fs::read(&z).unwrap_or_else(|e| panic!("{}: {e}", z.display()));
        String::from_utf8(zstd::decode_all(&bytes[..]).unwrap()).unwrap()
    };
    Tokenizer::from_json(&json).unwrap()
}

fn ids(t: &Tokenizer, s: &str) -> Vec<u32> {
    t.encode_with(s, true, true).unwrap()
}

/// A JSON array of ids.
fn u32s(v: &serde_json::Value) -> Vec<u32> {
    let ids = v.as_array().expect("an array of ids");
    ids.iter().map(|i| i.as_u64().unwrap() as u32).collect()
}

fn perplexity_text() -> String {
    std::fs::read_to_string(shared_dir().join("reference/perplexity.txt")).unwrap()
}

fn mixed_text() -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer_mixed.txt"),
    )
    .unwrap()
}

/// Short cases, each line of the mixed text, and the two whole texts: equal ids.
fn assert_same_ids(file: &str, model: &str) {
    let (ours, want) = (built(file), oracle(model));
    let mixed = mixed_text();
    let mut cases: Vec<String> = [
        "Hello, world! This is a test.",
        "12345",
        "<|im_start|>user\nHi<|im_end|>",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "  leading and trailing spaces   ",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cases.extend(mixed.lines().map(str::to_string));
    cases.push(mixed);
    cases.push(perplexity_text());
    for s in &cases {
        assert_eq!(ids(&ours, s), ids(&want, s), "{model}: {s:?}");
    }
    // Special-token markup as plain text: both agree too.
    let s = "<|im_start|>user<start_of_turn><bos>";
    assert_eq!(
        ours.encode_with(s, false, false).unwrap(),
        want.encode_with(s, false, false).unwrap()
    );
}

#[test]
fn smollm2_metadata_tokenizer_equals_tokenizer_json() {
    assert_same_ids(SMOLLM2, "smollm2-135m-instruct");
    let t = built(SMOLLM2);
    // Digits split one per token; special tokens are single ids, no BOS added.
    assert_eq!(ids(&t, "12345").len(), 5);
    let chat = ids(&t, "<|im_start|>user\nHi<|im_end|>");
    assert_eq!((chat[0], *chat.last().unwrap()), (1, 2));
    assert_eq!(t.id_bound(), 49152);
}

#[test]
fn gemma3_metadata_tokenizer_equals_tokenizer_json() {
    assert_same_ids(GEMMA3, "gemma3-270m");
    let t = built(GEMMA3);
    assert_eq!(ids(&t, "Hi")[0], 2, "<bos> is added");
    assert_eq!(t.id_bound(), 262144);
    let chat = ids(&t, "<start_of_turn>user\nHi<end_of_turn>");
    assert_eq!(chat[1], t.token_to_id("<start_of_turn>").unwrap());
    // With special parsing off, the markup is text.
    let plain = t.encode_with("<start_of_turn>", false, false).unwrap();
    assert!(plain.len() > 1, "{plain:?}");
}

/// Both decoders give the text back (SmolLM2 byte-level, Gemma byte fallback).
#[test]
fn decode_round_trips_the_mixed_text() {
    let mixed = mixed_text();
    for file in [SMOLLM2, GEMMA3] {
        let t = built(file);
        let ids = t.encode_with(&mixed, false, false).unwrap();
        assert_eq!(t.decode(&ids, true).unwrap(), mixed, "{file}");
    }
}

/// shared/reference/tokenizer_whitespace_vectors.json: llama.cpp's ids for runs of spaces.
#[test]
fn gemma3_follows_llama_cpp_on_long_space_runs() {
    let p = shared_dir().join("reference/tokenizer_whitespace_vectors.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    for (file, model) in [(GEMMA3, "gemma3-270m"), (SMOLLM2, "smollm2-135m-instruct")] {
        let t = built(file);
        let cases = doc[model].as_array().unwrap();
        assert!(cases.len() >= 4);
        for c in cases {
            let text = c["text"].as_str().unwrap();
            let want = u32s(&c["llama_cpp_ids"]);
            assert_eq!(ids(&t, text), want, "{model}: {text:?}");
        }
    }
}

#[test]
fn reference_prompt_ids_are_reproduced() {
    for (file, model) in [(SMOLLM2, "smollm2-135m-instruct"), (GEMMA3, "gemma3-270m")] {
        let p = shared_dir().join(format!("reference/{model}/index.json"));
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let ours = built(file);
        let prompts = index["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 5);
        for pr in prompts {
            let want = u32s(&pr["input_ids"]);
            assert_eq!(
                ids(&ours, pr["text"].as_str().unwrap()),
                want,
                "{model} {}",
                pr["name"]
            );
        }
    }
}

/// Encode speed on the perplexity text (reported, not asserted):
/// `cargo test --release -p infer-models --test gguf_tokenizer -- --ignored --nocapture encode_speed`
#[test]
#[ignore]
fn encode_speed() {
    let text = perplexity_text();
    for (file, model) in [(SMOLLM2, "smollm2-135m-instruct"), (GEMMA3, "gemma3-270m")] {
        for (what, t) in [
            ("GGUF metadata", built(file)),
            ("tokenizer.json", oracle(model)),
        ] {
            let n = ids(&t, &text).len();
            let reps = 20;
            let start = std::time::Instant::now();
            for _ in 0..reps {
                std::hint::black_box(ids(&t, &text));
            }
            let s = start.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{model} ({what}): {n} tokens in {:.2} ms = {:.0} tokens/s",
                s * 1e3,
                n as f64 / s
            );
        }
    }
}
