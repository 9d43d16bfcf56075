//! `infer bench`: prompt (prefill) and decode tokens/s of a vindex, llama-bench style.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use infer_inference::forward::Logits;
use infer_inference::TokenRunner;
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
    /// Prompt tokens processed in one batch (pp test); 0 skips it.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens decoded one at a time (tg test); 0 skips it.
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Context before each test (llama-bench's `-d`): pp and tg run after a context of this
    /// many tokens, prefilled untimed, and are reported as `pp512 @ d4096` — decode speed at
    /// depth (single-sequence protocol only).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions; the median is reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Sequences run at once (llama-batched-bench's `-npl`): B prompts of `-p` tokens are
    /// prefilled in batched steps, then every step decodes one token of each of the B
    /// sequences (continuing after its prompt), `-n` steps; aggregate and per-sequence
    /// tokens/s are reported (`-B 1`: the same protocol for one sequence). Without it: the
    /// llama-bench protocol above (decode after the `-d` context, empty by default).
    #[arg(short = 'B', long = "batch")]
    pub batch: Option<usize>,
    /// With a device decoder (`--device cuda`): also run one decode step kernel by kernel with
    /// timing events and print the device time per kernel kind (table output, single-sequence
    /// protocol).
    #[arg(long)]
    pub profile: bool,
    /// Print the format plan (which tier each operation reads) to stderr before the runs.
    #[arg(long)]
    pub explain: bool,
}

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

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("nothing to measure: -p and -n are both 0");
    }
    if let Some(b) = args.batch.filter(|&b| b == 0 || b > 4096) {
        bail!("--batch {b}: must be between 1 and 4096");
    }
    if args.batch.is_some() && args.depth > 0 {
        bail!("--depth is for the single-sequence protocol: with --batch, -p is each sequence's context");
    }
    let vindex = Vindex::open(&args.vindex)
        .with_context(|| format!("opening vindex {}", args.vindex.display()))?;
    let model = crate::cmd_run::build_model(&vindex, &args.vindex, &args.formats)?;
    let backend = args.device.backend()?;
    if args.explain {
        eprint!("{}", model.explain());
    }
    let ctx = args
        .depth
        .checked_add(args.n_prompt)
        .and_then(|c| c.checked_add(args.n_gen))
        .and_then(|c| c.checked_add(1))
        .with_context(|| {
            let depth = (args.depth > 0).then(|| format!("-d {} + ", args.depth));
            format!(
                "{}-p {} + -n {}: the context overflows",
                depth.unwrap_or_default(),
                args.n_prompt,
                args.n_gen
            )
        })?;
    let max = model.arch.config().max_position_embeddings;
    let sizes = if args.depth > 0 {
        format!(
            "-d {} + -p {} + -n {}",
            args.depth, args.n_prompt, args.n_gen
        )
    } else {
        format!("-p {} + -n {}", args.n_prompt, args.n_gen)
    };
    if ctx > max {
        bail!(
            "{sizes} needs a context of {ctx} positions (one more for the last token), \
             more than the model's maximum context {max}"
        );
    }
    // Weights, KV caches and scratch against the device's free memory (the host's available
    // memory for the KV caches on the CPU), before anything is uploaded or allocated.
    let seqs = args.batch.unwrap_or(1);
    let work = match args.batch {
        Some(b) => {
            // Prefill steps of whole prompts (at most MAX_STEP_TOKENS), then B tokens a step.
            let prompt = args.n_prompt.max(1);
            let per_step = (MAX_STEP_TOKENS / prompt).clamp(1, b);
            Workload {
                sequences: b,
                positions: ctx,
                step_tokens: (per_step * prompt).max(b),
                logit_rows: b,
                fused_decoder: false,
            }
        }
        None => Workload {
            sequences: 1,
            positions: ctx,
            step_tokens: args.depth.max(args.n_prompt).max(1),
            logit_rows: 1,
            fused_decoder: args.device.fused_decoder(&model, ctx),
        },
    };
    let what = format!(
        "{seqs} sequence{} × {ctx} positions ({} + 1)",
        if seqs == 1 { "" } else { "s" },
        if args.depth > 0 {
            "-d + -p + -n"
        } else {
            "-p + -n"
        }
    );
    let fix = if args.batch.is_some() {
        "lower -B, -p or -n"
    } else if args.depth > 0 {
        "lower -d, -p or -n"
    } else {
        "lower -p or -n"
    };
    // The table prints the `memory:` line; with --json, --explain prints it on stderr.
    let explain = args.explain && args.json;
    let memory = args
        .device
        .check_memory(&model, &*backend, &work, &what, fix, explain)?;
    // Deterministic pseudo-random prompt ids, as llama-bench uses random tokens.
    let vocab = model.vocab_size as u64;
    let ids: Vec<u32> = (0..(args.depth + args.n_prompt).max(1) as u64)
        .map(|i| ((i * 2654435761 + 12345) % vocab) as u32)
        .collect();

    if let Some(b) = args.batch {
        if args.profile {
            eprintln!(
                "note: --profile times the single-sequence decode; with --batch it is not run"
            );
        }
        return batched(&args, b, &model, &*backend, &ids, ctx, &memory);
    }
    let mut runner = TokenRunner::new(&model, &*backend, ctx, !args.device.host_loop)?;
    let decode = crate::device_args::decode_mode(&runner, &args.device);
    if args.profile && !runner.on_device() {
        eprintln!(
            "note: --profile times the device decoder's kernels; this run has none ({decode})"
        );
    }
    if args.profile && runner.on_device() && (args.json || args.n_gen == 0) {
        eprintln!(
            "note: --profile prints a table of one decode step: it needs -n > 0 and no --json"
        );
    }
    let mut logits = Vec::new();
    let (depth_ids, prompt_ids) = ids.split_at(args.depth);
    // A new cache holding the `--depth` context (prefilled untimed).
    let context = |runner: &mut TokenRunner<'_, '_>, logits: &mut Vec<f32>| {
        let mut cache = model.new_cache(ctx);
        if !depth_ids.is_empty() {
            runner.forward_into(depth_ids, &mut cache, Logits::Last, logits)?;
            // Its K/V reach the device decoder here, untimed (llama-bench times decode from a
            // filled cache).
            runner.sync_to_device(&cache)?;
        }
        anyhow::Ok(cache)
    };
    if args.device.device != crate::device_args::Device::Cpu {
        // Warm-up (untimed, as llama-bench's): the first device steps upload the weights,
        // record the CUDA graph and load the kernels of each product shape (cuBLAS loads its
        // kernels lazily); a prompt of the timed length after the same context warms the
        // prefill's shapes too.
        let mut cache = context(&mut runner, &mut logits)?;
        runner.forward_into(&ids[..1], &mut cache, Logits::Last, &mut logits)?;
        // One forward-pass cache at a time (the memory check counts one beside the fused
        // decoder's).
        drop(cache);
        if args.n_prompt > 1 {
            let mut cache = context(&mut runner, &mut logits)?;
            let prompt = &prompt_ids[..args.n_prompt];
            runner.forward_into(prompt, &mut cache, Logits::Last, &mut logits)?;
        }
    }
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    let mut profile = Vec::new();
    // Walk-FFN time per decoded token (all layers), from the process-wide walk FFN clock.
    let mut ffn_ms = Vec::new();
    for _ in 0..args.repetitions {
        if args.n_prompt > 0 {
            let mut cache = context(&mut runner, &mut logits)?;
            let t0 = Instant::now();
            runner.forward_into(
                &prompt_ids[..args.n_prompt],
                &mut cache,
                Logits::Last,
                &mut logits,
            )?;
            pp.push(args.n_prompt as f64 / t0.elapsed().as_secs_f64());
        }
        if args.n_gen > 0 {
            let mut cache = context(&mut runner, &mut logits)?;
            let mut tok = ids[0];
            let ffn0 = infer_inference::walk::walk_ffn_nanos();
            let t0 = Instant::now();
            for _ in 0..args.n_gen {
                // Greedy, chosen on the device when the decoder offers it (as `run` does).
                tok = runner.forward_greedy(tok, &mut cache, &mut logits)?;
            }
            tg.push(args.n_gen as f64 / t0.elapsed().as_secs_f64());
            let ffn_ns = infer_inference::walk::walk_ffn_nanos() - ffn0;
            ffn_ms.push(ffn_ns as f64 / 1e6 / args.n_gen as f64);
            if args.profile && profile.is_empty() {
                profile = runner.profile_step(tok, &cache)?;
            }
        }
    }
    let threads = rayon::current_num_threads();
    let bytes = model.weight_bytes_per_token() as f64;
    let pp_med = (!pp.is_empty()).then(|| median(pp));
    let tg_med = (!tg.is_empty()).then(|| median(tg));
    // Only meaningful when the FFN runs the walk path (else the clock does not move).
    let ffn_med = (!ffn_ms.is_empty())
        .then(|| median(ffn_ms))
        .filter(|&v| v > 0.0);
    let gbs = tg_med.map(|t| t * bytes / 1e9);
    let rss = peak_rss_bytes();
    let probe = tg_med.map(|_| read_probe_gb_per_s());
    let name = args.vindex.display().to_string();
    if args.json {
        let j = serde_json::json!({
            "vindex": name,
            "model_type": model.arch.config().model_type,
            "threads": threads,
            "device": args.device.device.to_string(),
            "decode": decode,
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "depth": args.depth,
            "repetitions": args.repetitions,
            "pp_tokens_per_s": pp_med,
            "tg_tokens_per_s": tg_med,
            "walk_k": args.formats.walk_k.to_string(),
            // The selection only exists for a sparse walk (K below all).
            "walk_select": (!args.formats.walk_k.is_all())
                .then(|| args.formats.walk_select.to_string()),
            "walk_ffn_ms_per_token": ffn_med,
            "weight_bytes_per_token": bytes,
            "tg_effective_gb_per_s": gbs,
            "read_probe_gb_per_s": probe,
            "peak_rss_bytes": rss,
            "memory": kv_memory::json(&memory.0, &memory.1),
        });
        crate::print_stdout(&format!("{j}\n"));
    } else {
        println!("decode: {decode}");
        println!("{}", kv_memory::line(&memory.0, &memory.1));
        println!("| vindex | threads | test | tokens/s |");
        println!("|---|---|---|---|");
        let at = if args.depth > 0 {
            format!(" @ d{}", args.depth)
        } else {
            String::new()
        };
        if let Some(v) = pp_med {
            println!("| {name} | {threads} | pp{}{at} | {v:.2} |", args.n_prompt);
        }
        if let Some(v) = tg_med {
            println!("| {name} | {threads} | tg{}{at} | {v:.2} |", args.n_gen);
        }
        if let Some(f) = ffn_med {
            let selection = if args.formats.walk_k.is_all() {
                String::new()
            } else {
                format!(", selection by the {}", args.formats.walk_select)
            };
            println!(
                "walk FFN (--walk-k {}{selection}): {f:.3} ms per decoded token",
                args.formats.walk_k
            );
        }
        if let (Some(g), Some(p)) = (gbs, probe) {
            println!(
                "plain memory-read probe: {p:.1} GB/s; decode reaches {:.0}% of it",
                100.0 * g / p
            );
        }
        if let Some(g) = gbs {
            let kv = if args.depth > 0 {
                " (weights only: the KV cache of the context adds its own reads)"
            } else {
                ""
            };
            println!(
                "decode reads {:.1} MB of weights per token: {g:.1} GB/s effective{kv}",
                bytes / 1e6
            );
        }
        if let Some(r) = rss {
            println!("peak RSS {:.1} MB", r as f64 / 1e6);
            if let Some(l) = backend.launch_report() {
                println!("{l}");
            }
        }
        print_profile(&profile, args.n_gen, tg_med);
    }
    Ok(())
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
    model: &infer_inference::Model<'_>,
    backend: &dyn infer_compute::ComputeBackend,
    ids: &[u32],
    ctx: usize,
    memory: &(kv_memory::Need, kv_memory::Room),
) -> anyhow::Result<()> {
    use infer_inference::forward::{BatchBuffers, BatchSeq};
    // Every sequence gets its own prompt (rotated ids), as the server would see.
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|i| {
            let n = args.n_prompt.max(1);
            (0..n).map(|j| ids[(i * 7 + j) % ids.len()]).collect()
        })
        .collect();
    let per_step = (MAX_STEP_TOKENS / args.n_prompt.max(1)).max(1);
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
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
                    tokens: if args.n_prompt == 0 { &p[..1] } else { p },
                    cache,
                    logits: Logits::Last,
                })
                .collect();
            model.forward_batch(backend, &mut seqs, &mut bufs, &mut logits)?;
        }
        if args.n_prompt > 0 && timed {
            pp.push((b * args.n_prompt) as f64 / t0.elapsed().as_secs_f64());
        }
        if args.n_gen == 0 {
            continue;
        }
        // The last prefill group's logits give its next tokens; the others start from a
        // fixed id (the tokens only need to be valid).
        let mut next: Vec<u32> = vec![ids[0]; b];
        let t1 = Instant::now();
        for _ in 0..args.n_gen {
            let mut seqs: Vec<BatchSeq<'_>> = caches
                .iter_mut()
                .zip(next.chunks(1))
                .map(|(cache, tok)| BatchSeq {
                    tokens: tok,
                    cache,
                    logits: Logits::Last,
                })
                .collect();
            // Greedy, chosen where the logits are (as the server does): a device backend
            // returns token ids, not [B, vocab] logits.
            model.forward_batch_greedy(backend, &mut seqs, &mut bufs, &mut chosen)?;
            for (n, c) in next.iter_mut().zip(&chosen) {
                *n = c.token;
            }
        }
        if timed {
            tg.push((b * args.n_gen) as f64 / t1.elapsed().as_secs_f64());
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
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
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
                args.n_prompt
            );
        }
        if let Some(v) = tg_med {
            let per = v / b as f64;
            println!(
                "| {name} | {threads} | {b} | tg{} | {v:.2} | {per:.2} |",
                args.n_gen
            );
        }
        if let Some(r) = peak_rss_bytes() {
            println!("peak RSS {:.1} MB", r as f64 / 1e6);
            if let Some(l) = backend.launch_report() {
                println!("{l}");
            }
        }
    }
    Ok(())
}

/// The `--profile` table: device time per kernel kind of one decode step at position `n_gen`.
fn print_profile(profile: &[(String, usize, f64)], pos: usize, tg: Option<f64>) {
    if profile.is_empty() {
        return;
    }
    let total: f64 = profile.iter().map(|p| p.2).sum();
    let launches: usize = profile.iter().map(|p| p.1).sum();
    println!(
        "one decode step at position {pos}, kernel by kernel (timing events between launches):"
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
    let replay = tg.map_or(String::new(), |t| {
        format!(
            "; one token in the tg run (graph replay + host): {:.1} µs",
            1e6 / t
        )
    });
    println!("sum: {launches} launches, {total:.1} µs{replay}");
}
