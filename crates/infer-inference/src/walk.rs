//! The walk FFN over the vindex's feature-major float tier: feature i is a key gᵢ (gate row),
//! a modulator uᵢ (up row) and a value dᵢ (down row), and
//! `FFN(x) = Σᵢ act(gᵢ·x)·(uᵢ·x)·dᵢ` (non-gated: `Σᵢ act(uᵢ·x)·dᵢ`).
//!
//! Exact by default (all features, as matrix products). A layer with a [`SparseWalk`] (set by
//! [`Model::set_walk_k`], `--walk-k`/`--walk-select`) keeps only the top-K features per token
//! by |gᵢ·x| (see [`crate::walk_sparse`]); K = all is always the exact path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use infer_compute::{ops, ComputeBackend, QuantFormat};
use infer_models::{Activation, FfnType};
use infer_vindex::Vindex;

use crate::layer::{DownLayout, Ffn, FloatRows, WalkFfn};
use crate::scratch::fit;
use crate::walk_k::{Selection, WalkK};
pub use crate::walk_sparse::{select_top_k, SparseWalk, WalkBuffers};
use crate::walk_sparse::{sparse_walk_ffn, SparseLayer};
use crate::{InferenceError, Model};

/// Nanoseconds spent in [`layer_walk_ffn`] by this process, all threads and models together.
static WALK_FFN_NANOS: AtomicU64 = AtomicU64::new(0);

/// Total wall-clock nanoseconds this process has spent in walk-FFN layers (exact or sparse; not
/// MoE experts) since it started: a monotonic clock for `infer bench`'s FFN time per token
/// (read it before and after a run and subtract). Concurrent forward passes add up.
pub fn walk_ffn_nanos() -> u64 {
    WALK_FFN_NANOS.load(Ordering::Relaxed)
}

/// One layer's walk FFN of `x` `[T, hidden]` into `out` (resized to `[T, hidden]`): the sparse
/// top-K path when the layer has a [`SparseWalk`] (and a feature-major down table), else the
/// exact [`walk_ffn`]. `bufs` are reusable scratch. Errors: only from the Q4_0 gate copy's
/// product (a copy whose size disagrees with the layer).
pub fn layer_walk_ffn(
    backend: &dyn ComputeBackend,
    w: &WalkFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
    bufs: &mut WalkBuffers,
    out: &mut Vec<f32>,
) -> Result<(), InferenceError> {
    let t0 = Instant::now();
    let r = match &w.sparse {
        Some(sparse) if w.down_layout == DownLayout::FeatureMajor => {
            let layer = SparseLayer {
                ffn: w,
                sparse,
                geometry: g,
            };
            sparse_walk_ffn(backend, layer, x, t, bufs, out)
        }
        _ => walk_ffn(backend, w, x, t, g, bufs, out),
    };
    WALK_FFN_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

impl<'a> Model<'a> {
    /// Apply `--walk-k` / `--walk-select` to every layer: layer `l` keeps
    /// `k.k_for_layer(l, intermediate)` features per token, scored by `select`; a layer whose K
    /// is its intermediate size stays exact (the dense path, bit for bit). Replaces any earlier
    /// setting; nothing changes on error.
    ///
    /// Errors ([`InferenceError::Plan`]): an entry naming a layer beyond the model; a K other
    /// than all on a layer that does not run the walk FFN (a quantized FFN plan or MoE: "--walk-k
    /// needs --ffn walk"); `Selection::Q4` on a non-gated FFN, or without the q4 tier's
    /// `gate_vectors_q4.bin`, or with a gate copy whose size disagrees with the layer.
    pub fn set_walk_k(
        &mut self,
        v: &'a Vindex,
        k: &WalkK,
        select: Selection,
    ) -> Result<(), InferenceError> {
        k.check_layers(self.layers.len())
            .map_err(InferenceError::Plan)?;
        let mut settings = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            let g = &layer.geometry;
            let kl = k.k_for_layer(l, g.intermediate_size);
            if kl >= g.intermediate_size {
                settings.push(None);
                continue;
            }
            let w = match &layer.ffn {
                Ffn::Walk(w) if w.down_layout == DownLayout::FeatureMajor => w,
                Ffn::Walk(_) => {
                    return Err(InferenceError::Plan(format!(
                        "--walk-k needs the float tier's feature-major down rows: layer {l} runs \
                         {} (K {kl} of {}); rebuild the vindex with `infer extract --float f16` \
                         (or f32)",
                        layer.ffn_path, g.intermediate_size
                    )))
                }
                _ => {
                    return Err(InferenceError::Plan(format!(
                        "--walk-k needs --ffn walk: layer {l} runs {} (K {kl} of {})",
                        layer.ffn_path, g.intermediate_size
                    )))
                }
            };
            if w.gate_bias.is_some() || g.clamped_swiglu.is_some() {
                return Err(InferenceError::Plan(format!(
                    "--walk-k: layer {l}'s FFN has a gate bias or a clamped SwiGLU, which the sparse walk does not implement"
                )));
            }
            let gate_q4 = match select {
                Selection::F32 => None,
                Selection::Q4 => Some(gate_q4(v, l, w, g)?),
            };
            settings.push(Some(SparseWalk { k: kl, gate_q4 }));
        }
        for (layer, s) in self.layers.iter_mut().zip(settings) {
            if let Ffn::Walk(w) = &mut layer.ffn {
                w.sparse = s;
            }
        }
        Ok(())
    }
}

