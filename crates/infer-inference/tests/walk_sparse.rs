//! Sparse walk FFN (issue 8): K = all (as `all` or as the intermediate size, with either
//! selection) is the dense walk FFN bit for bit and matches HF's logits on archrefs llama and
//! gemma3 and the real SmolLM2's reference logits; a small K differs but stays finite, and each
//! layer's sparse output equals a brute-force top-K sum (f64) within 1e-5 relative, for both the
//! f32 and the Q4_0 candidate selection; a batch selects per token (prefill equals decode).

mod common;

use common::*;
use infer_compute::{ComputeBackend, CpuBackend, QuantFormat};
use infer_inference::forward::Logits;
use infer_inference::layer::{Ffn, FloatRows, WalkFfn};
use infer_inference::walk::{layer_walk_ffn, WalkBuffers};
use infer_inference::{
    AttnChoice, FfnChoice, FormatRequest, LayerGeometry, LmHeadChoice, Model, Selection, WalkK,
};
use infer_models::{Activation, FfnType};
use infer_vindex::{QuantTiers, Vindex};

/// The float tier only: f32 attention, walk FFN, float lm_head.
const FLOAT: FormatRequest = FormatRequest {
    attn: AttnChoice::F32,
    ffn: FfnChoice::Walk,
    lm_head: LmHeadChoice::F32,
};

/// Relative tolerance against HF's logits (as tests/archrefs.rs): max |Δ| ≤ TOL × std.
const TOL: f64 = 1e-4;

const Q4: QuantTiers = QuantTiers {
    q4k: false,
    q8: false,
    q4: true,
};

/// An archrefs case extracted with the f32 tier and the q4 tier (for `gate_vectors_q4.bin`).
fn archref(case: &str) -> (tempfile::TempDir, Vindex, StFile) {
    archref_dtype(case, "f32")
}

/// As [`archref`] with the float tier in `dtype` (`f32` or `f16`).
fn archref_dtype(case: &str, dtype: &str) -> (tempfile::TempDir, Vindex, StFile) {
    let dir = shared_dir().join("archrefs").join(case);
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = extract_with(&dir, tmp.path(), case, dtype, None, Q4);
    let v = Vindex::open(&path).expect("open vindex");
    let r = StFile::open(&dir.join("reference.safetensors"));
    (tmp, v, r)
}

fn sparse_model<'a>(v: &'a Vindex, spec: &str, select: Selection) -> Model<'a> {
    let mut m = Model::from_vindex_with(v, &FLOAT).expect("model");
    m.set_walk_k(v, &WalkK::parse(spec).expect("spec"), select)
        .unwrap_or_else(|e| panic!("--walk-k {spec} --walk-select {select}: {e}"));
    m
}

fn logits_all(m: &Model<'_>, ids: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache(ids.len());
    m.forward(&CpuBackend::new(), ids, &mut cache, Logits::All)
        .expect("forward")
}

fn check_k_all(case: &str) {
    let (_tmp, v, r) = archref(case);
    let t = r.shape("input_ids")[1];
    let ids = &r.i64_as_u32("input_ids")[..t];
    let exact = Model::from_vindex_with(&v, &FLOAT).expect("model");
    let want = logits_all(&exact, ids);
    let reference = &r.f32("logits")[..want.len()];
    let (d, s) = (max_abs_diff(&want, reference), std_dev(reference));
    assert!(d <= TOL * s, "{case}: exact path vs HF max|Δ| {d:e}");
    let inter = exact.layers[0].geometry.intermediate_size;
    let n_layers = exact.layers.len();
    let specs = [
        "all".to_string(),
        inter.to_string(),
        "1.0".to_string(),
        format!("0-{}:all", n_layers - 1),
    ];
    for spec in &specs {
        for select in [Selection::F32, Selection::Q4] {
            let got = logits_all(&sparse_model(&v, spec, select), ids);
            assert_eq!(
                got, want,
                "{case}: --walk-k {spec} --walk-select {select} is not the dense walk FFN bit for bit"
            );
        }
    }
    println!("{case}: K = all (4 spellings × 2 selections) equals the dense path; vs HF max|Δ| {d:.2e} (std {s:.2e})");
}

#[test]
fn k_all_is_exact_llama() {
    check_k_all("llama");
}

#[test]
fn k_all_is_exact_gemma3() {
    check_k_all("gemma3");
}

fn act(a: Activation, x: f64) -> f64 {
    let x = x as f32;
    (match a {
        Activation::Silu => infer_compute::ops::silu(x),
        Activation::GeluTanh => infer_compute::ops::gelu_tanh(x),
        Activation::Gelu => infer_compute::ops::gelu(x),
    }) as f64
}

