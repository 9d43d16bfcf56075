//! A real model on the CUDA backend: SmolLM2-135M-Instruct (Q4_1 GGUF from `INFER_MODELS`)
//! extracted with the q4k tier, default quantized plan, CPU backend vs `CudaBackend`:
//!
//! - Greedy tokens of the chat prompt "What is the capital of France?" (24 tokens, through the
//!   forward pass; on each backend the host's argmax of each step's logits equals
//!   `Model::decode_greedy`'s choices, on CUDA made on the device): identical on both backends
//!   up to the first step whose CPU top-1/top-2 margin is below 1e-2 × std of the logits
//!   (there a rounding difference may legitimately pick the other token), and the CPU answer
//!   starts with "The capital of France is Paris" (models/README.md).
//! - Speed (printed, not asserted): prefill of 128 tokens and greedy decode of 64 tokens
//!   (`Model::decode_greedy`), median of 3 repetitions, tokens/s per backend; weight bytes per
//!   decoded token.
//!
//! Needs a CUDA device and the model: `#[ignore]`d; `scripts/gpu-check.sh model` runs it.

#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;
use infer_compute::cuda::CudaBackend;
use infer_compute::{ComputeBackend, CpuBackend};
use infer_inference::forward::Logits;
use infer_inference::sampling::argmax;
use infer_inference::tokenizer::Tokenizer;
use infer_inference::Model;
use infer_vindex::Vindex;

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PROMPT: &str =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

/// Greedy ids after `prompt` and each step's logits margin / std, from the logits of
/// `Model::forward_into` (prefill, then one token at a time); the same continuation through
/// `Model::decode_greedy` from a fresh cache (on CUDA: chosen on the device, each step launched
/// before the host reads the choice before it) must be identical.
fn greedy(model: &Model, b: &dyn ComputeBackend, prompt: &[u32], n: usize) -> Vec<(u32, f64)> {
    let ctx = prompt.len() + n + 1;
    let mut cache = model.new_cache(ctx);
    let mut logits = Vec::new();
    model
        .forward_into(b, prompt, &mut cache, Logits::Last, &mut logits)
        .expect("prefill");
    let mut out = Vec::new();
    for _ in 0..n {
        let tok = argmax(&logits);
        let mut s = logits.clone();
        s.sort_by(|a, b| b.total_cmp(a));
        out.push((tok, ((s[0] - s[1]) as f64) / std_dev(&logits)));
        model
            .forward_into(b, &[tok], &mut cache, Logits::Last, &mut logits)
            .expect("decode");
    }
    // The same continuation chosen where the logits are (`decode_greedy`), from a fresh cache.
    let mut cache = model.new_cache(ctx);
    model
        .forward_into(b, prompt, &mut cache, Logits::Last, &mut logits)
        .expect("prefill");
    let mut chosen = vec![argmax(&logits)];
    model
        .decode_greedy(b, chosen[0], &mut cache, n - 1, |t| {
            chosen.push(t);
            Ok(true)
        })
        .expect("greedy decode");
    let want: Vec<u32> = out.iter().map(|x| x.0).collect();
    assert_eq!(
        chosen,
        want,
        "{}: decode_greedy vs the host's argmax",
        b.name()
    );
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (prefill tokens/s, decode tokens/s), median of 3.
fn speed(model: &Model, b: &dyn ComputeBackend, n_prompt: usize, n_gen: usize) -> (f64, f64) {
    let vocab = model.vocab_size as u64;
    let ids: Vec<u32> = (0..n_prompt as u64)
        .map(|i| ((i * 2654435761 + 12345) % vocab) as u32)
        .collect();
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    // One untimed pass uploads the weights (CUDA) and warms the caches.
    let mut cache = model.new_cache(n_prompt + n_gen + 1);
    model
        .forward(b, &ids, &mut cache, Logits::Last)
        .expect("warm-up");
    for _ in 0..3 {
        let mut cache = model.new_cache(n_prompt + n_gen + 1);
        let t0 = Instant::now();
        model
            .forward(b, &ids, &mut cache, Logits::Last)
            .expect("prefill");
        pp.push(n_prompt as f64 / t0.elapsed().as_secs_f64());
        let mut cache = model.new_cache(n_gen + 1);
        let t0 = Instant::now();
        model
            .decode_greedy(b, ids[0], &mut cache, n_gen, |_| Ok(true))
            .expect("decode");
        tg.push(n_gen as f64 / t0.elapsed().as_secs_f64());
    }
    (median(pp), median(tg))
}

#[test]
#[ignore = "needs a CUDA device and the SmolLM2 GGUF: scripts/gpu-check.sh model"]
fn smollm2_on_cuda_matches_cpu() {
    let gguf = models_dir().join(GGUF);
    assert!(gguf.is_file(), "{} not found", gguf.display());
    let gpu = CudaBackend::new(0).unwrap_or_else(|e| panic!("needs a CUDA device: {e}"));
    let cpu = CpuBackend::new();
    let tmp = tempfile::tempdir().expect("tempdir");
    let t0 = Instant::now();
    let vpath = extract_with(
        &gguf,
        tmp.path(),
        "smollm2",
        "f32",
        None,
        infer_vindex::QuantTiers::Q4K,
    );
    println!("extracted in {:.1} s", t0.elapsed().as_secs_f64());
    let v = Vindex::open(&vpath).expect("open vindex");
    let model = Model::from_vindex(&v).expect("model");
    println!("plan: {}", model.plan);
    let tok = Tokenizer::from_json(&v.tokenizer_json().expect("tokenizer")).expect("tokenizer");
    let prompt = tok.encode(PROMPT, true).expect("encode");

    let c = greedy(&model, &cpu, &prompt, 24);
    let g = greedy(&model, gpu_ref(&gpu), &prompt, 24);
    let ids = |v: &[(u32, f64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
    let text_c = tok.decode(&ids(&c), true).expect("decode");
    let text_g = tok.decode(&ids(&g), true).expect("decode");
    println!("greedy cpu : {text_c:?}");
    println!("greedy cuda: {text_g:?}");
    assert!(
        text_c.starts_with("The capital of France is Paris"),
        "CPU answer {text_c:?}"
    );
    let same = c.iter().zip(&g).take_while(|(a, b)| a.0 == b.0).count();
    println!(
        "greedy tokens identical for {same}/{} steps (min CPU margin/std {:.3})",
        c.len(),
        c.iter().map(|x| x.1).fold(f64::INFINITY, f64::min)
    );
    if same < c.len() {
        assert!(
            c[same].1 < 1e-2,
            "GPU and CPU greedy tokens differ at step {same} where the CPU margin is {:.3} × std",
            c[same].1
        );
    }

    let bytes = model.weight_bytes_per_token() as f64;
    println!("weight bytes per decoded token: {:.1} MB", bytes / 1e6);
    let (pc, tc) = speed(&model, &cpu, 128, 64);
    let (pg, tg) = speed(&model, gpu_ref(&gpu), 128, 64);
    println!(
        "== SmolLM2-135M q4k: prefill (pp128) and decode (tg64) tokens/s, median of 3 ==\n\
         cpu  ({} threads): pp128 {pc:8.1}  tg64 {tc:7.1}\n\
         cuda ({}): pp128 {pg:8.1}  tg64 {tg:7.1}",
        rayon::current_num_threads(),
        gpu.name()
    );
}

fn gpu_ref(g: &CudaBackend) -> &dyn ComputeBackend {
    g
}
