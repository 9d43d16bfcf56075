//! Model-level parity of the CUDA backend: `Model::forward` with `CudaBackend` on every archrefs
//! case (/work/shared/archrefs, read through `INFER_SHARED`), extracted with the float tier and
//! the q4k tier.
//!
//! - Float tier (f32 attention, walk FFN, f32 lm_head): GPU logits against HF's (float64
//!   reference) within the CPU path's tolerance of tests/archrefs.rs, max |Δ| ≤ 1e-4 × std(ref),
//!   over both sequences (full sequence at once) and over a KV-cache decode of sequence 0
//!   (prefill half, then one token at a time); and against the CPU backend's logits, same bound.
//! - Default quantized plan (q4k tier): GPU logits against the CPU backend's, per position
//!   `r = max|Δ| / std(CPU logits)`. Both quantize the activations with the same f32 operations
//!   and sum each block exactly, so only the order of the f32 block terms differs (~1e-7
//!   relative per product); but such a difference can flip the rounding of one int8 activation
//!   in a later layer, which moves that position's logits by ~1e-2 × std (the CPU's own SIMD and
//!   scalar kernels differ the same way on gemma3, qwen2 and gpt_neox: measured 1.7e-2, 3.9e-2,
//!   2.6e-2 at 2-3 of 24 positions, 5e-7 elsewhere). So: the median position r ≤ 1e-5 (at most half
//!   the positions above it), every position r ≤ 0.1 (a wrong kernel gives r ~ 1).
//!   Greedy (argmax) tokens must agree at every position whose CPU top-1/top-2 margin exceeds
//!   0.1 × std.
//!
//! - The forward pass's calls of mixed lengths through one cache on the quantized plan:
//!   sequence 0 as prefill of a quarter, single tokens to the half (CUDA graph replays), a
//!   two-token pass, single tokens to the end; every call's last logits against the CPU
//!   backend's for the same calls, with the quantized bound above.
//! - Greedy decode through `Model::decode_greedy` (on CUDA each choice made on the device and
//!   the next step launched from it before the host reads it) after prefilling half of
//!   sequence 0: the GPU's choices equal the CPU backend's at every step whose CPU top-1/top-2
//!   margin exceeds 0.1 × std, for as long as both have chosen the same tokens (past a
//!   below-margin step where they differ, the two continue from different tokens).
//!
//! The tests need a CUDA device and are `#[ignore]`d; `scripts/gpu-check.sh` runs them (it copies
//! the archrefs folders next to the test binary and sets `INFER_SHARED`).

#![cfg(feature = "cuda")]

mod common;

use common::*;
use infer_compute::cuda::CudaBackend;
use infer_compute::{ComputeBackend, CpuBackend};
use infer_inference::forward::Logits;
use infer_inference::sampling::argmax;
use infer_inference::{AttnChoice, FfnChoice, FfnPath, FormatRequest, LmHeadChoice, Model};
use infer_vindex::Vindex;

/// Float tier vs HF and vs the CPU backend: max |Δ| ≤ TOL_FLOAT × std (as tests/archrefs.rs).
const TOL_FLOAT: f64 = 1e-4;
/// Quantized plan, GPU vs CPU, per position max |Δ| / std(CPU logits): the bound of an
/// order-only difference, and the bound every position (rounding flips included) must meet.
const TOL_QUANT: f64 = 1e-5;
const TOL_QUANT_FLIP: f64 = 0.1;
/// Greedy tokens are compared where the CPU margin exceeds MARGIN × std.
const MARGIN: f64 = 0.1;

const FLOAT: FormatRequest = FormatRequest {
    attn: AttnChoice::F32,
    ffn: FfnChoice::Walk,
    lm_head: LmHeadChoice::F32,
};

fn gpu() -> CudaBackend {
    CudaBackend::new(0).unwrap_or_else(|e| {
        panic!("the CUDA archrefs tests need a CUDA device (scripts/gpu-check.sh runs them): {e}")
    })
}

/// Logits `[t, vocab]` of each sequence of `ids` (`batch` rows of `t`), full sequence at once.
fn all_logits(
    model: &Model,
    backend: &dyn ComputeBackend,
    ids: &[u32],
    batch: usize,
    t: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * t * model.vocab_size);
    for b in 0..batch {
        let mut cache = model.new_cache(t);
        let l = model
            .forward(backend, &ids[b * t..(b + 1) * t], &mut cache, Logits::All)
            .unwrap_or_else(|e| panic!("forward on {}: {e}", backend.name()));
        out.extend_from_slice(&l);
    }
    out
}

