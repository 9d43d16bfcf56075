//! ModelConfig parsing: the 19 archrefs (transformers v5 layout), the two real models' configs
//! (v4 layout), v4 ≡ v5 equivalence, and error cases.

use std::path::{Path, PathBuf};

use infer_models::{architecture_for, LayerKind, ModelConfig, ModelError, RopeScaling};
use serde_json::{json, Value};

fn shared() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        p.join("archrefs").is_dir() && p.join("models").is_dir(),
        "shared reference data missing at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

fn load_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_hf_json(Path::new("test/config.json"), v)
}

struct Case {
    dir: &'static str,
    model_type: &'static str,
    layers: usize,
    heads: usize,
    kv: usize,
    head_dim: usize,
    hidden: usize,
    inter: usize,
    vocab: usize,
    theta: f64,
    prf: f64,
    window: Option<usize>,
    tied: bool,
    eps: f64,
}

#[rustfmt::skip]
const CASES: &[Case] = &[
    Case { dir: "llama", model_type: "llama", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: false, eps: 1e-5 },
    Case { dir: "llama-tied-gqa1", model_type: "llama", layers: 3, heads: 6, kv: 1, head_dim: 16, hidden: 96, inter: 160, vocab: 256, theta: 5e5, prf: 1.0, window: None, tied: true, eps: 1e-6 },
    Case { dir: "llama3-rope", model_type: "llama", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 5e5, prf: 1.0, window: None, tied: false, eps: 1e-6 },
    Case { dir: "mistral-swa", model_type: "mistral", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: Some(8), tied: false, eps: 1e-6 },
    Case { dir: "qwen2", model_type: "qwen2", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: true, eps: 1e-6 },
    Case { dir: "qwen3", model_type: "qwen3", layers: 3, heads: 4, kv: 2, head_dim: 32, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: false, eps: 1e-6 },
    Case { dir: "gemma", model_type: "gemma", layers: 3, heads: 4, kv: 1, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: true, eps: 1e-6 },
    Case { dir: "gemma2", model_type: "gemma2", layers: 4, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: Some(8), tied: true, eps: 1e-6 },
    Case { dir: "gemma3", model_type: "gemma3_text", layers: 6, heads: 4, kv: 1, head_dim: 32, hidden: 64, inter: 128, vocab: 256, theta: 1e6, prf: 1.0, window: Some(8), tied: true, eps: 1e-6 },
    Case { dir: "gemma3-ropescale", model_type: "gemma3_text", layers: 4, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e6, prf: 1.0, window: Some(6), tied: true, eps: 1e-6 },
    Case { dir: "starcoder2", model_type: "starcoder2", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: true, eps: 1e-5 },
    Case { dir: "phi3-partial", model_type: "phi3", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 0.5, window: None, tied: false, eps: 1e-5 },
    Case { dir: "gpt_neox", model_type: "gpt_neox", layers: 3, heads: 4, kv: 4, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 0.25, window: None, tied: false, eps: 1e-5 },
    Case { dir: "granite", model_type: "granite", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: false, eps: 1e-6 },
    Case { dir: "olmo2", model_type: "olmo2", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: false, eps: 1e-5 },
    Case { dir: "gpt2", model_type: "gpt2", layers: 3, heads: 4, kv: 4, head_dim: 16, hidden: 64, inter: 256, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: true, eps: 1e-5 },
    Case { dir: "phi", model_type: "phi", layers: 3, heads: 4, kv: 4, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 0.5, window: None, tied: false, eps: 1e-5 },
    Case { dir: "mixtral", model_type: "mixtral", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e6, prf: 1.0, window: None, tied: false, eps: 1e-5 },
    Case { dir: "qwen2-moe", model_type: "qwen2_moe", layers: 3, heads: 4, kv: 2, head_dim: 16, hidden: 64, inter: 128, vocab: 256, theta: 1e4, prf: 1.0, window: None, tied: false, eps: 1e-6 },
];

