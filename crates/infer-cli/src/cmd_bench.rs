//! `infer bench`: prompt (prefill) and decode tokens/s of a vindex, llama-bench style.
//!
//! `-p`, `-n` and `-d` take comma-separated lists as llama-bench's do: every `-p` value is a
//! pp test and every `-n` value a tg test, each run after every `-d` context. The model is
//! opened, uploaded and checked against memory once, for the largest context any test needs;
//! then each test runs on its own (an untimed warm-up on a device, `-r` timed repetitions).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use infer_inference::forward::Logits;
use infer_inference::{KvCache, Model};
use infer_vindex::Vindex;

use crate::device_args::DeviceArgs;
use crate::format_args::FormatArgs;
use crate::kv_memory::{self, Workload};

/// Arguments of `infer bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// The vindex directory.
    pub vindex: PathBuf,
    /// Prompt sizes, comma-separated (e.g. 512,2048,8192): each is a pp test, that many prompt
    /// tokens processed in one batch; 0 skips it.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "N[,N...]",
        value_delimiter = ',',
        value_parser = token_count,
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Decode lengths, comma-separated (e.g. 128,256): each is a tg test, that many tokens
    /// decoded one at a time; 0 skips it.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_name = "N[,N...]",
        value_delimiter = ',',
        value_parser = token_count,
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Contexts before each test, comma-separated (llama-bench's `-d`, e.g. 0,4096,16384):
    /// every pp and tg test runs after a context of each of these many tokens, prefilled
    /// untimed, and is reported as `pp512 @ d4096` — decode speed at depth (single-sequence
    /// protocol only).
    #[arg(
        short = 'd',
        long = "depth",
        value_name = "N[,N...]",
        value_delimiter = ',',
        value_parser = token_count,
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// Repetitions of each test; the median is reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Print JSON instead of a table: one object per line, one line per test.
    #[arg(long)]
    pub json: bool,
    /// Sequences run at once (llama-batched-bench's `-npl`): B prompts of `-p` tokens are
    /// prefilled in batched steps, then every step decodes one token of each of the B
    /// sequences (continuing after its prompt), `-n` steps; aggregate and per-sequence
    /// tokens/s are reported (`-B 1`: the same protocol for one sequence). Takes one `-p` and
    /// one `-n` value, no `-d`. Without it: the llama-bench protocol above (decode after the
    /// `-d` context, empty by default).
    #[arg(short = 'B', long = "batch")]
    pub batch: Option<usize>,
    /// On a device (`--device cuda`): after each tg test, also run one decode step kernel by
    /// kernel with timing events between launches (no CUDA graph) and print the device time
    /// per kernel (table output; one table per tg test; with `--batch`, one step of all B
    /// sequences).
    #[arg(long)]
    pub profile: bool,
    /// Print the format plan (which tier each operation reads) to stderr before the runs.
    #[arg(long)]
    pub explain: bool,
}

/// One item of a `-p`, `-n` or `-d` list: a number of tokens (clap names the flag in its
/// error).
fn token_count(s: &str) -> Result<usize, String> {
    const LISTS: &str = "give comma-separated numbers of tokens, e.g. 512,2048";
    if s.is_empty() {
        return Err(format!("an empty list item ({LISTS})"));
    }
    s.parse()
        .map_err(|_| format!("not a number of tokens ({LISTS})"))
}

/// What a test measures, as llama-bench's `pp` and `tg` tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Prompt processing: the tokens in one batch.
    Prompt,
    /// Text generation: the tokens decoded one at a time, greedy.
    Gen,
}

/// One test: `tokens` tokens of `phase` after an untimed context of `depth` tokens.
#[derive(Clone, Copy, Debug)]
struct Test {
    phase: Phase,
    tokens: usize,
    depth: usize,
}

impl Test {
    /// The table's name of the test, as llama-bench's: `pp512`, `tg128 @ d4096`.
    fn name(&self) -> String {
        let kind = match self.phase {
            Phase::Prompt => "pp",
            Phase::Gen => "tg",
        };
        let at = if self.depth > 0 {
            format!(" @ d{}", self.depth)
        } else {
            String::new()
        };
        format!("{kind}{}{at}", self.tokens)
    }

