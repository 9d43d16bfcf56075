//! Quantized products on the device: activations quantized once per call by a kernel, then
//! either one warp per weight row with `__dp4a` integer dot products (`kernels.cu`, few
//! activation rows) or tiles of weight rows × activation rows on the tensor cores (`mmq.cu`,
//! from [`MMQ_MIN_M`] rows on sm_80+).
//!
//! Activation formats are the CPU's (`crate::vec_dot::activation_format`): Q8_K for Q4_K and
//! Q6_K weights, Q8_0 for Q4_0, Q5_0 and Q8_0 weights, int8 + f32 scale per 32 values for the
//! seed's Q8 attention format, computed with the same f32 operations, so every block's integer
//! sum equals the CPU's and only the order of the f32 block terms differs.

use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use infer_quant::QuantFormat;

use super::cache::Scratch;
use super::device::{
    drv, int, mmq_q4k_smem, Device, MMQ_BM, MMQ_BN, MMQ_WIDTHS, MT, MVQ_ROWS, MVQ_TOKENS,
    MVQ_WARPS, ROWDOT_THREADS, ROWS_PER_BLOCK, STAGE,
};
use super::State;
use crate::backend::empty_product;
use crate::{ComputeError, MatData, Matrix, Proj};

/// The product kernels of one weight format: the mat-vec (`mv`, `MT` activation rows per weight
/// read), the one-row mat-vec (`mv1`: the K-quants' `mv1_*`, which keep more weight bytes in
/// flight; the mat-vec elsewhere), the tensor-core tiles (one per token tile of
/// [`MMQ_WIDTHS`]), whether they take dynamic shared memory (Q4_K: [`mmq_q4k_smem`]), and the
/// grouped tiles over expert tables (`mmq_ids_*`; none for the seed's split Q8).
struct FormatKernels<'a> {
    mv: &'a CudaFunction,
    mv1: &'a CudaFunction,
    mmq: &'a [CudaFunction; 3],
    mmq_dynamic_smem: bool,
    mmq_ids: Option<&'a CudaFunction>,
    /// The few-row tensor-core products (2..=[`MVQ_MAX_M`] rows: one and two groups of
    /// [`MVQ_TOKENS`]), where a format has them.
    few: Option<&'a [CudaFunction; 2]>,
}

impl FormatKernels<'_> {
    /// Dynamic shared memory of the tile kernels with a token tile of `bn` rows (bytes).
    fn mmq_smem(&self, bn: usize) -> usize {
        if self.mmq_dynamic_smem {
            mmq_q4k_smem(bn)
        } else {
            0
        }
    }
}

/// The product kernels of weight format `format` (`None`: the seed's split Q8), or `None` when
/// the CUDA backend has none: the one table of the products' kernels.
fn kernels(dev: &Device, format: Option<QuantFormat>) -> Option<FormatKernels<'_>> {
    let k = &dev.k;
    let few = match format {
        Some(QuantFormat::Q4_K) => Some(&k.mvq_q4_k),
        Some(QuantFormat::Q6_K) => Some(&k.mvq_q6_k),
        _ => None,
    };
    let (mv, mv1, mmq, mmq_dynamic_smem, mmq_ids) = match format {
        None => (&k.mv_q8s, &k.mv_q8s, &k.mmq_q8s, false, None),
        Some(QuantFormat::Q4_0) => (
            &k.mv_q4_0,
            &k.mv_q4_0,
            &k.mmq_q4_0,
            false,
            Some(&k.mmq_ids_q4_0),
        ),
        Some(QuantFormat::Q5_0) => (
            &k.mv_q5_0,
            &k.mv_q5_0,
            &k.mmq_q5_0,
            false,
            Some(&k.mmq_ids_q5_0),
        ),
        Some(QuantFormat::Q8_0) => (
            &k.mv_q8_0,
            &k.mv_q8_0,
            &k.mmq_q8_0,
            false,
            Some(&k.mmq_ids_q8_0),
        ),
        Some(QuantFormat::Q4_K) => (
            &k.mv_q4_k,
            &k.mv1_q4_k,
            &k.mmq_q4_k,
            true,
            Some(&k.mmq_ids_q4_k),
        ),
        Some(QuantFormat::Q6_K) => (
            &k.mv_q6_k,
            &k.mv1_q6_k,
            &k.mmq_q6_k,
            false,
            Some(&k.mmq_ids_q6_k),
        ),
        Some(_) => return None,
    };
    Some(FormatKernels {
        mv,
        mv1,
        mmq,
        mmq_dynamic_smem,
        mmq_ids,
        few,
    })
}

