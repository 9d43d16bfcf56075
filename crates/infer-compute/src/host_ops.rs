//! The whole operations of [`crate::ComputeBackend`] on the host (the CPU backend's, and the
//! trait's defaults): shape checks that return [`ComputeError::ShapeMismatch`], then the f32
//! routines of [`crate::ops`], [`crate::rope`] and [`crate::attention`].

use crate::ops::{self, Activation};
use crate::{
    Argmax, AttentionInput, AttentionParams, ComputeError, FloatTable, Norm, NormKind, RopeConfig,
};

/// `Err(ShapeMismatch)` unless `got == expected`.
pub(crate) fn check(
    what: &'static str,
    got: usize,
    expected: usize,
    unit: &'static str,
) -> Result<(), ComputeError> {
    if got != expected {
        return Err(ComputeError::ShapeMismatch {
            what,
            expected,
            got,
            unit,
        });
    }
    Ok(())
}

/// `x` must be whole rows of the norm's width (and the bias as wide as the weight).
pub(crate) fn check_norm(norm: &Norm<'_>, len: usize) -> Result<(), ComputeError> {
    let d = norm.weight.len();
    if let Some(b) = norm.bias {
        check("norm bias", b.len(), d, "values")?;
    }
    if (d == 0 && len != 0) || (d != 0 && !len.is_multiple_of(d)) {
        return Err(ComputeError::ShapeMismatch {
            what: "norm input (whole rows of the weight's width)",
            expected: len.div_ceil(d.max(1)) * d,
            got: len,
            unit: "values",
        });
    }
    Ok(())
}

/// Row-wise host operations on at least this many values (and two or more rows) are split
/// across rayon's pool by whole rows (each row's arithmetic unchanged): in batched decode the
/// RMSNorms and the gated activation of 16 rows ran on the calling thread while the other
/// threads waited (~2% of a 16-sequence SmolLM2 step on 2 threads); one row stays serial.
pub(crate) const PAR_ROW_VALUES: usize = 8192;

/// `f` over chunks of whole rows (`width` values each) of `x` and `y`, split across rayon's
/// pool when there are at least [`PAR_ROW_VALUES`] values in two or more rows, else once over
/// all of them.
fn by_rows<A: Sync, B: Send>(
    x: &[A],
    y: &mut [B],
    width: usize,
    f: impl Fn(&[A], &mut [B]) + Sync,
) {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    let rows = x.len() / width.max(1);
    if threads < 2 || rows < 2 || x.len() < PAR_ROW_VALUES || y.len() != x.len() {
        return f(x, y);
    }
    let chunk = rows.div_ceil(threads) * width;
    x.par_chunks(chunk)
        .zip(y.par_chunks_mut(chunk))
        .for_each(|(xc, yc)| f(xc, yc));
}

pub(crate) fn norm(n: &Norm<'_>, x: &[f32], out: &mut [f32]) -> Result<(), ComputeError> {
    check_norm(n, x.len())?;
    check("norm output", out.len(), x.len(), "values")?;
    match n.kind {
        NormKind::Rms { offset } => by_rows(x, out, n.weight.len(), |xc, oc| {
            ops::rms_norm(xc, n.weight, n.eps, offset, oc)
        }),
        NormKind::Layer => ops::layer_norm(x, n.weight, n.bias, n.eps, out),
    }
    Ok(())
}

pub(crate) fn norm_inplace(n: &Norm<'_>, x: &mut [f32]) -> Result<(), ComputeError> {
    check_norm(n, x.len())?;
    match n.kind {
        NormKind::Rms { offset } if x.len() >= PAR_ROW_VALUES => {
            // Rows split across the pool (`by_rows` over the rows' own values).
            use rayon::prelude::*;
            let d = n.weight.len().max(1);
            let chunk = (x.len() / d).div_ceil(rayon::current_num_threads()) * d;
            x.par_chunks_mut(chunk.max(d))
                .for_each(|xc| ops::rms_norm_inplace(xc, n.weight, n.eps, offset));
        }
        NormKind::Rms { offset } => ops::rms_norm_inplace(x, n.weight, n.eps, offset),
        NormKind::Layer => {
            let input = x.to_vec();
            ops::layer_norm(&input, n.weight, n.bias, n.eps, x);
        }
    }
    Ok(())
}

pub(crate) fn rope(
    x: &mut [f32],
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
    crate::apply_rope(x, n_heads, positions, cfg);
    Ok(())
}

