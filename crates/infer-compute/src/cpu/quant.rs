//! Quantized matrix–vector and matrix–matrix products on ggml block bytes.
//!
//! Formats with a fused kernel ([`crate::vec_dot::activation_format`]: Q4_K, Q6_K, Q4_0, Q5_0,
//! Q8_0) quantize the activations once (Q8_K or Q8_0), then run the integer dot product of
//! [`crate::vec_dot`] per weight row, rows split across rayon's pool. On x86-64 with AVX2,
//! Q4_0/Q5_0/Q8_0 (and Q6_K with AVX-512VL/BW) take the tile kernels of [`super::quant_tile`]
//! instead (one weight row against several activation rows; same integer block sums). Every
//! other format with a ggml dequantizer takes the dequantize-then-dot path of
//! [`super::quant_fallback`].

use super::quant_fallback;
use super::quant_tile;
use crate::backend::empty_product;
use crate::scratch;
use crate::vec_dot::{self, Isa, VecDotFn};
use crate::ComputeError;
use infer_quant::QuantFormat;
use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    /// Quantized activation rows ([`with_acts`]).
    static ACTS: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// Transposed `[rows, m]` results of [`quant_matmul`]'s non-tiled path.
    static YT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Quantize the `m` rows of `x` (`[m, cols]`) to the activation `format` (Q8_K or Q8_0, see
/// [`vec_dot::quantize_activations`]) into this thread's reusable buffer (`crate::scratch`)
/// and run `f(activations, bytes_per_row)`.
///
/// Errors: as [`vec_dot::quantize_activations`] (`cols` not block aligned, other formats).
pub(super) fn with_acts<R>(
    format: QuantFormat,
    x: &[f32],
    m: usize,
    cols: usize,
    f: impl FnOnce(&[u8], usize) -> R,
) -> Result<R, ComputeError> {
    let ar = format.bytes_for(cols)?;
    scratch::with(&ACTS, m * ar, |act| {
        let rows = |(xs, acts): (&[f32], &mut [u8])| {
            for (xi, ai) in xs
                .chunks_exact(cols.max(1))
                .zip(acts.chunks_exact_mut(ar.max(1)))
            {
                vec_dot::quantize_activations(format, xi, ai)?;
            }
            Ok::<(), ComputeError>(())
        };
        // Several rows (batched decode, prompts) are quantized by rows across the pool: on the
        // calling thread alone the others waited (each row's bytes are the same either way).
        let threads = rayon::current_num_threads();
        if threads > 1 && m > 1 && m * cols >= crate::host_ops::PAR_ROW_VALUES {
            let per = m.div_ceil(threads);
            x.par_chunks(per * cols)
                .zip(act[..m * ar].par_chunks_mut(per * ar))
                .try_for_each(rows)?;
        } else {
            rows((x, &mut act[..m * ar]))?;
        }
        Ok(f(act, ar))
    })
}

/// Below this many weight bytes (× activation rows) a product runs on the calling thread.
const PAR_MIN_BYTES: usize = 64 * 1024;
/// Parallel tasks per thread (load balance on a shared machine).
const TASKS_PER_THREAD: usize = 4;
/// Smallest task, in weight bytes × activation rows.
const MIN_TASK_BYTES: usize = 16 * 1024;
/// Activation rows per tile of [`quant_matmul`]: their quantized blocks stay in L2 while a task's
/// weight rows are swept over them.
const ACT_TILE: usize = 32;

/// Tasks hold whole multiples of this many weight rows: the sixteen-row groups of the VNNI
/// kernels (`vec_dot::vnni_gemm`), so that no task leaves rows to the slower remainder path.
const TASK_ROW_MULTIPLE: usize = 16;

/// How a product over `rows` weight rows is cut into tasks.
pub(crate) struct Split {
    /// Run on the calling thread.
    pub serial: bool,
    /// Weight rows per parallel task (≥ 1).
    pub rows_per_task: usize,
}

impl Split {
    /// `cost_per_row`: bytes touched per weight row (row bytes × activation rows).
    pub fn new(rows: usize, cost_per_row: usize) -> Split {
        let threads = rayon::current_num_threads();
        let total = rows.saturating_mul(cost_per_row);
        let serial = threads <= 1 || total < PAR_MIN_BYTES;
        let by_balance = rows.div_ceil(threads * TASKS_PER_THREAD);
        let by_size = MIN_TASK_BYTES.div_ceil(cost_per_row.max(1));
        Split {
            serial,
            rows_per_task: by_balance
                .max(by_size)
                .max(1)
                .next_multiple_of(TASK_ROW_MULTIPLE),
        }
    }

    /// True when work of `total` bytes (weight bytes × activation rows) runs serially.
    pub fn serial_for(total: usize) -> bool {
        rayon::current_num_threads() <= 1 || total < PAR_MIN_BYTES
    }
}

/// Formats this backend can multiply: a fused kernel or a ggml dequantizer (all but Q8_1).
fn supported(format: QuantFormat) -> bool {
    format != QuantFormat::Q8_1
}

/// Check the weight bytes of a `rows × cols` matrix of `format`; returns the bytes per row.
pub(super) fn check_weights(
    format: QuantFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
) -> Result<usize, ComputeError> {
    if !supported(format) {
        return Err(ComputeError::UnsupportedFormat {
            backend: "cpu".to_string(),
            format,
        });
    }
    let row_bytes = format.bytes_for(cols)?;
    let expected = rows
        .checked_mul(row_bytes)
        .ok_or(ComputeError::ShapeMismatch {
            what: "quantized matrix (rows * row bytes overflows)",
            expected: usize::MAX,
            got: bytes.len(),
            unit: "bytes",
        })?;
    if bytes.len() != expected {
        return Err(ComputeError::ShapeMismatch {
            what: "quantized matrix bytes (rows * bytes per row)",
            expected,
            got: bytes.len(),
            unit: "bytes",
        });
    }
    Ok(row_bytes)
}

/// The fused kernel and activation format for `format`, preferring `isa`.
pub(super) fn fused(format: QuantFormat, isa: Isa) -> Option<(QuantFormat, VecDotFn)> {
    let act = vec_dot::activation_format(format)?;
    let k = vec_dot::kernel(format, isa).or_else(|| vec_dot::kernel(format, Isa::Generic))?;
    Some((act, k))
}

/// `y[rows] = W·x`; see [`crate::ComputeBackend::quant_matvec`].
pub fn quant_matvec(
    isa: Isa,
    format: QuantFormat,
    bytes: &[u8],
    x: &[f32],
    rows: usize,
    cols: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    assert_eq!(
        x.len(),
        cols,
        "quant_matvec: x has {} values, want cols = {cols}",
        x.len()
    );
    assert_eq!(
        y.len(),
        rows,
        "quant_matvec: y has {} values, want rows = {rows}",
        y.len()
    );
    let row_bytes = check_weights(format, bytes, rows, cols)?;
    if format.interleaved().is_some() {
        let w = crate::Matrix::blocks(format, bytes, rows, cols);
        return super::quant_x16::matmul(isa, &w, x, 1, y);
    }
    if rows == 0 {
        return Ok(());
    }
    if cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if let Some(t) = quant_tile::tiled(format, isa) {
        return quant_tile::quantize_and_matmul(
            t,
            quant_tile::WeightRows { bytes, row_bytes },
            x,
            1,
            cols,
            y,
        );
    }
    let Some((act_format, kern)) = fused(format, isa) else {
        return quant_fallback::matmul_t(format, bytes, x, 1, cols, row_bytes, y);
    };
    with_acts(act_format, x, 1, cols, |act, _| {
        let split = Split::new(rows, row_bytes);
        let task = |ys: &mut [f32], ws: &[u8]| {
            for (yi, w) in ys.iter_mut().zip(ws.chunks_exact(row_bytes)) {
                *yi = kern(cols, w, act);
            }
        };
        if split.serial {
            task(y, bytes);
        } else {
            y.par_chunks_mut(split.rows_per_task)
                .zip(bytes.par_chunks(split.rows_per_task * row_bytes))
                .for_each(|(ys, ws)| task(ys, ws));
        }
    })
}

/// `y[m×rows] = x[m×cols] · Wᵀ` for a block-format `w`; see [`crate::ComputeBackend::linear`].
pub fn quant_matmul(
    isa: Isa,
    w: &crate::Matrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    let (format, bytes) = w.blocks_data()?;
    let (rows, cols) = (w.rows, w.cols);
    if format.interleaved().is_some() {
        check_weights(format, bytes, rows, cols)?;
        return super::quant_x16::matmul(isa, w, x, m, y);
    }
    assert_eq!(
        x.len(),
        m * cols,
        "quant_matmul: x has {} values, want m*cols = {m}*{cols}",
        x.len()
    );
    assert_eq!(
        y.len(),
        m * rows,
        "quant_matmul: y has {} values, want m*rows = {m}*{rows}",
        y.len()
    );
    if m == 1 {
        return quant_matvec(isa, format, bytes, x, rows, cols, y);
    }
    let row_bytes = check_weights(format, bytes, rows, cols)?;
    if empty_product(m, rows, cols, y) {
        return Ok(());
    }
    // Results are produced weight-row-major ([rows, m]) so that each task owns whole weight
    // rows, then transposed into y.
    if let Some(t) = quant_tile::tiled(format, isa) {
        return quant_tile::quantize_and_matmul(
            t,
            quant_tile::WeightRows { bytes, row_bytes },
            x,
            m,
            cols,
            y,
        );
    }
    scratch::with(&YT, rows * m, |yt| {
        match fused(format, isa) {
            None => quant_fallback::matmul_t(format, bytes, x, m, cols, row_bytes, yt)?,
            Some((act_format, kern)) => with_acts(act_format, x, m, cols, |act, act_row| {
                let weights = WeightRows {
                    bytes,
                    row_bytes,
                    cols,
                };
                fused_matmul_t(kern, weights, ActRows { act, m, act_row }, yt)
            })?,
        }
        transpose_into(yt, m, rows, y);
        Ok(())
    })
}

/// `y[i*rows + r] = yt[r*m + i]`: `[rows, m]` to `[m, rows]`.
/// Blocked in 16 × 16 tiles, so both sides stay within a few cache lines per tile.
pub(super) fn transpose_into(yt: &[f32], m: usize, rows: usize, y: &mut [f32]) {
    const B: usize = 16;
    assert!(
        yt.len() == m * rows && y.len() == m * rows,
        "transpose: lengths"
    );
    for r0 in (0..rows).step_by(B) {
        let r1 = (r0 + B).min(rows);
        for i0 in (0..m).step_by(B) {
            let i1 = (i0 + B).min(m);
            for r in r0..r1 {
                let src = &yt[r * m + i0..r * m + i1];
                for (k, &v) in src.iter().enumerate() {
                    y[(i0 + k) * rows + r] = v;
                }
            }
        }
    }
}

/// Weight rows of one product: `bytes` holds rows of `row_bytes` bytes, `cols` values each.
#[derive(Clone, Copy)]
struct WeightRows<'a> {
    bytes: &'a [u8],
    row_bytes: usize,
    cols: usize,
}

