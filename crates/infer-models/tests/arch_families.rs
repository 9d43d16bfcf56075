//! `architecture_for` per family: forward-pass answers against HF transformers semantics, the
//! per-layer Gemma-3 answers, and the canonical tensor keys against the archrefs checkpoints.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use infer_models::arch::{ExpertsPart, QkvLayout, TensorTransform};
use infer_models::hf::open_hf_folder;
use infer_models::{
    architecture_for, Activation, FfnType, ModelArchitecture, ModelConfig, NormType, RopeScaling,
};

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

/// The folder of an archrefs case: `archrefs/CASE`, else `archrefs-next/CASE`.
fn case_dir(case: &str) -> std::path::PathBuf {
    let first = shared().join("archrefs").join(case);
    if first.is_dir() {
        first
    } else {
        shared().join("archrefs-next").join(case)
    }
}

fn arch(case: &str) -> Box<dyn ModelArchitecture> {
    let cfg = ModelConfig::from_hf_file(&case_dir(case).join("config.json"))
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    architecture_for(&cfg).unwrap_or_else(|e| panic!("{case}: {e}"))
}

/// (case, norm, offset, ffn, activation, parallel, pre_attn, post_attn, pre_ffn, post_ffn,
///  qk_norm, qk_whole, learned positions)
type Row = (
    &'static str,
    NormType,
    f32,
    FfnType,
    Activation,
    bool,
    bool,
    bool,
    bool,
    bool,
    bool,
    bool,
    bool,
);

use Activation::{Gelu, GeluTanh, Silu};
use FfnType::{Gated, Standard};
use NormType::{LayerNorm as LN, RmsNorm as RMS};