    /// Its prompt size (llama-bench's `n_prompt`: 0 for a tg test).
    fn n_prompt(&self) -> usize {
        if self.phase == Phase::Prompt {
            self.tokens
        } else {
            0
        }
    }

    /// Its decode length (llama-bench's `n_gen`: 0 for a pp test).
    fn n_gen(&self) -> usize {
        if self.phase == Phase::Gen {
            self.tokens
        } else {
            0
        }
    }
}

/// The tests of `-p`, `-n` and `-d` in llama-bench's order: for each depth, every pp test and
/// then every tg test, in the order given; sizes of 0 are skipped.
fn tests(args: &BenchArgs) -> Vec<Test> {
    let mut tests = Vec::new();
    for &depth in &args.depth {
        for (phase, sizes) in [(Phase::Prompt, &args.n_prompt), (Phase::Gen, &args.n_gen)] {
            tests.extend(sizes.iter().filter(|&&n| n > 0).map(|&tokens| Test {
                phase,
                tokens,
                depth,
            }));
        }
    }
    tests
}

/// The largest `-d`, `-p` and `-n` (with `--batch`, the only ones): the context every test
/// fits in, so one cache size and one memory check serve them all.
#[derive(Clone, Copy, Debug)]
struct Largest {
    depth: usize,
    prompt: usize,
    gen: usize,
}

impl Largest {
    /// The largest value of each list.
    fn of(args: &BenchArgs) -> Self {
        let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        Largest {
            depth: max(&args.depth),
            prompt: max(&args.n_prompt),
            gen: max(&args.n_gen),
        }
    }

    /// `-d 4096 + -p 512 + -n 128` (no `-d` term at depth 0), for messages.
    fn describe(&self) -> String {
        let depth = if self.depth > 0 {
            format!("-d {} + ", self.depth)
        } else {
            String::new()
        };
        format!("{depth}-p {} + -n {}", self.prompt, self.gen)
    }

