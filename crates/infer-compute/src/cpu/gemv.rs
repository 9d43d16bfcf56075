//! Matrix–vector products: `y = B·x` parallel over output rows, and `y = x·B` parallel over
//! output columns.

use super::dot::{axpy, dot};
use rayon::prelude::*;

/// Below this many multiply-adds the product runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 15;

/// `y[n] = B[n×k] · x[k]`, `B` row-major. Every `y[i]` is written. Panics on length mismatch.
pub fn gemv(b: &[f32], x: &[f32], n: usize, k: usize, y: &mut [f32]) {
    assert_eq!(
        b.len(),
        n * k,
        "gemv: b has {} values, want n*k = {n}*{k}",
        b.len()
    );
    assert_eq!(x.len(), k, "gemv: x has {} values, want k = {k}", x.len());
    assert_eq!(y.len(), n, "gemv: y has {} values, want n = {n}", y.len());
    if k == 0 {
        y.fill(0.0);
        return;
    }
    let threads = rayon::current_num_threads();
    if threads <= 1 || n * k < PAR_MIN_WORK {
        for (yi, row) in y.iter_mut().zip(b.chunks_exact(k)) {
            *yi = dot(row, x);
        }
        return;
    }
    // ~4 chunks per thread for load balance, at least 8 rows per chunk.
    let rows = n.div_ceil(threads * 4).max(8);
    y.par_chunks_mut(rows)
        .zip(b.par_chunks(rows * k))
        .for_each(|(ys, bs)| {
            debug_assert_eq!(bs.len(), ys.len() * k);
            for (yi, row) in ys.iter_mut().zip(bs.chunks_exact(k)) {
                *yi = dot(row, x);
            }
        });
}

/// Columns of `y` per task in [`vecmat`] (a multiple of the vector width).
const VECMAT_COLS: usize = 256;

/// `y[n] = x[k] · B[k×n]`, `B` row-major (`y = Σ_p x[p]·B[p, :]`, row-wise axpy so every load
/// of B is contiguous). Every `y[j]` is written. Panics on length mismatch.
pub fn vecmat(x: &[f32], b: &[f32], k: usize, n: usize, y: &mut [f32]) {
    assert_eq!(
        b.len(),
        n * k,
        "vecmat: b has {} values, want k*n = {k}*{n}",
        b.len()
    );
    assert_eq!(x.len(), k, "vecmat: x has {} values, want k = {k}", x.len());
    assert_eq!(y.len(), n, "vecmat: y has {} values, want n = {n}", y.len());
    let block = |j0: usize, ys: &mut [f32]| {
        ys.fill(0.0);
        let w = ys.len();
        for (p, &xp) in x.iter().enumerate() {
            axpy(xp, &b[p * n + j0..][..w], ys);
        }
    };
    if rayon::current_num_threads() <= 1 || n * k < PAR_MIN_WORK || n <= VECMAT_COLS {
        y.chunks_mut(VECMAT_COLS)
            .enumerate()
            .for_each(|(ci, ys)| block(ci * VECMAT_COLS, ys));
        return;
    }
    y.par_chunks_mut(VECMAT_COLS)
        .enumerate()
        .for_each(|(ci, ys)| block(ci * VECMAT_COLS, ys));
}
