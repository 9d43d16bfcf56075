//! Shared test helpers: data locations, an in-memory `TensorSource`, and the round-trip check.
#![allow(dead_code)]

use std::path::PathBuf;

use half::f16;
use infer_models::arch::{ExpertsPart, QkvLayout, TensorTransform};
use infer_models::{
    ModelConfig, ModelError, ModelSource, SourceKind, Tensor, TensorInfo, TensorSource,
};
use infer_quant::QuantFormat;
use infer_vindex::classify::{classify, Role};
use infer_vindex::{Dtype, FloatSlice, Vindex};

/// `$INFER_SHARED`, default `<workspace>/../shared`. Panics with a clear message when missing.
pub fn shared_dir() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        p.is_dir(),
        "shared test data not found at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

/// A model file under `$INFER_MODELS` (default `~/.cache/infer/models`); panics when missing.
pub fn model_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("INFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/infer/models")
        });
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "model {} not found (set INFER_MODELS; fetch per shared/models/README.md)",
        p.display()
    );
    p
}

/// In-memory tensors. `fail_after` makes `read_f32` fail after that many reads (to test
/// interrupted builds).
pub struct MockTensors {
    pub infos: Vec<TensorInfo>,
    pub data: Vec<Vec<f32>>,
    pub fail_after: Option<usize>,
    pub reads: std::sync::atomic::AtomicUsize,
}

impl TensorSource for MockTensors {
    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }
    fn read_f32(&self, name: &str) -> Result<Tensor, ModelError> {
        let n = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail_after.is_some_and(|f| n >= f) {
            return Err(ModelError::BadTensor {
                path: "mock".into(),
                name: name.into(),
                msg: "simulated read failure".into(),
            });
        }
        let i = self
            .infos
            .iter()
            .position(|t| t.name == name)
            .ok_or(ModelError::NoSuchTensor {
                path: "mock".into(),
                name: name.into(),
            })?;
        Ok(Tensor {
            shape: self.infos[i].shape.clone(),
            data: self.data[i].clone(),
        })
    }
}

/// Dimensions of a mock Llama-style model.
pub struct MockDims {
    pub vocab: usize,
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub tied: bool,
}

pub fn mock_config(d: &MockDims) -> ModelConfig {
    serde_json::from_value(serde_json::json!({
        "model_type": "llama", "hidden_size": d.hidden, "intermediate_size": d.inter,
        "num_hidden_layers": d.layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": d.hidden / 4, "vocab_size": d.vocab, "max_position_embeddings": 128,
        "norm_eps": 1e-5, "rope_theta": 1e4, "rope_local_theta": null, "rope_scaling": null,
        "partial_rotary_factor": 1.0, "sliding_window": null,
        "layer_types": vec!["full"; d.layers], "hidden_act": "silu",
        "tie_word_embeddings": d.tied, "attention_bias": true, "mlp_bias": false,
        "query_pre_attn_scalar": null, "attn_logit_softcapping": null,
        "final_logit_softcapping": null, "embedding_multiplier": null,
        "attention_multiplier": null, "residual_multiplier": null, "logits_scaling": null,
        "use_parallel_residual": false, "num_experts": 0, "num_experts_per_tok": 0,
        "moe_intermediate_size": null, "shared_expert_intermediate_size": null,
        "norm_topk_prob": false, "bos_token_id": 1, "eos_token_ids": [2], "pad_token_id": null
    }))
    .expect("mock config")
}

/// Deterministic pseudo-random values covering many exponents, plus values that f16 rounds.
fn values(seed: usize, n: usize) -> Vec<f32> {
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 2f32.powi(((x >> 8) % 9) as i32 - 4)
        })
        .collect()
}

/// A minimal HF tokenizer.json (4 ids) that the mock sources carry.
pub const MOCK_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"<unk>":0,"<s>":1,"</s>":2,"a":3},"unk_token":"<unk>"}}"#;

