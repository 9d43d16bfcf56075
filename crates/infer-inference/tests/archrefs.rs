//! Every archrefs case (Llama and Gemma-3 first) against HF transformers (float64 reference stored as f32):
//! full-sequence logits and per-layer hidden states within 1e-4 × std of the reference, and
//! KV-cache decode equal to full recomputation (the reference's greedy `generated` tokens).

mod common;

use common::*;
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::{AttnChoice, FfnChoice, FormatRequest, LmHeadChoice, Model};
use infer_vindex::Vindex;

/// Relative tolerance: max |Δ| ≤ TOL × std(reference).
const TOL: f64 = 1e-4;

/// The float tier only: f32 attention, walk FFN, float lm_head.
const FLOAT: FormatRequest = FormatRequest {
    attn: AttnChoice::F32,
    ffn: FfnChoice::Walk,
    lm_head: LmHeadChoice::F32,
};

/// The default quantized plan against the reference: cosine similarity of all logits and
/// top-1 agreement over positions (random tiny models have tiny margins, so these are reported;
/// asserted only finite and cosine > 0.9).
fn report_quantized(case: &str, vindex: &Vindex, r: &StFile) -> Vec<f32> {
    let model = Model::from_vindex(vindex).expect("quantized model");
    let backend = CpuBackend::new();
    let shape = r.shape("input_ids");
    let (batch, t) = (shape[0], shape[1]);
    let ids = r.i64_as_u32("input_ids");
    let reference = r.f32("logits");
    let vocab = model.vocab_size;
    let (mut dot, mut na, mut nb, mut agree) = (0f64, 0f64, 0f64, 0usize);
    let mut all = Vec::new();
    for b in 0..batch {
        let mut cache = model.new_cache(t);
        let logits = model
            .forward(&backend, &ids[b * t..(b + 1) * t], &mut cache, Logits::All)
            .expect("forward");
        all.extend_from_slice(&logits);
        let refl = &reference[b * t * vocab..(b + 1) * t * vocab];
        for (x, y) in logits.iter().zip(refl) {
            dot += *x as f64 * *y as f64;
            na += (*x as f64).powi(2);
            nb += (*y as f64).powi(2);
        }
        for pos in 0..t {
            let row = pos * vocab..(pos + 1) * vocab;
            agree += (infer_inference::sampling::argmax(&logits[row.clone()])
                == infer_inference::sampling::argmax(&refl[row])) as usize;
        }
    }
    let cosine = dot / (na.sqrt() * nb.sqrt());
    println!(
        "{case} quantized ({}): logits cosine {cosine:.5}, top-1 agreement {agree}/{}",
        model.plan,
        batch * t
    );
    assert!(
        cosine.is_finite() && cosine > 0.9,
        "{case}: quantized cosine {cosine}"
    );
    // MoE: every expert runs from the quantized FFN tier, within cosine 0.99 of the f32 logits.
    if model.arch.num_experts_for_layer(0) > 0 {
        assert!(
            model
                .layers
                .iter()
                .all(|l| l.ffn_path == infer_inference::FfnPath::MoeQuantized),
            "{case}: MoE layers not on the quantized tier"
        );
        assert!(
            cosine >= 0.99,
            "{case}: quantized MoE cosine {cosine} < 0.99"
        );
    }
    all
}

/// Logits of both sequences of the reference's `input_ids` under `request`.
fn logits_with(vindex: &Vindex, request: &FormatRequest, r: &StFile) -> Vec<f32> {
    let model = Model::from_vindex_with(vindex, request).expect("model");
    let backend = CpuBackend::new();
    let shape = r.shape("input_ids");
    let (batch, t) = (shape[0], shape[1]);
    let ids = r.i64_as_u32("input_ids");
    let mut all = Vec::new();
    for b in 0..batch {
        let mut cache = model.new_cache(t);
        let logits = model
            .forward(&backend, &ids[b * t..(b + 1) * t], &mut cache, Logits::All)
            .expect("forward");
        all.extend_from_slice(&logits);
    }
    all
}