/// [`crate::attention`] of one sequence after shape checks; `in_task`: the caller already runs
/// sequences in parallel, so the decode row path stays on this thread (same result).
pub(crate) fn attention<T: crate::KvElem>(
    a: &AttentionInput<'_, T>,
    p: &AttentionParams,
    out: &mut [f32],
    in_task: bool,
) -> Result<(), ComputeError> {
    let (q_row, kv_row) = (p.n_q_heads * p.head_dim, p.n_kv_heads * p.head_dim);
    if p.n_kv_heads == 0 || !p.n_q_heads.is_multiple_of(p.n_kv_heads) {
        return Err(ComputeError::ShapeMismatch {
            what: "attention heads (n_kv_heads must divide n_q_heads)",
            expected: p.n_q_heads,
            got: p.n_kv_heads,
            unit: "kv heads",
        });
    }
    check(
        "attention q",
        a.q.len(),
        a.positions.len() * q_row,
        "values",
    )?;
    check("attention output", out.len(), a.q.len(), "values")?;
    for (what, c) in [
        ("attention k cache", a.k_cache),
        ("attention v cache", a.v_cache),
    ] {
        if c.len() < a.t_kv * kv_row {
            return Err(ComputeError::ShapeMismatch {
                what,
                expected: a.t_kv * kv_row,
                got: c.len(),
                unit: "values (at least)",
            });
        }
    }
    if let Some(&pos) = a.positions.iter().find(|&&pos| pos >= a.t_kv) {
        return Err(ComputeError::ShapeMismatch {
            what: "attention query position (must be < t_kv)",
            expected: a.t_kv,
            got: pos,
            unit: "position",
        });
    }
    if in_task {
        crate::attention::attention_in_task(a.q, a.k_cache, a.v_cache, a.positions, a.t_kv, p, out);
    } else {
        crate::attention(a.q, a.k_cache, a.v_cache, a.positions, a.t_kv, p, out);
    }
    Ok(())
}

/// Copy `src` (whole rows) into a host KV cache tensor from value `offset` on: an f32 cache
/// as it is, an f16 cache rounded to nearest even (`half`'s conversion, F16C where present).
/// Errors: the range past the tensor's end, a tensor not in host memory.
pub(crate) fn store_kv(
    what: &'static str,
    cache: &mut crate::Tensor,
    offset: usize,
    src: &[f32],
) -> Result<(), ComputeError> {
    use half::slice::HalfFloatSliceExt;
    if let Some(c) = cache.host_f16_mut() {
        let r = range(what, c.len(), offset, src.len())?;
        c[r].convert_from_f32_slice(src);
        return Ok(());
    }
    let c = crate::backend::host_mut(what, cache)?;
    let r = range(what, c.len(), offset, src.len())?;
    c[r].copy_from_slice(src);
    Ok(())
}

/// Copy `dst.len()` values of a host KV cache tensor from value `offset` on into `dst`
/// (widening an f16 cache exactly). Errors as [`store_kv`].
pub(crate) fn load_kv(
    what: &'static str,
    cache: &crate::Tensor,
    offset: usize,
    dst: &mut [f32],
) -> Result<(), ComputeError> {
    use half::slice::HalfFloatSliceExt;
    if let Some(c) = cache.host_f16() {
        let r = range(what, c.len(), offset, dst.len())?;
        c[r].convert_to_f32_slice(dst);
        return Ok(());
    }
    let c = crate::backend::host(what, cache)?;
    let r = range(what, c.len(), offset, dst.len())?;
    dst.copy_from_slice(&c[r]);
    Ok(())
}

pub(crate) fn gated_activation(
    act: Activation,
    gate: &[f32],
    up: &mut [f32],
) -> Result<(), ComputeError> {
    check("gated activation up", up.len(), gate.len(), "values")?;
    // Element-wise: any split gives the same values.
    by_rows(gate, up, 64, |g, u| ops::gated_mul_fast(act, g, u));
    Ok(())
}

pub(crate) fn add_scaled(x: &mut [f32], y: &[f32], alpha: f32) -> Result<(), ComputeError> {
    check("residual branch", y.len(), x.len(), "values")?;
    if alpha == 1.0 {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    } else {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b * alpha);
    }
    Ok(())
}

