//! `infer perplexity`: perplexity of a text file, scored like llama.cpp's `llama-perplexity`,
//! and the KL divergence from a base model's log-probabilities in llama-perplexity's file format
//! (`--kl-divergence-base` / `--kl-divergence`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use infer_inference::kl_divergence::{scored_per_window, KlStats, LogProbReader, LogProbWriter};
use infer_inference::perplexity::{perplexity, ScoredWindow};

use crate::device_args::DeviceArgs;
use crate::format_args::FormatArgs;

/// Window size when neither `-c` nor a base file gives one.
const DEFAULT_CTX: usize = 512;

/// Arguments of `infer perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// The vindex directory.
    pub vindex: PathBuf,
    /// UTF-8 text file to score (not needed with --kl-divergence, which scores the base
    /// file's tokens; when given there, its tokens must equal the base file's).
    #[arg(required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Context (window) size in tokens [default: 512, or the base file's with --kl-divergence].
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// Also write the log-probabilities of every scored position to this file, in the format
    /// of `llama-perplexity --kl-divergence-base` (readable by llama.cpp and by
    /// `--kl-divergence`). About 2 bytes × vocabulary per scored token. A new path, or an
    /// existing regular file with --force; written under a temp name and moved into place when
    /// complete (removed on error, Ctrl-C or SIGTERM).
    #[arg(long, value_name = "BASE_FILE", conflicts_with = "kl_divergence")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Replace an existing --kl-divergence-base file.
    #[arg(long, requires = "kl_divergence_base")]
    pub force: bool,
    /// Compare with the base log-probabilities in this file (written by
    /// `--kl-divergence-base`, here or by llama-perplexity) on the file's tokens and window
    /// size: PPL of both, mean/median/99% KL divergence, Δp and same-top statistics.
    #[arg(long, value_name = "BASE_FILE")]
    pub kl_divergence: Option<PathBuf>,
}

