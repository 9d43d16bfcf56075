//! The generation loop: prefill the prompt in one batched pass, then decode token by token,
//! streaming UTF-8 text, until EOS, a stop string, the token limit, or an interrupt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use infer_compute::ComputeBackend;

use crate::forward::Logits;
use crate::{InferenceError, KvCache, Model, Sampler, TextStreamer, Tokenizer};

/// Generation limits and stop conditions.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Maximum new tokens (`-n`).
    pub max_tokens: usize,
    /// End-of-generation token ids (EOS, `<end_of_turn>`, …).
    pub eog_ids: Vec<u32>,
    /// Stop when the generated text contains one of these (`--stop`); the stop string is not
    /// emitted.
    pub stop_strings: Vec<String>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Eog,
    StopString,
    MaxTokens,
    Interrupted,
    ContextFull,
}

/// Token counts and timings of one generation (tokens/s printed by the CLI).
#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub stop: StopReason,
    /// Generated ids (including a final EOG id when that ended generation).
    pub tokens: Vec<u32>,
}

impl GenerationStats {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Decode speed over the tokens after the first (the first comes from prefill's logits).
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Runs a [`Model`] with a KV cache, a sampler and a tokenizer, every step through the one
/// forward pass: the prompt in one batch ([`Model::forward_into`]), greedy decode through
/// [`Model::decode_greedy`] (each choice made where the logits are; on a device the next step
/// launched before the host reads it), sampled decode one [`Model::forward_into`] per token.
pub struct Generator<'m, 'a> {
    pub model: &'m Model<'a>,
    pub backend: &'m dyn ComputeBackend,
    pub tokenizer: &'m Tokenizer,
    pub cache: KvCache,
}

impl<'m, 'a> Generator<'m, 'a> {
    pub fn new(
        model: &'m Model<'a>,
        backend: &'m dyn ComputeBackend,
        tokenizer: &'m Tokenizer,
        context: usize,
    ) -> Self {
        Generator {
            model,
            backend,
            tokenizer,
            cache: model.new_cache(context),
        }
    }

    /// Generate from `prompt` ids appended to whatever the cache already holds (chat turns keep
    /// the cache). `on_text` receives each completed UTF-8 piece. Errors: empty prompt, prompt
    /// longer than the free context, token ids outside the vocabulary.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        interrupt: &AtomicBool,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerationStats, InferenceError> {
        if prompt.is_empty() {
            return Err(InferenceError::EmptyInput);
        }
        self.cache.check_room(prompt.len())?;
        let mut history: Vec<u32> = prompt.to_vec();
        let (model, backend) = (self.model, self.backend);
        let cache = &mut self.cache;
        let t0 = Instant::now();
        let mut logits = Vec::new();
        model.forward_into(backend, prompt, cache, Logits::Last, &mut logits)?;
        let prefill_time = t0.elapsed();
        let t1 = Instant::now();
        let mut streamer = TextStreamer::new(self.tokenizer);
        let mut out = StopFilter::new(&opts.stop_strings);
        let mut tokens = Vec::new();
        // Each token taken: streamed, and the reason to stop after it, if any.
        let mut accept =
            |next: u32, history: &mut Vec<u32>| -> Result<Option<StopReason>, InferenceError> {
                tokens.push(next);
                history.push(next);
                if opts.eog_ids.contains(&next) {
                    return Ok(Some(StopReason::Eog));
                }
                if let Some(piece) = streamer.push(next)? {
                    if out.push(&piece, &mut on_text) {
                        return Ok(Some(StopReason::StopString));
                    }
                }
                if tokens.len() >= opts.max_tokens {
                    return Ok(Some(StopReason::MaxTokens));
                }
                if interrupt.load(Ordering::Relaxed) {
                    return Ok(Some(StopReason::Interrupted));
                }
                Ok(None)
            };
        let greedy = sampler.is_greedy();
        let stop = if interrupt.load(Ordering::Relaxed) {
            StopReason::Interrupted
        } else if opts.max_tokens == 0 {
            StopReason::MaxTokens
        } else if greedy {
            // Each step's token is chosen where the logits are and, on a device, the next step
            // is launched before the host reads it (`Model::decode_greedy`).
            if logits.iter().any(|v| !v.is_finite()) {
                return Err(InferenceError::NonFiniteLogits);
            }
            let first = sampler.sample(&logits, &history);
            let mut stop = accept(first, &mut history)?;
            if stop.is_none() {
                let budget = opts.max_tokens.saturating_sub(1);
                model.decode_greedy(backend, first, cache, budget, |t| {
                    stop = accept(t, &mut history)?;
                    Ok(stop.is_none())
                })?;
            }
            match stop {
                Some(reason) => reason,
                None if cache.check_room(1).is_err() => StopReason::ContextFull,
                None => StopReason::MaxTokens,
            }
        } else {
            // Sampling: the logits of each step come back to the host.
            loop {
                if logits.iter().any(|v| !v.is_finite()) {
                    return Err(InferenceError::NonFiniteLogits);
                }
                let next = sampler.sample(&logits, &history);
                if let Some(reason) = accept(next, &mut history)? {
                    break reason;
                }
                if cache.check_room(1).is_err() {
                    break StopReason::ContextFull;
                }
                // Reuses the logits buffer: no allocation per decoded token in this crate.
                model.forward_into(backend, &[next], cache, Logits::Last, &mut logits)?;
            }
        };
        if stop != StopReason::StopString {
            out.flush(&mut on_text);
        }
        Ok(GenerationStats {
            prompt_tokens: prompt.len(),
            generated_tokens: tokens.len(),
            prefill_time,
            decode_time: t1.elapsed(),
            stop,
            tokens,
        })
    }
}

/// Holds back the tail of streamed text that could still become a stop string, and cuts the
/// text at the first stop string (used by [`Generator::generate`] and `infer serve`).
pub struct StopFilter<'s> {
    stops: &'s [String],
    pending: String,
}

