//! The walk FFN over the vindex's feature-major float tier: feature i is a key gᵢ (gate row),
//! a modulator uᵢ (up row) and a value dᵢ (down row), and
//! `FFN(x) = Σᵢ act(gᵢ·x)·(uᵢ·x)·dᵢ` (non-gated: `Σᵢ act(uᵢ·x)·dᵢ`).

use infer_compute::{ops, ComputeBackend};
use infer_models::{Activation, FfnType};

use crate::layer::{DownLayout, WalkFfn};
use crate::scratch::fit;

/// The exact activation of the float path (f64-accurate SiLU / GELU).
pub(crate) fn activation_fn(a: Activation) -> fn(f32) -> f32 {
    match a {
        Activation::Silu => ops::silu,
        Activation::GeluTanh => ops::gelu_tanh,
        Activation::Gelu => ops::gelu,
    }
}

/// Walk FFN over all features (exact), as matrix products on `x` `[T, hidden]`:
/// `A = act(X·Gᵀ) ⊙ (X·Uᵀ)` `[T, inter]` (in `up`; `gate` is scratch), then `out = A · D`
/// `[T, hidden]` (D feature-major `[inter, hidden]`, or `A · Dᵀ` for a Linear-layout down).
/// f16 tables are multiplied in place ([`crate::layer::FloatRows`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_ffn(
    backend: &dyn ComputeBackend,
    w: &WalkFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
    gate: &mut Vec<f32>,
    up: &mut Vec<f32>,
    out: &mut Vec<f32>,
) {
    let (h, inter) = (g.hidden_size, w.intermediate_size);
    let up = fit(up, t * inter);
    w.up.matmul_transb(backend, x, t, h, inter, up);
    if let Some(b) = &w.up_bias {
        for row in up.chunks_exact_mut(inter) {
            row.iter_mut().zip(b.iter()).for_each(|(a, b)| *a += b);
        }
    }
    let act = activation_fn(g.activation);
    match (g.ffn_type, &w.gate) {
        (FfnType::Gated, Some(gate_w)) => {
            let gate = fit(gate, t * inter);
            gate_w.matmul_transb(backend, x, t, h, inter, gate);
            up.iter_mut()
                .zip(gate.iter())
                .for_each(|(u, gv)| *u *= act(*gv));
        }
        _ => up.iter_mut().for_each(|u| *u = act(*u)),
    }
    let out = fit(out, t * h);
    match w.down_layout {
        DownLayout::FeatureMajor => w.down.matmul(backend, up, t, inter, h, out),
        DownLayout::Linear => w.down.matmul_transb(backend, up, t, inter, h, out),
    }
    if let Some(b) = &w.down_bias {
        for row in out.chunks_exact_mut(h) {
            row.iter_mut().zip(b.iter()).for_each(|(a, b)| *a += b);
        }
    }
}