/// Layer `l`'s Q4_0 gate copy `[intermediate, hidden]`, checked against the layer's geometry.
fn gate_q4<'a>(
    v: &'a Vindex,
    l: usize,
    w: &WalkFfn<'_>,
    g: &crate::LayerGeometry,
) -> Result<&'a [u8], InferenceError> {
    if g.ffn_type != FfnType::Gated || w.gate.is_none() {
        return Err(InferenceError::Plan(format!(
            "--walk-select q4: layer {l} has no gate (non-gated FFN); use --walk-select f32"
        )));
    }
    let data = v.gate_q4_data(l).map_err(|e| {
        InferenceError::Plan(format!(
            "--walk-select q4 needs gate_vectors_q4.bin of the q4 tier (rebuild with `infer extract --quant q4`): {e}"
        ))
    })?;
    let shape = [w.intermediate_size, g.hidden_size];
    let expected = QuantFormat::Q4_0
        .expected_bytes(&shape)
        .map_err(|e| InferenceError::Plan(format!("layer {l} Q4_0 gate copy: {e}")))?;
    if data.len() != expected {
        return Err(InferenceError::Plan(format!(
            "layer {l} gate_vectors_q4: {} bytes, expected {expected} (Q4_0 {shape:?})",
            data.len()
        )));
    }
    Ok(data)
}

/// The compute crate's name of a model's activation (its fast and device kernels).
pub(crate) fn compute_activation(a: Activation) -> ops::Activation {
    match a {
        Activation::Silu => ops::Activation::Silu,
        Activation::GeluTanh => ops::Activation::GeluTanh,
        Activation::Gelu => ops::Activation::Gelu,
    }
}

/// The exact activation of the float path (f64-accurate SiLU / GELU).
pub(crate) fn activation_fn(a: Activation) -> fn(f32) -> f32 {
    match a {
        Activation::Silu => ops::silu,
        Activation::GeluTanh => ops::gelu_tanh,
        Activation::Gelu => ops::gelu,
    }
}

/// Walk FFN over all features (exact), as matrix products on `x` `[T, hidden]`:
/// `A = act(X·Gᵀ) ⊙ (X·Uᵀ)` `[T, inter]` (biases added to both products when present; the
/// layer's clamped SwiGLU of both instead when it has one, gpt-oss) (in `bufs.up`; `bufs.gate`
/// is scratch, `bufs.idx` unused), then `out = A · D` `[T, hidden]` (D feature-major `[inter, hidden]`, or `A · Dᵀ`
/// for a Linear-layout down). f16 tables are multiplied in place ([`crate::layer::FloatRows`]).
pub(crate) fn walk_ffn(
    backend: &dyn ComputeBackend,
    w: &WalkFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
    bufs: &mut WalkBuffers,
    out: &mut Vec<f32>,
) -> Result<(), InferenceError> {
    let (h, inter) = (g.hidden_size, w.intermediate_size);
    let WalkBuffers { gate, up, .. } = bufs;
    let up = fit(up, t * inter);
    w.up.matmul_transb(backend, x, t, h, inter, up)?;
    if let Some(b) = &w.up_bias {
        for row in up.chunks_exact_mut(inter) {
            row.iter_mut().zip(b.iter()).for_each(|(a, b)| *a += b);
        }
    }
    let act = activation_fn(g.activation);
    // An f16 tier's weights already carry f16 rounding (~5e-4 relative): there the vectorised
    // activations (≤ 1e-5 relative from the exact ones) cost nothing measurable in accuracy and
    // the exact f64 ones were a quarter of a Gemma-3 f16 prompt's time.
    let fast = matches!(w.up, FloatRows::F16(_)).then(|| compute_activation(g.activation));
    match (g.ffn_type, &w.gate) {
        (FfnType::Gated, Some(gate_w)) => {
            let gate = fit(gate, t * inter);
            gate_w.matmul_transb(backend, x, t, h, inter, gate)?;
            if let Some(b) = &w.gate_bias {
                for row in gate.chunks_exact_mut(inter) {
                    row.iter_mut().zip(b.iter()).for_each(|(a, b)| *a += b);
                }
            }
            match (g.clamped_swiglu, fast) {
                (Some((limit, alpha)), _) => up
                    .iter_mut()
                    .zip(gate.iter())
                    .for_each(|(u, gv)| *u = ops::clamped_swiglu(*gv, *u, limit, alpha)),
                (None, Some(a)) => ops::gated_mul_fast(a, gate, up),
                (None, None) => up
                    .iter_mut()
                    .zip(gate.iter())
                    .for_each(|(u, gv)| *u *= act(*gv)),
            }
        }
        _ => match fast {
            Some(a) => ops::act_fast_inplace(a, up),
            None => up.iter_mut().for_each(|u| *u = act(*u)),
        },
    }
    let out = fit(out, t * h);
    match w.down_layout {
        DownLayout::FeatureMajor => w.down.matmul(backend, up, t, inter, h, out)?,
        DownLayout::Linear => w.down.matmul_transb(backend, up, t, inter, h, out)?,
    }
    if let Some(b) = &w.down_bias {
        for row in out.chunks_exact_mut(h) {
            row.iter_mut().zip(b.iter()).for_each(|(a, b)| *a += b);
        }
    }
    Ok(())
}
