//! [`crate::ComputeBackend::quant_matmul_many`] on the CPU: several quantized matrices times the
//! same activations (fused QKV, gate+up). The activations are quantized once per activation
//! format (Q8_0 split rows for the tile kernels, Q8_K for the K-quant kernels), and the weight
//! rows of all matrices are cut into tasks run in one rayon parallel region, so a decode step
//! pays one dispatch instead of one per matrix. Nothing is allocated once the per-thread
//! activation buffers have grown (task plans live in fixed arrays, tasks are an index range).

use super::quant::{self, Split};
use super::quant_tile::{self, TileActs, Tiled};
use crate::vec_dot::{Isa, OutMat, Q8Rows, VecDotFn};
use crate::{ComputeError, Proj};
use infer_quant::QuantFormat;
use rayon::prelude::*;

/// Matrices handled per batch of tasks: the per-matrix plans live in a fixed array (no
/// allocation); longer lists run in batches of this many (same results).
const MAX_PROJS: usize = 8;

/// How one task multiplies its weight rows.
#[derive(Clone, Copy)]
enum Kernel<'a> {
    Tiled(Tiled, TileActs<'a>),
    /// Fused kernel, quantized activations (`m` rows of `act_row` bytes).
    Fused(VecDotFn, &'a [u8], usize),
}

/// One matrix of a batch: its kernel, weight rows, and where its `[m, rows]` result goes.
#[derive(Clone, Copy)]
struct Plan<'a> {
    kernel: Kernel<'a>,
    w: &'a [u8],
    row_bytes: usize,
    rows: usize,
    /// Weight rows per task.
    rpt: usize,
    out: OutMat,
}

impl Plan<'_> {
    fn tasks(&self) -> usize {
        self.rows.div_ceil(self.rpt)
    }

    /// Run task `k`: weight rows `k·rpt..` of this matrix against all `m` activation rows.
    ///
    /// # Safety
    /// `out` must still point into a live `[m, rows]` buffer that no one else touches, and no
    /// other call may run the same task `k` concurrently.
    unsafe fn run(&self, k: usize, m: usize, cols: usize) {
        let r0 = k * self.rpt;
        let r1 = (r0 + self.rpt).min(self.rows);
        let w = &self.w[r0 * self.row_bytes..r1 * self.row_bytes];
        let out = self.out.at_row(r0);
        match self.kernel {
            Kernel::Tiled(t, a) => quant_tile::rows(
                t,
                quant_tile::WeightRows {
                    bytes: w,
                    row_bytes: self.row_bytes,
                },
                a,
                m,
                cols,
                out,
            ),
            Kernel::Fused(kern, a, ar) => {
                for (r, wr) in w.chunks_exact(self.row_bytes).enumerate() {
                    for i in 0..m {
                        out.put(r, i, kern(cols, wr, &a[i * ar..(i + 1) * ar]));
                    }
                }
            }
        }
    }
}

/// See [`crate::ComputeBackend::linear_many`]: every matrix holds ggml blocks, with the
/// same `cols` (checked by the caller with [`crate::Matrix::check`] and `check_io`).
pub(super) fn quant_matmul_many(
    isa: Isa,
    x: &[f32],
    m: usize,
    projs: &mut [Proj<'_>],
) -> Result<(), ComputeError> {
    let Some(cols) = projs.first().map(|p| p.w.cols) else {
        return Ok(());
    };
    if m == 0 || cols == 0 {
        for p in projs.iter_mut() {
            quant::quant_matmul(isa, &p.w, x, m, p.y)?;
        }
        return Ok(());
    }
    for batch in projs.chunks_mut(MAX_PROJS) {
        batch_many(isa, x, m, cols, batch)?;
    }
    Ok(())
}

/// The kernel kind of a matrix in a batch.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Tile kernel on Q8_0 split rows.
    TiledQ8,
    /// Tile kernel on Q8_K rows.
    TiledQ8K,
    /// Fused per-row kernel on Q8_K rows.
    FusedQ8K,
    /// The per-matrix path ([`quant::quant_matmul`]): Q8_0 activations without tile kernels
    /// (scalar ISA) and dequantize-then-dot formats.
    Rest,
}

fn kind(format: QuantFormat, isa: Isa) -> Kind {
    if let Some(t) = quant_tile::tiled(format, isa) {
        return match t.act_format() {
            QuantFormat::Q8_K => Kind::TiledQ8K,
            _ => Kind::TiledQ8,
        };
    }
    match quant::fused(format, isa) {
        Some((QuantFormat::Q8_K, _)) => Kind::FusedQ8K,
        _ => Kind::Rest,
    }
}