/// The vindex without a float tier (`--float none`, the CLI default): it opens with the q4k
/// tier only, its default plan stays close to the reference (as [`report_quantized`]), and
/// the walk FFN over its quantized rows (`--ffn walk`) equals its quantized dense FFN (the
/// same rows and products; only the activation's approximation differs) within 1e-4 × std.
fn check_quantized_only(case: &str, dir: &std::path::Path, r: &StFile) {
    let path = archrefs_quantized_only(case, dir);
    let v = Vindex::open(&path).expect("open quantized-only vindex");
    assert_eq!(v.tiers(), &[infer_vindex::Tier::Q4K], "{case}: tiers");
    let dense = report_quantized(&format!("{case} without a float tier"), &v, r);
    let walk = FormatRequest {
        ffn: FfnChoice::Walk,
        ..Default::default()
    };
    let walked = logits_with(&v, &walk, r);
    let (d, s) = (max_abs_diff(&walked, &dense), std_dev(&dense));
    println!(
        "{case}: walk over quantized rows vs dense quantized FFN: max|Δ| {d:.3e} (std {s:.3e})"
    );
    assert!(
        d <= TOL * s,
        "{case}: quantized walk vs dense: {d:e} > {TOL} × {s:e}"
    );
}

fn check_case(case: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    // The f32 tier plus the default quantized tier (q4k), which is reported at the end.
    let (dir, vpath) = archrefs_q4k(case, tmp.path());
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let r = StFile::open(&dir.join("reference.safetensors"));
    check_float_path(case, &vindex, &r);
    report_quantized(case, &vindex, &r);
    check_quantized_only(case, tmp.path(), &r);
}

/// The float tier of `vindex` against the reference `r`: every hidden state and the logits of
/// both sequences within `TOL × std`, KV-cache decode (half prefilled, then one token at a
/// time) at every position, and the greedy continuation `generated`.
fn check_float_path(case: &str, vindex: &Vindex, r: &StFile) {
    let model = Model::from_vindex_with(vindex, &FLOAT).expect("model");
    let backend = CpuBackend::new();
    let ids_shape = r.shape("input_ids");
    let (batch, t) = (ids_shape[0], ids_shape[1]);
    let ids = r.i64_as_u32("input_ids");
    let ref_logits = r.f32("logits");
    let vocab = model.vocab_size;
    let h = model.hidden_size;
    let n_hidden = (0..)
        .take_while(|i| r.has(&format!("hidden_states.{i}")))
        .count();
    assert_eq!(
        n_hidden,
        model.layers.len() + 1,
        "{case}: hidden-state count"
    );

    for b in 0..batch {
        let seq = &ids[b * t..(b + 1) * t];
        let mut cache = model.new_cache(t);
        let (logits, hidden) = model
            .forward_with_hidden(&backend, seq, &mut cache, Logits::All)
            .expect("forward");
        for (i, hs) in hidden.iter().enumerate() {
            let reference = r.f32(&format!("hidden_states.{i}"));
            let reference = &reference[b * t * h..(b + 1) * t * h];
            let d = max_abs_diff(hs, reference);
            let s = std_dev(reference);
            println!("{case} seq {b} hidden {i}: max|Δ| {d:.3e} (std {s:.3e})");
            assert!(
                d <= TOL * s,
                "{case} seq {b} hidden_states.{i}: max|Δ| {d:e} > {TOL} × std {s:e}"
            );
        }
        let reference = &ref_logits[b * t * vocab..(b + 1) * t * vocab];
        let d = max_abs_diff(&logits, reference);
        let s = std_dev(reference);
        println!(
            "{case} seq {b} logits: max|Δ| {d:.3e} (std {s:.3e}, ratio {:.2e})",
            d / s
        );
        assert!(
            d <= TOL * s,
            "{case} seq {b} logits: max|Δ| {d:e} > {TOL} × std {s:e}"
        );
    }

    // KV-cache decode: prefill half of sequence 0, then one token at a time; each step's logits
    // must match the full-sequence reference at that position.
    let seq = &ids[..t];
    let reference = &ref_logits[..t * vocab];
    let s = std_dev(reference);
    let mut cache = model.new_cache(t + 8);
    let half = t / 2;
    let mut last = model
        .forward(&backend, &seq[..half], &mut cache, Logits::Last)
        .expect("prefill");
    for pos in half..t {
        let d = max_abs_diff(&last, &reference[(pos - 1) * vocab..pos * vocab]);
        assert!(
            d <= TOL * s,
            "{case}: decode logits at position {} differ by {d:e}",
            pos - 1
        );
        last = model
            .forward(&backend, &seq[pos..pos + 1], &mut cache, Logits::Last)
            .expect("decode");
    }
    let d = max_abs_diff(&last, &reference[(t - 1) * vocab..]);
    assert!(
        d <= TOL * s,
        "{case}: decode logits at the last position differ by {d:e}"
    );

    // Greedy continuation with the KV cache reproduces `generated`.
    let generated = r.i64_as_u32("generated");
    let mut cache = model.new_cache(generated.len());
    let mut logits = model
        .forward(&backend, seq, &mut cache, Logits::Last)
        .expect("prefill");
    for (step, &want) in generated[t..].iter().enumerate() {
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let margin = (sorted[0] - sorted[1]) as f64;
        let got = infer_inference::sampling::argmax(&logits);
        if margin < 1e-3 * s {
            println!(
                "{case}: greedy step {step}: margin {margin:e} too small to compare; stopping"
            );
            break;
        }
        assert_eq!(got, want, "{case}: greedy token {step}");
        logits = model
            .forward(&backend, &[got], &mut cache, Logits::Last)
            .expect("decode");
    }
}

