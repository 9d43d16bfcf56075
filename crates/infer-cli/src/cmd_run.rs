//! `infer run` and `infer logits`: inference from a vindex, and the loading, sampling and
//! interrupt helpers `infer chat` ([`crate::cmd_chat`]) shares.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use infer_inference::forward::Logits;
use infer_inference::{
    GenerateOptions, GenerationStats, Generator, Model, Sampler, SamplingParams, Tokenizer,
};
use infer_models::ModelConfig;
use infer_vindex::Vindex;

use crate::device_args::DeviceArgs;
use crate::format_args::FormatArgs;

/// Sampling and generation flags shared by `run` and `chat`.
#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Maximum new tokens.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n: usize,
    /// Temperature; 0 = greedy (the default, deterministic).
    #[arg(long = "temp", default_value_t = 0.0, value_parser = non_negative)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold in (0, 1] (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95, value_parser = open_unit_interval)]
    pub top_p: f32,
    /// Drop tokens below min-p × the top probability, in [0, 1] (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05, value_parser = unit_interval)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_parser = positive)]
    pub repeat_penalty: f32,
    /// RNG seed (sampling is deterministic per seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the output contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Context size in tokens (KV cache capacity); default min(4096, model maximum).
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// Print which path each layer's attention and FFN takes, then continue.
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

fn parse_f32(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() {
        return Err(format!("'{s}' is not finite"));
    }
    Ok(v)
}
fn non_negative(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if v < 0.0 {
        return Err("must be >= 0".into());
    }
    Ok(v)
}
fn positive(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if v <= 0.0 {
        return Err("must be > 0".into());
    }
    Ok(v)
}
fn open_unit_interval(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if !(v > 0.0 && v <= 1.0) {
        return Err("must be in (0, 1]".into());
    }
    Ok(v)
}
fn unit_interval(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err("must be in [0, 1]".into());
    }
    Ok(v)
}

/// What `run` and `chat` decode with: the generator (set up for the device), the sampler and
/// the stop conditions.
pub(crate) struct Decoding<'m, 'a> {
    pub gen: Generator<'m, 'a>,
    pub sampler: Sampler,
    pub opts: GenerateOptions,
}

impl Decoding<'_, '_> {
    /// Generate from `prompt` (appended to what the cache holds), streaming the text to stdout
    /// and to `also`, with Ctrl-C meaning "stop generating"; then print the stats line.
    pub(crate) fn generate_to_stdout(
        &mut self,
        prompt: &[u32],
        interrupt: &AtomicBool,
        mut also: impl FnMut(&str),
    ) -> anyhow::Result<GenerationStats> {
        let Decoding { gen, sampler, opts } = self;
        let mut stdout = std::io::stdout();
        let stats = generating(|| {
            gen.generate(prompt, sampler, opts, interrupt, |piece| {
                also(piece);
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            })
        })?;
        println!();
        print_stats(&stats);
        Ok(stats)
    }
}

impl SamplingArgs {
    /// The [`Decoding`] of these flags for `model` on `backend` with a context of `ctx`, for
    /// prompt passes of up to `longest_prompt` tokens. First checks that the weights, the KV
    /// cache and the scratch fit in the device's memory (the KV cache in the host's on the CPU;
    /// `--explain` prints the `memory:` line, then where the prompt and the decoded tokens run).
    /// Errors: a context that does not fit (naming `--ctx`).
    pub(crate) fn decoding<'m, 'a>(
        &self,
        model: &'m Model<'a>,
        backend: &'m dyn infer_compute::ComputeBackend,
        tokenizer: &'m Tokenizer,
        ctx: usize,
        longest_prompt: usize,
    ) -> anyhow::Result<Decoding<'m, 'a>> {
        let work = crate::kv_memory::Workload {
            sequences: 1,
            positions: ctx,
            step_tokens: longest_prompt.clamp(1, ctx),
            logit_rows: 1,
        };
        self.device.check_memory(
            model,
            backend,
            &work,
            &format!("--ctx {ctx} positions"),
            "lower --ctx (-c)",
            self.explain,
        )?;
        let gen = Generator::new(model, backend, tokenizer, ctx);
        self.device.explain(self.explain);
        Ok(Decoding {
            gen,
            sampler: Sampler::new(self.params()),
            opts: GenerateOptions {
                max_tokens: self.n,
                eog_ids: eog_ids(model, tokenizer),
                stop_strings: self.stop.clone(),
            },
        })
    }

    pub(crate) fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: 64,
            seed: self.seed,
        }
    }
}

/// Arguments of `infer run`.
#[derive(Args)]
pub struct RunArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// Prompt text, used as is (chat markup such as `<|im_start|>` is recognised).
    pub prompt: String,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Arguments of `infer logits`.
