//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty; seeded.
//!
//! Order of operations follows llama.cpp's default sampler chain: repetition penalty → top-k →
//! top-p → min-p → temperature → draw. Temperature 0 means greedy (argmax, ties → smaller id).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Sampling settings (CLI `--temp`, `--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`, `--seed`).
#[derive(Clone, Debug)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = disabled.
    pub top_k: usize,
    /// 1.0 = disabled.
    pub top_p: f32,
    /// 0.0 = disabled.
    pub min_p: f32,
    /// 1.0 = disabled; > 1 penalises tokens seen in the last `repeat_last_n` tokens (CTRL-style:
    /// positive logits divided, negative multiplied).
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// A seeded sampler: the same seed, params and logits give the same tokens.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

/// Index of the largest value; ties go to the smaller index.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Sampler { params, rng }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when [`Sampler::sample`] is a plain argmax of the logits (temperature 0, no
    /// repetition penalty), so the choice can be made where the logits are
    /// ([`crate::Model::decode_greedy`]).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0 && self.params.repeat_penalty == 1.0
    }

    /// Pick the next token from `logits` (`[vocab]`), given the tokens so far (`history`).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let mut logits = logits.to_vec();
        if p.repeat_penalty != 1.0 {
            let from = history.len().saturating_sub(p.repeat_last_n);
            let mut seen: Vec<u32> = history[from..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(v) = logits.get_mut(id as usize) {
                    *v = if *v > 0.0 {
                        *v / p.repeat_penalty
                    } else {
                        *v * p.repeat_penalty
                    };
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(&logits);
        }
        // Candidates sorted by logit, descending (ties: smaller id first).
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            // Only the top k need sorting (the order is total, so the result is the same).
            cand.select_nth_unstable_by(p.top_k - 1, order);
            cand.truncate(p.top_k);
        }
        cand.sort_by(order);
        let probs = softmax(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let cut = probs[0] * p.min_p;
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= cut).count().max(1));
        }
        cand.truncate(keep.max(1));
        // Differences from the largest logit (cand[0]), so a tiny temperature gives large
        // negative values (→ probability 0), not an overflow to infinity.
        let top = cand[0].1;
        let scaled: Vec<f32> = cand.iter().map(|c| (c.1 - top) / p.temperature).collect();
        let probs = softmax(&scaled);
        let r: f32 = self.rng.gen();
        let mut cum = 0.0;
        for (c, pr) in cand.iter().zip(&probs) {
            cum += pr;
            if r < cum {
                return c.0;
            }
        }
        cand[cand.len() - 1].0
    }
}

fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_with_ties_to_smaller_id() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 17) as f32 * 0.3).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.iter().collect::<std::collections::HashSet<_>>().len() > 1,
            "temperature sampling should vary"
        );
        let mut s = Sampler::new(SamplingParams { top_k: 1, ..p });
        assert_eq!(s.sample(&logits, &[]), argmax(&logits));
    }

    #[test]
    fn tiny_temperature_is_near_greedy_not_garbage() {
        // 3.0 / 1e-40 overflows f32: the draw must still pick the largest logit.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1e-40,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&[1.0, 3.0, 2.0, -4.0], &[]), 1);
        }
    }

    #[test]
    fn top_k_keeps_the_k_largest_with_ties_to_smaller_ids() {
        // Logits 0, 1, 1, 0, 1 …: with k = 3 only ids 1, 2, 4 may come out.
        let logits: Vec<f32> = (0..50)
            .map(|i| if i % 3 == 0 { 0.0 } else { 1.0 })
            .collect();
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        });
        let seen: std::collections::HashSet<u32> =
            (0..200).map(|_| s.sample(&logits, &[])).collect();
        assert_eq!(seen, [1, 2, 4].into_iter().collect());
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[2.0, 1.5], &[0]), 1);
    }
}
