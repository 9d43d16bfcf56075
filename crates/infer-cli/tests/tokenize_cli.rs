//! `infer tokenize` / `detokenize` on the real GGUFs, and a Gemma-3 GGUF that runs by itself:
//! the vindex extracted without `--tokenizer` (SentencePiece vocabulary from its metadata) scores
//! the same perplexity and generates the same text as one extracted with the model's
//! tokenizer.json.

mod common;
use common::{infer, model_file, shared_dir, text};

const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";
const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The reference prompts' ids (shared/reference/MODEL/index.json): (text, ids).
fn reference_prompts(model: &str) -> Vec<(String, Vec<u32>)> {
    let p = shared_dir().join(format!("reference/{model}/index.json"));
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    index["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pr| {
            let ids = pr["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            (pr["text"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

fn ok(args: &[&str]) -> String {
    let o = infer(args);
    assert!(o.status.success(), "infer {args:?}: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn tokenize_prints_the_reference_ids_and_detokenize_inverts_it() {
    for (file, model) in [(GEMMA, "gemma3-270m"), (SMOLLM, "smollm2-135m-instruct")] {
        let gguf = model_file(file);
        let g = gguf.to_str().unwrap();
        for (prompt, ids) in reference_prompts(model).into_iter().take(3) {
            let out = ok(&["tokenize", g, &prompt, "--ids"]);
            assert_eq!(out.trim(), format!("{ids:?}"), "{model}: {prompt:?}");
            // Special tokens are kept (Gemma's added <bos> too) unless --skip-special.
            let back = ok(&["detokenize", g, "--ids", out.trim()]);
            let bos = if file == GEMMA { "<bos>" } else { "" };
            assert_eq!(back.strip_suffix('\n').unwrap(), format!("{bos}{prompt}"));
            let skipped = ok(&["detokenize", g, "--ids", out.trim(), "--skip-special"]);
            assert!(!skipped.contains("<bos>") && !skipped.contains("<|im_start|>"));
        }
    }
}

#[test]
fn tokenize_formats_and_special_token_parsing() {
    let gguf = model_file(SMOLLM);
    let g = gguf.to_str().unwrap();
    // <|im_start|> is id 1 when parsed, several tokens as text.
    assert_eq!(
        ok(&["tokenize", g, "<|im_start|>user", "--ids"]).trim(),
        "[1, 4093]"
    );
    let plain = ok(&["tokenize", g, "<|im_start|>user", "--ids", "--no-special"]);
    assert!(
        !plain.contains("[1,") && plain.matches(',').count() >= 3,
        "{plain}"
    );
    // Default: one `id -> 'piece'` line per token; --json: ids, tokens, pieces.
    assert_eq!(
        ok(&["tokenize", g, "Hi there"]),
        " 26843 -> 'Hi'\n   665 -> ' there'\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["tokenize", g, "Hi there", "--json"])).unwrap();
    assert_eq!(json["ids"], serde_json::json!([26843, 665]));
    assert_eq!(json["tokens"], serde_json::json!(["Hi", "Ġthere"]));
    assert_eq!(json["pieces"], serde_json::json!(["Hi", " there"]));
    // Gemma adds <bos> unless --no-bos.
    let gemma = model_file(GEMMA);
    let gm = gemma.to_str().unwrap();
    assert!(ok(&["tokenize", gm, "Hi", "--ids"]).starts_with("[2, "));
    assert!(!ok(&["tokenize", gm, "Hi", "--ids", "--no-bos"]).starts_with("[2, "));
}

#[test]
fn tokenize_errors_are_clear() {
    let gguf = model_file(SMOLLM);
    let g = gguf.to_str().unwrap();
    for (args, want) in [
        (
            vec!["detokenize", g, "--ids", "1,x"],
            "--ids: 'x' is not a token id",
        ),
        (
            vec!["detokenize", g, "--ids", "99999999"],
            "token id 99999999 is outside the vocabulary",
        ),
        (
            vec!["tokenize", "/nonexistent.gguf", "hi"],
            "/nonexistent.gguf",
        ),
    ] {
        let o = infer(&args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
}

/// Gemma's tokenizer.json from shared/models (zstd there), written into `dir`.
fn gemma_tokenizer_json(dir: &std::path::Path) -> std::path::PathBuf {
    let zst = shared_dir().join("models/gemma3-270m/tokenizer.json.zst");
    let bytes = zstd::decode_all(&std::fs::read(&zst).unwrap()[..]).unwrap();
    let p = dir.join("gemma-tokenizer.json");
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn gemma3_gguf_runs_without_a_tokenizer_json() {
    let root = tempfile::tempdir().unwrap();
    let gguf = model_file(GEMMA);
    let tok = gemma_tokenizer_json(root.path());
    let bare = root.path().join("bare.vindex");
    let with = root.path().join("with.vindex");
    let g = gguf.to_str().unwrap();
    ok(&[
        "extract",
        g,
        "-o",
        bare.to_str().unwrap(),
        "--quant",
        "none",
    ]);
    ok(&[
        "extract",
        g,
        "-o",
        with.to_str().unwrap(),
        "--quant",
        "none",
        "--tokenizer",
        tok.to_str().unwrap(),
    ]);
    // A shortened perplexity text (3 windows of 128 tokens).
    let full = std::fs::read_to_string(shared_dir().join("reference/perplexity.txt")).unwrap();
    let cut: String = full.chars().take(2400).collect();
    let txt = root.path().join("ppl.txt");
    std::fs::write(&txt, cut).unwrap();
    let ppl = |v: &std::path::Path| {
        ok(&[
            "perplexity",
            v.to_str().unwrap(),
            txt.to_str().unwrap(),
            "-c",
            "128",
        ])
    };
    let (a, b) = (ppl(&bare), ppl(&with));
    assert!(a.starts_with("PPL = "), "{a}");
    assert_eq!(a, b, "perplexity without and with --tokenizer");
    let run = |v: &std::path::Path| {
        ok(&[
            "run",
            v.to_str().unwrap(),
            "The capital of France is",
            "-n",
            "6",
        ])
    };
    let (a, b) = (run(&bare), run(&with));
    assert!(a.len() > 4, "{a}");
    assert_eq!(a, b, "greedy text without and with --tokenizer");
}
