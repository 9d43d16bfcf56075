//! Issue 6, "no allocation per token": after warm-up, a decode step on the quantized (q4k)
//! plan through [`Model::forward_into`] (reused logits buffer, scratch buffers in the cache)
//! allocates nothing in infer-inference's own code.
//!
//! A global allocator counts every `alloc`/`alloc_zeroed`/`realloc` of the process (this file
//! holds a single test, so no other test thread allocates meanwhile). What remains per step are
//! infer-compute's kernel temporaries (activation quantization `Q8Rows::quantize`, the task
//! lists of `quant_matmul_many`, RoPE's per-call `inv_freq`/cos/sin buffers, attention's score
//! buffer): 26 per layer on this model, a constant independent of the position. The test checks
//! (1) the per-step count is the same at every step and at most that budget, and (2) by
//! attributing one step's allocations to the innermost `infer_*` frame of a backtrace, that
//! none of them comes from outside infer-compute.
//!
//! Model: the archrefs `llama` case (3 layers, hidden 64) extracted with the q4k tier, default
//! plan; a 1-thread rayon pool so that the count is deterministic (rayon's `for_each_init` in
//! the compute kernels allocates per split on a multi-thread pool).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use common::*;
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::{FfnPath, FormatRequest, Model};
use infer_vindex::Vindex;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);
/// Innermost `infer_*` frame of each allocation made while `TRACE` is set.
static SITES: Mutex<Vec<String>> = Mutex::new(Vec::new());
thread_local!(static IN_TRACE: Cell<bool> = const { Cell::new(false) });

/// Count one allocation; while tracing, record where it came from (re-entrant allocations made
/// by the backtrace itself are neither counted as sites nor traced).
fn record() {
    if IN_TRACE.with(|g| g.get()) {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    if !TRACE.load(Ordering::Relaxed) {
        return;
    }
    IN_TRACE.with(|g| g.set(true));
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let site = bt
        .lines()
        .find(|l| l.contains("infer_"))
        .map_or_else(|| "<no infer_ frame>".to_string(), |l| l.trim().to_string());
    if let Ok(mut s) = SITES.lock() {
        s.push(site);
    }
    IN_TRACE.with(|g| g.set(false));
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        record();
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        record();
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        record();
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// infer-compute's kernel temporaries per layer and decode step on this model (see the module
/// docs); measured 26 = 13 `Q8Rows::quantize` + 6 `quant_matmul_many` + 4 `Rope::apply` +
/// 2 `RopeConfig::inv_freq` + 1 `attention`.
const COMPUTE_ALLOCS_PER_LAYER: usize = 26;

#[test]
fn llama_q4k_decode_steps_allocate_nothing_in_infer_inference() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = extract_with(
        &shared_dir().join("archrefs").join("llama"),
        tmp.path(),
        "llama",
        "f32",
        None,
        infer_vindex::QuantTiers::Q4K,
    );
    let v = Vindex::open(&path).expect("open vindex");
    let model = Model::from_vindex_with(&v, &FormatRequest::default()).expect("model");
    assert!(
        model.layers.iter().all(|l| l.ffn_path == FfnPath::Q4K),
        "the default plan of a q4k vindex runs the q4k FFN"
    );
    let backend = CpuBackend::new();
    let steps = 16;
    let prompt: Vec<u32> = (0..8u32).map(|i| (i * 31 + 5) % 100).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("1-thread pool");
    let (per_step, reference) = pool.install(|| {
        let mut cache = model.new_cache(prompt.len() + steps + 4);
        let mut logits = Vec::new();
        model
            .forward_into(&backend, &prompt, &mut cache, Logits::Last, &mut logits)
            .expect("prefill");
        let mut step = |logits: &mut Vec<f32>| {
            let tok = infer_inference::sampling::argmax(logits);
            let a0 = ALLOCS.load(Ordering::SeqCst);
            model
                .forward_into(&backend, &[tok], &mut cache, Logits::Last, logits)
                .expect("decode");
            ALLOCS.load(Ordering::SeqCst) - a0
        };
        // Warm-up: the scratch buffers grew during prefill; one decode step settles anything
        // sized by the first single-token batch.
        step(&mut logits);
        let per_step: Vec<usize> = (0..steps).map(|_| step(&mut logits)).collect();
        TRACE.store(true, Ordering::SeqCst);
        step(&mut logits);
        TRACE.store(false, Ordering::SeqCst);
        (per_step, logits)
    });
    eprintln!("allocations per decode step after warm-up: {per_step:?}");

    // The buffered path computes the same logits as the allocating `forward`.
    let mut cache = model.new_cache(prompt.len() + steps + 4);
    let mut logits = pool
        .install(|| model.forward(&backend, &prompt, &mut cache, Logits::Last))
        .expect("prefill");
    for _ in 0..steps + 2 {
        let tok = infer_inference::sampling::argmax(&logits);
        logits = pool
            .install(|| model.forward(&backend, &[tok], &mut cache, Logits::Last))
            .expect("decode");
    }
    assert_eq!(logits, reference, "forward_into and forward disagree");

    let budget = COMPUTE_ALLOCS_PER_LAYER * model.layers.len();
    assert!(
        per_step.iter().all(|&n| n == per_step[0] && n <= budget),
        "allocations per step {per_step:?}: want a constant ≤ {budget} (infer-compute temporaries)"
    );
    let sites = SITES.lock().expect("sites").clone();
    assert_eq!(
        sites.len(),
        per_step[0],
        "traced step allocated differently"
    );
    let foreign: Vec<&String> = sites
        .iter()
        .filter(|s| !s.contains("infer_compute::"))
        .collect();
    assert!(
        foreign.is_empty(),
        "allocations outside infer-compute during a decode step (innermost infer_ frame): {foreign:#?}"
    );
}
