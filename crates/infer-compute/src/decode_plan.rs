//! Whole-token decode on a device (the seed's `decode_token` / `full_pipeline_q4`): a
//! [`DecodePlan`] describes every block of a model in compute terms (norm weights, quantized
//! matrices with their format tags, per-layer geometry), and a backend that can keep the whole
//! step resident returns a [`TokenDecoder`] for it through
//! [`crate::ComputeBackend::token_decoder`].
//!
//! The plan covers the pre-norm decoder block shared by the Llama and Gemma families
//! (`x += [post_attn_norm](attn(pre_attn_norm(x)))`, `x += [post_ffn_norm](ffn(pre_ffn_norm(x)))`)
//! with RMSNorm, optional per-head q/k RMSNorm, RoPE, GQA, sliding window, attention soft-cap,
//! a gated or plain FFN, and a final RMSNorm and lm_head with optional logit divisor and
//! soft-cap, and Linear biases on the projections (Qwen2's QKV). A model with anything else
//! (LayerNorm, norm biases, parallel residual, MoE or walk FFN, learned positions) is not
//! expressed as a plan and runs the host loop.

use crate::ops::Activation;
use crate::{Argmax, AttentionParams, ComputeError, FloatTable, MatData, RopeConfig};

/// The `[out_features]` f32 Linear biases of a block's projections (`None`: no bias), added to
/// the product's output (`y = W x + b`, before q/k norm and RoPE for q and k).
#[derive(Clone, Copy, Debug, Default)]
pub struct PlanBiases<'a> {
    pub q: Option<&'a [f32]>,
    pub k: Option<&'a [f32]>,
    pub v: Option<&'a [f32]>,
    pub o: Option<&'a [f32]>,
    pub gate: Option<&'a [f32]>,
    pub up: Option<&'a [f32]>,
    pub down: Option<&'a [f32]>,
}

/// One decoder block. Norm weights are `[hidden]` f32 (q/k norms `[head_dim]`, applied per
/// head); every norm computes `x · rsqrt(mean(x²) + eps) · (w + norm_offset)`.
#[derive(Clone, Debug)]
pub struct PlanLayer<'a> {
    pub pre_attn_norm: &'a [f32],
    pub post_attn_norm: Option<&'a [f32]>,
    pub pre_ffn_norm: &'a [f32],
    pub post_ffn_norm: Option<&'a [f32]>,
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    /// `[n_q_heads · head_dim, hidden]`.
    pub wq: MatData<'a>,
    /// `[n_kv_heads · head_dim, hidden]`.
    pub wk: MatData<'a>,
    pub wv: MatData<'a>,
    /// `[hidden, n_q_heads · head_dim]`.
    pub wo: MatData<'a>,
    /// `[intermediate, hidden]`; `None` for a plain `down(act(up(x)))` FFN.
    pub gate: Option<MatData<'a>>,
    /// `[intermediate, hidden]`.
    pub up: MatData<'a>,
    /// `[hidden, intermediate]`.
    pub down: MatData<'a>,
    /// The projections' Linear biases (all `None` for most families).
    pub biases: PlanBiases<'a>,
    pub intermediate_size: usize,
    /// Heads, head_dim, scale, sliding window, soft-cap.
    pub attention: AttentionParams<'a>,
    /// `None`: no rotary embedding in this layer.
    pub rope: Option<RopeConfig>,
    pub activation: Activation,
    pub eps: f32,
    pub norm_offset: f32,
    /// Multiplier of both residual branches (Granite's `residual_multiplier`, else 1).
    pub residual_multiplier: f32,
}

/// A whole model for [`crate::ComputeBackend::token_decoder`].
#[derive(Clone, Debug)]
pub struct DecodePlan<'a> {
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// Token embeddings `[vocab, hidden]`, multiplied by `embedding_scale` when read.
    pub embeddings: FloatTable<'a>,
    pub embedding_scale: f32,
    pub layers: Vec<PlanLayer<'a>>,
    /// `[hidden]`, with the layers' `eps` and `norm_offset` convention (`final_eps`,
    /// `final_norm_offset`).
    pub final_norm: &'a [f32],
    pub final_eps: f32,
    pub final_norm_offset: f32,
    /// `[vocab, hidden]`; `None`: tied to the embeddings.
    pub lm_head: Option<MatData<'a>>,
    /// Logits are divided by this (1 for most models).
    pub logits_divisor: f32,
    /// Final logit soft-cap `cap · tanh(z / cap)` (Gemma-2).
    pub final_softcap: Option<f32>,
    /// Positions the device KV cache holds (the context size).
    pub context: usize,
}

