//! Round trip of the two real GGUF models (SmolLM2-135M Q4_1/Q8_0, Gemma-3-270M Q4_K/Q5_0/Q6_K/
//! Q8_0): every tensor read back through the vindex API equals the source's dequantized f32
//! bit for bit (f32 tier) or its f16 rounding (f16 tier). Also the tokenizer paths and the
//! Gemma-3 open-time measurement.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{assert_roundtrip, model_file, shared_dir};
use infer_vindex::{build, files, BuildOptions, Dtype, Vindex};

const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

/// Gemma's tokenizer.json from shared/models (zstd-compressed there), written to `dir`.
fn gemma_tokenizer(dir: &Path) -> PathBuf {
    let zst = shared_dir().join("models/gemma3-270m/tokenizer.json.zst");
    let bytes = std::fs::read(&zst).unwrap_or_else(|e| panic!("{}: {e}", zst.display()));
    let text = zstd::decode_all(&bytes[..]).expect("zstd");
    let p = dir.join("gemma-tokenizer.json");
    std::fs::write(&p, text).unwrap();
    p
}

fn roundtrip(model: &str, dtype: Dtype, tokenizer: Option<PathBuf>, root: &Path) -> PathBuf {
    let src =
        infer_models::open_source(&model_file(model)).unwrap_or_else(|e| panic!("{model}: {e}"));
    let target = root.join(format!("{model}-{dtype}.vindex"));
    let opts = BuildOptions {
        dtype,
        tokenizer,
        ..Default::default()
    };
    let t = Instant::now();
    build(&src, &target, &opts).unwrap_or_else(|e| panic!("{model}: build: {e}"));
    let built = t.elapsed();
    let v = Vindex::open(&target).unwrap();
    let n = assert_roundtrip(&src, &v);
    assert_eq!(v.config(), &src.config);
    assert_eq!(v.chat_template(), src.chat_template.as_deref());
    let stored_tok: serde_json::Value =
        serde_json::from_str(&v.tokenizer_json().unwrap()).expect("tokenizer.json is JSON");
    assert!(stored_tok.get("model").is_some() || stored_tok.get("infer_spm").is_some());
    assert_eq!(v.index().provenance.source_kind, "gguf");
    assert_eq!(v.index().provenance.source_sha256.len(), 1);
    eprintln!(
        "{model} {dtype}: {n} tensors round-trip; built in {:.2} s",
        built.as_secs_f64()
    );
    target
}

#[test]
fn smollm2_roundtrip_f32_and_f16() {
    let root = tempfile::tempdir().unwrap();
    // Tokenizer built from GGUF metadata (byte-level BPE).
    let t = roundtrip(SMOLLM, Dtype::F32, None, root.path());
    let v = Vindex::open(&t).unwrap();
    assert!(v.lm_head().is_none(), "SmolLM2 ties embeddings");
    assert_eq!(v.num_layers(), 30);
    assert_eq!(v.gate_vectors(29).unwrap().len(), 1536 * 576);
    let sha = &v.index().provenance.source_sha256[0].sha256;
    assert_eq!(
        sha,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    roundtrip(SMOLLM, Dtype::F16, None, root.path());
}

#[test]
fn gemma3_roundtrip_f32_and_f16() {
    let root = tempfile::tempdir().unwrap();
    let tok = gemma_tokenizer(root.path());
    let t = roundtrip(GEMMA, Dtype::F32, Some(tok.clone()), root.path());
    let v = Vindex::open(&t).unwrap();
    assert_eq!(v.num_layers(), 18);
    assert_eq!(v.embeddings().1, [262144, 640]);
    assert!(v.tensor("model.layers.5.self_attn.q_norm.weight").is_ok());
    assert!(v
        .tensor("model.layers.17.post_feedforward_layernorm.weight")
        .is_ok());
    assert!(infer_vindex::verify(&t).unwrap().is_ok());
    std::fs::remove_dir_all(&t).unwrap();
    roundtrip(GEMMA, Dtype::F16, Some(tok), root.path());
}

/// Gemma's GGUF without a tokenizer.json: the SentencePiece vocabulary from its metadata is
/// stored (`--tokenizer` still wins, see `gemma3_roundtrip_f32_and_f16`).
#[test]
fn gemma3_without_tokenizer_json_uses_its_gguf_vocabulary() {
    let src = infer_models::open_source(&model_file(GEMMA)).unwrap();
    let text = infer_vindex::resolve_tokenizer(&src, &BuildOptions::default())
        .unwrap()
        .expect("a tokenizer");
    assert!(text.starts_with("{\"infer_spm\""), "{}", &text[..40]);
    let tok = infer_models::tokenizer::Tokenizer::from_json(&text).unwrap();
    let ids = tok.encode_with("Hello", true, true).unwrap();
    assert_eq!((ids.len(), ids[0]), (2, 2), "<bos> then one token: {ids:?}");
    let root = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        tokenizer: Some(gemma_tokenizer(root.path())),
        ..Default::default()
    };
    let text = infer_vindex::resolve_tokenizer(&src, &opts)
        .unwrap()
        .unwrap();
    assert!(text.contains("\"model\""), "--tokenizer wins");
}

/// Median time of 20 opens of the Gemma-3 f32 vindex (reported, not asserted).
/// `cargo test --release -p infer-vindex --test gguf -- --ignored --nocapture open_time`
#[test]
#[ignore]
fn gemma3_open_time() {
    let root = tempfile::tempdir().unwrap();
    let src = infer_models::open_source(&model_file(GEMMA)).unwrap();
    let target = root.path().join("g.vindex");
    let opts = BuildOptions {
        allow_no_tokenizer: true,
        ..Default::default()
    };
    build(&src, &target, &opts).unwrap();
    let mut times: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let v = Vindex::open(&target).unwrap();
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(v.num_layers(), 18);
            dt
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let bytes: u64 = v_bytes(&target);
    eprintln!(
        "Vindex::open(gemma-3-270m f32, {:.0} MiB): median {:.3} ms over 20 (min {:.3}, max {:.3})",
        bytes as f64 / (1 << 20) as f64,
        times[10] * 1e3,
        times[0] * 1e3,
        times[19] * 1e3
    );
}

fn v_bytes(dir: &Path) -> u64 {
    files::BIN_FILES
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}
