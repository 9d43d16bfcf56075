//! `infer perplexity`: perplexity of a text file, scored like llama.cpp's `llama-perplexity`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::{Model, Tokenizer};
use infer_vindex::Vindex;

/// Arguments of `infer perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// UTF-8 text file to score.
    pub file: PathBuf,
    /// Context (window) size in tokens.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
}

/// Negative log-likelihood of `target` under `logits` (log-softmax in f64).
fn nll(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    -(logits[target] as f64 - max - sum.ln())
}

/// Non-overlapping windows of `ctx` tokens; in each, positions `ctx/2 .. ctx-2` predict the
/// next token (the second half, as llama-perplexity scores); a model that adds BOS gets BOS as
/// each window's first token. Prints PPL ± its standard error (llama.cpp's estimate).
pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    if args.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let vindex = Vindex::open(&args.vindex).with_context(|| format!("opening vindex {}", args.vindex.display()))?;
    let tok = Tokenizer::from_json(&vindex.tokenizer_json()?)?;
    let model = Model::from_vindex(&vindex)?;
    let max = model.arch.config().max_position_embeddings;
    if args.ctx > max {
        bail!("--ctx {} exceeds the model's maximum context {max}", args.ctx);
    }
    let tokens = tok.encode(&text, true)?;
    // The BOS the tokenizer adds (if any) is the first token of an encoded empty string.
    let bos = tok.encode("", true)?.first().copied();
    let n_windows = tokens.len() / args.ctx;
    if n_windows == 0 {
        bail!("{}: {} tokens is less than one window of {}", args.file.display(), tokens.len(), args.ctx);
    }
    let backend = CpuBackend::new();
    let vocab = model.vocab_size;
    let first = args.ctx / 2;
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    for w in 0..n_windows {
        let mut window = tokens[w * args.ctx..(w + 1) * args.ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let mut cache = model.new_cache(args.ctx);
        let logits = model.forward(&backend, &window, &mut cache, Logits::All)?;
        for i in first..args.ctx - 1 {
            let v = nll(&logits[i * vocab..(i + 1) * vocab], window[i + 1] as usize);
            sum += v;
            sum2 += v * v;
            count += 1;
        }
        eprintln!("[{}/{n_windows}] running PPL {:.4}", w + 1, (sum / count as f64).exp());
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
    println!("PPL = {ppl:.4} +/- {err:.4} ({n_windows} windows of {}, {count} scored tokens)", args.ctx);
    Ok(())
}