/// `x[r] += sigmoid(gate[r]) · y[r]` per row `r` of `x` and `y` (`[R, width]`, `R =
/// gate.len()`), `sigmoid(z) = 1 / (1 + e^{-z})` in f32 (HF `Qwen2MoeSparseMoeBlock`'s
/// shared-expert gate). Errors: [`check_gated`].
pub(crate) fn add_gated(
    x: &mut [f32],
    y: &[f32],
    gate: &[f32],
    width: usize,
) -> Result<(), ComputeError> {
    check_gated(x.len(), y.len(), gate.len(), width)?;
    for ((xr, yr), &z) in x
        .chunks_exact_mut(width.max(1))
        .zip(y.chunks_exact(width.max(1)))
        .zip(gate)
    {
        let w = 1.0 / (1.0 + (-z).exp());
        xr.iter_mut().zip(yr).for_each(|(a, b)| *a += w * b);
    }
    Ok(())
}

/// The shapes of [`crate::ComputeBackend::add_gated`]: `y` as long as `x`, one gate per row of
/// `width`. Errors: [`ComputeError::ShapeMismatch`].
pub(crate) fn check_gated(
    x_len: usize,
    y_len: usize,
    gates: usize,
    width: usize,
) -> Result<(), ComputeError> {
    check("gated branch", y_len, x_len, "values")?;
    check("gate logits (one per row)", gates * width, x_len, "values")
}

pub(crate) fn embed(
    table: FloatTable<'_>,
    ids: &[u32],
    scale: f32,
    out: &mut [f32],
) -> Result<(), ComputeError> {
    let h = if ids.is_empty() {
        0
    } else {
        out.len() / ids.len()
    };
    check("embedding output", out.len(), ids.len() * h, "values")?;
    let rows = table.len().checked_div(h).unwrap_or(0);
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(h.max(1))) {
        let i = id as usize;
        if i >= rows {
            return Err(ComputeError::ShapeMismatch {
                what: "embedding row (token id < rows)",
                expected: rows,
                got: i,
                unit: "row",
            });
        }
        match table {
            FloatTable::F32(t) => row.copy_from_slice(&t[i * h..(i + 1) * h]),
            FloatTable::F16(t) => row
                .iter_mut()
                .zip(&t[i * h..(i + 1) * h])
                .for_each(|(o, w)| *o = w.to_f32()),
            FloatTable::Blocks { format, bytes } => {
                // `rows` counted whole rows of blocks, so row `i` is in bounds.
                let rb = format.bytes_for(h)?;
                infer_quant::dequantize(format, &bytes[i * rb..(i + 1) * rb], row)?;
            }
        }
        if scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
    Ok(())
}

/// The token ids of greedy choices for a lookup in a table of `rows` rows: a choice past the
/// table (a row without a finite logit, whose step the caller discards) reads row 0.
pub(crate) fn chosen_ids(picks: &[Argmax], rows: usize) -> Vec<u32> {
    picks
        .iter()
        .map(|a| {
            if (a.token as usize) < rows {
                a.token
            } else {
                0
            }
        })
        .collect()
}

/// The largest finite value of `logits` (ties → the smaller index) and whether all are finite
/// ([`crate::ComputeBackend::argmax`]). Errors: empty logits.
pub(crate) fn argmax(logits: &[f32]) -> Result<Argmax, ComputeError> {
    if logits.is_empty() {
        return Err(ComputeError::ShapeMismatch {
            what: "argmax logits",
            expected: 1,
            got: 0,
            unit: "values (at least)",
        });
    }
    #[cfg(target_arch = "x86_64")]
    if crate::vec_dot::avx2_available() {
        // SAFETY: AVX2 detected.
        return Ok(unsafe { argmax_avx2(logits) });
    }
    Ok(argmax_scalar(logits))
}