#[test]
fn llama_matches_hf() {
    check_case("llama");
}

#[test]
fn gemma3_matches_hf() {
    check_case("gemma3");
}

/// Qwen3-MoE (`../shared/archrefs-next/qwen3-moe`): Qwen3 attention with per-head q/k norm and
/// 8 experts top-2 with `norm_topk_prob`, on the float path and (cosine ≥ 0.99) quantized.
#[test]
fn qwen3_moe_matches_hf() {
    check_case("qwen3-moe");
}

/// MoE decode through the operations a device backend routes with (`moe_route`,
/// `project_routed`, `combine_routed`: `CpuBackend::with_moe_routing_ops`, which a CUDA run
/// takes without a host round trip) on the float tier: Mixtral, Qwen3-MoE and Qwen2-MoE (its
/// shared expert under the gate, `add_gated`), half of sequence 0 prefilled, then one token at
/// a time, each step's logits within `TOL × std` of HF's.
#[test]
fn moe_decode_through_routing_operations_matches_hf() {
    for case in ["mixtral", "qwen3-moe", "qwen2-moe"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (dir, vpath) = archrefs_q4k(case, tmp.path());
        let vindex = Vindex::open(&vpath).expect("open vindex");
        let r = StFile::open(&dir.join("reference.safetensors"));
        let model = Model::from_vindex_with(&vindex, &FLOAT).expect("model");
        let backend = CpuBackend::new().with_moe_routing_ops();
        let t = r.shape("input_ids")[1];
        let ids = r.i64_as_u32("input_ids");
        let vocab = model.vocab_size;
        let reference = &r.f32("logits")[..t * vocab];
        let s = std_dev(reference);
        let mut cache = model.new_cache(t);
        let half = t / 2;
        let mut last = model
            .forward(&backend, &ids[..half], &mut cache, Logits::Last)
            .expect("prefill");
        for pos in half..=t {
            let d = max_abs_diff(&last, &reference[(pos - 1) * vocab..pos * vocab]);
            println!(
                "{case} routed decode at {}: max|Δ| {d:.3e} (std {s:.3e})",
                pos - 1
            );
            assert!(
                d <= TOL * s,
                "{case}: routed decode logits at position {} differ by {d:e}",
                pos - 1
            );
            if pos < t {
                last = model
                    .forward(&backend, &ids[pos..pos + 1], &mut cache, Logits::Last)
                    .expect("decode");
            }
        }
    }
}

