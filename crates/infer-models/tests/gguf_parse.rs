//! The two real GGUFs: parsing, tensor names/shapes after mapping, config vs the HF config.json.

mod gguf_common;

use std::collections::BTreeMap;

use gguf_common::{model_path, shared_config, GEMMA3, SMOLLM2};
use infer_models::gguf::{config_from_gguf, open_gguf_source, GgufFile, GgufValue};
use infer_models::{LayerKind, ModelConfig, SourceKind};
use infer_quant::QuantFormat;
use serde_json::Value;

#[test]
fn smollm2_header_and_metadata() {
    let g = GgufFile::open(&model_path(SMOLLM2)).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_start() % 32, 0);
    assert_eq!(g.metadata_entries().len(), 33);
    assert_eq!(g.tensor_infos().len(), 272);
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.metadata("llama.block_count"), Some(&GgufValue::U32(30)));
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(100_000.0));
    assert_eq!(
        g.get_f32("llama.attention.layer_norm_rms_epsilon"),
        Some(1e-5)
    );
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("smollm"));
    let toks = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks.len(), 49152);
    assert_eq!(&toks[..3], ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
    assert_eq!(
        g.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(g.get_str_array("tokenizer.ggml.merges").unwrap()[0], "Ġ t");
    let e = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        (e.dims.clone(), e.format),
        (vec![576, 49152], QuantFormat::Q8_0)
    );
    assert_eq!(e.hf_shape(), vec![49152, 576]);
    // Q8_0: 34 bytes per 32 values; the slice is zero-copy from the mmap.
    assert_eq!(
        g.tensor_bytes("token_embd.weight").unwrap().len(),
        49152 * 576 / 32 * 34
    );
    let q = g.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.format, q.n_bytes),
        (QuantFormat::Q4_1, 576 * 576 / 32 * 20)
    );
    // The last tensor ends at most one alignment before the end of the file.
    let end = g
        .tensor_infos()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap();
    let len = std::fs::metadata(model_path(SMOLLM2)).unwrap().len() as usize;
    assert!(g.data_start() + end <= len && len - (g.data_start() + end) < 32);
    assert!(g
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
}

#[test]
fn gemma3_header_and_metadata() {
    let g = GgufFile::open(&model_path(GEMMA3)).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.tensor_infos().len(), 236);
    assert_eq!(g.get_str("general.architecture"), Some("gemma3"));
    assert_eq!(g.get_u32("gemma3.attention.sliding_window"), Some(512));
    assert_eq!(g.get_u32("gemma3.attention.key_length"), Some(256));
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("llama"));
    assert_eq!(
        g.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
        262144
    );
    let tt = g.get_i64_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(tt.len(), 262144);
    assert_eq!(tt[2], 3, "<bos> is a control token");
    let formats: std::collections::BTreeSet<_> =
        g.tensor_infos().iter().map(|t| t.format.name()).collect();
    let want: std::collections::BTreeSet<_> = ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
        .into_iter()
        .collect();
    assert_eq!(formats, want);
}

/// Expected HF name → shape for a Llama-style model, from its config.json.
fn llama_table(c: &Value) -> BTreeMap<String, Vec<usize>> {
    let u = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("config.json {k}")) as usize;
    let (h, i, hd, v) = (
        u("hidden_size"),
        u("intermediate_size"),
        u("head_dim"),
        u("vocab_size"),
    );
    let (nq, nkv) = (u("num_attention_heads"), u("num_key_value_heads"));
    let mut t = BTreeMap::new();
    t.insert("model.embed_tokens.weight".to_string(), vec![v, h]);
    t.insert("model.norm.weight".to_string(), vec![h]);
    for l in 0..u("num_hidden_layers") {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![nq * hd, h]),
            ("self_attn.k_proj.weight", vec![nkv * hd, h]),
            ("self_attn.v_proj.weight", vec![nkv * hd, h]),
            ("self_attn.o_proj.weight", vec![h, nq * hd]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ] {
            t.insert(format!("{p}{n}"), s);
        }
    }
    t
}

