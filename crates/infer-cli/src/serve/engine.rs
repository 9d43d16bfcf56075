//! The engine thread: loads the model, then runs continuous batching over
//! [`Model::forward_batch`] — each step one decode token of every generating sequence plus
//! prompt chunks of prefilling ones ([`super::scheduler`]) — and sends each request's text
//! back through its channel. Every choice of a request is its own sequence in its own KV slot
//! (a [`KvCache`] of `--ctx-size` positions, `--parallel` of them: the hard memory bound). The
//! choices of an `n > 1` request share one prefill: choice 0 runs the prompt, then its KV rows
//! are copied into the other choices' slots and every choice samples its first token from the
//! same last-position logits (with its own seed).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use infer_compute::{Argmax, ComputeBackend};
use infer_inference::chat::ChatTemplate;
use infer_inference::forward::{BatchBuffers, BatchSeq, Logits};
use infer_inference::{KvCache, Model, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::choice::{logprobs, ChoiceSampler, ChoiceText, LogprobEntry};
use super::metrics as m;
use super::params::SamplingSpec;
use super::scheduler::{pick_slot, plan_step, Phase, Work};

/// What the HTTP side needs once the model is loaded.
pub struct Ready {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// The model id of `/v1/models` (the vindex folder's name).
    pub model_id: String,
    pub vocab: usize,
    /// Positions per sequence (`--ctx-size`).
    pub ctx: usize,
    /// Unix time the model was loaded.
    pub created: u64,
}

/// Why a choice stopped (OpenAI `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the engine tells a request, per choice.
#[derive(Debug)]
pub enum Event {
    /// Released text of choice `choice` with the log-probabilities of the tokens it came from.
    Text {
        choice: usize,
        text: String,
        logprobs: Vec<LogprobEntry>,
    },
    /// Choice `choice` ended after `completion_tokens` tokens; `cached_tokens` of its prompt
    /// came from the prefix cache.
    Done {
        choice: usize,
        finish: Finish,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    /// The engine failed on this request (the message says why).
    Failed(String),
}

/// A generation request handed to the engine.
pub struct Job {
    pub prompt: Arc<Vec<u32>>,
    /// Tokens to generate at most (already fitted to the context).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub n: usize,
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Reuse a cached prompt prefix (else the prompt runs whole).
    pub cache_prompt: bool,
    pub sampling: SamplingSpec,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// Engine settings (from the `serve` flags).
pub struct EngineConfig {
    pub parallel: usize,
    /// Tokens one step may run (decode tokens + prompt chunks).
    pub batch_tokens: usize,
}

/// Why a job was not queued.
pub enum QueueError {
    /// `--max-queue` jobs are waiting already.
    Full,
    /// The engine has stopped.
    Closed,
}

/// The sending side of the job queue, bounded by a count of the jobs not yet admitted to a
/// slot (including the one the engine holds while it waits for enough free slots).
#[derive(Clone)]
pub struct Queue {
    tx: mpsc::Sender<Job>,
    waiting: Arc<AtomicUsize>,
    max: usize,
}

impl Queue {
    /// Queue `job`, unless `max` jobs wait already or the engine has stopped.
    pub fn push(&self, job: Job) -> Result<(), QueueError> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(QueueError::Full);
        }
        m::gauge_waiting(self.waiting.load(Ordering::SeqCst));
        self.tx.send(job).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            QueueError::Closed
        })
    }
}

/// The receiving side of [`Queue`].
pub struct QueueRx {
    rx: mpsc::Receiver<Job>,
    waiting: Arc<AtomicUsize>,
}

/// A job queue holding at most `max` jobs.
pub fn queue(max: usize) -> (Queue, QueueRx) {
    let (tx, rx) = mpsc::channel();
    let waiting = Arc::new(AtomicUsize::new(0));
    (
        Queue {
            tx,
            waiting: waiting.clone(),
            max,
        },
        QueueRx { rx, waiting },
    )
}

impl QueueRx {
    fn try_next(&self) -> Option<Job> {
        self.rx.try_recv().ok()
    }
    fn next_within(&self, d: Duration) -> Option<Job> {
        self.rx.recv_timeout(d).ok()
    }
    /// A job left the queue (admitted or dropped).
    fn left(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        m::gauge_waiting(self.waiting.load(Ordering::SeqCst));
    }
}