/// Cohere-2 (`../shared/archrefs-next/cohere2`): parallel attention + FFN from one bias-free
/// LayerNorm, interleaved RoPE on the three sliding layers (window 8), a global layer without
/// RoPE, tied embeddings, `logit_scale` 0.25.
#[test]
fn cohere2_matches_hf() {
    check_case("cohere2");
}

/// Write an f32 GGUF of llama.cpp architecture `arch` at `path`: `metadata` (plus llama.cpp's
/// `none` vocabulary: the archrefs checkpoints have none) and `tensors` given by HF name and
/// HF (row-major) shape, stored under llama.cpp's names (`infer_models::names`) with dims
/// fastest-first.
fn write_f32_gguf(
    path: &std::path::Path,
    arch: &str,
    mut metadata: Vec<(String, infer_models::gguf::GgufValue)>,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
) {
    use infer_models::gguf::{GgufHeader, GgufTensorInfo, GgufValue, GgufWriter};
    metadata.push((
        "tokenizer.ggml.model".into(),
        GgufValue::String("none".into()),
    ));
    let align = 32usize;
    let (mut infos, mut data, mut offset) = (Vec::new(), Vec::new(), 0usize);
    for (hf, shape, values) in tensors {
        let name = infer_models::names::hf_to_gguf_name(arch, &hf)
            .unwrap_or_else(|| panic!("no GGUF name for {hf}"));
        assert_eq!(values.len(), shape.iter().product::<usize>(), "{hf}");
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        infos.push(GgufTensorInfo {
            name,
            dims: shape.iter().rev().copied().collect(),
            format: infer_quant::QuantFormat::F32,
            offset,
            n_bytes: bytes.len(),
        });
        offset = (offset + bytes.len()).div_ceil(align) * align;
        data.push(bytes);
    }
    let header = GgufHeader {
        version: 3,
        metadata,
        tensors: infos,
        alignment: align,
    };
    let mut w = GgufWriter::new(std::fs::File::create(path).unwrap(), &header, path).unwrap();
    for d in &data {
        w.write_data(d).unwrap();
    }
    w.finish().unwrap();
}

/// Extract the GGUF at `path` (f32 and q4k tiers) and check it against the HF reference of
/// archrefs case `case`: its config equals the checkpoint's in every field GGUF holds (the
/// token ids aside: no vocabulary), and the float path as [`check_case`] checks it.
fn check_gguf(case: &str, path: &std::path::Path, dir: &std::path::Path) {
    let src = infer_models::open_source(&archrefs_case_dir(case)).expect("open case");
    let vpath = extract_with(
        path,
        dir,
        &format!("{case}-gguf"),
        "f32",
        None,
        infer_vindex::QuantTiers::Q4K,
    );
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let mut want = src.config.clone();
    (want.bos_token_id, want.eos_token_ids, want.pad_token_id) = (None, vec![], None);
    assert_eq!(vindex.config(), &want, "{case} config through GGUF");
    let r = StFile::open(&archrefs_case_dir(case).join("reference.safetensors"));
    let label = format!("{case} (GGUF)");
    check_float_path(&label, &vindex, &r);
    report_quantized(&label, &vindex, &r);
}

/// The HF tensors of archrefs case `case` (name, shape, values).
fn hf_tensors(case: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let src = infer_models::open_source(&archrefs_case_dir(case)).expect("open case");
    src.tensors
        .tensors()
        .iter()
        .map(|i| {
            let t = src.tensors.read_f32(&i.name).expect("read");
            (i.name.clone(), t.shape, t.data)
        })
        .collect()
}

/// Cohere-2 through GGUF: the HF checkpoint written as a llama.cpp `cohere2` GGUF (the metadata
/// `infer export` writes: `cohere2.logit_scale`, `attention.layer_norm_epsilon`,
/// `attention.sliding_window`, the pattern of 4 implied; llama.cpp's tensor names, f32),
/// extracted and run: the same checks against HF as the safetensors path.
#[test]
fn cohere2_from_gguf_matches_hf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = infer_models::open_source(&archrefs_case_dir("cohere2")).expect("open cohere2");
    let metadata =
        infer_models::gguf::model_metadata(&src.config, "cohere2").expect("cohere2 GGUF metadata");
    let path = tmp.path().join("cohere2.gguf");
    write_f32_gguf(&path, "cohere2", metadata, hf_tensors("cohere2"));
    check_gguf("cohere2", &path, tmp.path());
}