/// [`argmax`], one value at a time (the definition).
fn argmax_scalar(logits: &[f32]) -> Argmax {
    let mut best: Option<(usize, f32)> = None;
    let mut all_finite = true;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_finite() {
            all_finite = false;
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    Argmax {
        token: best.map_or(0, |(i, _)| i as u32),
        all_finite,
    }
}

/// [`argmax_scalar`] in two AVX2 passes (the greedy choice of a batched decode step scanned
/// 16 × 49152 logits one by one on the calling thread, ~1.4% of the step): the largest finite
/// value (non-finite lanes as −∞), then the first index holding it (`==`, so −0 and +0 tie as
/// in the scalar `>`).
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn argmax_avx2(x: &[f32]) -> Argmax {
    use std::arch::x86_64::*;
    let n8 = x.len() / 8 * 8;
    let p = x.as_ptr();
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut best = neg_inf;
    let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for i in (0..n8).step_by(8) {
        let v = _mm256_loadu_ps(p.add(i));
        // |v| < ∞, ordered: false for NaN and ±∞.
        let f = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_and_ps(v, abs), inf);
        finite = _mm256_and_ps(finite, f);
        best = _mm256_max_ps(best, _mm256_blendv_ps(neg_inf, v, f));
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), best);
    let mut m = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut all_finite = _mm256_movemask_ps(finite) == 0xff;
    for &v in &x[n8..] {
        if v.is_finite() {
            m = m.max(v);
        } else {
            all_finite = false;
        }
    }
    // No finite value: −∞ stays (a finite value is never −∞).
    if m == f32::NEG_INFINITY {
        return Argmax {
            token: 0,
            all_finite,
        };
    }
    let mv = _mm256_set1_ps(m);
    let mut token = None;
    for i in (0..n8).step_by(8) {
        let eq = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_loadu_ps(p.add(i)), mv));
        if eq != 0 {
            token = Some(i + eq.trailing_zeros() as usize);
            break;
        }
    }
    let token = token.unwrap_or_else(|| n8 + x[n8..].iter().position(|&v| v == m).unwrap_or(0));
    Argmax {
        token: token as u32,
        all_finite,
    }
}

/// `Ok` when `len` values are whole rows of a non-zero `width` (the logits of `argmax_rows`),
/// else a shape error.
pub(crate) fn check_argmax_rows(len: usize, width: usize) -> Result<(), ComputeError> {
    check_whole_rows("argmax rows (whole rows of the width)", len, width)
}

/// `offset..offset + n` when it lies within `len` values, else a shape error naming `what`.
pub(crate) fn range(
    what: &'static str,
    len: usize,
    offset: usize,
    n: usize,
) -> Result<std::ops::Range<usize>, ComputeError> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(offset..end),
        _ => Err(ComputeError::ShapeMismatch {
            what,
            expected: len,
            got: offset.saturating_add(n),
            unit: "values (end of the range, at most)",
        }),
    }
}

pub(crate) fn copy_rows(
    src: &[f32],
    width: usize,
    rows: &[usize],
    dst: &mut [f32],
) -> Result<(), ComputeError> {
    check_row_indices(rows, src.len().checked_div(width).unwrap_or(0))?;
    for (&r, d) in rows.iter().zip(dst.chunks_exact_mut(width.max(1))) {
        d.copy_from_slice(&src[r * width..(r + 1) * width]);
    }
    Ok(())
}

pub(crate) fn add_rows_scaled(
    src: &[f32],
    width: usize,
    rows: &[usize],
    weights: &[f32],
    dst: &mut [f32],
) -> Result<(), ComputeError> {
    check_scatter(src.len(), width, rows, weights, dst.len())?;
    for ((&r, &w), s) in rows.iter().zip(weights).zip(src.chunks_exact(width.max(1))) {
        let d = &mut dst[r * width..(r + 1) * width];
        d.iter_mut().zip(s).for_each(|(a, b)| *a += w * b);
    }
    Ok(())
}

/// The shapes of [`crate::ComputeBackend::add_rows_scaled`]: `src` is `rows.len()` rows of
/// `width`, one weight per row, every index below `dst`'s rows and none repeated. Errors:
/// [`ComputeError::ShapeMismatch`].
pub(crate) fn check_scatter(
    src_len: usize,
    width: usize,
    rows: &[usize],
    weights: &[f32],
    dst_len: usize,
) -> Result<(), ComputeError> {
    check("add_rows_scaled src", src_len, rows.len() * width, "values")?;
    check(
        "add_rows_scaled weights",
        weights.len(),
        rows.len(),
        "values",
    )?;
    let n = dst_len.checked_div(width).unwrap_or(0);
    check_row_indices(rows, n)?;
    // A decode step's few rows are compared pairwise (no allocation); a chunk's marked.
    let repeated = if rows.len() <= 32 {
        rows.iter()
            .enumerate()
            .any(|(i, r)| rows[i + 1..].contains(r))
    } else {
        let mut seen = vec![false; n];
        rows.iter().any(|&r| std::mem::replace(&mut seen[r], true))
    };
    if repeated {
        return Err(ComputeError::ShapeMismatch {
            what: "add_rows_scaled row (each index once)",
            expected: 1,
            got: 2,
            unit: "uses",
        });
    }
    Ok(())
}

