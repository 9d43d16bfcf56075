//! Position checks of `ModelConfig` (HF `config.json`): a context of 0 positions and, for RoPE
//! families, a rotary dimension that is 0, odd or wider than a head, or a non-positive RoPE
//! base, are refused with an error naming the file and the field. GGUF metadata goes through
//! the same check (`infer-vindex/tests/layer_count.rs` extracts doctored GGUF copies).

use std::path::{Path, PathBuf};

use infer_models::{ModelConfig, ModelError};
use serde_json::{json, Value};

fn archref_config(case: &str) -> Value {
    let dir = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let p = dir.join("archrefs").join(case).join("config.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "shared reference config {} missing: {e} (set INFER_SHARED)",
            p.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_hf_json(Path::new("doctored/config.json"), v)
}

/// Parse `case`'s config after `edit`; it must fail with `BadField` on `field` and the
/// message (which names the file) must contain `want`.
fn refused(case: &str, edit: impl FnOnce(&mut Value), field: &str, want: &str) {
    let mut v = archref_config(case);
    edit(&mut v);
    match parse(&v) {
        Err(e @ ModelError::BadField { .. }) => {
            let msg = e.to_string();
            assert!(
                matches!(&e, ModelError::BadField { field: f, .. } if f == field),
                "{case}: wrong field in '{msg}', expected '{field}'"
            );
            assert!(
                msg.starts_with("doctored/config.json: ") && msg.contains(want),
                "{case}: message '{msg}' lacks '{want}'"
            );
        }
        other => panic!("{case}: expected BadField on '{field}', got {other:?}"),
    }
}

#[test]
fn zero_context_length_is_refused() {
    refused(
        "llama",
        |v| v["max_position_embeddings"] = json!(0),
        "max_position_embeddings",
        "context length must be at least 1 position (got 0)",
    );
    // GPT-2 spells it n_positions (learned positions: the context still must be ≥ 1).
    refused(
        "gpt2",
        |v| v["n_positions"] = json!(0),
        "n_positions",
        "at least 1 position",
    );
}

#[test]
fn unusable_rotary_dimension_is_refused() {
    // llama head_dim 16: factor 0 turns RoPE off; phi3-partial (head_dim 16) 0.1875 → 3 dims
    // (odd); 1.5 → 24 dims (> head_dim).
    refused(
        "llama",
        |v| v["partial_rotary_factor"] = json!(0.0),
        "partial_rotary_factor",
        "rotary dimension 0 (head_dim 16 × partial rotary factor 0)",
    );
    for (prf, dim) in [(0.1875, 3), (1.5, 24)] {
        refused(
            "phi3-partial",
            |v| v["rope_parameters"]["partial_rotary_factor"] = json!(prf),
            "partial_rotary_factor",
            &format!("rotary dimension {dim} (head_dim 16"),
        );
    }
    refused(
        "llama",
        |v| v["rope_parameters"]["rope_theta"] = json!(0.0),
        "rope_theta",
        "RoPE base must be finite and positive (got 0)",
    );
}

#[test]
fn valid_rotary_settings_still_parse() {
    // phi3-partial's own 0.5 → 8 of 16 dims; 0.25 → 4; gpt2 has no RoPE, so its factor is
    // irrelevant and not checked.
    let c = parse(&archref_config("phi3-partial")).expect("phi3-partial parses");
    assert_eq!((c.head_dim, c.partial_rotary_factor), (16, 0.5));
    let mut v = archref_config("phi3-partial");
    v["rope_parameters"]["partial_rotary_factor"] = json!(0.25);
    assert_eq!(parse(&v).expect("0.25 parses").partial_rotary_factor, 0.25);
    let mut g = archref_config("gpt2");
    g["partial_rotary_factor"] = json!(0.0);
    assert!(
        parse(&g).is_ok(),
        "gpt2 (learned positions) needs no rotary dims"
    );
}