/// Quantized activation rows: `m` rows of `act_row` bytes in `act`.
#[derive(Clone, Copy)]
struct ActRows<'a> {
    act: &'a [u8],
    m: usize,
    act_row: usize,
}

/// `yt[r*m + i] = kern(W[r], act[i])`: tasks own blocks of weight rows; inside a task the
/// activation rows are taken in tiles of [`ACT_TILE`], and each weight row of the task is swept
/// over the tile (weights read once per tile, from L1/L2).
fn fused_matmul_t(kern: VecDotFn, w: WeightRows<'_>, a: ActRows<'_>, yt: &mut [f32]) {
    let WeightRows {
        bytes,
        row_bytes,
        cols,
    } = w;
    let ActRows { act, m, act_row } = a;
    let rows = yt.len() / m;
    let task = |ys: &mut [f32], ws: &[u8]| {
        for t0 in (0..m).step_by(ACT_TILE) {
            let t1 = (t0 + ACT_TILE).min(m);
            for (yr, w) in ys.chunks_exact_mut(m).zip(ws.chunks_exact(row_bytes)) {
                for i in t0..t1 {
                    yr[i] = kern(cols, w, &act[i * act_row..(i + 1) * act_row]);
                }
            }
        }
    };
    let split = Split::new(rows, row_bytes * m);
    if split.serial {
        task(yt, bytes);
    } else {
        yt.par_chunks_mut(split.rows_per_task * m)
            .zip(bytes.par_chunks(split.rows_per_task * row_bytes))
            .for_each(|(ys, ws)| task(ys, ws));
    }
}
