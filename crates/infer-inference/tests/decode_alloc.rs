//! Issue 6, "no allocation per token": after warm-up, a decode step on the quantized (q4k)
//! plan through [`Model::forward_into`] (reused logits buffer, scratch buffers in the cache)
//! makes **zero** heap allocations, on a 1-thread and on a 2-thread rayon pool (SmolLM2 also
//! with an f16 KV cache).
//!
//! A global allocator counts every `alloc`/`alloc_zeroed`/`realloc` made by the measured pool's
//! workers and by the test thread driving it (threads of other pools, starting or exiting
//! concurrently, are not counted; this file holds a single test). infer-compute keeps its
//! kernel temporaries (quantized activations, attention scores, RoPE cos/sin and inverse
//! frequencies) in per-thread buffers that only grow, and plans `quant_matmul_many`'s tasks in
//! fixed arrays, so once every pool thread has run each kernel at its size nothing is allocated.
//! Which worker runs a forward pass or steals which task is up to rayon, so before measuring
//! every worker runs one prefill and one decode step on a cache of its own (`broadcast`).
//!
//! Cases: the archrefs `llama` and `gemma3` models (tiny: every product runs serially, but the
//! sliding window, two RoPE configurations and q/k norms of Gemma are on the path), and the real
//! SmolLM2-135M (GGUF from `INFER_MODELS`), whose products are large enough to be split across
//! both workers of the 2-thread pool (Q5_0/Q8_0 tile kernels, the AVX-512 Q6_K tile kernel or the
//! fused Q6_K kernel, the parallel attention path from ~7 cached positions on).
//!
//! Every step runs inside one `pool.install`, i.e. on a pool worker. rayon itself allocates
//! nothing there (work-stealing joins use stack jobs and preallocated deques). A caller *outside*
//! the pool (the CLI's main thread) also enters it once per forward pass (`rayon::scope`), which
//! pushes one job on rayon's global injector queue (crossbeam `Injector`); that queue allocates a
//! block every 63 pushes, i.e. one allocation per 63 decoded tokens, outside infer-compute and
//! infer-inference; the last check of the test measures exactly that.

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
/// The thread group whose allocations are counted (0: none).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Next thread-group id (1 is the global pool).
static NEXT_GROUP: AtomicUsize = AtomicUsize::new(2);
const GLOBAL_GROUP: usize = 1;
static TRACE: AtomicBool = AtomicBool::new(false);
/// Innermost `infer_*` (or `rayon`/`crossbeam`) frame of each allocation made while `TRACE` is set.
static SITES: Mutex<Vec<String>> = Mutex::new(Vec::new());
thread_local! {
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
    /// The thread group of this thread: the workers of one pool plus the test thread while it
    /// drives that pool.
    static GROUP: Cell<usize> = const { Cell::new(0) };
}