/// The one-row mat-vec kernel of weight format `format` and whether it reads Q8_K activations
/// (else 32-value blocks), or `None` when the CUDA backend has none.
pub(super) fn kernel(dev: &Device, format: QuantFormat) -> Option<(&CudaFunction, bool)> {
    kernels(dev, Some(format)).map(|k| (k.mv1, is_kq(Some(format))))
}

/// The grouped tile kernel (`mmq_ids_*`) of weight format `format`, whether it reads Q8_K
/// activations, and its dynamic shared memory; `None` for a format without one or a device
/// without the tensor-core instructions (compute capability below 8.0).
pub(super) fn grouped_kernel(
    dev: &Device,
    format: QuantFormat,
) -> Option<(&CudaFunction, bool, usize)> {
    if dev.cc.0 < 8 {
        return None;
    }
    let k = kernels(dev, Some(format))?;
    Some((k.mmq_ids?, is_kq(Some(format)), k.mmq_smem(MMQ_BN)))
}

/// Activation rows from which the products run the tensor-core tile kernels (`mmq_*`) rather
/// than the mat-vecs, which read each weight row once per `MT` activation rows (Q4_K and Q6_K
/// take `mvq_*` from 2 to [`MVQ_MAX_M`] rows instead). At 4 rows the 16-token tiles were ahead
/// of the Q4_K mat-vec: 8 B Q4_K_M, 4 sequences, 547 vs 522 tok/s (H100, two rounds).
pub(super) const MMQ_MIN_M: usize = 4;
/// Most activation rows of the few-row tensor-core products (`mvq_*`, Q4_K and Q6_K): two
/// groups of [`MVQ_TOKENS`], every weight block unpacked once into registers for all of them.
pub(super) const MVQ_MAX_M: usize = 2 * MVQ_TOKENS;

/// A product's launch: the kernel, whether it reads Q8_K activations, its grid, and for the
/// tile kernels the two split-K buffer pointers that follow the shared arguments.
pub(super) struct ProductLaunch<'a> {
    pub func: &'a CudaFunction,
    pub kq: bool,
    pub cfg: LaunchConfig,
    /// `mmq_*` only: [`super::device::SplitK`]'s partials and counters (device pointers).
    pub split: Option<[u64; 2]>,
}

/// The index in [`MMQ_WIDTHS`] of the token tile for `m` activation rows: the narrowest tile
/// that holds them all, the widest beyond it (a 16-sequence decode step fills a 16-token tile,
/// where a 64-token one would leave three quarters of its columns idle).
fn token_tile(m: usize) -> usize {
    (0..MMQ_WIDTHS.len())
        .rev()
        .find(|&i| MMQ_WIDTHS[i] >= m)
        .unwrap_or(0)
}

