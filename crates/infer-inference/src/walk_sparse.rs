//! Sparse walk FFN (issue 8): per token, keep the K features with the largest |gᵢ·x| (the gate
//! KNN) and compute `Σ_{i ∈ top-K} act(gᵢ·x)·(uᵢ·x)·dᵢ` reading only the selected up and down
//! rows (feature-major, so one feature is one contiguous row of each table).
//!
//! Candidate scores come from the float gate rows (the full gate mat-vec, whose values are then
//! used exactly) or from the Q4_0 gate copy (`gate_vectors_q4.bin` through
//! [`ComputeBackend::linear`]), in which case the selected features' gate values are
//! recomputed exactly from the float rows. Without a gate (`FfnType::Standard`) the scores are
//! the activations `act(uᵢ·x + bᵢ)` themselves. K = all never comes here: the dense matrix path
//! in [`crate::walk`] runs instead.

use infer_compute::{ComputeBackend, QuantFormat};
use rayon::prelude::*;

use crate::layer::{FloatRows, LayerGeometry, WalkFfn};
use crate::scratch::fit;
use crate::InferenceError;

/// Features whose coefficients one task computes.
const COEF_CHUNK: usize = 64;
/// Smallest output-column chunk of the down accumulation given to one task (a multiple of the
/// vector width).
const MIN_COLS: usize = 64;

/// One layer's sparse-walk setting, resolved when the model is built (`--walk-k`,
/// `--walk-select`).
#[derive(Clone, Copy, Debug)]
pub struct SparseWalk<'a> {
    /// Features kept per token, `1..intermediate` (K = all means no `SparseWalk`).
    pub k: usize,
    /// The Q4_0 gate copy `[intermediate, hidden]` (ggml blocks, row-major) when candidates
    /// are scored from it; `None`: scored from the float gate rows.
    pub gate_q4: Option<&'a [u8]>,
}

/// Reusable buffers of a walk-FFN layer (exact or sparse), grown to the largest batch seen, so
/// that a decode step allocates nothing once grown.
#[derive(Debug, Default)]
pub struct WalkBuffers {
    /// Exact path: gate products `[T, intermediate]`; sparse: candidate scores, same shape.
    pub(crate) gate: Vec<f32>,
    /// Exact path: up products, then activations `[T, intermediate]`; sparse: coefficients
    /// `act(gᵢ·x)(uᵢ·x)` of the selected features `[T, K]`.
    pub(crate) up: Vec<f32>,
    /// Sparse: feature indices per token `[T, intermediate]`, the first K the selected ones.
    pub(crate) idx: Vec<u32>,
}

/// Put the indices of the `k` largest `|scores[i]|` (ties: lower index first) into `idx[..k]`,
/// in increasing index order, by partial selection (`select_nth_unstable_by`, no full sort).
/// `idx.len() == scores.len()`, `1 ≤ k ≤ scores.len()`.
pub fn select_top_k(scores: &[f32], k: usize, idx: &mut [u32]) {
    debug_assert_eq!(idx.len(), scores.len());
    idx.iter_mut().enumerate().for_each(|(i, v)| *v = i as u32);
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            let (sa, sb) = (scores[a as usize].abs(), scores[b as usize].abs());
            sb.total_cmp(&sa).then(a.cmp(&b))
        });
    }
    // Increasing feature order: the selected rows are then read front to back.
    idx[..k].sort_unstable();
}

/// Selected features ahead of the one being processed whose rows are prefetched: the rows are
/// scattered, so the hardware prefetcher restarts at every row; asking for the next rows early
/// keeps the memory system busy (≈ 2.5× faster row gathers measured on SmolLM2 layers).
const PREFETCH_AHEAD: usize = 4;