#[rustfmt::skip]
const FAMILIES: &[Row] = &[
    //  case               norm off  ffn       act       par    preA   postA  preF   postF  qk     whole  pos
    ("llama",            RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("llama-tied-gqa1",  RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("llama3-rope",      RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("mistral-swa",      RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("qwen2",            RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("qwen3",            RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, true,  false, false),
    ("gemma",            RMS, 1.0, Gated,    GeluTanh, false, true,  false, true,  false, false, false, false),
    ("gemma2",           RMS, 1.0, Gated,    GeluTanh, false, true,  true,  true,  true,  false, false, false),
    ("gemma3",           RMS, 1.0, Gated,    GeluTanh, false, true,  true,  true,  true,  true,  false, false),
    ("gemma3-ropescale", RMS, 1.0, Gated,    GeluTanh, false, true,  true,  true,  true,  true,  false, false),
    ("starcoder2",       LN,  0.0, Standard, GeluTanh, false, true,  false, true,  false, false, false, false),
    ("phi3-partial",     RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("gpt_neox",         LN,  0.0, Standard, Gelu,     true,  true,  false, true,  false, false, false, false),
    ("granite",          RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("olmo2",            RMS, 0.0, Gated,    Silu,     false, false, true,  false, true,  true,  true,  false),
    ("gpt2",             LN,  0.0, Standard, GeluTanh, false, true,  false, true,  false, false, false, true),
    ("phi",              LN,  0.0, Standard, GeluTanh, true,  true,  false, false, false, false, false, false),
    ("mixtral",          RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    ("qwen2-moe",        RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
    // ../shared/archrefs-next
    ("qwen3-moe",        RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, true,  false, false),
    ("cohere2",          LN,  0.0, Gated,    Silu,     true,  true,  false, false, false, false, false, false),
    ("gpt-oss",          RMS, 0.0, Gated,    Silu,     false, true,  false, true,  false, false, false, false),
];

#[test]
fn family_answers_match_hf_semantics() {
    for r in FAMILIES {
        let a = arch(r.0);
        let c = r.0;
        assert_eq!(a.norm_type(), r.1, "{c} norm");
        assert_eq!(a.norm_weight_offset(), r.2, "{c} offset");
        assert_eq!(a.ffn_type(), r.3, "{c} ffn");
        assert_eq!(a.activation(), r.4, "{c} act");
        assert_eq!(a.parallel_residual(), r.5, "{c} parallel");
        assert_eq!(a.has_pre_attn_norm(), r.6, "{c} pre attn");
        assert_eq!(a.has_post_attn_norm(), r.7, "{c} post attn");
        assert_eq!(a.has_pre_ffn_norm(), r.8, "{c} pre ffn");
        assert_eq!(a.has_post_ffn_norm(), r.9, "{c} post ffn");
        assert_eq!(a.has_qk_norm(), r.10, "{c} qk norm");
        assert_eq!(a.qk_norm_whole_projection(), r.11, "{c} qk whole");
        assert_eq!(a.has_learned_positions(), r.12, "{c} positions");
        assert!(!a.has_v_norm(), "{c}");
        assert_eq!(a.rope_interleaved(), c == "cohere2", "{c} interleaved RoPE");
        // Keys agree with the flags.
        assert_eq!(a.pre_attn_norm_key(0).is_some(), r.6, "{c}");
        assert_eq!(a.post_attn_norm_key(0).is_some(), r.7, "{c}");
        assert_eq!(a.pre_ffn_norm_key(0).is_some(), r.8, "{c}");
        assert_eq!(a.post_ffn_norm_key(0).is_some(), r.9, "{c}");
        assert_eq!(a.q_norm_key(0).is_some(), r.10, "{c}");
        assert_eq!(a.ffn_gate_key(0).is_some(), r.3 == Gated, "{c}");
    }
}

#[test]
fn scales_multipliers_softcaps() {
    for case in [
        "llama",
        "mistral-swa",
        "qwen2",
        "starcoder2",
        "gpt2",
        "phi",
        "olmo2",
    ] {
        let a = arch(case);
        assert_eq!(a.attention_scale_for_layer(0), 0.25, "{case}: 16^-0.5");
        assert_eq!(a.embedding_scale(), 1.0, "{case}");
        assert_eq!(
            (a.residual_multiplier(), a.logits_divisor()),
            (1.0, 1.0),
            "{case}"
        );
    }
    assert_eq!(arch("qwen3").attention_scale_for_layer(2), 32f64.powf(-0.5));
    assert_eq!(arch("gemma2").attention_scale_for_layer(1), 0.25);
    let g = arch("gemma");
    assert_eq!(g.embedding_scale(), 8.0);
    assert_eq!(g.attention_scale_for_layer(0), 0.25);
    let g2 = arch("gemma2");
    assert_eq!(
        (g2.attn_logit_softcap(), g2.final_logit_softcap()),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(g2.sliding_window_for_layer(0), Some(8));
    assert_eq!(g2.sliding_window_for_layer(1), None);
    let gr = arch("granite");
    assert_eq!(gr.attention_scale_for_layer(0), 0.05);
    assert_eq!(gr.embedding_scale(), 12.0);
    assert_eq!(gr.residual_multiplier(), 0.22);
    assert_eq!(gr.logits_divisor(), 8.0);
    let m = arch("mistral-swa");
    assert!((0..3).all(|l| m.sliding_window_for_layer(l) == Some(8)));
    assert!((0..3).all(|l| arch("llama").sliding_window_for_layer(l).is_none()));
    let l3 = arch("llama3-rope");
    assert!(
        matches!(l3.rope_scaling_for_layer(1), Some(RopeScaling::Llama3 { factor, .. }) if factor == 8.0)
    );
    assert_eq!(l3.rope_base_for_layer(1), 5e5);
    assert_eq!(arch("gpt_neox").rotary_fraction_for_layer(0), 0.25);
    assert_eq!(arch("phi").rotary_fraction_for_layer(0), 0.5);
    assert_eq!(arch("phi3-partial").rotary_fraction_for_layer(0), 0.5);
    assert_eq!(arch("gpt2").rotary_fraction_for_layer(0), 0.0);
    let mx = arch("mixtral");
    assert_eq!(
        (mx.num_experts_for_layer(0), mx.num_experts_per_tok()),
        (4, 2)
    );
    assert!(mx.norm_topk_prob());
    assert_eq!(mx.intermediate_size_for_layer(0), 128);
    let qm = arch("qwen2-moe");
    assert_eq!(qm.intermediate_size_for_layer(0), 64);
    assert_eq!(qm.shared_expert_intermediate_size(), Some(96));
    assert!(!qm.norm_topk_prob());
    assert_eq!(arch("llama").num_experts_for_layer(0), 0);
}

#[test]
fn gemma3_per_layer_answers() {
    let a = arch("gemma3");
    // layer_types: S S F S S F
    let expect = [
        (1e4, Some(8)),
        (1e4, Some(8)),
        (1e6, None),
        (1e4, Some(8)),
        (1e4, Some(8)),
        (1e6, None),
    ];
    for (l, (base, window)) in expect.iter().enumerate() {
        assert_eq!(a.rope_base_for_layer(l), *base, "layer {l} base");
        assert_eq!(a.sliding_window_for_layer(l), *window, "layer {l} window");
        assert_eq!(
            a.attention_scale_for_layer(l),
            32f64.powf(-0.5),
            "layer {l} scale"
        );
        assert_eq!(a.rope_scaling_for_layer(l), None, "layer {l} scaling");
        assert_eq!(a.head_dim_for_layer(l), 32);
    }
    assert_eq!(a.embedding_scale(), 8.0);
    assert_eq!(
        (a.attn_logit_softcap(), a.final_logit_softcap()),
        (None, None)
    );

    let r = arch("gemma3-ropescale");
    // layer_types: S F S F; linear ×8 on full layers only.
    for l in 0..4 {
        let full = l % 2 == 1;
        let scaling = r.rope_scaling_for_layer(l);
        if full {
            assert_eq!(
                scaling,
                Some(RopeScaling::Linear { factor: 8.0 }),
                "layer {l}"
            );
            assert_eq!(r.rope_base_for_layer(l), 1e6);
            assert_eq!(r.sliding_window_for_layer(l), None);
        } else {
            assert_eq!(scaling, None, "layer {l}");
            assert_eq!(r.rope_base_for_layer(l), 1e4);
            assert_eq!(r.sliding_window_for_layer(l), Some(6));
        }
        assert_eq!(r.attention_scale_for_layer(l), 0.25);
    }
}

/// Canonical tensors of a checkpoint: canonical name → shape, after the source transforms.
fn canonical_tensors(case: &str, a: &dyn ModelArchitecture) -> BTreeMap<String, Vec<usize>> {
    let src = open_hf_folder(&case_dir(case)).unwrap();
    let c = a.config();
    let (h, kv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let mut out = BTreeMap::new();
    for info in src.tensors.tensors() {
        let Some(name) = a.canonical_name(&info.name) else {
            continue;
        };
        let s = info.shape.clone();
        let mut put = |n: String, shape: Vec<usize>| {
            assert!(
                out.insert(n.clone(), shape).is_none(),
                "{case}: duplicate {n}"
            );
        };
        let swap = |n: &str, what: &str| n.replacen("qkv_proj", what, 1);
        match a.source_transform(&info.name) {
            TensorTransform::AsIs => put(name, s),
            TensorTransform::Transpose => put(name, s.iter().rev().copied().collect()),
            TensorTransform::SplitQkv(layout) => {
                assert!(name.contains("self_attn.qkv_proj."), "{case}: {name}");
                let is_w = name.ends_with(".weight");
                let rows = |r: usize| {
                    if is_w {
                        vec![r, c.hidden_size]
                    } else {
                        vec![r]
                    }
                };
                let (q, k) = (h * hd, kv * hd);
                let total = match layout {
                    QkvLayout::Conv1dConcat => *s.last().unwrap(),
                    QkvLayout::Concat | QkvLayout::PerHeadInterleaved => s[0],
                };
                assert_eq!(total, q + 2 * k, "{case}: fused rows of {name}");
                if layout == QkvLayout::PerHeadInterleaved {
                    assert_eq!(h, kv, "{case}: interleaved layout assumes MHA");
                }
                put(swap(&name, "q_proj"), rows(q));
                put(swap(&name, "k_proj"), rows(k));
                put(swap(&name, "v_proj"), rows(k));
            }
            TensorTransform::SplitGateUp => {
                assert_eq!(s[0], 2 * c.intermediate_size, "{case}: {name}");
                let half = vec![c.intermediate_size, s[1]];
                put(name.replacen("gate_up_proj", "gate_proj", 1), half.clone());
                put(name.replacen("gate_up_proj", "up_proj", 1), half);
            }
            TensorTransform::SplitExperts(part) => {
                let base = name.rsplit_once("experts.").unwrap().0.to_string();
                for e in 0..s[0] {
                    let at = |p: &str| format!("{base}experts.{e}.{p}");
                    match part {
                        ExpertsPart::GateUp => {
                            put(at("gate_proj.weight"), vec![s[2] / 2, s[1]]);
                            put(at("up_proj.weight"), vec![s[2] / 2, s[1]]);
                        }
                        ExpertsPart::GateUpBias => {
                            put(at("gate_proj.bias"), vec![s[1] / 2]);
                            put(at("up_proj.bias"), vec![s[1] / 2]);
                        }
                        ExpertsPart::Down => put(at("down_proj.weight"), vec![s[2], s[1]]),
                        ExpertsPart::DownBias => put(at("down_proj.bias"), vec![s[1]]),
                        ExpertsPart::Stacked | ExpertsPart::StackedBias => {
                            panic!("{case}: stacked experts come only from GGUF ({name})")
                        }
                    }
                }
            }
        }
    }
    out
}

/// Every key the forward pass reads exists with the expected shape, and every canonical tensor
/// of the checkpoint is read by some key.
#[test]
fn canonical_keys_cover_every_archref_tensor() {
    for r in FAMILIES {
        let case = r.0;
        let a = arch(case);
        let tensors = canonical_tensors(case, a.as_ref());
        let c = a.config().clone();
        let (hid, h, kv, hd) = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        let mut want: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut add = |k: String, s: Vec<usize>| {
            if let Some(prev) = want.insert(k.clone(), s.clone()) {
                assert_eq!(prev, s, "{case}: {k} wanted with two shapes");
            }
        };
        let norm = |add: &mut dyn FnMut(String, Vec<usize>), k: String, n: usize| {
            if let Some(b) = a.norm_bias_key(&k) {
                add(b, vec![n]);
            }
            add(k, vec![n]);
        };
        add(a.embed_key(), vec![c.vocab_size, hid]);
        add(a.lm_head_key(), vec![c.vocab_size, hid]);
        assert_eq!(
            a.lm_head_key() == a.embed_key(),
            c.tie_word_embeddings,
            "{case}"
        );
        if let Some(k) = a.lm_head_bias_key() {
            add(k, vec![c.vocab_size]);
        }
        if let Some(k) = a.position_embed_key() {
            add(k, vec![c.max_position_embeddings, hid]);
        }
        norm(&mut add, a.final_norm_key(), hid);
        for l in 0..a.num_layers() {
            add(a.attn_q_key(l), vec![h * hd, hid]);
            add(a.attn_k_key(l), vec![kv * hd, hid]);
            add(a.attn_v_key(l), vec![kv * hd, hid]);
            add(a.attn_o_key(l), vec![hid, h * hd]);
            for (k, n) in [
                (a.attn_q_bias_key(l), h * hd),
                (a.attn_k_bias_key(l), kv * hd),
                (a.attn_v_bias_key(l), kv * hd),
                (a.attn_o_bias_key(l), hid),
                (a.attn_sinks_key(l), h),
            ] {
                if let Some(k) = k {
                    add(k, vec![n]);
                }
            }
            let whole = a.qk_norm_whole_projection();
            if let Some(k) = a.q_norm_key(l) {
                norm(&mut add, k, if whole { h * hd } else { hd });
            }
            if let Some(k) = a.k_norm_key(l) {
                norm(&mut add, k, if whole { kv * hd } else { hd });
            }
            for k in [
                a.pre_attn_norm_key(l),
                a.post_attn_norm_key(l),
                a.pre_ffn_norm_key(l),
                a.post_ffn_norm_key(l),
            ]
            .into_iter()
            .flatten()
            {
                norm(&mut add, k, hid);
            }
            let inter = a.intermediate_size_for_layer(l);
            let experts = a.num_experts_for_layer(l);
            if experts == 0 {
                if let Some(k) = a.ffn_gate_key(l) {
                    add(k, vec![inter, hid]);
                }
                add(a.ffn_up_key(l), vec![inter, hid]);
                add(a.ffn_down_key(l), vec![hid, inter]);
                for (k, n) in [
                    (a.ffn_gate_bias_key(l), inter),
                    (a.ffn_up_bias_key(l), inter),
                    (a.ffn_down_bias_key(l), hid),
                ] {
                    if let Some(k) = k {
                        add(k, vec![n]);
                    }
                }
            } else {
                add(a.moe_router_key(l).unwrap(), vec![experts, hid]);
                if let Some(k) = a.moe_router_bias_key(l) {
                    add(k, vec![experts]);
                }
                for e in 0..experts {
                    add(a.expert_gate_key(l, e), vec![inter, hid]);
                    add(a.expert_up_key(l, e), vec![inter, hid]);
                    add(a.expert_down_key(l, e), vec![hid, inter]);
                    if let Some([g, u, d]) = a.expert_bias_keys(l, e) {
                        add(g, vec![inter]);
                        add(u, vec![inter]);
                        add(d, vec![hid]);
                    }
                }
                if let Some([g, u, d]) = a.shared_expert_keys(l) {
                    let s = a.shared_expert_intermediate_size().unwrap();
                    add(g, vec![s, hid]);
                    add(u, vec![s, hid]);
                    add(d, vec![hid, s]);
                    add(a.shared_expert_gate_key(l).unwrap(), vec![1, hid]);
                }
            }
        }
        for (k, shape) in &want {
            match tensors.get(k) {
                Some(s) => assert_eq!(s, shape, "{case}: shape of {k}"),
                None => panic!(
                    "{case}: key {k} not in checkpoint; have {:?}",
                    tensors.keys().take(20).collect::<Vec<_>>()
                ),
            }
        }
        let unread: BTreeSet<&String> = tensors.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            unread.is_empty(),
            "{case}: tensors no key reads: {unread:?}"
        );
    }
}

#[test]
fn canonical_names_of_renamed_families() {
    let g = arch("gpt2");
    for (hf, canon) in [
        ("transformer.wte.weight", "model.embed_tokens.weight"),
        ("wte.weight", "model.embed_tokens.weight"),
        ("wpe.weight", "model.embed_positions.weight"),
        (
            "h.1.ln_2.bias",
            "model.layers.1.post_attention_layernorm.bias",
        ),
        (
            "transformer.h.2.mlp.c_proj.weight",
            "model.layers.2.mlp.down_proj.weight",
        ),
        ("transformer.ln_f.weight", "model.norm.weight"),
    ] {
        assert_eq!(g.canonical_name(hf).as_deref(), Some(canon), "{hf}");
    }
    assert_eq!(
        g.canonical_name("h.0.attn.bias"),
        None,
        "causal-mask buffer dropped"
    );
    assert_eq!(
        g.source_transform("h.0.mlp.c_fc.weight"),
        TensorTransform::Transpose
    );
    assert_eq!(
        g.source_transform("h.0.mlp.c_fc.bias"),
        TensorTransform::AsIs
    );
    let n = arch("gpt_neox");
    assert_eq!(
        n.canonical_name("gpt_neox.layers.0.attention.rotary_emb.inv_freq"),
        None
    );
    assert_eq!(
        n.source_transform("gpt_neox.layers.0.attention.query_key_value.weight"),
        TensorTransform::SplitQkv(QkvLayout::PerHeadInterleaved)
    );
    let m = arch("mixtral");
    assert_eq!(
        m.canonical_name("model.layers.1.block_sparse_moe.experts.3.w3.weight")
            .as_deref(),
        Some("model.layers.1.mlp.experts.3.up_proj.weight")
    );
    let g3 = arch("gemma3");
    assert_eq!(
        g3.canonical_name("language_model.model.layers.0.self_attn.q_norm.weight")
            .as_deref(),
        Some("model.layers.0.self_attn.q_norm.weight")
    );
    assert_eq!(
        g3.canonical_name("vision_tower.vision_model.embeddings.patch_embedding.weight"),
        None
    );
    // Llama-named families are identity.
    let l = arch("llama");
    assert_eq!(
        l.canonical_name("model.layers.0.mlp.gate_proj.weight")
            .as_deref(),
        Some("model.layers.0.mlp.gate_proj.weight")
    );
}

#[test]
fn pre_ffn_norm_trap() {
    // Llama: post_attention_layernorm IS the pre-FFN norm.
    let l = arch("llama");
    assert_eq!(
        l.pre_ffn_norm_key(1).as_deref(),
        Some("model.layers.1.post_attention_layernorm.weight")
    );
    assert_eq!(l.post_attn_norm_key(1), None);
    // Gemma-2/3: post_attention_layernorm is the post-attention norm.
    for case in ["gemma2", "gemma3"] {
        let g = arch(case);
        assert_eq!(
            g.post_attn_norm_key(1).as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(
            g.pre_ffn_norm_key(1).as_deref(),
            Some("model.layers.1.pre_feedforward_layernorm.weight")
        );
    }
}

#[test]
fn inconsistent_config_is_an_error_not_a_panic() {
    let mut cfg = arch("gemma3").config().clone();
    cfg.layer_types.pop();
    let err = architecture_for(&cfg).err().expect("short layer_types");
    assert!(err.contains("layer_types"), "{err}");
    let mut cfg = arch("llama").config().clone();
    cfg.hidden_act = "relu6".into();
    assert!(architecture_for(&cfg).err().unwrap().contains("relu6"));
}
