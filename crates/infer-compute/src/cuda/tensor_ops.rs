//! The forward pass's [`Tensor`] operations on the device: tensors are device allocations
//! ([`DevBuf`]), every operation is kernels on the backend's stream (`ops.cu`, and the product
//! kernels of `kernels.cu` reading and writing the tensors in place), and nothing is copied to
//! the host except by [`download`]. Weights, norm weights and biases come from the weight cache
//! (uploaded once, keyed by the host slice). Per-call index arrays (positions, token ids, rows,
//! the attention step's cache pointers) are copied into small device buffers first; copies and
//! kernels are ordered by the one stream.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use infer_quant::QuantFormat;

use super::blas::{chunk_rows, dequant_kernel, uses_gemm, BatchedGemm, Gemm};
use super::cache::as_bytes;
use super::device::{dev_err, drv, int, GT, MMQ_BM, MMQ_BN, ROWDOT_MAX_M, ROWS_PER_BLOCK};
use super::quant::{grouped_kernel, is_kq, mv_job, product_kernel, rowdot_grid, warp_grid};
use super::step::Recorder;
use super::State;
use crate::host_ops::check;
use crate::ops::Activation;
use crate::KvType;
use crate::{
    Argmax, Attend, AttentionParams, Chosen, ComputeError, DeviceBuffer, ExpertRows, FloatTable,
    MatData, Matrix, Norm, NormKind, ResidualNorm, RopeAttend, RopeConfig, RoutedProj, Tensor,
    TensorProj,
};

/// Threads of the row-wise kernels of `ops.cu` (`OPS_THREADS`).
const OPS_THREADS: u32 = 256;
/// Threads of `t_attention`: `ATTN_WARPS` warps.
const ATTN_THREADS: u32 = 128;
/// Largest head_dim `t_attention` handles (`attn_row<16>`).
const MAX_HEAD_DIM: usize = 512;
/// Query rows per block of `t_attention_tiles*` (`ATT_BQ`), keys per shared-memory tile
/// (`ATT_BK`) and its threads (`ATT_WARPS` warps).
const ATT_BQ: usize = 32;
const ATT_BK: usize = 32;
const ATT_TILE_THREADS: u32 = 256;
/// Largest head_dim of `t_attention_tiles*` (`t_attention_tiles256`).
const ATT_TILE_MAX_HEAD_DIM: usize = 256;
/// A batch whose longest chunk has at least this many rows attends by tiles of rows
/// (`t_attention_tiles*`, prompts); otherwise one block per row (`t_attention`, decode).
const ATT_TILE_MIN_ROWS: usize = 4;

/// Dynamic shared memory of `t_attention_tiles*` for `hd`: the query tile, the key tile (rows
/// padded by one value), the value tile and the warps' probabilities, in bytes.
pub(super) fn att_tile_smem(hd: usize) -> usize {
    4 * (ATT_BQ * hd
        + ATT_BK * (hd + 1)
        + ATT_BK * hd
        + (ATT_TILE_THREADS as usize / 32) * 4 * ATT_BK)
}

/// The largest y or z dimension of a CUDA grid.
const MAX_GRID_YZ: usize = 65535;
/// Threads of `t_add_norm` (`RN_THREADS` in decode.cu).
const RN_THREADS: u32 = 1024;
/// Largest rotary half `head_norm_rope` handles with `ATTN_THREADS` threads (two pairs each).
const MAX_ROT_HALF: usize = 2 * ATTN_THREADS as usize;

/// Activations already quantized for the next product by the kernel that wrote them (a fused
/// operation: `add_norm`, `rope_attend`, the activation): `n` values at device address `x`, in
/// the Q8_K buffers (`kq`) and/or the 32-value buffers with f16 scales (`b32`, the ggml
/// formats' Q8_0). Valid for the one tensor operation after the one that set it
/// (`CudaBackend::tensor_op`), where [`quantize`] skips its launch when it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PreQuant {
    x: u64,
    n: usize,
    kq: bool,
    b32: bool,
}

/// A tensor's device memory: f32 values, or (a KV cache made by [`fit_kv`]) values stored as
/// `.1` (the kernels' `kt` argument, [`kv_code`]) in f32 words.
pub(super) struct DevBuf(Arc<CudaSlice<f32>>, KvType);

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({} words of {})", self.0.len(), self.1)
    }
}