/// One KV slot.
struct Slot {
    /// `None` while lent to a forward step.
    cache: Option<KvCache>,
    /// The ids whose K/V the cache holds (positions `0..len`), kept after a sequence ends
    /// for the prefix cache.
    held: Vec<u32>,
    busy: bool,
}

/// One choice being generated.
struct Seq<'t> {
    events: UnboundedSender<Event>,
    choice: usize,
    slot: usize,
    prompt: Arc<Vec<u32>>,
    /// Prompt positions in the cache.
    fed: usize,
    /// Sampled and not yet fed.
    next: Option<u32>,
    /// Prompt and generated ids (the repetition penalty's window).
    history: Vec<u32>,
    generated: usize,
    max_tokens: usize,
    sampler: ChoiceSampler,
    text: ChoiceText<'t>,
    logprobs: Option<usize>,
    ignore_eos: bool,
    pending_logprobs: Vec<LogprobEntry>,
    cached: usize,
    arrived: Instant,
    last_token: Option<Instant>,
    done: bool,
    /// The `Done` event of a finished choice, sent once its slot is free and the gauges say
    /// so: a client that has its answer sees `/metrics` without it.
    ending: Option<Event>,
    /// Choices 1.. of an `n > 1` request while this one (choice 0) prefills their shared
    /// prompt: not scheduled; their slots are held. Released by [`Engine::release_followers`]
    /// once the prompt has run.
    followers: Vec<Seq<'t>>,
}

impl Seq<'_> {
    fn phase(&self) -> Phase {
        match self.next {
            Some(_) => Phase::Decode,
            None => Phase::Prefill {
                fed: self.fed,
                len: self.prompt.len(),
            },
        }
    }

    fn finish(&mut self, finish: Finish, tail: String) {
        let logprobs = std::mem::take(&mut self.pending_logprobs);
        if !tail.is_empty() || !logprobs.is_empty() {
            let _ = self.events.send(Event::Text {
                choice: self.choice,
                text: tail,
                logprobs,
            });
        }
        self.ending = Some(Event::Done {
            choice: self.choice,
            finish,
            completion_tokens: self.generated,
            cached_tokens: self.cached,
        });
        self.done = true;
    }
}

/// The model, its backend and its slots while serving.
pub struct Engine<'m, 'a, 't> {
    pub model: &'m Model<'a>,
    pub backend: &'m dyn ComputeBackend,
    pub tokenizer: &'t Tokenizer,
    pub eog: Vec<u32>,
    pub ctx: usize,
    pub config: EngineConfig,
}

impl<'t> Engine<'_, '_, 't> {
    /// The KV caches of the `parallel` slots, each of `ctx` positions, allocated now in the
    /// backend's memory (as llama-server does at start), so memory does not grow while
    /// serving. Errors: the backend cannot hold them (out of memory), naming the size.
    pub fn slot_caches(&self) -> anyhow::Result<Vec<KvCache>> {
        (0..self.config.parallel)
            .map(|_| {
                let mut c = self.model.new_cache(self.ctx);
                c.ensure(self.backend).with_context(|| {
                    let dims: Vec<usize> = (0..c.layers()).map(|l| c.kv_dim(l)).collect();
                    let kv = self.backend.kv_type();
                    format!(
                        "KV cache: {} slots × {} positions ({} each, {kv})",
                        self.config.parallel,
                        self.ctx,
                        crate::kv_memory::size(crate::kv_memory::kv_bytes(&dims, kv, self.ctx))
                    )
                })?;
                Ok(c)
            })
            .collect()
    }