#[test]
fn every_archref_config_parses_with_expected_values() {
    let root = shared().join("archrefs");
    let mut dirs: Vec<String> = std::fs::read_dir(&root)
        .expect("archrefs readable")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut listed: Vec<String> = CASES.iter().map(|c| c.dir.to_string()).collect();
    listed.sort();
    assert_eq!(dirs, listed, "the table must cover every archrefs case");

    for c in CASES {
        let cfg = ModelConfig::from_hf_file(&root.join(c.dir).join("config.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", c.dir));
        let arch = architecture_for(&cfg).unwrap_or_else(|e| panic!("{}: {e}", c.dir));
        assert_eq!(cfg.model_type, c.model_type, "{}", c.dir);
        assert_eq!(arch.num_layers(), c.layers, "{} layers", c.dir);
        assert_eq!(cfg.hidden_size, c.hidden, "{} hidden", c.dir);
        assert_eq!(cfg.intermediate_size, c.inter, "{} intermediate", c.dir);
        assert_eq!(arch.vocab_size(), c.vocab, "{} vocab", c.dir);
        assert_eq!(cfg.tie_word_embeddings, c.tied, "{} tied", c.dir);
        assert_eq!(cfg.norm_eps, c.eps, "{} eps", c.dir);
        assert_eq!(cfg.layer_types.len(), c.layers, "{} layer_types", c.dir);
        assert_eq!(cfg.rope_theta, c.theta, "{} rope_theta", c.dir);
        assert_eq!(cfg.sliding_window, c.window, "{} window", c.dir);
        for l in 0..c.layers {
            assert_eq!(arch.num_q_heads_for_layer(l), c.heads, "{} heads", c.dir);
            assert_eq!(arch.num_kv_heads_for_layer(l), c.kv, "{} kv heads", c.dir);
            assert_eq!(arch.head_dim_for_layer(l), c.head_dim, "{} head_dim", c.dir);
            let expected_prf = if c.dir == "gpt2" { 0.0 } else { c.prf };
            assert_eq!(
                arch.rotary_fraction_for_layer(l),
                expected_prf,
                "{} rotary",
                c.dir
            );
        }
        let scaling_expected = match c.dir {
            "llama3-rope" => Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 16,
            }),
            "gemma3-ropescale" => Some(RopeScaling::Linear { factor: 8.0 }),
            _ => None,
        };
        assert_eq!(cfg.rope_scaling, scaling_expected, "{} rope scaling", c.dir);
        let local = matches!(c.dir, "gemma3" | "gemma3-ropescale").then_some(1e4);
        assert_eq!(cfg.rope_local_theta, local, "{} local theta", c.dir);
    }
}

#[test]
fn archref_family_specific_fields() {
    let root = shared().join("archrefs");
    let cfg = |d: &str| ModelConfig::from_hf_file(&root.join(d).join("config.json")).unwrap();

    let g2 = cfg("gemma2");
    assert_eq!(g2.attn_logit_softcapping, Some(50.0));
    assert_eq!(g2.final_logit_softcapping, Some(30.0));
    assert_eq!(g2.query_pre_attn_scalar, Some(16.0));
    use LayerKind::{Full as F, Sliding as S};
    assert_eq!(g2.layer_types, vec![S, F, S, F]);
    assert_eq!(cfg("gemma3").layer_types, vec![S, S, F, S, S, F]);
    assert_eq!(cfg("gemma3").attn_logit_softcapping, None);
    assert_eq!(cfg("mistral-swa").layer_types, vec![S, S, S]);

    let gr = cfg("granite");
    assert_eq!(gr.embedding_multiplier, Some(12.0));
    assert_eq!(gr.attention_multiplier, Some(0.05));
    assert_eq!(gr.residual_multiplier, Some(0.22));
    assert_eq!(gr.logits_scaling, Some(8.0));
    assert_eq!(cfg("llama").embedding_multiplier, None);

    let mx = cfg("mixtral");
    assert_eq!((mx.num_experts, mx.num_experts_per_tok), (4, 2));
    assert!(mx.norm_topk_prob);
    let qm = cfg("qwen2-moe");
    assert_eq!((qm.num_experts, qm.num_experts_per_tok), (4, 2));
    assert_eq!(qm.moe_intermediate_size, Some(64));
    assert_eq!(qm.shared_expert_intermediate_size, Some(96));
    assert!(!qm.norm_topk_prob);
    assert!(qm.attention_bias);
    assert_eq!(qm.eos_token_ids, Vec::<u32>::new());

    assert!(cfg("qwen2").attention_bias);
    assert!(!cfg("qwen3").attention_bias);
    let sc = cfg("starcoder2");
    assert!(sc.attention_bias && sc.mlp_bias);
    assert_eq!(sc.hidden_act, "gelu_pytorch_tanh");
    let nx = cfg("gpt_neox");
    assert!(nx.use_parallel_residual && nx.attention_bias);
    assert_eq!(nx.hidden_act, "gelu");
    let g = cfg("gpt2");
    assert_eq!(g.hidden_act, "gelu_new");
    assert_eq!(g.max_position_embeddings, 256);
    assert_eq!(g.eos_token_ids, vec![50256]);
    assert!(cfg("phi").use_parallel_residual);
    assert_eq!(cfg("olmo2").eos_token_ids, vec![50279]);
    assert_eq!(cfg("olmo2").bos_token_id, None);
}