/// Sequence 0 through the KV cache: prefill the first half, then one token at a time; the
/// logits of positions `half-1 ..= t-1`, `[t - half + 1, vocab]`.
fn decode_logits(model: &Model, backend: &dyn ComputeBackend, seq: &[u32]) -> Vec<f32> {
    let t = seq.len();
    let half = t / 2;
    let mut cache = model.new_cache(t);
    let mut out = model
        .forward(backend, &seq[..half], &mut cache, Logits::Last)
        .expect("prefill");
    for &tok in &seq[half..] {
        let l = model
            .forward(backend, &[tok], &mut cache, Logits::Last)
            .expect("decode");
        out.extend_from_slice(&l);
    }
    out
}

/// Assert `got[i] == argmax(want_i)` for each `[vocab]` chunk `want_i` of `want` whose top-2
/// margin is at least MARGIN × `sq` (nearer ties may flip with rounding); returns (compared,
/// skipped).
fn check_greedy(
    case: &str,
    what: &str,
    got: &[u32],
    want: &[f32],
    vocab: usize,
    sq: f64,
) -> (usize, usize) {
    let (mut compared, mut skipped) = (0, 0);
    for (i, (&g, w)) in got.iter().zip(want.chunks_exact(vocab)).enumerate() {
        let mut sorted = w.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if ((sorted[0] - sorted[1]) as f64) < MARGIN * sq {
            skipped += 1;
            continue;
        }
        compared += 1;
        assert_eq!(g, argmax(w), "{case}: {what} at {i} differs GPU vs CPU");
    }
    (compared, skipped)
}

/// The forward pass's greedy choices ([`Model::forward_greedy`]: argmax where the logits are,
/// on the device for CUDA): `seq[..t/2]` prefilled, then each token of `seq[t/2..]`; entry i
/// matches chunk i + 1 of [`decode_logits`].
fn forward_greedy_ids(model: &Model, backend: &dyn ComputeBackend, seq: &[u32]) -> Vec<u32> {
    let t = seq.len();
    let mut cache = model.new_cache(t);
    model
        .forward(backend, &seq[..t / 2], &mut cache, Logits::Last)
        .expect("prefill");
    seq[t / 2..]
        .iter()
        .map(|&tok| {
            model
                .forward_greedy(backend, &[tok], &mut cache)
                .expect("greedy step")
        })
        .collect()
}

/// Sequence `seq` as calls of these lengths: a quarter, single tokens to the half, two tokens,
/// single tokens to the end. Returns each call's last logits, `[calls, vocab]`.
fn chunked_logits(model: &Model, backend: &dyn ComputeBackend, seq: &[u32]) -> Vec<f32> {
    let t = seq.len();
    let (q, h) = ((t / 4).max(1), t / 2);
    let mut sizes = vec![q];
    sizes.extend(std::iter::repeat(1).take(h.saturating_sub(q)));
    sizes.push(2);
    let used: usize = sizes.iter().sum();
    sizes.extend(std::iter::repeat(1).take(t - used));
    let mut cache = model.new_cache(t);
    let (mut out, mut logits, mut at) = (Vec::new(), Vec::new(), 0);
    for n in sizes {
        model
            .forward_into(
                backend,
                &seq[at..at + n],
                &mut cache,
                Logits::Last,
                &mut logits,
            )
            .unwrap_or_else(|e| panic!("forward at {at} on {}: {e}", backend.name()));
        out.extend_from_slice(&logits);
        at += n;
    }
    out
}

/// Greedy decode of `seq[..t/2]`'s continuation through [`Model::decode_greedy`]: prefill
/// `seq[..t/2]`, then `seq[t/2]` and each choice in turn, `t - t/2` choices.
fn decode_greedy_ids(model: &Model, backend: &dyn ComputeBackend, seq: &[u32]) -> Vec<u32> {
    let t = seq.len();
    let half = t / 2;
    let mut cache = model.new_cache(t);
    model
        .forward(backend, &seq[..half], &mut cache, Logits::Last)
        .expect("prefill");
    let mut ids = Vec::with_capacity(t - half);
    model
        .decode_greedy(backend, seq[half], &mut cache, t - half, |tok| {
            ids.push(tok);
            Ok(true)
        })
        .unwrap_or_else(|e| panic!("decode_greedy on {}: {e}", backend.name()));
    ids
}

