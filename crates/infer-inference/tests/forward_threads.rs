//! The forward pass gives the same logits whatever the thread pool it runs on: called from a
//! thread outside the global 2-thread pool (the forward pass enters the pool once, then splits its
//! quantized products across both workers) against a 1-thread pool (every product serial).
//! Model: SmolLM2-135M-Instruct (GGUF from `INFER_MODELS`), the default quantized plan (Q5_0/Q8_0
//! attention, Q5_0/Q6_K FFN, Q8_0 lm_head): prefill of 12 tokens, then 6 greedy decode steps.

mod common;

use common::*;
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::{FormatRequest, Model};
use infer_vindex::Vindex;

/// Prefill `prompt`, then decode `steps` greedy tokens; returns every step's last logits.
fn run(model: &Model<'_>, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let backend = CpuBackend::new();
    let mut cache = model.new_cache(prompt.len() + steps + 1);
    let mut out = vec![model
        .forward(&backend, prompt, &mut cache, Logits::Last)
        .expect("prefill")];
    for _ in 0..steps {
        let tok = infer_inference::sampling::argmax(out.last().expect("logits"));
        out.push(
            model
                .forward(&backend, &[tok], &mut cache, Logits::Last)
                .expect("decode"),
        );
    }
    out
}

#[test]
fn smollm2_quantized_logits_do_not_depend_on_thread_count() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = smollm2_with(tmp.path(), infer_vindex::QuantTiers::ALL);
    let v = Vindex::open(&path).expect("open vindex");
    let model = Model::from_vindex_with(&v, &FormatRequest::default()).expect("model");
    let prompt: Vec<u32> = (0..12u32).map(|i| (i * 7919 + 17) % 49152).collect();

    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("1-thread pool");
    let serial = one.install(|| run(&model, &prompt, 6));
    // The global pool with 2 workers; this test thread is outside it, so each forward pass
    // enters the pool itself (the CLI's situation).
    if rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global()
        .is_err()
    {
        assert!(
            rayon::current_num_threads() >= 2,
            "the global rayon pool was already built with < 2 threads"
        );
    }
    assert!(rayon::current_thread_index().is_none());
    let parallel = run(&model, &prompt, 6);
    assert_eq!(serial.len(), parallel.len());
    for (step, (a, b)) in serial.iter().zip(&parallel).enumerate() {
        let d = max_abs_diff(a, b);
        assert!(
            d <= 1e-4,
            "step {step}: 1-thread and 2-thread logits differ by {d} (> 1e-4)"
        );
        assert_eq!(
            infer_inference::sampling::argmax(a),
            infer_inference::sampling::argmax(b),
            "step {step}: greedy token differs between thread counts"
        );
    }
}