#[test]
fn real_model_configs_v4_layout() {
    let models = shared().join("models");
    let s = ModelConfig::from_hf_file(&models.join("smollm2-135m-instruct/config.json")).unwrap();
    assert_eq!(s.model_type, "llama");
    assert_eq!(
        (
            s.hidden_size,
            s.num_hidden_layers,
            s.num_attention_heads,
            s.num_key_value_heads
        ),
        (576, 30, 9, 3)
    );
    assert_eq!(
        (s.head_dim, s.intermediate_size, s.vocab_size),
        (64, 1536, 49152)
    );
    assert_eq!(s.rope_theta, 1e5);
    assert_eq!(s.rope_scaling, None);
    assert_eq!(s.norm_eps, 1e-5);
    assert!(s.tie_word_embeddings);
    assert_eq!(s.hidden_act, "silu");
    assert_eq!(s.eos_token_ids, vec![2]);
    assert_eq!(s.sliding_window, None);

    let g = ModelConfig::from_hf_file(&models.join("gemma3-270m/config.json")).unwrap();
    assert_eq!(g.model_type, "gemma3_text");
    assert_eq!(
        (
            g.hidden_size,
            g.num_hidden_layers,
            g.num_attention_heads,
            g.num_key_value_heads
        ),
        (640, 18, 4, 1)
    );
    assert_eq!(
        (g.head_dim, g.intermediate_size, g.vocab_size),
        (256, 2048, 262144)
    );
    assert_eq!(g.query_pre_attn_scalar, Some(256.0));
    assert_eq!(g.norm_eps, 1e-6);
    assert!(g.tie_word_embeddings);
    assert_eq!(g.hidden_act, "gelu_pytorch_tanh");
    assert_eq!(g.sliding_window, Some(512));
    assert_eq!(g.rope_theta, 1e6);
    assert_eq!(g.rope_local_theta, Some(1e4));
    assert_eq!(g.rope_scaling, None);
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (None, None)
    );
    assert_eq!(
        (g.bos_token_id, g.eos_token_ids.clone(), g.pad_token_id),
        (Some(2), vec![1], Some(0))
    );
    let full: Vec<usize> = (0..18)
        .filter(|&i| g.layer_types[i] == LayerKind::Full)
        .collect();
    assert_eq!(full, vec![5, 11, 17]);
    let arch = architecture_for(&g).unwrap();
    assert_eq!(arch.rope_base_for_layer(5), 1e6);
    assert_eq!(arch.rope_base_for_layer(4), 1e4);
    assert_eq!(arch.sliding_window_for_layer(0), Some(512));
    assert_eq!(arch.sliding_window_for_layer(17), None);
    assert_eq!(arch.attention_scale_for_layer(0), 1.0 / 16.0);
    assert!((arch.embedding_scale() - 640f32.sqrt()).abs() < 1e-6);
}

/// Rewrite a v5 config into the v4 layout the way transformers 4.x wrote it.
fn to_v4(mut v: Value) -> Value {
    let obj = v.as_object_mut().unwrap();
    let rp = obj.remove("rope_parameters").unwrap();
    obj.insert("rope_theta".into(), rp["rope_theta"].clone());
    let mut scaling = rp.as_object().unwrap().clone();
    scaling.remove("rope_theta");
    obj.insert("rope_scaling".into(), Value::Object(scaling));
    v
}