/// `got` (the GPU's [`decode_greedy_ids`]) against `want` (the CPU's), step by step: `logits`
/// are the CPU's logits of each step of `want` (chunk i chose `want[i]`). Equal tokens are
/// compared (above the margin) or skipped (below it); at the first step where they differ the
/// CPU margin must be below MARGIN × `sq` (a rounding flip), and the comparison ends there
/// (the two continue from different tokens). Returns (compared, skipped).
fn check_greedy_run(
    case: &str,
    got: &[u32],
    want: &[u32],
    logits: &[f32],
    vocab: usize,
    sq: f64,
) -> (usize, usize) {
    assert_eq!(got.len(), want.len(), "{case}: greedy decode lengths");
    let (mut compared, mut skipped) = (0, 0);
    for (i, ((&g, &w), l)) in got
        .iter()
        .zip(want)
        .zip(logits.chunks_exact(vocab))
        .enumerate()
    {
        let mut sorted = l.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let margin = (sorted[0] - sorted[1]) as f64;
        if g != w {
            assert!(
                margin < MARGIN * sq,
                "{case}: decode_greedy step {i}: GPU chose {g}, CPU {w}, CPU margin {margin:e} \
                 ≥ {MARGIN} × std {sq:e}"
            );
            break;
        }
        if margin < MARGIN * sq {
            skipped += 1;
        } else {
            compared += 1;
        }
    }
    (compared, skipped)
}

fn ratio(what: &str, case: &str, got: &[f32], want: &[f32], s: f64, tol: f64) {
    let d = max_abs_diff(got, want);
    println!(
        "cuda archrefs {case} {what}: max|Δ| {d:.3e} (std {s:.3e}, ratio {:.2e}, tol {tol:.0e})",
        d / s
    );
    assert!(
        d <= tol * s,
        "{case} {what}: max|Δ| {d:e} > {tol} × std {s:e}"
    );
}

/// Quantized GPU vs CPU logits `[positions, vocab]` (see the module docs): median position
/// ratio ≤ TOL_QUANT (at most half the positions above it), all ≤ TOL_QUANT_FLIP.
fn ratio_quant(what: &str, case: &str, got: &[f32], want: &[f32], vocab: usize, s: f64) {
    let mut r: Vec<f64> = got
        .chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .map(|(g, w)| max_abs_diff(g, w) / s)
        .collect();
    r.sort_by(f64::total_cmp);
    let n = r.len();
    let above = r.iter().filter(|&&v| v > TOL_QUANT).count();
    let (median, max) = (r[n / 2], r[n - 1]);
    println!(
        "cuda archrefs {case} {what}: max|Δ|/std median {median:.2e}, max {max:.2e}; \
         {above}/{n} positions above {TOL_QUANT:.0e} (rounding flips)"
    );
    assert!(
        median <= TOL_QUANT && max <= TOL_QUANT_FLIP,
        "{case} {what}: max|Δ|/std median {median:e}, max {max:e}, {above}/{n} positions \
         above {TOL_QUANT:e}"
    );
}

