//! Reusable buffers of the forward pass, so that a decode step allocates nothing of its own once
//! the buffers have grown to the largest batch seen (issue 6: "no allocation per token").

/// Activation buffers of one forward pass (all f32, row-major `[T, width]`), kept in the
/// [`crate::KvCache`] between calls. Each is resized to the current batch with [`fit`], which
/// only allocates when a batch is larger than any before it.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Token id of each row of the batch `[R]` (every sequence's tokens, in batch order).
    pub(crate) tokens: Vec<u32>,
    /// Absolute position of each row `[R]`.
    pub(crate) positions: Vec<usize>,
    /// Where each sequence's rows are.
    pub(crate) spans: Vec<crate::forward::Span>,
    /// Residual stream `[T, hidden]`.
    pub(crate) x: Vec<f32>,
    /// Pre-attention norm output `[T, hidden]`.
    pub(crate) normed: Vec<f32>,
    /// q `[T, q_dim]`, k and v `[T, kv_dim]`.
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    /// Attention output before (`attn`, `[T, q_dim]`) and after (`attn_out`, `[T, hidden]`) the
    /// output projection.
    pub(crate) attn: Vec<f32>,
    pub(crate) attn_out: Vec<f32>,
    /// FFN input and output `[T, hidden]`.
    pub(crate) ffn_in: Vec<f32>,
    pub(crate) ffn_out: Vec<f32>,
    /// The FFN's own buffers.
    pub(crate) ffn: FfnScratch,
    /// Post-norm target, swapped with the buffer it normalises `[T, hidden]`.
    pub(crate) tmp: Vec<f32>,
}

/// Buffers inside an FFN: gate/up `[T, intermediate]`, and the sparse walk FFN's feature
/// indices per token `[T, intermediate]` (`--walk-k`).
#[derive(Debug, Default)]
pub(crate) struct FfnScratch {
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) walk_idx: Vec<u32>,
}

/// Resize `buf` to `n` zeros and return it; allocates only when `n` exceeds its capacity.
pub(crate) fn fit(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    buf.clear();
    buf.resize(n, 0.0);
    buf
}
