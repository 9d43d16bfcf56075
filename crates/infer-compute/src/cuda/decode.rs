//! [`CudaDecoder`]: a [`DecodePlan`] resident on the device (the seed's `decode_token`). Weights
//! come from the backend's weight cache (uploaded once, shared with the host-loop products); the
//! KV cache, activations and logits live in device buffers; one step is the kernels of
//! `decode.cu` plus the quantized mat-vecs of `kernels.cu`, recorded once into a CUDA graph and
//! replayed per token with only `{token, pos}` copied in and the logits copied out.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use infer_quant::QuantFormat;

use super::cache::as_bytes;
use super::device::{dev_err, drv, int, Device};
use super::quant::{check, mv_grid};
use super::{CudaBackend, State};
use crate::ops::Activation;
use crate::{ComputeError, DecodePlan, PlanRows, PlanWeight, TokenDecoder};

/// Threads of the one-block kernels; `DEC_THREADS` in decode.cu.
const DEC_THREADS: u32 = 256;
/// Threads of `dec_residual_norm` (`RN_THREADS` in decode.cu).
const RN_THREADS: u32 = 1024;
/// Largest hidden size of `dec_residual_norm` (`RN_MAX`: its shared copy of the row).
const MAX_HIDDEN: usize = 8192;
/// Shared head buffers of `dec_attention`.
const MAX_HEAD_DIM: usize = 1024;

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
}

impl DevWeight {
    /// Activation family of a quantized weight: Q8_K (true) or 32-value blocks (false).
    fn family(&self) -> Option<bool> {
        match self.kind {
            WKind::Quant(f) => Some(matches!(f, QuantFormat::Q4_K | QuantFormat::Q6_K)),
            _ => None,
        }
    }
}

/// The products of one input: one `dec_mv_multi` launch over a device job table when every
/// weight is quantized, else one product each. The input's producer quantizes it for
/// [`Group::families`].
#[derive(Debug)]
struct Group {
    weights: Vec<DevWeight>,
    outs: Vec<u64>,
    cols: usize,
    /// `[W, y, rows, format, first block]` per weight; `None` when a weight is float.
    jobs: Option<CudaSlice<i64>>,
    blocks: usize,
}

/// `dec_mv_multi`'s format code.
fn format_code(f: QuantFormat) -> Result<i64, ComputeError> {
    Ok(match f {
        QuantFormat::Q4_0 => 0,
        QuantFormat::Q5_0 => 1,
        QuantFormat::Q8_0 => 2,
        QuantFormat::Q4_K => 4,
        QuantFormat::Q6_K => 5,
        _ => {
            return Err(ComputeError::UnsupportedFormat {
                backend: "cuda".to_string(),
                format: f,
            })
        }
    })
}

impl Group {
    fn new(
        st: &Arc<CudaStream>,
        weights: Vec<DevWeight>,
        outs: Vec<u64>,
        cols: usize,
    ) -> Result<Self, ComputeError> {
        let mut table = Vec::new();
        let mut blocks = 0usize;
        let mut all_quant = true;
        for (w, &y) in weights.iter().zip(&outs) {
            let WKind::Quant(f) = w.kind else {
                all_quant = false;
                break;
            };
            table.extend([
                w.ptr as i64,
                y as i64,
                w.rows as i64,
                format_code(f)?,
                blocks as i64,
            ]);
            blocks += w.rows.div_ceil(super::device::ROWS_PER_BLOCK);
        }
        let jobs = if all_quant {
            int("mat-vec blocks", blocks)?;
            Some(drv("upload mat-vec jobs", st.clone_htod(&table))?)
        } else {
            None
        };
        Ok(Group {
            weights,
            outs,
            cols,
            jobs,
            blocks,
        })
    }

    /// Activation families the quantized weights need: (Q8_K, 32-value blocks).
    fn families(&self) -> (bool, bool) {
        let has = |k| self.weights.iter().any(|w| w.family() == Some(k));
        (has(true), has(false))
    }
}

