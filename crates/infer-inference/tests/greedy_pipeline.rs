//! [`Model::decode_greedy`] gives the tokens of a loop of [`Model::forward_greedy`] and leaves
//! the same cache, whether the backend makes its choices on the host at once (the CPU backend)
//! or keeps them until they are read, as a device does (`HeldChoices` below: the CPU backend's
//! products, with choices handed out only through `take_chosen` and looked up by
//! `embed_chosen`). With held choices, `decode_greedy` runs each next step from the held
//! choice before reading it and drops a step run ahead of a stop from the cache; a cache left
//! wrong (a position too many, a row of the dropped step) changes the logits of the token run
//! after the stop, which are compared bit for bit with the loop's.
//!
//! Cases: archrefs `llama`, `gemma3` (embedding scale) and `qwen3-moe` (routed experts), on
//! the quantized plan; stops by `on_token` after 1, 2 and 5 choices, by `max_new`, and by a
//! full cache. And [`Model::forward_batch_later`]: three sequences stepped together, each step
//! fed by the choices of the one before, choose what host-fed batches choose.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use common::*;
use infer_compute::{
    Argmax, Chosen, ComputeBackend, ComputeError, CpuBackend, FloatTable, Matrix, Proj, Tensor,
};
use infer_inference::forward::{BatchBuffers, BatchSeq, Logits};
use infer_inference::{KvCache, Model};
use infer_vindex::Vindex;

/// The CPU backend, holding its greedy choices as a device does: the last two steps' choices
/// by ticket, readable only through `take_chosen`, and embeddable without reading only for the
/// last one.
struct HeldChoices {
    cpu: CpuBackend,
    held: Mutex<Vec<(u64, Vec<Argmax>)>>,
    tickets: AtomicU64,
}

impl HeldChoices {
    fn new() -> Self {
        HeldChoices {
            cpu: CpuBackend::new(),
            held: Mutex::new(Vec::new()),
            tickets: AtomicU64::new(0),
        }
    }

    fn held(&self, ticket: u64) -> Option<Vec<Argmax>> {
        let held = self.held.lock().expect("held");
        held.iter()
            .find(|(t, _)| *t == ticket)
            .map(|(_, v)| v.clone())
    }
}

impl ComputeBackend for HeldChoices {
    fn name(&self) -> &str {
        "held-choices"
    }

    fn routes_on_device(&self) -> bool {
        self.cpu.routes_on_device()
    }

    fn matmul_transb(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cpu.matmul_transb(a, b, m, k, n, c)
    }

    fn matmul(
        &self,
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cpu.matmul(a, b, m, k, n, c)
    }

    fn gemv(
        &self,
        b: &[f32],
        x: &[f32],
        n: usize,
        k: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cpu.gemv(b, x, n, k, y)
    }

