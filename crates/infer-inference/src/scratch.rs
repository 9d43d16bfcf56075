//! Reusable buffers of the forward pass, so that a decode step allocates nothing of its own once
//! the buffers have grown to the largest batch seen (issue 6: "no allocation per token").

use infer_compute::Tensor;

/// Activation buffers of one forward pass (all f32, row-major `[T, width]`, [`Tensor`]s in
/// the backend's memory), kept in the [`crate::KvCache`] or [`crate::BatchBuffers`] between
/// calls. Each is resized to the current batch by the operation that writes it
/// ([`infer_compute::ComputeBackend::fit`]), which only allocates when a batch is larger than
/// any before it.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Token id of each row of the batch `[R]` (every sequence's tokens, in batch order).
    pub(crate) tokens: Vec<u32>,
    /// Absolute position of each row `[R]`.
    pub(crate) positions: Vec<usize>,
    /// Rows whose logits are asked for; position ids of learned position embeddings.
    pub(crate) picked: Vec<usize>,
    pub(crate) ids: Vec<u32>,
    /// Where each sequence's rows are.
    pub(crate) spans: Vec<crate::forward::Span>,
    /// Residual stream `[T, hidden]`.
    pub(crate) x: Tensor,
    /// Pre-attention norm output `[T, hidden]`.
    pub(crate) normed: Tensor,
    /// q `[T, q_dim]`, k and v `[T, kv_dim]`.
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    /// Attention output before (`attn`, `[T, q_dim]`) and after (`attn_out`, `[T, hidden]`) the
    /// output projection.
    pub(crate) attn: Tensor,
    pub(crate) attn_out: Tensor,
    /// FFN input and output `[T, hidden]`.
    pub(crate) ffn_in: Tensor,
    pub(crate) ffn_out: Tensor,
    /// The rows whose logits are asked for, gathered `[L, hidden]`, and their logits
    /// `[L, vocab]`.
    pub(crate) last: Tensor,
    pub(crate) logits: Tensor,
    /// The FFN's own buffers.
    pub(crate) ffn: FfnScratch,
    /// Post-norm target, swapped with the buffer it normalises `[T, hidden]`.
    pub(crate) tmp: Tensor,
}

/// Buffers inside an FFN: gate/up `[T, intermediate]` of the dense FFN (tensors), and the
/// walk FFN's host buffers (gate/up scores and the sparse walk's feature indices per token
/// `[T, intermediate]`, `--walk-k`).
#[derive(Debug, Default)]
pub(crate) struct FfnScratch {
    pub(crate) gate: Tensor,
    pub(crate) up: Tensor,
    /// An MoE step's router logits, then the experts' output rows (a decode step's slots, a
    /// prompt chunk's rows sorted by expert, or one expert's rows when experts have biases).
    pub(crate) moe_out: Tensor,
    /// A prompt chunk's rows gathered for its experts (sorted by expert, or one expert's).
    pub(crate) moe_in: Tensor,
    /// The expert choice `[rows, 2·k]` where the backend keeps it (`moe_route`).
    pub(crate) moe_sel: Tensor,
    /// The shared expert's gate logits, one per row (Qwen2-MoE's `shared_expert_gate`).
    pub(crate) shared_gate: Tensor,
    pub(crate) walk: crate::walk::WalkBuffers,
    /// Host copies of the input and output of the FFNs that run on the host (walk FFN, MoE)
    /// when the backend keeps activations on a device.
    pub(crate) host_in: Vec<f32>,
    pub(crate) host_out: Vec<f32>,
}

/// Resize `buf` to `n` zeros and return it; allocates only when `n` exceeds its capacity.
pub(crate) fn fit(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    buf.clear();
    buf.resize(n, 0.0);
    buf
}