/// Per-layer product groups.
#[derive(Debug)]
struct LayerGroups {
    qkv: Group,
    o: Group,
    gate_up: Group,
    down: Group,
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
    k_cache: CudaSlice<f32>,
    v_cache: CudaSlice<f32>,
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
    kq: ActBuf,
    b32: ActBuf,
}

/// See the [module docs](self).
pub(super) struct CudaDecoder<'b> {
    backend: &'b CudaBackend,
    stream: Arc<CudaStream>,
    generation: u64,
    hidden: usize,
    vocab: usize,
    context: usize,
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

/// Upload (or find in the cache) a weight of `rows × cols` and check its size.
fn weight(
    st: &mut State,
    w: &PlanWeight<'_>,
    rows: usize,
    cols: usize,
) -> Result<DevWeight, ComputeError> {
    let State { dev, cache, .. } = st;
    let (kind, bytes) = match *w {
        PlanWeight::Quant { format, bytes } => {
            check(dev, format, bytes, rows, cols)?;
            (WKind::Quant(format), bytes)
        }
        PlanWeight::F32(v) => {
            if v.len() != rows * cols {
                return Err(shape_err("f32 weight (rows * cols)", rows * cols, v.len()));
            }
            (WKind::F32, as_bytes(v))
        }
        PlanWeight::F16(v) => {
            if v.len() != rows * cols {
                return Err(shape_err("f16 weight (rows * cols)", rows * cols, v.len()));
            }
            (WKind::F16, as_bytes(v))
        }
    };
    let buf = cache.get(&dev.stream, bytes)?;
    Ok(DevWeight {
        kind,
        ptr: ptr(buf, &dev.stream),
        rows,
        cols,
    })
}