    fn matmul_transb_f16(
        &self,
        a: &[f32],
        b: &[half::f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cpu.matmul_transb_f16(a, b, m, k, n, c)
    }

    fn matmul_f16(
        &self,
        a: &[f32],
        b: &[half::f16],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cpu.matmul_f16(a, b, m, k, n, c)
    }

    fn linear(
        &self,
        w: &Matrix<'_>,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cpu.linear(w, x, m, y)
    }

    fn linear_many(&self, x: &[f32], m: usize, projs: &mut [Proj<'_>]) -> Result<(), ComputeError> {
        self.cpu.linear_many(x, m, projs)
    }

    fn argmax_rows_later(
        &self,
        logits: &Tensor,
        width: usize,
        chosen: &mut Chosen,
    ) -> Result<(), ComputeError> {
        let mut picks = Vec::new();
        self.cpu.argmax_rows(logits, width, &mut picks)?;
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) + 1;
        *chosen = Chosen {
            rows: picks.len(),
            host: None,
            ticket,
        };
        let mut held = self.held.lock().expect("held");
        held.push((ticket, picks));
        let old = held.len().saturating_sub(2);
        held.drain(..old);
        Ok(())
    }

    fn take_chosen(&self, chosen: &Chosen, out: &mut Vec<Argmax>) -> Result<(), ComputeError> {
        let picks = self.held(chosen.ticket).ok_or(ComputeError::NotOnHost {
            op: "take_chosen: choices no longer held",
        })?;
        *out = picks;
        Ok(())
    }

    fn embed_chosen(
        &self,
        table: FloatTable<'_>,
        width: usize,
        chosen: &Chosen,
        scale: f32,
        out: &mut Tensor,
    ) -> Result<(), ComputeError> {
        let latest = self.tickets.load(Ordering::Relaxed);
        assert_eq!(
            chosen.ticket, latest,
            "embed_chosen of choices that are not the last made"
        );
        let picks = self.held(chosen.ticket).expect("the last choices are held");
        let ids: Vec<u32> = picks.iter().map(|a| a.token).collect();
        self.cpu.embed(table, width, &ids, scale, out)
    }
}

/// The reference: `prompt`, then `forward_greedy` from its greedy choice until `n` choices are
/// made or the cache is full; the choices and the cache (holding the prompt and every choice
/// but the last).
fn loop_of_steps(model: &Model<'_>, prompt: &[u32], ctx: usize, n: usize) -> (Vec<u32>, KvCache) {
    let cpu = CpuBackend::new();
    let mut cache = model.new_cache(ctx);
    let logits = model
        .forward(&cpu, prompt, &mut cache, Logits::Last)
        .expect("prompt");
    let mut tok = infer_inference::sampling::argmax(&logits);
    let mut made = vec![];
    // The first choice of `decode_greedy` is the step of its `first` (the prompt's choice).
    while made.len() < n && cache.check_room(1).is_ok() {
        tok = model
            .forward_greedy(&cpu, &[tok], &mut cache)
            .expect("greedy step");
        made.push(tok);
    }
    (made, cache)
}

/// `decode_greedy` on `backend` from the prompt's greedy choice, stopping after `stop_after`
/// choices (by `on_token`) or `n`; the choices and the cache.
fn pipelined(
    model: &Model<'_>,
    backend: &dyn ComputeBackend,
    prompt: &[u32],
    ctx: usize,
    n: usize,
    stop_after: usize,
) -> (Vec<u32>, KvCache) {
    let cpu = CpuBackend::new();
    let mut cache = model.new_cache(ctx);
    let logits = model
        .forward(&cpu, prompt, &mut cache, Logits::Last)
        .expect("prompt");
    let first = infer_inference::sampling::argmax(&logits);
    let mut made = vec![];
    let count = model
        .decode_greedy(backend, first, &mut cache, n, |t| {
            made.push(t);
            Ok(made.len() < stop_after)
        })
        .expect("decode_greedy");
    assert_eq!(count, made.len(), "decode_greedy's count");
    (made, cache)
}

fn check_case(case: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, vpath) = archrefs_q4k(case, tmp.path());
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let model = Model::from_vindex(&vindex).expect("model");
    let r = StFile::open(&dir.join("reference.safetensors"));
    let t = r.shape("input_ids")[1].min(8);
    let prompt = r.i64_as_u32("input_ids")[..t].to_vec();
    let cpu = CpuBackend::new();
    let held = HeldChoices::new();
    // (context, max_new, stop after): on_token stops, max_new stops, the cache fills.
    let runs = [
        (t + 16, 8, 1),
        (t + 16, 8, 2),
        (t + 16, 8, 5),
        (t + 16, 6, usize::MAX),
        (t + 4, 100, usize::MAX),
    ];
    for (ctx, n, stop_after) in runs {
        for (name, backend) in [("cpu", &cpu as &dyn ComputeBackend), ("held", &held)] {
            let (want, mut want_cache) = loop_of_steps(&model, &prompt, ctx, n.min(stop_after));
            let label = format!("{case} {name} ctx {ctx} max_new {n} stop after {stop_after}");
            let (got, mut cache) = pipelined(&model, backend, &prompt, ctx, n, stop_after);
            assert_eq!(got, want, "{label}: tokens");
            assert_eq!(cache.len(), want_cache.len(), "{label}: cache length");
            if cache.check_room(1).is_err() {
                continue;
            }
            // The last choice run on both caches: any difference in what they hold shows.
            let last = *got.last().expect("a choice");
            let a = model
                .forward(&cpu, &[last], &mut cache, Logits::Last)
                .expect("after");
            let b = model
                .forward(&cpu, &[last], &mut want_cache, Logits::Last)
                .expect("after");
            assert!(a == b, "{label}: logits after the stop differ");
        }
    }
}

