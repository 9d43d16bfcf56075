//! Extract loads and checks the tokenizer and chat template before writing anything (issue 15
//! bug 5, issue 20): junk `--tokenizer` files, another model's tokenizer, special-token ids out
//! of range, malformed GGUF tokenizer metadata and unparsable templates are refused with an error
//! naming the file or key, and the target is never created.

mod common;

use std::path::Path;

use common::{mock_source, model_file, shared_dir, MockDims};
use infer_models::gguf::{encode_header, GgufArray, GgufFile, GgufHeader, GgufValue};
use infer_models::ModelSource;
use infer_vindex::{build, BuildOptions, VindexError};

const DIMS: MockDims = MockDims {
    vocab: 96,
    hidden: 16,
    inter: 32,
    layers: 1,
    tied: true,
};

/// Build into `root/out.vindex`; the error, after checking nothing was written.
fn refused(src: &ModelSource, opts: &BuildOptions, root: &Path) -> VindexError {
    let target = root.join("out.vindex");
    let e = build(src, &target, opts).expect_err("the build must fail");
    assert!(!target.exists(), "{} was written", target.display());
    let left: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("out"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    e
}

#[test]
fn bug5_junk_tokenizer_json_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let junk = root.path().join("bad.json");
    std::fs::write(&junk, r#"{"x":1}"#).unwrap();
    let opts = BuildOptions {
        tokenizer: Some(junk.clone()),
        ..Default::default()
    };
    let e = refused(&mock_source(&DIMS), &opts, root.path());
    assert!(matches!(e, VindexError::BadTokenizer { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&junk.display().to_string())
            && msg.contains("not a usable tokenizer: JSON without the `model` object"),
        "{msg}"
    );
}

#[test]
fn bug5_tokenizer_of_another_model_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let zst = shared_dir().join("models/gemma3-270m/tokenizer.json.zst");
    let gemma = zstd::decode_all(&std::fs::read(&zst).unwrap()[..]).unwrap();
    let tok = root.path().join("gemma-tokenizer.json");
    std::fs::write(&tok, gemma).unwrap();
    let src = infer_models::open_source(&model_file("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let opts = BuildOptions {
        tokenizer: Some(tok),
        ..Default::default()
    };
    let e = refused(&src, &opts, root.path());
    let msg = e.to_string();
    assert!(
        msg.contains("ids up to 262143 but the model's embedding has 49152 rows"),
        "{msg}"
    );
}

#[test]
fn bug5_special_token_ids_out_of_range_are_refused() {
    let root = tempfile::tempdir().unwrap();
    for (bos, eos, name) in [
        (Some(96), vec![2], "bos_token_id 96"),
        (Some(1), vec![2, 500], "eos_token_id 500"),
    ] {
        let mut src = mock_source(&DIMS);
        src.config.bos_token_id = bos;
        src.config.eos_token_ids = eos;
        let e = refused(&src, &BuildOptions::default(), root.path());
        assert!(matches!(e, VindexError::BadTokenizer { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("{name} is outside the embedding's 96 rows")),
            "{e}"
        );
    }
}

#[test]
fn unparsable_chat_template_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut src = mock_source(&DIMS);
    src.chat_template = Some("{% for m in messages %}{{ m.content }".into());
    let e = refused(&src, &BuildOptions::default(), root.path());
    assert!(
        e.to_string().contains("the chat template does not parse"),
        "{e}"
    );
}

fn strs(v: &[&str]) -> GgufValue {
    GgufValue::Array(GgufArray::String(v.iter().map(|s| s.to_string()).collect()))
}

/// A vocabulary-only GGUF: a 5-token byte-level BPE vocabulary, edited by `edit`.
fn vocab_gguf(dir: &Path, edit: impl FnOnce(&mut Vec<(String, GgufValue)>)) -> GgufFile {
    let mut md: Vec<(String, GgufValue)> = vec![
        (
            "general.architecture".into(),
            GgufValue::String("llama".into()),
        ),
        (
            "tokenizer.ggml.model".into(),
            GgufValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".into(),
            GgufValue::String("gpt-2".into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            strs(&["a", "b", "ab", "<s>", "</s>"]),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            GgufValue::Array(GgufArray::I32(vec![1, 1, 1, 3, 3])),
        ),
        ("tokenizer.ggml.merges".into(), strs(&["a b"])),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(3)),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(4)),
    ];
    edit(&mut md);
    let h = GgufHeader {
        version: 3,
        metadata: md,
        tensors: vec![],
        alignment: 32,
    };
    let path = dir.join("vocab.gguf");
    let bytes = encode_header(&h, &path).unwrap();
    std::fs::write(&path, bytes).unwrap();
    GgufFile::open(&path).unwrap()
}

fn set(md: &mut [(String, GgufValue)], key: &str, v: GgufValue) {
    md.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

/// Malformed `tokenizer.ggml.*` metadata: each refused naming the key, nothing written.
#[test]
fn bad_gguf_tokenizer_metadata_is_refused_naming_the_key() {
    type Edit = Box<dyn FnOnce(&mut Vec<(String, GgufValue)>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("good vocabulary", Box::new(|_| {}), ""),
        (
            "missing tokens",
            Box::new(|md| md.retain(|(k, _)| k != "tokenizer.ggml.tokens")),
            "'tokenizer.ggml.tokens' is missing",
        ),
        (
            "missing merges",
            Box::new(|md| md.retain(|(k, _)| k != "tokenizer.ggml.merges")),
            "'tokenizer.ggml.merges' is missing",
        ),
        (
            "token types of another length",
            Box::new(|md| {
                set(
                    md,
                    "tokenizer.ggml.token_type",
                    GgufValue::Array(GgufArray::I32(vec![1; 4])),
                )
            }),
            "'tokenizer.ggml.token_type': 4 entries but 5 tokens",
        ),
        (
            "duplicate token",
            Box::new(|md| {
                set(
                    md,
                    "tokenizer.ggml.tokens",
                    strs(&["a", "b", "ab", "a", "</s>"]),
                )
            }),
            "'tokenizer.ggml.tokens': token \"a\" appears twice (ids 0 and 3)",
        ),
        (
            "merge naming an unknown token",
            Box::new(|md| set(md, "tokenizer.ggml.merges", strs(&["a b", "a c"]))),
            "'tokenizer.ggml.merges': merge 1 \"a c\" names \"c\", which is not a token",
        ),
        (
            "BOS id out of range",
            Box::new(|md| set(md, "tokenizer.ggml.bos_token_id", GgufValue::U32(5))),
            "'tokenizer.ggml.bos_token_id': id 5 is outside the vocabulary (5 tokens)",
        ),
        (
            "SentencePiece scores of another length",
            Box::new(|md| {
                set(
                    md,
                    "tokenizer.ggml.model",
                    GgufValue::String("llama".into()),
                );
                md.push((
                    "tokenizer.ggml.scores".into(),
                    GgufValue::Array(GgufArray::F32(vec![0.0; 3])),
                ));
            }),
            "'tokenizer.ggml.scores': 3 entries but 5 tokens",
        ),
    ];
    for (what, edit, want) in cases {
        let root = tempfile::tempdir().unwrap();
        let g = vocab_gguf(root.path(), edit);
        let mut src = mock_source(&DIMS);
        src.tokenizer_json = None;
        src.gguf = Some(std::sync::Arc::new(g));
        if want.is_empty() {
            let text = infer_vindex::resolve_tokenizer(&src, &BuildOptions::default()).unwrap();
            assert!(text.unwrap().contains("\"ab\""), "{what}");
            continue;
        }
        let e = refused(&src, &BuildOptions::default(), root.path());
        assert!(e.to_string().contains(want), "{what}: {e}");
    }
}
