//! Mat-vec/mat-mat over the seed's Q8 attention format: int8 weights `[rows, cols]` with one f32
//! scale per 32 consecutive values of a row (`w = q · scale`, ggml `dequantize_row_q8_0`
//! semantics with the scale kept in f32 and stored apart from the values).
//!
//! Activations are quantized once per row to int8 with one f32 scale per 32 values
//! (`d = max|x| / 127`, `q = round(x / d)`, as ggml `quantize_row_q8_0_ref` but with an f32
//! `d`), then each block contributes `(Σ qw·qx) · sw · sx` with the sum in i32. On x86-64 with
//! AVX2 the blocks run through the tile kernels of `vec_dot::avx2_tile` (`(sw·sx)·Σ` per block,
//! one FMA; several activation rows per weight row), else through the scalar loop below.

use rayon::prelude::*;
use std::cell::Cell;

use crate::vec_dot::Q8Rows;
use crate::{scratch, ComputeError};

/// Values per scale.
pub const Q8_BLOCK: usize = 32;

/// Quantize one activation row to int8 values + f32 scales per 32.
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), db) in x
        .chunks_exact(Q8_BLOCK)
        .zip(q.chunks_exact_mut(Q8_BLOCK))
        .zip(d.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (qv, &xv) in qb.iter_mut().zip(xb) {
            *qv = (xv * inv).round() as i8;
        }
        *db = scale;
    }
}

fn dot_row(w: &[u8], ws: &[f32], q: &[i8], qs: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (((wb, &sw), qb), &sx) in w
        .chunks_exact(Q8_BLOCK)
        .zip(ws)
        .zip(q.chunks_exact(Q8_BLOCK))
        .zip(qs)
    {
        let mut s = 0i32;
        for (&a, &b) in wb.iter().zip(qb) {
            s += (a as i8 as i32) * (b as i32);
        }
        acc += s as f32 * sw * sx;
    }
    acc
}

/// `y[m×rows] = x[m×cols] · Wᵀ` for int8 `values` `[rows, cols]` and `scales` `[rows, cols/32]`.
/// Errors: `cols` not a multiple of 32, or a buffer length that disagrees with the shape.
pub fn q8_matmul(
    values: &[u8],
    scales: &[f32],
    x: &[f32],
    m: usize,
    rows: usize,
    cols: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    check_shapes(values, scales, x, m, rows, cols, y)?;
    let nb = cols / Q8_BLOCK;
    let mut q = scratch::take(&QS, m * cols);
    let mut qs = scratch::take(&DS, m * nb);
    for ((xr, qr), sr) in x
        .chunks_exact(cols.max(1))
        .zip(q.chunks_exact_mut(cols.max(1)))
        .zip(qs.chunks_exact_mut(nb.max(1)))
    {
        quantize_row(xr, qr, sr);
    }
    let acts = Q8Rows {
        qs: q,
        d: qs,
        m,
        cols,
    };
    #[cfg(target_arch = "x86_64")]
    if crate::vec_dot::avx2_available() && m > 0 && rows > 0 && cols > 0 {
        let out = crate::vec_dot::OutMat::rows_last(y, m, rows);
        let split = crate::cpu::Split::new(rows, cols * m);
        let rpt = split.rows_per_task;
        // SAFETY: AVX2 detected; task k owns weight rows k·rpt.. and exactly those columns of
        // `y` (in bounds: `out` covers m × rows); `y` outlives the parallel region.
        let task = |k: usize, vs: &[u8]| unsafe {
            let sc = &scales[k * rpt * nb..k * rpt * nb + vs.len() / Q8_BLOCK];
            crate::vec_dot::avx2_tile::rows_times_acts_q8s(vs, sc, &acts, out.at_row(k * rpt))
        };
        if split.serial {
            task(0, values);
        } else {
            values
                .par_chunks(rpt * cols)
                .enumerate()
                .for_each(|(k, vs)| task(k, vs));
        }
        scratch::give(&QS, acts.qs);
        scratch::give(&DS, acts.d);
        return Ok(());
    }
    scratch::with(&YT, rows * m, |yt| {
        scalar_matmul(values, scales, &acts, rows, yt, y)
    });
    scratch::give(&QS, acts.qs);
    scratch::give(&DS, acts.d);
    Ok(())
}

