//! [`CudaDecoder`]: a [`DecodePlan`] resident on the device (the seed's `decode_token`). Weights
//! come from the backend's weight cache (uploaded once, shared with the host-loop products); the
//! KV cache, activations and logits live in device buffers; one step is the kernels of
//! `decode.cu` plus the quantized mat-vecs of `kernels.cu`, recorded once into a CUDA graph and
//! replayed per token with only `{token, pos}` copied in and the logits (or, for greedy
//! decoding, the chosen token: `dec_argmax`) copied out.
//!
//! Per layer eight launches (`launch.rs`): the fused QKV mat-vecs (`group.rs`), attention (q/k
//! norm, RoPE, KV store, scores, softmax, values, output quantization), the o mat-vec,
//! residual + RMSNorm + activation quantization, the fused gate+up mat-vecs, the activation and
//! its quantization, the down mat-vec, residual + the next layer's norm + quantization. Launches
//! use programmatic dependent launch (`launch.rs` `go`), so each kernel's launch and the
//! mat-vecs' weight loads overlap the kernel before.
//!
//! Fusing the norm and the activation into the mat-vecs' last block (a completion counter per
//! launch) was measured slower on the H200 (SmolLM2 shapes, 770 vs 894 tokens/s with PDL):
//! the fence, the atomic and the serial tail cost more than the launch they save.

mod group;
mod launch;

use std::cell::RefCell;
use std::sync::{Arc, MutexGuard};

use group::{Group, LayerGroups};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
use infer_quant::QuantFormat;

use super::cache::as_bytes;
use super::device::{dev_err, drv, int, Device};
use super::quant::check;
use super::{tensor_ops, CudaBackend, State};
use crate::ops::Activation;
use crate::KvType;
use crate::{
    Argmax, ComputeError, DecodePlan, FloatTable, MatData, PlanLayer, Tensor, TokenDecoder,
};

/// Threads of the one-block kernels; `DEC_THREADS` in decode.cu.
pub(in crate::cuda) const DEC_THREADS: u32 = 256;
/// Threads of `dec_residual_norm` (`RN_THREADS` in decode.cu).
const RN_THREADS: u32 = 1024;
/// Threads of `dec_attention` (`ATT_THREADS` in decode.cu).
const ATT_THREADS: u32 = 512;
/// Shared head buffers of `dec_attention` (`MAX_HD` in decode.cu).
const MAX_HEAD_DIM: usize = 1024;
/// KV caches of more than `ATT_SPLIT_MIN_CONTEXT` positions split each kv head's keys over
/// several `dec_attn_split*` blocks (flash decoding, merged by `dec_attn_merge`): one block per
/// `ATT_SPLIT_KEYS` positions, at most `ATT_MAX_SPLITS`. Shorter caches keep one
/// `dec_attention` block per query head and no merge launch.
const ATT_SPLIT_MIN_CONTEXT: usize = 512;
const ATT_SPLIT_KEYS: usize = 128;
const ATT_MAX_SPLITS: usize = 64;
/// Threads of a `dec_attn_split*` block (`SPLIT_WARPS` warps in decode.cu).
pub(in crate::cuda) const ATT_SPLIT_THREADS: u32 = 128;
/// Query heads per kv head that `dec_attn_split*` holds (`SPLIT_GRP` in decode.cu).
const SPLIT_GRP: usize = 8;

/// Key splits of a layer's attention for a KV cache of `context` positions: by the keys the
/// layer can attend to (`window` as `DevLayer::window`: > 0 a sliding window, < 0 none, 0 the
/// whole cache); see [`ATT_SPLIT_MIN_CONTEXT`].
pub(in crate::cuda) fn attention_splits(context: usize, window: i32) -> usize {
    let keys = attended_keys(context, window);
    if keys <= ATT_SPLIT_MIN_CONTEXT {
        return 1;
    }
    keys.div_ceil(ATT_SPLIT_KEYS).min(ATT_MAX_SPLITS)
}

/// The positions a layer attends to in a cache of `context` (`window` as in
/// [`attention_splits`]).
fn attended_keys(context: usize, window: i32) -> usize {
    match window {
        w if w > 0 => context.min(w as usize),
        w if w < 0 => 0,
        _ => context,
    }
}