/// The product kernel for `m` activation rows of weights `format` (`None`: the seed's split Q8)
/// of `rows × cols` and its launch: the tensor-core tiles (`mmq_*`, one block per
/// [`token_tile`] activation rows × `MMQ_BM` weight rows, activation tiles fastest so the
/// blocks sharing a weight tile run together, K split into [`split_shares`] shares when the
/// tiles alone would leave the device idle) from [`MMQ_MIN_M`] rows on devices of compute
/// capability 8.0 or later, else the mat-vecs (the one-row kernel for one row); Q4_K and Q6_K from 2
/// to [`MVQ_MAX_M`] rows take the few-row tensor-core products (`mvq_*`). All take the
/// same arguments, the tile kernels then the split-K pointers; Q4_K's tile kernels ask for
/// [`mmq_q4k_smem`] bytes of dynamic shared memory.
/// Errors: a format without a kernel.
pub(super) fn product_kernel(
    dev: &Device,
    format: Option<QuantFormat>,
    rows: usize,
    cols: usize,
    m: usize,
) -> Result<ProductLaunch<'_>, ComputeError> {
    let tiles = m >= MMQ_MIN_M && dev.cc.0 >= 8;
    let Some(fk) = kernels(dev, format) else {
        return Err(match format {
            Some(format) => ComputeError::UnsupportedFormat {
                backend: "cuda".to_string(),
                format,
            },
            None => super::device::dev_err("no kernels for the split Q8 format"),
        });
    };
    let kq = is_kq(format);
    if let Some(few) = fk
        .few
        .filter(|_| (2..=MVQ_MAX_M).contains(&m) && dev.cc.0 >= 8)
    {
        let groups = m.div_ceil(MVQ_TOKENS);
        return Ok(ProductLaunch {
            func: &few[groups - 1],
            kq,
            cfg: LaunchConfig {
                grid_dim: (rows.div_ceil(MVQ_ROWS) as u32, 1, 1),
                block_dim: (32 * MVQ_WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            },
            split: None,
        });
    }
    if !tiles {
        return Ok(ProductLaunch {
            func: if m == 1 { fk.mv1 } else { fk.mv },
            kq,
            cfg: mv_grid(rows, m),
            split: None,
        });
    }
    let tile = token_tile(m);
    let (mmq, bn, smem) = (
        &fk.mmq[tile],
        MMQ_WIDTHS[tile],
        fk.mmq_smem(MMQ_WIDTHS[tile]),
    );
    let (gx, gy) = (m.div_ceil(bn), rows.div_ceil(MMQ_BM));
    // Blocks of this kernel the device runs at once (1 per multiprocessor if the driver
    // cannot say).
    let per_sm = mmq
        .occupancy_max_active_blocks_per_multiprocessor(256, smem, None)
        .map_or(1, |n| n.max(1) as usize);
    let shares = split_shares(gx * gy, cols, dev.sms * per_sm, dev.split.slots);
    let stream = &dev.stream;
    let cfg = LaunchConfig {
        grid_dim: (gx as u32, gy as u32, shares as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    Ok(ProductLaunch {
        func: mmq,
        kq,
        cfg,
        split: Some([
            dev.split.part.device_ptr(stream).0,
            dev.split.counters.device_ptr(stream).0,
        ]),
    })
}

/// Super-blocks of 256 values (2 K steps) each split-K share takes at least.
const MIN_SHARE_SUPERBLOCKS: usize = 2;

/// Shares of the K dimension (`cols` values) for a tile launch of `tiles` blocks, as
/// `gridDim.z` (`mmq_share` in `mmq.cu`): 1 when the tiles fill the `resident` blocks the device
/// runs at once, else about `resident / tiles`, each at least [`MIN_SHARE_SUPERBLOCKS`]
/// super-blocks, no share empty, and `tiles × shares ≤ slots` (the partial tiles of
/// [`super::device::SplitK`]).
pub(super) fn split_shares(tiles: usize, cols: usize, resident: usize, slots: usize) -> usize {
    let tiles = tiles.max(1);
    let superblocks = cols.div_ceil(256);
    let s = (resident / tiles)
        .min(superblocks / MIN_SHARE_SUPERBLOCKS)
        .min(slots / tiles);
    if s < 2 {
        return 1;
    }
    superblocks.div_ceil(superblocks.div_ceil(s))
}

/// Check a weight buffer like the CPU backend: format with a kernel, `cols` block aligned,
/// `bytes.len() == rows · bytes_for(cols)`.
pub(super) fn check(
    dev: &Device,
    format: QuantFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
) -> Result<(), ComputeError> {
    if kernel(dev, format).is_none() {
        return Err(ComputeError::UnsupportedFormat {
            backend: "cuda".to_string(),
            format,
        });
    }
    let row_bytes = format.bytes_for(cols)?;
    if bytes.len() != rows * row_bytes {
        return Err(ComputeError::ShapeMismatch {
            what: "quantized weight bytes (rows * bytes per row)",
            expected: rows * row_bytes,
            got: bytes.len(),
            unit: "bytes",
        });
    }
    Ok(())
}

/// Grid of the mat-vec kernels: `ROWS_PER_BLOCK` weight rows per block, `MT` activation rows
/// per block row.
fn mv_grid(rows: usize, m: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            rows.div_ceil(ROWS_PER_BLOCK) as u32,
            m.div_ceil(MT) as u32,
            1,
        ),
        block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Grid of the float mat-vecs (`rowdot_*`): one block of `ROWDOT_THREADS` per weight row,
/// `MT` activation rows per block row.
pub(super) fn rowdot_grid(rows: usize, m: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, m.div_ceil(MT) as u32, 1),
        block_dim: (ROWDOT_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `dec_mv_multi`'s format code.
pub(super) fn format_code(f: QuantFormat) -> Result<i64, ComputeError> {
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

/// Matrices with at least this many rows have more one-row warps than the H200 holds at once
/// (132 SMs × 64 warps = 8448): there a warp of the 32-value formats takes several rows.
const TALL_ROWS: usize = 16384;

/// Rows per warp of `dec_mv_multi` for a `rows × cols` matrix of `format`: 1, or for tall
/// matrices of the 32-value formats as many whole rows as one staged chunk holds (at most 4),
/// so each warp keeps more weight bytes in flight (measured: the lm_head's one-row warps
/// reached ~1 TB/s). The K-quants keep one row per warp: `mvk_stream` splits a row over the
/// warp's lanes and pipelines its loads; several rows per warp measured slower on the H200
/// (8 B gate/up at 3 rows per warp 1714 GB/s against 2103 at one, lm_head at 8: 2221 against
/// 2346).
pub(super) fn rows_per_warp(format: QuantFormat, rows: usize, cols: usize) -> usize {
    let row_bytes = cols / format.block_elems() * format.block_bytes();
    if rows < TALL_ROWS || row_bytes == 0 || is_kq(Some(format)) {
        return 1;
    }
    (STAGE / row_bytes).clamp(1, 4)
}

/// One `dec_mv_multi` job `[W, y, rows, format, first block, rows per warp, bias]` for the
/// `rows × cols` matrix of `format` at device address `w` into `y` (plus the `[rows]` f32 Linear
/// bias at `bias`, 0: none), its warp blocks numbered from `first_block`; and the number of
/// blocks it takes. Errors: a format without a mat-vec
/// kernel; K-quant weights not 16-byte aligned (their kernels read them as 16-byte words;
/// device allocations, one per weight, are 256-byte aligned).
pub(super) fn mv_job(
    format: QuantFormat,
    w: u64,
    y: u64,
    bias: u64,
    rows: usize,
    cols: usize,
    first_block: usize,
) -> Result<([i64; 7], usize), ComputeError> {
    if is_kq(Some(format)) && !w.is_multiple_of(16) {
        return Err(super::device::dev_err(format!(
            "{format:?} mat-vec weights at {w:#x} are not 16-byte aligned"
        )));
    }
    let rpw = rows_per_warp(format, rows, cols);
    let job = [
        w as i64,
        y as i64,
        rows as i64,
        format_code(format)?,
        first_block as i64,
        rpw as i64,
        bias as i64,
    ];
    Ok((job, rows.div_ceil(ROWS_PER_BLOCK * rpw)))
}

/// One warp per block of `nblocks` activation blocks.
pub(super) fn warp_grid(nblocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (nblocks.div_ceil(4) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The activation family of weight format `format` (`None`: the seed's Q8 format), from the
/// format table's pairing: Q8_K for the K-quants, 32-value int8 blocks otherwise.
pub(super) fn is_kq(format: Option<QuantFormat>) -> bool {
    format.and_then(QuantFormat::vec_dot_type) == Some(QuantFormat::Q8_K)
}

/// Quantize the `m × cols` activations already in `s.x` for weights of `format`
/// (`None`: the seed's Q8 format) into the family's buffers (`s.kq` or `s.b32`).
pub(super) fn quantize_acts(
    dev: &Device,
    s: &mut Scratch,
    format: Option<QuantFormat>,
    m: usize,
    cols: usize,
) -> Result<(), ComputeError> {
    let st = &dev.stream;
    let n = m * cols;
    let kq = is_kq(format);
    let block = if kq { 256 } else { 32 };
    let nblocks = n / block;
    let nb_i = int("activation blocks", nblocks)?;
    s.x.at_least(st, n)?;
    let a = if kq { &mut s.kq } else { &mut s.b32 };
    a.aq.at_least(st, n)?;
    a.ad.at_least(st, nblocks)?;
    if kq {
        a.bsums.at_least(st, nblocks * 16)?;
    }
    let (x, aq, ad, bs) = (s.x.get(), a.aq.get(), a.ad.get(), a.bsums.get());
    let r = if kq {
        let mut b = st.launch_builder(&dev.k.quantize_q8_k);
        b.arg(x).arg(aq).arg(ad).arg(bs).arg(&nb_i);
        // SAFETY: argument types match `quantize_q8_k`; buffers hold n values / nblocks blocks.
        unsafe { b.launch(warp_grid(nblocks)) }
    } else {
        let f16_scale: i32 = format.is_some() as i32;
        let mut b = st.launch_builder(&dev.k.quantize_q8_32);
        b.arg(x).arg(aq).arg(ad).arg(&nb_i).arg(&f16_scale);
        // SAFETY: argument types match `quantize_q8_32`; buffers hold n values / nblocks blocks.
        unsafe { b.launch(warp_grid(nblocks)) }
    };
    drv("launch activation quantizer", r).map(|_| ())
}

/// Where a mat-vec launch reads and writes: `m` activation rows against `rows` weight rows
/// of `cols` values, output at `s.y[y_off .. y_off + m·rows]` (`[m, rows]`).
#[derive(Clone, Copy, Debug)]
pub(super) struct MvShape {
    pub m: usize,
    pub rows: usize,
    pub cols: usize,
    pub y_off: usize,
}

/// Launch the mat-vec kernel of `format` on weights `w` (device, padded by
/// [`super::cache::WEIGHT_PAD`]), activations quantized in `s` for this format's family, per
/// `shape`.
pub(super) fn launch_mv(
    dev: &Device,
    s: &Scratch,
    format: QuantFormat,
    w: &CudaSlice<u8>,
    shape: MvShape,
) -> Result<(), ComputeError> {
    let MvShape {
        m,
        rows,
        cols,
        y_off,
    } = shape;
    let p = product_kernel(dev, Some(format), rows, cols, m)?;
    let (rows_i, cols_i, m_i) = (int("rows", rows)?, int("cols", cols)?, int("m", m)?);
    let a = if p.kq { &s.kq } else { &s.b32 };
    let y = s.y.get().slice(y_off..y_off + m * rows);
    let mut b = dev.stream.launch_builder(p.func);
    b.arg(w).arg(a.aq.get()).arg(a.ad.get());
    if p.kq {
        b.arg(a.bsums.get());
    }
    b.arg(&y).arg(&rows_i).arg(&cols_i).arg(&m_i);
    if let Some(split) = &p.split {
        b.arg(&split[0]).arg(&split[1]);
    }
    // SAFETY: argument list matches `mv_*` in kernels.cu and `mmq_*` in mmq.cu; `w` holds rows·bytes_for(cols) bytes
    // (checked) plus padding, the scratch buffers hold m·cols activations and the output view
    // m·rows values.
    drv("launch quantized product", unsafe { b.launch(p.cfg) }).map(|_| ())
}

/// `y[m×rows] = x[m×cols] · Wᵀ` for ggml-format weights `w` (see [`super::CudaBackend`]).
pub(super) fn quant_matmul(
    st: &mut State,
    w: &Matrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    let (format, bytes) = w.blocks_data()?;
    let (rows, cols) = (w.rows, w.cols);
    check(&st.dev, format, bytes, rows, cols)?;
    if empty_product(m, rows, cols, y) {
        return Ok(());
    }
    let State { dev, cache, s, .. } = st;
    let w = cache.get(&dev.stream, bytes)?;
    upload_x(dev, s, x)?;
    s.y.at_least(&dev.stream, m * rows)?;
    quantize_acts(dev, s, Some(format), m, cols)?;
    let shape = MvShape {
        m,
        rows,
        cols,
        y_off: 0,
    };
    launch_mv(dev, s, format, w, shape)?;
    download_y(dev, s, y)
}

/// Several products of the same activations (fused QKV, gate+up): `p.y[m×p.rows] =
/// x[m×cols] · p.Wᵀ` for every `p`. The activations are uploaded once and quantized once per
/// activation family present (Q8_K and/or 32-value blocks); every kernel writes its own range
/// of one output buffer, which comes back with one synchronisation. Each output equals
/// [`quant_matmul`] of its matrix bit for bit (same kernels, same quantized activations).
/// Errors as [`quant_matmul`], checked for every matrix before anything runs.
pub(super) fn quant_matmul_many(
    st: &mut State,
    x: &[f32],
    m: usize,
    projs: &mut [Proj<'_>],
) -> Result<(), ComputeError> {
    let Some(cols) = projs.first().map(|p| p.w.cols) else {
        return Ok(());
    };
    for p in projs.iter() {
        let (format, bytes) = p.w.blocks_data()?;
        check(&st.dev, format, bytes, p.w.rows, cols)?;
    }
    if m == 0 {
        return Ok(());
    }
    if cols == 0 {
        for p in projs.iter_mut() {
            p.y.fill(0.0);
        }
        return Ok(());
    }
    let State { dev, cache, s, .. } = st;
    for p in projs.iter().filter(|p| p.w.rows > 0) {
        cache.get(&dev.stream, p.w.blocks_data()?.1)?;
    }
    upload_x(dev, s, x)?;
    let total: usize = projs.iter().map(|p| m * p.w.rows).sum();
    s.y.at_least(&dev.stream, total)?;
    for family in [true, false] {
        let first = projs.iter().find_map(|p| match p.w.data {
            MatData::Blocks { format, .. } if p.w.rows > 0 && is_kq(Some(format)) == family => {
                Some(format)
            }
            _ => None,
        });
        if let Some(format) = first {
            quantize_acts(dev, s, Some(format), m, cols)?;
        }
    }
    let mut off = 0;
    for p in projs.iter().filter(|p| p.w.rows > 0) {
        let (format, bytes) = p.w.blocks_data()?;
        let Some(w) = cache.peek(bytes) else {
            return Err(super::device::dev_err(
                "fused weights missing from the cache",
            ));
        };
        let shape = MvShape {
            m,
            rows: p.w.rows,
            cols,
            y_off: off,
        };
        launch_mv(dev, s, format, w, shape)?;
        off += m * p.w.rows;
    }
    let mut off = 0;
    for p in projs.iter_mut().filter(|p| p.w.rows > 0) {
        let n = m * p.w.rows;
        let view = s.y.get().slice(off..off + n);
        drv(
            "copy the result to the host",
            dev.stream.memcpy_dtoh(&view, &mut p.y[..n]),
        )?;
        off += n;
    }
    drv("synchronize", dev.stream.synchronize())
}

/// `y[m×rows] = x[m×cols] · Wᵀ` for the seed's split Q8 format (int8 values, f32 scales per
/// 32) in `w`.
pub(super) fn q8_matmul(
    st: &mut State,
    w: &Matrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    let MatData::SplitQ8 { values, scales } = w.data else {
        return Err(ComputeError::NotBlocks {
            storage: w.describe(),
        });
    };
    let (rows, cols) = (w.rows, w.cols);
    crate::q8_split::check_shapes(values, scales, x, m, rows, cols, y)?;
    if empty_product(m, rows, cols, y) {
        return Ok(());
    }
    let State { dev, cache, s, .. } = st;
    // Two cache entries: upload both, then borrow both (the map is not touched in between).
    cache.get(&dev.stream, values)?;
    cache.get(&dev.stream, super::cache::as_bytes(scales))?;
    upload_x(dev, s, x)?;
    s.y.at_least(&dev.stream, m * rows)?;
    quantize_acts(dev, s, None, m, cols)?;
    let (rows_i, cols_i, m_i) = (int("rows", rows)?, int("cols", cols)?, int("m", m)?);
    let wv = cache.peek(values);
    let ws = cache.peek(super::cache::as_bytes(scales));
    let (Some(wv), Some(ws)) = (wv, ws) else {
        return Err(super::device::dev_err("q8 weights missing from the cache"));
    };
    let p = product_kernel(dev, None, rows, cols, m)?;
    let mut b = dev.stream.launch_builder(p.func);
    b.arg(wv)
        .arg(ws)
        .arg(s.b32.aq.get())
        .arg(s.b32.ad.get())
        .arg(s.y.get())
        .arg(&rows_i)
        .arg(&cols_i)
        .arg(&m_i);
    if let Some(split) = &p.split {
        b.arg(&split[0]).arg(&split[1]);
    }
    // SAFETY: argument list matches `mv_q8s` / `mmq_q8s`; buffer sizes checked above.
    drv("launch q8 product", unsafe { b.launch(p.cfg) })?;
    download_y(dev, s, y)
}

/// Copy the host activations into `s.x`.
pub(super) fn upload_x(dev: &Device, s: &mut Scratch, x: &[f32]) -> Result<(), ComputeError> {
    s.x.at_least(&dev.stream, x.len())?;
    let mut view = s.x.get_mut().slice_mut(0..x.len());
    drv(
        "copy activations to the device",
        dev.stream.memcpy_htod(x, &mut view),
    )
}

/// Copy the first `y.len()` values of `s.y` to the host and wait for the stream.
pub(super) fn download_y(dev: &Device, s: &Scratch, y: &mut [f32]) -> Result<(), ComputeError> {
    let view = s.y.get().slice(0..y.len());
    drv(
        "copy the result to the host",
        dev.stream.memcpy_dtoh(&view, y),
    )?;
    drv("synchronize", dev.stream.synchronize())
}

#[cfg(test)]
mod tests {
    use super::{split_shares, token_tile, MMQ_WIDTHS};

    #[test]
    fn token_tile_is_the_narrowest_that_holds_the_rows() {
        let width = |m| MMQ_WIDTHS[token_tile(m)];
        assert_eq!((width(8), width(16)), (16, 16));
        assert_eq!((width(17), width(32)), (32, 32));
        assert_eq!((width(33), width(64), width(512)), (64, 64, 64));
    }

    #[test]
    fn split_k_fills_the_device_only_where_the_tiles_do_not() {
        // 8 B q_proj at a decode batch: 32 tiles on 132 resident blocks, 16 super-blocks.
        assert_eq!(split_shares(32, 4096, 132, 528), 4);
        // Enough tiles (a prompt): no split.
        assert_eq!(split_shares(896, 4096, 132, 528), 1);
        assert_eq!(split_shares(132, 4096, 132, 528), 1);
        // One tile: as many shares as super-blocks allow, at least 2 super-blocks each.
        assert_eq!(split_shares(1, 4096, 132, 528), 8);
        assert_eq!(split_shares(1, 512, 132, 528), 1);
        // Odd super-block counts: shares of ceil(7 / 3) = 3 super-blocks, none empty.
        assert_eq!(split_shares(1, 1792, 132, 528), 3);
        // Never more partial tiles than the buffer holds.
        assert_eq!(split_shares(100, 1 << 16, 1000, 300), 3);
        for tiles in 1..300 {
            for sb in 1..80 {
                let s = split_shares(tiles, 256 * sb, 264, 528);
                assert!(s == 1 || tiles * s <= 528, "tiles {tiles} sb {sb}: {s}");
                let per = sb.div_ceil(s);
                assert!(
                    (s - 1) * per < sb,
                    "empty share: tiles {tiles} sb {sb}: {s}"
                );
            }
        }
    }
}
