//! Softmax, soft-capping and simple in-place arithmetic.

/// Numerically stable softmax of one row in place: `e^(x−max) / Σ e^(x−max)` (f32 exps, sum
/// accumulated in f64). An empty slice is left as is; a row of all `−∞` becomes NaN, as in torch.
pub fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Soft-cap `cap · tanh(x / cap)` (Gemma-2 attention and final-logit soft-capping,
/// HF `Gemma2Attention` / `Gemma2ForCausalLM`).
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

/// [`softcap`] of every element in place.
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    for v in x {
        *v = softcap(*v, cap);
    }
}

/// `x[i] += y[i]` (residual add). Panics if the lengths differ.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_inplace: length mismatch");
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x[i] *= s`.
pub fn scale_inplace(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}