/// Hint the CPU to load `row(i)[c0 .. c0 + len]` of rows of `width` values into cache (no-op on
/// other architectures and for an out-of-range row).
#[inline(always)]
fn prefetch(rows: &FloatRows<'_>, i: usize, width: usize, c0: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let r = i * width + c0..i * width + c0 + len;
        let (ptr, bytes) = match rows {
            FloatRows::F32(v) => match v.get(r) {
                Some(s) => (s.as_ptr() as *const i8, len * 4),
                None => return,
            },
            FloatRows::F16(v) => match v.get(r) {
                Some(s) => (s.as_ptr() as *const i8, len * 2),
                None => return,
            },
            FloatRows::Blocks { .. } => return,
        };
        for off in (0..bytes).step_by(64) {
            // SAFETY: SSE is part of the x86-64 baseline; a prefetch never faults, and the
            // address lies inside the slice.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    ptr.wrapping_add(off),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, i, width, c0, len);
}

/// `y = Σₙ c[n] · row(sel[n])[c0 .. c0 + y.len()]` over rows of `width` values (`y` is
/// overwritten). f32 rows go four at a time (four concurrent memory streams, one pass over `y`
/// per four rows); f16 rows one at a time through `axpy_f16`.
fn accumulate_rows(
    rows: &FloatRows<'_>,
    sel: &[u32],
    c: &[f32],
    width: usize,
    c0: usize,
    y: &mut [f32],
) {
    y.fill(0.0);
    let len = y.len();
    let mut n = 0;
    if let FloatRows::F32(v) = rows {
        let row = |i: u32| &v[i as usize * width + c0..i as usize * width + c0 + len];
        while n + 4 <= sel.len() {
            if let Some(&next) = sel.get(n + 4 + PREFETCH_AHEAD) {
                prefetch(rows, next as usize, width, c0, len);
            }
            let (r0, r1, r2, r3) = (
                row(sel[n]),
                row(sel[n + 1]),
                row(sel[n + 2]),
                row(sel[n + 3]),
            );
            let (a0, a1, a2, a3) = (c[n], c[n + 1], c[n + 2], c[n + 3]);
            for ((((yv, &x0), &x1), &x2), &x3) in y.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
                *yv += (a0 * x0 + a1 * x1) + (a2 * x2 + a3 * x3);
            }
            n += 4;
        }
    }
    for m in n..sel.len() {
        if let Some(&next) = sel.get(m + PREFETCH_AHEAD) {
            prefetch(rows, next as usize, width, c0, len);
        }
        axpy_cols(rows, c[m], sel[m] as usize, width, c0, y);
    }
}

/// `out[n] = row(sel[n]) · x` over rows of `x.len()` values. f32 rows go four at a time (four
/// concurrent memory streams, 8-wide partial sums); f16 rows one at a time (`dot_f16`).
fn dot_rows(rows: &FloatRows<'_>, sel: &[u32], x: &[f32], out: &mut [f32]) {
    let k = x.len();
    let mut n = 0;
    if let FloatRows::F32(v) = rows {
        let row = |i: u32| &v[i as usize * k..(i as usize + 1) * k];
        while n + 4 <= sel.len() {
            if let Some(&next) = sel.get(n + 4 + PREFETCH_AHEAD) {
                prefetch(rows, next as usize, k, 0, k);
            }
            let r = [
                row(sel[n]),
                row(sel[n + 1]),
                row(sel[n + 2]),
                row(sel[n + 3]),
            ];
            out[n..n + 4].copy_from_slice(&dot4(r, x));
            n += 4;
        }
    }
    for m in n..sel.len() {
        if let Some(&next) = sel.get(m + PREFETCH_AHEAD) {
            prefetch(rows, next as usize, k, 0, k);
        }
        out[m] = rows.dot_row(sel[m] as usize, x);
    }
}

/// Four dot products with one activation vector: 8 partial sums per row, reduced pairwise.
fn dot4(r: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA, checked just above.
            return unsafe { dot4_avx2(r, x) };
        }
    }
    dot4_generic(r, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4_avx2(r: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    dot4_generic(r, x)
}

#[inline(always)]
fn dot4_generic(r: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    let mut acc = [[0f32; 8]; 4];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        let xs = &x[c * 8..c * 8 + 8];
        for (a, row) in acc.iter_mut().zip(&r) {
            let rs = &row[c * 8..c * 8 + 8];
            for ((s, &p), &q) in a.iter_mut().zip(rs).zip(xs) {
                *s += p * q;
            }
        }
    }
    let mut out = [0f32; 4];
    for ((o, a), row) in out.iter_mut().zip(&acc).zip(&r) {
        let tail: f32 = (chunks * 8..x.len()).map(|j| row[j] * x[j]).sum();
        *o = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])) + tail;
    }
    out
}