    /// Positions of the cache: `-d + -p + -n + 1` (one more for the last token). Errors: the
    /// sum overflows, or exceeds the model's maximum context `max`; both name the sizes.
    fn context(&self, max: usize) -> anyhow::Result<usize> {
        let ctx = self
            .depth
            .checked_add(self.prompt)
            .and_then(|c| c.checked_add(self.gen))
            .and_then(|c| c.checked_add(1))
            .with_context(|| format!("{}: the context overflows", self.describe()))?;
        if ctx > max {
            bail!(
                "{} needs a context of {ctx} positions (one more for the last token), \
                 more than the model's maximum context {max}",
                self.describe()
            );
        }
        Ok(ctx)
    }
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A plain memory-read probe: GB/s of summing a 512 MiB buffer with every pool thread (median
/// of 5), the ceiling decode's effective bandwidth is compared with.
fn read_probe_gb_per_s() -> f64 {
    use rayon::prelude::*;
    let buf = vec![1u64; 64 << 20];
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let sum: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .sum();
        std::hint::black_box(sum);
        runs.push((buf.len() * 8) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    median(runs)
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The flags' own errors, before the model is opened.
fn validate(args: &BenchArgs, tests: &[Test]) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if tests.is_empty() {
        bail!("nothing to measure: -p and -n are both 0");
    }
    if let Some(b) = args.batch.filter(|&b| b == 0 || b > 4096) {
        bail!("--batch {b}: must be between 1 and 4096");
    }
    if args.batch.is_some() && args.depth.iter().any(|&d| d > 0) {
        bail!("--depth is for the single-sequence protocol: with --batch, -p is each sequence's context");
    }
    if args.batch.is_some() && (args.n_prompt.len() > 1 || args.n_gen.len() > 1) {
        bail!(
            "--batch takes one -p and one -n value (lists are for the single-sequence \
             protocol): run one bench per size"
        );
    }
    Ok(())
}

/// `infer bench`: checks the flags, opens the model and checks memory once for the largest
/// context, then runs the `--batch` protocol or every llama-bench test.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let tests = tests(&args);
    validate(&args, &tests)?;
    let largest = Largest::of(&args);
    let vindex = Vindex::open(&args.vindex)
        .with_context(|| format!("opening vindex {}", args.vindex.display()))?;
    let model = crate::cmd_run::build_model(&vindex, &args.vindex, &args.formats)?;
    let backend = args.device.backend()?;
    if args.explain {
        eprint!("{}", model.explain());
    }
    let ctx = largest.context(model.arch.config().max_position_embeddings)?;
    // Weights, KV caches and scratch against the device's free memory (the host's available
    // memory for the KV caches on the CPU), before anything is uploaded or allocated.
    let work = workload(&args, largest, ctx);
    let (what, fix) = memory_words(&args, largest, ctx);
    // The table prints the `memory:` line; with --json, --explain prints it on stderr.
    let explain = args.explain && args.json;
    let memory = args
        .device
        .check_memory(&model, &*backend, &work, &what, fix, explain)?;
    // Deterministic pseudo-random prompt ids, as llama-bench uses random tokens.
    let vocab = model.vocab_size as u64;
    let ids: Vec<u32> = (0..(largest.depth + largest.prompt).max(1) as u64)
        .map(|i| ((i * 2654435761 + 12345) % vocab) as u32)
        .collect();
    if let Some(b) = args.batch {
        return batched(&args, b, &model, &*backend, &ids, ctx, &memory);
    }
    single(&args, &tests, &model, &*backend, &ids, ctx, &memory)
}

/// What the memory check counts: with `--batch`, B sequences prefilled in steps of whole
/// prompts (at most [`MAX_STEP_TOKENS`]) and then decoded B tokens a step; without, one
/// sequence of `ctx` positions whose longest step is the largest context or prompt.
fn workload(args: &BenchArgs, largest: Largest, ctx: usize) -> Workload {
    match args.batch {
        Some(b) => {
            let prompt = largest.prompt.max(1);
            let per_step = (MAX_STEP_TOKENS / prompt).clamp(1, b);
            Workload {
                sequences: b,
                positions: ctx,
                step_tokens: (per_step * prompt).max(b),
                logit_rows: b,
            }
        }
        None => Workload {
            sequences: 1,
            positions: ctx,
            step_tokens: largest.depth.max(largest.prompt).max(1),
            logit_rows: 1,
        },
    }
}

/// The memory check's words: what the KV cache holds (`1 sequence × 4225 positions (-d + -p +
/// -n + 1)`) and which flags lower it.
fn memory_words(args: &BenchArgs, largest: Largest, ctx: usize) -> (String, &'static str) {
    let seqs = args.batch.unwrap_or(1);
    let sum = if largest.depth > 0 {
        "-d + -p + -n"
    } else {
        "-p + -n"
    };
    let what = format!(
        "{seqs} sequence{} × {ctx} positions ({sum} + 1)",
        if seqs == 1 { "" } else { "s" }
    );
    let fix = if args.batch.is_some() {
        "lower -B, -p or -n"
    } else if largest.depth > 0 {
        "lower -d, -p or -n"
    } else {
        "lower -p or -n"
    };
    (what, fix)
}

/// Device time per kernel of one decode step: name, launches, µs.
type Profile = Vec<(String, usize, f64)>;

/// What one test measured: medians over its repetitions.
struct Outcome {
    test: Test,
    tokens_per_s: f64,
    /// Walk-FFN time per decoded token (all layers) of a tg test, from the process-wide walk
    /// FFN clock; `None` where the FFN does not run the walk path (the clock does not move).
    walk_ffn_ms: Option<f64>,
    /// `--profile` of a tg test on a device: one step after the first repetition.
    profile: Profile,
}

/// The single-sequence protocol's state across its tests: one model and backend (the weights
/// uploaded on the first pass, kept) with caches of `ctx` positions.
struct Bench<'r, 'm, 'a> {
    model: &'m Model<'a>,
    backend: &'m dyn infer_compute::ComputeBackend,
    /// The context's ids, then the prompt's (a test at depth `d` reads `ids[d..]`).
    ids: &'r [u32],
    ctx: usize,
    logits: Vec<f32>,
    repetitions: usize,
    /// One untimed run of each test first (on a device, as llama-bench's warm-up).
    warm_up: bool,
    /// Profile one decode step of each tg test.
    profile: bool,
}

impl<'r> Bench<'r, '_, '_> {
    /// One test: the warm-up, then the timed repetitions, each after a fresh context.
    fn run(&mut self, test: Test) -> anyhow::Result<Outcome> {
        if self.warm_up {
            self.warm(test)?;
        }
        let (mut rates, mut ffn_ms, mut profile) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..self.repetitions {
            let mut cache = self.context(test.depth)?;
            match test.phase {
                Phase::Prompt => rates.push(self.prefill(test, &mut cache)?),
                Phase::Gen => {
                    let (rate, ffn, last) = self.decode(test, &mut cache)?;
                    rates.push(rate);
                    ffn_ms.push(ffn);
                    if self.profile && profile.is_empty() {
                        profile = self.profile_step(last, &mut cache)?;
                    }
                }
            }
        }
        let walk_ffn_ms = (!ffn_ms.is_empty())
            .then(|| median(ffn_ms))
            .filter(|&v| v > 0.0);
        Ok(Outcome {
            test,
            tokens_per_s: median(rates),
            walk_ffn_ms,
            profile,
        })
    }