/// The shapes of [`crate::ComputeBackend::moe_route`]: `logits` whole rows of `n ≥ 1`
/// experts, `1 ≤ k ≤ n`, a bias of `n` values. Returns the rows. Errors:
/// [`ComputeError::ShapeMismatch`].
pub(crate) fn check_route(
    logits_len: usize,
    n: usize,
    bias: Option<&[f32]>,
    k: usize,
) -> Result<usize, ComputeError> {
    check_whole_rows(
        "moe_route logits (whole rows of num_experts)",
        logits_len,
        n,
    )?;
    if k == 0 || k > n {
        return Err(ComputeError::ShapeMismatch {
            what: "moe_route top-k (1 ≤ k ≤ num_experts)",
            expected: n,
            got: k,
            unit: "experts",
        });
    }
    if let Some(b) = bias {
        check("moe_route router bias", b.len(), n, "values")?;
    }
    Ok(logits_len / n)
}

/// [`crate::ComputeBackend::moe_route`] on host slices (shapes checked by [`check_route`]):
/// each row of `logits` (`experts` wide) chosen by [`crate::ops::moe_route`] into its `2·k`
/// values of `sel`.
pub(crate) fn moe_route_rows(
    logits: &[f32],
    experts: usize,
    bias: Option<&[f32]>,
    k: usize,
    norm: bool,
    sel: &mut [f32],
) {
    let mut probs = vec![0.0f32; experts];
    for (row, s) in logits
        .chunks_exact(experts)
        .zip(sel.chunks_exact_mut(2 * k))
    {
        probs.copy_from_slice(row);
        let chosen = crate::ops::moe_route(&mut probs, bias, k, norm);
        for (i, &(e, w)) in chosen.iter().enumerate() {
            s[i] = e as f32;
            s[k + i] = w;
        }
    }
}