/// At most [`MAX_PROJS`] matrices (weights already checked): activations quantized once per
/// activation format (into per-thread buffers), then the weight rows of all matrices cut into
/// tasks of one rayon parallel region, then the [`Kind::Rest`] matrices one by one.
fn batch_many(
    isa: Isa,
    x: &[f32],
    m: usize,
    cols: usize,
    projs: &mut [Proj<'_>],
) -> Result<(), ComputeError> {
    debug_assert!(projs.len() <= MAX_PROJS);
    let mut kinds = [Kind::Rest; MAX_PROJS];
    for (k, p) in kinds.iter_mut().zip(projs.iter()) {
        *k = kind(p.w.blocks_data()?.0, isa);
    }
    let kinds = &kinds[..projs.len()];
    let need_q8 = kinds.contains(&Kind::TiledQ8);
    let need_q8k = kinds
        .iter()
        .any(|k| matches!(k, Kind::TiledQ8K | Kind::FusedQ8K));
    with_q8_opt(need_q8, x, m, cols, |q8| {
        with_q8k_opt(need_q8k, x, m, cols, |q8k| {
            run_batch(isa, m, cols, projs, kinds, q8, q8k)
        })
    })???;
    for (p, &k) in projs.iter_mut().zip(kinds) {
        if k == Kind::Rest {
            quant::quant_matmul(isa, &p.w, x, m, p.y)?;
        }
    }
    Ok(())
}

/// `f(Some(Q8_0 split rows of x))` when `need`, else `f(None)`.
fn with_q8_opt<R>(
    need: bool,
    x: &[f32],
    m: usize,
    cols: usize,
    f: impl FnOnce(Option<&Q8Rows>) -> R,
) -> Result<R, ComputeError> {
    if need {
        Q8Rows::with_thread_buffer(x, m, cols, |a| f(Some(a)))
    } else {
        Ok(f(None))
    }
}

/// `f(Some((Q8_K rows of x, bytes per row)))` when `need`, else `f(None)`.
fn with_q8k_opt<R>(
    need: bool,
    x: &[f32],
    m: usize,
    cols: usize,
    f: impl FnOnce(Option<(&[u8], usize)>) -> R,
) -> Result<R, ComputeError> {
    if need {
        quant::with_acts(QuantFormat::Q8_K, x, m, cols, |a, ar| f(Some((a, ar))))
    } else {
        Ok(f(None))
    }
}

/// The tiled and fused matrices of a batch, in one parallel region.
fn run_batch(
    isa: Isa,
    m: usize,
    cols: usize,
    projs: &mut [Proj<'_>],
    kinds: &[Kind],
    q8: Option<&Q8Rows>,
    q8k: Option<(&[u8], usize)>,
) -> Result<(), ComputeError> {
    let mut plans: [Option<Plan<'_>>; MAX_PROJS] = [None; MAX_PROJS];
    // First task index of each plan, and one past the last.
    let mut starts = [0usize; MAX_PROJS + 1];
    let mut total = 0usize;
    let mut serial_cost = 0usize;
    for (pi, (p, &kd)) in projs.iter_mut().zip(kinds).enumerate() {
        starts[pi] = total;
        let (format, bytes) = p.w.blocks_data()?;
        let kernel = match (kd, q8, q8k) {
            (Kind::TiledQ8, Some(a), _) => {
                quant_tile::tiled(format, isa).map(|t| Kernel::Tiled(t, TileActs::Q8(a)))
            }
            (Kind::TiledQ8K, _, Some((a, _))) => {
                quant_tile::tiled(format, isa).map(|t| Kernel::Tiled(t, TileActs::Q8K(a)))
            }
            (Kind::FusedQ8K, _, Some((a, ar))) => {
                quant::fused(format, isa).map(|(_, k)| Kernel::Fused(k, a, ar))
            }
            _ => None,
        };
        let Some(kernel) = kernel else { continue };
        let rows = p.w.rows;
        if rows == 0 {
            continue;
        }
        let rb = format.bytes_for(cols)?;
        serial_cost += rows * rb * m;
        let plan = Plan {
            kernel,
            w: bytes,
            row_bytes: rb,
            rows,
            rpt: Split::new(rows, rb * m).rows_per_task,
            out: OutMat::rows_last(p.y, m, rows),
        };
        total += plan.tasks();
        plans[pi] = Some(plan);
    }
    starts[projs.len()] = total;
    let plans = &plans[..projs.len()];
    let starts = &starts[..=projs.len()];
    let run = |task: usize| {
        // The plan whose task range holds `task` (plans without tasks have empty ranges).
        let pi = starts.partition_point(|&s| s <= task) - 1;
        if let Some(plan) = &plans[pi] {
            // SAFETY: task indices are distinct across the loop below, each task owns the
            // columns of its own weight rows of its matrix's `p.y` (borrowed mutably by
            // `projs` for the whole call and not otherwise touched until the tasks are done).
            unsafe { plan.run(task - starts[pi], m, cols) }
        }
    };
    if Split::serial_for(serial_cost) {
        (0..total).for_each(run);
    } else {
        (0..total).into_par_iter().for_each(run);
    }
    Ok(())
}