/// Three sequences (prompts of 3, 5 and 8 tokens) prefilled, then `steps` greedy steps of all
/// three: through [`Model::forward_batch_greedy`] with the host feeding the ids (the
/// reference), and through [`Model::forward_batch_later`] on `backend`, each step fed by the
/// choices of the one before; the choices of every step must be equal.
fn check_batch(model: &Model<'_>, prompt: &[u32], backend: &dyn ComputeBackend, label: &str) {
    let steps = 5;
    let prompts = [&prompt[..3], &prompt[..5], prompt];
    let ctx = prompt.len() + steps + 2;
    let run = |later: bool| -> Vec<Vec<u32>> {
        let cpu = CpuBackend::new();
        let mut caches: Vec<KvCache> = prompts.iter().map(|_| model.new_cache(ctx)).collect();
        let mut bufs = BatchBuffers::default();
        let mut next = Vec::new();
        for (c, p) in caches.iter_mut().zip(prompts) {
            let logits = model.forward(&cpu, p, c, Logits::Last).expect("prompt");
            next.push(infer_inference::sampling::argmax(&logits));
        }
        let mut made = vec![];
        let (mut cur, mut fed) = (Chosen::default(), Chosen::default());
        let mut picks = Vec::new();
        for step in 0..steps {
            let mut seqs: Vec<BatchSeq<'_>> = caches
                .iter_mut()
                .zip(next.chunks(1))
                .map(|(cache, tokens)| BatchSeq {
                    tokens,
                    cache,
                    logits: Logits::Last,
                })
                .collect();
            if later {
                std::mem::swap(&mut cur, &mut fed);
                let feed = (step > 0).then_some(&fed);
                model
                    .forward_batch_later(backend, &mut seqs, &mut bufs, feed, &mut cur)
                    .expect("forward_batch_later");
                if step > 0 {
                    backend.take_chosen(&fed, &mut picks).expect("take_chosen");
                    made.push(picks.iter().map(|a| a.token).collect());
                }
            } else {
                model
                    .forward_batch_greedy(&cpu, &mut seqs, &mut bufs, &mut picks)
                    .expect("forward_batch_greedy");
                let ids: Vec<u32> = picks.iter().map(|a| a.token).collect();
                next.clone_from(&ids);
                made.push(ids);
            }
        }
        if later {
            backend.take_chosen(&cur, &mut picks).expect("take_chosen");
            made.push(picks.iter().map(|a| a.token).collect());
        }
        made
    };
    assert_eq!(
        run(true),
        run(false),
        "{label}: batched choices step by step"
    );
}

#[test]
fn forward_batch_later_matches_host_fed_batches() {
    for case in ["llama", "qwen3-moe"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (dir, vpath) = archrefs_q4k(case, tmp.path());
        let vindex = Vindex::open(&vpath).expect("open vindex");
        let model = Model::from_vindex(&vindex).expect("model");
        let r = StFile::open(&dir.join("reference.safetensors"));
        let t = r.shape("input_ids")[1].min(8);
        let prompt = r.i64_as_u32("input_ids")[..t].to_vec();
        check_batch(&model, &prompt, &CpuBackend::new(), &format!("{case} cpu"));
        check_batch(
            &model,
            &prompt,
            &HeldChoices::new(),
            &format!("{case} held"),
        );
        println!("forward_batch_later {case}: ok");
    }
}

#[test]
fn decode_greedy_matches_a_loop_of_greedy_steps() {
    for case in ["llama", "gemma3", "qwen3-moe"] {
        check_case(case);
        println!("decode_greedy {case}: ok");
    }
}