/// The shapes of [`crate::ComputeBackend::project_routed`]: products with experts, each
/// product's experts of one shape and all of one width, `x` one row of it or `k` rows, `k`
/// slots in `sel` (`2·k` values at least). Returns the width (`cols`). Errors:
/// [`ComputeError::ShapeMismatch`].
pub(crate) fn check_routed(
    projs: &[crate::RoutedProj<'_>],
    x_len: usize,
    sel_len: usize,
    k: usize,
) -> Result<usize, ComputeError> {
    check(
        "project_routed sel (2·k values from moe_route)",
        sel_len,
        2 * k,
        "values",
    )?;
    let n = projs.first().map_or(0, |p| p.experts.len());
    let cols = projs
        .first()
        .and_then(|p| p.experts.first())
        .map_or(0, |e| e.cols);
    for p in projs {
        check("project_routed experts", p.experts.len(), n, "matrices")?;
        let Some(e0) = p.experts.first() else {
            return Err(ComputeError::ShapeMismatch {
                what: "project_routed experts (at least one)",
                expected: 1,
                got: 0,
                unit: "matrices",
            });
        };
        check(
            "project_routed expert cols (one width)",
            e0.cols,
            cols,
            "values",
        )?;
        if let Some(e) = p
            .experts
            .iter()
            .find(|e| (e.rows, e.cols) != (e0.rows, e0.cols))
        {
            return Err(ComputeError::ShapeMismatch {
                what: "project_routed expert rows × cols (one shape)",
                expected: e0.rows * e0.cols,
                got: e.rows * e.cols,
                unit: "values",
            });
        }
    }
    if x_len != cols && x_len != k * cols {
        return Err(ComputeError::ShapeMismatch {
            what: "project_routed x (one row, or one per slot)",
            expected: k * cols,
            got: x_len,
            unit: "values",
        });
    }
    Ok(cols)
}

/// The shapes of [`crate::ComputeBackend::combine_routed`]: `y` whole rows of `k` slots, `k`
/// slots in `sel`. Returns the row width. Errors: [`ComputeError::ShapeMismatch`].
pub(crate) fn check_combine(y_len: usize, sel_len: usize, k: usize) -> Result<usize, ComputeError> {
    check(
        "combine_routed sel (2·k values from moe_route)",
        sel_len,
        2 * k,
        "values",
    )?;
    check_whole_rows("combine_routed y (k whole rows)", y_len, k)?;
    Ok(y_len / k)
}

/// The shapes of [`crate::ComputeBackend::project_grouped`]: experts as
/// [`check_routed`] demands them (one shape per product, one width for all), every group of at
/// least one row and an expert index in range, `x` the groups' rows. Returns the row width
/// (`cols`). Errors: [`ComputeError::ShapeMismatch`].
pub(crate) fn check_grouped(
    projs: &[crate::RoutedProj<'_>],
    x_len: usize,
    groups: &[crate::ExpertRows],
) -> Result<usize, ComputeError> {
    // The experts' shapes: those of a routed product of one slot over one row of their width.
    let cols = projs
        .first()
        .and_then(|p| p.experts.first())
        .map_or(0, |e| e.cols);
    check_routed(projs, cols, 2, 1)?;
    let n = projs.first().map_or(0, |p| p.experts.len());
    let mut total = 0usize;
    for g in groups {
        if g.rows == 0 || g.expert >= n {
            return Err(ComputeError::ShapeMismatch {
                what: "project_grouped group (rows ≥ 1, expert below the experts)",
                expected: n,
                got: g.expert,
                unit: "experts",
            });
        }
        total += g.rows;
    }
    check(
        "project_grouped x (the groups' rows)",
        x_len,
        total * cols,
        "values",
    )?;
    Ok(cols)
}

/// The shapes of [`crate::ComputeBackend::combine_rows`]: `k ≥ 1` slots per token, one weight
/// per slot, every slot a row of `y` (`[R, width]`). Returns the token count. Errors:
/// [`ComputeError::ShapeMismatch`].
pub(crate) fn check_combine_rows(
    y_len: usize,
    width: usize,
    slots: &[usize],
    weights: &[f32],
    k: usize,
) -> Result<usize, ComputeError> {
    check_whole_rows("combine_rows slots (k per token)", slots.len(), k)?;
    check(
        "combine_rows weights (one per slot)",
        weights.len(),
        slots.len(),
        "weights",
    )?;
    check_whole_rows("combine_rows y (whole rows of the width)", y_len, width)?;
    check_row_indices(slots, y_len / width)?;
    Ok(slots.len() / k)
}

/// [`crate::ComputeBackend::combine_rows`] on host slices (shapes checked by
/// [`check_combine_rows`]).
pub(crate) fn combine_rows(
    y: &[f32],
    width: usize,
    slots: &[usize],
    weights: &[f32],
    k: usize,
    out: &mut [f32],
) {
    for ((o, s), w) in out
        .chunks_exact_mut(width)
        .zip(slots.chunks_exact(k))
        .zip(weights.chunks_exact(k))
    {
        o.fill(0.0);
        for (&r, &wj) in s.iter().zip(w) {
            o.iter_mut()
                .zip(&y[r * width..(r + 1) * width])
                .for_each(|(a, b)| *a += wj * b);
        }
    }
}

/// `Err(ShapeMismatch)` unless `len` values are whole rows of `width ≥ 1` (`what` names them).
pub(crate) fn check_whole_rows(
    what: &'static str,
    len: usize,
    width: usize,
) -> Result<(), ComputeError> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(ComputeError::ShapeMismatch {
            what,
            expected: width.max(1),
            got: len,
            unit: "values",
        });
    }
    Ok(())
}

/// The expert index `id` (an f32 of [`crate::ComputeBackend::moe_route`]'s `sel`) below `n`.
/// Errors: [`ComputeError::ShapeMismatch`].
pub fn expert_index(id: f32, n: usize) -> Result<usize, ComputeError> {
    let e = id as usize;
    if id < 0.0 || id.fract() != 0.0 || e >= n {
        return Err(ComputeError::ShapeMismatch {
            what: "expert index (a choice of moe_route)",
            expected: n,
            got: e,
            unit: "experts",
        });
    }
    Ok(e)
}

pub(crate) fn add_bias(y: &mut [f32], bias: &[f32]) -> Result<(), ComputeError> {
    check_bias(y.len(), bias)?;
    for row in y.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
    }
    Ok(())
}

pub(crate) fn scale_softcap(x: &mut [f32], divisor: f32, softcap: Option<f32>) {
    if divisor != 1.0 {
        x.iter_mut().for_each(|v| *v /= divisor);
    }
    if let Some(cap) = softcap {
        x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    }
}

