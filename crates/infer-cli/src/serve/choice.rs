//! One choice of a request while it generates (engine side): its sampler with the OpenAI
//! penalties and biases, its log-probabilities, and its text — released only in whole UTF-8
//! characters and never while it could still be the start of a stop string.

use std::collections::HashMap;

use infer_inference::sampling::argmax;
use infer_inference::{Sampler, StopFilter, TextStreamer, Tokenizer};

use super::params::SamplingSpec;

/// The log-probability of one token (natural log, of the model's softmax over the raw
/// logits, before penalties and temperature — as vLLM reports them).
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    /// The token's text (its bytes lossily decoded when not UTF-8 on its own).
    pub token: String,
    /// The token's bytes in the output text.
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// The chosen token's [`TokenLogprob`] and the `k` most likely alternatives.
#[derive(Clone, Debug)]
pub struct LogprobEntry {
    pub chosen: TokenLogprob,
    pub top: Vec<TokenLogprob>,
}

/// Samples the tokens of one choice.
pub struct ChoiceSampler {
    spec: SamplingSpec,
    sampler: Sampler,
    /// How often each token occurs in the generated text (presence/frequency penalties).
    counts: HashMap<u32, u32>,
    adjusted: Vec<f32>,
    greedy: bool,
}

impl ChoiceSampler {
    /// The sampler of choice `index` (seeded with the request's seed + `index`).
    pub fn new(spec: &SamplingSpec, index: usize) -> Self {
        let mut params = spec.params.clone();
        params.seed = params.seed.wrapping_add(index as u64);
        ChoiceSampler {
            greedy: spec.is_greedy(),
            spec: spec.clone(),
            sampler: Sampler::new(params),
            counts: HashMap::new(),
            adjusted: Vec::new(),
        }
    }

    /// The next token from `logits` (`[vocab]`), given prompt + generated ids (`history`, for
    /// the repetition penalty). Order: logit bias, presence/frequency penalties, then the
    /// shared sampler chain (repetition penalty, top-k, top-p, min-p, temperature).
    pub fn pick(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let tok = if self.greedy {
            argmax(logits)
        } else {
            self.adjusted.clear();
            self.adjusted.extend_from_slice(logits);
            for &(id, b) in &self.spec.logit_bias {
                self.adjusted[id as usize] += b;
            }
            for (&id, &c) in &self.counts {
                self.adjusted[id as usize] -=
                    self.spec.presence_penalty + self.spec.frequency_penalty * c as f32;
            }
            self.sampler.sample(&self.adjusted, history)
        };
        *self.counts.entry(tok).or_default() += 1;
        tok
    }

    /// True when [`ChoiceSampler::pick`] is the argmax of the raw logits (temperature 0, no
    /// penalties or biases), so the engine may let the backend choose where the logits are.
    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    /// Record `tok`, chosen outside [`ChoiceSampler::pick`] (the backend's greedy choice), as
    /// `pick` records its own; returns it.
    pub fn chose(&mut self, tok: u32) -> u32 {
        *self.counts.entry(tok).or_default() += 1;
        tok
    }
}

/// Log-probabilities of `chosen` and the `k` most likely tokens of `logits`.
pub fn logprobs(tok: &Tokenizer, logits: &[f32], chosen: u32, k: usize) -> LogprobEntry {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    let entry = |id: u32| {
        let bytes = tok.decode(&[id], false).unwrap_or_default().into_bytes();
        TokenLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob: logits[id as usize] - lse,
        }
    };
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k > 0 && k < order.len() {
        order.select_nth_unstable_by(k - 1, cmp);
    }
    order.truncate(k);
    order.sort_by(cmp);
    LogprobEntry {
        chosen: entry(chosen),
        top: order.into_iter().map(entry).collect(),
    }
}

/// The text of one choice: token ids in, text pieces out.
pub struct ChoiceText<'t> {
    streamer: TextStreamer<'t>,
    stops: Vec<String>,
    /// Text the stop filter holds back (it could be the start of a stop string).
    pending: String,
}

impl<'t> ChoiceText<'t> {
    pub fn new(tok: &'t Tokenizer, stops: &[String]) -> Self {
        ChoiceText {
            streamer: TextStreamer::new(tok),
            stops: stops.to_vec(),
            pending: String::new(),
        }
    }

    /// Add a generated id; returns the text that can be released now and whether a stop
    /// string was matched (the text is then cut before it). Errors: detokenization.
    pub fn push(&mut self, id: u32) -> Result<(String, bool), infer_inference::InferenceError> {
        let Some(piece) = self.streamer.push(id)? else {
            return Ok((String::new(), false));
        };
        let text = std::mem::take(&mut self.pending) + &piece;
        let mut out = String::new();
        let stopped = StopFilter::new(&self.stops).push(&text, &mut |s| out.push_str(s));
        if !stopped {
            // What the filter did not emit is what it holds back.
            self.pending = text[out.len()..].to_string();
        }
        Ok((out, stopped))
    }

    /// The held-back text, at the end of generation without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_and_bias_change_the_choice() {
        let mut spec = SamplingSpec {
            params: infer_inference::SamplingParams::default(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: vec![(0, -100.0)],
        };
        let logits = [3.0, 2.0, 1.0];
        assert_eq!(ChoiceSampler::new(&spec, 0).pick(&logits, &[]), 1);
        spec.logit_bias.clear();
        spec.presence_penalty = 2.0;
        let mut s = ChoiceSampler::new(&spec, 0);
        assert_eq!(s.pick(&logits, &[]), 0);
        // 3 − 2 < 2.0: the seen token loses to the next.
        assert_eq!(s.pick(&logits, &[0]), 1);
    }
}