/// Upload (or find) an f32 vector of length `n`; `None` → 0 (absent).
fn vector(st: &mut State, v: Option<&[f32]>, n: usize) -> Result<u64, ComputeError> {
    let Some(v) = v else { return Ok(0) };
    if v.len() != n {
        return Err(shape_err("norm weight", n, v.len()));
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
        if h == 0 || h > MAX_HIDDEN {
            return Err(dev_err(format!(
                "decode: hidden_size {h} outside 1..={MAX_HIDDEN}"
            )));
        }
        let stream = drv("create the decode stream", st.dev.ctx.new_stream())?;
        let (mut max_cols, mut max_q) = (h, 0usize);
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
            let (qd, kvd, inter) = (a.n_q_heads * hd, a.n_kv_heads * hd, l.intermediate_size);
            max_cols = max_cols.max(qd).max(inter);
            max_q = max_q.max(a.n_q_heads);
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
                Some(g) => Some(weight(&mut st, g, inter, h)?),
                None => None,
            };
            layers.push(DevLayer {
                pre_attn_norm: vector(&mut st, Some(l.pre_attn_norm), h)?,
                post_attn_norm: vector(&mut st, l.post_attn_norm, h)?,
                pre_ffn_norm: vector(&mut st, Some(l.pre_ffn_norm), h)?,
                post_ffn_norm: vector(&mut st, l.post_ffn_norm, h)?,
                q_norm: vector(&mut st, l.q_norm, hd)?,
                k_norm: vector(&mut st, l.k_norm, hd)?,
                wq: weight(&mut st, &l.wq, qd, h)?,
                wk: weight(&mut st, &l.wk, kvd, h)?,
                wv: weight(&mut st, &l.wv, kvd, h)?,
                wo: weight(&mut st, &l.wo, h, qd)?,
                gate,
                up: weight(&mut st, &l.up, inter, h)?,
                down: weight(&mut st, &l.down, h, inter)?,
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
                k_cache: zeros(&stream, plan.context * kvd)?,
                v_cache: zeros(&stream, plan.context * kvd)?,
            });
        }
        let (embed_bytes, embed_f16, embed_len) = match plan.embeddings {
            PlanRows::F32(v) => (as_bytes(v), false, v.len()),
            PlanRows::F16(v) => (as_bytes(v), true, v.len()),
        };
        if embed_len != plan.vocab_size * h {
            return Err(shape_err(
                "embeddings (vocab * hidden)",
                plan.vocab_size * h,
                embed_len,
            ));
        }
        let embed_ptr = {
            let State { dev, cache, .. } = &mut *st;
            ptr(cache.get(&dev.stream, embed_bytes)?, &dev.stream)
        };
        let lm_head = match &plan.lm_head {
            Some(w) => weight(&mut st, w, plan.vocab_size, h)?,
            None => DevWeight {
                kind: if embed_f16 { WKind::F16 } else { WKind::F32 },
                ptr: embed_ptr,
                rows: plan.vocab_size,
                cols: h,
            },
        };
        let final_norm = vector(&mut st, Some(plan.final_norm), h)?;
        let max_kvd = plan
            .layers
            .iter()
            .map(|l| l.attention.n_kv_heads * l.attention.head_dim)
            .max()
            .unwrap_or(0);
        let max_qd = plan
            .layers
            .iter()
            .map(|l| l.attention.n_q_heads * l.attention.head_dim)
            .max()
            .unwrap_or(0);
        let max_inter = plan
            .layers
            .iter()
            .map(|l| l.intermediate_size)
            .max()
            .unwrap_or(0);
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
            stream,
            generation,
            hidden: h,
            vocab: plan.vocab_size,
            context: plan.context,
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

    fn go(
        &self,
        name: &'static str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[A],
    ) -> Result<(), ComputeError> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                A::P(v) => b.arg(v),
                A::I(v) => b.arg(v),
                A::F(v) => b.arg(v),
            };
        }
        // SAFETY: every call site passes the argument list of the named kernel (decode.cu /
        // kernels.cu) with device pointers into buffers sized for it (allocated in `new`).
        drv("launch a decode kernel", unsafe { b.launch(cfg) })?;
        if let Some(events) = self.profile.borrow_mut().as_mut() {
            let e = drv(
                "record a profiling event",
                self.stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
            )?;
            events.push((name, e));
        }
        Ok(())
    }

    fn p<T>(&self, s: &CudaSlice<T>) -> u64 {
        ptr(s, &self.stream)
    }

    /// Quantize `cols` activations at `x` once per activation family used by `ws`.
    fn quantize_for(
        &self,
        dev: &Device,
        ws: &[&DevWeight],
        x: u64,
        cols: usize,
    ) -> Result<(), ComputeError> {
        for family in [true, false] {
            if !ws.iter().any(|w| w.family() == Some(family)) {
                continue;
            }
            let block = if family { 256 } else { 32 };
            let nblocks = cols / block;
            let cfg = LaunchConfig {
                grid_dim: (nblocks.div_ceil(4) as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let nb = A::I(int("activation blocks", nblocks)?);
            if family {
                let a = &self.bufs.kq;
                let args = [
                    A::P(x),
                    A::P(self.p(&a.aq)),
                    A::P(self.p(&a.ad)),
                    A::P(self.p(&a.bsums)),
                    nb,
                ];
                self.go("quantize", &dev.k.quantize_q8_k, cfg, &args)?;
            } else {
                let a = &self.bufs.b32;
                let args = [
                    A::P(x),
                    A::P(self.p(&a.aq)),
                    A::P(self.p(&a.ad)),
                    nb,
                    A::I(1),
                ];
                self.go("quantize", &dev.k.quantize_q8_32, cfg, &args)?;
            }
        }
        Ok(())
    }

    /// `y[rows] = W · x` with `x` (f32, `cols`) at `x`, already quantized for `w`'s family by
    /// [`Self::quantize_for`] when `w` is quantized.
    fn matvec(&self, dev: &Device, w: &DevWeight, x: u64, y: u64) -> Result<(), ComputeError> {
        let (rows, cols) = (int("rows", w.rows)?, int("cols", w.cols)?);
        let cfg = mv_grid(w.rows, 1);
        match w.kind {
            WKind::Quant(format) => {
                let (f, kq) = match format {
                    QuantFormat::Q4_0 => (&dev.k.mv_q4_0, false),
                    QuantFormat::Q5_0 => (&dev.k.mv_q5_0, false),
                    QuantFormat::Q8_0 => (&dev.k.mv_q8_0, false),
                    QuantFormat::Q4_K => (&dev.k.mv_q4_k, true),
                    QuantFormat::Q6_K => (&dev.k.mv_q6_k, true),
                    _ => {
                        return Err(ComputeError::UnsupportedFormat {
                            backend: "cuda".to_string(),
                            format,
                        })
                    }
                };
                let a = if kq { &self.bufs.kq } else { &self.bufs.b32 };
                let mut args = vec![A::P(w.ptr), A::P(self.p(&a.aq)), A::P(self.p(&a.ad))];
                if kq {
                    args.push(A::P(self.p(&a.bsums)));
                }
                args.extend([A::P(y), A::I(rows), A::I(cols), A::I(1)]);
                self.go("mat-vec (single)", f, cfg, &args)
            }
            WKind::F32 | WKind::F16 => {
                let f = match w.kind {
                    WKind::F16 => &dev.k.rowdot_f16,
                    _ => &dev.k.rowdot_f32,
                };
                let args = [
                    A::P(x),
                    A::P(w.ptr),
                    A::P(y),
                    A::I(1),
                    A::I(rows),
                    A::I(cols),
                ];
                self.go("mat-vec (float)", f, cfg, &args)
            }
        }
    }

    /// Quantized-activation pointers of the families `fam` = (Q8_K, 32-value): (q32, d32, qk, dk,
    /// bsums), 0 where not wanted.
    fn quant_targets(&self, fam: (bool, bool)) -> [A; 5] {
        let (k, b) = (&self.bufs.kq, &self.bufs.b32);
        let pick = |on: bool, v: u64| A::P(if on { v } else { 0 });
        [
            pick(fam.1, self.p(&b.aq)),
            pick(fam.1, self.p(&b.ad)),
            pick(fam.0, self.p(&k.aq)),
            pick(fam.0, self.p(&k.ad)),
            pick(fam.0, self.p(&k.bsums)),
        ]
    }

    /// `x += [post](branch) · mult` (when `branch` ≠ 0), then `xn = rmsnorm(x) · (norm + off2)`
    /// quantized for the families `fam` of the products that read `xn`.
    #[allow(clippy::too_many_arguments)]
    fn residual_norm(
        &self,
        dev: &Device,
        branch: u64,
        post: u64,
        mult: f32,
        (eps, off): (f32, f32),
        norm: u64,
        (eps2, off2): (f32, f32),
        fam: (bool, bool),
    ) -> Result<(), ComputeError> {
        let b = &self.bufs;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (RN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = vec![
            A::P(self.p(&b.x)),
            A::P(branch),
            A::P(post),
            A::F(mult),
            A::P(norm),
            A::P(self.p(&b.xn)),
            A::I(int("hidden", self.hidden)?),
            A::F(eps),
            A::F(off),
            A::F(eps2),
            A::F(off2),
        ];
        args.extend(self.quant_targets(fam));
        self.go(
            "residual+norm+quantize",
            &dev.k.dec_residual_norm,
            cfg,
            &args,
        )
    }

    /// The products of `g` on their input (already quantized for [`Group::families`]).
    fn run_group(&self, dev: &Device, g: &Group, x: u64) -> Result<(), ComputeError> {
        let Some(jobs) = &g.jobs else {
            for (w, &y) in g.weights.iter().zip(&g.outs) {
                self.matvec(dev, w, x, y)?;
            }
            return Ok(());
        };
        let (k, b) = (&self.bufs.kq, &self.bufs.b32);
        let cfg = LaunchConfig {
            grid_dim: (g.blocks as u32, 1, 1),
            block_dim: (32 * super::device::ROWS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            A::P(self.p(jobs)),
            A::I(g.weights.len() as i32),
            A::P(self.p(&b.aq)),
            A::P(self.p(&b.ad)),
            A::P(self.p(&k.aq)),
            A::P(self.p(&k.ad)),
            A::P(self.p(&k.bsums)),
            A::I(int("cols", g.cols)?),
        ];
        self.go("mat-vec (fused)", &dev.k.dec_mv_multi, cfg, &args)
    }

    /// Enqueue one whole step on the decode stream (recorded into the graph on first use).
    fn record(&self, dev: &Device) -> Result<(), ComputeError> {
        let b = &self.bufs;
        let k = &dev.k;
        let one = |threads: u32| LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (x, xn, pp) = (self.p(&b.x), self.p(&b.xn), self.p(&b.p));
        let h = int("hidden", self.hidden)?;
        let embed = if self.embed.1 {
            &k.dec_embed_f16
        } else {
            &k.dec_embed_f32
        };
        let args = [
            A::P(self.embed.0),
            A::P(pp),
            A::P(x),
            A::I(h),
            A::F(self.embed_scale),
        ];
        self.go("embedding", embed, one(DEC_THREADS), &args)?;
        let (Some(first), Some(g0)) = (self.layers.first(), self.groups.first()) else {
            return Err(dev_err("decode: a plan without layers"));
        };
        let norm0 = (first.eps, first.off);
        let fam0 = g0.qkv.families();
        self.residual_norm(dev, 0, 0, 1.0, norm0, first.pre_attn_norm, norm0, fam0)?;
        let (q, kk, v) = (self.p(&b.q), self.p(&b.k), self.p(&b.v));
        let (attn, up) = (self.p(&b.attn), self.p(&b.up));
        let (branch, gate) = (self.p(&b.branch), self.p(&b.gate));
        for (i, (l, g)) in self.layers.iter().zip(&self.groups).enumerate() {
            let en = (l.eps, l.off);
            self.run_group(dev, &g.qkv, xn)?;
            let cfg = LaunchConfig {
                grid_dim: (l.n_q as u32, 1, 1),
                block_dim: (DEC_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let inv = l.inv_freq.as_ref().map_or(0, |f| self.p(f));
            let args = [
                A::P(q),
                A::P(kk),
                A::P(v),
                A::P(l.q_norm),
                A::P(l.k_norm),
                A::P(inv),
                A::P(self.p(&l.k_cache)),
                A::P(self.p(&l.v_cache)),
                A::P(attn),
                A::P(self.p(&b.scores)),
                A::P(pp),
                A::I(int("query heads", l.n_q)?),
                A::I(int("kv heads", l.n_kv)?),
                A::I(int("head_dim", l.head_dim)?),
                A::I(int("rotary dim", l.rot)?),
                A::I(l.interleaved as i32),
                A::F(l.eps),
                A::F(l.off),
                A::I(int("context", self.context)?),
                A::F(l.scale),
                A::I(l.window),
                A::F(l.softcap),
            ];
            // The attention blocks quantize their heads for the o projection when every
            // quantized block lies within one head; else a separate quantize launch.
            let fam = g.o.families();
            let fused = (!fam.0 || l.head_dim.is_multiple_of(256))
                && (!fam.1 || l.head_dim.is_multiple_of(32));
            let mut args = args.to_vec();
            args.extend(self.quant_targets(if fused { fam } else { (false, false) }));
            self.go(
                "attention (rope, kv store, quantize)",
                &k.dec_attention,
                cfg,
                &args,
            )?;
            if !fused {
                self.quantize_for(dev, &g.o.weights.iter().collect::<Vec<_>>(), attn, g.o.cols)?;
            }
            self.run_group(dev, &g.o, attn)?;
            let fam = g.gate_up.families();
            self.residual_norm(
                dev,
                branch,
                l.post_attn_norm,
                l.mult,
                en,
                l.pre_ffn_norm,
                en,
                fam,
            )?;
            self.run_group(dev, &g.gate_up, xn)?;
            self.act_quant(dev, l, &g.down, if l.gate.is_some() { gate } else { 0 }, up)?;
            self.run_group(dev, &g.down, up)?;
            let (norm, en2, fam) = match (self.layers.get(i + 1), self.groups.get(i + 1)) {
                (Some(next), Some(ng)) => {
                    (next.pre_attn_norm, (next.eps, next.off), ng.qkv.families())
                }
                _ => (
                    self.final_norm,
                    (self.final_eps, self.final_off),
                    self.lm_group.families(),
                ),
            };
            self.residual_norm(dev, branch, l.post_ffn_norm, l.mult, en, norm, en2, fam)?;
        }
        let logits = self.p(&b.logits);
        self.run_group(dev, &self.lm_group, xn)?;
        if self.logits_div != 1.0 || self.final_cap > 0.0 {
            let cfg = LaunchConfig {
                grid_dim: (self.vocab.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let args = [
                A::P(logits),
                A::I(int("vocab", self.vocab)?),
                A::F(self.logits_div),
                A::F(self.final_cap),
            ];
            self.go("logit soft-cap", &k.dec_logits_post, cfg, &args)?;
        }
        Ok(())
    }

    /// `up = act(gate) · up` (or `act(up)` when `gate` is 0), quantized for `down` when it is a
    /// quantized weight.
    fn act_quant(
        &self,
        dev: &Device,
        l: &DevLayer,
        down: &Group,
        gate: u64,
        up: u64,
    ) -> Result<(), ComputeError> {
        let fam = down.weights.first().and_then(|w| w.family());
        let kq = fam == Some(true);
        let per_warp = if kq { 256 } else { 32 };
        let warps = l.inter.div_ceil(per_warp);
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (qa, da, bs) = match fam {
            Some(true) => (
                self.p(&self.bufs.kq.aq),
                self.p(&self.bufs.kq.ad),
                self.p(&self.bufs.kq.bsums),
            ),
            Some(false) => (self.p(&self.bufs.b32.aq), self.p(&self.bufs.b32.ad), 0),
            None => (0, 0, 0),
        };
        let args = [
            A::P(gate),
            A::P(up),
            A::I(int("intermediate", l.inter)?),
            A::I(l.act),
            A::P(qa),
            A::P(da),
            A::P(bs),
            A::I(kq as i32),
        ];
        self.go("activation+quantize", &dev.k.dec_act_quant, cfg, &args)
    }

    /// Capture [`Self::record`] into a graph (once).
    fn capture(&mut self, dev: &Device) -> Result<(), ComputeError> {
        drv(
            "begin graph capture",
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED),
        )?;
        let recorded = self.record(dev);
        let graph = drv(
            "end graph capture",
            self.stream.end_capture(CUgraphInstantiate_flags(0)),
        );
        recorded?;
        self.graph = Some(graph?.ok_or_else(|| dev_err("graph capture recorded nothing"))?);
        Ok(())
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
        if start + n > self.context {
            return Err(dev_err(format!(
                "decode: KV rows {start}..{} past the context {}",
                start + n,
                self.context
            )));
        }
        Ok((kvd, start * kvd))
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
        let l = &mut self.layers[layer];
        let mut kview = l.k_cache.slice_mut(off..off + k.len());
        drv("upload K rows", st.memcpy_htod(k, &mut kview))?;
        let mut vview = l.v_cache.slice_mut(off..off + v.len());
        drv("upload V rows", st.memcpy_htod(v, &mut vview))?;
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
        drv(
            "download K rows",
            st.memcpy_dtoh(&l.k_cache.slice(off..off + k.len()), k),
        )?;
        drv(
            "download V rows",
            st.memcpy_dtoh(&l.v_cache.slice(off..off + v.len()), v),
        )?;
        drv("synchronize", st.synchronize())
    }

    fn step(&mut self, token: u32, pos: usize, logits: &mut [f32]) -> Result<(), ComputeError> {
        if logits.len() != self.vocab {
            return Err(shape_err("logits (vocab)", self.vocab, logits.len()));
        }
        let backend = self.backend;
        let st = backend.lock();
        self.set_params(st.generation, token, pos)?;
        if self.graph.is_none() {
            self.capture(&st.dev)?;
        }
        if let Some(g) = &self.graph {
            drv("replay the decode graph", g.launch())?;
        }
        let stream = self.stream.clone();
        drv(
            "download logits",
            stream.memcpy_dtoh(&self.bufs.logits, logits),
        )?;
        drv("synchronize", stream.synchronize())
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