/// Positions per key split of a small cache in the forward pass's decode attention: one step
/// of a `dec_attn_split*` block's tile loop (`SPLIT_WARPS` warps × `TK` keys). H100, one
/// Qwen3-30B-A3B decode token at a 128-position cache: 5.88 ms of device time with one
/// `t_rope_attend` block per query head, 4.28 ms with splits of 32 positions (4.33 with 64).
const SMALL_SPLIT_KEYS: usize = 32;

/// Key splits of the forward pass's decode attention over a batch (`blocks_per_split` blocks
/// for each split: kv heads × rows): [`attention_splits`] past `ATT_SPLIT_MIN_CONTEXT`
/// positions; a smaller cache is split into pieces of at least [`SMALL_SPLIT_KEYS`]
/// positions, no more than fill the device's `sms` multiprocessors once (1: no split).
pub(in crate::cuda) fn row_attention_splits(
    context: usize,
    window: i32,
    blocks_per_split: usize,
    sms: usize,
) -> usize {
    let s = attention_splits(context, window);
    if s > 1 {
        return s;
    }
    attended_keys(context, window)
        .div_ceil(SMALL_SPLIT_KEYS)
        .min(sms.div_ceil(blocks_per_split.max(1)))
        .max(1)
}

/// The key-split attention kernel (`dec_attn_split*`) for heads of `head_dim` values with `grp`
/// query heads per kv head: `None` unless head_dim is a multiple of 8 and at most 256 (the
/// kernel reads 8 values of a key at a time), `grp` is at most `SPLIT_GRP` and the group's
/// heads fit the kernel's shared memory.
pub(in crate::cuda) fn split_kernel(
    dev: &Device,
    grp: usize,
    head_dim: usize,
) -> Option<&CudaFunction> {
    if grp == 0 || grp > SPLIT_GRP || grp * head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(8) {
        return None;
    }
    let class = match head_dim {
        0..=64 => 0,
        65..=128 => 1,
        129..=256 => 2,
        _ => return None,
    };
    Some(&dev.k.dec_attn_split[class + if grp > 4 { 3 } else { 0 }])
}

// decode.cu's limits: `dec_attn_merge` holds `wt[64]` and takes one split per thread of its
// DEC_THREADS block; `dec_attn_split*` runs SPLIT_WARPS = 4 warps.
const _: () = assert!(ATT_MAX_SPLITS <= 64 && ATT_MAX_SPLITS <= DEC_THREADS as usize);
const _: () = assert!(ATT_SPLIT_THREADS == 4 * 32);

/// A kernel argument: a device pointer, an int or a float.
#[derive(Clone, Copy)]
enum A {
    P(u64),
    I(i32),
    F(f32),
}

/// A weight on the device.
#[derive(Clone, Copy, Debug)]
enum WKind {
    Quant(QuantFormat),
    F32,
    F16,
}

#[derive(Clone, Copy, Debug)]
struct DevWeight {
    kind: WKind,
    ptr: u64,
    rows: usize,
    cols: usize,
    /// The `[rows]` f32 Linear bias added by the mat-vec (0: none; quantized weights only).
    bias: u64,
}

impl DevWeight {
    /// Activation family of a quantized weight: Q8_K (true) or 32-value blocks (false).
    fn family(&self) -> Option<bool> {
        match self.kind {
            WKind::Quant(f) => Some(f.vec_dot_type() == Some(QuantFormat::Q8_K)),
            _ => None,
        }
    }
}

/// One layer's device pointers (0 = absent) and geometry.
#[derive(Debug)]
struct DevLayer {
    pre_attn_norm: u64,
    post_attn_norm: u64,
    pre_ffn_norm: u64,
    post_ffn_norm: u64,
    q_norm: u64,
    k_norm: u64,
    wq: DevWeight,
    wk: DevWeight,
    wv: DevWeight,
    wo: DevWeight,
    gate: Option<DevWeight>,
    up: DevWeight,
    down: DevWeight,
    n_q: usize,
    n_kv: usize,
    head_dim: usize,
    inter: usize,
    rot: usize,
    interleaved: bool,
    /// Device `[rot/2]` f64 inverse frequencies; absent without RoPE.
    inv_freq: Option<CudaSlice<f64>>,
    scale: f32,
    /// > 0: sliding window; 0: none; −1: no key visible.
    window: i32,
    softcap: f32,
    act: i32,
    eps: f32,
    off: f32,
    mult: f32,
    /// `[context, n_kv · head_dim]` keys and values, stored as the decoder's [`KvType`].
    k_cache: CudaSlice<u8>,
    v_cache: CudaSlice<u8>,
}

