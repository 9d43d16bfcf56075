//! The forward pass's [`Tensor`] operations on the device: tensors are device allocations
//! ([`DevBuf`]), every operation is kernels on the backend's stream (`ops.cu`, and the product
//! kernels of `kernels.cu` reading and writing the tensors in place), and nothing is copied to
//! the host except by [`download`]. Weights, norm weights and biases come from the weight cache
//! (uploaded once, keyed by the host slice). Per-call index arrays (positions, token ids, rows,
//! the attention step's cache pointers) are copied into small device buffers first; copies and
//! kernels are ordered by the one stream.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use infer_quant::QuantFormat;

use super::cache::{as_bytes, Grow};
use super::device::{dev_err, drv, int, launch_args, Device, GT};
use super::quant::{is_kq, kernel, mv_grid, warp_grid};
use super::State;
use crate::host_ops::check;
use crate::ops::Activation;
use crate::{
    Attend, AttentionParams, ComputeError, DeviceBuffer, FloatTable, MatData, Matrix, Norm,
    NormKind, RopeConfig, Tensor, TensorProj,
};

/// Threads of the row-wise kernels of `ops.cu` (`OPS_THREADS`).
const OPS_THREADS: u32 = 256;
/// Threads of `t_attention`: `ATTN_WARPS` warps.
const ATTN_THREADS: u32 = 128;
/// Largest head_dim `t_attention` handles (`attn_row<16>`).
const MAX_HEAD_DIM: usize = 512;
/// Up to this many activation rows, float products use the warp-per-row kernel (as float.rs).
const ROWDOT_MAX_M: usize = 8;

/// A tensor's device memory.
pub(super) struct DevBuf(CudaSlice<f32>);

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({} f32)", self.0.len())
    }
}

impl DeviceBuffer for DevBuf {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Small per-call device arrays of the tensor operations, and RoPE's inverse frequencies per
/// configuration.
#[derive(Debug)]
pub(super) struct OpScratch {
    ints: Grow<i32>,
    info: Grow<i64>,
    inv_freq: Vec<(RopeConfig, CudaSlice<f64>)>,
}

impl OpScratch {
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<Self, ComputeError> {
        Ok(OpScratch {
            ints: Grow::new(stream)?,
            info: Grow::new(stream)?,
            inv_freq: Vec::new(),
        })
    }
}

fn ptr<T>(s: &CudaSlice<T>, st: &Arc<CudaStream>) -> u64 {
    s.device_ptr(st).0
}

/// The device pointer of tensor `t`. Errors: a host tensor or another backend's.
fn tp(st: &Arc<CudaStream>, t: &Tensor, op: &str) -> Result<u64, ComputeError> {
    match t.device().and_then(|d| d.as_any().downcast_ref::<DevBuf>()) {
        Some(b) => Ok(ptr(&b.0, st)),
        None => Err(dev_err(format!(
            "{op}: the tensor is not in this CUDA device's memory (make it with the backend's fit/upload)"
        ))),
    }
}

fn dev_buf_mut<'t>(t: &'t mut Tensor, op: &str) -> Result<&'t mut CudaSlice<f32>, ComputeError> {
    match t
        .device_mut()
        .and_then(|d| d.as_any_mut().downcast_mut::<DevBuf>())
    {
        Some(b) => Ok(&mut b.0),
        None => Err(dev_err(format!(
            "{op}: the tensor is not in this CUDA device's memory"
        ))),
    }
}

/// Kernel argument slots: pointers and 64-bit ints as they are, 32-bit ints and floats in the
/// low bytes.
fn i(v: i32) -> u64 {
    v as u32 as u64
}
fn f(v: f32) -> u64 {
    v.to_bits() as u64
}