    /// Serve jobs from `jobs` until `stop` is set and nothing runs; `caches` from
    /// [`Engine::slot_caches`].
    pub fn run(&self, caches: Vec<KvCache>, jobs: QueueRx, stop: &AtomicBool) {
        let mut slots: Vec<Slot> = caches
            .into_iter()
            .map(|c| Slot {
                cache: Some(c),
                held: Vec::new(),
                busy: false,
            })
            .collect();
        metrics::gauge!(m::KV_CAPACITY).set((self.config.parallel * self.ctx) as f64);
        let mut seqs: Vec<Seq<'t>> = Vec::new();
        let mut stash: Option<Job> = None;
        let mut bufs = BatchBuffers::default();
        let mut logits = Vec::new();
        loop {
            // Admit queued jobs while their choices fit in free slots (FIFO: a job waits
            // for all of its slots before later jobs are looked at).
            loop {
                if stash.is_none() {
                    stash = if seqs.is_empty() {
                        jobs.next_within(Duration::from_millis(100))
                    } else {
                        jobs.try_next()
                    };
                }
                let Some(job) = stash.take() else { break };
                if job.events.is_closed() {
                    jobs.left();
                    metrics::counter!(m::CANCELLED).increment(job.n as u64);
                    continue;
                }
                let free = slots.iter().filter(|s| !s.busy).count();
                if free < job.n {
                    stash = Some(job);
                    break;
                }
                jobs.left();
                self.admit(job, &mut slots, &mut seqs);
            }
            if seqs.is_empty() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            self.step(&mut slots, &mut seqs, &mut bufs, &mut logits);
            let (ended, running): (Vec<_>, Vec<_>) = seqs.drain(..).partition(|s| s.done);
            seqs = running;
            for s in &ended {
                // Followers still waiting for this prompt (it was cancelled or failed) end too.
                for slot in std::iter::once(s.slot).chain(s.followers.iter().map(|f| f.slot)) {
                    slots[slot].busy = false;
                }
            }
            self.gauges(&slots, &seqs);
            for s in ended {
                if let Some(done) = s.ending {
                    let _ = s.events.send(done);
                }
            }
        }
    }

    /// Give `job`'s choices free slots: choice 0 the slot sharing the longest prefix with the
    /// prompt (the prefix cache), choices 1.. the emptiest others, as followers of choice 0
    /// (they receive its prompt rows instead of running the prompt themselves).
    fn admit(&self, job: Job, slots: &mut [Slot], seqs: &mut Vec<Seq<'t>>) {
        let mut choices = Vec::with_capacity(job.n);
        for choice in 0..job.n {
            let held: Vec<Option<&[u32]>> = slots
                .iter()
                .map(|s| (!s.busy).then_some(s.held.as_slice()))
                .collect();
            // Followers take no prefix: the slot holding the least (cached prefixes survive).
            let want: &[u32] = if choice == 0 { &job.prompt } else { &[] };
            let Some((i, keep)) = pick_slot(&held, want) else {
                unreachable!("admit is called with enough free slots")
            };
            let keep = if job.cache_prompt { keep } else { 0 };
            let slot = &mut slots[i];
            slot.busy = true;
            slot.held.truncate(keep);
            if let Some(c) = slot.cache.as_mut() {
                c.truncate(keep);
            }
            if keep > 0 {
                metrics::counter!(m::PREFIX_CACHE_HITS).increment(1);
                metrics::counter!(m::PREFIX_CACHED_TOKENS).increment(keep as u64);
            }
            choices.push(Seq {
                events: job.events.clone(),
                choice,
                slot: i,
                prompt: job.prompt.clone(),
                fed: keep,
                next: None,
                history: job.prompt.to_vec(),
                generated: 0,
                max_tokens: job.max_tokens,
                sampler: ChoiceSampler::new(&job.sampling, choice),
                text: ChoiceText::new(self.tokenizer, &job.stop),
                logprobs: job.logprobs,
                ignore_eos: job.ignore_eos,
                pending_logprobs: Vec::new(),
                cached: keep,
                arrived: job.arrived,
                last_token: None,
                done: false,
                ending: None,
                followers: Vec::new(),
            });
        }
        let mut choices = choices.into_iter();
        if let Some(mut first) = choices.next() {
            first.followers = choices.collect();
            seqs.push(first);
        }
    }