/// Quantized activations of one family, sized for the widest input.
#[derive(Debug)]
struct ActBuf {
    aq: CudaSlice<i8>,
    ad: CudaSlice<f32>,
    bsums: CudaSlice<i32>,
}

/// Device activation buffers of one step.
#[derive(Debug)]
struct Bufs {
    p: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    branch: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    scores: CudaSlice<f32>,
    /// The attention's key splits: `[n_q][splits][head_dim + 2]` (values, maximum, sum).
    splits: CudaSlice<f32>,
    /// `dec_argmax`'s result: the packed (logit, id) key and the non-finite flag.
    best: CudaSlice<u64>,
    kq: ActBuf,
    b32: ActBuf,
}

/// See the [module docs](self).
pub(super) struct CudaDecoder<'b> {
    backend: &'b CudaBackend,
    /// The dequantized copy of a quantized embedding table (`embed` points into it).
    _embed_owned: Option<CudaSlice<f32>>,
    stream: Arc<CudaStream>,
    generation: u64,
    hidden: usize,
    vocab: usize,
    context: usize,
    /// How the KV cache stores its values (the backend's at creation).
    kv: KvType,
    embed: (u64, bool),
    embed_scale: f32,
    final_norm: u64,
    final_eps: f32,
    final_off: f32,
    logits_div: f32,
    final_cap: f32,
    layers: Vec<DevLayer>,
    groups: Vec<LayerGroups>,
    lm_group: Group,
    bufs: Bufs,
    graph: Option<CudaGraph>,
    /// While [`TokenDecoder::profile_step`] runs: an event after each launch.
    profile: RefCell<Option<Vec<(&'static str, CudaEvent)>>>,
}

