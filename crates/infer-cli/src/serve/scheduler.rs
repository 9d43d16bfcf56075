//! Continuous batching decisions, free of I/O: which tokens each sequence runs in the next
//! step (one decode token per generating sequence, then prompt chunks of the prefilling ones
//! up to a token budget — chunked prefill), and which KV slot a new sequence takes (the free
//! one sharing the longest prefix with its prompt: the prefix cache).

use std::ops::Range;

/// Where a sequence stands, as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Its prompt positions `fed..len` are still to run.
    Prefill { fed: usize, len: usize },
    /// It has a sampled token to feed.
    Decode,
}

/// What one sequence runs in a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Prompt positions (a chunk of the prompt).
    Prompt(Range<usize>),
    /// Its pending sampled token.
    Token,
}

/// Plan a step: every decoding sequence gets its token (they are never stalled), then the
/// prefilling sequences, oldest first, get prompt chunks until `budget` tokens are planned.
/// At least one prompt token is planned when nothing decodes, so a step always progresses.
/// Returns (sequence index, work) pairs, decode tokens first.
pub fn plan_step(phases: &[Phase], budget: usize) -> Vec<(usize, Work)> {
    let mut plan: Vec<(usize, Work)> = phases
        .iter()
        .enumerate()
        .filter(|(_, p)| **p == Phase::Decode)
        .map(|(i, _)| (i, Work::Token))
        .collect();
    let mut left = budget
        .saturating_sub(plan.len())
        .max(usize::from(plan.is_empty()));
    for (i, p) in phases.iter().enumerate() {
        if left == 0 {
            break;
        }
        if let Phase::Prefill { fed, len } = *p {
            let take = (len - fed).min(left);
            if take > 0 {
                plan.push((i, Work::Prompt(fed..fed + take)));
                left -= take;
            }
        }
    }
    plan
}

/// Length of the common prefix of two id lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The free slot (`held[i]` = the ids whose K/V slot `i` holds; `None` = busy) to run
/// `prompt` in, and how many of its positions can be kept: the longest shared prefix, less
/// one when it covers the whole prompt (the last prompt token must run to give logits).
/// Ties go to the slot holding the least (so long cached prefixes survive longer). `None` when
/// every slot is busy.
pub fn pick_slot(held: &[Option<&[u32]>], prompt: &[u32]) -> Option<(usize, usize)> {
    held.iter()
        .enumerate()
        .filter_map(|(i, h)| h.map(|h| (i, h)))
        .map(|(i, h)| {
            let keep = common_prefix(h, prompt).min(prompt.len().saturating_sub(1));
            (i, keep, h.len())
        })
        .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)).then(b.0.cmp(&a.0)))
        .map(|(i, keep, _)| (i, keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_first_then_chunks_within_the_budget() {
        let phases = [
            Phase::Prefill { fed: 0, len: 100 },
            Phase::Decode,
            Phase::Prefill { fed: 10, len: 20 },
            Phase::Decode,
        ];
        let plan = plan_step(&phases, 40);
        assert_eq!(
            plan,
            vec![(1, Work::Token), (3, Work::Token), (0, Work::Prompt(0..38)),]
        );
        let plan = plan_step(&phases, 200);
        assert_eq!(
            plan[2..],
            [(0, Work::Prompt(0..100)), (2, Work::Prompt(10..20))]
        );
        // More decoders than budget: all decode, no prefill.
        assert_eq!(plan_step(&phases, 1).len(), 2);
        // Nothing decodes and budget 0: one prompt token still runs.
        assert_eq!(
            plan_step(&[Phase::Prefill { fed: 0, len: 5 }], 0),
            vec![(0, Work::Prompt(0..1))]
        );
    }

    #[test]
    fn slot_with_the_longest_prefix_is_picked() {
        let a: &[u32] = &[1, 2, 3, 4];
        let b: &[u32] = &[1, 2, 9];
        let empty: &[u32] = &[];
        assert_eq!(
            pick_slot(&[Some(b), Some(a), None], &[1, 2, 3, 7]),
            Some((1, 3))
        );
        // The whole prompt cached: its last token still runs.
        assert_eq!(pick_slot(&[Some(a)], &[1, 2, 3, 4]), Some((0, 3)));
        // No shared prefix: the emptiest slot.
        assert_eq!(pick_slot(&[Some(a), Some(empty)], &[5]), Some((1, 0)));
        assert_eq!(pick_slot(&[None, None], &[5]), None);
    }
}
