//! `C = A·Bᵀ` and `C = A·B` through `matrixmultiply::sgemm` (B read through strides, never
//! copied), split into column blocks of C or row blocks of A across rayon threads.

use super::gemv::{gemv, vecmat};
use crate::backend::check_product as check;
use crate::shared_out::SharedOut;
use rayon::prelude::*;
use std::ops::Range;

/// Below this many multiply-adds the product runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 18;
/// Column blocks are multiples of this (sgemm's widest micro-kernel is 16 columns).
const COL_ALIGN: usize = 16;

/// How B is stored.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BLayout {
    /// `[n, k]` row-major (a Linear weight); the product uses `Bᵀ`.
    Transposed,
    /// `[k, n]` row-major (a feature-major table such as `down_features`).
    Plain,
}

/// `C[m×n] = A[m×k]·B[n×k]ᵀ`; see [`crate::ComputeBackend::matmul_transb`].
pub fn matmul_transb(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    check("matmul_transb", a, b, m, k, n, c);
    if m == 1 && n > 0 {
        gemv(b, a, n, k, c);
    } else {
        gemm(a, b, m, k, n, c, BLayout::Transposed);
    }
}

/// `C[m×n] = A[m×k]·B[k×n]`; see [`crate::ComputeBackend::matmul`].
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    check("matmul", a, b, m, k, n, c);
    if m == 1 && n > 0 {
        vecmat(a, b, k, n, c);
    } else {
        gemm(a, b, m, k, n, c, BLayout::Plain);
    }
}

/// The sizes of a product `C[m×n] = A[m×k]·B[k×n]` (B possibly stored transposed, `[n, k]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Dims {
    /// Rows of A and C.
    pub(super) m: usize,
    /// Columns of A, rows of B: the summed dimension.
    pub(super) k: usize,
    /// Columns of B and C.
    pub(super) n: usize,
}

/// Shapes already checked.
fn gemm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32], layout: BLayout) {
    if m == 0 || n == 0 {
        return;
    }
    let dims = Dims { m, k, n };
    let threads = rayon::current_num_threads();
    if threads <= 1 || m * n * k < PAR_MIN_WORK {
        // SAFETY: shapes checked by the caller; c is exclusively borrowed.
        unsafe { sgemm_block(a, b, dims, 0..n, c.as_mut_ptr(), layout) };
        return;
    }
    let col_chunk = n.div_ceil(threads).div_ceil(COL_ALIGN) * COL_ALIGN;
    if n >= threads * COL_ALIGN {
        // Split the columns of C (= rows of a transposed B): each thread streams its own part of B.
        let out = SharedOut(c.as_mut_ptr());
        let n_chunks = n.div_ceil(col_chunk);
        (0..n_chunks).into_par_iter().for_each(|ci| {
            let j0 = ci * col_chunk;
            let j1 = (j0 + col_chunk).min(n);
            // SAFETY: column ranges [j0, j1) of the chunks are disjoint and cover 0..n; each
            // call writes only those columns of the m rows of C.
            unsafe { sgemm_block(a, b, dims, j0..j1, out.get(), layout) };
        });
    } else {
        // Few columns, many rows: split the rows of A / C instead.
        let rows = m.div_ceil(threads);
        c.par_chunks_mut(rows * n)
            .zip(a.par_chunks(rows * k))
            .for_each(|(cs, as_)| {
                let part = Dims {
                    m: cs.len() / n,
                    ..dims
                };
                // SAFETY: cs is this thread's [part.m, n] block of C, as_ the matching rows of A.
                unsafe { sgemm_block(as_, b, part, 0..n, cs.as_mut_ptr(), layout) };
            });
    }
}

/// Columns `cols` (`j0..j1`) of `C = A·op(B)` of sizes `dims` into `c` (`[m, n]` row-major,
/// pointing at column 0).
///
/// # Safety
/// `a` is `[m, k]`, `b` holds `n·k` values in `layout`, and `c` is valid for writes of rows
/// `0..m` (stride `n`), columns `j0..j1 ≤ n`; no other thread writes those elements meanwhile.
unsafe fn sgemm_block(
    a: &[f32],
    b: &[f32],
    dims: Dims,
    cols: Range<usize>,
    c: *mut f32,
    layout: BLayout,
) {
    let Dims { m, k, n } = dims;
    let Range { start: j0, end: j1 } = cols;
    debug_assert!(a.len() >= m * k && b.len() >= n * k && j0 <= j1 && j1 <= n);
    // op(B) as a [k, n] matrix. Transposed: element (p, j) = b[j*k + p] → strides (1, k).
    // Plain: element (p, j) = b[p*n + j] → strides (n, 1).
    let (b0, strides) = match layout {
        BLayout::Transposed => (b.as_ptr().add(j0 * k), (1, k as isize)),
        BLayout::Plain => (b.as_ptr().add(j0), (n as isize, 1)),
    };
    let block = Dims { m, k, n: j1 - j0 };
    sgemm_strided(a, block, b0, strides, c.add(j0), n);
}

/// `C = A·B` through `matrixmultiply::sgemm` for the sizes `dims`: `A` `[m, k]` row-major f32,
/// `B` the `[k, n]` f32 matrix at `b` read with (row, column) strides `b_strides`, and `C` the
/// `[m, n]` f32 matrix at `c` with rows `c_row_stride` values apart (columns contiguous),
/// overwritten.
///
/// # Safety
/// `a` holds `m·k` values, `b` is valid for reads of the `[k, n]` matrix under `b_strides`, and
/// `c` is valid for writes of `m` rows × `n` columns at stride `c_row_stride`, written by no
/// other thread meanwhile.
#[inline]
pub(super) unsafe fn sgemm_strided(
    a: &[f32],
    dims: Dims,
    b: *const f32,
    (rsb, csb): (isize, isize),
    c: *mut f32,
    c_row_stride: usize,
) {
    let Dims { m, k, n } = dims;
    matrixmultiply::sgemm(
        m,
        k,
        n,
        1.0,
        a.as_ptr(),
        k as isize,
        1,
        b,
        rsb,
        csb,
        0.0,
        c,
        c_row_stride as isize,
        1,
    );
}