#[test]
fn llama3_rope_scaling_v4_and_v5_give_the_same_config() {
    let v5 = load_json(&shared().join("archrefs/llama3-rope/config.json"));
    let v4 = to_v4(v5.clone());
    assert!(v4.get("rope_parameters").is_none());
    assert_eq!(v4["rope_scaling"]["rope_type"], "llama3");
    let (a, b) = (parse(&v5).unwrap(), parse(&v4).unwrap());
    assert_eq!(a, b);
    assert!(matches!(a.rope_scaling, Some(RopeScaling::Llama3 { factor, .. }) if factor == 8.0));

    // Older v4 spelling `type` instead of `rope_type`.
    let mut old = v4.clone();
    let rs = old["rope_scaling"].as_object_mut().unwrap();
    let t = rs.remove("rope_type").unwrap();
    rs.insert("type".into(), t);
    assert_eq!(parse(&old).unwrap(), a);
}

#[test]
fn gemma3_v4_layout_with_pattern_equals_v5() {
    let v5 = load_json(&shared().join("archrefs/gemma3-ropescale/config.json"));
    let mut v4 = v5.clone();
    let o = v4.as_object_mut().unwrap();
    o.remove("rope_parameters");
    o.remove("layer_types");
    o.remove("_sliding_window_pattern");
    o.insert("rope_theta".into(), json!(1000000.0));
    o.insert("rope_local_base_freq".into(), json!(10000.0));
    o.insert(
        "rope_scaling".into(),
        json!({"type": "linear", "factor": 8.0}),
    );
    // Layers S F S F: full iff (i+1) % 2 == 0.
    o.insert("sliding_window_pattern".into(), json!(2));
    assert_eq!(parse(&v4).unwrap(), parse(&v5).unwrap());
}

#[test]
fn gpt_neox_v4_rotary_pct_equals_v5() {
    let v5 = load_json(&shared().join("archrefs/gpt_neox/config.json"));
    let mut v4 = v5.clone();
    let o = v4.as_object_mut().unwrap();
    o.remove("rope_parameters");
    o.insert("rotary_pct".into(), json!(0.25));
    o.insert("rotary_emb_base".into(), json!(10000));
    assert_eq!(parse(&v4).unwrap(), parse(&v5).unwrap());
    // And the class default (0.25) when nothing is given.
    v4.as_object_mut().unwrap().remove("rotary_pct");
    assert_eq!(parse(&v4).unwrap().partial_rotary_factor, 0.25);
}

#[test]
fn missing_required_field_is_named() {
    let mut v = load_json(&shared().join("archrefs/llama/config.json"));
    v.as_object_mut().unwrap().remove("hidden_size");
    match parse(&v) {
        Err(ModelError::MissingField { field, path }) => {
            assert_eq!(field, "hidden_size");
            assert_eq!(path, Path::new("test/config.json"));
        }
        other => panic!("expected MissingField, got {other:?}"),
    }
    let mut g = load_json(&shared().join("archrefs/gpt2/config.json"));
    g.as_object_mut().unwrap().remove("n_embd");
    assert!(matches!(parse(&g), Err(ModelError::MissingField { field, .. }) if field == "n_embd"));

    let mut r = load_json(&shared().join("archrefs/llama3-rope/config.json"));
    r["rope_parameters"]
        .as_object_mut()
        .unwrap()
        .remove("low_freq_factor");
    assert!(matches!(parse(&r),
        Err(ModelError::MissingField { field, .. }) if field == "rope_parameters.low_freq_factor"));

    // `null` counts as missing for a required field.
    let mut n = load_json(&shared().join("archrefs/llama/config.json"));
    n["vocab_size"] = Value::Null;
    assert!(
        matches!(parse(&n), Err(ModelError::MissingField { field, .. }) if field == "vocab_size")
    );
}

/// A zero size is blamed on the field that is 0 (it used to always name num_attention_heads).
#[test]
fn zero_size_names_the_zero_field() {
    for (dir, key) in [
        ("llama", "hidden_size"),
        ("llama", "num_hidden_layers"),
        ("llama", "num_attention_heads"),
        ("gpt2", "n_embd"),
        ("gpt2", "n_layer"),
        ("gpt2", "n_head"),
    ] {
        let mut v = load_json(&shared().join("archrefs").join(dir).join("config.json"));
        v[key] = json!(0);
        let err = parse(&v).expect_err(key);
        assert_eq!(
            err.to_string(),
            format!("test/config.json: config field '{key}': must be at least 1 (got 0)")
        );
    }
}

