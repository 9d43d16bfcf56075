//! [`TokenRunner`] keeps the host KV cache and a device decoder's cache in step, without a GPU:
//! a test backend (`MirrorBackend`: the CPU backend's products) offers a [`TokenDecoder`] that
//! holds its own KV cache, filled with NaN where nothing was written, and runs each step through
//! [`Model::forward`] on it. Any row the runner fails to copy (host → decoder before a device
//! step, decoder → host before a host pass) is NaN or stale there and changes the logits; a
//! correct runner gives logits bit-identical to the plain CPU host loop for the same calls.
//!
//! Cases: archrefs `llama` and `gemma3` (q4k tier, which has a decode plan), sequence 0 as
//! calls of a quarter, single tokens to the half, two tokens, single tokens to the end; then the
//! cache is truncated (as a chat front end may do) and decoding goes on. Greedy decoding through
//! [`TokenRunner::forward_greedy`] (the decoder's `step_argmax`) gives the host loop's tokens.

mod common;

use common::*;
use infer_compute::{
    Argmax, ComputeBackend, ComputeError, CpuBackend, DecodePlan, Matrix, Proj, TokenDecoder,
};
use infer_inference::forward::Logits;
use infer_inference::sampling::argmax;
use infer_inference::{KvCache, Model, TokenRunner};
use infer_vindex::Vindex;

/// The CPU backend's products plus a [`MirrorDecoder`] over `model`.
struct MirrorBackend<'m, 'a> {
    cpu: CpuBackend,
    model: &'m Model<'a>,
}

/// A "device" decoder whose device is a second host KV cache.
struct MirrorDecoder<'m, 'a> {
    cpu: CpuBackend,
    model: &'m Model<'a>,
    cache: KvCache,
}

impl TokenDecoder for MirrorDecoder<'_, '_> {
    fn write_kv(
        &mut self,
        layer: usize,
        start: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), ComputeError> {
        self.cache
            .write_rows(&self.cpu, layer, start, k, v)
            .expect("mirror rows");
        Ok(())
    }

    fn read_kv(
        &mut self,
        layer: usize,
        start: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), ComputeError> {
        self.cache
            .read_rows(&self.cpu, layer, start, k, v)
            .expect("mirror rows");
        Ok(())
    }

    fn step(&mut self, token: u32, pos: usize, logits: &mut [f32]) -> Result<(), ComputeError> {
        // Rows 0..pos are whatever was written or computed here; position pos is the token's.
        self.cache.truncate(pos);
        self.cache.advance(pos - self.cache.len());
        let l = self
            .model
            .forward(&self.cpu, &[token], &mut self.cache, Logits::Last)
            .expect("mirror forward");
        logits.copy_from_slice(&l);
        Ok(())
    }

    fn step_argmax(&mut self, token: u32, pos: usize) -> Result<Option<Argmax>, ComputeError> {
        let mut logits = vec![0.0; self.model.vocab_size];
        self.step(token, pos, &mut logits)?;
        Ok(Some(Argmax {
            token: argmax(&logits),
            all_finite: logits.iter().all(|v| v.is_finite()),
        }))
    }
}

impl ComputeBackend for MirrorBackend<'_, '_> {
    fn name(&self) -> &str {
        "mirror"
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
    fn token_decoder<'s>(
        &'s self,
        plan: &DecodePlan<'_>,
    ) -> Result<Option<Box<dyn TokenDecoder + 's>>, ComputeError> {
        let mut cache = self.model.new_cache(plan.context);
        cache.ensure(&self.cpu).expect("allocate the mirror cache");
        for l in 0..cache.layers() {
            let nan = vec![f32::NAN; plan.context * cache.kv_dim(l)];
            cache
                .write_rows(&self.cpu, l, 0, &nan, &nan)
                .expect("mirror rows");
        }
        Ok(Some(Box::new(MirrorDecoder {
            cpu: CpuBackend::new(),
            model: self.model,
            cache,
        })))
    }
}

/// The forward calls of one [`run`]: the calls `calls` (token counts) over `seq`, then, after
/// truncating the cache to `cut` positions, the calls `after` over `seq2` (the same tokens as
/// `seq` up to `cut`, other tokens after it, so rows left over from the first pass would change
/// the logits).
struct Calls<'a> {
    seq: &'a [u32],
    calls: &'a [usize],
    cut: usize,
    seq2: &'a [u32],
    after: &'a [usize],
}