    /// Untimed, as llama-bench's warm-up: the first device steps upload the weights, record
    /// the CUDA graphs and load the kernels of each product shape (cuBLAS loads its kernels
    /// lazily); a tg test warms a few greedy decode steps after its context (a step's list is
    /// captured as a graph the second time it is launched), a pp test its prompt.
    fn warm(&mut self, test: Test) -> anyhow::Result<()> {
        // One cache at a time (the memory check counts one): this one is dropped before the
        // timed runs make theirs.
        let mut cache = self.context(test.depth)?;
        match test.phase {
            Phase::Prompt => {
                let prompt = self.prompt(test);
                self.model.forward_into(
                    self.backend,
                    prompt,
                    &mut cache,
                    Logits::Last,
                    &mut self.logits,
                )?;
            }
            Phase::Gen => {
                let steps = test.tokens.min(3);
                self.model
                    .decode_greedy(self.backend, self.ids[0], &mut cache, steps, |_| Ok(true))?;
            }
        }
        Ok(())
    }

    /// A new cache holding a context of `depth` tokens, prefilled untimed (llama-bench times
    /// decode from a filled cache).
    fn context(&mut self, depth: usize) -> anyhow::Result<KvCache> {
        let mut cache = self.model.new_cache(self.ctx);
        if depth > 0 {
            let ids = self.ids;
            self.model.forward_into(
                self.backend,
                &ids[..depth],
                &mut cache,
                Logits::Last,
                &mut self.logits,
            )?;
        }
        Ok(cache)
    }

    /// `--profile`: device time per kernel of one greedy decode step of `token` at position
    /// `cache.len()`, its kernels launched one by one with timing events between them
    /// ([`infer_compute::ComputeBackend::start_kernel_profile`]); empty where the backend times
    /// nothing (the CPU). The step advances `cache`.
    fn profile_step(&mut self, token: u32, cache: &mut KvCache) -> anyhow::Result<Profile> {
        if !self.backend.start_kernel_profile()? {
            return Ok(Vec::new());
        }
        let step = self.model.forward_greedy(self.backend, &[token], cache);
        // Stop timing whether or not the step ran.
        let profile = self.backend.take_kernel_profile();
        step?;
        Ok(profile?)
    }

    /// The pp test's prompt: the ids after its context.
    fn prompt(&self, test: Test) -> &'r [u32] {
        let ids = self.ids;
        &ids[test.depth..test.depth + test.tokens]
    }