#[test]
fn unknown_model_type_is_rejected() {
    let mut v = load_json(&shared().join("archrefs/llama/config.json"));
    v["model_type"] = json!("bert");
    match parse(&v) {
        Err(ModelError::UnknownArchitecture {
            model_type,
            supported,
            ..
        }) => {
            assert_eq!(model_type, "bert");
            assert!(supported.contains("llama") && supported.contains("qwen2_moe"));
        }
        other => panic!("expected UnknownArchitecture, got {other:?}"),
    }
    let mut cfg = parse(&load_json(&shared().join("archrefs/llama/config.json"))).unwrap();
    cfg.model_type = "bert".into();
    let err = architecture_for(&cfg).err().expect("bert must be rejected");
    assert!(err.contains("bert") && err.contains("gemma3_text"), "{err}");
}

#[test]
fn family_key_spellings_and_defaults() {
    let base = load_json(&shared().join("archrefs/llama/config.json"));

    // head_dim null → hidden / heads.
    let mut v = base.clone();
    v["head_dim"] = Value::Null;
    v["hidden_size"] = json!(96);
    assert_eq!(parse(&v).unwrap().head_dim, 24);

    // eos_token_id as a list.
    let mut v = base.clone();
    v["eos_token_id"] = json!([128001, 128008, 128009]);
    assert_eq!(
        parse(&v).unwrap().eos_token_ids,
        vec![128001, 128008, 128009]
    );

    // Mistral: sliding_window null → no sliding layers.
    let mut m = load_json(&shared().join("archrefs/mistral-swa/config.json"));
    m["sliding_window"] = Value::Null;
    let mc = parse(&m).unwrap();
    assert_eq!(mc.sliding_window, None);
    assert!(mc.layer_types.iter().all(|k| *k == LayerKind::Full));

    // Qwen2: use_sliding_window false → no window even when sliding_window is set.
    let mut q = load_json(&shared().join("archrefs/qwen2/config.json"));
    q["sliding_window"] = json!(4096);
    assert_eq!(parse(&q).unwrap().sliding_window, None);

    // Gemma-2 v4 without layer_types: alternate, starting with sliding.
    let mut g2 = load_json(&shared().join("archrefs/gemma2/config.json"));
    g2.as_object_mut().unwrap().remove("layer_types");
    let g2c = parse(&g2).unwrap();
    use LayerKind::{Full as F, Sliding as S};
    assert_eq!(g2c.layer_types, vec![S, F, S, F]);

    // gpt2: n_inner null → 4 · n_embd; explicit n_inner wins.
    let mut gp = load_json(&shared().join("archrefs/gpt2/config.json"));
    assert_eq!(parse(&gp).unwrap().intermediate_size, 256);
    gp["n_inner"] = json!(100);
    assert_eq!(parse(&gp).unwrap().intermediate_size, 100);

    // Unsupported RoPE type → BadField naming it.
    let mut y = base.clone();
    y["rope_parameters"] = json!({"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4});
    assert!(matches!(parse(&y),
        Err(ModelError::BadField { field, .. }) if field == "rope_parameters.rope_type"));
    // YaRN with only a factor: HF `_compute_yarn_parameters` defaults (beta 32/1, the original
    // context = max_position_embeddings, attention factor 0.1·ln(factor) + 1, truncated).
    y["rope_parameters"] = json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4});
    let c = parse(&y).unwrap();
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Yarn {
            factor: 4.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: c.max_position_embeddings,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        })
    );

    // Unknown activation → BadField.
    let mut a = base.clone();
    a["hidden_act"] = json!("relu6");
    assert!(matches!(parse(&a), Err(ModelError::BadField { field, .. }) if field == "hidden_act"));

    // A multimodal gemma3 config is read from text_config.
    let text = load_json(&shared().join("archrefs/gemma3/config.json"));
    let mm = json!({"model_type": "gemma3", "text_config": text.clone(), "eos_token_id": [1, 106]});
    let mut t2 = text.clone();
    t2.as_object_mut().unwrap().remove("eos_token_id");
    let mm2 = json!({"model_type": "gemma3", "text_config": t2, "eos_token_id": [1, 106]});
    assert_eq!(parse(&mm).unwrap(), parse(&text).unwrap());
    assert_eq!(parse(&mm2).unwrap().eos_token_ids, vec![1, 106]);
}