impl<'s> StopFilter<'s> {
    /// A filter for `stops` (empty strings never match).
    pub fn new(stops: &'s [String]) -> Self {
        StopFilter {
            stops,
            pending: String::new(),
        }
    }

    /// Append text; emit what can no longer be part of a stop string. True when a stop string
    /// appeared (the text before it is emitted, the rest dropped).
    pub fn push(&mut self, piece: &str, emit: &mut impl FnMut(&str)) -> bool {
        self.pending.push_str(piece);
        // A stop longer than the held text cannot occur in it; skipping it also keeps the
        // search (whose set-up costs the stop's length) from running per token on huge stops.
        if let Some(pos) = self
            .stops
            .iter()
            .filter(|s| !s.is_empty() && s.len() <= self.pending.len())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            emit(&self.pending[..pos]);
            self.pending.clear();
            return true;
        }
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.pending, s))
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        if cut > 0 {
            emit(&self.pending[..cut]);
            self.pending.drain(..cut);
        }
        false
    }

    /// Emit the held-back text (generation ended without a stop string).
    pub fn flush(&mut self, emit: &mut impl FnMut(&str)) {
        if !self.pending.is_empty() {
            emit(&self.pending);
            self.pending.clear();
        }
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop` (char-boundary safe).
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop.is_char_boundary(n)
                && text.ends_with(&stop[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_filter_holds_back_partial_stop_and_cuts_at_stop() {
        let stops = vec!["\nUser:".to_string()];
        let mut f = StopFilter::new(&stops);
        let mut out = String::new();
        assert!(!f.push("Hello\nUs", &mut |s| out.push_str(s)));
        assert_eq!(out, "Hello");
        assert!(f.push("er: hi", &mut |s| out.push_str(s)));
        assert_eq!(out, "Hello");
    }

    /// Stops far longer than the text (a server request's megabytes of them) hold back the
    /// text's end that starts one and never match; a short stop among them still cuts.
    #[test]
    fn stop_filter_with_huge_stops() {
        let mut stops: Vec<String> = (0..4).map(|i| format!("x{i}").repeat(1_000_000)).collect();
        for k in 0..50 {
            let mut out = String::new();
            let stopped =
                StopFilter::new(&stops).push(&format!("token {k} x0x"), &mut |s| out.push_str(s));
            assert!(!stopped);
            assert_eq!(out, format!("token {k} "));
        }
        stops.push("n 7".to_string());
        let mut out = String::new();
        assert!(StopFilter::new(&stops).push("token 7 x0", &mut |s| out.push_str(s)));
        assert_eq!(out, "toke");
    }
}