/// Count one allocation of the active thread group; while tracing, record where it came from
/// (re-entrant allocations made by the backtrace itself are neither counted nor traced).
fn record() {
    let group = GROUP.with(|g| g.get());
    if IN_TRACE.with(|g| g.get()) || group == 0 || group != ACTIVE.load(Ordering::SeqCst) {
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
        .find(|l| l.contains("infer_") || l.contains("rayon") || l.contains("crossbeam"))
        .map_or_else(
            || "<no infer_/rayon frame>".to_string(),
            |l| l.trim().to_string(),
        );
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

/// Decode steps measured per case, after the warm-up steps.
const STEPS: usize = 16;
/// Decode steps before measuring: the first single-token step sizes the scratch buffers of
/// every kernel on the thread that runs it; on the 2-thread pool the second worker needs to
/// have stolen each kind of task once.
const WARM_UP: usize = 4;

/// A pool whose workers form a new thread group; returns it with the group id.
fn pool(threads: usize) -> (rayon::ThreadPool, usize) {
    let id = NEXT_GROUP.fetch_add(1, Ordering::SeqCst);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| GROUP.with(|g| g.set(id)))
        .build()
        .expect("thread pool");
    (pool, id)
}

/// Count the allocations of thread group `id` and of this thread while `f` runs.
fn counting<R>(id: usize, f: impl FnOnce() -> R) -> R {
    let mine = GROUP.with(|g| g.replace(id));
    ACTIVE.store(id, Ordering::SeqCst);
    let r = f();
    ACTIVE.store(0, Ordering::SeqCst);
    GROUP.with(|g| g.set(mine));
    r
}

fn prompt_for(model: &Model<'_>, len: usize) -> Vec<u32> {
    let vocab = model.vocab_size as u32;
    (0..len as u32).map(|i| (i * 7919 + 17) % vocab).collect()
}

/// Run a prefill and one decode step on every worker of the current pool (each on its own
/// cache), so that each worker's per-thread kernel buffers have their decode sizes: which worker
/// runs a forward pass, or steals which task, is up to rayon.
fn warm_workers(model: &Model<'_>, backend: &CpuBackend, prompt: &[u32]) {
    rayon::broadcast(|_| {
        let mut cache = model.new_cache(prompt.len() + 2);
        let mut logits = Vec::new();
        model
            .forward_into(backend, prompt, &mut cache, Logits::Last, &mut logits)
            .expect("warm-up prefill");
        let tok = infer_inference::sampling::argmax(&logits);
        model
            .forward_into(backend, &[tok], &mut cache, Logits::Last, &mut logits)
            .expect("warm-up decode");
    });
}

/// Allocations of each measured decode step, and the allocation sites of one more traced step.
/// Panics if the buffered `forward_into` and the allocating `forward` disagree.
fn decode_allocs(
    model: &Model<'_>,
    backend: &CpuBackend,
    (pool, group): &(rayon::ThreadPool, usize),
    prompt: &[u32],
) -> (Vec<usize>, Vec<String>) {
    let total = WARM_UP + STEPS + 1;
    pool.install(|| warm_workers(model, backend, prompt));
    let (per_step, sites, reference) = counting(*group, || {
        pool.install(|| {
            let mut cache = model.new_cache(prompt.len() + total + 1);
            let mut logits = Vec::new();
            model
                .forward_into(backend, prompt, &mut cache, Logits::Last, &mut logits)
                .expect("prefill");
            let mut step = |logits: &mut Vec<f32>| {
                let tok = infer_inference::sampling::argmax(logits);
                let a0 = ALLOCS.load(Ordering::SeqCst);
                model
                    .forward_into(backend, &[tok], &mut cache, Logits::Last, logits)
                    .expect("decode");
                ALLOCS.load(Ordering::SeqCst) - a0
            };
            for _ in 0..WARM_UP {
                step(&mut logits);
            }
            let per_step: Vec<usize> = (0..STEPS).map(|_| step(&mut logits)).collect();
            SITES.lock().expect("sites").clear();
            TRACE.store(true, Ordering::SeqCst);
            step(&mut logits);
            TRACE.store(false, Ordering::SeqCst);
            let sites = std::mem::take(&mut *SITES.lock().expect("sites"));
            (per_step, sites, logits)
        })
    });

    // The buffered path computes the same logits as the allocating `forward`.
    let mut cache = model.new_cache(prompt.len() + total + 1);
    let mut logits = pool
        .install(|| model.forward(backend, prompt, &mut cache, Logits::Last))
        .expect("prefill");
    for _ in 0..total {
        let tok = infer_inference::sampling::argmax(&logits);
        logits = pool
            .install(|| model.forward(backend, &[tok], &mut cache, Logits::Last))
            .expect("decode");
    }
    assert_eq!(logits, reference, "forward_into and forward disagree");
    (per_step, sites)
}

fn check_zero(case: &str, model: &Model<'_>, backend: &CpuBackend, prompt_len: usize) {
    for threads in [1, 2] {
        let (per_step, sites) = decode_allocs(
            model,
            backend,
            &pool(threads),
            &prompt_for(model, prompt_len),
        );
        eprintln!("{case}, {threads} thread(s): allocations per decode step {per_step:?}");
        assert!(
            per_step.iter().all(|&n| n == 0) && sites.is_empty(),
            "{case}, {threads}-thread pool: allocations per decode step {per_step:?}, want 0; \
             sites of a traced step (innermost infer_/rayon frame): {sites:#?}"
        );
    }
}

fn q4k_model<'a>(v: &'a Vindex) -> Model<'a> {
    let model = Model::from_vindex_with(v, &FormatRequest::default()).expect("model");
    assert!(
        model.layers.iter().all(|l| l.ffn_path == FfnPath::Q4K),
        "the default plan of a q4k vindex runs the q4k FFN"
    );
    model
}

