//! [`crate::ComputeBackend::quant_matmul_many`] on the CPU: several quantized matrices times the
//! same activations (fused QKV, gate+up). The activations are quantized once per activation
//! format (Q8_0 split rows for the tile kernels, Q8_K for the K-quant kernels), and the weight
//! rows of all matrices are cut into tasks run in one rayon parallel region, so a decode step
//! pays one dispatch instead of one per matrix.

use super::quant::{self, Split};
use super::quant_tile::{self, TileActs, Tiled};
use crate::vec_dot::{Isa, OutMat, Q8Rows, VecDotFn};
use crate::{ComputeError, QuantProj};
use infer_quant::QuantFormat;
use rayon::prelude::*;

/// How one task multiplies its weight rows.
#[derive(Clone, Copy)]
enum Kernel<'a> {
    Tiled(Tiled, TileActs<'a>),
    /// Fused kernel, quantized activations (`m` rows of `act_row` bytes).
    Fused(VecDotFn, &'a [u8], usize),
}

/// Where a task writes.
enum Out<'a> {
    /// `[rows, m]` outputs of the task's weight rows (transposed when m > 1).
    Slice(&'a mut [f32]),
    /// The task's columns of the `[m, rows]` result.
    Mat(OutMat),
}

/// A block of weight rows of one matrix and its outputs.
struct Task<'a> {
    kernel: Kernel<'a>,
    w: &'a [u8],
    row_bytes: usize,
    out: Out<'a>,
}

/// See [`crate::ComputeBackend::quant_matmul_many`].
pub(super) fn quant_matmul_many(
    isa: Isa,
    x: &[f32],
    m: usize,
    cols: usize,
    projs: &mut [QuantProj<'_>],
) -> Result<(), ComputeError> {
    assert_eq!(
        x.len(),
        m * cols,
        "quant_matmul_many: x has {} values, want m*cols = {m}*{cols}",
        x.len()
    );
    for p in projs.iter() {
        assert_eq!(
            p.y.len(),
            m * p.rows,
            "quant_matmul_many: y has {} values, want m*rows = {m}*{}",
            p.y.len(),
            p.rows
        );
    }
    if m == 0 || cols == 0 {
        for p in projs.iter_mut() {
            quant::quant_matmul(isa, p.format, p.bytes, x, m, p.rows, cols, p.y)?;
        }
        return Ok(());
    }
    // Activations, quantized once per activation format.
    let mut q8_rows: Option<Q8Rows> = None;
    let mut q8_k: Option<Vec<u8>> = None;
    let mut row_bytes = Vec::with_capacity(projs.len());
    for p in projs.iter() {
        row_bytes.push(quant::check_weights(p.format, p.bytes, p.rows, cols)?);
        let act = match quant_tile::tiled(p.format, isa) {
            Some(t) => Some(t.act_format()),
            None => quant::fused(p.format, isa).map(|(a, _)| a),
        };
        match act {
            Some(QuantFormat::Q8_0)
                if quant_tile::tiled(p.format, isa).is_some() && q8_rows.is_none() =>
            {
                q8_rows = Some(Q8Rows::quantize(x, m, cols)?);
            }
            Some(QuantFormat::Q8_K) if q8_k.is_none() => {
                q8_k = Some(quant_tile::quantize_q8k(x, m, cols)?);
            }
            // Q8_0 activations without tile kernels (scalar ISA), dequantize-then-dot formats:
            // the per-matrix path.
            _ => {}
        }
    }
    let q8k_row = QuantFormat::Q8_K.bytes_for(cols).unwrap_or(0);
    // Transposed outputs (`[rows, m]`) of the non-tiled fused kernels when m > 1; tiled kernels
    // write straight into `p.y`.
    let mut yts: Vec<Option<Vec<f32>>> = Vec::new();
    let mut tasks: Vec<Task<'_>> = Vec::new();
    let mut rest: Vec<usize> = Vec::new();
    let mut serial_cost = 0usize;
    for p in projs.iter() {
        let fused_t = m > 1 && quant_tile::tiled(p.format, isa).is_none();
        yts.push(fused_t.then(|| vec![0f32; p.rows * m]));
    }
    {
        for (pi, (p, yt_slot)) in projs.iter_mut().zip(yts.iter_mut()).enumerate() {
            let kernel = if let Some(t) = quant_tile::tiled(p.format, isa) {
                match (t.act_format(), &q8_rows, &q8_k) {
                    (QuantFormat::Q8_K, _, Some(a)) => Kernel::Tiled(t, TileActs::Q8K(a)),
                    (_, Some(a), _) => Kernel::Tiled(t, TileActs::Q8(a)),
                    _ => unreachable!("activations quantized above"),
                }
            } else {
                match (quant::fused(p.format, isa), &q8_k) {
                    (Some((QuantFormat::Q8_K, k)), Some(a)) => Kernel::Fused(k, a, q8k_row),
                    _ => {
                        rest.push(pi);
                        continue;
                    }
                }
            };
            let rb = row_bytes[pi];
            if p.rows == 0 {
                continue;
            }
            serial_cost += p.rows * rb * m;
            let rpt = Split::new(p.rows, rb * m).rows_per_task;
            match kernel {
                Kernel::Tiled(..) => {
                    let om = OutMat::rows_last(p.y, m, p.rows);
                    for (k, w) in p.bytes.chunks(rpt * rb).enumerate() {
                        tasks.push(Task {
                            kernel,
                            w,
                            row_bytes: rb,
                            // SAFETY: k·rpt < rows (the chunk is not empty).
                            out: Out::Mat(unsafe { om.at_row(k * rpt) }),
                        });
                    }
                }
                Kernel::Fused(..) => {
                    let out: &mut [f32] = match yt_slot {
                        Some(yt) => yt,
                        None => &mut *p.y,
                    };
                    for (w, o) in p.bytes.chunks(rpt * rb).zip(out.chunks_mut(rpt * m)) {
                        tasks.push(Task {
                            kernel,
                            w,
                            row_bytes: rb,
                            out: Out::Slice(o),
                        });
                    }
                }
            }
        }
        let run = |t: Task<'_>| match (t.kernel, t.out) {
            // SAFETY: each task's `OutMat` covers the columns of its own weight rows only, in
            // a `p.y` that is not otherwise touched until the tasks are done.
            (Kernel::Tiled(k, a), Out::Mat(om)) => unsafe {
                quant_tile::rows(k, t.w, t.row_bytes, a, m, cols, om)
            },
            (Kernel::Fused(k, a, ar), Out::Slice(out)) => {
                for (w, o) in t.w.chunks_exact(t.row_bytes).zip(out.chunks_exact_mut(m)) {
                    for (i, oi) in o.iter_mut().enumerate() {
                        *oi = k(cols, w, &a[i * ar..(i + 1) * ar]);
                    }
                }
            }
            _ => unreachable!("task kernel and output kind are built together"),
        };
        if Split::serial_for(serial_cost) {
            tasks.into_iter().for_each(run);
        } else {
            tasks.into_par_iter().for_each(run);
        }
    }
    for (pi, (p, yt)) in projs.iter_mut().zip(&yts).enumerate() {
        if let (Some(yt), false) = (yt, rest.contains(&pi)) {
            quant::transpose_into(yt, m, p.rows, p.y);
        }
    }
    for pi in rest {
        let p = &mut projs[pi];
        quant::quant_matmul(isa, p.format, p.bytes, x, m, p.rows, cols, p.y)?;
    }
    Ok(())
}