/// Gemma-3 adds q/k norms and pre/post-FFN norms to the Llama table.
fn gemma3_table(c: &Value) -> BTreeMap<String, Vec<usize>> {
    let mut t = llama_table(c);
    let h = c["hidden_size"].as_u64().unwrap() as usize;
    let hd = c["head_dim"].as_u64().unwrap() as usize;
    for l in 0..c["num_hidden_layers"].as_u64().unwrap() {
        let p = format!("model.layers.{l}.");
        t.insert(format!("{p}self_attn.q_norm.weight"), vec![hd]);
        t.insert(format!("{p}self_attn.k_norm.weight"), vec![hd]);
        t.insert(format!("{p}pre_feedforward_layernorm.weight"), vec![h]);
        t.insert(format!("{p}post_feedforward_layernorm.weight"), vec![h]);
    }
    t
}

fn source_table(file: &str) -> BTreeMap<String, Vec<usize>> {
    let src = open_gguf_source(&model_path(file)).unwrap();
    assert_eq!(src.kind, SourceKind::Gguf);
    let t: BTreeMap<_, _> = src
        .tensors
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    assert_eq!(t.len(), src.tensors.tensors().len(), "duplicate HF names");
    t
}

#[test]
fn smollm2_tensor_names_and_shapes() {
    let want = llama_table(&shared_config("smollm2-135m-instruct"));
    assert_eq!(want.len(), 2 + 30 * 9);
    assert_eq!(source_table(SMOLLM2), want);
}

#[test]
fn gemma3_tensor_names_and_shapes() {
    let want = gemma3_table(&shared_config("gemma3-270m"));
    assert_eq!(want.len(), 2 + 18 * 13);
    assert_eq!(source_table(GEMMA3), want);
}

/// Compare every forward-affecting field of `got` with the HF config.json `c`.
fn assert_config_matches(got: &ModelConfig, c: &Value) {
    let u = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("config.json {k}")) as usize;
    let f = |k: &str| c[k].as_f64().unwrap_or_else(|| panic!("config.json {k}"));
    assert_eq!(got.model_type, c["model_type"].as_str().unwrap());
    assert_eq!(got.hidden_size, u("hidden_size"));
    assert_eq!(got.intermediate_size, u("intermediate_size"));
    assert_eq!(got.num_hidden_layers, u("num_hidden_layers"));
    assert_eq!(got.num_attention_heads, u("num_attention_heads"));
    assert_eq!(got.num_key_value_heads, u("num_key_value_heads"));
    assert_eq!(got.head_dim, u("head_dim"));
    assert_eq!(got.vocab_size, u("vocab_size"));
    assert_eq!(got.max_position_embeddings, u("max_position_embeddings"));
    // GGUF stores f32; its shortest decimal is the config.json value.
    assert_eq!(got.norm_eps, f("rms_norm_eps"));
    assert_eq!(got.rope_theta, f("rope_theta"));
    assert_eq!(got.rope_local_theta, c["rope_local_base_freq"].as_f64());
    assert!(c["rope_scaling"].is_null());
    assert_eq!(got.rope_scaling, None);
    assert_eq!(got.partial_rotary_factor, 1.0);
    assert_eq!(
        got.sliding_window,
        c["sliding_window"].as_u64().map(|v| v as usize)
    );
    let want_types: Vec<LayerKind> = match c["layer_types"].as_array() {
        Some(a) => a
            .iter()
            .map(|t| match t.as_str().unwrap() {
                "full_attention" => LayerKind::Full,
                "sliding_attention" => LayerKind::Sliding,
                o => panic!("layer type {o}"),
            })
            .collect(),
        None => vec![LayerKind::Full; u("num_hidden_layers")],
    };
    assert_eq!(got.layer_types, want_types);
    let act = c.get("hidden_act").or(c.get("hidden_activation")).unwrap();
    assert_eq!(got.hidden_act, act.as_str().unwrap());
    assert_eq!(
        got.tie_word_embeddings,
        c["tie_word_embeddings"].as_bool().unwrap()
    );
    assert_eq!(got.attention_bias, c["attention_bias"].as_bool().unwrap());
    assert_eq!(
        got.mlp_bias,
        c.get("mlp_bias").and_then(Value::as_bool).unwrap_or(false)
    );
    assert_eq!(
        got.query_pre_attn_scalar,
        c["query_pre_attn_scalar"].as_f64()
    );
    assert_eq!(
        got.attn_logit_softcapping,
        c["attn_logit_softcapping"].as_f64()
    );
    assert_eq!(
        got.final_logit_softcapping,
        c["final_logit_softcapping"].as_f64()
    );
    assert_eq!(got.embedding_multiplier, None);
    assert_eq!(got.attention_multiplier, None);
    assert_eq!(got.residual_multiplier, None);
    assert_eq!(got.logits_scaling, None);
    assert!(!got.use_parallel_residual);
    assert_eq!((got.num_experts, got.num_experts_per_tok), (0, 0));
    assert_eq!(got.bos_token_id, Some(u("bos_token_id") as u32));
    assert_eq!(got.eos_token_ids, vec![u("eos_token_id") as u32]);
    assert_eq!(got.pad_token_id, Some(u("pad_token_id") as u32));
}

