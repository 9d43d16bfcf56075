//! `infer perplexity`: perplexity of a text file, scored like llama.cpp's `llama-perplexity`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use infer_inference::perplexity::perplexity;
use infer_vindex::Vindex;

use crate::device_args::DeviceArgs;
use crate::format_args::FormatArgs;

/// Arguments of `infer perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// The vindex directory.
    pub vindex: PathBuf,
    /// UTF-8 text file to score.
    pub file: PathBuf,
    /// Context (window) size in tokens.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
}

/// Non-overlapping windows of `ctx` tokens; in each, positions `ctx/2 .. ctx-2` predict the
/// next token (the second half, as llama-perplexity scores); a model that adds BOS gets BOS as
/// each window's first token. Prints PPL ± its standard error (llama.cpp's estimate).
pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    if args.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let vindex = Vindex::open(&args.vindex)
        .with_context(|| format!("opening vindex {}", args.vindex.display()))?;
    let tok = crate::cmd_run::load_tokenizer(&vindex, &args.vindex)?;
    let model = crate::cmd_run::build_model(&vindex, &args.vindex, &args.formats)?;
    let max = model.arch.config().max_position_embeddings;
    if args.ctx > max {
        bail!(
            "--ctx {} exceeds the model's maximum context {max}",
            args.ctx
        );
    }
    let tokens = tok.encode(&text, true)?;
    // The BOS the tokenizer adds (if any) is the first token of an encoded empty string.
    let bos = tok.encode("", true)?.first().copied();
    if tokens.len() < args.ctx {
        bail!(
            "{}: {} tokens is less than one window of {}",
            args.file.display(),
            tokens.len(),
            args.ctx
        );
    }
    let backend = args.device.backend()?;
    let r = perplexity(
        &model,
        &*backend,
        &tokens,
        args.ctx,
        bos,
        |w, n, running| {
            eprintln!("[{}/{n}] running PPL {running:.4}", w + 1);
        },
    )?;
    println!(
        "PPL = {:.4} +/- {:.4} ({} windows of {}, {} scored tokens)",
        r.ppl, r.error, r.windows, args.ctx, r.scored_tokens
    );
    Ok(())
}