/// The shapes of an [`crate::ComputeBackend::attend`] step, shared by every backend: heads that
/// divide, `q`/`k`/`v` of the batch's rows, slots in batch order, each cache with room for its
/// new rows (K and V caches of one length), one sink per query head when there are sinks.
/// Errors: [`ComputeError::ShapeMismatch`].
pub(crate) fn check_attend(
    a: &crate::Attend<'_, '_>,
    p: &AttentionParams,
) -> Result<(), ComputeError> {
    if p.n_kv_heads == 0 || !p.n_q_heads.is_multiple_of(p.n_kv_heads) {
        return Err(ComputeError::ShapeMismatch {
            what: "attention heads (n_kv_heads must divide n_q_heads)",
            expected: p.n_q_heads,
            got: p.n_kv_heads,
            unit: "kv heads",
        });
    }
    if let Some(s) = p.sinks {
        check(
            "attention sinks (one per query head)",
            s.len(),
            p.n_q_heads,
            "values",
        )?;
    }
    let (qd, kvd) = (p.n_q_heads * p.head_dim, p.n_kv_heads * p.head_dim);
    let rows: usize = a.seqs.iter().map(|s| s.rows).sum();
    check("attention q", a.q.len(), rows * qd, "values")?;
    check("attention k", a.k.len(), rows * kvd, "values")?;
    check("attention v", a.v.len(), rows * kvd, "values")?;
    let mut row = 0;
    for s in a.seqs.iter() {
        check("attention slot rows (batch order)", s.row0, row, "row")?;
        let end = s.start + s.rows;
        if s.k_cache.len() < end * kvd || s.v_cache.len() != s.k_cache.len() {
            return Err(ComputeError::ShapeMismatch {
                what: "KV cache (room for the new rows)",
                expected: end * kvd,
                got: s.k_cache.len().min(s.v_cache.len()),
                unit: "values (at least)",
            });
        }
        row += s.rows;
    }
    Ok(())
}

/// `Err(ShapeMismatch)` unless every index of `rows` is below `n` (rows of the source).
pub(crate) fn check_row_indices(rows: &[usize], n: usize) -> Result<(), ComputeError> {
    match rows.iter().find(|&&r| r >= n) {
        Some(&r) => Err(ComputeError::ShapeMismatch {
            what: "row index (below the source's rows)",
            expected: n,
            got: r,
            unit: "row",
        }),
        None => Ok(()),
    }
}

/// `Err(ShapeMismatch)` unless `len` values are whole rows of `bias`'s width.
pub(crate) fn check_bias(len: usize, bias: &[f32]) -> Result<(), ComputeError> {
    if bias.is_empty() || !len.is_multiple_of(bias.len()) {
        return Err(ComputeError::ShapeMismatch {
            what: "bias rows (whole rows of the bias's width)",
            expected: len.div_ceil(bias.len().max(1)) * bias.len(),
            got: len,
            unit: "values",
        });
    }
    Ok(())
}