    /// Times the pp test's prompt, one batch after the context in `cache`: tokens/s.
    fn prefill(&mut self, test: Test, cache: &mut KvCache) -> anyhow::Result<f64> {
        let prompt = self.prompt(test);
        let t0 = Instant::now();
        self.model
            .forward_into(self.backend, prompt, cache, Logits::Last, &mut self.logits)?;
        Ok(test.tokens as f64 / t0.elapsed().as_secs_f64())
    }

    /// Times the tg test's greedy decode after the context in `cache`: tokens/s, walk-FFN ms
    /// per token and the last token chosen (the next one's input).
    fn decode(&mut self, test: Test, cache: &mut KvCache) -> anyhow::Result<(f64, f64, u32)> {
        let mut tok = self.ids[0];
        let ffn0 = infer_inference::walk::walk_ffn_nanos();
        let t0 = Instant::now();
        // Greedy as `run` is: a device records each step while the one before runs.
        self.model
            .decode_greedy(self.backend, tok, cache, test.tokens, |t| {
                tok = t;
                Ok(true)
            })?;
        let rate = test.tokens as f64 / t0.elapsed().as_secs_f64();
        let ffn_ns = infer_inference::walk::walk_ffn_nanos() - ffn0;
        Ok((rate, ffn_ns as f64 / 1e6 / test.tokens as f64, tok))
    }
}

/// What every row of a single-sequence run shares.
struct Shared<'a> {
    name: String,
    threads: usize,
    /// The decode path, in words ([`crate::device_args::decode_mode`]).
    decode: String,
    /// Weight bytes one decoded token reads.
    bytes: f64,
    /// Peak RSS after all the tests.
    rss: Option<u64>,
    /// The read probe, run once after the tests when there is a tg test.
    probe: Option<f64>,
    memory: &'a (kv_memory::Need, kv_memory::Room),
}