/// The rows as f32 (f16 widened exactly, blocks dequantized as ggml does).
fn f32_rows(rows: &FloatRows<'_>) -> Vec<f32> {
    match rows {
        FloatRows::F32(v) => v.to_vec(),
        FloatRows::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        FloatRows::Blocks { format, bytes, .. } => {
            infer_quant::dequantize_to_vec(*format, bytes, rows.len()).expect("blocks")
        }
    }
}

fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

/// Candidate scores `[t, inter]` as the sparse path computes them (same backend call, so the
/// same f32 bits): the float gate product, or the Q4_0 kernel's product with the gate copy.
fn scores(w: &WalkFfn<'_>, g: &LayerGeometry, x: &[f32], t: usize) -> Vec<f32> {
    let (h, inter) = (g.hidden_size, w.intermediate_size);
    let backend = CpuBackend::new();
    let mut s = vec![0f32; t * inter];
    match w.sparse.as_ref().expect("sparse layer").gate_q4 {
        None => w
            .gate
            .as_ref()
            .expect("gate")
            .matmul_transb(&backend, x, t, h, inter, &mut s)
            .expect("gate scores"),
        Some(q4) => backend
            .linear(
                &infer_compute::Matrix::blocks(QuantFormat::Q4_0, q4, inter, h),
                x,
                t,
                &mut s,
            )
            .expect("q4 scores"),
    }
    s
}

/// Brute force for one token: the top-K of `scores` by magnitude (full sort; ties: lower
/// index), then `Σ act(gᵢ·x)(uᵢ·x)dᵢ` in f64 with exact gate values.
fn brute_force(
    w: &WalkFfn<'_>,
    g: &LayerGeometry,
    x: &[f32],
    scores: &[f32],
    k: usize,
) -> Vec<f64> {
    assert_eq!(
        g.ffn_type,
        FfnType::Gated,
        "archrefs llama/gemma3 are gated"
    );
    let (h, inter) = (g.hidden_size, w.intermediate_size);
    let gate = f32_rows(w.gate.as_ref().expect("gate"));
    let (up, down) = (f32_rows(&w.up), f32_rows(&w.down));
    let mut order: Vec<usize> = (0..inter).collect();
    order.sort_by(|&a, &b| scores[b].abs().total_cmp(&scores[a].abs()).then(a.cmp(&b)));
    let mut out = vec![0f64; h];
    for &i in &order[..k] {
        let gv = dot64(&gate[i * h..(i + 1) * h], x);
        let c = act(g.activation, gv) * dot64(&up[i * h..(i + 1) * h], x);
        for (o, d) in out.iter_mut().zip(&down[i * h..(i + 1) * h]) {
            *o += c * *d as f64;
        }
    }
    out
}

