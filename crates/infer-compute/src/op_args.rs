//! Arguments of the whole operations of [`crate::ComputeBackend`] (norms, attention, embedding
//! lookup): one struct per operation instead of long positional lists.

use half::f16;

/// Which normalisation a [`Norm`] computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormKind {
    /// RMSNorm `x · rsqrt(mean(x²) + eps) · (w + offset)` (HF `LlamaRMSNorm`, offset 0;
    /// `GemmaRMSNorm`, offset 1); see [`crate::ops::rms_norm`].
    Rms { offset: f32 },
    /// LayerNorm `(x − mean) / sqrt(var + eps) · w + b` (`torch.nn.functional.layer_norm`);
    /// see [`crate::ops::layer_norm`].
    Layer,
}

/// A norm over rows of `weight.len()` values, f32.
#[derive(Clone, Copy, Debug)]
pub struct Norm<'a> {
    pub kind: NormKind,
    /// `[width]`.
    pub weight: &'a [f32],
    /// `[width]` LayerNorm bias; `None`: no bias (always `None` for RMSNorm).
    pub bias: Option<&'a [f32]>,
    pub eps: f32,
}

/// The tensors of one sequence's attention step ([`crate::ComputeBackend::attention`]).
#[derive(Clone, Copy, Debug)]
pub struct AttentionInput<'a, T = f32> {
    /// `[t_q, n_q_heads · head_dim]` f32, RoPE applied.
    pub q: &'a [f32],
    /// At least `t_kv` rows of `[n_kv_heads · head_dim]` f32 or f16 ([`crate::KvElem`]); row
    /// `j` holds position `j`.
    pub k_cache: &'a [T],
    pub v_cache: &'a [T],
    /// Absolute position of each query row (`t_q` values, each `< t_kv`).
    pub positions: &'a [usize],
    /// Cached positions the queries may see (the sequence's length after this step).
    pub t_kv: usize,
}

/// A table `[rows, cols]` (token embeddings) as stored: f32, f16, or ggml blocks of `format`
/// (each row `cols / format.block_elems()` whole blocks, e.g. a GGUF's own `token_embd`
/// blocks), looked up row by row (a quantized row is dequantized on lookup).
#[derive(Clone, Copy, Debug)]
pub enum FloatTable<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Blocks {
        format: crate::QuantFormat,
        bytes: &'a [u8],
    },
}

impl FloatTable<'_> {
    /// Number of values (for blocks: whole blocks × values per block).
    pub fn len(&self) -> usize {
        match self {
            FloatTable::F32(v) => v.len(),
            FloatTable::F16(v) => v.len(),
            FloatTable::Blocks { format, bytes } => {
                bytes.len() / format.block_bytes().max(1) * format.block_elems()
            }
        }
    }

    /// True when the table holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The greedy choice of an argmax over logits ([`crate::ComputeBackend::argmax`],
/// [`crate::ComputeBackend::argmax_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Argmax {
    /// Id of the largest finite logit (ties → the smaller id).
    pub token: u32,
    /// False when some logit is NaN or ±infinite (those take no part in the choice).
    pub all_finite: bool,
}

/// The greedy choices of one step on their way to the host: made by
/// [`crate::ComputeBackend::argmax_rows_later`] (which does not wait for the device), read by
/// [`crate::ComputeBackend::take_chosen`] (which does), and looked up before that by
/// [`crate::ComputeBackend::embed_chosen`] as the next step's token ids, where they were made.
/// So a device can run step `i + 1` while the host has not yet read step `i`'s choice.
#[derive(Clone, Debug, Default)]
pub struct Chosen {
    /// Rows chosen: one per row of the logits.
    pub rows: usize,
    /// The choices when they were made on the host (a host backend); `None` while a device
    /// holds them.
    pub host: Option<Vec<Argmax>>,
    /// A device backend's number of the copy in flight (0 for choices made on the host).
    pub ticket: u64,
}

/// One sequence's KV cache slot in an [`Attend`] batch.
#[derive(Debug)]
pub struct KvSlot<'a> {
    /// `[capacity, n_kv_heads · head_dim]` keys; row `j` holds position `j`.
    pub k_cache: &'a mut crate::Tensor,
    /// Values, as `k_cache`.
    pub v_cache: &'a mut crate::Tensor,
    /// First row of this sequence in the batch's `q`, `k`, `v` and output.
    pub row0: usize,
    /// Its number of rows (new tokens).
    pub rows: usize,
    /// Cache position of its first new row (the sequence's length before the step); its rows
    /// are at positions `start..start + rows`.
    pub start: usize,
}

/// The tensors of one layer's batched attention step ([`crate::ComputeBackend::attend`]).
#[derive(Debug)]
pub struct Attend<'a, 's> {
    /// `[R, n_q_heads · head_dim]`, RoPE applied.
    pub q: &'a crate::Tensor,
    /// `[R, n_kv_heads · head_dim]` new keys (RoPE applied) and values of every row.
    pub k: &'a crate::Tensor,
    pub v: &'a crate::Tensor,
    /// The sequences, their rows in batch order.
    pub seqs: &'a mut [KvSlot<'s>],
}

/// The residual step of a pre-norm block fused with the norm that follows it
/// ([`crate::ComputeBackend::add_norm`]): `x += alpha · post(branch)`, then `out = next(x)`.
#[derive(Clone, Copy, Debug)]
pub struct ResidualNorm<'a> {
    /// The branch's own norm before the residual add (Gemma-2/3's post-attention and post-FFN
    /// norms); `None`: the branch is added as it is.
    pub post: Option<Norm<'a>>,
    /// Residual multiplier (1 for most models, Granite's `residual_multiplier`).
    pub alpha: f32,
    /// The norm of the updated stream: the next sub-block's input norm (pre-FFN, the next
    /// layer's pre-attention norm, or the final norm).
    pub next: Norm<'a>,
}

/// One layer's attention step with the q/k preparation fused in
/// ([`crate::ComputeBackend::rope_attend`]): per-head RMSNorm of the new query and key rows
/// (Qwen3, Gemma-3, OLMo-2's whole projection), RoPE at each row's position, then the KV store
/// and attention of [`Attend`]. `q` and `k` hold unspecified values afterwards (a backend
/// may normalise and rotate them in place, or not at all when it fuses the steps).
#[derive(Debug)]
pub struct RopeAttend<'a, 's> {
    /// `[R, n_q_heads · head_dim]` query rows as projected (before norm and RoPE).
    pub q: &'a mut crate::Tensor,
    /// `[R, n_kv_heads · head_dim]` key rows as projected.
    pub k: &'a mut crate::Tensor,
    /// `[R, n_kv_heads · head_dim]` value rows.
    pub v: &'a crate::Tensor,
    /// The query norm; its width is the row width it normalises (`head_dim` per head, or the
    /// whole projection for OLMo-2). `None`: no query norm.
    pub q_norm: Option<Norm<'a>>,
    /// The key norm, as `q_norm`.
    pub k_norm: Option<Norm<'a>>,
    /// RoPE of this layer; `None`: no positional rotation (e.g. Cohere-2's global layers).
    pub rope: Option<&'a crate::RopeConfig>,
    /// Absolute position of every row (`R` values), for RoPE; equal to each slot's
    /// `start..start + rows`.
    pub positions: &'a [usize],
    /// The sequences, their rows in batch order.
    pub seqs: &'a mut [KvSlot<'s>],
}
