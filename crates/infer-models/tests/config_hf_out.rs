//! `ModelConfig::to_hf_json` (what `infer export --safetensors` writes as config.json) parses
//! back to the same config: every archrefs case, the real models' configs, and variants that
//! exercise each family-specific key (sliding layouts, biases, soft-caps, multipliers, MoE,
//! RoPE scaling, token-id lists).

use std::path::{Path, PathBuf};

use infer_models::ModelConfig;
use serde_json::{json, Value};

fn shared() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        p.join("archrefs").is_dir(),
        "shared reference data missing at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

fn parse(v: &Value) -> ModelConfig {
    ModelConfig::from_hf_json(Path::new("in/config.json"), v).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// `cfg` → config.json → `cfg` again, and the written keys are the family's own.
fn round_trip(what: &str, cfg: &ModelConfig) -> Value {
    let out = cfg.to_hf_json("float32");
    let back = ModelConfig::from_hf_json(Path::new("out/config.json"), &out)
        .unwrap_or_else(|e| panic!("{what}: written config does not parse: {e}\n{out:#}"));
    assert_eq!(
        &back, cfg,
        "{what}: written config parses to another config\n{out:#}"
    );
    out
}

#[test]
fn every_archref_and_real_config_round_trips() {
    let root = shared();
    let mut n = 0;
    for dir in std::fs::read_dir(root.join("archrefs")).unwrap().flatten() {
        let p = dir.path().join("config.json");
        if !p.is_file() {
            continue;
        }
        let cfg = ModelConfig::from_hf_file(&p).unwrap();
        let out = round_trip(&p.display().to_string(), &cfg);
        assert_eq!(out["torch_dtype"], "float32");
        n += 1;
    }
    assert!(n >= 19, "{n} archrefs cases");
    for case in ["qwen3-moe", "gpt-oss", "cohere2"] {
        let p = root.join("archrefs-next").join(case).join("config.json");
        let cfg = ModelConfig::from_hf_file(&p).unwrap();
        round_trip(case, &cfg);
    }
    for m in ["smollm2-135m-instruct", "gemma3-270m"] {
        let p = root.join("models").join(m).join("config.json");
        let cfg = ModelConfig::from_hf_file(&p).unwrap();
        round_trip(m, &cfg);
    }
    let gpt2 = ModelConfig::from_hf_file(&root.join("archrefs/gpt2/config.json")).unwrap();
    let out = gpt2.to_hf_json("float32");
    assert_eq!(out["n_embd"], 64);
    assert_eq!(out["activation_function"], "gelu_new");
    assert_eq!(out["architectures"], json!(["GPT2LMHeadModel"]));
    assert!(out.get("hidden_size").is_none());
}

#[test]
fn family_specific_variants_round_trip() {
    let base = |mt: &str| {
        json!({
            "model_type": mt, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "max_position_embeddings": 512,
        })
    };
    let with = |mut v: Value, extra: Value| {
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let variants = [
        (
            "qwen2 sliding from layer 2",
            with(
                base("qwen2"),
                json!({"use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2}),
            ),
        ),
        ("qwen3 default head_dim", base("qwen3")),
        (
            "starcoder2 without biases",
            with(base("starcoder2"), json!({"use_bias": false})),
        ),
        ("mistral default window", base("mistral")),
        (
            "mistral without window",
            with(base("mistral"), json!({"sliding_window": null})),
        ),
        ("gemma2 default soft-caps", base("gemma2")),
        (
            "gemma2 no soft-caps",
            with(
                base("gemma2"),
                json!({"attn_logit_softcapping": null, "final_logit_softcapping": null}),
            ),
        ),
        (
            "gemma3 pattern 3, local base, linear scaling",
            with(
                base("gemma3_text"),
                json!({"sliding_window_pattern": 3, "rope_local_base_freq": 2e4,
                       "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
            ),
        ),
        (
            "granite multipliers",
            with(
                base("granite"),
                json!({"embedding_multiplier": 12.0, "attention_multiplier": 0.05,
                       "residual_multiplier": 0.22, "logits_scaling": 8.0}),
            ),
        ),
        (
            "gpt_neox serial residual",
            with(
                base("gpt_neox"),
                json!({"use_parallel_residual": false, "attention_bias": false, "rotary_pct": 0.5}),
            ),
        ),
        (
            "llama biases, eos list, llama3 scaling",
            with(
                base("llama"),
                json!({"attention_bias": true, "mlp_bias": true, "eos_token_id": [5, 7, 9],
                       "bos_token_id": 1, "pad_token_id": 0,
                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
            ),
        ),
        (
            "qwen3_moe",
            with(
                base("qwen3_moe"),
                json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "norm_topk_prob": true}),
            ),
        ),
        (
            "phi3 window",
            with(base("phi3"), json!({"sliding_window": 32})),
        ),
    ];
    for (what, v) in variants {
        let cfg = parse(&v);
        round_trip(what, &cfg);
    }
}