fn check_case(case: &str, gpu: &CudaBackend) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, vpath) = archrefs_q4k(case, tmp.path());
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let cpu = CpuBackend::new();
    let r = StFile::open(&dir.join("reference.safetensors"));
    let shape = r.shape("input_ids");
    let (batch, t) = (shape[0], shape[1]);
    let ids = r.i64_as_u32("input_ids");
    let reference = r.f32("logits");

    // Float tier: GPU vs HF, GPU vs CPU, KV-cache decode vs HF.
    let model = Model::from_vindex_with(&vindex, &FLOAT).expect("float model");
    let vocab = model.vocab_size;
    let s = std_dev(&reference);
    let g = all_logits(&model, gpu, &ids, batch, t);
    ratio("float vs HF", case, &g, &reference, s, TOL_FLOAT);
    let c = all_logits(&model, &cpu, &ids, batch, t);
    ratio("float vs CPU", case, &g, &c, s, TOL_FLOAT);
    let before = gpu.step_stats();
    let dec = decode_logits(&model, gpu, &ids[..t]);
    let half = t / 2;
    // Decode steps of one shape: the first launched kernel by kernel, the second captured
    // into a CUDA graph, the rest replays of it (cuda/step.rs); the logits above are those
    // of the replays.
    let after = gpu.step_stats();
    let steps = (t - half) as u64;
    // An MoE layer's launches depend on the experts each token chooses (the router logits
    // come to the host between its launches), so its steps replay a graph only when the
    // choice repeats.
    let routed = model
        .layers
        .iter()
        .any(|l| matches!(l.ffn_path, FfnPath::MoeF32 | FfnPath::MoeQuantized));
    assert!(
        routed || after.replayed - before.replayed >= steps.saturating_sub(2),
        "{case}: {steps} decode steps replayed a graph {} times ({before:?} → {after:?})",
        after.replayed - before.replayed
    );
    ratio(
        "float KV decode vs HF",
        case,
        &dec,
        &reference[(half - 1) * vocab..t * vocab],
        s,
        TOL_FLOAT,
    );

    // Default quantized plan: GPU vs CPU, full sequences and KV-cache decode; greedy agreement.
    let model = Model::from_vindex(&vindex).expect("quantized model");
    let g = all_logits(&model, gpu, &ids, batch, t);
    let c = all_logits(&model, &cpu, &ids, batch, t);
    let sq = std_dev(&c);
    ratio_quant(
        &format!("quantized ({}) vs CPU", model.plan),
        case,
        &g,
        &c,
        vocab,
        sq,
    );
    let gd = decode_logits(&model, gpu, &ids[..t]);
    let cd = decode_logits(&model, &cpu, &ids[..t]);
    ratio_quant("quantized KV decode vs CPU", case, &gd, &cd, vocab, sq);
    let gpu_ids: Vec<u32> = g.chunks_exact(vocab).map(argmax).collect();
    let (compared, skipped) = check_greedy(case, "quantized greedy token", &gpu_ids, &c, vocab, sq);
    println!("cuda archrefs {case}: quantized greedy tokens equal at {compared} positions ({skipped} below margin)");
    // The forward pass's device argmax on its decode steps (the greedy choices of `cd`).
    let ids_fwd = forward_greedy_ids(&model, gpu, &ids[..t]);
    let (compared, skipped) = check_greedy(
        case,
        "forward-pass device argmax",
        &ids_fwd,
        &cd[vocab..],
        vocab,
        sq,
    );
    assert!(compared > 0, "{case}: no decode step above the margin");
    println!("cuda archrefs {case}: forward-pass device argmax equal at {compared} steps ({skipped} below margin)");

    // Calls of mixed lengths through one cache (decode steps between prompt chunks).
    let gd = chunked_logits(&model, gpu, &ids[..t]);
    let cd = chunked_logits(&model, &cpu, &ids[..t]);
    ratio_quant("chunked forward vs CPU", case, &gd, &cd, vocab, sq);
    // Greedy decode, each choice fed back (on CUDA chosen and fed on the device).
    let ids_gpu = decode_greedy_ids(&model, gpu, &ids[..t]);
    let ids_cpu = decode_greedy_ids(&model, &cpu, &ids[..t]);
    // The CPU's logits of each of its steps: seq[..t/2] prefilled, then seq[t/2] and its
    // choices but the last, one at a time ([`decode_logits`] past the prefill's chunk).
    let mut path = ids[..=half].to_vec();
    path.extend_from_slice(&ids_cpu[..ids_cpu.len() - 1]);
    let cpu_steps = &decode_logits(&model, &cpu, &path)[vocab..];
    for (i, l) in cpu_steps.chunks_exact(vocab).enumerate() {
        assert_eq!(
            argmax(l),
            ids_cpu[i],
            "{case}: CPU decode_greedy vs its logits at {i}"
        );
    }
    let (compared, skipped) = check_greedy_run(case, &ids_gpu, &ids_cpu, cpu_steps, vocab, sq);
    assert!(
        compared > 0,
        "{case}: no decode_greedy step above the margin"
    );
    println!(
        "cuda archrefs {case}: decode_greedy tokens equal at {compared} steps ({skipped} below \
         margin) of {}",
        ids_cpu.len()
    );
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn llama_on_cuda_matches_hf_and_cpu() {
    check_case("llama", &gpu());
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn gemma3_on_cuda_matches_hf_and_cpu() {
    check_case("gemma3", &gpu());
}

/// The families of `../shared/archrefs-next`: Qwen3-MoE, gpt-oss (attention sinks and YaRN in
/// the device kernels, MoE on the host), Cohere-2 (interleaved RoPE on the sliding layers only).
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn archrefs_next_cases_on_cuda() {
    let gpu = gpu();
    for case in ["qwen3-moe", "gpt-oss", "cohere2"] {
        check_case(case, &gpu);
        println!("cuda archrefs {case}: ok");
    }
}

/// Every other archrefs case folder (all 19 in all).
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn every_archrefs_case_on_cuda() {
    let gpu = gpu();
    let names = common::archrefs_cases_except(&["llama", "gemma3"]);
    let failed: Vec<&String> = names
        .iter()
        .filter(|n| {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_case(n, &gpu)))
                .is_ok();
            println!("cuda archrefs {n}: {}", if ok { "ok" } else { "FAILED" });
            !ok
        })
        .collect();
    assert!(
        failed.is_empty(),
        "archrefs cases failed on CUDA: {failed:?}"
    );
}
