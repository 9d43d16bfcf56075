//! The expert choice of a mixture-of-experts router.

/// The experts one token's router logits choose, with their weights: `probs` (`[num_experts]`)
/// becomes `softmax(logits + bias)` in place ([`super::softmax_inplace`]), then the `k` most
/// probable experts (ties to the lower index), highest first, each weighted by its
/// probability — renormalised over the chosen when `norm` (`norm_topk_prob`, which equals
/// gpt-oss's softmax over the top-k logits). HF `MixtralSparseMoeBlock`,
/// `Qwen2MoeSparseMoeBlock`, `GptOssTopKRouter`. `k` above `num_experts` takes them all; a
/// bias of another length is ignored past the shorter of the two.
pub fn moe_route(
    probs: &mut [f32],
    bias: Option<&[f32]>,
    k: usize,
    norm: bool,
) -> smallvec::SmallVec<[(usize, f32); 8]> {
    if let Some(b) = bias {
        probs.iter_mut().zip(b).for_each(|(p, b)| *p += b);
    }
    super::softmax_inplace(probs);
    let n = probs.len();
    let mut order: smallvec::SmallVec<[usize; 128]> = (0..n).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let chosen = &order[..k.min(n)];
    let sum: f32 = chosen.iter().map(|&e| probs[e]).sum();
    chosen
        .iter()
        .map(|&e| (e, if norm { probs[e] / sum } else { probs[e] }))
        .collect()
}