impl DeviceBuffer for DevBuf {
    fn capacity(&self) -> usize {
        let bytes = 4 * self.0.len();
        match self.1 {
            KvType::F32 => self.0.len(),
            KvType::F16 => bytes / 2,
            KvType::Q8_0 => bytes / 34 * 32,
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Which activation block families the quantized products read, per activation size (values,
/// rows × width): Q8_K (`kq`, the K-quants) and/or 32-value blocks (`b32`, the other ggml
/// formats). A fused operation quantizes its output only for the families a product of that
/// size has read (both until one has run): a Q4_K_M model's products all read Q8_K, so the
/// 32-value copy would be written for nothing at every layer.
#[derive(Debug, Default)]
struct ActFamilies(Vec<(usize, bool, bool)>);

/// Sizes remembered by [`ActFamilies`] (prompt chunks of many lengths come and go).
const ACT_FAMILY_SIZES: usize = 16;

impl ActFamilies {
    /// A product of `n` activation values read the family `kq` (else 32-value blocks).
    fn note(&mut self, n: usize, kq: bool) {
        let k = match self.0.iter().position(|e| e.0 == n) {
            Some(k) => k,
            None => {
                if self.0.len() == ACT_FAMILY_SIZES {
                    self.0.remove(0);
                }
                self.0.push((n, false, false));
                self.0.len() - 1
            }
        };
        if kq {
            self.0[k].1 = true;
        } else {
            self.0[k].2 = true;
        }
    }

    /// Of the families `(kq, b32)` a fused operation's output of `n` values could be quantized
    /// to, those a product of that size read (all of them before any has run).
    fn wanted(&self, n: usize, kq: bool, b32: bool) -> (bool, bool) {
        match self.0.iter().find(|e| e.0 == n) {
            Some(&(_, k, b)) => (kq && k, b32 && b),
            None => (kq, b32),
        }
    }
}

/// RoPE's inverse frequencies per configuration and the greedy choices, on the device.
#[derive(Debug, Default)]
pub(super) struct OpScratch {
    /// The activation families the products read, per size.
    act_families: ActFamilies,
    inv_freq: Vec<(RopeConfig, CudaSlice<f64>)>,
    /// `argmax_rows`' packed (value, id) keys and non-finite flags, two words per row.
    best: Option<CudaSlice<u64>>,
    /// The `argmax_rows_later` whose choices `best` holds, if it still does.
    best_ticket: Option<u64>,
    /// `argmax_rows_later`s so far (each one's ticket).
    tickets: u64,
    /// Choice copies in flight to the host, ticket `t` in slot `t % 2`.
    copies: [Option<ChoiceCopy>; 2],
    /// The decode attention's key splits (`dec_attn_split*`): `[rows, n_q, splits, head_dim + 2]`.
    splits: Option<CudaSlice<f32>>,
}

fn ptr<T>(s: &CudaSlice<T>, st: &Arc<CudaStream>) -> u64 {
    s.device_ptr(st).0
}

/// The kernels' code of a KV cache type (`KV_F32`, `KV_F16`, `KV_Q8_0` in decode.cu).
fn kv_code(kv: KvType) -> i32 {
    match kv {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
    }
}

/// The device pointer of f32 tensor `t` for a recorded launch (the tensor is kept alive until
/// the launch is enqueued). Errors: a host tensor or another backend's, a KV cache stored in
/// another type (only the attention operations read those: [`tp_kv`]).
fn tp(st: &mut State, t: &Tensor, op: &str) -> Result<u64, ComputeError> {
    match tp_kv(st, t, op)? {
        (p, KvType::F32) => Ok(p),
        (_, kv) => Err(dev_err(format!(
            "{op}: the tensor is a KV cache stored as {kv}, not f32 values"
        ))),
    }
}

/// [`tp`] of a KV cache tensor: its pointer and storage type.
fn tp_kv(st: &mut State, t: &Tensor, op: &str) -> Result<(u64, KvType), ComputeError> {
    match t.device().and_then(|d| d.as_any().downcast_ref::<DevBuf>()) {
        Some(b) => {
            st.rec.keep(&b.0);
            Ok((ptr(&b.0, &st.dev.stream), b.1))
        }
        None => Err(dev_err(format!(
            "{op}: the tensor is not in this CUDA device's memory (make it with the backend's fit/upload)"
        ))),
    }
}

/// The K and V caches of a batch's sequences: their pointers per sequence and their one storage
/// type. Errors: as [`tp_kv`], caches of different types in one batch.
fn kv_ptrs(
    st: &mut State,
    seqs: &[crate::KvSlot<'_>],
    op: &str,
) -> Result<(Vec<(u64, u64)>, KvType), ComputeError> {
    let mut out = Vec::with_capacity(seqs.len());
    let mut kind = None;
    for s in seqs {
        let (kc, kk) = tp_kv(st, s.k_cache, op)?;
        let (vc, vk) = tp_kv(st, s.v_cache, op)?;
        for k in [kk, vk] {
            if *kind.get_or_insert(k) != k {
                return Err(dev_err(format!(
                    "{op}: KV caches of types {} and {k} in one batch",
                    kind.unwrap_or(k)
                )));
            }
        }
        out.push((kc, vc));
    }
    Ok((out, kind.unwrap_or_default()))
}

/// The device memory of `t` to write from the host: pending launches are enqueued first
/// (they may read or write it, and they hold references to it).
fn dev_buf_mut<'t>(
    st: &mut State,
    t: &'t mut Tensor,
    op: &str,
) -> Result<&'t mut CudaSlice<f32>, ComputeError> {
    st.rec.flush(&st.dev.stream)?;
    match t
        .device_mut()
        .and_then(|d| d.as_any_mut().downcast_mut::<DevBuf>())
    {
        Some(b) if b.1 != KvType::F32 => Err(dev_err(format!(
            "{op}: the tensor is a KV cache stored as {}, not f32 values",
            b.1
        ))),
        Some(b) => match Arc::get_mut(&mut b.0) {
            Some(s) => Ok(s),
            None => Err(dev_err(format!(
                "{op}: the tensor's memory is shared (a recorded launch still holds it)"
            ))),
        },
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

/// Record a launch of `func` (launched with the step, see `step.rs`) with programmatic
/// dependent launch: every kernel the tensor operations use `pdl_wait`s before it reads
/// (ops.cu, and kernels.cu's quantize and mat-vec kernels), except the tiled f32/f16 GEMMs and
/// the bf16 conversions of `dequant.cu` (`to_bf16`, `dq_*`), launched by [`go_plain`]. Every caller passes the argument list of the kernel it launches, with device
/// pointers of tensors (kept alive by [`tp`]), staged arrays and cached weights sized for what
/// the kernel reads and writes (the shapes are checked before).
fn go(
    rec: &mut Recorder,
    func: &cudarc::driver::CudaFunction,
    cfg: LaunchConfig,
    args: &mut [u64],
) -> Result<(), ComputeError> {
    push(rec, func, cfg, args, true)
}

/// [`go`] without programmatic dependent launch (for kernels that do not `pdl_wait`).
fn go_plain(
    rec: &mut Recorder,
    func: &cudarc::driver::CudaFunction,
    cfg: LaunchConfig,
    args: &mut [u64],
) -> Result<(), ComputeError> {
    push(rec, func, cfg, args, false)
}

fn push(
    rec: &mut Recorder,
    func: &cudarc::driver::CudaFunction,
    cfg: LaunchConfig,
    args: &mut [u64],
    pdl: bool,
) -> Result<(), ComputeError> {
    if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 {
        return Ok(());
    }
    rec.push(func, cfg, args, pdl);
    Ok(())
}

/// A device pointer to the cached copy of `v` (a weight, norm weight or bias).
/// Copies a re-upload replaced stay alive until the launches recorded so far are enqueued.
fn cached(st: &mut State, bytes: &[u8]) -> Result<u64, ComputeError> {
    let State {
        dev, cache, rec, ..
    } = st;
    let p = ptr(cache.get(&dev.stream, bytes)?, &dev.stream);
    keep_retired(cache, rec);
    Ok(p)
}

/// Hand the weight copies and expert tables the cache replaced to the recorder, which keeps
/// them until the pending launches are enqueued.
fn keep_retired(cache: &mut super::cache::WeightCache, rec: &mut Recorder) {
    for old in cache.take_retired() {
        rec.keep_any(old);
    }
}

/// Stage `v` in the step's arena; its device pointer when the step runs.
fn upload_ints(st: &mut State, v: &[i32]) -> Result<u64, ComputeError> {
    st.rec.stage(&st.dev.stream, as_bytes(v))
}

fn to_i32(what: &str, v: usize) -> Result<i32, ComputeError> {
    int(what, v)
}

pub(super) fn fit(st: &mut State, t: &mut Tensor, len: usize) -> Result<(), ComputeError> {
    fit_as(st, t, len, KvType::F32)
}

/// [`fit`] of a KV cache tensor stored as `kv` (`len` a multiple of 32 for Q8_0: whole rows of
/// heads checked by `KvType::check_head_dim`).
pub(super) fn fit_kv(
    st: &mut State,
    t: &mut Tensor,
    len: usize,
    kv: KvType,
) -> Result<(), ComputeError> {
    fit_as(st, t, len, kv)
}

fn fit_as(st: &mut State, t: &mut Tensor, len: usize, kv: KvType) -> Result<(), ComputeError> {
    let same = t
        .device()
        .and_then(|d| d.as_any().downcast_ref::<DevBuf>())
        .is_some_and(|b| b.1 == kv);
    if same && t.set_len(len) {
        return Ok(());
    }
    let words = kv.row_bytes(len).div_ceil(4);
    let buf = drv(
        "allocate a tensor",
        st.dev.stream.alloc_zeros::<f32>(words.max(1)),
    )?;
    *t = Tensor::device_from(Box::new(DevBuf(Arc::new(buf), kv)), len);
    Ok(())
}

/// Values `r` of a KV cache stored as `kv` in `buf`, as f32 (host conversion: f16 widening,
/// ggml `dequantize_row_q8_0`). `r` starts and ends on a Q8_0 block for Q8_0.
fn read_kv_values(
    st: &mut State,
    buf: &CudaSlice<f32>,
    kv: KvType,
    r: std::ops::Range<usize>,
    dst: &mut [f32],
) -> Result<(), ComputeError> {
    let bytes = kv_bytes(kv, &r)?;
    let mut raw = vec![0f32; (bytes.end - bytes.start).div_ceil(4) + 1];
    let (w0, w1) = (bytes.start / 4, bytes.end.div_ceil(4));
    drv(
        "copy to the host",
        st.dev
            .stream
            .memcpy_dtoh(&buf.slice(w0..w1), &mut raw[..w1 - w0]),
    )?;
    st.rec.wait(&st.dev.stream)?;
    let all = super::cache::as_bytes(&raw);
    decode_kv(kv, &all[bytes.start - 4 * w0..bytes.end - 4 * w0], dst)
}

/// `dst.len()` values stored as `kv` in `b`, as f32 (f16 widening, ggml
/// `dequantize_row_q8_0`). Errors: `b` of another length.
fn decode_kv(kv: KvType, b: &[u8], dst: &mut [f32]) -> Result<(), ComputeError> {
    check("KV cache bytes", b.len(), kv.row_bytes(dst.len()), "bytes")?;
    match kv {
        KvType::F32 => {
            for (o, c) in dst.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        KvType::F16 => {
            for (o, c) in dst.iter_mut().zip(b.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        KvType::Q8_0 => infer_quant::dequantize(infer_quant::QuantFormat::Q8_0, b, dst)?,
    }
    Ok(())
}

/// The byte range of values `r` in a cache stored as `kv`. Errors: a Q8_0 range that does not
/// start and end on a block.
fn kv_bytes(
    kv: KvType,
    r: &std::ops::Range<usize>,
) -> Result<std::ops::Range<usize>, ComputeError> {
    if kv == KvType::Q8_0 && !(r.start.is_multiple_of(32) && r.end.is_multiple_of(32)) {
        return Err(dev_err(format!(
            "KV cache values {}..{}: a q8_0 cache is read and written in whole 32-value blocks",
            r.start, r.end
        )));
    }
    Ok(kv.row_bytes(r.start)..kv.row_bytes(r.end))
}

/// `src` stored as `kv` (f16 rounding to nearest even; ggml `quantize_row_q8_0_ref`, as the
/// kernels' `kv_put_row`).
fn encode_kv(kv: KvType, src: &[f32]) -> Result<Vec<u8>, ComputeError> {
    Ok(match kv {
        KvType::F32 => super::cache::as_bytes(src).to_vec(),
        KvType::F16 => src
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        KvType::Q8_0 => {
            infer_quant::quantize(infer_quant::QuantFormat::Q8_0, src, src.len(), None)?
        }
    })
}

pub(super) fn upload(st: &mut State, src: &[f32], dst: &mut Tensor) -> Result<(), ComputeError> {
    fit(st, dst, src.len())?;
    let buf = dev_buf_mut(st, dst, "upload")?;
    let mut view = buf.slice_mut(0..src.len());
    drv(
        "copy to the device",
        st.dev.stream.memcpy_htod(src, &mut view),
    )
}

pub(super) fn download(st: &mut State, src: &Tensor, dst: &mut [f32]) -> Result<(), ComputeError> {
    check("download destination", dst.len(), src.len(), "values")?;
    st.rec.flush(&st.dev.stream)?;
    let Some(b) = src
        .device()
        .and_then(|d| d.as_any().downcast_ref::<DevBuf>())
    else {
        return Err(dev_err(
            "download: the tensor is not in this CUDA device's memory",
        ));
    };
    if b.1 != KvType::F32 {
        let buf = b.0.clone();
        return read_kv_values(st, &buf, b.1, 0..src.len(), dst);
    }
    let view = b.0.slice(0..src.len());
    let stream = &st.dev.stream;
    st.rec.timed_wait(|| {
        drv("copy to the host", stream.memcpy_dtoh(&view, dst))?;
        drv("synchronize", stream.synchronize())
    })
}

pub(super) fn read_at(
    st: &mut State,
    src: &Tensor,
    offset: usize,
    dst: &mut [f32],
) -> Result<(), ComputeError> {
    let r = crate::host_ops::range("read_at", src.len(), offset, dst.len())?;
    st.rec.flush(&st.dev.stream)?;
    let Some(b) = src
        .device()
        .and_then(|d| d.as_any().downcast_ref::<DevBuf>())
    else {
        return Err(dev_err(
            "read_at: the tensor is not in this CUDA device's memory",
        ));
    };
    if b.1 != KvType::F32 {
        let buf = b.0.clone();
        return read_kv_values(st, &buf, b.1, r, dst);
    }
    let view = b.0.slice(r);
    drv("copy to the host", st.dev.stream.memcpy_dtoh(&view, dst))?;
    st.rec.wait(&st.dev.stream)
}

pub(super) fn write_at(
    st: &mut State,
    src: &[f32],
    dst: &mut Tensor,
    offset: usize,
) -> Result<(), ComputeError> {
    let r = crate::host_ops::range("write_at", dst.len(), offset, src.len())?;
    if let Some(kv) = dst
        .device()
        .and_then(|d| d.as_any().downcast_ref::<DevBuf>())
        .map(|b| b.1)
        .filter(|&kv| kv != KvType::F32)
    {
        return write_kv_values(st, src, dst, kv, r);
    }
    let buf = dev_buf_mut(st, dst, "write_at")?;
    let mut view = buf.slice_mut(r);
    drv(
        "copy to the device",
        st.dev.stream.memcpy_htod(src, &mut view),
    )
}

/// [`write_at`] into a KV cache stored as `kv`: `src` encoded on the host ([`encode_kv`]),
/// then copied byte for byte.
fn write_kv_values(
    st: &mut State,
    src: &[f32],
    dst: &mut Tensor,
    kv: KvType,
    r: std::ops::Range<usize>,
) -> Result<(), ComputeError> {
    let bytes = kv_bytes(kv, &r)?;
    let enc = encode_kv(kv, src)?;
    st.rec.flush(&st.dev.stream)?;
    let Some(b) = dst
        .device_mut()
        .and_then(|d| d.as_any_mut().downcast_mut::<DevBuf>())
    else {
        return Err(dev_err(
            "write_at: the tensor is not in this CUDA device's memory",
        ));
    };
    let Some(buf) = Arc::get_mut(&mut b.0) else {
        return Err(dev_err(
            "write_at: the tensor's memory is shared (a recorded launch still holds it)",
        ));
    };
    let base = ptr(buf, &st.dev.stream) + bytes.start as u64;
    let stream = &st.dev.stream;
    // SAFETY: `bytes` lies inside the allocation (its values `r` were range-checked against the
    // tensor's length, and the allocation holds `kv.row_bytes(len)` bytes); `enc` lives until
    // the stream is synchronized below.
    let res = unsafe { cudarc::driver::result::memcpy_htod_async(base, &enc, stream.cu_stream()) };
    drv("copy to the device", res)?;
    drv("synchronize", stream.synchronize())
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
    let mut a = [
        tp(st, src, "copy_rows")?,
        tp(st, dst, "copy_rows")?,
        ip,
        i(to_i32("width", width)?),
    ];
    go(
        &mut st.rec,
        &st.dev.k.t_copy_rows,
        per_row(rows.len(), OPS_THREADS),
        &mut a,
    )
}

pub(super) fn add_rows_scaled(
    st: &mut State,
    src: &Tensor,
    width: usize,
    rows: &[usize],
    weights: &[f32],
    dst: &mut Tensor,
) -> Result<(), ComputeError> {
    crate::host_ops::check_scatter(src.len(), width, rows, weights, dst.len())?;
    if rows.is_empty() || width == 0 {
        return Ok(());
    }
    let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    let ip = upload_ints(st, &idx)?;
    let wp = st.rec.stage(&st.dev.stream, as_bytes(weights))?;
    let mut a = [
        tp(st, src, "add_rows_scaled")?,
        tp(st, dst, "add_rows_scaled")?,
        ip,
        wp,
        i(to_i32("width", width)?),
    ];
    go(
        &mut st.rec,
        &st.dev.k.t_add_rows_scaled,
        per_row(rows.len(), OPS_THREADS),
        &mut a,
    )
}

pub(super) fn fill(st: &mut State, t: &mut Tensor, len: usize, v: f32) -> Result<(), ComputeError> {
    fit(st, t, len)?;
    if len == 0 {
        return Ok(());
    }
    let mut a = [tp(st, t, "fill")?, len as u64, f(v)];
    go(&mut st.rec, &st.dev.k.t_fill, flat(len), &mut a)
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
            if !f16 && m > ROWDOT_MAX_M && st.dev.blas.is_some() {
                return f32_gemm(st, wp, x, y, [m_i, rows_i, cols_i]);
            }
            let k = &st.dev.k;
            let (func, cfg) = if m <= ROWDOT_MAX_M {
                (
                    if f16 { &k.rowdot_f16 } else { &k.rowdot_f32 },
                    rowdot_grid(rows, m),
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
            if m <= ROWDOT_MAX_M {
                go(&mut st.rec, func, cfg, &mut a)
            } else {
                go_plain(&mut st.rec, func, cfg, &mut a)
            }
        }
        MatData::Blocks { format, bytes } => {
            super::quant::check(&st.dev, format, bytes, rows, cols)?;
            let wp = cached(st, bytes)?;
            if uses_gemm(&st.dev, format, rows, cols, m) {
                acts_to_bf16(st, x, m * cols)?;
                let w = CachedBlocks {
                    format,
                    ptr: wp,
                    row_bytes: bytes.len() / rows,
                    rows,
                    cols,
                };
                return gemm(st, &w, y, m);
            }
            quantize(st, x, Some(format), m, cols)?;
            mv(st, format, wp, y, m, rows, cols)
        }
        MatData::SplitQ8 { values, scales } => {
            let wv = cached(st, values)?;
            let ws = cached(st, as_bytes(scales))?;
            quantize(st, x, None, m, cols)?;
            let s = &st.s;
            let mut a = vec![
                wv,
                ws,
                ptr(s.b32.aq.get(), &st.dev.stream),
                ptr(s.b32.ad.get(), &st.dev.stream),
                y,
                i(rows_i),
                i(cols_i),
                i(m_i),
            ];
            let p = product_kernel(&st.dev, None, rows, cols, m)?;
            a.extend(p.split.into_iter().flatten());
            go(&mut st.rec, p.func, p.cfg, &mut a)
        }
    }
}

/// `y[m × rows] = x[m × cols] · wᵀ` for f32 weights `w` (`rows × cols`) on cuBLAS (an MoE
/// router over a prompt chunk: the tiled `gemm_nt_f32` ran it at ~1 TFLOPS on an H100): one
/// f32 GEMM, no TF32 (the results of an f32 product up to the order of the sums), its pointer
/// arrays staged. Column-major: `yᵀ (rows × m, ld rows) = wᵀᵀ · xᵀ`.
fn f32_gemm(st: &mut State, w: u64, x: u64, y: u64, mrc: [i32; 3]) -> Result<(), ComputeError> {
    let [m, rows, cols] = mrc;
    let stage = |st: &mut State, v: u64| st.rec.stage(&st.dev.stream, as_bytes(&[v]));
    let (a, b, c) = (stage(st, w)?, stage(st, x)?, stage(st, y)?);
    st.rec.push_batched(BatchedGemm {
        trans_a: true,
        trans_b: false,
        m: rows,
        n: m,
        k: cols,
        a,
        lda: cols,
        b,
        ldb: cols,
        c,
        ldc: rows,
        batch: 1,
        alpha: 1f32.to_bits(),
    });
    Ok(())
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
    let n = m * cols;
    let kq = is_kq(format);
    if format.is_some() {
        st.ops.act_families.note(n, kq);
    }
    if let Some(p) = st.pq {
        // Quantized by the kernel that wrote `x` (ggml formats only: the seed's Q8 keeps f32
        // scales).
        if p.x == x && p.n == n && (if kq { p.kq } else { format.is_some() && p.b32 }) {
            return Ok(());
        }
    }
    let State { dev, s, rec, .. } = st;
    let stream = &dev.stream;
    let nblocks = n / if kq { 256 } else { 32 };
    let nb = int("activation blocks", nblocks)?;
    let a = if kq { &mut s.kq } else { &mut s.b32 };
    // A buffer replaced while launches are pending stays alive until they are enqueued.
    let mut keep = |old: Option<Box<dyn Any + Send>>| {
        if let Some(old) = old {
            rec.keep_any(old);
        }
    };
    keep(a.aq.at_least_keep(stream, n)?);
    keep(a.ad.at_least_keep(stream, nblocks)?);
    if kq {
        keep(a.bsums.at_least_keep(stream, nblocks * 16)?);
        let mut args = [
            x,
            ptr(a.aq.get(), stream),
            ptr(a.ad.get(), stream),
            ptr(a.bsums.get(), stream),
            i(nb),
        ];
        go(rec, &dev.k.quantize_q8_k, warp_grid(nblocks), &mut args)
    } else {
        let mut args = [
            x,
            ptr(a.aq.get(), stream),
            ptr(a.ad.get(), stream),
            i(nb),
            i(format.is_some() as i32),
        ];
        go(rec, &dev.k.quantize_q8_32, warp_grid(nblocks), &mut args)
    }
}

/// The product kernel of `format` for `m` rows ([`product_kernel`]: mat-vec or tensor-core
/// tiles) on cached weights `wp` and the activations quantized last for its family, into `y`
/// (`[m, rows]`).
fn mv(
    st: &mut State,
    format: QuantFormat,
    wp: u64,
    y: u64,
    m: usize,
    rows: usize,
    cols: usize,
) -> Result<(), ComputeError> {
    let p = product_kernel(&st.dev, Some(format), rows, cols, m)?;
    let stream = &st.dev.stream;
    let a = if p.kq { &st.s.kq } else { &st.s.b32 };
    let (rows_i, cols_i, m_i) = (int("rows", rows)?, int("cols", cols)?, int("m", m)?);
    let mut args = vec![wp, ptr(a.aq.get(), stream), ptr(a.ad.get(), stream)];
    if p.kq {
        args.push(ptr(a.bsums.get(), stream));
    }
    args.extend([y, i(rows_i), i(cols_i), i(m_i)]);
    args.extend(p.split.into_iter().flatten());
    go(&mut st.rec, p.func, p.cfg, &mut args)
}

/// Convert `n` f32 activations at `x` to bf16 in `st.s.xb` for [`gemm`].
fn acts_to_bf16(st: &mut State, x: u64, n: usize) -> Result<(), ComputeError> {
    let State { dev, s, rec, .. } = st;
    if let Some(old) = s.xb.at_least_keep(&dev.stream, n)? {
        rec.keep_any(old);
    }
    let groups = n / 8;
    let mut a = [x, ptr(s.xb.get(), &dev.stream), groups as u64];
    go_plain(rec, &dev.k.to_bf16, flat(groups), &mut a)
}

/// Cached quantized weights: `rows × cols` values of `format` at device address `ptr`,
/// `row_bytes` per row.
#[derive(Clone, Copy)]
struct CachedBlocks {
    format: QuantFormat,
    ptr: u64,
    row_bytes: usize,
    rows: usize,
    cols: usize,
}

/// The dequantize + cuBLAS product ([`super::blas`]) of cached weights `w` by the bf16
/// activations in `st.s.xb` (`m × w.cols`, from [`acts_to_bf16`]) into `y` (`[m, w.rows]`):
/// per chunk of [`chunk_rows`] rows, the rows dequantized into `st.s.wb`, then one GEMM writing
/// that chunk's columns of `y`. The dequantization waits for the previous kernels to finish (no
/// programmatic dependent launch): the GEMM before it may still read `wb`.
fn gemm(st: &mut State, w: &CachedBlocks, y: u64, m: usize) -> Result<(), ComputeError> {
    let CachedBlocks {
        format,
        ptr: wp,
        row_bytes,
        rows,
        cols,
    } = *w;
    let chunk = chunk_rows(rows, cols);
    let (m_i, cols_i, rows_i) = (int("m", m)?, int("cols", cols)?, int("rows", rows)?);
    let State { dev, s, rec, .. } = st;
    let Some(func) = dequant_kernel(dev, format) else {
        return Err(dev_err(format!(
            "no bf16 dequantization kernel for {format:?}"
        )));
    };
    if let Some(old) = s.wb.at_least_keep(&dev.stream, chunk * cols)? {
        rec.keep_any(old);
    }
    let (wb, xb) = (ptr(s.wb.get(), &dev.stream), ptr(s.xb.get(), &dev.stream));
    for r0 in (0..rows).step_by(chunk) {
        let n = chunk.min(rows - r0);
        let groups = n * cols / 8;
        let mut a = [wp + (r0 * row_bytes) as u64, wb, groups as u64];
        go_plain(rec, func, flat(groups), &mut a)?;
        rec.push_gemm(Gemm {
            w: wb,
            x: xb,
            y: y + (r0 * std::mem::size_of::<f32>()) as u64,
            rows: n as i32,
            m: m_i,
            cols: cols_i,
            ldy: rows_i,
        });
    }
    Ok(())
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
    let buf = dev_buf_mut(st, y, "product")?;
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
    if m == 1 && w.rows > 0 && w.cols > 0 && matches!(w.data, MatData::Blocks { .. }) {
        // The one-launch mat-vec path of `project_many` (tall matrices, the lm_head, with
        // several rows per warp).
        return project_many(st, x, m, &mut [TensorProj { w: *w, y }]);
    }
    fit(st, y, m * w.rows)?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        return zero(st, y);
    }
    let (xp, yp) = (tp(st, x, "project")?, tp(st, y, "project")?);
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
    if projs.is_empty() {
        return Ok(());
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
    let xp = tp(st, x, "project_many")?;
    let cols = projs[0].w.cols;
    let mut ptrs = Vec::with_capacity(projs.len());
    for p in projs.iter_mut() {
        let (format, bytes) = p.w.blocks_data()?;
        super::quant::check(&st.dev, format, bytes, p.w.rows, cols)?;
        fit(st, p.y, m * p.w.rows)?;
        ptrs.push((cached(st, bytes)?, tp(st, p.y, "project_many")?));
    }
    let formats = projs
        .iter()
        .map(|p| p.w.blocks_data().map(|(f, _)| f))
        .collect::<Result<Vec<_>, _>>()?;
    if projs
        .iter()
        .zip(&formats)
        .all(|(p, &f)| uses_gemm(&st.dev, f, p.w.rows, cols, m))
    {
        // Many rows: the activations converted once, one dequantize + GEMM per matrix.
        acts_to_bf16(st, xp, m * cols)?;
        for ((p, (wp, yp)), format) in projs.iter().zip(ptrs).zip(formats) {
            if let Some(row_bytes) = p.w.blocks_data()?.1.len().checked_div(p.w.rows) {
                let w = CachedBlocks {
                    format,
                    ptr: wp,
                    row_bytes,
                    rows: p.w.rows,
                    cols,
                };
                gemm(st, &w, yp, m)?;
            }
        }
        return Ok(());
    }
    for family in [true, false] {
        if let Some(p) = projs.iter().find(
            |p| matches!(p.w.data, MatData::Blocks { format, .. } if is_kq(Some(format)) == family),
        ) {
            let (format, _) = p.w.blocks_data()?;
            quantize(st, xp, Some(format), m, cols)?;
        }
    }
    if m == 1 {
        // One activation row (decode of one sequence): every matrix in one `dec_mv_multi`
        // launch over a job table staged with the step.
        return mv_multi(st, projs, &ptrs, cols);
    }
    for (p, (wp, yp)) in projs.iter().zip(ptrs) {
        if p.w.rows > 0 {
            let (format, _) = p.w.blocks_data()?;
            mv(st, format, wp, yp, m, p.w.rows, cols)?;
        }
    }
    Ok(())
}

/// The mat-vecs of one activation row (already quantized for every family the weights need)
/// by the quantized matrices `projs` (device weights and outputs `ptrs`), in one `dec_mv_multi`
/// launch: job `[W, y, rows, format, first block, rows per warp]` per matrix.
fn mv_multi(
    st: &mut State,
    projs: &[TensorProj<'_>],
    ptrs: &[(u64, u64)],
    cols: usize,
) -> Result<(), ComputeError> {
    let mut jobs: smallvec::SmallVec<[i64; 28]> = smallvec::SmallVec::new();
    let mut blocks = 0usize;
    for (p, &(wp, yp)) in projs.iter().zip(ptrs) {
        let (format, _) = p.w.blocks_data()?;
        let (job, n) = mv_job(format, wp, yp, 0, p.w.rows, cols, blocks)?;
        jobs.extend(job);
        blocks += n;
    }
    let jp = st.rec.stage(&st.dev.stream, as_bytes(&jobs))?;
    launch_mv_jobs(st, jp, projs.len(), blocks, cols, MvJobs::Fixed)
}

/// How a `dec_mv_multi` launch finds its jobs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MvJobs {
    /// Staged by the host, one activation row: `dec_mv_multi` with programmatic dependent
    /// launch.
    Fixed,
    /// The experts an MoE router chose (`dec_mv_multi_rows`): each job's weights from its
    /// product's expert table at the index `sel` holds for its slot (of `experts` entries),
    /// each job on its activation row.
    Routed { sel: u64, experts: i32 },
}

/// Launch `dec_mv_multi` over the `njobs` jobs staged at `jp` (`blocks` blocks in all) on the
/// activations quantized last, as `how` says.
fn launch_mv_jobs(
    st: &mut State,
    jp: u64,
    njobs: usize,
    blocks: usize,
    cols: usize,
    how: MvJobs,
) -> Result<(), ComputeError> {
    let stream = &st.dev.stream;
    let (kq, b32) = (&st.s.kq, &st.s.b32);
    let mut a = [
        jp,
        i(to_i32("mat-vec jobs", njobs)?),
        ptr(b32.aq.get(), stream),
        ptr(b32.ad.get(), stream),
        ptr(kq.aq.get(), stream),
        ptr(kq.ad.get(), stream),
        ptr(kq.bsums.get(), stream),
        i(to_i32("cols", cols)?),
        0,
        0,
    ];
    let cfg = LaunchConfig {
        grid_dim: (int("mat-vec blocks", blocks)? as u32, 1, 1),
        block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    match how {
        MvJobs::Fixed => go(&mut st.rec, &st.dev.k.dec_mv_multi, cfg, &mut a[..8]),
        MvJobs::Routed { sel, experts } => {
            (a[8], a[9]) = (sel, i(experts));
            go(&mut st.rec, &st.dev.k.dec_mv_multi_rows, cfg, &mut a)
        }
    }
}

/// Largest router a device `moe_route` takes (its probabilities in shared memory).
const MAX_ROUTED_EXPERTS: usize = 1024;

pub(super) fn moe_route(
    st: &mut State,
    logits: &Tensor,
    n: usize,
    bias: Option<&[f32]>,
    k: usize,
    norm: bool,
    sel: &mut Tensor,
) -> Result<(), ComputeError> {
    let rows = crate::host_ops::check_route(logits.len(), n, bias, k)?;
    if n > MAX_ROUTED_EXPERTS {
        // Past the kernel's shared memory: chosen on the host (a synchronisation).
        let mut probs = vec![0.0f32; logits.len()];
        download(st, logits, &mut probs)?;
        let mut v = vec![0.0f32; rows * 2 * k];
        crate::host_ops::moe_route_rows(&probs, n, bias, k, norm, &mut v);
        return upload(st, &v, sel);
    }
    fit(st, sel, rows * 2 * k)?;
    if rows == 0 {
        return Ok(());
    }
    let bp = match bias {
        Some(b) => cached(st, as_bytes(b))?,
        None => 0,
    };
    let mut a = [
        tp(st, logits, "moe_route")?,
        bp,
        i(to_i32("experts", n)?),
        i(to_i32("top-k", k)?),
        i(norm as i32),
        tp(st, sel, "moe_route")?,
    ];
    let cfg = LaunchConfig {
        grid_dim: (int("router rows", rows)? as u32, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    go(&mut st.rec, &st.dev.k.t_moe_route, cfg, &mut a)
}

/// Whether `experts` are quantized blocks of one format and byte length (a job of the device's
/// routed mat-vec reads any of them, whichever its slot's choice).
fn uniform_blocks(experts: &[Matrix<'_>]) -> bool {
    let first = experts.first().and_then(|e| e.blocks_data().ok());
    experts.iter().all(|e| match (e.blocks_data(), first) {
        (Ok((f, b)), Some((f0, b0))) => f == f0 && b.len() == b0.len(),
        _ => false,
    })
}

pub(super) fn project_routed(
    st: &mut State,
    x: &Tensor,
    projs: &mut [RoutedProj<'_>],
    sel: &Tensor,
    k: usize,
) -> Result<(), ComputeError> {
    let cols = crate::host_ops::check_routed(projs, x.len(), sel.len(), k)?;
    let per_slot = x.len() != cols;
    let device = projs.len() <= 3
        && cols > 0
        && k > 0
        && projs
            .iter()
            .all(|p| p.experts[0].rows > 0 && uniform_blocks(p.experts));
    if !device {
        // The choice read on the host (a synchronisation), then each slot's products.
        let mut ids = smallvec::SmallVec::<[f32; 16]>::from_elem(0.0, k);
        read_at(st, sel, 0, &mut ids)?;
        let mut xs = Tensor::default();
        let mut ys: smallvec::SmallVec<[Tensor; 3]> =
            projs.iter().map(|_| Tensor::default()).collect();
        for p in projs.iter_mut() {
            fit(st, p.y, k * p.experts[0].rows)?;
        }
        for (s, &id) in ids.iter().enumerate() {
            let e = crate::host_ops::expert_index(id, projs[0].experts.len())?;
            let xin = if per_slot {
                copy_rows(st, x, cols, &[s], &mut xs)?;
                &xs
            } else {
                x
            };
            for (p, y) in projs.iter().zip(ys.iter_mut()) {
                project(st, &p.experts[e], xin, 1, y)?;
            }
            // Row block s of each output: zeroed, then the slot's product added.
            for (p, y) in projs.iter_mut().zip(&ys) {
                let rows = p.experts[0].rows;
                let src = tp(st, y, "project_routed")?;
                let dst = tp(st, p.y, "project_routed")? + (s * rows * 4) as u64;
                let mut z = [dst, rows as u64, f(0.0)];
                go(&mut st.rec, &st.dev.k.t_fill, flat(rows), &mut z)?;
                let mut a = [dst, src, rows as u64, f(1.0)];
                go(&mut st.rec, &st.dev.k.t_add_scaled, flat(rows), &mut a)?;
            }
        }
        return Ok(());
    }
    let xp = tp(st, x, "project_routed")?;
    let m = if per_slot { k } else { 1 };
    for family in [true, false] {
        if let Some(p) = projs.iter().find(|p| {
            matches!(p.experts[0].data, MatData::Blocks { format, .. } if is_kq(Some(format)) == family)
        }) {
            let (format, _) = p.experts[0].blocks_data()?;
            quantize(st, xp, Some(format), m, cols)?;
        }
    }
    let mut tables = [0u64; 3];
    let mut templates: smallvec::SmallVec<[(QuantFormat, u64, u64, usize); 3]> =
        smallvec::SmallVec::new();
    for (j, p) in projs.iter_mut().enumerate() {
        let (format, bytes0) = p.experts[0].blocks_data()?;
        let rows = p.experts[0].rows;
        super::quant::check(&st.dev, format, bytes0, rows, cols)?;
        tables[j] = expert_table(st, p.experts)?;
        // Expert 0's copy only for `mv_job`'s alignment check; the job reads the table.
        let w0 = cached(st, bytes0)?;
        fit(st, p.y, k * rows)?;
        templates.push((format, w0, tp(st, p.y, "project_routed")?, rows));
    }
    // Job s·np + j: slot s's product j, on activation row s when each slot has its own input.
    let mut jobs: smallvec::SmallVec<[i64; 128]> = smallvec::SmallVec::new();
    let mut blocks = 0usize;
    for s in 0..k {
        for (j, &(format, w0, yp, rows)) in templates.iter().enumerate() {
            let (mut job, n) = mv_job(
                format,
                w0,
                yp + (s * rows * 4) as u64,
                0,
                rows,
                cols,
                blocks,
            )?;
            // The product's expert table in place of the weights; slot s picks from it.
            job[0] = tables[j] as i64;
            job[3] |= (s as i64) << 32;
            if per_slot {
                job[3] |= (s as i64) << 8;
            }
            jobs.extend(job);
            blocks += n;
        }
    }
    let jp = st.rec.stage(&st.dev.stream, as_bytes(&jobs))?;
    let how = MvJobs::Routed {
        sel: tp(st, sel, "project_routed")?,
        experts: to_i32("experts", projs[0].experts.len())?,
    };
    launch_mv_jobs(st, jp, k * projs.len(), blocks, cols, how)
}

/// The device address of the table of `experts`' device copies (quantized blocks), made once
/// ([`super::cache::WeightCache::table`]); tables a re-upload dropped on the way stay alive
/// until the launches recorded so far are enqueued (an earlier product of this step may read
/// one).
fn expert_table(st: &mut State, experts: &[Matrix<'_>]) -> Result<u64, ComputeError> {
    let all: smallvec::SmallVec<[&[u8]; 128]> = experts
        .iter()
        .map(|e| e.blocks_data().map(|(_, b)| b))
        .collect::<Result<_, _>>()?;
    let table = st.cache.table(&st.dev.stream, &all)?;
    keep_retired(&mut st.cache, &mut st.rec);
    Ok(table)
}

/// [`crate::ComputeBackend::project_grouped`]: where every product's experts are blocks of one
/// format with a grouped tile kernel, `x` is quantized once per activation family and each
/// product is one `mmq_ids_*` launch over a staged table of tiles (`{expert, first row, rows}`,
/// at most `MMQ_BN` rows each) and the product's device table of expert pointers; otherwise one
/// product per group (the plain kernels on the group's rows).
pub(super) fn project_grouped(
    st: &mut State,
    x: &Tensor,
    projs: &mut [RoutedProj<'_>],
    groups: &[ExpertRows],
) -> Result<(), ComputeError> {
    let cols = crate::host_ops::check_grouped(projs, x.len(), groups)?;
    let total: usize = groups.iter().map(|g| g.rows).sum();
    for p in projs.iter_mut() {
        fit(st, p.y, total * p.experts[0].rows)?;
    }
    if total == 0 || projs.iter().all(|p| p.experts[0].rows == 0) {
        return Ok(());
    }
    if cols == 0 {
        for p in projs.iter_mut() {
            zero(st, p.y)?;
        }
        return Ok(());
    }
    let xp = tp(st, x, "project_grouped")?;
    let grouped = projs.iter().all(|p| {
        uniform_blocks(p.experts)
            && p.experts[0]
                .blocks_data()
                .is_ok_and(|(f, _)| grouped_kernel(&st.dev, f).is_some())
    });
    if !grouped {
        for p in projs.iter_mut() {
            let rows = p.experts[0].rows;
            let yp = tp(st, p.y, "project_grouped")?;
            let mut row0 = 0;
            for g in groups {
                let (xg, yg) = ((row0 * cols * 4) as u64, (row0 * rows * 4) as u64);
                product(st, &p.experts[g.expert], xp + xg, g.rows, yp + yg)?;
                row0 += g.rows;
            }
        }
        return Ok(());
    }
    for family in [true, false] {
        if let Some(p) = projs.iter().find(|p| {
            matches!(p.experts[0].data, MatData::Blocks { format, .. } if is_kq(Some(format)) == family)
        }) {
            let (format, _) = p.experts[0].blocks_data()?;
            quantize(st, xp, Some(format), total, cols)?;
        }
    }
    let mut tiles: Vec<i32> = Vec::with_capacity(4 * (total.div_ceil(MMQ_BN) + groups.len()));
    let mut row0 = 0;
    for g in groups {
        for t0 in (0..g.rows).step_by(MMQ_BN) {
            tiles.extend([
                to_i32("expert", g.expert)?,
                to_i32("grouped row", row0 + t0)?,
                (g.rows - t0).min(MMQ_BN) as i32,
                0,
            ]);
        }
        row0 += g.rows;
    }
    let ntiles = tiles.len() / 4;
    let tiles_p = upload_ints(st, &tiles)?;
    let cols_i = to_i32("cols", cols)?;
    for p in projs.iter_mut() {
        let (format, bytes0) = p.experts[0].blocks_data()?;
        let rows = p.experts[0].rows;
        if rows == 0 {
            continue;
        }
        super::quant::check(&st.dev, format, bytes0, rows, cols)?;
        let table = expert_table(st, p.experts)?;
        let yp = tp(st, p.y, "project_grouped")?;
        let Some((func, kq, smem)) = grouped_kernel(&st.dev, format) else {
            return Err(dev_err(format!("no grouped product kernel for {format:?}")));
        };
        let stream = &st.dev.stream;
        let a = if kq { &st.s.kq } else { &st.s.b32 };
        let mut args = vec![
            table,
            tiles_p,
            ptr(a.aq.get(), stream),
            ptr(a.ad.get(), stream),
        ];
        if kq {
            args.push(ptr(a.bsums.get(), stream));
        }
        args.extend([yp, i(to_i32("rows", rows)?), i(cols_i)]);
        let cfg = LaunchConfig {
            grid_dim: (
                int("grouped tiles", ntiles)? as u32,
                int("weight row tiles", rows.div_ceil(MMQ_BM))? as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        go(&mut st.rec, func, cfg, &mut args)?;
    }
    Ok(())
}

pub(super) fn combine_rows(
    st: &mut State,
    y: &Tensor,
    width: usize,
    slots: &[usize],
    weights: &[f32],
    k: usize,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    let t = crate::host_ops::check_combine_rows(y.len(), width, slots, weights, k)?;
    fit(st, out, t * width)?;
    if t == 0 {
        return Ok(());
    }
    let idx: Vec<i32> = slots
        .iter()
        .map(|&r| to_i32("combine_rows slot", r))
        .collect::<Result<_, _>>()?;
    let ip = upload_ints(st, &idx)?;
    let wp = st.rec.stage(&st.dev.stream, as_bytes(weights))?;
    let mut a = [
        tp(st, y, "combine_rows")?,
        ip,
        wp,
        i(to_i32("routed slots", k)?),
        i(to_i32("width", width)?),
        tp(st, out, "combine_rows")?,
    ];
    go(
        &mut st.rec,
        &st.dev.k.t_moe_combine_rows,
        per_row(t, OPS_THREADS),
        &mut a,
    )
}

pub(super) fn combine_routed(
    st: &mut State,
    y: &Tensor,
    sel: &Tensor,
    k: usize,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    let width = crate::host_ops::check_combine(y.len(), sel.len(), k)?;
    fit(st, out, width)?;
    let mut a = [
        tp(st, y, "combine_routed")?,
        tp(st, sel, "combine_routed")?,
        i(to_i32("routed slots", k)?),
        width as u64,
        tp(st, out, "combine_routed")?,
    ];
    go(&mut st.rec, &st.dev.k.t_moe_combine, flat(width), &mut a)
}

pub(super) fn add_bias(st: &mut State, y: &mut Tensor, bias: &[f32]) -> Result<(), ComputeError> {
    crate::host_ops::check_bias(y.len(), bias)?;
    let bp = cached(st, as_bytes(bias))?;
    let mut a = [
        tp(st, y, "add_bias")?,
        bp,
        y.len() as u64,
        i(to_i32("bias width", bias.len())?),
    ];
    go(&mut st.rec, &st.dev.k.t_add_bias, flat(y.len()), &mut a)
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
        &mut st.rec,
        &st.dev.k.t_norm,
        per_row(len / d, OPS_THREADS),
        &mut a,
    )
}

/// [`crate::ComputeBackend::norm`]: an RMSNorm without bias as `t_add_norm` without a branch
/// (its output quantized for the next product, as after a residual step: the first layer's
/// input norm), any other norm as `t_norm`.
pub(super) fn norm(
    st: &mut State,
    n: &Norm<'_>,
    x: &Tensor,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    fit(st, out, x.len())?;
    let (xp, op) = (tp(st, x, "norm")?, tp(st, out, "norm")?);
    crate::host_ops::check_norm(n, x.len())?;
    let len = x.len();
    let d = n.weight.len();
    let rms = match rms_parts(st, n)? {
        Some(p) if len > 0 => p,
        _ => return norm_launch(st, n, xp, op, len),
    };
    add_norm_launch(
        st,
        AddNormLaunch {
            x: xp,
            branch: 0,
            post: (0, 0.0, 0.0),
            alpha: 1.0,
            next: rms,
            out: op,
            n: len,
            width: d,
        },
    )
}

pub(super) fn norm_inplace(
    st: &mut State,
    n: &Norm<'_>,
    x: &mut Tensor,
) -> Result<(), ComputeError> {
    let xp = tp(st, x, "norm")?;
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
    let xp = tp(st, x, "rope")?;
    let pos: Vec<i32> = positions
        .iter()
        .map(|&p| to_i32("position", p))
        .collect::<Result<_, _>>()?;
    let pp = upload_ints(st, &pos)?;
    let fp = inv_freq_ptr(st, cfg)?;
    let mut a = [
        xp,
        pp,
        fp,
        i(to_i32("heads", n_heads)?),
        i(to_i32("head_dim", cfg.head_dim)?),
        i(to_i32("rotary_dim", cfg.rotary_dim)?),
        i(cfg.interleaved as i32),
        cfg.attention_factor().to_bits(),
    ];
    go(
        &mut st.rec,
        &st.dev.k.t_rope,
        per_row(positions.len() * n_heads, 64),
        &mut a,
    )
}

/// Rows of a prompt chunk, and keys it attends to (its position after it), from which its
/// attention runs as GEMMs ([`attend_gemm`]): shorter chunks stay on the tile kernel, which
/// takes every sequence of a batch in one launch (H200: SmolLM2 16 × pp128 0.66× as GEMMs).
const ATT_GEMM_MIN_ROWS: usize = 128;
/// Keys (the chunk's end position) from which a chunk of [`ATT_GEMM_MIN_ROWS`] rows or more runs
/// as GEMMs: below it the tile kernel was as fast (H200, cuda_bench).
const ATT_GEMM_MIN_KEYS: usize = 512;
/// Query rows per piece of [`attend_gemm`]: each piece scores only the keys its rows can see
/// (causal, sliding window), so smaller pieces waste less of the score GEMM.
const ATT_GEMM_PIECE_ROWS: usize = 512;
/// Most attention scores held at once by [`attend_gemm`] (f32, 512 MiB).
const ATT_GEMM_MAX_SCORES: usize = 128 << 20;

/// The attention of one long prompt chunk `s` (its keys and values already stored) through
/// cuBLAS, per piece of query rows: the scores `scale · Q_h K_gᵀ` of every query head `h`
/// (kv head `g = h / (nq / nkv)`) against the keys the piece's rows can see (from the first
/// row's window start to the last row's position) as one batched f32 GEMM into `st.s.att`
/// (`[nq][rows][keys]`), the masked softmax in place (`t_attn_softmax`: causal, sliding window,
/// soft-cap, sinks), then `O_h = P_h V_g` as a second batched GEMM straight into the output
/// rows. Same f32 arithmetic as the tile kernel, in another order. A cache stored in another
/// type than f32 (`kv`) is first widened to f32 scratch over the keys the chunk sees
/// (`t_kv_widen`). `(window, sinks)`: the window code and the sinks' device copy of
/// [`attention_launch`].
fn attend_gemm(
    st: &mut State,
    s: &crate::KvSlot<'_>,
    cache: (u64, u64),
    kv: KvType,
    rows: BatchRows,
    p: &AttentionParams,
    (window, sinks): (i32, u64),
) -> Result<(), ComputeError> {
    let BatchRows { q: qp, out: op } = rows;
    let (nq, nkv, hd) = (p.n_q_heads, p.n_kv_heads, p.head_dim);
    let end = s.start + s.rows;
    let piece = (ATT_GEMM_MAX_SCORES / (nq * end).max(1)).clamp(1, ATT_GEMM_PIECE_ROWS);
    let first_key = |first: usize| match p.sliding_window {
        Some(w) if w > 0 => (first + 1).saturating_sub(w),
        _ => 0,
    };
    let (kc, vc, base) = widen_kv(st, cache, kv, first_key(s.start), end, nkv * hd)?;
    {
        let State {
            dev, s: sc, rec, ..
        } = st;
        if let Some(old) = sc.att.at_least_keep(&dev.stream, nq * piece * end)? {
            rec.keep_any(old);
        }
    }
    let sp = ptr(st.s.att.get(), &st.dev.stream);
    let f32b = std::mem::size_of::<f32>() as u64;
    let qd = (nq * hd) as u64;
    let hd_i = to_i32("head_dim", hd)?;
    let (kvd_i, qd_i) = (to_i32("kv width", nkv * hd)?, to_i32("q width", nq * hd)?);
    let nq_i = to_i32("q heads", nq)?;
    for t0 in (0..s.rows).step_by(piece) {
        let m = piece.min(s.rows - t0);
        let row = (s.row0 + t0) as u64;
        // The keys the piece's rows see: k0 ..= the last row's position.
        let first = s.start + t0;
        let k0 = first_key(first);
        let keys = first + m - k0;
        let keys_i = to_i32("attention keys", keys)?;
        let g = |h: usize| ((h / (nq / nkv)) * hd + (k0 - base) * nkv * hd) as u64;
        // Per head: K_g / V_g, the head's query (output) columns of the piece's first row, its
        // score matrix.
        let kv_ptrs = |cache: u64| -> Vec<u64> { (0..nq).map(|h| cache + g(h) * f32b).collect() };
        let q_ptrs: Vec<u64> = (0..nq)
            .map(|h| qp + (row * qd + (h * hd) as u64) * f32b)
            .collect();
        let o_ptrs: Vec<u64> = (0..nq)
            .map(|h| op + (row * qd + (h * hd) as u64) * f32b)
            .collect();
        let s_ptrs: Vec<u64> = (0..nq).map(|h| sp + (h * m * keys) as u64 * f32b).collect();
        let stage = |st: &mut State, v: &[u64]| st.rec.stage(&st.dev.stream, as_bytes(v));
        let (ka, qa, sa) = (
            stage(st, &kv_ptrs(kc))?,
            stage(st, &q_ptrs)?,
            stage(st, &s_ptrs)?,
        );
        let (va, oa) = (stage(st, &kv_ptrs(vc))?, stage(st, &o_ptrs)?);
        let m_i = to_i32("attention rows", m)?;
        // Column-major: S_hᵀ (keys × m, ld keys) = K_g (keys × hd) · Q_hᵀ (hd × m).
        st.rec.push_batched(BatchedGemm {
            trans_a: true,
            trans_b: false,
            m: keys_i,
            n: m_i,
            k: hd_i,
            a: ka,
            lda: kvd_i,
            b: qa,
            ldb: qd_i,
            c: sa,
            ldc: keys_i,
            batch: nq_i,
            alpha: p.scale.to_bits(),
        });
        let (p0, k0_i) = (to_i32("position", first)?, to_i32("first key", k0)?);
        let cfg = LaunchConfig {
            grid_dim: (m as u32, nq as u32, 1),
            block_dim: (OPS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut a = [
            sp,
            i(m_i),
            i(keys_i),
            i(p0),
            i(k0_i),
            i(window),
            f(p.softcap.unwrap_or(0.0)),
            sinks,
        ];
        go(&mut st.rec, &st.dev.k.t_attn_softmax, cfg, &mut a)?;
        // O_hᵀ (hd × m, ld nq·hd) = V_gᵀ (hd × keys) · P_hᵀ (keys × m).
        st.rec.push_batched(BatchedGemm {
            trans_a: false,
            trans_b: false,
            m: hd_i,
            n: m_i,
            k: keys_i,
            a: va,
            lda: kvd_i,
            b: sa,
            ldb: keys_i,
            c: oa,
            ldc: qd_i,
            batch: nq_i,
            alpha: 1f32.to_bits(),
        });
    }
    Ok(())
}

/// Device addresses of the batch's query rows and attention output rows (f32, `[rows][nq ·
/// head_dim]` each), for [`attend_gemm`].
#[derive(Clone, Copy)]
struct BatchRows {
    q: u64,
    out: u64,
}

/// The K and V caches `cache` as f32 for [`attend_gemm`]: as they are when stored as f32, else
/// rows `k0..end` (of `kvd` values) widened into `st.s.kvw` (`t_kv_widen`). Returns the two
/// pointers and the cache row at which they start. Errors: allocation failure.
fn widen_kv(
    st: &mut State,
    cache: (u64, u64),
    kv: KvType,
    k0: usize,
    end: usize,
    kvd: usize,
) -> Result<(u64, u64, usize), ComputeError> {
    if kv == KvType::F32 {
        return Ok((cache.0, cache.1, 0));
    }
    let n = (end - k0) * kvd;
    {
        let State {
            dev, s: sc, rec, ..
        } = st;
        if let Some(old) = sc.kvw.at_least_keep(&dev.stream, 2 * n)? {
            rec.keep_any(old);
        }
    }
    let wp = ptr(st.s.kvw.get(), &st.dev.stream);
    let to = [wp, wp + (n * std::mem::size_of::<f32>()) as u64];
    for (src, dst) in [cache.0, cache.1].into_iter().zip(to) {
        let mut a = [src, dst, (k0 * kvd) as u64, n as u64, i(kv_code(kv))];
        go(&mut st.rec, &st.dev.k.t_kv_widen, flat(n), &mut a)?;
    }
    Ok((to[0], to[1], k0))
}

/// What `t_attention` and `t_rope_attend` take of `p` alike: the window code (0 none, -1 no
/// keys, else the window's length), the attention sinks' device copy (0: none) and the launch
/// (one block of `ATTN_THREADS` per query head and row). Errors: a window above `i32::MAX`;
/// device failures.
fn attention_launch(
    st: &mut State,
    p: &AttentionParams,
    rows: usize,
) -> Result<(i32, u64, LaunchConfig), ComputeError> {
    let window = match p.sliding_window {
        None => 0,
        Some(0) => -1,
        Some(w) => to_i32("sliding window", w)?,
    };
    let sinks = match p.sinks {
        Some(s) => cached(st, as_bytes(s))?,
        None => 0,
    };
    let cfg = LaunchConfig {
        grid_dim: (p.n_q_heads as u32, rows as u32, 1),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    Ok((window, sinks, cfg))
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
    let mut info = Vec::with_capacity(rows * 3);
    let (caches, kv) = kv_ptrs(st, at.seqs, "attend")?;
    kv.check_head_dim(p.head_dim)?;
    let kt = i(kv_code(kv));
    for (s, &(kc, vc)) in at.seqs.iter().zip(&caches) {
        for pos in s.start..s.start + s.rows {
            info.extend([kc as i64, vc as i64, pos as i64]);
        }
    }
    if rows == 0 {
        return Ok(());
    }
    // Per row: its sequence's K and V cache and its position (staged: they change per step).
    let ip = st.rec.stage(&st.dev.stream, as_bytes(&info))?;
    let (qp, kp, vp, op) = (
        tp(st, at.q, "attend")?,
        tp(st, at.k, "attend")?,
        tp(st, at.v, "attend")?,
        tp(st, out, "attend")?,
    );
    let kvd_i = to_i32("kv_dim", kvd)?;
    let mut a = [kp, vp, ip, i(kvd_i), kt];
    go(
        &mut st.rec,
        &st.dev.k.t_kv_store,
        per_row(rows, OPS_THREADS),
        &mut a,
    )?;
    let (window, sinks, cfg) = attention_launch(st, p, rows)?;
    let longest = at.seqs.iter().map(|s| s.rows).max().unwrap_or(0);
    let tiles_fit =
        p.head_dim > 0 && p.head_dim <= ATT_TILE_MAX_HEAD_DIM && p.head_dim.is_multiple_of(4);
    // Long prompt chunks attend through cuBLAS (`attend_gemm`), the other sequences of the
    // batch by tiles (which address any rows, unlike the per-row kernel).
    let by_gemm: Vec<bool> = at
        .seqs
        .iter()
        .map(|s| {
            tiles_fit
                && window >= 0
                && st.dev.blas.is_some()
                && s.rows >= ATT_GEMM_MIN_ROWS
                && s.start + s.rows >= ATT_GEMM_MIN_KEYS
        })
        .collect();
    let tiled = tiles_fit && (longest >= ATT_TILE_MIN_ROWS || by_gemm.contains(&true));
    for ((s, &cache), _) in at
        .seqs
        .iter()
        .zip(&caches)
        .zip(&by_gemm)
        .filter(|(_, &g)| g)
    {
        let rows = BatchRows { q: qp, out: op };
        attend_gemm(st, s, cache, kv, rows, p, (window, sinks))?;
    }
    // Per row (`info`) or, for prompt chunks, per tile of up to ATT_BQ consecutive rows of one
    // sequence: {k cache, v cache, first row, its position, rows}.
    let (table, cfg) = if tiled {
        let mut tiles = Vec::new();
        for ((s, &(kc, vc)), _) in at
            .seqs
            .iter()
            .zip(&caches)
            .zip(&by_gemm)
            .filter(|(_, &g)| !g)
        {
            for t0 in (0..s.rows).step_by(ATT_BQ) {
                let n = ATT_BQ.min(s.rows - t0);
                let (row, pos) = ((s.row0 + t0) as i64, (s.start + t0) as i64);
                tiles.extend([kc as i64, vc as i64, row, pos, n as i64]);
            }
        }
        if tiles.is_empty() {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (
                p.n_q_heads as u32,
                int("attention tiles", tiles.len() / 5)? as u32,
                1,
            ),
            block_dim: (ATT_TILE_THREADS, 1, 1),
            shared_mem_bytes: att_tile_smem(p.head_dim) as u32,
        };
        (st.rec.stage(&st.dev.stream, as_bytes(&tiles))?, cfg)
    } else {
        (ip, cfg)
    };
    let mut a = [
        qp,
        table,
        op,
        i(to_i32("q heads", p.n_q_heads)?),
        i(to_i32("kv heads", p.n_kv_heads)?),
        i(to_i32("head_dim", p.head_dim)?),
        f(p.scale),
        i(window),
        f(p.softcap.unwrap_or(0.0)),
        sinks,
        kt,
    ];
    let k = &st.dev.k;
    let func = if tiled {
        // One kernel per register width.
        &k.t_attention_tiles[match p.head_dim {
            0..=64 => 0,
            65..=128 => 1,
            _ => 2,
        }]
    } else {
        &k.t_attention
    };
    go(&mut st.rec, func, cfg, &mut a)
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
    let gp = match gate {
        Some(g) => {
            check("gated activation up", up.len(), g.len(), "values")?;
            tp(st, g, "gated_activation")?
        }
        None => 0,
    };
    let n = up.len();
    let (kq, b32) = wanted_families(st, n, n.is_multiple_of(256), n.is_multiple_of(32));
    if !(kq || b32) || n == 0 {
        let mut a = [gp, tp(st, up, "activation")?, n as u64, i(act_code(act))];
        return go(&mut st.rec, &st.dev.k.t_act, flat(n), &mut a);
    }
    // With the quantization for the next product (the down projection): one warp per chunk.
    let t = quant_targets(st, n, kq, b32)?;
    let upp = tp(st, up, "activation")?;
    let mut a = [
        gp,
        upp,
        n as u64,
        i(act_code(act)),
        t[0],
        t[1],
        t[2],
        t[3],
        t[4],
    ];
    let chunks = n / if kq { 256 } else { 32 };
    go(
        &mut st.rec,
        &st.dev.k.t_act_quant,
        warp_grid(chunks),
        &mut a,
    )?;
    st.pq_next = Some(PreQuant { x: upp, n, kq, b32 });
    Ok(())
}

pub(super) fn add_scaled(
    st: &mut State,
    x: &mut Tensor,
    y: &Tensor,
    alpha: f32,
) -> Result<(), ComputeError> {
    check("residual branch", y.len(), x.len(), "values")?;
    let mut a = [
        tp(st, x, "add_scaled")?,
        tp(st, y, "add_scaled")?,
        x.len() as u64,
        f(alpha),
    ];
    go(&mut st.rec, &st.dev.k.t_add_scaled, flat(x.len()), &mut a)
}

pub(super) fn add_gated(
    st: &mut State,
    x: &mut Tensor,
    y: &Tensor,
    gate: &Tensor,
    width: usize,
) -> Result<(), ComputeError> {
    crate::host_ops::check_gated(x.len(), y.len(), gate.len(), width)?;
    if x.is_empty() {
        return Ok(());
    }
    let mut a = [
        tp(st, x, "add_gated")?,
        tp(st, y, "add_gated")?,
        tp(st, gate, "add_gated")?,
        x.len() as u64,
        width as u64,
    ];
    go(&mut st.rec, &st.dev.k.t_add_gated, flat(x.len()), &mut a)
}

pub(super) fn scale_softcap(
    st: &mut State,
    x: &mut Tensor,
    divisor: f32,
    softcap: Option<f32>,
) -> Result<(), ComputeError> {
    let mut a = [
        tp(st, x, "scale_softcap")?,
        x.len() as u64,
        f(divisor),
        f(softcap.unwrap_or(0.0)),
    ];
    go(
        &mut st.rec,
        &st.dev.k.t_scale_softcap,
        flat(x.len()),
        &mut a,
    )
}

/// Where an embedding lookup's token ids are.
#[derive(Clone, Copy)]
enum Ids<'a> {
    /// Given by the host (staged in the step's arena).
    Host(&'a [u32]),
    /// The choices of the last `argmax_rows_later`, `rows` of them, in `OpScratch::best`.
    Best(usize),
}

impl Ids<'_> {
    fn len(&self) -> usize {
        match self {
            Ids::Host(v) => v.len(),
            Ids::Best(rows) => *rows,
        }
    }
}

/// [`crate::ComputeBackend::embed`] on the device: `t_embed` for an f32/f16 table, the
/// quantized formats of `t_embed_*` (ggml's dequantizers, dequant.cu) for a table of blocks;
/// other block formats are dequantized on the host row by row and uploaded.
pub(super) fn embed(
    st: &mut State,
    table: FloatTable<'_>,
    width: usize,
    ids: &[u32],
    scale: f32,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    let rows = table_rows(table, width)?;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= rows) {
        return Err(ComputeError::ShapeMismatch {
            what: "embedding row (token id < rows)",
            expected: rows,
            got: id as usize,
            unit: "row",
        });
    }
    embed_rows(st, table, (rows, width), Ids::Host(ids), scale, out)
}

/// [`crate::ComputeBackend::embed_chosen`] on the device: the choices of the last
/// [`argmax_rows_later`] looked up where they are (no wait); choices of an earlier step, or a
/// table only the host can read, wait for them ([`take_chosen`]).
pub(super) fn embed_chosen(
    st: &mut State,
    table: FloatTable<'_>,
    width: usize,
    chosen: &Chosen,
    scale: f32,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    let rows = table_rows(table, width)?;
    let latest = chosen.host.is_none() && st.ops.best_ticket == Some(chosen.ticket);
    if latest && embed_kernel(st, table, width).is_some() {
        return embed_rows(st, table, (rows, width), Ids::Best(chosen.rows), scale, out);
    }
    let mut picks = Vec::with_capacity(chosen.rows);
    take_chosen(st, chosen, &mut picks)?;
    let ids = crate::host_ops::chosen_ids(&picks, rows);
    embed_rows(st, table, (rows, width), Ids::Host(&ids), scale, out)
}

/// Rows of an embedding table of `width`. Errors: a table that is not whole rows.
fn table_rows(table: FloatTable<'_>, width: usize) -> Result<usize, ComputeError> {
    let rows = table.len().checked_div(width).unwrap_or(0);
    if width == 0 || rows * width != table.len() {
        return Err(ComputeError::ShapeMismatch {
            what: "embedding table (whole rows of the width)",
            expected: rows.max(1) * width,
            got: table.len(),
            unit: "values",
        });
    }
    Ok(rows)
}

/// The kernel that looks up rows of `table` on the device and its `f16` argument (`t_embed`),
/// or `None` for block formats without one (or rows that are not whole blocks).
fn embed_kernel(
    st: &State,
    table: FloatTable<'_>,
    width: usize,
) -> Option<(cudarc::driver::CudaFunction, Option<i32>)> {
    let k = &st.dev.k;
    match table {
        FloatTable::F32(_) => Some((k.t_embed.clone(), Some(0))),
        FloatTable::F16(_) => Some((k.t_embed.clone(), Some(1))),
        FloatTable::Blocks { format, .. } => {
            if !width.is_multiple_of(format.block_elems()) {
                return None;
            }
            let f = match format {
                QuantFormat::Q4_0 => &k.t_embed_q4_0,
                QuantFormat::Q5_0 => &k.t_embed_q5_0,
                QuantFormat::Q8_0 => &k.t_embed_q8_0,
                QuantFormat::Q4_K => &k.t_embed_q4_k,
                QuantFormat::Q6_K => &k.t_embed_q6_k,
                _ => return None,
            };
            Some((f.clone(), None))
        }
    }
}

/// Row `r` of `out` (fit to `ids.len() · width`) = row `ids[r]` of `table` (`[rows, width]`,
/// [`table_rows`] of the caller) times `scale`; the ids are in range (checked by the caller, or
/// choices of a product of this table's rows).
fn embed_rows(
    st: &mut State,
    table: FloatTable<'_>,
    (rows, width): (usize, usize),
    ids: Ids<'_>,
    scale: f32,
    out: &mut Tensor,
) -> Result<(), ComputeError> {
    let n = ids.len();
    fit(st, out, n * width)?;
    if n == 0 {
        return Ok(());
    }
    let Some((func, f16)) = embed_kernel(st, table, width) else {
        // A block format without a device kernel: the few looked-up rows are dequantized on
        // the host (ggml's dequantizers) and copied over.
        let Ids::Host(ids) = ids else {
            return Err(dev_err(
                "embed: chosen ids for a table the device cannot read",
            ));
        };
        let mut rows_host = vec![0.0; n * width];
        crate::host_ops::embed(table, ids, scale, &mut rows_host)?;
        return upload(st, &rows_host, out);
    };
    let bytes = match table {
        FloatTable::F32(v) => as_bytes(v),
        FloatTable::F16(v) => as_bytes(v),
        FloatTable::Blocks { bytes, .. } => bytes,
    };
    let tpp = cached(st, bytes)?;
    let (ip, bp) = match ids {
        Ids::Host(ids) => {
            let idx: Vec<i32> = ids.iter().map(|&v| v as i32).collect();
            (upload_ints(st, &idx)?, 0)
        }
        Ids::Best(_) => match &st.ops.best {
            Some(b) => (0, ptr(b, &st.dev.stream)),
            None => return Err(dev_err("embed: no greedy choices on the device")),
        },
    };
    let op = tp(st, out, "embed")?;
    let mut a = vec![
        tpp,
        ip,
        bp,
        i(to_i32("embedding rows", rows)?),
        op,
        i(to_i32("width", width)?),
        f(scale),
    ];
    if let Some(f16) = f16 {
        a.push(i(f16));
    }
    go(&mut st.rec, &func, per_row(n, OPS_THREADS), &mut a)
}

/// The families `(kq, b32)` a fused operation quantizes its `n` output values to: of those
/// its width allows, the ones a product of that size read ([`ActFamilies`]).
fn wanted_families(st: &State, n: usize, kq: bool, b32: bool) -> (bool, bool) {
    st.ops.act_families.wanted(n, kq, b32)
}

/// Device pointers `[q32, d32, qk, dk, bsk]` of the activation buffers, sized for `n` values,
/// for the families wanted (`kq`: Q8_K, `b32`: 32-value blocks), 0 for the others.
fn quant_targets(st: &mut State, n: usize, kq: bool, b32: bool) -> Result<[u64; 5], ComputeError> {
    let State { dev, s, rec, .. } = st;
    let stream = &dev.stream;
    let mut keep = |old: Option<Box<dyn Any + Send>>| {
        if let Some(old) = old {
            rec.keep_any(old);
        }
    };
    let mut t = [0u64; 5];
    if b32 {
        keep(s.b32.aq.at_least_keep(stream, n)?);
        keep(s.b32.ad.at_least_keep(stream, n / 32)?);
        t[0] = ptr(s.b32.aq.get(), stream);
        t[1] = ptr(s.b32.ad.get(), stream);
    }
    if kq {
        keep(s.kq.aq.at_least_keep(stream, n)?);
        keep(s.kq.ad.at_least_keep(stream, n / 256)?);
        keep(s.kq.bsums.at_least_keep(stream, n / 256 * 16)?);
        t[2] = ptr(s.kq.aq.get(), stream);
        t[3] = ptr(s.kq.ad.get(), stream);
        t[4] = ptr(s.kq.bsums.get(), stream);
    }
    Ok(t)
}

/// An RMSNorm without bias: (weight pointer, eps, offset); `None` for any other norm.
fn rms_parts(st: &mut State, n: &Norm<'_>) -> Result<Option<(u64, f32, f32)>, ComputeError> {
    match (n.kind, n.bias) {
        (NormKind::Rms { offset }, None) => {
            Ok(Some((cached(st, as_bytes(n.weight))?, n.eps, offset)))
        }
        _ => Ok(None),
    }
}

/// [`crate::ComputeBackend::add_norm`] as one `t_add_norm` launch (a block per row), its output
/// quantized for the next product. `Ok(false)`: not fused (a LayerNorm or a norm bias), nothing
/// recorded.
pub(super) fn add_norm(
    st: &mut State,
    x: &mut Tensor,
    branch: &Tensor,
    rn: &ResidualNorm<'_>,
    out: &mut Tensor,
) -> Result<bool, ComputeError> {
    check("residual branch", branch.len(), x.len(), "values")?;
    crate::host_ops::check_norm(&rn.next, x.len())?;
    let d = rn.next.weight.len();
    if let Some(p) = &rn.post {
        crate::host_ops::check_norm(p, x.len())?;
        check("post norm width", p.weight.len(), d, "values")?;
    }
    let Some((nw, eps2, off2)) = rms_parts(st, &rn.next)? else {
        return Ok(false);
    };
    let (pw, eps, off) = match &rn.post {
        Some(p) => match rms_parts(st, p)? {
            Some(v) => v,
            None => return Ok(false),
        },
        None => (0, 0.0, 0.0),
    };
    fit(st, out, x.len())?;
    if x.is_empty() {
        return Ok(true);
    }
    let (xp, bp, op) = (
        tp(st, x, "add_norm")?,
        tp(st, branch, "add_norm")?,
        tp(st, out, "add_norm")?,
    );
    add_norm_launch(
        st,
        AddNormLaunch {
            x: xp,
            branch: bp,
            post: (pw, eps, off),
            alpha: rn.alpha,
            next: (nw, eps2, off2),
            out: op,
            n: x.len(),
            width: d,
        },
    )?;
    Ok(true)
}

/// One `t_add_norm` launch: device pointers and the RMSNorms' `(weight, eps, offset)` (a
/// weight pointer 0: no post norm; `branch` 0: no residual add, only the norm of `x`).
struct AddNormLaunch {
    x: u64,
    branch: u64,
    post: (u64, f32, f32),
    alpha: f32,
    next: (u64, f32, f32),
    out: u64,
    /// Values of `x` (whole rows of `width`).
    n: usize,
    width: usize,
}

/// `t_add_norm` over the `n / width` rows of `l` (a block per row), its output quantized for
/// the next product's activation family ([`wanted_families`]), remembered as [`PreQuant`].
fn add_norm_launch(st: &mut State, l: AddNormLaunch) -> Result<(), ComputeError> {
    let (n, d) = (l.n, l.width);
    let (kq, b32) = wanted_families(st, n, d.is_multiple_of(256), d.is_multiple_of(32));
    let t = quant_targets(st, n, kq, b32)?;
    let mut a = [
        l.x,
        l.branch,
        l.post.0,
        f(l.alpha),
        l.next.0,
        l.out,
        i(to_i32("norm width", d)?),
        f(l.post.1),
        f(l.post.2),
        f(l.next.1),
        f(l.next.2),
        t[0],
        t[1],
        t[2],
        t[3],
        t[4],
    ];
    go(
        &mut st.rec,
        &st.dev.k.t_add_norm,
        per_row(n / d, RN_THREADS),
        &mut a,
    )?;
    st.pq_next = Some(PreQuant {
        x: l.out,
        n,
        kq,
        b32,
    });
    Ok(())
}

/// The device copy of RoPE's inverse frequencies for `cfg`.
fn inv_freq_ptr(st: &mut State, cfg: &RopeConfig) -> Result<u64, ComputeError> {
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
    Ok(ptr(&ops.inv_freq[k].1, &dev.stream))
}

/// [`crate::ComputeBackend::rope_attend`] as one `t_rope_attend` launch (a block per row and
/// query head) when every sequence brings one new row (decode) and the q/k norms are per-head
/// RMSNorms of equal eps and offset; its output quantized for the o product. `Ok(false)`: not
/// fused, nothing recorded.
pub(super) fn rope_attend(
    st: &mut State,
    a: &mut RopeAttend<'_, '_>,
    p: &AttentionParams,
    out: &mut Tensor,
) -> Result<bool, ComputeError> {
    let hd = p.head_dim;
    let per_head = |n: &Option<Norm<'_>>| {
        n.as_ref().is_none_or(|n| {
            n.weight.len() == hd && n.bias.is_none() && matches!(n.kind, NormKind::Rms { .. })
        })
    };
    let same = match (&a.q_norm, &a.k_norm) {
        (Some(q), Some(k)) => q.eps == k.eps && q.kind == k.kind,
        _ => true,
    };
    let rope_ok = a
        .rope
        .is_none_or(|r| r.head_dim == hd && r.rotary_dim / 2 <= MAX_ROT_HALF);
    if !(a.seqs.iter().all(|s| s.rows == 1)
        && per_head(&a.q_norm)
        && per_head(&a.k_norm)
        && same
        && rope_ok
        && hd <= MAX_HEAD_DIM)
    {
        return Ok(false);
    }
    {
        let at = Attend {
            q: a.q,
            k: a.k,
            v: a.v,
            seqs: a.seqs,
        };
        crate::host_ops::check_attend(&at, p)?;
    }
    check(
        "rope_attend positions",
        a.positions.len(),
        a.seqs.len(),
        "rows",
    )?;
    let rows = a.seqs.len();
    if rows > MAX_GRID_YZ {
        // One grid row (y or z) per decode row.
        return Err(ComputeError::ShapeMismatch {
            what: "decode attention rows in one step (a grid dimension)",
            expected: MAX_GRID_YZ,
            got: rows,
            unit: "rows at most",
        });
    }
    fit(st, out, a.q.len())?;
    if rows == 0 {
        return Ok(true);
    }
    let mut info = Vec::with_capacity(rows * 3);
    let (caches, kv) = kv_ptrs(st, a.seqs, "rope_attend")?;
    kv.check_head_dim(hd)?;
    for (s, &(kc, vc)) in a.seqs.iter().zip(&caches) {
        info.extend([kc as i64, vc as i64, s.start as i64]);
    }
    let ip = st.rec.stage(&st.dev.stream, as_bytes(&info))?;
    let (mut eps, mut off) = (0.0, 0.0);
    let mut norm_ptr = |st: &mut State, n: &Option<Norm<'_>>| -> Result<u64, ComputeError> {
        match n {
            Some(n) => {
                let (w, e, o) = rms_parts(st, n)?.unwrap_or((0, 0.0, 0.0));
                (eps, off) = (e, o);
                Ok(w)
            }
            None => Ok(0),
        }
    };
    let qn = norm_ptr(st, &a.q_norm)?;
    let kn = norm_ptr(st, &a.k_norm)?;
    let (inv, rot, interleaved, mscale) = match a.rope {
        Some(r) if r.rotary_dim > 0 => (
            inv_freq_ptr(st, r)?,
            r.rotary_dim,
            r.interleaved,
            r.attention_factor(),
        ),
        _ => (0, 0, false, 1.0),
    };
    let (window, sinks, cfg) = attention_launch(st, p, rows)?;
    let n = a.q.len();
    let (kq, b32) = wanted_families(st, n, hd.is_multiple_of(256), hd.is_multiple_of(32));
    let t = quant_targets(st, n, kq, b32)?;
    let (qp, kp, vp, op) = (
        tp(st, a.q, "rope_attend")?,
        tp(st, a.k, "rope_attend")?,
        tp(st, a.v, "rope_attend")?,
        tp(st, out, "rope_attend")?,
    );
    // The key-split kernels (flash decoding, `attn_split.rs`) over every row of the batch (one
    // block per kv head with its query heads, key split and row, then one merge block per
    // query head and row; with one split the split blocks write the heads themselves),
    // whenever they take the head shape, without attention sinks or a RoPE attention factor;
    // else `t_rope_attend`. They read each key once for the kv head's
    // query heads where `t_rope_attend` reads it once per query head, one key per warp at a
    // time: at 64 sequences of 8 B shapes (8 kv heads, enough blocks without a split) the
    // latter took 411 µs a layer (H100). Keys split over blocks for caches of more than 32
    // positions while kv heads × rows leave multiprocessors idle, and for every cache past 512
    // (`row_attention_splits`); the count follows the cache's size, not the position, so a
    // decode step still replays as one graph.
    let kvd = p.n_kv_heads * hd;
    let context = a
        .seqs
        .iter()
        .map(|s| s.k_cache.len() / kvd.max(1))
        .max()
        .unwrap_or(0);
    let splits =
        super::attn_split::row_attention_splits(context, window, p.n_kv_heads * rows, st.dev.sms);
    let grp = p.n_q_heads / p.n_kv_heads.max(1);
    let split = match super::attn_split::split_kernel(&st.dev, grp, hd) {
        Some(f) if sinks == 0 && mscale == 1.0 => Some(f.clone()),
        _ => None,
    };
    if let Some(func) = split {
        let sp = split_scratch(st, rows * p.n_q_heads * splits * (hd + 2))?;
        let nq = i(to_i32("q heads", p.n_q_heads)?);
        let hd_i = i(to_i32("head_dim", hd)?);
        let splits_i = i(to_i32("key splits", splits)?);
        let mut args = [
            qp,
            kp,
            vp,
            qn,
            kn,
            inv,
            sp,
            ip,
            nq,
            i(to_i32("kv heads", p.n_kv_heads)?),
            hd_i,
            i(to_i32("rotary dim", rot)?),
            i(interleaved as i32),
            f(eps),
            f(off),
            f(p.scale),
            i(window),
            f(p.softcap.unwrap_or(0.0)),
            splits_i,
            i(kv_code(kv)),
            op,
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
        ];
        let cfg = LaunchConfig {
            grid_dim: (p.n_kv_heads as u32, splits as u32, rows as u32),
            block_dim: (super::attn_split::ATT_SPLIT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        go(&mut st.rec, &func, cfg, &mut args)?;
        st.pq_next = Some(PreQuant { x: op, n, kq, b32 });
        if splits == 1 {
            // The split kernel wrote (and quantized) the heads itself.
            return Ok(true);
        }
        let merge = LaunchConfig {
            grid_dim: (p.n_q_heads as u32, rows as u32, 1),
            block_dim: (super::attn_split::DEC_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = [sp, op, hd_i, splits_i, t[0], t[1], t[2], t[3], t[4]];
        go(&mut st.rec, &st.dev.k.dec_attn_merge, merge, &mut args)?;
        return Ok(true);
    }
    let mut args = [
        qp,
        kp,
        vp,
        ip,
        qn,
        kn,
        inv,
        op,
        i(to_i32("q heads", p.n_q_heads)?),
        i(to_i32("kv heads", p.n_kv_heads)?),
        i(to_i32("head_dim", hd)?),
        i(to_i32("rotary dim", rot)?),
        i(interleaved as i32),
        f(eps),
        f(off),
        mscale.to_bits(),
        f(p.scale),
        i(window),
        f(p.softcap.unwrap_or(0.0)),
        sinks,
        t[0],
        t[1],
        t[2],
        t[3],
        t[4],
        i(kv_code(kv)),
    ];
    go(&mut st.rec, &st.dev.k.t_rope_attend, cfg, &mut args)?;
    st.pq_next = Some(PreQuant { x: op, n, kq, b32 });
    Ok(true)
}

/// The device pointer of the scratch buffer in `slot`, grown (zeroed) to at least `len`
/// values; a replaced buffer is kept until the launches that use it are enqueued. Errors:
/// allocation failure (`what` names the buffer).
fn grown<T: DeviceRepr + ValidAsZeroBits + Send + 'static>(
    stream: &Arc<CudaStream>,
    rec: &mut Recorder,
    slot: &mut Option<CudaSlice<T>>,
    len: usize,
    what: &str,
) -> Result<u64, ComputeError> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        let buf = drv(
            &format!("allocate {what}"),
            stream.alloc_zeros::<T>(len.max(1)),
        )?;
        if let Some(old) = slot.replace(buf) {
            rec.keep_any(Box::new(old));
        }
    }
    match slot {
        Some(b) => Ok(b.device_ptr(stream).0),
        None => Err(dev_err(format!("{what} missing"))),
    }
}

/// The device pointer of the key-split scratch, at least `len` values ([`grown`]).
fn split_scratch(st: &mut State, len: usize) -> Result<u64, ComputeError> {
    let State { dev, ops, rec, .. } = &mut *st;
    grown(
        &dev.stream,
        rec,
        &mut ops.splits,
        len,
        "the attention's key splits",
    )
}

/// Record `t_argmax_clear` and `t_argmax_rows`: the greedy choice of each row of `logits`
/// (`[R, width]`) into `OpScratch::best`, two words per row; returns `R`. Errors: `width` 0 or
/// not whole rows; device failures.
fn record_argmax(st: &mut State, logits: &Tensor, width: usize) -> Result<usize, ComputeError> {
    crate::host_ops::check_argmax_rows(logits.len(), width)?;
    let rows = logits.len() / width;
    if rows == 0 {
        return Ok(0);
    }
    let bp = {
        let State { dev, ops, rec, .. } = &mut *st;
        grown(
            &dev.stream,
            rec,
            &mut ops.best,
            2 * rows,
            "the argmax buffer",
        )?
    };
    let rows_i = to_i32("argmax rows", rows)?;
    let mut a = [bp, i(rows_i)];
    go(
        &mut st.rec,
        &st.dev.k.t_argmax_clear,
        flat(2 * rows),
        &mut a,
    )?;
    let lp = tp(st, logits, "argmax_rows")?;
    let cfg = LaunchConfig {
        grid_dim: (width.div_ceil(256 * 8).min(1024) as u32, rows as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut a = [lp, i(to_i32("vocab", width)?), bp];
    go(&mut st.rec, &st.dev.k.t_argmax_rows, cfg, &mut a)?;
    Ok(rows)
}

/// The choices of `t_argmax_rows`' packed words (two per row) into `out`.
fn unpack_choices(words: &[u64], out: &mut Vec<Argmax>) {
    out.clear();
    out.extend(words.chunks_exact(2).map(|b| Argmax {
        // The low 32 bits hold 0xffffffff - id (t_argmax_rows).
        token: u32::MAX - (b[0] & 0xffff_ffff) as u32,
        all_finite: b[1] == 0,
    }));
}

/// The greedy choice of each row of `logits` (`[R, width]`) ([`record_argmax`]), then its
/// `2 R` words copied back (this syncs the step).
pub(super) fn argmax_rows(
    st: &mut State,
    logits: &Tensor,
    width: usize,
    out: &mut Vec<Argmax>,
) -> Result<(), ComputeError> {
    let rows = record_argmax(st, logits, width)?;
    out.clear();
    if rows == 0 {
        return Ok(());
    }
    // `best` no longer holds the choices of an `argmax_rows_later`.
    st.ops.best_ticket = None;
    st.rec.flush(&st.dev.stream)?;
    let mut best = vec![0u64; 2 * rows];
    let Some(buf) = &st.ops.best else {
        return Err(dev_err("argmax buffer missing"));
    };
    let stream = &st.dev.stream;
    st.rec.timed_wait(|| {
        drv(
            "copy the greedy tokens to the host",
            stream.memcpy_dtoh(&buf.slice(0..2 * rows), &mut best),
        )?;
        drv("synchronize", stream.synchronize())
    })?;
    unpack_choices(&best, out);
    Ok(())
}

/// A copy of greedy choices to the host in flight ([`argmax_rows_later`]): its pinned buffer
/// and the event recorded after the copy into it.
#[derive(Debug)]
pub(super) struct ChoiceCopy {
    host: cudarc::driver::PinnedHostSlice<u64>,
    done: cudarc::driver::CudaEvent,
    /// The `argmax_rows_later` whose choices it holds (or receives) and their rows.
    ticket: u64,
    rows: usize,
}

/// [`crate::ComputeBackend::argmax_rows_later`] on the device: [`record_argmax`], everything
/// pending launched, then the `2 R` words copied into one of two pinned buffers (used in turn)
/// and an event recorded after the copy: the host does not wait. The choices stay in
/// `OpScratch::best` for [`embed_chosen`] until the next argmax.
pub(super) fn argmax_rows_later(
    st: &mut State,
    logits: &Tensor,
    width: usize,
    chosen: &mut Chosen,
) -> Result<(), ComputeError> {
    let rows = record_argmax(st, logits, width)?;
    st.ops.best_ticket = None;
    st.rec.flush(&st.dev.stream)?;
    st.ops.tickets += 1;
    let ticket = st.ops.tickets;
    *chosen = Chosen {
        rows,
        host: None,
        ticket,
    };
    let State { dev, ops, rec, .. } = &mut *st;
    let stream = &dev.stream;
    let slot = &mut ops.copies[(ticket % 2) as usize];
    // The slot's last copy (two tickets ago) may still be in flight: done before its buffer
    // is reused or replaced.
    if let Some(c) = slot.as_ref() {
        rec.timed_wait(|| drv("wait for an older choice copy", c.done.synchronize()))?;
    }
    if slot.as_ref().is_none_or(|c| c.host.len() < 2 * rows) {
        // SAFETY: the buffer is written by the copy below before it is read.
        let host = drv("allocate pinned memory for the greedy choices", unsafe {
            stream
                .context()
                .alloc_pinned_with_flags::<u64>((2 * rows).max(64), 0)
        })?;
        let done = drv("create an event", stream.context().new_event(None))?;
        *slot = Some(ChoiceCopy {
            host,
            done,
            ticket,
            rows,
        });
    }
    let Some(c) = slot.as_mut() else {
        return Err(dev_err("choice copy missing"));
    };
    c.ticket = ticket;
    c.rows = rows;
    if rows == 0 {
        return Ok(());
    }
    let src = match &ops.best {
        Some(b) => ptr(b, stream),
        None => return Err(dev_err("argmax buffer missing")),
    };
    let dst = drv("pinned choices", c.host.as_mut_slice())?;
    // SAFETY: `dst` is pinned host memory of at least `2 rows` words, alive until the event
    // below has completed (it is synchronised before the buffer is reused or dropped: the
    // slot is waited on above, and `take_chosen` waits before reading); `src` holds `2 rows`
    // words written by the launches enqueued before the copy.
    drv("copy the greedy tokens to the host", unsafe {
        cudarc::driver::result::memcpy_dtoh_async(&mut dst[..2 * rows], src, stream.cu_stream())
    })?;
    drv("record the choice copy", c.done.record(stream))?;
    ops.best_ticket = Some(ticket);
    Ok(())
}

/// [`crate::ComputeBackend::take_chosen`] on the device: waits for the copy of `chosen`'s
/// ticket. Errors: a ticket whose buffer was reused (more than two steps old), device failures.
pub(super) fn take_chosen(
    st: &mut State,
    chosen: &Chosen,
    out: &mut Vec<Argmax>,
) -> Result<(), ComputeError> {
    if let Some(picks) = &chosen.host {
        out.clear();
        out.extend_from_slice(picks);
        return Ok(());
    }
    let State { ops, rec, .. } = &mut *st;
    let Some(c) = ops.copies[(chosen.ticket % 2) as usize]
        .as_ref()
        .filter(|c| c.ticket == chosen.ticket && chosen.ticket != 0)
    else {
        return Err(dev_err(format!(
            "take_chosen: the greedy choices of step {} are no longer held (a device keeps the \
             last two)",
            chosen.ticket
        )));
    };
    rec.timed_wait(|| drv("wait for the greedy choices", c.done.synchronize()))?;
    let words = drv("pinned choices", c.host.as_slice())?;
    unpack_choices(&words[..2 * c.rows], out);
    Ok(())
}