/// The llama-bench protocol: every test on one model and backend, then one table or one JSON
/// object per test.
fn single(
    args: &BenchArgs,
    tests: &[Test],
    model: &Model<'_>,
    backend: &dyn infer_compute::ComputeBackend,
    ids: &[u32],
    ctx: usize,
    memory: &(kv_memory::Need, kv_memory::Room),
) -> anyhow::Result<()> {
    let decode = crate::device_args::decode_mode(&args.device);
    let has_tg = tests.iter().any(|t| t.phase == Phase::Gen);
    let on_device = args.device.device != crate::device_args::Device::Cpu;
    if args.profile && !on_device {
        eprintln!("note: --profile times a device's kernels; this run has none ({decode})");
    }
    if args.profile && on_device && (args.json || !has_tg) {
        eprintln!(
            "note: --profile prints a table of one decode step: it needs -n > 0 and no --json"
        );
    }
    let mut bench = Bench {
        model,
        backend,
        profile: args.profile && !args.json && on_device,
        ids,
        ctx,
        logits: Vec::new(),
        repetitions: args.repetitions,
        warm_up: on_device,
    };
    let outcomes = tests
        .iter()
        .map(|&t| bench.run(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rss = peak_rss_bytes();
    let shared = Shared {
        name: args.vindex.display().to_string(),
        threads: rayon::current_num_threads(),
        decode,
        bytes: model.weight_bytes_per_token() as f64,
        rss,
        probe: has_tg.then(read_probe_gb_per_s),
        memory,
    };
    if args.json {
        let lines: String = outcomes
            .iter()
            .map(|o| format!("{}\n", test_json(args, model, &shared, o)))
            .collect();
        crate::print_stdout(&lines);
    } else {
        print_table(args, &shared, &outcomes, backend);
    }
    Ok(())
}

/// One test's JSON object: the run's fields with this test's `n_prompt`, `n_gen`, `depth` and
/// tokens/s (`pp_tokens_per_s` for a pp test, `tg_tokens_per_s` and the decode figures for a
/// tg test; the other `null`).
fn test_json(
    args: &BenchArgs,
    model: &Model<'_>,
    shared: &Shared<'_>,
    o: &Outcome,
) -> serde_json::Value {
    let tg = (o.test.phase == Phase::Gen).then_some(o.tokens_per_s);
    let pp = (o.test.phase == Phase::Prompt).then_some(o.tokens_per_s);
    serde_json::json!({
        "vindex": shared.name,
        "model_type": model.arch.config().model_type,
        "threads": shared.threads,
        "device": args.device.device.to_string(),
        "decode": shared.decode,
        "test": o.test.name(),
        "n_prompt": o.test.n_prompt(),
        "n_gen": o.test.n_gen(),
        "depth": o.test.depth,
        "repetitions": args.repetitions,
        "pp_tokens_per_s": pp,
        "tg_tokens_per_s": tg,
        "walk_k": args.formats.walk_k.to_string(),
        // The selection only exists for a sparse walk (K below all).
        "walk_select": (!args.formats.walk_k.is_all())
            .then(|| args.formats.walk_select.to_string()),
        "walk_ffn_ms_per_token": o.walk_ffn_ms,
        "weight_bytes_per_token": shared.bytes,
        "tg_effective_gb_per_s": tg.map(|t| t * shared.bytes / 1e9),
        "read_probe_gb_per_s": tg.and(shared.probe),
        "peak_rss_bytes": shared.rss,
        "memory": kv_memory::json(&shared.memory.0, &shared.memory.1),
    })
}

/// The table: one row per test, then the decode figures of each tg test (prefixed with the
/// test's name when there are several), peak RSS and the `--profile` tables.
fn print_table(
    args: &BenchArgs,
    shared: &Shared<'_>,
    outcomes: &[Outcome],
    backend: &dyn infer_compute::ComputeBackend,
) {
    let Shared {
        name,
        threads,
        bytes,
        ..
    } = shared;
    println!("decode: {}", shared.decode);
    println!("{}", kv_memory::line(&shared.memory.0, &shared.memory.1));
    println!("| vindex | threads | test | tokens/s |");
    println!("|---|---|---|---|");
    for o in outcomes {
        println!(
            "| {name} | {threads} | {} | {:.2} |",
            o.test.name(),
            o.tokens_per_s
        );
    }
    let tg: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.test.phase == Phase::Gen)
        .collect();
    let label = |o: &Outcome| {
        if tg.len() > 1 {
            format!("{}: ", o.test.name())
        } else {
            String::new()
        }
    };
    for o in &tg {
        if let Some(f) = o.walk_ffn_ms {
            let selection = if args.formats.walk_k.is_all() {
                String::new()
            } else {
                format!(", selection by the {}", args.formats.walk_select)
            };
            println!(
                "{}walk FFN (--walk-k {}{selection}): {f:.3} ms per decoded token",
                label(o),
                args.formats.walk_k
            );
        }
    }
    for o in &tg {
        let gbs = o.tokens_per_s * bytes / 1e9;
        if let Some(p) = shared.probe {
            println!(
                "{}plain memory-read probe: {p:.1} GB/s; decode reaches {:.0}% of it",
                label(o),
                100.0 * gbs / p
            );
        }
    }
    for o in &tg {
        let gbs = o.tokens_per_s * bytes / 1e9;
        let kv = if o.test.depth > 0 {
            " (weights only: the KV cache of the context adds its own reads)"
        } else {
            ""
        };
        println!(
            "{}decode reads {:.1} MB of weights per token: {gbs:.1} GB/s effective{kv}",
            label(o),
            bytes / 1e6
        );
    }
    if let Some(r) = shared.rss {
        println!("peak RSS {:.1} MB", r as f64 / 1e6);
        if let Some(l) = backend.launch_report() {
            println!("{l}");
        }
    }
    for o in &tg {
        print_profile(&label(o), &o.profile, o.test, o.tokens_per_s);
    }
}

/// Most prompt tokens in one prefill step of `--batch` (llama-batched-bench's `-b 2048`):
/// bounds the step's activation buffers.
const MAX_STEP_TOKENS: usize = 2048;

/// `--batch B`: B prompts of `-p` tokens prefilled in steps of at most [`MAX_STEP_TOKENS`]
/// tokens (whole prompts), then `-n` steps each decoding one greedy token of every sequence
/// after its prompt, llama-batched-bench style. Reports the medians of aggregate prefill and
/// decode tokens/s (all sequences) and decode tokens/s per sequence.
fn batched(
    args: &BenchArgs,
    b: usize,
    model: &Model<'_>,
    backend: &dyn infer_compute::ComputeBackend,
    ids: &[u32],
    ctx: usize,
    memory: &(kv_memory::Need, kv_memory::Room),
) -> anyhow::Result<()> {
    use infer_compute::Chosen;
    use infer_inference::forward::{BatchBuffers, BatchSeq};
    // With --batch, -p and -n have one value each (`validate`).
    let sizes = Largest::of(args);
    // Every sequence gets its own prompt (rotated ids), as the server would see.
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|i| {
            let n = sizes.prompt.max(1);
            (0..n).map(|j| ids[(i * 7 + j) % ids.len()]).collect()
        })
        .collect();
    let per_step = (MAX_STEP_TOKENS / sizes.prompt.max(1)).max(1);
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    let mut profile = Profile::new();
    let mut bufs = BatchBuffers::default();
    let mut logits = Vec::new();
    let mut chosen = Vec::new();
    // One untimed warm-up repetition on a device (as llama-batched-bench's): weight uploads,
    // graph captures and lazily loaded kernels stay out of the medians.
    let warm_up = usize::from(args.device.device != crate::device_args::Device::Cpu);
    for rep in 0..warm_up + args.repetitions {
        let timed = rep >= warm_up;
        let mut caches: Vec<_> = (0..b).map(|_| model.new_cache(ctx)).collect();
        let t0 = Instant::now();
        for (group, prompts) in caches.chunks_mut(per_step).zip(prompts.chunks(per_step)) {
            let mut seqs: Vec<BatchSeq<'_>> = group
                .iter_mut()
                .zip(prompts)
                .map(|(cache, p)| BatchSeq {
                    tokens: if sizes.prompt == 0 { &p[..1] } else { p },
                    cache,
                    logits: Logits::Last,
                })
                .collect();
            model.forward_batch(backend, &mut seqs, &mut bufs, &mut logits)?;
        }
        if sizes.prompt > 0 && timed {
            pp.push((b * sizes.prompt) as f64 / t0.elapsed().as_secs_f64());
        }
        if sizes.gen == 0 {
            continue;
        }
        // The last prefill group's logits give its next tokens; the others start from a
        // fixed id (the tokens only need to be valid).
        let next: Vec<u32> = vec![ids[0]; b];
        let t1 = Instant::now();
        // Greedy, chosen where the logits are: each step after the first runs the choices of
        // the one before where they were made (a device records step i + 1 while step i
        // runs; only the ids come back, one step late).
        let (mut cur, mut fed) = (Chosen::default(), Chosen::default());
        for step in 0..sizes.gen {
            let mut seqs = decode_seqs(&mut caches, &next);
            std::mem::swap(&mut cur, &mut fed);
            let feed = (step > 0).then_some(&fed);
            model.forward_batch_later(backend, &mut seqs, &mut bufs, feed, &mut cur)?;
            if step > 0 {
                backend.take_chosen(&fed, &mut chosen)?;
            }
        }
        backend.take_chosen(&cur, &mut chosen)?;
        if timed {
            tg.push((b * sizes.gen) as f64 / t1.elapsed().as_secs_f64());
        }
        if timed && args.profile && !args.json && profile.is_empty() {
            profile = profile_batch_step(model, backend, &mut caches, &next, &mut bufs)?;
        }
    }
    let threads = rayon::current_num_threads();
    let pp_med = (!pp.is_empty()).then(|| median(pp));
    let tg_med = (!tg.is_empty()).then(|| median(tg));
    let name = args.vindex.display().to_string();
    if args.json {
        let j = serde_json::json!({
            "vindex": name,
            "model_type": model.arch.config().model_type,
            "threads": threads,
            "device": args.device.device.to_string(),
            "batch": b,
            "n_prompt": sizes.prompt,
            "n_gen": sizes.gen,
            "repetitions": args.repetitions,
            "pp_tokens_per_s": pp_med,
            "tg_tokens_per_s": tg_med,
            "tg_tokens_per_s_per_sequence": tg_med.map(|t| t / b as f64),
            "weight_bytes_per_token": model.weight_bytes_per_token(),
            "peak_rss_bytes": peak_rss_bytes(),
            "memory": kv_memory::json(&memory.0, &memory.1),
        });
        crate::print_stdout(&format!("{j}\n"));
    } else {
        println!(
            "batched forward: {b} sequences per step on {}",
            backend.name()
        );
        println!("{}", kv_memory::line(&memory.0, &memory.1));
        println!(
            "| vindex | threads | B | test | tokens/s (all sequences) | tokens/s per sequence |"
        );
        println!("|---|---|---|---|---|---|");
        if let Some(v) = pp_med {
            let per = v / b as f64;
            println!(
                "| {name} | {threads} | {b} | pp{} | {v:.2} | {per:.2} |",
                sizes.prompt
            );
        }
        if let Some(v) = tg_med {
            let per = v / b as f64;
            println!(
                "| {name} | {threads} | {b} | tg{} | {v:.2} | {per:.2} |",
                sizes.gen
            );
        }
        if let Some(r) = peak_rss_bytes() {
            println!("peak RSS {:.1} MB", r as f64 / 1e6);
            if let Some(l) = backend.launch_report() {
                println!("{l}");
            }
        }
        if let Some(tg) = tg_med {
            let at = Test {
                phase: Phase::Gen,
                tokens: sizes.gen,
                depth: sizes.prompt,
            };
            print_profile(&format!("{b} sequences: "), &profile, at, tg / b as f64);
        }
    }
    Ok(())
}