/// One thread per value, `OPS_THREADS` per block.
fn flat(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(OPS_THREADS as usize) as u32, 1, 1),
        block_dim: (OPS_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` per row.
fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn go(
    dev: &Device,
    func: &cudarc::driver::CudaFunction,
    cfg: LaunchConfig,
    args: &mut [u64],
) -> Result<(), ComputeError> {
    if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 {
        return Ok(());
    }
    // SAFETY: every caller passes the argument list of the kernel it launches, with device
    // pointers of tensors and cached weights sized for what the kernel reads and writes (the
    // shapes are checked before the launch).
    unsafe { launch_args(&dev.stream, func, cfg, args) }
}

/// A device pointer to the cached copy of `v` (a weight, norm weight or bias).
fn cached(st: &mut State, bytes: &[u8]) -> Result<u64, ComputeError> {
    let State { dev, cache, .. } = st;
    Ok(ptr(cache.get(&dev.stream, bytes)?, &dev.stream))
}

/// Copy `v` into the device int buffer; its pointer.
fn upload_ints(st: &mut State, v: &[i32]) -> Result<u64, ComputeError> {
    let State { dev, ops, .. } = st;
    ops.ints.at_least(&dev.stream, v.len().max(1))?;
    let mut view = ops.ints.get_mut().slice_mut(0..v.len());
    drv(
        "copy indices to the device",
        dev.stream.memcpy_htod(v, &mut view),
    )?;
    Ok(ptr(ops.ints.get(), &dev.stream))
}

fn to_i32(what: &str, v: usize) -> Result<i32, ComputeError> {
    int(what, v)
}

pub(super) fn fit(st: &mut State, t: &mut Tensor, len: usize) -> Result<(), ComputeError> {
    let mine = t
        .device()
        .is_some_and(|d| d.as_any().downcast_ref::<DevBuf>().is_some());
    if mine && t.set_len(len) {
        return Ok(());
    }
    let buf = drv(
        "allocate a tensor",
        st.dev.stream.alloc_zeros::<f32>(len.max(1)),
    )?;
    *t = Tensor::device_from(Box::new(DevBuf(buf)), len);
    Ok(())
}

pub(super) fn upload(st: &mut State, src: &[f32], dst: &mut Tensor) -> Result<(), ComputeError> {
    fit(st, dst, src.len())?;
    let buf = dev_buf_mut(dst, "upload")?;
    let mut view = buf.slice_mut(0..src.len());
    drv(
        "copy to the device",
        st.dev.stream.memcpy_htod(src, &mut view),
    )
}

pub(super) fn download(st: &mut State, src: &Tensor, dst: &mut [f32]) -> Result<(), ComputeError> {
    check("download destination", dst.len(), src.len(), "values")?;
    let Some(b) = src
        .device()
        .and_then(|d| d.as_any().downcast_ref::<DevBuf>())
    else {
        return Err(dev_err(
            "download: the tensor is not in this CUDA device's memory",
        ));
    };
    let view = b.0.slice(0..src.len());
    drv("copy to the host", st.dev.stream.memcpy_dtoh(&view, dst))?;
    drv("synchronize", st.dev.stream.synchronize())
}

pub(super) fn read_at(
    st: &mut State,
    src: &Tensor,
    offset: usize,
    dst: &mut [f32],
) -> Result<(), ComputeError> {
    let r = crate::host_ops::range("read_at", src.len(), offset, dst.len())?;
    let Some(b) = src
        .device()
        .and_then(|d| d.as_any().downcast_ref::<DevBuf>())
    else {
        return Err(dev_err(
            "read_at: the tensor is not in this CUDA device's memory",
        ));
    };
    let view = b.0.slice(r);
    drv("copy to the host", st.dev.stream.memcpy_dtoh(&view, dst))?;
    drv("synchronize", st.dev.stream.synchronize())
}

pub(super) fn write_at(
    st: &mut State,
    src: &[f32],
    dst: &mut Tensor,
    offset: usize,
) -> Result<(), ComputeError> {
    let r = crate::host_ops::range("write_at", dst.len(), offset, src.len())?;
    let buf = dev_buf_mut(dst, "write_at")?;
    let mut view = buf.slice_mut(r);
    drv(
        "copy to the device",
        st.dev.stream.memcpy_htod(src, &mut view),
    )
}

pub(super) fn copy_rows(
    st: &mut State,
    src: &Tensor,
    width: usize,
    rows: &[usize],
    dst: &mut Tensor,
) -> Result<(), ComputeError> {
    crate::host_ops::check_row_indices(rows, src.len().checked_div(width).unwrap_or(0))?;
    fit(st, dst, rows.len() * width)?;
    let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    let ip = upload_ints(st, &idx)?;
    let s = &st.dev.stream;
    let mut a = [
        tp(s, src, "copy_rows")?,
        tp(s, dst, "copy_rows")?,
        ip,
        i(to_i32("width", width)?),
    ];
    go(
        &st.dev,
        &st.dev.k.t_copy_rows,
        per_row(rows.len(), OPS_THREADS),
        &mut a,
    )
}

/// The weight product on device tensors: `y[m × w.rows] = x · Wᵀ` (`y` already fit).
fn product(st: &mut State, w: &Matrix<'_>, x: u64, m: usize, y: u64) -> Result<(), ComputeError> {
    let (rows, cols) = (w.rows, w.cols);
    let (m_i, rows_i, cols_i) = (int("m", m)?, int("rows", rows)?, int("cols", cols)?);
    match w.data {
        MatData::F32(_) | MatData::F16(_) => {
            let (bytes, f16) = match w.data {
                MatData::F32(v) => (as_bytes(v), false),
                MatData::F16(v) => (as_bytes(v), true),
                _ => unreachable!("float storage matched above"),
            };
            let wp = cached(st, bytes)?;
            let k = &st.dev.k;
            let (func, cfg) = if m <= ROWDOT_MAX_M {
                (
                    if f16 { &k.rowdot_f16 } else { &k.rowdot_f32 },
                    mv_grid(rows, m),
                )
            } else {
                let cfg = LaunchConfig {
                    grid_dim: (rows.div_ceil(GT) as u32, m.div_ceil(GT) as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                (if f16 { &k.gemm_nt_f16 } else { &k.gemm_nt_f32 }, cfg)
            };
            let mut a = [x, wp, y, i(m_i), i(rows_i), i(cols_i)];
            go(&st.dev, func, cfg, &mut a)
        }
        MatData::Blocks { format, bytes } => {
            super::quant::check(&st.dev, format, bytes, rows, cols)?;
            let wp = cached(st, bytes)?;
            quantize(st, x, Some(format), m, cols)?;
            mv(st, format, wp, y, m, rows, cols)
        }
        MatData::SplitQ8 { values, scales } => {
            let wv = cached(st, values)?;
            let ws = cached(st, as_bytes(scales))?;
            quantize(st, x, None, m, cols)?;
            let s = &st.s;
            let mut a = [
                wv,
                ws,
                ptr(s.b32.aq.get(), &st.dev.stream),
                ptr(s.b32.ad.get(), &st.dev.stream),
                y,
                i(rows_i),
                i(cols_i),
                i(m_i),
            ];
            go(&st.dev, &st.dev.k.mv_q8s, mv_grid(rows, m), &mut a)
        }
    }
}

/// Quantize `m × cols` activations at `x` for weights of `format` (`None`: the seed's Q8)
/// into the family's buffers.
fn quantize(
    st: &mut State,
    x: u64,
    format: Option<QuantFormat>,
    m: usize,
    cols: usize,
) -> Result<(), ComputeError> {
    let State { dev, s, .. } = st;
    let stream = &dev.stream;
    let n = m * cols;
    let kq = is_kq(format);
    let nblocks = n / if kq { 256 } else { 32 };
    let nb = int("activation blocks", nblocks)?;
    let a = if kq { &mut s.kq } else { &mut s.b32 };
    a.aq.at_least(stream, n)?;
    a.ad.at_least(stream, nblocks)?;
    if kq {
        a.bsums.at_least(stream, nblocks * 16)?;
        let mut args = [
            x,
            ptr(a.aq.get(), stream),
            ptr(a.ad.get(), stream),
            ptr(a.bsums.get(), stream),
            i(nb),
        ];
        go(dev, &dev.k.quantize_q8_k, warp_grid(nblocks), &mut args)
    } else {
        let mut args = [
            x,
            ptr(a.aq.get(), stream),
            ptr(a.ad.get(), stream),
            i(nb),
            i(format.is_some() as i32),
        ];
        go(dev, &dev.k.quantize_q8_32, warp_grid(nblocks), &mut args)
    }
}

/// The mat-vec kernel of `format` on cached weights `wp` and the activations quantized last for
/// its family, into `y` (`[m, rows]`).
fn mv(
    st: &State,
    format: QuantFormat,
    wp: u64,
    y: u64,
    m: usize,
    rows: usize,
    cols: usize,
) -> Result<(), ComputeError> {
    let Some((func, kq)) = kernel(&st.dev, format) else {
        return Err(ComputeError::UnsupportedFormat {
            backend: "cuda".into(),
            format,
        });
    };
    let stream = &st.dev.stream;
    let a = if kq { &st.s.kq } else { &st.s.b32 };
    let (rows_i, cols_i, m_i) = (int("rows", rows)?, int("cols", cols)?, int("m", m)?);
    let mut args = vec![wp, ptr(a.aq.get(), stream), ptr(a.ad.get(), stream)];
    if kq {
        args.push(ptr(a.bsums.get(), stream));
    }
    args.extend([y, i(rows_i), i(cols_i), i(m_i)]);
    go(&st.dev, func, mv_grid(rows, m), &mut args)
}

/// Shapes of a product: the storage matches the matrix, `x` holds `m × cols`.
fn check_product(w: &Matrix<'_>, x: &Tensor, m: usize) -> Result<(), ComputeError> {
    w.check()?;
    check(
        "product activations (m × cols)",
        x.len(),
        m * w.cols,
        "values",
    )
}

/// Zero `y` (a product with no input columns).
fn zero(st: &mut State, y: &mut Tensor) -> Result<(), ComputeError> {
    let buf = dev_buf_mut(y, "product")?;
    drv("clear a tensor", st.dev.stream.memset_zeros(buf))
}

pub(super) fn project(
    st: &mut State,
    w: &Matrix<'_>,
    x: &Tensor,
    m: usize,
    y: &mut Tensor,
) -> Result<(), ComputeError> {
    check_product(w, x, m)?;
    fit(st, y, m * w.rows)?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        return zero(st, y);
    }
    let s = &st.dev.stream;
    let (xp, yp) = (tp(s, x, "project")?, tp(s, y, "project")?);
    product(st, w, xp, m, yp)
}

pub(super) fn project_many(
    st: &mut State,
    x: &Tensor,
    m: usize,
    projs: &mut [TensorProj<'_>],
) -> Result<(), ComputeError> {
    for p in projs.iter() {
        check_product(&p.w, x, m)?;
    }
    let all_blocks = projs
        .iter()
        .all(|p| matches!(p.w.data, MatData::Blocks { .. }));
    let same_cols = projs.windows(2).all(|w| w[0].w.cols == w[1].w.cols);
    if !all_blocks || !same_cols || m == 0 || projs.iter().any(|p| p.w.cols == 0) {
        for p in projs.iter_mut() {
            project(st, &p.w, x, m, p.y)?;
        }
        return Ok(());
    }
    // Quantize the activations once per family, then one mat-vec per matrix.
    let xp = tp(&st.dev.stream, x, "project_many")?;
    let cols = projs[0].w.cols;
    let mut ptrs = Vec::with_capacity(projs.len());
    for p in projs.iter_mut() {
        let (format, bytes) = p.w.blocks_data()?;
        super::quant::check(&st.dev, format, bytes, p.w.rows, cols)?;
        fit(st, p.y, m * p.w.rows)?;
        ptrs.push((cached(st, bytes)?, tp(&st.dev.stream, p.y, "project_many")?));
    }
    for family in [true, false] {
        if let Some(p) = projs.iter().find(
            |p| matches!(p.w.data, MatData::Blocks { format, .. } if is_kq(Some(format)) == family),
        ) {
            let (format, _) = p.w.blocks_data()?;
            quantize(st, xp, Some(format), m, cols)?;
        }
    }
    for (p, (wp, yp)) in projs.iter().zip(ptrs) {
        if p.w.rows > 0 {
            let (format, _) = p.w.blocks_data()?;
            mv(st, format, wp, yp, m, p.w.rows, cols)?;
        }
    }
    Ok(())
}

pub(super) fn add_bias(st: &mut State, y: &mut Tensor, bias: &[f32]) -> Result<(), ComputeError> {
    crate::host_ops::check_bias(y.len(), bias)?;
    let bp = cached(st, as_bytes(bias))?;
    let mut a = [
        tp(&st.dev.stream, y, "add_bias")?,
        bp,
        y.len() as u64,
        i(to_i32("bias width", bias.len())?),
    ];
    go(&st.dev, &st.dev.k.t_add_bias, flat(y.len()), &mut a)
}

fn norm_launch(
    st: &mut State,
    n: &Norm<'_>,
    x: u64,
    out: u64,
    len: usize,
) -> Result<(), ComputeError> {
    crate::host_ops::check_norm(n, len)?;
    let d = n.weight.len();
    if len == 0 {
        return Ok(());
    }
    let wp = cached(st, as_bytes(n.weight))?;
    let bp = match n.bias {
        Some(b) => cached(st, as_bytes(b))?,
        None => 0,
    };
    let (layer, off) = match n.kind {
        NormKind::Rms { offset } => (0, offset),
        NormKind::Layer => (1, 0.0),
    };
    let mut a = [
        x,
        wp,
        bp,
        out,
        i(to_i32("norm width", d)?),
        i(layer),
        f(n.eps),
        f(off),
    ];
    go(
        &st.dev,
        &st.dev.k.t_norm,
        per_row(len / d, OPS_THREADS),
        &mut a,
    )
}

pub(super) fn norm(
    st: &mut State,
    n: &Norm<'_>,
    x: &Tensor,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    fit(st, out, x.len())?;
    let s = &st.dev.stream;
    let (xp, op) = (tp(s, x, "norm")?, tp(s, out, "norm")?);
    norm_launch(st, n, xp, op, x.len())
}

pub(super) fn norm_inplace(
    st: &mut State,
    n: &Norm<'_>,
    x: &mut Tensor,
) -> Result<(), ComputeError> {
    let xp = tp(&st.dev.stream, x, "norm")?;
    norm_launch(st, n, xp, xp, x.len())
}

pub(super) fn rope(
    st: &mut State,
    x: &mut Tensor,
    n_heads: usize,
    positions: &[usize],
    cfg: &RopeConfig,
) -> Result<(), ComputeError> {
    check(
        "rope input (positions × heads × head_dim)",
        x.len(),
        positions.len() * n_heads * cfg.head_dim,
        "values",
    )?;
    if x.is_empty() || cfg.rotary_dim == 0 {
        return Ok(());
    }
    let xp = tp(&st.dev.stream, x, "rope")?;
    let pos: Vec<i32> = positions
        .iter()
        .map(|&p| to_i32("position", p))
        .collect::<Result<_, _>>()?;
    let pp = upload_ints(st, &pos)?;
    let fp = {
        let State { dev, ops, .. } = st;
        let k = match ops.inv_freq.iter().position(|(c, _)| c == cfg) {
            Some(k) => k,
            None => {
                let inv = cfg.inv_freq();
                let buf = drv("upload RoPE frequencies", dev.stream.clone_htod(&inv))?;
                ops.inv_freq.push((*cfg, buf));
                ops.inv_freq.len() - 1
            }
        };
        ptr(&ops.inv_freq[k].1, &dev.stream)
    };
    let mut a = [
        xp,
        pp,
        fp,
        i(to_i32("heads", n_heads)?),
        i(to_i32("head_dim", cfg.head_dim)?),
        i(to_i32("rotary_dim", cfg.rotary_dim)?),
        i(cfg.interleaved as i32),
    ];
    go(
        &st.dev,
        &st.dev.k.t_rope,
        per_row(positions.len() * n_heads, 64),
        &mut a,
    )
}

pub(super) fn attend(
    st: &mut State,
    at: &mut Attend<'_, '_>,
    p: &AttentionParams,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    crate::host_ops::check_attend(at, p)?;
    if p.head_dim > MAX_HEAD_DIM {
        return Err(dev_err(format!(
            "attention: head_dim {} exceeds the kernel's {MAX_HEAD_DIM}",
            p.head_dim
        )));
    }
    let kvd = p.n_kv_heads * p.head_dim;
    let rows: usize = at.seqs.iter().map(|s| s.rows).sum();
    fit(st, out, at.q.len())?;
    let stream = st.dev.stream.clone();
    let mut info = Vec::with_capacity(rows * 3);
    for s in at.seqs.iter() {
        let end = s.start + s.rows;
        let (kc, vc) = (
            tp(&stream, s.k_cache, "attend")?,
            tp(&stream, s.v_cache, "attend")?,
        );
        for pos in s.start..end {
            info.extend([kc as i64, vc as i64, pos as i64]);
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let ip = {
        let State { dev, ops, .. } = st;
        ops.info.at_least(&dev.stream, info.len())?;
        let mut view = ops.info.get_mut().slice_mut(0..info.len());
        drv(
            "copy the attention step's rows",
            dev.stream.memcpy_htod(&info, &mut view),
        )?;
        ptr(ops.info.get(), &dev.stream)
    };
    let (qp, kp, vp, op) = (
        tp(&stream, at.q, "attend")?,
        tp(&stream, at.k, "attend")?,
        tp(&stream, at.v, "attend")?,
        tp(&stream, out, "attend")?,
    );
    let kvd_i = to_i32("kv_dim", kvd)?;
    let mut a = [kp, vp, ip, i(kvd_i)];
    go(
        &st.dev,
        &st.dev.k.t_kv_store,
        per_row(rows, OPS_THREADS),
        &mut a,
    )?;
    let window = match p.sliding_window {
        None => 0,
        Some(0) => -1,
        Some(w) => to_i32("sliding window", w)?,
    };
    let cfg = LaunchConfig {
        grid_dim: (p.n_q_heads as u32, rows as u32, 1),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut a = [
        qp,
        ip,
        op,
        i(to_i32("q heads", p.n_q_heads)?),
        i(to_i32("kv heads", p.n_kv_heads)?),
        i(to_i32("head_dim", p.head_dim)?),
        f(p.scale),
        i(window),
        f(p.softcap.unwrap_or(0.0)),
    ];
    go(&st.dev, &st.dev.k.t_attention, cfg, &mut a)
}

fn act_code(a: Activation) -> i32 {
    match a {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::Gelu => 2,
    }
}

pub(super) fn activation(
    st: &mut State,
    act: Activation,
    gate: Option<&Tensor>,
    up: &mut Tensor,
) -> Result<(), ComputeError> {
    let s = &st.dev.stream;
    let gp = match gate {
        Some(g) => {
            check("gated activation up", up.len(), g.len(), "values")?;
            tp(s, g, "gated_activation")?
        }
        None => 0,
    };
    let mut a = [
        gp,
        tp(s, up, "activation")?,
        up.len() as u64,
        i(act_code(act)),
    ];
    go(&st.dev, &st.dev.k.t_act, flat(up.len()), &mut a)
}

pub(super) fn add_scaled(
    st: &mut State,
    x: &mut Tensor,
    y: &Tensor,
    alpha: f32,
) -> Result<(), ComputeError> {
    check("residual branch", y.len(), x.len(), "values")?;
    let s = &st.dev.stream;
    let mut a = [
        tp(s, x, "add_scaled")?,
        tp(s, y, "add_scaled")?,
        x.len() as u64,
        f(alpha),
    ];
    go(&st.dev, &st.dev.k.t_add_scaled, flat(x.len()), &mut a)
}

pub(super) fn scale_softcap(
    st: &mut State,
    x: &mut Tensor,
    divisor: f32,
    softcap: Option<f32>,
) -> Result<(), ComputeError> {
    let mut a = [
        tp(&st.dev.stream, x, "scale_softcap")?,
        x.len() as u64,
        f(divisor),
        f(softcap.unwrap_or(0.0)),
    ];
    go(&st.dev, &st.dev.k.t_scale_softcap, flat(x.len()), &mut a)
}

pub(super) fn embed(
    st: &mut State,
    table: FloatTable<'_>,
    width: usize,
    ids: &[u32],
    scale: f32,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    let rows = table.len().checked_div(width).unwrap_or(0);
    if width == 0 || rows * width != table.len() {
        return Err(ComputeError::ShapeMismatch {
            what: "embedding table (whole rows of the width)",
            expected: rows.max(1) * width,
            got: table.len(),
            unit: "values",
        });
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= rows) {
        return Err(ComputeError::ShapeMismatch {
            what: "embedding row (token id < rows)",
            expected: rows,
            got: id as usize,
            unit: "row",
        });
    }
    fit(st, out, ids.len() * width)?;
    if ids.is_empty() {
        return Ok(());
    }
    let (bytes, f16) = match table {
        FloatTable::F32(v) => (as_bytes(v), 0),
        FloatTable::F16(v) => (as_bytes(v), 1),
        // A quantized table (no float tier): the few looked-up rows are dequantized on the
        // host (ggml's dequantizers) and copied over.
        FloatTable::Blocks { .. } => {
            let mut rows_host = vec![0.0; ids.len() * width];
            crate::host_ops::embed(table, ids, scale, &mut rows_host)?;
            return upload(st, &rows_host, out);
        }
    };
    let tpp = cached(st, bytes)?;
    let idx: Vec<i32> = ids.iter().map(|&v| v as i32).collect();
    let ip = upload_ints(st, &idx)?;
    let mut a = [
        tpp,
        ip,
        tp(&st.dev.stream, out, "embed")?,
        i(to_i32("width", width)?),
        f(scale),
        i(f16),
    ];
    go(
        &st.dev,
        &st.dev.k.t_embed,
        per_row(ids.len(), OPS_THREADS),
        &mut a,
    )
}