#[test]
fn quantized_decode_steps_allocate_nothing() {
    // The global pool (used by the last check) gets 2 workers before anything touches it.
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .start_handler(|_| GROUP.with(|g| g.set(GLOBAL_GROUP)))
        .build_global()
        .expect("global rayon pool built first");
    let tmp = tempfile::tempdir().expect("tempdir");
    for case in ["llama", "gemma3"] {
        let (_, path) = archrefs_q4k(case, tmp.path());
        let v = Vindex::open(&path).expect("open vindex");
        check_zero(case, &q4k_model(&v), &CpuBackend::new(), 8);
    }

    let path = smollm2_with(tmp.path(), infer_vindex::QuantTiers::Q4K);
    let v = Vindex::open(&path).expect("open vindex");
    let model = q4k_model(&v);
    check_zero("SmolLM2-135M", &model, &CpuBackend::new(), 12);
    // An f16 KV cache (`--kv-type f16`): its rows rounded in place, read by the same kernels.
    let f16_cache = CpuBackend::new().with_kv_type(infer_compute::KvType::F16);
    check_zero("SmolLM2-135M, f16 KV cache", &model, &f16_cache, 12);

    // From outside the pool (the CLI): each forward pass enters the global 2-thread pool once
    // (`rayon::scope`), one push on rayon's injector queue, which allocates one block per 63
    // pushes (crossbeam-deque `Injector`, BLOCK_CAP 63). Over 126 steps: exactly 2.
    assert!(rayon::current_thread_index().is_none());
    let backend = CpuBackend::new();
    let prompt = prompt_for(&model, 12);
    let steps = 126;
    let mut cache = model.new_cache(prompt.len() + WARM_UP + steps + 1);
    let mut logits = Vec::new();
    model
        .forward_into(&backend, &prompt, &mut cache, Logits::Last, &mut logits)
        .expect("prefill");
    for _ in 0..WARM_UP {
        let tok = infer_inference::sampling::argmax(&logits);
        model
            .forward_into(&backend, &[tok], &mut cache, Logits::Last, &mut logits)
            .expect("decode");
    }
    SITES.lock().expect("sites").clear();
    TRACE.store(true, Ordering::SeqCst);
    warm_workers(&model, &backend, &prompt);
    let a0 = ALLOCS.load(Ordering::SeqCst);
    counting(GLOBAL_GROUP, || {
        for _ in 0..steps {
            let tok = infer_inference::sampling::argmax(&logits);
            model
                .forward_into(&backend, &[tok], &mut cache, Logits::Last, &mut logits)
                .expect("decode");
        }
    });
    let outside = ALLOCS.load(Ordering::SeqCst) - a0;
    TRACE.store(false, Ordering::SeqCst);
    let sites = std::mem::take(&mut *SITES.lock().expect("sites"));
    eprintln!("SmolLM2-135M, called from outside the 2-thread pool: {outside} allocations in {steps} steps at {sites:#?}");
    assert_eq!(
        outside, 2,
        "{steps} decode steps entered from outside the pool: want exactly the 2 blocks of rayon's injector"
    );
    assert!(
        sites
            .iter()
            .all(|s| s.contains("crossbeam_deque::deque::Block")),
        "allocations from outside the pool not in rayon's injector: {sites:#?}"
    );
}
