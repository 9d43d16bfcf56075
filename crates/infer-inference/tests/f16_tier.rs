//! The f16 tier runs in place (f16 matrices multiplied by `matmul_transb_f16` / `matmul_f16`,
//! never widened at load) and computes what the f32 path computes on the same f16-rounded
//! weights: for several archrefs architectures (gated and non-gated FFN, biases, tied and untied
//! output, MoE experts), the logits of the in-place f16 model equal those of the same model with
//! every f16 matrix widened to an f32 copy, within 1e-4 × the logits' standard deviation (only
//! the f32 summation order differs), at every position of a prefill and through decode steps.

mod common;

use std::borrow::Cow;

use common::{extract, shared_dir, std_dev};
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::layer::{Ffn, FloatRows, WalkFfn, WeightData};
use infer_inference::Model;
use infer_vindex::Vindex;

fn widen_rows(r: &mut FloatRows<'_>) -> bool {
    if let FloatRows::F16(v) = r {
        *r = FloatRows::F32(Cow::Owned(v.iter().map(|x| x.to_f32()).collect()));
        return true;
    }
    false
}

fn widen_weight(w: &mut WeightData<'_>) -> bool {
    if let WeightData::F16(v) = w {
        *w = WeightData::F32(Cow::Owned(v.iter().map(|x| x.to_f32()).collect()));
        return true;
    }
    false
}

fn widen_walk(w: &mut WalkFfn<'_>) -> usize {
    let mut n = 0;
    if let Some(g) = &mut w.gate {
        n += widen_rows(g) as usize;
    }
    n + widen_rows(&mut w.up) as usize + widen_rows(&mut w.down) as usize
}

/// Replace every f16 matrix of `m` with its f32 widening; returns how many were replaced.
fn widen_model(m: &mut Model<'_>) -> usize {
    let mut n = widen_rows(&mut m.embeddings) as usize;
    if let Some(w) = &mut m.lm_head {
        n += widen_weight(w) as usize;
    }
    for layer in &mut m.layers {
        for lin in [&mut layer.wq, &mut layer.wk, &mut layer.wv, &mut layer.wo] {
            n += widen_weight(&mut lin.weight) as usize;
        }
        match &mut layer.ffn {
            Ffn::Walk(w) => n += widen_walk(w),
            Ffn::Moe(moe) => {
                for e in moe.experts.iter_mut().chain(moe.shared.iter_mut()) {
                    n += widen_walk(e);
                }
            }
            Ffn::Dense(_) => {}
        }
    }
    n
}

fn check(case: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = extract(
        &shared_dir().join("archrefs").join(case),
        tmp.path(),
        case,
        "f16",
        None,
    );
    let v = Vindex::open(&path).expect("open");
    let native = Model::from_vindex(&v).expect("model");
    assert!(
        matches!(native.embeddings, FloatRows::F16(_)),
        "{case}: the f16 tier's embeddings must stay f16"
    );
    let mut wide = Model::from_vindex(&v).expect("model");
    let replaced = widen_model(&mut wide);
    assert!(
        replaced > 4 * native.layers.len(),
        "{case}: only {replaced} f16 matrices"
    );
    let be = CpuBackend::new();
    let prompt: Vec<u32> = (0..11u32)
        .map(|i| (i * 37 + 3) % native.vocab_size as u32)
        .collect();
    let (mut c1, mut c2) = (native.new_cache(32), wide.new_cache(32));
    let mut a = native
        .forward(&be, &prompt, &mut c1, Logits::All)
        .expect("f16 prefill");
    let mut b = wide
        .forward(&be, &prompt, &mut c2, Logits::All)
        .expect("f32 prefill");
    for step in 0..4 {
        let tol = 1e-4 * std_dev(&b);
        let worst = common::max_abs_diff(&a, &b);
        eprintln!(
            "{case} step {step}: {replaced} f16 matrices, max |Δ| {worst:.3e} (tol {tol:.3e})"
        );
        assert!(
            worst <= tol,
            "{case} step {step}: max |Δ| {worst:.3e} > {tol:.3e}"
        );
        let tok = infer_inference::sampling::argmax(&b[b.len() - native.vocab_size..]);
        a = native
            .forward(&be, &[tok], &mut c1, Logits::Last)
            .expect("f16 decode");
        b = wide
            .forward(&be, &[tok], &mut c2, Logits::Last)
            .expect("f32 decode");
    }
}

#[test]
fn f16_tier_in_place_equals_widened_weights() {
    for case in ["llama", "gemma3", "gpt2", "qwen2", "mixtral", "phi"] {
        check(case);
    }
}