#[test]
fn smollm2_config_matches_hf_config_json() {
    let g = GgufFile::open(&model_path(SMOLLM2)).unwrap();
    assert_config_matches(
        &config_from_gguf(&g).unwrap(),
        &shared_config("smollm2-135m-instruct"),
    );
}

#[test]
fn gemma3_config_matches_hf_config_json() {
    let g = GgufFile::open(&model_path(GEMMA3)).unwrap();
    let cfg = config_from_gguf(&g).unwrap();
    assert_config_matches(&cfg, &shared_config("gemma3-270m"));
    // Family defaults the GGUF lacks: layers 5, 11, 17 are global.
    let full: Vec<usize> = (0..18)
        .filter(|&i| cfg.layer_types[i] == LayerKind::Full)
        .collect();
    assert_eq!(full, vec![5, 11, 17]);
    assert_eq!(cfg.rope_local_theta, Some(10_000.0));
    assert_eq!(cfg.query_pre_attn_scalar, Some(256.0));
}

#[test]
fn source_carries_chat_template_and_gguf() {
    let src = open_gguf_source(&model_path(SMOLLM2)).unwrap();
    let want = std::fs::read_to_string(
        gguf_common::shared_dir().join("models/smollm2-135m-instruct/chat_template.jinja"),
    )
    .unwrap();
    assert_eq!(
        src.chat_template.as_deref().map(str::trim),
        Some(want.trim())
    );
    assert!(src.gguf.is_some());
    // No tokenizer.json next to the GGUF: the one built from metadata is used.
    assert!(src.tokenizer_json.unwrap().contains("\"<|im_start|>\""));
    // SentencePiece GGUF: the llama.cpp-style SPM document built from metadata.
    let gemma = open_gguf_source(&model_path(GEMMA3)).unwrap();
    assert!(gemma.tokenizer_json.unwrap().starts_with("{\"infer_spm\""));
    assert!(gemma.chat_template.is_none());
}

/// The GGUF config equals the HF parser's config of the shared config.json, field for field.
#[test]
fn config_equals_hf_parser() {
    for (file, dir) in [(SMOLLM2, "smollm2-135m-instruct"), (GEMMA3, "gemma3-270m")] {
        let g = GgufFile::open(&model_path(file)).unwrap();
        let p = gguf_common::shared_dir()
            .join("models")
            .join(dir)
            .join("config.json");
        assert_eq!(
            config_from_gguf(&g).unwrap(),
            ModelConfig::from_hf_file(&p).unwrap(),
            "{file}"
        );
    }
}