#[test]
fn from_hf_file_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("config.json");
    assert!(matches!(ModelConfig::from_hf_file(&missing),
        Err(ModelError::Io { path, .. }) if path == missing));
    std::fs::write(&missing, "{not json").unwrap();
    assert!(matches!(ModelConfig::from_hf_file(&missing),
        Err(ModelError::Json { path, .. }) if path == missing));
}

/// The two families of `../shared/archrefs-next` added with gpt-oss and Cohere-2: every value
/// their forward pass reads, from the transformers 5 `config.json` (defaults where absent).
#[test]
fn gpt_oss_and_cohere2_configs() {
    use LayerKind::{Full as F, Sliding as S};
    let read = |case: &str| {
        ModelConfig::from_hf_file(
            &shared()
                .join("archrefs-next")
                .join(case)
                .join("config.json"),
        )
        .unwrap()
    };
    let g = read("gpt-oss");
    assert_eq!(g.model_type, "gpt_oss");
    assert_eq!(g.rope_theta, 150_000.0);
    assert_eq!(
        g.rope_scaling,
        Some(RopeScaling::Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 4096,
            attention_factor: 0.1 * 32f64.ln() + 1.0,
            truncate: false,
        })
    );
    assert_eq!(
        (g.sliding_window, g.layer_types.clone()),
        (Some(8), vec![S, F, S, F])
    );
    assert_eq!(
        (g.num_experts, g.num_experts_per_tok, g.norm_topk_prob),
        (4, 2, true)
    );
    assert_eq!((g.swiglu_limit, g.swiglu_alpha), (Some(7.0), Some(1.702)));
    assert!(g.attention_bias && !g.tie_word_embeddings && !g.use_parallel_residual);
    assert_eq!((g.norm_eps, g.logit_scale), (1e-5, None));
    let a = architecture_for(&g).unwrap();
    assert_eq!(
        a.attn_sinks_key(1).as_deref(),
        Some("model.layers.1.self_attn.sinks")
    );
    assert_eq!(
        a.moe_router_bias_key(0).as_deref(),
        Some("model.layers.0.mlp.gate.bias")
    );
    assert_eq!(a.clamped_swiglu(), Some((7.0, 1.702)));

    let c = read("cohere2");
    assert_eq!(c.model_type, "cohere2");
    assert_eq!(
        (c.sliding_window, c.layer_types.clone()),
        (Some(8), vec![S, S, S, F])
    );
    assert_eq!(c.logit_scale, Some(0.25));
    assert!(c.tie_word_embeddings && c.use_parallel_residual && !c.attention_bias);
    assert_eq!(
        (c.norm_eps, c.rope_theta, c.rope_scaling.clone()),
        (1e-5, 1e4, None)
    );
    let a = architecture_for(&c).unwrap();
    assert_eq!(a.logits_divisor(), 4.0);
    assert!(a.rope_interleaved());
    let roped: Vec<bool> = (0..4).map(|l| a.has_rope_for_layer(l)).collect();
    assert_eq!(roped, [true, true, true, false]);
    assert_eq!(a.norm_bias_key("model.norm.weight"), None);

    // Without layer_types: Cohere-2's sliding_window_pattern (default 4), gpt-oss alternating.
    let mut j = load_json(&shared().join("archrefs-next/cohere2/config.json"));
    j.as_object_mut().unwrap().remove("layer_types");
    j["num_hidden_layers"] = json!(8);
    j["sliding_window_pattern"] = json!(2);
    assert_eq!(parse(&j).unwrap().layer_types, vec![S, F, S, F, S, F, S, F]);
    j.as_object_mut().unwrap().remove("sliding_window_pattern");
    assert_eq!(parse(&j).unwrap().layer_types, vec![S, S, S, F, S, S, S, F]);
    j["logit_scale"] = json!(0.0);
    assert!(architecture_for(&parse(&j).unwrap()).is_err());
    let mut j = load_json(&shared().join("archrefs-next/gpt-oss/config.json"));
    j.as_object_mut().unwrap().remove("layer_types");
    j.as_object_mut().unwrap().remove("rope_parameters");
    let d = parse(&j).unwrap();
    assert_eq!(d.layer_types, vec![S, F, S, F]);
    assert_eq!(
        d.rope_scaling, g.rope_scaling,
        "the GptOssConfig default YaRN"
    );
    j["swiglu_limit"] = json!(-1.0);
    assert!(architecture_for(&parse(&j).unwrap()).is_err());
}