fn ptr<T>(s: &CudaSlice<T>, st: &Arc<CudaStream>) -> u64 {
    s.device_ptr(st).0
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    st: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>, ComputeError> {
    drv("allocate decode buffers", st.alloc_zeros::<T>(n.max(1)))
}

fn shape_err(what: &'static str, expected: usize, got: usize) -> ComputeError {
    ComputeError::ShapeMismatch {
        what,
        expected,
        got,
        unit: "values",
    }
}

/// Upload (or find in the cache) a weight of `rows × cols` and its `[rows]` bias, and check
/// their sizes. Errors also for a bias on a float weight (the float products add none).
fn weight(
    st: &mut State,
    w: &MatData<'_>,
    bias: Option<&[f32]>,
    rows: usize,
    cols: usize,
) -> Result<DevWeight, ComputeError> {
    let bias_ptr = vector(st, bias, rows)?;
    let State { dev, cache, .. } = st;
    let (kind, bytes) = match *w {
        MatData::Blocks { format, bytes } => {
            check(dev, format, bytes, rows, cols)?;
            (WKind::Quant(format), bytes)
        }
        MatData::SplitQ8 { .. } => {
            return Err(super::device::dev_err(
                "the device decoder has no kernel for the split Q8 (int8 + f32 scales) format",
            ))
        }
        MatData::F32(v) => {
            if v.len() != rows * cols {
                return Err(shape_err("f32 weight (rows * cols)", rows * cols, v.len()));
            }
            (WKind::F32, as_bytes(v))
        }
        MatData::F16(v) => {
            if v.len() != rows * cols {
                return Err(shape_err("f16 weight (rows * cols)", rows * cols, v.len()));
            }
            (WKind::F16, as_bytes(v))
        }
    };
    if bias_ptr != 0 && !matches!(kind, WKind::Quant(_)) {
        return Err(super::device::dev_err(
            "the device decoder adds a Linear bias only to quantized weights",
        ));
    }
    let buf = cache.get(&dev.stream, bytes)?;
    Ok(DevWeight {
        kind,
        ptr: ptr(buf, &dev.stream),
        rows,
        cols,
        bias: bias_ptr,
    })
}

/// Upload (or find) an f32 vector of length `n`; `None` → 0 (absent).
fn vector(st: &mut State, v: Option<&[f32]>, n: usize) -> Result<u64, ComputeError> {
    let Some(v) = v else { return Ok(0) };
    if v.len() != n {
        return Err(shape_err("norm weight or bias", n, v.len()));
    }
    let State { dev, cache, .. } = st;
    Ok(ptr(cache.get(&dev.stream, as_bytes(v))?, &dev.stream))
}

fn act_code(a: Activation) -> i32 {
    match a {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::Gelu => 2,
    }
}

fn act_buf(st: &Arc<CudaStream>, n: usize) -> Result<ActBuf, ComputeError> {
    Ok(ActBuf {
        aq: zeros(st, n)?,
        ad: zeros(st, n / 32 + 1)?,
        bsums: zeros(st, (n / 256 + 1) * 16)?,
    })
}

impl<'b> CudaDecoder<'b> {
    /// Upload `plan` and allocate the KV cache and buffers. Errors: shapes that disagree, a
    /// format without a kernel, sizes beyond the kernels' limits, device failures.
    pub fn new(backend: &'b CudaBackend, plan: &DecodePlan<'_>) -> Result<Self, ComputeError> {
        let mut st = backend.lock();
        let h = plan.hidden_size;
        if h == 0 {
            return Err(dev_err("decode: hidden_size 0"));
        }
        let stream = drv("create the decode stream", st.dev.ctx.new_stream())?;
        let kv = st.kv;
        let mut layers = Vec::with_capacity(plan.layers.len());
        for l in &plan.layers {
            let a = &l.attention;
            let hd = a.head_dim;
            if hd == 0
                || hd > MAX_HEAD_DIM
                || a.n_kv_heads == 0
                || !a.n_q_heads.is_multiple_of(a.n_kv_heads)
            {
                return Err(dev_err(format!(
                    "decode: head_dim {hd} (at most {MAX_HEAD_DIM}) with {} query and {} kv heads",
                    a.n_q_heads, a.n_kv_heads
                )));
            }
            kv.check_head_dim(hd)?;
            // The fused kernels have neither attention sinks nor scaled cos/sin (YaRN): such
            // models run the tensor operations instead.
            if a.sinks.is_some() || l.rope.is_some_and(|r| r.attention_factor() != 1.0) {
                return Err(dev_err(
                    "decode: attention sinks or YaRN RoPE (the fused decoder has neither)",
                ));
            }
            let (qd, kvd, inter) = (a.n_q_heads * hd, a.n_kv_heads * hd, l.intermediate_size);
            let (rot, interleaved, inv_freq) = match &l.rope {
                Some(r) => {
                    let f = r.inv_freq();
                    let buf = drv("upload RoPE frequencies", stream.clone_htod(&f))?;
                    (r.rotary_dim, r.interleaved, Some(buf))
                }
                None => (0, false, None),
            };
            let window = match a.sliding_window {
                None => 0,
                Some(0) => -1,
                Some(w) => int("sliding window", w)?,
            };
            let gate = match &l.gate {
                Some(g) => Some(weight(&mut st, g, l.biases.gate, inter, h)?),
                None => None,
            };
            layers.push(DevLayer {
                pre_attn_norm: vector(&mut st, Some(l.pre_attn_norm), h)?,
                post_attn_norm: vector(&mut st, l.post_attn_norm, h)?,
                pre_ffn_norm: vector(&mut st, Some(l.pre_ffn_norm), h)?,
                post_ffn_norm: vector(&mut st, l.post_ffn_norm, h)?,
                q_norm: vector(&mut st, l.q_norm, hd)?,
                k_norm: vector(&mut st, l.k_norm, hd)?,
                wq: weight(&mut st, &l.wq, l.biases.q, qd, h)?,
                wk: weight(&mut st, &l.wk, l.biases.k, kvd, h)?,
                wv: weight(&mut st, &l.wv, l.biases.v, kvd, h)?,
                wo: weight(&mut st, &l.wo, l.biases.o, h, qd)?,
                gate,
                up: weight(&mut st, &l.up, l.biases.up, inter, h)?,
                down: weight(&mut st, &l.down, l.biases.down, h, inter)?,
                n_q: a.n_q_heads,
                n_kv: a.n_kv_heads,
                head_dim: hd,
                inter,
                rot,
                interleaved,
                inv_freq,
                scale: a.scale,
                window,
                softcap: a.softcap.unwrap_or(0.0),
                act: act_code(l.activation),
                eps: l.eps,
                off: l.norm_offset,
                mult: l.residual_multiplier,
                k_cache: zeros(&stream, kv.row_bytes(plan.context * kvd))?,
                v_cache: zeros(&stream, kv.row_bytes(plan.context * kvd))?,
            });
        }
        // A quantized table (a vindex without a float tier) is dequantized once into an f32
        // copy owned by this decoder (exact: the host's lookup dequantizes the same rows), and
        // a tied lm_head reads its blocks, as the forward pass does.
        let mut embed_owned = None;
        let (embed_ptr, embed_f16, embed_len, tied_blocks) = match plan.embeddings {
            FloatTable::F32(v) => {
                let State { dev, cache, .. } = &mut *st;
                let p = ptr(cache.get(&dev.stream, as_bytes(v))?, &dev.stream);
                (p, false, v.len(), None)
            }
            FloatTable::F16(v) => {
                let State { dev, cache, .. } = &mut *st;
                let p = ptr(cache.get(&dev.stream, as_bytes(v))?, &dev.stream);
                (p, true, v.len(), None)
            }
            FloatTable::Blocks { format, bytes } => {
                let n = plan.vocab_size * h;
                let values = infer_quant::dequantize_to_vec(format, bytes, n)?;
                let buf = drv(
                    "upload the dequantized embeddings",
                    st.dev.stream.clone_htod(&values),
                )?;
                let p = ptr(&buf, &st.dev.stream);
                embed_owned = Some(buf);
                (p, false, n, Some(MatData::Blocks { format, bytes }))
            }
        };
        if embed_len != plan.vocab_size * h {
            return Err(shape_err(
                "embeddings (vocab * hidden)",
                plan.vocab_size * h,
                embed_len,
            ));
        }
        let lm_head = match (&plan.lm_head, tied_blocks) {
            (Some(w), _) => weight(&mut st, w, None, plan.vocab_size, h)?,
            (None, Some(w)) => weight(&mut st, &w, None, plan.vocab_size, h)?,
            (None, None) => DevWeight {
                kind: if embed_f16 { WKind::F16 } else { WKind::F32 },
                ptr: embed_ptr,
                rows: plan.vocab_size,
                cols: h,
                bias: 0,
            },
        };
        let final_norm = vector(&mut st, Some(plan.final_norm), h)?;
        let widest = |f: fn(&PlanLayer<'_>) -> usize| plan.layers.iter().map(f).max().unwrap_or(0);
        let max_kvd = widest(|l| l.attention.n_kv_heads * l.attention.head_dim);
        let max_qd = widest(|l| l.attention.n_q_heads * l.attention.head_dim);
        let max_inter = widest(|l| l.intermediate_size);
        let max_q = widest(|l| l.attention.n_q_heads);
        let max_hd = widest(|l| l.attention.head_dim);
        // The widest product input: hidden, attention output or intermediate.
        let max_cols = h.max(max_qd).max(max_inter);
        let bufs = Bufs {
            p: zeros(&stream, 2)?,
            x: zeros(&stream, h)?,
            xn: zeros(&stream, h)?,
            q: zeros(&stream, max_qd)?,
            k: zeros(&stream, max_kvd)?,
            v: zeros(&stream, max_kvd)?,
            attn: zeros(&stream, max_qd)?,
            branch: zeros(&stream, h)?,
            gate: zeros(&stream, max_inter)?,
            up: zeros(&stream, max_inter)?,
            logits: zeros(&stream, plan.vocab_size)?,
            scores: zeros(&stream, max_q * plan.context)?,
            splits: zeros(
                &stream,
                max_q * attention_splits(plan.context, 0) * (max_hd + 2),
            )?,
            best: zeros(&stream, 2)?,
            kq: act_buf(&stream, max_cols)?,
            b32: act_buf(&stream, max_cols)?,
        };
        let p = |b: &CudaSlice<f32>| ptr(b, &stream);
        let mut groups = Vec::with_capacity(layers.len());
        for l in &layers {
            let (gate_ws, gate_ys) = match l.gate {
                Some(g) => (vec![g, l.up], vec![p(&bufs.gate), p(&bufs.up)]),
                None => (vec![l.up], vec![p(&bufs.up)]),
            };
            groups.push(LayerGroups {
                qkv: Group::new(
                    &stream,
                    vec![l.wq, l.wk, l.wv],
                    vec![p(&bufs.q), p(&bufs.k), p(&bufs.v)],
                    h,
                )?,
                o: Group::new(
                    &stream,
                    vec![l.wo],
                    vec![p(&bufs.branch)],
                    l.n_q * l.head_dim,
                )?,
                gate_up: Group::new(&stream, gate_ws, gate_ys, h)?,
                down: Group::new(&stream, vec![l.down], vec![p(&bufs.branch)], l.inter)?,
            });
        }
        let lm_group = Group::new(&stream, vec![lm_head], vec![p(&bufs.logits)], h)?;
        // Weights were uploaded on the backend's stream: wait before this stream reads them.
        drv("synchronize uploads", st.dev.stream.synchronize())?;
        let generation = st.generation;
        drop(st);
        Ok(CudaDecoder {
            backend,
            _embed_owned: embed_owned,
            stream,
            generation,
            hidden: h,
            vocab: plan.vocab_size,
            context: plan.context,
            kv,
            embed: (embed_ptr, embed_f16),
            embed_scale: plan.embedding_scale,
            final_norm,
            final_eps: plan.final_eps,
            final_off: plan.final_norm_offset,
            logits_div: plan.logits_divisor,
            final_cap: plan.final_softcap.unwrap_or(0.0),
            layers,
            groups,
            lm_group,
            bufs,
            graph: None,
            profile: RefCell::new(None),
        })
    }

    /// Check `token` and `pos` and copy them to the device (`p`). Errors: out of range, a
    /// cleared weight cache (`generation` changed), a device failure.
    fn set_params(&mut self, generation: u64, token: u32, pos: usize) -> Result<(), ComputeError> {
        if token as usize >= self.vocab {
            return Err(dev_err(format!(
                "decode: token id {token} outside the vocabulary ({})",
                self.vocab
            )));
        }
        if pos >= self.context {
            return Err(dev_err(format!(
                "decode: position {pos} outside the context ({})",
                self.context
            )));
        }
        if generation != self.generation {
            return Err(dev_err(
                "decode: the backend's weight cache was cleared after this decoder was made",
            ));
        }
        let params = [token as i32, int("position", pos)?];
        let stream = self.stream.clone();
        drv(
            "upload token and position",
            stream.memcpy_htod(&params, &mut self.bufs.p),
        )
    }

    /// Set `{token, pos}` and enqueue the step's graph (captured on first use); returns the
    /// backend lock, held while the caller reads the results.
    fn replay(&mut self, token: u32, pos: usize) -> Result<MutexGuard<'b, State>, ComputeError> {
        let st = self.backend.lock();
        self.set_params(st.generation, token, pos)?;
        if self.graph.is_none() {
            self.capture(&st.dev)?;
        }
        if let Some(g) = &self.graph {
            drv("replay the decode graph", g.launch())?;
        }
        Ok(st)
    }

    /// Check a KV row range of `layer`; returns (kv_dim, element offset).
    fn kv_range(
        &self,
        layer: usize,
        start: usize,
        k_len: usize,
        v_len: usize,
    ) -> Result<(usize, usize), ComputeError> {
        let l = self
            .layers
            .get(layer)
            .ok_or_else(|| dev_err(format!("decode: no layer {layer}")))?;
        let kvd = l.n_kv * l.head_dim;
        if k_len != v_len || !k_len.is_multiple_of(kvd) {
            return Err(shape_err("K/V rows (n * kv_dim)", kvd, k_len));
        }
        let n = k_len / kvd;
        match start.checked_add(n) {
            Some(end) if end <= self.context => Ok((kvd, start * kvd)),
            _ => Err(dev_err(format!(
                "decode: KV rows {start}..{start}+{n} past the context {}",
                self.context
            ))),
        }
    }
}

impl CudaDecoder<'_> {
    /// Rows `start .. start + rows` of `layer` between this cache and the forward pass's
    /// device tensors `k`, `v` (`[context, kv_dim]`), device to device: into this cache when
    /// `into_decoder`, else out of it. `Ok(false)` when a tensor is not in this device's memory.
    /// The backend's pending launches are finished first (they write or read the tensors).
    fn copy_kv(
        &mut self,
        layer: usize,
        start: usize,
        rows: usize,
        k: &Tensor,
        v: &Tensor,
        into_decoder: bool,
    ) -> Result<bool, ComputeError> {
        let kvd = self
            .layers
            .get(layer)
            .map(|l| l.n_kv * l.head_dim)
            .ok_or_else(|| dev_err(format!("decode: no layer {layer}")))?;
        let n = rows
            .checked_mul(kvd)
            .ok_or_else(|| dev_err(format!("decode: {rows} KV rows overflow")))?;
        let (_, off) = self.kv_range(layer, start, n, n)?;
        // Same row width and length on the forward pass's side: rows `start..` hold the same
        // positions there.
        if k.len() != v.len() || !k.len().is_multiple_of(kvd) {
            return Err(shape_err(
                "forward-pass K/V cache (rows × kv_dim)",
                kvd,
                k.len(),
            ));
        }
        let mut st = self.backend.lock();
        let State { dev, rec, .. } = &mut *st;
        let (Some((kp, kt)), Some((vp, vt))) = (
            tensor_ops::device_ptr(k, &dev.stream),
            tensor_ops::device_ptr(v, &dev.stream),
        ) else {
            return Ok(false);
        };
        if kt != self.kv || vt != self.kv {
            return Err(dev_err(format!(
                "decode: the forward pass's KV cache is stored as {kt}/{vt}, the decoder's as {}",
                self.kv
            )));
        }
        if off + n > k.len() {
            return Err(dev_err(format!(
                "decode: KV rows {start}..{start}+{rows} past the forward pass's cache of {} rows",
                k.len() / kvd
            )));
        }
        if n == 0 {
            return Ok(true);
        }
        rec.flush(&dev.stream)?;
        rec.wait(&dev.stream)?;
        let s = self.stream.clone();
        drv("bind the CUDA context", s.context().bind_to_thread())?;
        let l = &self.layers[layer];
        let bytes = self.kv.row_bytes(n);
        let at = self.kv.row_bytes(off) as u64;
        for (cache, src) in [(ptr(&l.k_cache, &s), kp), (ptr(&l.v_cache, &s), vp)] {
            let (to, from) = if into_decoder {
                (cache + at, src + at)
            } else {
                (src + at, cache + at)
            };
            // SAFETY: both ranges lie inside live allocations of this context (checked
            // above: off + n values in the decoder's cache and in both tensors), and the
            // copy completes before this function returns (synchronize below).
            let r = unsafe {
                cudarc::driver::result::memcpy_dtod_async(to, from, bytes, s.cu_stream())
            };
            drv("copy K/V rows on the device", r)?;
        }
        drv("synchronize", s.synchronize())?;
        Ok(true)
    }
}