/// A mock Llama-style source: embeddings, per layer q/k/v/o (+ q/k/v biases, q/k norms),
/// two norms, gate/up/down, one unclassifiable tensor per layer; final norm; lm_head unless tied;
/// one global "other" tensor.
pub fn mock_source(d: &MockDims) -> ModelSource {
    let (h, i, v) = (d.hidden, d.inter, d.vocab);
    let mut t: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.q_proj.bias", vec![h]),
            ("self_attn.k_proj.weight", vec![h / 2, h]),
            ("self_attn.k_proj.bias", vec![h / 2]),
            ("self_attn.v_proj.weight", vec![h / 2, h]),
            ("self_attn.v_proj.bias", vec![h / 2]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("self_attn.q_norm.weight", vec![h / 4]),
            ("self_attn.k_norm.weight", vec![h / 4]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
            ("mlp.router.weight", vec![3, h]),
        ] {
            t.push((format!("{p}.{n}"), s));
        }
    }
    t.push(("model.norm.weight".into(), vec![h]));
    if !d.tied {
        t.push(("lm_head.weight".into(), vec![v, h]));
    }
    t.push(("model.extra_scalar".into(), vec![1]));
    let infos: Vec<TensorInfo> = t
        .iter()
        .map(|(name, shape)| TensorInfo {
            name: name.clone(),
            shape: shape.clone(),
            dtype: QuantFormat::F32,
            bytes: shape.iter().product::<usize>() * 4,
        })
        .collect();
    let data = infos
        .iter()
        .enumerate()
        .map(|(k, ti)| values(k + 1, ti.shape.iter().product()))
        .collect();
    let dir = std::env::temp_dir();
    ModelSource {
        path: dir,
        kind: SourceKind::HfFolder,
        config: mock_config(d),
        tensors: Box::new(MockTensors {
            infos,
            data,
            fail_after: None,
            reads: Default::default(),
        }),
        tokenizer_json: Some(MOCK_TOKENIZER.into()),
        tokenizer_config_json: Some(r#"{"bos_token":"<s>"}"#.into()),
        chat_template: Some("{{ messages }}".into()),
        gguf: None,
    }
}

/// Row-major transpose of `[rows, cols]`.
pub fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// A stored tensor widened to f32 in HF orientation (down_proj transposed back to
/// `[hidden, intermediate]`), with its shape and stored format.
fn fetch(v: &Vindex, key: &str, shape: &[usize]) -> (Vec<f32>, Vec<usize>, QuantFormat) {
    let place = classify(key, shape);
    let layer = place.layer.filter(|&l| l < v.num_layers());
    let (s, shp): (FloatSlice<'_>, Vec<usize>) = match (place.role, layer) {
        (Role::Embedding, _) => {
            let (s, sh) = v.embeddings();
            (s, sh.to_vec())
        }
        (Role::LmHead, _) => {
            let (s, sh) = v
                .lm_head()
                .unwrap_or_else(|| panic!("{key}: lm_head not stored"));
            (s, sh.to_vec())
        }
        (Role::FfnGate, Some(l)) => (
            v.gate_layer(l).unwrap(),
            v.entry(key).unwrap().1.shape.clone(),
        ),
        (Role::FfnUp, Some(l)) => (
            v.up_layer(l).unwrap(),
            v.entry(key).unwrap().1.shape.clone(),
        ),
        (Role::FfnDown, Some(l)) => {
            let sh = v.entry(key).unwrap().1.shape.clone(); // [I, H]
            let s = v.down_layer(l).unwrap();
            let back = transpose(&s.to_f32_vec(), sh[0], sh[1]);
            return (back, vec![sh[1], sh[0]], s.format());
        }
        _ => {
            let (s, sh) = v.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
            (s, sh.to_vec())
        }
    };
    (s.to_f32_vec(), shp, s.format())
}

/// `got` (stored, widened) equals `want` bit for bit, after f16 rounding when stored as f16; the
/// stored format is f16 exactly for matrices of an f16 vindex.
fn assert_values(what: &str, got: &[f32], fmt: QuantFormat, want: &[f32], want_f16: bool) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert_eq!(fmt == QuantFormat::F16, want_f16, "{what}: stored as {fmt}");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        let b = if want_f16 {
            f16::from_f32(*b).to_f32()
        } else {
            *b
        };
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what}[{k}]: stored {a}, expected {b}"
        );
    }
}