/// gpt-oss through GGUF, laid out as llama.cpp's `convert_hf_to_gguf.py` writes a checkpoint
/// whose experts are not MXFP4: `gpt-oss.*` keys (experts, YaRN `rope.scaling.*`, sliding
/// window; pattern 2 implied), `attn_sinks`, `post_attention_norm`, `ffn_gate_inp` (+ bias),
/// and each projection's experts stacked as `ffn_{gate,up,down}_exps` (gate and up the even and
/// odd columns of `gate_up_proj`, transposed to `[E, inter, hidden]`; down transposed to
/// `[E, hidden, inter]`) with their biases. Extracted and run against HF as the safetensors
/// path. (Real gpt-oss GGUFs store these experts as MXFP4, which infer does not read.)
#[test]
fn gpt_oss_from_gguf_matches_hf() {
    use infer_models::gguf::GgufValue;
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = infer_models::open_source(&archrefs_case_dir("gpt-oss"))
        .expect("open gpt-oss")
        .config;
    let Some(infer_models::RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        ..
    }) = c.rope_scaling
    else {
        panic!("gpt-oss: no YaRN");
    };
    let u = |k: &str, v: usize| (format!("gpt-oss.{k}"), GgufValue::U32(v as u32));
    let f = |k: &str, v: f64| (format!("gpt-oss.{k}"), GgufValue::F32(v as f32));
    let metadata = vec![
        (
            "general.architecture".to_string(),
            GgufValue::String("gpt-oss".into()),
        ),
        u("block_count", c.num_hidden_layers),
        u("context_length", c.max_position_embeddings),
        u("embedding_length", c.hidden_size),
        u("feed_forward_length", c.intermediate_size),
        u("attention.head_count", c.num_attention_heads),
        u("attention.head_count_kv", c.num_key_value_heads),
        f("rope.freq_base", c.rope_theta),
        f("attention.layer_norm_rms_epsilon", c.norm_eps),
        u("expert_count", c.num_experts),
        u("expert_used_count", c.num_experts_per_tok),
        u("attention.key_length", c.head_dim),
        u("attention.value_length", c.head_dim),
        (
            "gpt-oss.rope.scaling.type".into(),
            GgufValue::String("yarn".into()),
        ),
        f("rope.scaling.factor", factor),
        u(
            "rope.scaling.original_context_length",
            original_max_position_embeddings,
        ),
        u("attention.sliding_window", c.sliding_window.unwrap()),
        u("expert_feed_forward_length", c.intermediate_size),
    ];
    let mut tensors = Vec::new();
    let stem_down = |n: &str| n.replace("down_proj", "stacked_down_proj");
    for (name, shape, d) in hf_tensors("gpt-oss") {
        let stem = |p: &str| name.replace("gate_up_proj", &format!("stacked_{p}"));
        match (name.rsplit_once("mlp.experts.").map(|x| x.1), &shape[..]) {
            (Some("gate_up_proj"), &[e, h, two_i]) => {
                let i = two_i / 2;
                for (parity, p) in ["gate_proj", "up_proj"].iter().enumerate() {
                    let mut out = vec![0f32; e * i * h];
                    for ex in 0..e {
                        for fe in 0..i {
                            for r in 0..h {
                                out[(ex * i + fe) * h + r] =
                                    d[(ex * h + r) * two_i + 2 * fe + parity];
                            }
                        }
                    }
                    tensors.push((stem(p), vec![e, i, h], out));
                }
            }
            (Some("gate_up_proj_bias"), &[e, two_i]) => {
                for (parity, p) in ["gate_proj_bias", "up_proj_bias"].iter().enumerate() {
                    let out = d.iter().skip(parity).step_by(2).copied().collect();
                    let n = name.replace("gate_up_proj_bias", &format!("stacked_{p}"));
                    tensors.push((n, vec![e, two_i / 2], out));
                }
            }
            (Some("down_proj"), &[e, i, h]) => {
                let mut out = vec![0f32; e * h * i];
                for ex in 0..e {
                    for fe in 0..i {
                        for r in 0..h {
                            out[(ex * h + r) * i + fe] = d[(ex * i + fe) * h + r];
                        }
                    }
                }
                tensors.push((stem_down(&name), vec![e, h, i], out));
            }
            (Some("down_proj_bias"), _) => tensors.push((stem_down(&name), shape, d)),
            _ => tensors.push((name, shape, d)),
        }
    }
    let path = tmp.path().join("gpt-oss.gguf");
    write_f32_gguf(&path, "gpt-oss", metadata, tensors);
    check_gguf("gpt-oss", &path, tmp.path());
}