#[derive(Args)]
#[group(id = "input", required = true, multiple = false, args = ["prompt", "ids"])]
pub struct LogitsArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// Text to tokenize (the tokenizer's BOS rule applies).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub ids: Option<Vec<u32>>,
    /// Write `logits` f32 [T, vocab] and `input_ids` i64 [T] to this safetensors file (a new
    /// path, or an existing regular file with --force; never a device, FIFO or symlink).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing --out file.
    #[arg(long, requires = "out")]
    pub force: bool,
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// An opened vindex with its tokenizer.
pub(crate) struct Loaded {
    pub vindex: Vindex,
    pub tokenizer: Tokenizer,
}

/// Open the vindex at `path`; errors say why it is not one (missing, a file, no index.json).
pub(crate) fn open_vindex(path: &std::path::Path) -> anyhow::Result<Vindex> {
    Vindex::open(path).with_context(|| format!("opening vindex {}", path.display()))
}

pub(crate) fn load_tokenizer(vindex: &Vindex, path: &std::path::Path) -> anyhow::Result<Tokenizer> {
    let json = vindex
        .tokenizer_json()
        .with_context(|| format!("{}: reading tokenizer", path.display()))?;
    Tokenizer::from_json(&json).with_context(|| format!("{}: tokenizer.json", path.display()))
}

pub(crate) fn load(path: &std::path::Path) -> anyhow::Result<Loaded> {
    let vindex = open_vindex(path)?;
    let tokenizer = load_tokenizer(&vindex, path)?;
    Ok(Loaded { vindex, tokenizer })
}

/// Assemble the model with the requested formats and sparse walk (`--walk-k`,
/// `--walk-select`); errors name the vindex (its index.json holds the config).
pub(crate) fn build_model<'v>(
    vindex: &'v Vindex,
    path: &std::path::Path,
    formats: &FormatArgs,
) -> anyhow::Result<Model<'v>> {
    let mut model = Model::from_vindex_with(vindex, &formats.request()).with_context(|| {
        format!(
            "{}: assembling the model from index.json and its files",
            path.display()
        )
    })?;
    model
        .set_walk_k(vindex, &formats.walk_k, formats.walk_select)
        .with_context(|| format!("{}: --walk-k {}", path.display(), formats.walk_k))?;
    Ok(model)
}

/// Warn when `ids` start with two BOS tokens (the tokenizer or template adds one and the text
/// has another), as llama.cpp does: the model then sees an input it was not trained on.
pub(crate) fn warn_double_bos(model: &Model<'_>, ids: &[u32]) {
    if let (Some(bos), [a, b, ..]) = (model.arch.config().bos_token_id, ids) {
        if *a == bos && *b == bos {
            eprintln!(
                "warning: the prompt starts with two BOS tokens (id {bos}); the model expects one (does the text start with one the tokenizer or template also adds?)"
            );
        }
    }
}

/// Exit `128 + signal` (130 after Ctrl-C) when generation was interrupted, so scripts can
/// tell output was cut short.
pub(crate) fn exit_if_interrupted(stats: &GenerationStats) {
    if stats.stop == infer_inference::StopReason::Interrupted {
        std::process::exit(crate::signals::exit_code());
    }
}

/// The context size: `requested` (given as the command's `flag`, `--ctx` or `--ctx-size`) or
/// min(4096, the model's maximum). Errors name `flag`: 0, or more than the model's maximum.
pub(crate) fn context_size(
    config: &ModelConfig,
    requested: Option<usize>,
    flag: &str,
) -> anyhow::Result<usize> {
    let max = config.max_position_embeddings.max(1);
    let ctx = requested.unwrap_or(4096.min(max));
    if ctx == 0 {
        bail!("{flag} must be at least 1");
    }
    if ctx > max {
        bail!("{flag} {ctx} exceeds the model's maximum context {max}");
    }
    Ok(ctx)
}