/// `y += alpha · row(i)[c0 .. c0 + y.len()]` for rows of `width` values.
fn axpy_cols(rows: &FloatRows<'_>, alpha: f32, i: usize, width: usize, c0: usize, y: &mut [f32]) {
    let r = i * width + c0..i * width + c0 + y.len();
    match rows {
        FloatRows::F32(v) => y.iter_mut().zip(&v[r]).for_each(|(a, b)| *a += alpha * b),
        FloatRows::F16(v) => infer_compute::axpy_f16(alpha, &v[r], y),
        FloatRows::Blocks { .. } => {
            // Never a sparse walk's down table (those are feature-major floats); exact anyway.
            let mut row = vec![0.0; width];
            rows.axpy_row(1.0, i, &mut row);
            let n = y.len();
            y.iter_mut()
                .zip(&row[c0..c0 + n])
                .for_each(|(a, b)| *a += alpha * b);
        }
    }
}

/// One layer as the sparse walk runs it: its walk-FFN tables (feature-major down), its top-K
/// setting (the layer's `ffn.sparse`) and its geometry.
#[derive(Clone, Copy)]
pub(crate) struct SparseLayer<'r, 'w> {
    pub(crate) ffn: &'r WalkFfn<'w>,
    pub(crate) sparse: &'r SparseWalk<'w>,
    pub(crate) geometry: &'r LayerGeometry,
}