/// The tensors of MoE archrefs case `case` laid out as llama.cpp's `convert_hf_to_gguf.py`
/// writes them (`LlamaModel` for Mixtral, `Qwen2MoeModel` for Qwen3-MoE), under the HF names
/// `infer_models::names` maps to llama.cpp's: the router as `mlp.gate` (`ffn_gate_inp`), each
/// projection's experts stacked on a new slowest axis, `[E, rows, cols]`, as
/// `mlp.experts.stacked_{gate,up,down}_proj` (`ffn_{gate,up,down}_exps`); with `permute_heads`
/// `(heads, kv_heads)`, q and k rows permuted for llama.cpp's RoPE (`LlamaModel.permute`).
fn moe_gguf_tensors(
    case: &str,
    permute_heads: Option<(usize, usize)>,
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let src = infer_models::open_source(&archrefs_case_dir(case)).expect("open case");
    let arch = infer_models::architecture_for(&src.config).expect("architecture");
    let mut out = Vec::new();
    // (layer, projection) → per expert (index, shape, values).
    type Experts = Vec<(usize, Vec<usize>, Vec<f32>)>;
    let mut experts: std::collections::BTreeMap<(usize, String), Experts> = Default::default();
    for (name, shape, mut d) in hf_tensors(case) {
        let key = arch.canonical_name(&name).expect("canonical name");
        let layer_rest = key
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once('.'));
        if let Some((l, rest)) = layer_rest {
            if let Some((e, proj)) = rest
                .strip_prefix("mlp.experts.")
                .and_then(|r| r.split_once('.'))
            {
                let proj = proj.strip_suffix(".weight").expect("expert weight");
                experts
                    .entry((l.parse().unwrap(), proj.to_string()))
                    .or_default()
                    .push((e.parse().unwrap(), shape, d));
                continue;
            }
        }
        if let Some((heads, kv_heads)) = permute_heads {
            let n = if key.contains(".self_attn.q_proj.") {
                Some(heads)
            } else if key.contains(".self_attn.k_proj.") {
                Some(kv_heads)
            } else {
                None
            };
            if let Some(n) = n {
                d = infer_models::gguf::permute_qk_rows(&d, shape[0], n).expect("permute");
            }
        }
        out.push((key, shape, d));
    }
    for ((l, proj), mut per_expert) in experts {
        per_expert.sort_by_key(|(e, _, _)| *e);
        let shape = per_expert[0].1.clone();
        let mut stacked_shape = vec![per_expert.len()];
        stacked_shape.extend_from_slice(&shape);
        let data = per_expert.into_iter().flat_map(|(_, _, d)| d).collect();
        out.push((
            format!("model.layers.{l}.mlp.experts.stacked_{proj}"),
            stacked_shape,
            data,
        ));
    }
    out
}