/// Non-overlapping windows of `ctx` tokens; in each, positions `ctx/2 .. ctx-2` predict the
/// next token (the second half, as llama-perplexity scores); a model that adds BOS gets BOS as
/// each window's first token. Prints PPL ± its standard error (llama.cpp's estimate), and with
/// `--kl-divergence` the comparison with the base.
pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    if let Some(out) = &args.kl_divergence_base {
        crate::cmd_run::check_output_path("--kl-divergence-base", out, args.force)?;
    }
    let vindex = crate::cmd_run::open_vindex(&args.vindex)?;
    let tok = crate::cmd_run::load_tokenizer(&vindex, &args.vindex)?;
    let model = crate::cmd_run::build_model(&vindex, &args.vindex, &args.formats)?;
    // The BOS the tokenizer adds (if any) is the first token of an encoded empty string.
    let bos = tok.encode("", true)?.first().copied();
    let text_tokens = match &args.file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            Some(tok.encode(&text, true)?)
        }
        None => None,
    };
    let mut base = match &args.kl_divergence {
        Some(path) => Some(LogProbReader::open(path)?),
        None => None,
    };
    let ctx = match (&base, args.ctx) {
        (Some(b), Some(c)) if c != b.n_ctx => bail!(
            "--ctx {c} differs from the window size {} that {} was scored with",
            b.n_ctx,
            args.kl_divergence.as_ref().unwrap().display()
        ),
        (Some(b), _) => b.n_ctx,
        (None, c) => c.unwrap_or(DEFAULT_CTX),
    };
    if ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let max = model.arch.config().max_position_embeddings;
    if ctx > max {
        bail!("--ctx {ctx} exceeds the model's maximum context {max}");
    }
    let tokens = match &base {
        Some(b) => {
            let path = args.kl_divergence.as_ref().unwrap().display();
            if b.n_vocab != model.vocab_size {
                bail!(
                    "{path}: scored with a vocabulary of {}, this model has {}",
                    b.n_vocab,
                    model.vocab_size
                );
            }
            if let Some(bad) = b.tokens.iter().find(|&&t| t as usize >= model.vocab_size) {
                bail!("{path}: token id {bad} is outside the vocabulary");
            }
            if let Some(ours) = &text_tokens {
                let hint =
                    "another tokenizer or text; leave out the text to score the base file's tokens";
                if let Some(i) =
                    (0..ours.len().min(b.tokens.len())).find(|&i| ours[i] != b.tokens[i])
                {
                    bail!(
                        "{path}: the text's token {i} is {} here, {} in the base file ({hint})",
                        ours[i],
                        b.tokens[i]
                    );
                }
                if ours.len() < b.tokens.len() {
                    bail!(
                        "{path}: the text has {} tokens, the base file {} ({hint})",
                        ours.len(),
                        b.tokens.len()
                    );
                }
            }
            b.tokens.clone()
        }
        None => text_tokens.unwrap_or_default(),
    };
    if tokens.len() < ctx {
        bail!(
            "{}: {} tokens is less than one window of {ctx}",
            args.file
                .as_ref()
                .map(|f| f.display().to_string())
                .unwrap_or_default(),
            tokens.len(),
        );
    }
    // Before the output file is started.
    let backend = args.device.backend()?;
    // One window at a time: its cache, its prompt pass and every position's logits.
    let work = crate::kv_memory::Workload {
        sequences: 1,
        positions: ctx,
        step_tokens: ctx,
        logit_rows: ctx,
    };
    let what = format!("windows of --ctx {ctx}");
    args.device
        .check_memory(&model, &*backend, &work, &what, "lower --ctx (-c)", false)?;
    let mut writer = match &args.kl_divergence_base {
        Some(path) => {
            crate::cmd_vindex::install_interrupt_cleanup(path);
            Some(LogProbWriter::create(path, ctx, model.vocab_size, &tokens)?)
        }
        None => None,
    };
    let mut stats = KlStats::default();
    let mut base_rows = Vec::new();
    let vocab = model.vocab_size;
    let r = perplexity(
        &model,
        &*backend,
        &tokens,
        ctx,
        bos,
        |w: &ScoredWindow<'_>| {
            if let Some(wr) = writer.as_mut() {
                wr.write_window(w.logits)?;
            }
            if let Some(b) = base.as_mut() {
                b.read_window(&mut base_rows)?;
                let targets = &w.tokens[ctx / 2 + 1..ctx / 2 + 1 + scored_per_window(ctx)];
                stats.add_window(w.logits, &base_rows, targets, vocab);
            }
            eprintln!(
                "[{}/{}] running PPL {:.4}",
                w.index + 1,
                w.windows,
                w.running_ppl
            );
            Ok(())
        },
    )?;
    if let Some(wr) = writer {
        wr.finish()?;
    }
    println!(
        "PPL = {:.4} +/- {:.4} ({} windows of {ctx}, {} scored tokens)",
        r.ppl, r.error, r.windows, r.scored_tokens
    );
    if let Some(s) = stats.summary() {
        println!(
            "Mean PPL(Q)                : {:.6} ± {:.6}",
            s.ppl, s.ppl_error
        );
        println!(
            "Mean PPL(base)             : {:.6} ± {:.6}",
            s.ppl_base, s.ppl_base_error
        );
        println!(
            "Mean ln(PPL(Q)/PPL(base))  : {:.6} ± {:.6}",
            s.ln_ppl_ratio, s.ln_ppl_ratio_error
        );
        println!("Mean PPL(Q)/PPL(base)      : {:.6}", s.ln_ppl_ratio.exp());
        println!("Mean    KLD: {:.6} ± {:.6}", s.kld, s.kld_error);
        println!("Maximum KLD: {:.6}", s.kld_max);
        println!("99.0%   KLD: {:.6}", s.kld_99);
        println!("Median  KLD: {:.6}", s.kld_median);
        println!("Mean    Δp: {:.3} %", 100.0 * s.p_diff_mean);
        println!("RMS Δp    : {:.3} %", 100.0 * s.p_diff_rms);
        println!("Same top p: {:.3} %", 100.0 * s.same_top);
    }
    Ok(())
}