/// A model resident on a device, decoding one token per [`TokenDecoder::step`] with its own
/// KV cache (`[context, n_kv_heads · head_dim]` f32 per layer for K and for V). Positions are
/// absolute; the caller keeps its host cache and this one consistent with
/// [`TokenDecoder::write_kv`] / [`TokenDecoder::read_kv`].
pub trait TokenDecoder {
    /// Copy K and V rows of `layer` for positions `start .. start + k.len() / kv_dim` from the
    /// host into the device cache. Errors: rows past the context, lengths that are not whole
    /// rows or differ, a device failure.
    fn write_kv(
        &mut self,
        layer: usize,
        start: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), ComputeError>;

    /// Copy K and V rows of `layer` for positions `start .. start + k.len() / kv_dim` from the
    /// device cache into `k` and `v`. Errors as [`TokenDecoder::write_kv`].
    fn read_kv(
        &mut self,
        layer: usize,
        start: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), ComputeError>;

    /// Copy K and V rows `start .. start + rows` of `layer` from `k` and `v` (a host-loop
    /// cache's tensors `[context, kv_dim]`, same positions) into the device cache without a
    /// trip through the host, when the tensors live in this decoder's device memory; `Ok(false)`
    /// when they do not (copy through [`TokenDecoder::write_kv`] then). Errors as
    /// [`TokenDecoder::write_kv`], and rows past either cache.
    fn write_kv_from(
        &mut self,
        layer: usize,
        start: usize,
        rows: usize,
        k: &crate::Tensor,
        v: &crate::Tensor,
    ) -> Result<bool, ComputeError> {
        let _ = (layer, start, rows, k, v);
        Ok(false)
    }

    /// The reverse of [`TokenDecoder::write_kv_from`]: device cache rows `start .. start + rows`
    /// of `layer` into the tensors `k` and `v`, when they live in this decoder's device memory.
    fn read_kv_into(
        &mut self,
        layer: usize,
        start: usize,
        rows: usize,
        k: &mut crate::Tensor,
        v: &mut crate::Tensor,
    ) -> Result<bool, ComputeError> {
        let _ = (layer, start, rows, k, v);
        Ok(false)
    }

    /// Run `token` at position `pos` through every layer (its K/V go into the device cache at
    /// `pos`; positions `0..pos` must be there already) and write the logits `[vocab]` f32
    /// into `logits`. Errors: `pos` outside the context, a token id outside the vocabulary,
    /// `logits` of the wrong length, a device failure.
    fn step(&mut self, token: u32, pos: usize, logits: &mut [f32]) -> Result<(), ComputeError>;

    /// Run one step like [`TokenDecoder::step`] and choose the greedy next token where the
    /// logits are: the id of the largest logit, ties to the smaller id (a host argmax that
    /// skips nothing), without copying the `[vocab]` logits back. `Ok(None)` when this decoder
    /// does not offer it (the default): call [`TokenDecoder::step`] instead. Errors as
    /// [`TokenDecoder::step`].
    fn step_argmax(&mut self, token: u32, pos: usize) -> Result<Option<Argmax>, ComputeError> {
        let _ = (token, pos);
        Ok(None)
    }

    /// Run one step like [`TokenDecoder::step`] (writing K/V at `pos`, no logits returned)
    /// kernel by kernel with a timing event after each, and return per kernel kind: (name,
    /// launches, device µs), in first-launch order. The default: no breakdown (empty).
    /// Errors as [`TokenDecoder::step`].
    fn profile_step(
        &mut self,
        token: u32,
        pos: usize,
    ) -> Result<Vec<(String, usize, f64)>, ComputeError> {
        let _ = (token, pos);
        Ok(Vec::new())
    }
}