/// Each call's last logits for the calls `c`; `expect_device`: whether the runner must run on
/// the backend's decoder.
fn run(
    model: &Model,
    backend: &dyn ComputeBackend,
    c: &Calls<'_>,
    expect_device: bool,
) -> Vec<Vec<f32>> {
    let &Calls {
        seq,
        calls,
        cut,
        seq2,
        after,
    } = c;
    let mut cache = model.new_cache(seq.len());
    let mut runner = TokenRunner::new(model, backend, seq.len(), true).expect("runner");
    assert_eq!(
        runner.on_device(),
        expect_device,
        "{:?}",
        runner.host_reason
    );
    let (mut out, mut logits, mut at) = (Vec::new(), Vec::new(), 0);
    let mut go = |tokens: &[u32], cache: &mut KvCache| {
        runner
            .forward_into(tokens, cache, Logits::Last, &mut logits)
            .expect("forward");
        out.push(logits.clone());
    };
    for &n in calls {
        go(&seq[at..at + n], &mut cache);
        at += n;
    }
    cache.truncate(cut);
    at = cut;
    for &n in after {
        go(&seq2[at..at + n], &mut cache);
        at += n;
    }
    out
}

fn check(case: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, path) = archrefs_q4k(case, tmp.path());
    let vindex = Vindex::open(&path).expect("open vindex");
    let model = Model::from_vindex(&vindex).expect("model");
    let r = StFile::open(&dir.join("reference.safetensors"));
    let t = r.shape("input_ids")[1];
    let seq = &r.i64_as_u32("input_ids")[..t];
    let (q, h) = (t / 4, t / 2);
    let mut calls = vec![q];
    calls.extend(std::iter::repeat(1).take(h - q));
    calls.push(2);
    calls.extend(std::iter::repeat(1).take(t - h - 2));
    // After the run: back to position h - 1 (device rows beyond it dropped), then one host pass
    // of two tokens and single tokens again.
    let cut = h - 1;
    let mut after = vec![2];
    after.extend(std::iter::repeat(1).take(t - cut - 2));
    let seq2: Vec<u32> = (0..t)
        .map(|i| {
            if i < cut {
                seq[i]
            } else {
                seq[t - 1 - (i - cut)]
            }
        })
        .collect();
    assert_ne!(&seq2[cut..], &seq[cut..]);

    let mirror = MirrorBackend {
        cpu: CpuBackend::new(),
        model: &model,
    };
    let c = Calls {
        seq,
        calls: &calls,
        cut,
        seq2: &seq2,
        after: &after,
    };
    let got = run(&model, &mirror, &c, true);
    let cpu = CpuBackend::new();
    let want = run(&model, &cpu, &c, false);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{case}: call {i}: logits differ from the host loop's (max |Δ| {})",
            max_abs_diff(g, w)
        );
    }
    println!(
        "{case}: {} calls, logits identical to the host loop",
        got.len()
    );
}

#[test]
fn llama_runner_keeps_caches_in_step() {
    check("llama");
}

#[test]
fn gemma3_runner_keeps_caches_in_step() {
    check("gemma3");
}

/// Greedy ids after `prompt`: the prompt through `forward_into`, then `n` steps through
/// `forward_greedy` (the mirror decoder's `step_argmax`, or the host loop + argmax).
fn greedy(model: &Model, backend: &dyn ComputeBackend, prompt: &[u32], n: usize) -> Vec<u32> {
    let ctx = prompt.len() + n;
    let mut cache = model.new_cache(ctx);
    let mut runner = TokenRunner::new(model, backend, ctx, true).expect("runner");
    let mut logits = Vec::new();
    runner
        .forward_into(prompt, &mut cache, Logits::Last, &mut logits)
        .expect("prefill");
    let mut ids = vec![argmax(&logits)];
    for _ in 1..n {
        let next = runner
            .forward_greedy(ids[ids.len() - 1], &mut cache, &mut logits)
            .expect("greedy step");
        ids.push(next);
    }
    assert_eq!(cache.len(), prompt.len() + n - 1);
    ids
}

#[test]
fn greedy_steps_on_the_decoder_match_the_host_loop() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, path) = archrefs_q4k("llama", tmp.path());
    let vindex = Vindex::open(&path).expect("open vindex");
    let model = Model::from_vindex(&vindex).expect("model");
    let r = StFile::open(&dir.join("reference.safetensors"));
    let prompt = &r.i64_as_u32("input_ids")[..4];
    let mirror = MirrorBackend {
        cpu: CpuBackend::new(),
        model: &model,
    };
    let got = greedy(&model, &mirror, prompt, 12);
    let want = greedy(&model, &CpuBackend::new(), prompt, 12);
    assert_eq!(got, want, "greedy ids: decoder vs host loop");
    println!("llama: 12 greedy ids identical ({got:?})");
}