/// [`crate::ComputeBackend::attend`] on host tensors: per sequence, the KV store then
/// [`attention`]; several sequences run in parallel (each attention call parallelises over
/// heads by itself only at long contexts).
pub(crate) fn attend(
    a: &mut crate::Attend<'_, '_>,
    p: &AttentionParams,
    out: &mut crate::Tensor,
) -> Result<(), ComputeError> {
    use crate::backend::{host, host_mut};
    check_attend(a, p)?;
    let (qd, kvd) = (p.n_q_heads * p.head_dim, p.n_kv_heads * p.head_dim);
    let (q, k, v) = (
        host("attend", a.q)?,
        host("attend", a.k)?,
        host("attend", a.v)?,
    );
    let out = host_mut("attend", out)?;
    check("attention output", out.len(), q.len(), "values")?;
    let in_task = a.seqs.len() > 1;
    let one = |s: &mut crate::KvSlot<'_>, out: &mut [f32]| -> Result<(), ComputeError> {
        let r = s.row0..s.row0 + s.rows;
        let end = s.start + s.rows;
        // The new rows as the cache stores them (rounded for f16): each row then attends to
        // its own key and value as later steps will read them.
        store_kv(
            "attend",
            s.k_cache,
            s.start * kvd,
            &k[r.start * kvd..r.end * kvd],
        )?;
        store_kv(
            "attend",
            s.v_cache,
            s.start * kvd,
            &v[r.start * kvd..r.end * kvd],
        )?;
        let positions: smallvec::SmallVec<[usize; 16]> = (s.start..end).collect();
        let q = &q[r.start * qd..r.end * qd];
        if let (Some(kc), Some(vc)) = (s.k_cache.host_f16(), s.v_cache.host_f16()) {
            let input = AttentionInput {
                q,
                k_cache: kc,
                v_cache: vc,
                positions: &positions,
                t_kv: end,
            };
            return attention(&input, p, out, in_task);
        }
        let input = AttentionInput {
            q,
            k_cache: host("attend", s.k_cache)?,
            v_cache: host("attend", s.v_cache)?,
            positions: &positions,
            t_kv: end,
        };
        attention(&input, p, out, in_task)
    };
    // Each sequence's rows of `out`, in batch order.
    let mut outs = smallvec::SmallVec::<[&mut [f32]; 4]>::new();
    let mut rest = &mut out[..];
    for s in a.seqs.iter() {
        let (head, tail) = rest.split_at_mut(s.rows * qd);
        outs.push(head);
        rest = tail;
    }
    if let ([s], [o]) = (&mut a.seqs[..], &mut outs[..]) {
        return one(s, o);
    }
    use rayon::prelude::*;
    a.seqs
        .par_iter_mut()
        .zip(outs.par_iter_mut())
        .try_for_each(|(s, o)| one(s, o))
}

#[cfg(test)]
mod argmax_tests {
    /// The AVX2 argmax gives the scalar definition's choice and finiteness on random rows with
    /// ties, signed zeros, NaN, ±∞, all-non-finite rows and every tail length.
    #[test]
    fn simd_argmax_equals_the_scalar_definition() {
        let mut next = crate::vec_dot::xorshift(0x1234_5678_9abc_def1);
        let specials = [
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.5,
            -1.5,
        ];
        for len in 1..70usize {
            for trial in 0..40 {
                let x: Vec<f32> = (0..len)
                    .map(|_| {
                        let r = next();
                        match (r % 8, trial % 4) {
                            (0, _) | (1, 0) => specials[(r >> 8) as usize % specials.len()],
                            (_, 3) => f32::NAN,
                            _ => ((r >> 16) % 7) as f32 - 3.0,
                        }
                    })
                    .collect();
                let got = super::argmax(&x).unwrap();
                let want = super::argmax_scalar(&x);
                assert_eq!(got, want, "len {len} trial {trial}: {x:?}");
            }
        }
    }
}

#[cfg(test)]
mod row_split_tests {
    use crate::ops::{self, Activation};
    use crate::{Norm, NormKind};

    /// RMSNorm (out of place and in place) and the gated activation split across a two-thread
    /// pool by rows give the bits of one call over all rows.
    #[test]
    fn split_rows_give_the_bits_of_one_call() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut next = crate::vec_dot::xorshift(0x5151_2727_9393_1111);
        let mut f = || ((next() % 20001) as f32 - 10000.0) * 1e-3;
        for (rows, width) in [(16usize, 576usize), (33, 512), (3, 4096)] {
            let x: Vec<f32> = (0..rows * width).map(|_| f()).collect();
            let w: Vec<f32> = (0..width).map(|_| f()).collect();
            let n = Norm {
                kind: NormKind::Rms { offset: 0.0 },
                weight: &w,
                bias: None,
                eps: 1e-5,
            };
            let mut want = vec![0f32; x.len()];
            ops::rms_norm(&x, &w, 1e-5, 0.0, &mut want);
            let mut got = vec![0f32; x.len()];
            let mut inplace = x.clone();
            pool.install(|| {
                super::norm(&n, &x, &mut got).unwrap();
                super::norm_inplace(&n, &mut inplace).unwrap();
            });
            assert_eq!(got, want, "{rows}x{width}");
            assert_eq!(inplace, want, "{rows}x{width} in place");
            let gate: Vec<f32> = (0..x.len()).map(|_| f()).collect();
            let mut want = x.clone();
            ops::gated_mul_fast(Activation::Silu, &gate, &mut want);
            let mut got = x.clone();
            pool.install(|| super::gated_activation(Activation::Silu, &gate, &mut got).unwrap());
            assert_eq!(got, want, "{rows}x{width} gated");
        }
    }
}