    /// Copy the prompt rows of `leader` (its slot holds the whole prompt now) into each of its
    /// followers' slots and sample each follower's first token from `row`, the logits of the
    /// prompt's last position; returns the followers, now decoding. Errors: a copy failed
    /// (the message says why; the followers' slots are left empty).
    fn release_followers(
        &self,
        slots: &mut [Slot],
        leader: &mut Seq<'t>,
        row: &[f32],
        now: Instant,
    ) -> Result<Vec<Seq<'t>>, String> {
        let mut followers = std::mem::take(&mut leader.followers);
        let len = leader.prompt.len();
        let mut failed = None;
        for f in &mut followers {
            let (src, dst) = two_slots(slots, leader.slot, f.slot);
            let copied = match (src.cache.as_ref(), dst.cache.as_mut()) {
                (Some(src), Some(dst)) => dst.copy_prefix_from(self.backend, src, len),
                _ => unreachable!("caches are back in their slots between steps"),
            };
            dst.held.clear();
            if let Err(e) = copied {
                failed = Some(format!(
                    "copying the prompt's KV cache to choice {}: {e}",
                    f.choice
                ));
                break;
            }
            dst.held.extend_from_slice(&leader.prompt);
            f.fed = len;
            f.cached = leader.cached;
        }
        if let Some(e) = failed {
            for f in &followers {
                slots[f.slot].held.clear();
            }
            leader.followers = followers;
            return Err(e);
        }
        for f in &mut followers {
            self.sample(f, Next::Row(row), now, len);
        }
        Ok(followers)
    }

    /// One batched forward step over `seqs`, then sampling for every sequence whose logits
    /// are due. A sequence whose client went away is dropped before the step.
    fn step(
        &self,
        slots: &mut [Slot],
        seqs: &mut Vec<Seq<'t>>,
        bufs: &mut BatchBuffers,
        logits: &mut Vec<f32>,
    ) {
        for s in seqs.iter_mut() {
            if s.events.is_closed() {
                s.done = true;
                metrics::counter!(m::CANCELLED).increment(1 + s.followers.len() as u64);
            }
        }
        let phases: Vec<Phase> = seqs
            .iter()
            .map(|s| {
                if s.done {
                    Phase::Prefill { fed: 0, len: 0 }
                } else {
                    s.phase()
                }
            })
            .collect();
        let plan = plan_step(&phases, self.config.batch_tokens);
        if plan.is_empty() {
            return;
        }
        let inputs: Vec<Vec<u32>> = plan
            .iter()
            .map(|(i, w)| match w {
                Work::Token => vec![seqs[*i].next.unwrap_or_default()],
                Work::Prompt(r) => seqs[*i].prompt[r.clone()].to_vec(),
            })
            .collect();
        let mut caches: Vec<KvCache> = plan
            .iter()
            .map(|(i, _)| match slots[seqs[*i].slot].cache.take() {
                Some(c) => c,
                None => unreachable!("each slot runs one sequence"),
            })
            .collect();
        // When no sequence of the step needs its logits row (greedy, no logprobs, no `n > 1`
        // choices waiting for the prompt's row), the choices are made where the logits are:
        // on a device only B token ids come back instead of `[B, vocab]` logits.
        let greedy = plan.iter().all(|(i, _)| {
            let s = &seqs[*i];
            s.sampler.is_greedy() && s.logprobs.is_none() && s.followers.is_empty()
        });
        let mut chosen = Vec::new();
        let t0 = Instant::now();
        let result = {
            let mut batch: Vec<BatchSeq<'_>> = caches
                .iter_mut()
                .zip(&inputs)
                .map(|(cache, tokens)| BatchSeq {
                    tokens,
                    cache,
                    logits: Logits::Last,
                })
                .collect();
            if greedy {
                self.model
                    .forward_batch_greedy(self.backend, &mut batch, bufs, &mut chosen)
            } else {
                self.model
                    .forward_batch(self.backend, &mut batch, bufs, logits)
            }
        };
        for ((i, _), c) in plan.iter().zip(caches) {
            slots[seqs[*i].slot].cache = Some(c);
        }
        let ntok: usize = inputs.iter().map(Vec::len).sum();
        metrics::histogram!(m::STEP_SECONDS).record(t0.elapsed().as_secs_f64());
        metrics::histogram!(m::STEP_TOKENS).record(ntok as f64);
        if let Err(e) = result {
            // Nothing was written (forward_batch checks before writing); the sequences of
            // this step fail, their slots start empty.
            for (i, _) in &plan {
                let s = &mut seqs[*i];
                let _ = s.events.send(Event::Failed(format!("forward pass: {e}")));
                s.done = true;
                let slot = &mut slots[s.slot];
                slot.held.clear();
                if let Some(c) = slot.cache.as_mut() {
                    c.clear();
                }
            }
            return;
        }
        let vocab = self.model.vocab_size;
        let now = Instant::now();
        let mut released = Vec::new();
        for (k, ((i, work), toks)) in plan.iter().zip(&inputs).enumerate() {
            let s = &mut seqs[*i];
            slots[s.slot].held.extend_from_slice(toks);
            if let Work::Prompt(r) = work {
                s.fed = r.end;
                metrics::counter!(m::PROMPT_TOKENS).increment(toks.len() as u64);
                if s.fed < s.prompt.len() {
                    continue;
                }
            }
            let cache_len = slots[s.slot].cache.as_ref().map_or(0, KvCache::len);
            if greedy {
                self.sample(s, Next::Greedy(chosen[k]), now, cache_len);
                continue;
            }
            let row = &logits[k * vocab..(k + 1) * vocab];
            // The other choices start from this prompt (unless its logits are unusable: then
            // the request fails in `sample`, and they end with it).
            if !s.followers.is_empty() && row.iter().all(|v| v.is_finite()) {
                match self.release_followers(slots, s, row, now) {
                    Ok(f) => released.extend(f),
                    Err(e) => {
                        let _ = s.events.send(Event::Failed(e));
                        s.done = true;
                        continue;
                    }
                }
            }
            self.sample(s, Next::Row(row), now, cache_len);
        }
        seqs.extend(released);
    }

    /// Sample the next token of `s` (from its logits row, or the greedy choice made where the
    /// logits are) and release its text.
    fn sample(&self, s: &mut Seq<'t>, next: Next<'_>, now: Instant, cache_len: usize) {
        let finite = match next {
            Next::Row(row) => row.iter().all(|v| v.is_finite()),
            Next::Greedy(a) => a.all_finite,
        };
        if !finite {
            let _ = s
                .events
                .send(Event::Failed("the model produced non-finite logits".into()));
            s.done = true;
            return;
        }
        let tok = match next {
            Next::Row(row) => s.sampler.pick(row, &s.history),
            Next::Greedy(a) => s.sampler.chose(a.token),
        };
        s.history.push(tok);
        s.generated += 1;
        s.next = None;
        metrics::counter!(m::GENERATED_TOKENS).increment(1);
        match s.last_token {
            None => metrics::histogram!(m::TTFT).record((now - s.arrived).as_secs_f64()),
            Some(t) => metrics::histogram!(m::ITL).record((now - t).as_secs_f64()),
        }
        s.last_token = Some(now);
        if !s.ignore_eos && self.eog.contains(&tok) {
            let tail = s.text.finish();
            s.finish(Finish::Stop, tail);
            return;
        }
        if let (Some(k), Next::Row(row)) = (s.logprobs, next) {
            s.pending_logprobs
                .push(logprobs(self.tokenizer, row, tok, k));
        }
        let (text, stopped) = match s.text.push(tok) {
            Ok(t) => t,
            Err(e) => {
                let _ = s.events.send(Event::Failed(format!("detokenizing: {e}")));
                s.done = true;
                return;
            }
        };
        if stopped {
            s.finish(Finish::Stop, text);
            return;
        }
        if s.generated >= s.max_tokens || cache_len + 1 > self.ctx {
            let tail = text + &s.text.finish();
            s.finish(Finish::Length, tail);
            return;
        }
        if !text.is_empty() {
            let logprobs = std::mem::take(&mut s.pending_logprobs);
            let _ = s.events.send(Event::Text {
                choice: s.choice,
                text,
                logprobs,
            });
        }
        s.next = Some(tok);
    }

    fn gauges(&self, slots: &[Slot], seqs: &[Seq<'_>]) {
        let decoding = seqs.iter().filter(|s| s.next.is_some()).count();
        let waiting: usize = seqs.iter().map(|s| s.followers.len()).sum();
        metrics::gauge!(m::RUNNING).set(decoding as f64);
        metrics::gauge!(m::PREFILLING).set((seqs.len() - decoding + waiting) as f64);
        let used: usize = slots
            .iter()
            .filter(|s| s.busy)
            .filter_map(|s| s.cache.as_ref().map(KvCache::len))
            .sum();
        metrics::gauge!(m::KV_USED).set(used as f64);
    }
}

/// What a step hands [`Engine::sample`] for one sequence: its logits row `[vocab]`, or the
/// greedy choice made where the logits are (`Model::forward_batch_greedy`).
#[derive(Clone, Copy)]
enum Next<'r> {
    Row(&'r [f32]),
    Greedy(Argmax),
}

/// Slot `a` to read and slot `b` to write (`a != b`).
fn two_slots(slots: &mut [Slot], a: usize, b: usize) -> (&Slot, &mut Slot) {
    assert_ne!(a, b, "a follower has its own slot");
    if a < b {
        let (lo, hi) = slots.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = slots.split_at_mut(a);
        (&hi[0], &mut lo[b])
    }
}

/// Publish `ready` for the HTTP side.
pub fn publish(cell: &OnceLock<Arc<Ready>>, ready: Arc<Ready>) {
    let _ = cell.set(ready);
}
