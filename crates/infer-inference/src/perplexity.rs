//! Perplexity scored like llama.cpp's `llama-perplexity`.

use infer_compute::ComputeBackend;

use crate::forward::Logits;
use crate::{InferenceError, Model};

/// Result of [`perplexity`].
#[derive(Clone, Debug)]
pub struct Perplexity {
    pub ppl: f64,
    /// Standard error of the PPL estimate (llama-perplexity's `+/-`).
    pub error: f64,
    pub windows: usize,
    pub scored_tokens: usize,
}

/// Negative log-likelihood of `target` under `logits` (log-softmax in f64).
fn nll(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    -(logits[target] as f64 - max - sum.ln())
}

/// One scored window, handed to [`perplexity`]'s observer after it ran.
pub struct ScoredWindow<'a> {
    /// Window number (0-based) and the number of windows.
    pub index: usize,
    pub windows: usize,
    /// The window's tokens as they came from the text (before the BOS replacement), `ctx`.
    pub tokens: &'a [u32],
    /// Logits of the scored positions `ctx/2 .. ctx-2`: `[ctx - 1 - ctx/2, vocab]` row-major.
    pub logits: &'a [f32],
    /// PPL over every position scored so far, this window included.
    pub running_ppl: f64,
}

/// Non-overlapping windows of `ctx` tokens; in each, positions `ctx/2 .. ctx-2` predict the next
/// token (the second half, as llama-perplexity scores); with `bos`, each window's first token is
/// replaced by it. `on_window` sees each window's scored logits (progress, or a
/// [`crate::kl_divergence`] base file) and may stop the run with an error. Errors: fewer tokens
/// than one window (`EmptyInput`), a forward error, or the observer's error.
pub fn perplexity(
    model: &Model<'_>,
    backend: &dyn ComputeBackend,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    mut on_window: impl FnMut(&ScoredWindow<'_>) -> Result<(), InferenceError>,
) -> Result<Perplexity, InferenceError> {
    let windows = if ctx >= 4 { tokens.len() / ctx } else { 0 };
    if windows == 0 {
        return Err(InferenceError::EmptyInput);
    }
    let vocab = model.vocab_size;
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    for w in 0..windows {
        let text = &tokens[w * ctx..(w + 1) * ctx];
        let mut window = text.to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let mut cache = model.new_cache(ctx);
        let logits = model.forward(backend, &window, &mut cache, Logits::All)?;
        for i in ctx / 2..ctx - 1 {
            let v = nll(&logits[i * vocab..(i + 1) * vocab], window[i + 1] as usize);
            sum += v;
            sum2 += v * v;
            count += 1;
        }
        on_window(&ScoredWindow {
            index: w,
            windows,
            tokens: text,
            logits: &logits[ctx / 2 * vocab..(ctx - 1) * vocab],
            running_ppl: (sum / count as f64).exp(),
        })?;
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let error = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        ppl,
        error,
        windows,
        scored_tokens: count,
    })
}