/// `{arch}.*` metadata of `c` as convert_hf_to_gguf.py's `TextModel.set_gguf_parameters`
/// writes it for a MoE (plus `rope.dimension_count`, `attention.key_length` /
/// `value_length`), and `expert_feed_forward_length` when `moe_intermediate_size` is set.
fn moe_gguf_metadata(
    arch: &str,
    c: &infer_models::ModelConfig,
) -> Vec<(String, infer_models::gguf::GgufValue)> {
    use infer_models::gguf::GgufValue;
    let u = |k: &str, v: usize| (format!("{arch}.{k}"), GgufValue::U32(v as u32));
    let f = |k: &str, v: f64| (format!("{arch}.{k}"), GgufValue::F32(v as f32));
    let mut md = vec![
        (
            "general.architecture".to_string(),
            GgufValue::String(arch.into()),
        ),
        u("block_count", c.num_hidden_layers),
        u("context_length", c.max_position_embeddings),
        u("embedding_length", c.hidden_size),
        u("feed_forward_length", c.intermediate_size),
        u("attention.head_count", c.num_attention_heads),
        u("attention.head_count_kv", c.num_key_value_heads),
        f("rope.freq_base", c.rope_theta),
        f("attention.layer_norm_rms_epsilon", c.norm_eps),
        u("expert_count", c.num_experts),
        u("expert_used_count", c.num_experts_per_tok),
        u("attention.key_length", c.head_dim),
        u("attention.value_length", c.head_dim),
        u("rope.dimension_count", c.head_dim),
    ];
    if let Some(w) = c.moe_intermediate_size {
        md.push(u("expert_feed_forward_length", w));
    }
    md
}

/// Mixtral through GGUF as llama.cpp stores it: architecture `llama` with `llama.expert_count`
/// / `expert_used_count`, Q/K rows permuted, the router `ffn_gate_inp` and the experts stacked
/// as `ffn_{gate,up,down}_exps` ([`moe_gguf_tensors`]); read back as HF `mixtral` (the same
/// config as the checkpoint's), extracted and run against HF as the safetensors path.
#[test]
fn mixtral_from_gguf_matches_hf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = infer_models::open_source(&archrefs_case_dir("mixtral"))
        .expect("open mixtral")
        .config;
    let tensors = moe_gguf_tensors(
        "mixtral",
        Some((c.num_attention_heads, c.num_key_value_heads)),
    );
    let path = tmp.path().join("mixtral.gguf");
    write_f32_gguf(&path, "llama", moe_gguf_metadata("llama", &c), tensors);
    check_gguf("mixtral", &path, tmp.path());
}

/// Qwen3-MoE through GGUF as llama.cpp stores it: architecture `qwen3moe`
/// (`expert_feed_forward_length` the experts' width, `feed_forward_length` HF's
/// `intermediate_size`), q/k norms, no Q/K permutation, router and stacked experts as for
/// Mixtral; read back as HF `qwen3_moe`, extracted and run against HF.
#[test]
fn qwen3_moe_from_gguf_matches_hf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = infer_models::open_source(&archrefs_case_dir("qwen3-moe"))
        .expect("open qwen3-moe")
        .config;
    let tensors = moe_gguf_tensors("qwen3-moe", None);
    let path = tmp.path().join("qwen3-moe.gguf");
    write_f32_gguf(
        &path,
        "qwen3moe",
        moe_gguf_metadata("qwen3moe", &c),
        tensors,
    );
    check_gguf("qwen3-moe", &path, tmp.path());
}

/// gpt-oss (`../shared/archrefs-next/gpt-oss`): attention sinks, q/k/v/o biases, alternating
/// sliding (window 8) / full layers, YaRN RoPE (factor 32, not truncated), MoE of 4 experts
/// top-2 with a biased router, biased experts and the clamped SwiGLU (limit 7).
#[test]
fn gpt_oss_matches_hf() {
    check_case("gpt-oss");
}

/// Every case folder under archrefs (a newly added folder of the same shape is picked up).
#[test]
fn every_archrefs_case_matches_hf() {
    let names = common::archrefs_cases_except(&["llama", "gemma3"]);
    let failed: Vec<&String> = names
        .iter()
        .filter(|n| {
            let ok = std::panic::catch_unwind(|| check_case(n)).is_ok();
            println!("archrefs {n}: {}", if ok { "ok" } else { "FAILED" });
            !ok
        })
        .collect();
    assert!(failed.is_empty(), "archrefs cases failed: {failed:?}");
}