/// `tokenizer.ggml.eot_token_id` / `eom_token_id` end generation too (after EOS, no repeats),
/// as llama.cpp's end-of-generation set.
#[test]
fn eot_and_eom_ids_join_the_eos_ids() {
    use infer_models::gguf::{encode_header, GgufHeader};
    let mut h = GgufHeader::read(&model_path(SMOLLM2)).unwrap();
    h.metadata
        .push(("tokenizer.ggml.eot_token_id".into(), GgufValue::U32(4)));
    h.metadata
        .push(("tokenizer.ggml.eom_token_id".into(), GgufValue::U32(2)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eot.gguf");
    let bytes = encode_header(&h, &path).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut &f, &bytes).unwrap();
    let data_start = bytes.len().div_ceil(h.alignment) * h.alignment;
    f.set_len((data_start + h.data_len()) as u64).unwrap(); // sparse zero data
    let cfg = config_from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(cfg.eos_token_ids, vec![2, 4]);
}

/// SmolLM2's header as architecture `arch` (its `llama.*` keys renamed) plus `extra` metadata,
/// written with sparse zero data; its config (or the error's message).
fn config_with(arch: &str, extra: &[(&str, u32)]) -> Result<ModelConfig, String> {
    use infer_models::gguf::{encode_header, GgufHeader};
    let mut h = GgufHeader::read(&model_path(SMOLLM2)).unwrap();
    for (k, v) in h.metadata.iter_mut() {
        if let Some(rest) = k.strip_prefix("llama.") {
            *k = format!("{arch}.{rest}");
        }
        if k == "general.architecture" {
            *v = GgufValue::String(arch.into());
        }
    }
    for (k, v) in extra {
        h.metadata.push((format!("{arch}.{k}"), GgufValue::U32(*v)));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    let bytes = encode_header(&h, &path).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut &f, &bytes).unwrap();
    let data_start = bytes.len().div_ceil(h.alignment) * h.alignment;
    f.set_len((data_start + h.data_len()) as u64).unwrap();
    config_from_gguf(&GgufFile::open(&path).unwrap()).map_err(|e| e.to_string())
}

/// MoE metadata: `llama` with `expert_count` is HF `mixtral` (experts as wide as
/// `feed_forward_length`), `qwen3moe` is `qwen3_moe` (experts `expert_feed_forward_length`
/// wide, else llama.cpp's `feed_forward_length / expert_used_count`), both with the top k
/// renormalised; `expert_used_count` is required, in 1..=expert_count; `qwen3moe` without
/// experts and `qwen3`/`gemma3`-style dense architectures with experts are refused.
#[test]
fn moe_metadata_maps_to_hf_families() {
    let c = config_with("llama", &[("expert_count", 8), ("expert_used_count", 2)]).unwrap();
    assert_eq!(c.model_type, "mixtral");
    assert_eq!((c.num_experts, c.num_experts_per_tok), (8, 2));
    assert_eq!(c.moe_intermediate_size, None);
    assert!(c.norm_topk_prob);
    let dense = config_with("llama", &[]).unwrap();
    assert_eq!((dense.model_type.as_str(), dense.num_experts), ("llama", 0));
    let ff = dense.intermediate_size;

    let q = config_with(
        "qwen3moe",
        &[
            ("expert_count", 16),
            ("expert_used_count", 4),
            ("expert_feed_forward_length", 96),
        ],
    )
    .unwrap();
    assert_eq!(q.model_type, "qwen3_moe");
    assert_eq!((q.num_experts, q.num_experts_per_tok), (16, 4));
    assert_eq!(
        (q.intermediate_size, q.moe_intermediate_size),
        (ff, Some(96))
    );
    assert!(q.norm_topk_prob);
    let q = config_with(
        "qwen3moe",
        &[("expert_count", 16), ("expert_used_count", 4)],
    )
    .unwrap();
    assert_eq!(q.moe_intermediate_size, Some(ff / 4));

    for (arch, extra, want) in [
        ("qwen3moe", &[][..], "qwen3moe.expert_count"),
        (
            "llama",
            &[("expert_count", 8)][..],
            "llama.expert_used_count",
        ),
        (
            "llama",
            &[("expert_count", 8), ("expert_used_count", 0)][..],
            "0 experts used per token of 8",
        ),
        (
            "qwen3moe",
            &[("expert_count", 8), ("expert_used_count", 9)][..],
            "9 experts used per token of 8",
        ),
        (
            "qwen3",
            &[("expert_count", 8), ("expert_used_count", 2)][..],
            "not supported for 'qwen3'",
        ),
    ] {
        let e = config_with(arch, extra).unwrap_err();
        assert!(e.contains(want), "{arch} {extra:?}: {e}");
    }
}