impl TokenDecoder for CudaDecoder<'_> {
    fn write_kv(
        &mut self,
        layer: usize,
        start: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), ComputeError> {
        let (_, off) = self.kv_range(layer, start, k.len(), v.len())?;
        if k.is_empty() {
            return Ok(());
        }
        let _guard = self.backend.lock();
        let st = self.stream.clone();
        let kv = self.kv;
        let bytes = kv.row_bytes(off)..kv.row_bytes(off + k.len());
        let l = &mut self.layers[layer];
        let (ke, ve) = (tensor_ops::encode_kv(kv, k)?, tensor_ops::encode_kv(kv, v)?);
        let mut kview = l.k_cache.slice_mut(bytes.clone());
        drv("upload K rows", st.memcpy_htod(&ke, &mut kview))?;
        let mut vview = l.v_cache.slice_mut(bytes);
        drv("upload V rows", st.memcpy_htod(&ve, &mut vview))?;
        drv("synchronize", st.synchronize())
    }

    fn read_kv(
        &mut self,
        layer: usize,
        start: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), ComputeError> {
        let (_, off) = self.kv_range(layer, start, k.len(), v.len())?;
        if k.is_empty() {
            return Ok(());
        }
        let _guard = self.backend.lock();
        let l = &self.layers[layer];
        let st = &self.stream;
        let kv = self.kv;
        let bytes = kv.row_bytes(off)..kv.row_bytes(off + k.len());
        let (mut kb, mut vb) = (vec![0u8; bytes.len()], vec![0u8; bytes.len()]);
        drv(
            "download K rows",
            st.memcpy_dtoh(&l.k_cache.slice(bytes.clone()), &mut kb),
        )?;
        drv(
            "download V rows",
            st.memcpy_dtoh(&l.v_cache.slice(bytes), &mut vb),
        )?;
        drv("synchronize", st.synchronize())?;
        tensor_ops::decode_kv(kv, &kb, k)?;
        tensor_ops::decode_kv(kv, &vb, v)
    }

    fn write_kv_from(
        &mut self,
        layer: usize,
        start: usize,
        rows: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<bool, ComputeError> {
        self.copy_kv(layer, start, rows, k, v, true)
    }

    fn read_kv_into(
        &mut self,
        layer: usize,
        start: usize,
        rows: usize,
        k: &mut Tensor,
        v: &mut Tensor,
    ) -> Result<bool, ComputeError> {
        self.copy_kv(layer, start, rows, k, v, false)
    }

    fn step(&mut self, token: u32, pos: usize, logits: &mut [f32]) -> Result<(), ComputeError> {
        if logits.len() != self.vocab {
            return Err(shape_err("logits (vocab)", self.vocab, logits.len()));
        }
        let _guard = self.replay(token, pos)?;
        let stream = self.stream.clone();
        drv(
            "download logits",
            stream.memcpy_dtoh(&self.bufs.logits, logits),
        )?;
        drv("synchronize", stream.synchronize())
    }

    fn step_argmax(&mut self, token: u32, pos: usize) -> Result<Option<Argmax>, ComputeError> {
        let _guard = self.replay(token, pos)?;
        let mut best = [0u64; 2];
        let stream = self.stream.clone();
        drv(
            "download the greedy token",
            stream.memcpy_dtoh(&self.bufs.best, &mut best),
        )?;
        drv("synchronize", stream.synchronize())?;
        Ok(Some(Argmax {
            // The low 32 bits hold 0xffffffff - id (see dec_argmax).
            token: u32::MAX - (best[0] & 0xffff_ffff) as u32,
            all_finite: best[1] == 0,
        }))
    }

    fn profile_step(
        &mut self,
        token: u32,
        pos: usize,
    ) -> Result<Vec<(String, usize, f64)>, ComputeError> {
        let backend = self.backend;
        let st = backend.lock();
        self.set_params(st.generation, token, pos)?;
        let start = drv(
            "record a profiling event",
            self.stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
        )?;
        *self.profile.borrow_mut() = Some(Vec::new());
        let recorded = self.record(&st.dev);
        let events = self.profile.borrow_mut().take().unwrap_or_default();
        recorded?;
        drv("synchronize", self.stream.synchronize())?;
        let mut out: Vec<(String, usize, f64)> = Vec::new();
        let mut prev = &start;
        for (name, e) in &events {
            let us = drv("event time", prev.elapsed_ms(e))? as f64 * 1e3;
            match out.iter_mut().find(|o| o.0 == *name) {
                Some(o) => {
                    o.1 += 1;
                    o.2 += us;
                }
                None => out.push((name.to_string(), 1, us)),
            }
            prev = e;
        }
        Ok(out)
    }
}