/// Relative tolerance of an f16 KV cache against the f32 one: max |Δ| of the logits ≤
/// `TOL_KV_F16 × std(reference)`. Keys and values rounded to f16 (relative error ≤ 2⁻¹¹)
/// move the tiny random models' logits by up to 1.8e-3 × std (gpt-oss; measured).
const TOL_KV_F16: f64 = 5e-3;

/// Relative tolerance of KV-cache decode against full recomputation, both on an f16 cache.
/// Not [`TOL`]: a key or value that prefill and decode compute a few f32 ulps apart (their
/// products' summation orders differ) may round to neighbouring f16 values — a few of the
/// 1536 stored values per layer do — so the two runs read caches one f16 ulp apart there;
/// measured up to 8.8e-5 × std (gpt-oss), against 2e-6 on an f32 cache.
const TOL_KV_F16_DECODE: f64 = 1e-3;

/// The float path of `case` with the KV cache stored as f16 (`--kv-type f16`): the logits of
/// both sequences within [`TOL_KV_F16`] × std of the f32 cache's, and KV-cache decode (half
/// prefilled, then one token at a time) equal to the f16 cache's full recomputation within
/// [`TOL_KV_F16_DECODE`] × std (a row attends to its own key and value as stored, so prefill
/// and decode read the same values but for rounding flips).
fn check_kv_f16(case: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = archrefs_case_dir(case);
    let vpath = extract(&dir, tmp.path(), case, "f32", None);
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let r = StFile::open(&dir.join("reference.safetensors"));
    let model = Model::from_vindex_with(&vindex, &FLOAT).expect("model");
    let f32_cache = CpuBackend::new();
    let f16_cache = CpuBackend::new().with_kv_type(infer_compute::KvType::F16);
    let (batch, t) = (r.shape("input_ids")[0], r.shape("input_ids")[1]);
    let ids = r.i64_as_u32("input_ids");
    let s = std_dev(&r.f32("logits"));
    let vocab = model.vocab_size;
    let full = |b: &CpuBackend, seq: &[u32]| {
        let mut cache = model.new_cache(seq.len());
        model
            .forward(b, seq, &mut cache, Logits::All)
            .expect("forward")
    };
    for b in 0..batch {
        let seq = &ids[b * t..(b + 1) * t];
        let d = max_abs_diff(&full(&f16_cache, seq), &full(&f32_cache, seq));
        println!(
            "{case} seq {b}: f16 vs f32 KV cache logits max|Δ| {d:.3e} (std {s:.3e}, ratio {:.2e})",
            d / s
        );
        assert!(
            d <= TOL_KV_F16 * s,
            "{case} seq {b}: f16 KV cache logits differ by {d:e} > {TOL_KV_F16} × std {s:e}"
        );
    }
    let seq = &ids[..t];
    let want = full(&f16_cache, seq);
    let mut cache = model.new_cache(t);
    let half = t / 2;
    model
        .forward(&f16_cache, &seq[..half], &mut cache, Logits::Last)
        .expect("prefill");
    let mut worst = 0f64;
    for pos in half..t {
        let got = model
            .forward(&f16_cache, &seq[pos..pos + 1], &mut cache, Logits::Last)
            .expect("decode");
        worst = worst.max(max_abs_diff(&got, &want[pos * vocab..(pos + 1) * vocab]));
    }
    println!(
        "{case}: f16 KV cache decode vs recomputation max|Δ| {worst:.3e} (ratio {:.2e})",
        worst / s
    );
    assert!(
        worst <= TOL_KV_F16_DECODE * s,
        "{case}: f16 KV cache decode differs from recomputation by {worst:e} > \
         {TOL_KV_F16_DECODE} × std {s:e}"
    );
}

/// [`check_kv_f16`] on families with the attention variants: GQA (llama), sliding window and
/// q/k norms (gemma3, mistral-swa), soft-cap (gemma2), sinks (gpt-oss).
#[test]
fn f16_kv_cache_matches_f32_cache() {
    for case in ["llama", "gemma3", "gemma2", "mistral-swa", "gpt-oss"] {
        check_kv_f16(case);
    }
}
