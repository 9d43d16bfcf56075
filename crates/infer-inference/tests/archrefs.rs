//! Every archrefs case (Llama and Gemma-3 first) against HF transformers (float64 reference stored as f32):
//! full-sequence logits and per-layer hidden states within 1e-4 × std of the reference, and
//! KV-cache decode equal to full recomputation (the reference's greedy `generated` tokens).

mod common;

use common::*;
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::Model;
use infer_vindex::Vindex;

/// Relative tolerance: max |Δ| ≤ TOL × std(reference).
const TOL: f64 = 1e-4;

fn check_case(case: &str) {
    let dir = shared_dir().join("archrefs").join(case);
    let tmp = tempfile::tempdir().expect("tempdir");
    let vpath = extract(&dir, tmp.path(), case, "f32", None);
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let model = Model::from_vindex(&vindex).expect("model");
    let backend = CpuBackend::new();
    let r = StFile::open(&dir.join("reference.safetensors"));
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

/// Every case folder under archrefs (a newly added folder of the same shape is picked up).
#[test]
fn every_archrefs_case_matches_hf() {
    let root = shared_dir().join("archrefs");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("archrefs")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("reference.safetensors").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "llama" && n != "gemma3")
        .collect();
    names.sort();
    assert!(
        names.len() >= 17,
        "expected the 19 archrefs cases, found {}",
        names.len() + 2
    );
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