/// The sparse walk FFN of `x` `[T, hidden]` into `out` (resized to `[T, hidden]`): per token the
/// top-`layer.sparse.k` features by |score| (module docs), exact gate and up values for them,
/// and the sum of their down rows weighted by `act(gᵢ·x)(uᵢ·x)` (the layer's exact activation,
/// [`crate::walk::activation_fn`]); plus the down bias. The down table must be feature-major.
/// Errors: a Q4_0 gate copy whose size disagrees with the layer (from
/// [`ComputeBackend::linear`]).
pub(crate) fn sparse_walk_ffn(
    backend: &dyn ComputeBackend,
    layer: SparseLayer<'_, '_>,
    x: &[f32],
    t: usize,
    bufs: &mut WalkBuffers,
    out: &mut Vec<f32>,
) -> Result<(), InferenceError> {
    let SparseLayer {
        ffn: w,
        sparse: sp,
        geometry: g,
    } = layer;
    let act = crate::walk::activation_fn(g.activation);
    let (h, inter) = (g.hidden_size, w.intermediate_size);
    let k = sp.k.clamp(1, inter.max(1));
    let gate = match g.ffn_type {
        infer_models::FfnType::Gated => w.gate.as_ref(),
        infer_models::FfnType::Standard => None,
    };
    let scores = fit(&mut bufs.gate, t * inter);
    match (gate, sp.gate_q4) {
        (Some(_), Some(q4)) => {
            let q4 = infer_compute::Matrix::blocks(QuantFormat::Q4_0, q4, inter, h);
            backend.linear(&q4, x, t, scores)?
        }
        (Some(gw), None) => gw.matmul_transb(backend, x, t, h, inter, scores)?,
        (None, _) => {
            w.up.matmul_transb(backend, x, t, h, inter, scores)?;
            for row in scores.chunks_exact_mut(inter) {
                if let Some(b) = &w.up_bias {
                    row.iter_mut().zip(b.iter()).for_each(|(s, b)| *s += b);
                }
                row.iter_mut().for_each(|s| *s = act(*s));
            }
        }
    }
    let scores = &bufs.gate[..];
    bufs.idx.clear();
    bufs.idx.resize(t * inter, 0);
    let coef = fit(&mut bufs.up, t * k);
    let out = fit(out, t * h);
    let exact_gate = sp.gate_q4.is_none();
    let threads = rayon::current_num_threads().max(1);
    // One token: split the down accumulation by output columns across the pool; a batch is
    // already split by tokens.
    let cols = if t == 1 {
        (h.div_ceil(threads).div_ceil(16) * 16).max(MIN_COLS)
    } else {
        h
    };
    out.par_chunks_mut(h)
        .zip(bufs.idx.par_chunks_mut(inter))
        .zip(coef.par_chunks_mut(k))
        .zip(scores.par_chunks(inter))
        .zip(x.par_chunks(h))
        .for_each(|((((o, idx), c), s), xr)| {
            select_top_k(s, k, idx);
            let sel = &idx[..k];
            c.par_chunks_mut(COEF_CHUNK)
                .zip(sel.par_chunks(COEF_CHUNK))
                .for_each(|(cc, ss)| {
                    let Some(gw) = gate else {
                        // Non-gated: the scores are the activations.
                        cc.iter_mut()
                            .zip(ss)
                            .for_each(|(ci, &i)| *ci = s[i as usize]);
                        return;
                    };
                    // Up values into `cc`, then (Q4 selection) times the exact gate values.
                    dot_rows(&w.up, ss, xr, cc);
                    for (ci, &i) in cc.iter_mut().zip(ss) {
                        *ci += w.up_bias.as_ref().map_or(0.0, |b| b[i as usize]);
                    }
                    if exact_gate {
                        for (ci, &i) in cc.iter_mut().zip(ss) {
                            *ci *= act(s[i as usize]);
                        }
                    } else {
                        let mut gv = [0f32; COEF_CHUNK];
                        let gv = &mut gv[..ss.len()];
                        dot_rows(gw, ss, xr, gv);
                        for (ci, g) in cc.iter_mut().zip(gv.iter()) {
                            *ci *= act(*g);
                        }
                    }
                });
            let c = &*c;
            o.par_chunks_mut(cols).enumerate().for_each(|(j, oc)| {
                accumulate_rows(&w.down, sel, c, h, j * cols, oc);
            });
        });
    if let Some(b) = &w.down_bias {
        for row in out.chunks_exact_mut(h) {
            row.iter_mut().zip(b.iter()).for_each(|(a, b)| *a += b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{accumulate_rows, dot_rows, select_top_k};
    use crate::layer::FloatRows;
    use std::borrow::Cow;

    /// Rows of width 13 (not a multiple of the 8-wide partial sums), f32 and f16: the 4-row
    /// kernels equal one row at a time.
    #[test]
    fn row_kernels_match_single_rows() {
        let (width, n_rows) = (13, 11);
        let data: Vec<f32> = (0..width * n_rows)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) / 8.0)
            .collect();
        let x: Vec<f32> = (0..width).map(|i| (i as f32 - 6.0) / 4.0).collect();
        let sel = [0u32, 2, 3, 5, 6, 9, 10];
        let c: Vec<f32> = (0..sel.len()).map(|n| n as f32 - 2.5).collect();
        let f16s: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
        for rows in [
            FloatRows::F32(Cow::Borrowed(&data[..])),
            FloatRows::F16(Cow::Borrowed(&f16s[..])),
        ] {
            let mut got = vec![0f32; sel.len()];
            dot_rows(&rows, &sel, &x, &mut got);
            for (g, &i) in got.iter().zip(&sel) {
                let want = rows.dot_row(i as usize, &x);
                assert!(
                    (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "row {i}: {g} vs {want}"
                );
            }
            let mut acc = vec![9f32; 5];
            accumulate_rows(&rows, &sel, &c, width, 4, &mut acc);
            let mut want = vec![0f32; width];
            for (&i, &a) in sel.iter().zip(&c) {
                rows.axpy_row(a, i as usize, &mut want);
            }
            for (g, w) in acc.iter().zip(&want[4..9]) {
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
            }
        }
    }

    #[test]
    fn top_k_by_magnitude_with_index_ties() {
        let s = [0.1, -5.0, 3.0, 3.0, -0.2, 4.0, -3.0];
        let mut idx = [0u32; 7];
        select_top_k(&s, 3, &mut idx);
        assert_eq!(&idx[..3], &[1, 2, 5]);
        // |3| ties at indices 2, 3, 6: the lower index wins.
        select_top_k(&s, 4, &mut idx);
        assert_eq!(&idx[..4], &[1, 2, 3, 5]);
        select_top_k(&s, 7, &mut idx);
        assert_eq!(&idx[..], &[0, 1, 2, 3, 4, 5, 6]);
        select_top_k(&s, 1, &mut idx);
        assert_eq!(idx[0], 1);
    }
}