/// Every source tensor, read back through the API, equals the source bit for bit (f32 tier) or
/// its f16 rounding (f16 tier, matrices; 1-D tensors stay f32). Tensors the architecture
/// transforms at extract time (GPT-2 Conv1D, fused qkv / gate_up) are reassembled from their
/// stored parts and compared with the source. Also checks that nothing else is stored.
/// Returns the number of source tensors compared.
pub fn assert_roundtrip(src: &ModelSource, v: &Vindex) -> usize {
    let arch = infer_models::architecture_for(&src.config).expect("architecture");
    let f16_tier = v.dtype() == Dtype::F16;
    let (mut n, mut stored) = (0, 0);
    for info in src.tensors.tensors() {
        let Some(key) = arch.canonical_name(&info.name) else {
            continue;
        };
        let t = src
            .tensors
            .read_f32(&info.name)
            .expect("source tensor readable");
        let want_f16 = f16_tier && info.shape.len() >= 2;
        let what = format!("{} ({key})", info.name);
        match arch.source_transform(&info.name) {
            TensorTransform::AsIs => {
                let (got, shape, fmt) = fetch(v, &key, &info.shape);
                assert_eq!(shape, info.shape, "{what}: shape");
                assert_values(&what, &got, fmt, &t.data, want_f16);
                stored += 1;
            }
            TensorTransform::Transpose => {
                let (got, shape, fmt) = fetch(v, &key, &info.shape);
                let want = match info.shape[..] {
                    [r, c] => {
                        assert_eq!(shape, vec![c, r], "{what}: shape");
                        transpose(&t.data, r, c)
                    }
                    _ => t.data.clone(),
                };
                assert_values(&what, &got, fmt, &want, want_f16);
                stored += 1;
            }
            TensorTransform::SplitQkv(layout) => {
                let parts: Vec<_> = ["q_proj", "k_proj", "v_proj"]
                    .iter()
                    .map(|p| fetch(v, &key.replacen("qkv_proj", p, 1), &[0, 0]))
                    .collect();
                let fmt = parts[0].2;
                let cols = parts[0].1.get(1).copied().unwrap_or(1);
                let joined: Vec<f32> = match layout {
                    QkvLayout::PerHeadInterleaved => {
                        let block = src.config.head_dim * cols;
                        let heads = src.config.num_attention_heads;
                        (0..heads)
                            .flat_map(|h| {
                                parts
                                    .iter()
                                    .flat_map(move |p| p.0[h * block..(h + 1) * block].to_vec())
                            })
                            .collect()
                    }
                    _ => parts.iter().flat_map(|p| p.0.clone()).collect(),
                };
                let want = match (layout, &info.shape[..]) {
                    (QkvLayout::Conv1dConcat, [c, r]) => transpose(&t.data, *c, *r),
                    _ => t.data.clone(),
                };
                assert_values(&what, &joined, fmt, &want, want_f16);
                stored += 3;
            }
            TensorTransform::SplitGateUp => {
                let g = fetch(v, &key.replacen("gate_up_proj", "gate_proj", 1), &[0, 0]);
                let u = fetch(v, &key.replacen("gate_up_proj", "up_proj", 1), &[0, 0]);
                let joined: Vec<f32> = g.0.iter().chain(&u.0).copied().collect();
                assert_values(&what, &joined, g.2, &t.data, want_f16);
                stored += 2;
            }
            TensorTransform::SplitExperts(part) => {
                // gpt-oss: expert e's stored Linear matrices / biases put back into the fused
                // `[E, hidden, 2·inter]` (gate even, up odd columns) / `[E, inter, hidden]`
                // layouts, or the biases `[E, 2·inter]` / `[E, hidden]`.
                let (e, fmt_of) = (info.shape[0], |k: &str| fetch(v, k, &[0, 0]));
                let base = key.rsplit_once("experts.").expect("fused experts key").0;
                let mut joined = vec![0f32; t.data.len()];
                let mut fmt = QuantFormat::F32;
                for ex in 0..e {
                    let at = |p: &str| format!("{base}experts.{ex}.{p}");
                    match (part, &info.shape[..]) {
                        (ExpertsPart::GateUp, &[_, h, two_i]) => {
                            for (parity, p) in
                                ["gate_proj.weight", "up_proj.weight"].iter().enumerate()
                            {
                                let (w, shape, f) = fmt_of(&at(p));
                                assert_eq!(shape, vec![two_i / 2, h], "{what}: {p}");
                                fmt = f;
                                for f in 0..two_i / 2 {
                                    for r in 0..h {
                                        joined[ex * h * two_i + r * two_i + 2 * f + parity] =
                                            w[f * h + r];
                                    }
                                }
                            }
                        }
                        (ExpertsPart::GateUpBias, &[_, two_i]) => {
                            for (parity, p) in ["gate_proj.bias", "up_proj.bias"].iter().enumerate()
                            {
                                let (b, _, _) = fmt_of(&at(p));
                                for (f, &x) in b.iter().enumerate() {
                                    joined[ex * two_i + 2 * f + parity] = x;
                                }
                            }
                        }
                        (ExpertsPart::Down, &[_, i, h]) => {
                            let (w, shape, f) = fmt_of(&at("down_proj.weight"));
                            assert_eq!(shape, vec![h, i], "{what}: down");
                            fmt = f;
                            let back = transpose(&w, h, i);
                            joined[ex * i * h..(ex + 1) * i * h].copy_from_slice(&back);
                        }
                        (ExpertsPart::DownBias, &[_, h]) => {
                            let (b, _, _) = fmt_of(&at("down_proj.bias"));
                            joined[ex * h..(ex + 1) * h].copy_from_slice(&b);
                        }
                        // A GGUF's stacked experts: expert e's slice as is.
                        (ExpertsPart::Stacked, &[_, r, c]) => {
                            let proj = key.rsplit_once("experts.stacked_").unwrap().1;
                            let (w, shape, f) = fmt_of(&at(&format!("{proj}.weight")));
                            assert_eq!(shape, vec![r, c], "{what}");
                            fmt = f;
                            joined[ex * r * c..(ex + 1) * r * c].copy_from_slice(&w);
                        }
                        (ExpertsPart::StackedBias, &[_, n]) => {
                            let proj = key.rsplit_once("experts.stacked_").unwrap().1;
                            let proj = proj.strip_suffix("_bias").unwrap();
                            let (b, _, _) = fmt_of(&at(&format!("{proj}.bias")));
                            joined[ex * n..(ex + 1) * n].copy_from_slice(&b);
                        }
                        _ => panic!("{what}: fused experts of shape {:?}", info.shape),
                    }
                }
                // The per-expert biases are 1-D (f32 in every tier), the matrices follow it.
                let matrices = matches!(
                    part,
                    ExpertsPart::GateUp | ExpertsPart::Down | ExpertsPart::Stacked
                );
                assert_values(&what, &joined, fmt, &t.data, f16_tier && matrices);
                stored += match part {
                    ExpertsPart::GateUp | ExpertsPart::GateUpBias => 2 * e,
                    _ => e,
                };
            }
        }
        n += 1;
    }
    assert_eq!(
        v.keys().count(),
        stored,
        "vindex holds exactly the source's tensors"
    );
    n
}