thread_local! {
    /// Quantized activations (values, scales) and the scalar path's transposed result, reused
    /// across calls (`crate::scratch`).
    static QS: Cell<Vec<i8>> = const { Cell::new(Vec::new()) };
    static DS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static YT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The portable path: `y[i*rows + r] = dot_row(W_r, A_i)` for the weights `values`/`scales`
/// (`[rows, cols]`, as [`q8_matmul`]) and the `acts.m` quantized activation rows `acts`
/// (`acts.cols` = `cols` values each); weight row r is read once for all m rows (into `yt`,
/// `[rows, m]`, then transposed into `y`, `[m, rows]`).
fn scalar_matmul(
    values: &[u8],
    scales: &[f32],
    acts: &Q8Rows,
    rows: usize,
    yt: &mut [f32],
    y: &mut [f32],
) {
    let (q, qs, m, cols) = (&acts.qs[..], &acts.d[..], acts.m, acts.cols);
    let nb = cols / Q8_BLOCK;
    yt.par_chunks_mut(m.max(1))
        .enumerate()
        .for_each(|(r, out)| {
            let w = &values[r * cols..(r + 1) * cols];
            let ws = &scales[r * nb..(r + 1) * nb];
            for (i, o) in out.iter_mut().enumerate() {
                *o = dot_row(
                    w,
                    ws,
                    &q[i * cols..(i + 1) * cols],
                    &qs[i * nb..(i + 1) * nb],
                );
            }
        });
    for r in 0..rows {
        for i in 0..m {
            y[i * rows + r] = yt[r * m + i];
        }
    }
}

/// The buffer checks of a seed-Q8 product (shared by every backend): `cols` a multiple of 32,
/// `values` `rows·cols` bytes, `scales` `rows·cols/32`, `x` `m·cols`, `y` `m·rows`; the first
/// mismatch as [`ComputeError::ShapeMismatch`].
pub(crate) fn check_shapes(
    values: &[u8],
    scales: &[f32],
    x: &[f32],
    m: usize,
    rows: usize,
    cols: usize,
    y: &[f32],
) -> Result<(), ComputeError> {
    let check = |what: &'static str, expected: usize, got: usize, unit: &'static str| {
        if expected == got {
            Ok(())
        } else {
            Err(ComputeError::ShapeMismatch {
                what,
                expected,
                got,
                unit,
            })
        }
    };
    check(
        "q8 columns (multiple of 32)",
        cols.div_ceil(Q8_BLOCK) * Q8_BLOCK,
        cols,
        "values",
    )?;
    check("q8 values", rows * cols, values.len(), "bytes")?;
    check("q8 scales", rows * cols / Q8_BLOCK, scales.len(), "scales")?;
    check("q8 activations", m * cols, x.len(), "values")?;
    check("q8 output", m * rows, y.len(), "values")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_path_matches_scalar_path_on_many_shapes() {
        let mut state = 0x1234_5678u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for cols in [32usize, 96, 576] {
            for (m, rows) in [
                (1usize, 1usize),
                (1, 67),
                (2, 7),
                (3, 300),
                (5, 9),
                (9, 33),
                (13, 64),
            ] {
                let nb = cols / 32;
                let values: Vec<u8> = (0..rows * cols)
                    .map(|_| ((next() % 255) as i32 - 127) as i8 as u8)
                    .collect();
                let scales: Vec<f32> = (0..rows * nb)
                    .map(|_| (next() % 1000) as f32 * 1e-5)
                    .collect();
                let x: Vec<f32> = (0..m * cols)
                    .map(|_| ((next() % 2001) as f32 - 1000.0) * 1e-3)
                    .collect();
                let mut y = vec![f32::NAN; m * rows];
                q8_matmul(&values, &scales, &x, m, rows, cols, &mut y).unwrap();
                let mut q = vec![0i8; m * cols];
                let mut qs = vec![0f32; m * nb];
                for ((xr, qr), sr) in x
                    .chunks_exact(cols)
                    .zip(q.chunks_exact_mut(cols))
                    .zip(qs.chunks_exact_mut(nb))
                {
                    quantize_row(xr, qr, sr);
                }
                let mut want = vec![f32::NAN; m * rows];
                let mut yt = vec![0f32; m * rows];
                let acts = Q8Rows {
                    qs: q,
                    d: qs,
                    m,
                    cols,
                };
                scalar_matmul(&values, &scales, &acts, rows, &mut yt, &mut want);
                let (q, qs) = (&acts.qs, &acts.d);
                for i in 0..m {
                    for r in 0..rows {
                        let mag: f64 = (0..cols)
                            .map(|c| {
                                (values[r * cols + c] as i8 as f64
                                    * scales[r * nb + c / 32] as f64
                                    * q[i * cols + c] as f64
                                    * qs[i * nb + c / 32] as f64)
                                    .abs()
                            })
                            .sum();
                        let (g, w) = (y[i * rows + r], want[i * rows + r]);
                        assert!(
                            g.is_finite() && (g as f64 - w as f64).abs() <= 2e-6 * mag.max(1e-30),
                            "m={m} {rows}x{cols} row {r} act {i}: {g} vs scalar {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matches_f64_reference_on_dequantized_values() {
        let (rows, cols, m) = (5, 96, 3);
        let values: Vec<u8> = (0..rows * cols)
            .map(|i| ((i * 37 % 255) as i32 - 127) as i8 as u8)
            .collect();
        let scales: Vec<f32> = (0..rows * cols / 32)
            .map(|i| 0.01 + i as f32 * 0.003)
            .collect();
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.1)
            .collect();
        let mut y = vec![f32::NAN; m * rows];
        q8_matmul(&values, &scales, &x, m, rows, cols, &mut y).unwrap();
        for i in 0..m {
            for r in 0..rows {
                let mut exact = 0f64;
                let mut mag = 0f64;
                for c in 0..cols {
                    let w =
                        (values[r * cols + c] as i8) as f64 * scales[r * cols / 32 + c / 32] as f64;
                    exact += w * x[i * cols + c] as f64;
                    mag += (w * x[i * cols + c] as f64).abs();
                }
                let got = y[i * rows + r] as f64;
                assert!(
                    (got - exact).abs() <= 1e-2 * mag,
                    "row {r} act {i}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let mut y = vec![0.0; 2];
        assert!(q8_matmul(&[0; 62], &[1.0; 2], &[0.0; 31], 1, 2, 31, &mut y).is_err());
        assert!(q8_matmul(&[0; 64], &[1.0; 1], &[0.0; 32], 1, 2, 32, &mut y).is_err());
    }
}
