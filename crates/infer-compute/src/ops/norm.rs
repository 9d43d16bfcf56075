//! RMSNorm and LayerNorm over rows.

/// RMSNorm of each row of `x` (row length `w.len()`), into `out` (same shape as `x`):
///
/// `out = x · rsqrt(mean(x²) + eps) · (w + weight_offset)`
///
/// HF `LlamaRMSNorm` (`weight_offset = 0`) and `GemmaRMSNorm` (`weight_offset = 1`, i.e.
/// `(1 + w)`), both computed in f32. The mean of squares is accumulated in f64 (closer to the
/// exact value than any f32 order), the scale rounded to f32, then `(x · scale) · (w + offset)`
/// in f32. Panics if `x.len()` is not a multiple of `w.len()` or `out.len() != x.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, weight_offset: f32, out: &mut [f32]) {
    check_rows("rms_norm", x.len(), w.len());
    assert_eq!(
        out.len(),
        x.len(),
        "rms_norm: out has {} values, want {}",
        out.len(),
        x.len()
    );
    if w.is_empty() {
        return;
    }
    for (xr, or) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        let scale = rms_scale(xr, eps);
        for ((o, &xi), &wi) in or.iter_mut().zip(xr).zip(w) {
            *o = (xi * scale) * (wi + weight_offset);
        }
    }
}

/// [`rms_norm`] writing back into `x` (e.g. per-head q/k norms over `[T·heads, head_dim]`).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32, weight_offset: f32) {
    check_rows("rms_norm_inplace", x.len(), w.len());
    if w.is_empty() {
        return;
    }
    for xr in x.chunks_exact_mut(w.len()) {
        let scale = rms_scale(xr, eps);
        for (xi, &wi) in xr.iter_mut().zip(w) {
            *xi = (*xi * scale) * (wi + weight_offset);
        }
    }
}

/// `rsqrt(mean(x²) + eps)` rounded to f32.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = ss / x.len() as f64;
    (1.0 / (mean + eps as f64).sqrt()) as f32
}

/// LayerNorm of each row of `x` (row length `w.len()`), into `out`:
///
/// `out = (x − mean) / sqrt(var + eps) · w + b`, `var` the biased variance (divide by n),
/// as `torch.nn.functional.layer_norm`. Mean and variance are accumulated in f64.
/// `b = None` means no bias. Panics on length mismatch.
pub fn layer_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    check_rows("layer_norm", x.len(), w.len());
    assert_eq!(
        out.len(),
        x.len(),
        "layer_norm: out has {} values, want {}",
        out.len(),
        x.len()
    );
    if let Some(b) = b {
        assert_eq!(
            b.len(),
            w.len(),
            "layer_norm: bias has {} values, want {}",
            b.len(),
            w.len()
        );
    }
    let d = w.len();
    if d == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (i, (o, &xi)) in or.iter_mut().zip(xr).enumerate() {
            let n = ((xi as f64 - mean) * inv) as f32;
            *o = n * w[i] + b.map_or(0.0, |b| b[i]);
        }
    }
}

fn check_rows(what: &str, n: usize, d: usize) {
    assert!(
        (d == 0 && n == 0) || (d != 0 && n.is_multiple_of(d)),
        "{what}: input of {n} values is not whole rows of {d}"
    );
}
