//! Activation functions (scalar, f32 in/out, evaluated in f64 and rounded once).

use super::erf::erfc;

/// SiLU / swish: `x · σ(x) = x / (1 + e^(−x))` (HF `ACT2FN["silu"]`).
pub fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x / (1.0 + (-x).exp())) as f32
}

/// GELU, tanh approximation (HF `gelu_pytorch_tanh`, `NewGELUActivation`):
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// Exact GELU (HF `gelu`, `torch.nn.functional.gelu`): `0.5·x·(1 + erf(x/√2))`, evaluated as
/// `0.5·x·erfc(−x/√2)` so that large negative `x` keeps full relative precision.
pub fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)) as f32
}

/// gpt-oss's clamped SwiGLU of one (gate, up) pair, evaluated in f64 and rounded once (HF
/// `modeling_gpt_oss.py` `GptOssExperts.forward`): `g = min(gate, limit)`,
/// `u = clamp(up, −limit, limit)`, `(u + 1) · g · σ(alpha · g)`.
pub fn clamped_swiglu(gate: f32, up: f32, limit: f32, alpha: f32) -> f32 {
    let (limit, alpha) = (limit as f64, alpha as f64);
    let g = (gate as f64).min(limit);
    let u = (up as f64).clamp(-limit, limit);
    ((u + 1.0) * g / (1.0 + (-alpha * g).exp())) as f32
}

/// An FFN activation, chosen per model from its config (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// [`silu`] (`"silu"`, `"swish"`).
    Silu,
    /// [`gelu_tanh`] (`"gelu_pytorch_tanh"`, `"gelu_new"`).
    GeluTanh,
    /// [`gelu`] (`"gelu"`).
    Gelu,
}

impl Activation {
    /// The activation of one value.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => silu(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::Gelu => gelu(x),
        }
    }

    /// Apply to every element of `x` in place.
    pub fn apply_inplace(self, x: &mut [f32]) {
        for v in x {
            *v = self.apply(*v);
        }
    }

    /// Gated FFN combination in place: `gate[i] = act(gate[i]) · up[i]` (HF `LlamaMLP`:
    /// `down(act(gate(x)) * up(x))`). Panics if the lengths differ.
    pub fn gated_inplace(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(
            gate.len(),
            up.len(),
            "gated activation: gate/up length mismatch"
        );
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = self.apply(*g) * u;
        }
    }
}