/// End-of-generation ids: the config's EOS ids plus the usual end-of-turn tokens in the vocab.
pub(crate) fn eog_ids(model: &Model<'_>, tok: &Tokenizer) -> Vec<u32> {
    let mut ids = model.arch.config().eos_token_ids.clone();
    for t in [
        "<|im_end|>",
        "<|endoftext|>",
        "<end_of_turn>",
        "<eos>",
        "</s>",
        "<|eot_id|>",
        "<|end_of_text|>",
        "<|end|>",
    ] {
        if let Some(id) = tok.token_to_id(t) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// True while tokens are being generated: Ctrl-C then stops generation cleanly (stats are
/// still printed); at any other time (e.g. the chat prompt) it exits.
static GENERATING: AtomicBool = AtomicBool::new(false);

/// The flag Ctrl-C sets while generating. Ctrl-C at any other time, a second one while
/// stopping, or SIGTERM / SIGHUP at any time exits at once with `128 + signal`.
pub(crate) fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    crate::signals::set_handler(move || {
        if !crate::signals::is_ctrl_c()
            || !GENERATING.load(Ordering::SeqCst)
            || f.swap(true, Ordering::SeqCst)
        {
            eprintln!();
            std::process::exit(crate::signals::exit_code());
        }
    });
    flag
}

/// Run `f` with Ctrl-C meaning "stop generating".
pub(crate) fn generating<T>(f: impl FnOnce() -> T) -> T {
    GENERATING.store(true, Ordering::SeqCst);
    let out = f();
    GENERATING.store(false, Ordering::SeqCst);
    out
}

pub(crate) fn print_stats(s: &GenerationStats) {
    eprintln!("\n{}", stats_line(s));
}

/// `[prompt: N tokens, X tokens/s | decode: M tokens, Y tokens/s | stop: …]`. The decode
/// speed counts the tokens after the first (which comes from the prompt pass), so with one
/// token or none there is no speed to show.
fn stats_line(s: &GenerationStats) -> String {
    let tokens = |n: usize| format!("{n} token{}", if n == 1 { "" } else { "s" });
    let decode = match s.generated_tokens {
        0 | 1 => tokens(s.generated_tokens),
        n => format!("{}, {:.1} tokens/s", tokens(n), s.decode_tokens_per_s()),
    };
    format!(
        "[prompt: {}, {:.1} tokens/s | decode: {decode} | stop: {:?}]",
        tokens(s.prompt_tokens),
        s.prefill_tokens_per_s(),
        s.stop
    )
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let l = load(&args.vindex)?;
    let model = build_model(&l.vindex, &args.vindex, &args.sampling.formats)?;
    if args.sampling.explain {
        eprint!("{}", model.explain());
    }
    let backend = args.sampling.device.backend()?;
    let ctx = context_size(model.arch.config(), args.sampling.ctx, "--ctx")?;
    let prompt = l.tokenizer.encode(&args.prompt, true)?;
    if prompt.is_empty() {
        bail!("the prompt is empty: give some text to continue");
    }
    warn_double_bos(&model, &prompt);
    let mut d = args
        .sampling
        .decoding(&model, &*backend, &l.tokenizer, ctx, prompt.len())?;
    let interrupt = interrupt_flag();
    let stats = d.generate_to_stdout(&prompt, &interrupt, |_| {})?;
    exit_if_interrupted(&stats);
    Ok(())
}

pub fn logits(args: LogitsArgs) -> anyhow::Result<()> {
    if let Some(out) = &args.out {
        check_output_path("--out", out, args.force)?;
    }
    let vindex = open_vindex(&args.vindex)?;
    let model = build_model(&vindex, &args.vindex, &args.formats)?;
    // Token ids need no tokenizer (weights-only vindexes work); text and token names do.
    let tokenizer = match &args.prompt {
        Some(_) => Some(load_tokenizer(&vindex, &args.vindex)?),
        None => load_tokenizer(&vindex, &args.vindex).ok(),
    };
    let ids = match (&args.prompt, &args.ids, &tokenizer) {
        (Some(p), _, Some(tok)) => tok.encode(p, true)?,
        (None, Some(ids), _) => ids.clone(),
        _ => bail!("give --prompt TEXT or --ids 1,2,3"),
    };
    if ids.is_empty() {
        bail!("no tokens to run (empty prompt)");
    }
    warn_double_bos(&model, &ids);
    let max = model.arch.config().max_position_embeddings.max(1);
    if ids.len() > max {
        bail!(
            "{} tokens exceed the model's maximum context {max}",
            ids.len()
        );
    }
    let backend = args.device.backend()?;
    let work = crate::kv_memory::Workload {
        sequences: 1,
        positions: ids.len(),
        step_tokens: ids.len(),
        logit_rows: ids.len(),
    };
    let what = format!("{} tokens", ids.len());
    let fix = "give fewer tokens";
    args.device
        .check_memory(&model, &*backend, &work, &what, fix, false)?;
    let mut cache = model.new_cache(ids.len());
    let logits = model.forward(&*backend, &ids, &mut cache, Logits::All)?;
    if logits.iter().any(|v| !v.is_finite()) {
        bail!(
            "{}: the model produced non-finite logits (corrupt weights or config?)",
            args.vindex.display()
        );
    }
    let vocab = model.vocab_size;
    let last = &logits[(ids.len() - 1) * vocab..];
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| last[b].total_cmp(&last[a]).then(a.cmp(&b)));
    let mut text = format!("top-10 logits at position {}:\n", ids.len() - 1);
    for &i in order.iter().take(10) {
        // The token's text as it would be printed (`"\n"`, `" and"`), not its byte-level
        // vocabulary string (`Ċ`, `Ġand`).
        let tok = tokenizer
            .as_ref()
            .and_then(|t| t.decode(&[i as u32], false).ok())
            .unwrap_or_default();
        text.push_str(&format!("{i:>8} {:>12.6} {tok:?}\n", last[i]));
    }
    crate::print_stdout(&text);
    if let Some(out) = &args.out {
        crate::cmd_vindex::install_interrupt_cleanup(out);
        write_logits(out, &ids, &logits, vocab)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// Fail before any work when the output file `out` of option `flag` (`--out`,
/// `--kl-divergence-base`) may not or cannot be written: it must be a new path or, with
/// `force`, an existing regular file (never a directory, device, FIFO, socket or symlink:
/// writing replaces the path by renaming over it), in an existing folder where a file can be
/// created (probed with the temp file the write stages in, `.NAME.tmp-PID`, removed at once:
/// a read-only or pseudo file system such as `/proc` fails here, not after the model ran).
/// Errors start with `flag` and `out`.
pub(crate) fn check_output_path(
    flag: &str,
    out: &std::path::Path,
    force: bool,
) -> anyhow::Result<()> {
    let shown = out.display();
    match std::fs::symlink_metadata(out) {
        Ok(m) if m.file_type().is_symlink() => {
            bail!("{flag} {shown}: is a symbolic link; refusing to replace it (give the path it points to)")
        }
        Ok(m) if m.is_dir() => bail!("{flag} {shown}: is a folder, not a file"),
        Ok(m) if !m.is_file() => bail!(
            "{flag} {shown}: is not a regular file (a device, FIFO or socket); refusing to replace it"
        ),
        Ok(_) if !force => bail!("{flag} {shown}: already exists (use --force to replace it)"),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("{flag} {shown}: {e}"),
    }
    let parent = crate::cmd_synth::space::output_dir(out);
    if !parent.is_dir() {
        let what = if parent.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        bail!(
            "{flag} {shown}: output directory {} {what}",
            parent.display()
        );
    }
    let Some(name) = out.file_name() else {
        bail!("{flag} {shown}: not a file path");
    };
    let probe = parent.join(temp_name(&name.to_string_lossy()));
    if let Err(e) = std::fs::File::create(&probe) {
        bail!(
            "{flag} {shown}: cannot create a file in {}: {e}",
            parent.display()
        );
    }
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// This process's temp name for an output file named `name` (`.NAME.tmp-PID`, as `infer
/// extract` stages; [`crate::cmd_vindex::install_interrupt_cleanup`] removes it).
fn temp_name(name: &str) -> String {
    infer_vindex::files::temp_dir_name(name, std::process::id())
}

fn write_logits(
    out: &std::path::Path,
    ids: &[u32],
    logits: &[f32],
    vocab: usize,
) -> anyhow::Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let st_err = |e: safetensors::SafeTensorError| {
        anyhow::anyhow!("{}", infer_models::hf::safetensors_error_text(&e))
    };
    let logit_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let id_bytes: Vec<u8> = ids.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect();
    let t = ids.len();
    let tensors = vec![
        (
            "logits",
            TensorView::new(Dtype::F32, vec![t, vocab], &logit_bytes).map_err(st_err)?,
        ),
        (
            "input_ids",
            TensorView::new(Dtype::I64, vec![t], &id_bytes).map_err(st_err)?,
        ),
    ];
    // A hidden temp file beside `out` (same file system), renamed over it when complete.
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let tmp = out.with_file_name(temp_name(&name));
    let written = safetensors::serialize_to_file(tensors, &None, &tmp)
        .map_err(|e| {
            anyhow::anyhow!(
                "writing {}: {}",
                out.display(),
                infer_models::hf::safetensors_error_text(&e)
            )
        })
        .and_then(|_| {
            std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stats_line_shows_no_speed_for_one_token() {
        let mut s = GenerationStats {
            prompt_tokens: 1,
            generated_tokens: 1,
            prefill_time: Duration::from_millis(500),
            decode_time: Duration::from_millis(1),
            stop: infer_inference::StopReason::Interrupted,
            tokens: vec![7],
        };
        assert_eq!(
            stats_line(&s),
            "[prompt: 1 token, 2.0 tokens/s | decode: 1 token | stop: Interrupted]"
        );
        s.generated_tokens = 5;
        s.decode_time = Duration::from_secs(2);
        assert_eq!(
            stats_line(&s),
            "[prompt: 1 token, 2.0 tokens/s | decode: 5 tokens, 2.0 tokens/s | stop: Interrupted]"
        );
    }
}