/// Deterministic inputs `[t, h]` with a spread of magnitudes (a hidden state's scale).
fn inputs(t: usize, h: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..t * h)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn check_small_k(case: &str, dtype: &str) {
    let (_tmp, v, r) = archref_dtype(case, dtype);
    let t = r.shape("input_ids")[1];
    let ids = &r.i64_as_u32("input_ids")[..t];
    let exact = logits_all(&Model::from_vindex_with(&v, &FLOAT).expect("model"), ids);
    let backend = CpuBackend::new();
    for select in [Selection::F32, Selection::Q4] {
        for spec in ["0.25", "40", "0.5"] {
            let m = sparse_model(&v, spec, select);
            // Whole model: different from exact, finite.
            let got = logits_all(&m, ids);
            assert!(
                got.iter().all(|x| x.is_finite()),
                "{case} {spec}: non-finite"
            );
            let d = max_abs_diff(&got, &exact);
            println!(
                "{case} --walk-k {spec} --walk-select {select}: logits max|Δ| vs exact {d:.3e}"
            );
            assert!(d > 1e-4, "{case} {spec}: sparse equals exact ({d:e})");
            // Every layer against the brute force, for a batch of 3 tokens (per-token selection).
            let mut bufs = WalkBuffers::default();
            let mut out = Vec::new();
            for (l, layer) in m.layers.iter().enumerate() {
                let Ffn::Walk(w) = &layer.ffn else {
                    panic!("{case} layer {l}: not a walk FFN")
                };
                let g = &layer.geometry;
                let k = w.sparse.as_ref().expect("sparse").k;
                assert_eq!(
                    k,
                    WalkK::parse(spec)
                        .unwrap()
                        .k_for_layer(l, g.intermediate_size)
                );
                let h = g.hidden_size;
                let x = inputs(3, h, l as u64 + 7);
                layer_walk_ffn(&backend, w, &x, 3, g, &mut bufs, &mut out).expect("sparse ffn");
                let s = scores(w, g, &x, 3);
                let inter = g.intermediate_size;
                for row in 0..3 {
                    let xr = &x[row * h..(row + 1) * h];
                    let want = brute_force(w, g, xr, &s[row * inter..(row + 1) * inter], k);
                    let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
                    let err = out[row * h..(row + 1) * h]
                        .iter()
                        .zip(&want)
                        .fold(0f64, |a, (x, y)| a.max((*x as f64 - y).abs()));
                    assert!(
                        err <= 1e-5 * scale,
                        "{case} layer {l} row {row} --walk-k {spec} {select}: max|Δ| {err:e} vs scale {scale:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn small_k_equals_brute_force_llama() {
    check_small_k("llama", "f32");
}

#[test]
fn small_k_equals_brute_force_gemma3() {
    check_small_k("gemma3", "f32");
}

/// A batch selects per token: prefill logits equal one-token-at-a-time decode.
#[test]
fn sparse_prefill_equals_decode() {
    let (_tmp, v, r) = archref("llama");
    let t = r.shape("input_ids")[1];
    let ids = &r.i64_as_u32("input_ids")[..t];
    let backend = CpuBackend::new();
    for select in [Selection::F32, Selection::Q4] {
        let m = sparse_model(&v, "0.25", select);
        let all = logits_all(&m, ids);
        let vocab = m.vocab_size;
        let mut cache = m.new_cache(t);
        for (pos, &id) in ids.iter().enumerate() {
            let step = m
                .forward(&backend, &[id], &mut cache, Logits::Last)
                .expect("decode");
            let d = max_abs_diff(&step, &all[pos * vocab..(pos + 1) * vocab]);
            assert!(
                d <= 1e-4,
                "{select}: position {pos}: decode vs prefill max|Δ| {d:e}"
            );
        }
    }
}

/// K = all through `set_walk_k` on the real SmolLM2 matches its reference logits (first prompt).
#[test]
fn k_all_matches_real_smollm2_reference() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = smollm2_with(tmp.path(), Q4);
    let v = Vindex::open(&path).expect("open");
    let refdir = shared_dir().join("reference/smollm2-135m-instruct");
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(refdir.join("index.json")).expect("reference index.json"),
    )
    .expect("json");
    let p = &index["prompts"][0];
    let r = StFile::open(&refdir.join(p["file"].as_str().expect("file")));
    let ids = r.i64_as_u32("input_ids");
    let m = sparse_model(&v, &m_intermediate(&v), Selection::Q4);
    let mut cache = m.new_cache(ids.len());
    let last = m
        .forward(&CpuBackend::new(), &ids, &mut cache, Logits::Last)
        .expect("forward");
    let want = r.f32("last_logits");
    let d = max_abs_diff(&last, &want);
    println!("SmolLM2 --walk-k 1536 --walk-select q4: last logits max|Δ| {d:.2e}");
    assert!(d <= 1e-3, "SmolLM2 K = all: max|Δ| {d:e} > 1e-3");
}

fn m_intermediate(v: &Vindex) -> String {
    v.config().intermediate_size.to_string()
}

#[test]
fn spec_and_plan_errors() {
    for (spec, want) in [
        ("0.0", "not in (0, 1]"),
        ("2.5", "not in (0, 1]"),
        ("ten", "not a number"),
        ("5-2:0.5", "out of order"),
        ("0", "count of 0"),
    ] {
        let e = WalkK::parse(spec).expect_err(spec);
        assert!(e.contains(want), "{spec}: {e}");
    }
    let (_tmp, v, _r) = archref("llama");
    let mut m = Model::from_vindex_with(&v, &FLOAT).expect("model");
    let e = m
        .set_walk_k(&v, &WalkK::parse("3:0.5").unwrap(), Selection::F32)
        .expect_err("layer 3 of 3");
    assert!(e.to_string().contains("layer 3"), "{e}");
    // A quantized FFN plan cannot run a sparse walk.
    let q4 = FormatRequest {
        ffn: FfnChoice::Q4,
        ..FLOAT
    };
    let mut m = Model::from_vindex_with(&v, &q4).expect("q4 model");
    let e = m
        .set_walk_k(&v, &WalkK::parse("0.5").unwrap(), Selection::F32)
        .expect_err("quantized FFN");
    assert!(e.to_string().contains("--walk-k needs --ffn walk"), "{e}");
    // K = all is fine with any plan.
    m.set_walk_k(&v, &WalkK::all(), Selection::Q4)
        .expect("all with a quantized FFN");
    // Q4 selection needs gate_vectors_q4.bin.
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = extract(
        &shared_dir().join("archrefs/llama"),
        tmp.path(),
        "plain",
        "f32",
        None,
    );
    let plain = Vindex::open(&path).expect("open");
    let mut m = Model::from_vindex_with(&plain, &FLOAT).expect("model");
    let e = m
        .set_walk_k(&plain, &WalkK::parse("0.5").unwrap(), Selection::Q4)
        .expect_err("no q4 tier");
    assert!(e.to_string().contains("q4"), "{e}");
}

/// The f16 tier: rows are read (and widened) in place by the same sparse path.
#[test]
fn small_k_equals_brute_force_f16_tier() {
    check_small_k("llama", "f16");
}