/// `--profile` with `--batch`: device time per kernel of one batched decode step (one token
/// of each sequence in `caches`, `next[i]` for sequence i), its kernels launched one by one
/// with timing events between them; empty where the backend times nothing (the CPU). The
/// step advances every cache.
fn profile_batch_step(
    model: &Model<'_>,
    backend: &dyn infer_compute::ComputeBackend,
    caches: &mut [KvCache],
    next: &[u32],
    bufs: &mut infer_inference::forward::BatchBuffers,
) -> anyhow::Result<Profile> {
    if !backend.start_kernel_profile()? {
        return Ok(Profile::new());
    }
    let mut seqs = decode_seqs(caches, next);
    let mut logits = Vec::new();
    let step = model.forward_batch(backend, &mut seqs, bufs, &mut logits);
    // Stop timing whether or not the step ran.
    let profile = backend.take_kernel_profile();
    step?;
    Ok(profile?)
}

/// One decode step's batch: token `next[i]` for the sequence of `caches[i]`, last logits.
fn decode_seqs<'a>(
    caches: &'a mut [KvCache],
    next: &'a [u32],
) -> Vec<infer_inference::forward::BatchSeq<'a>> {
    caches
        .iter_mut()
        .zip(next.chunks(1))
        .map(|(cache, tok)| infer_inference::forward::BatchSeq {
            tokens: tok,
            cache,
            logits: Logits::Last,
        })
        .collect()
}

/// The `--profile` table of a tg test: device time per kernel kind of one decode step after
/// it (at position depth + n), headed by `label`; nothing without a profile.
fn print_profile(label: &str, profile: &[(String, usize, f64)], test: Test, tg: f64) {
    if profile.is_empty() {
        return;
    }
    let total: f64 = profile.iter().map(|p| p.2).sum();
    let launches: usize = profile.iter().map(|p| p.1).sum();
    println!(
        "{label}one decode step at position {}, kernel by kernel (timing events between \
         launches):",
        test.depth + test.tokens
    );
    println!("| kernel | launches | µs | µs per launch | share |");
    println!("|---|---|---|---|---|");
    for (name, n, us) in profile {
        println!(
            "| {name} | {n} | {us:.1} | {:.2} | {:.0}% |",
            us / *n as f64,
            100.0 * us / total
        );
    }
    println!(
        "sum: {launches} launches, {total:.1} µs; one token in the tg run (graph replay + \
         host): {:.1} µs",
        1e6 / tg
    );
}
