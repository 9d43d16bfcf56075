//! The forward pass — one loop for prefill (many tokens) and decode (one token).

use infer_compute::{ops, ComputeBackend, QuantProj};
use infer_models::{Activation, FfnType, NormType};

use crate::layer::{
    DenseFfn, DownLayout, Ffn, FullPipelineLayer, Linear, MoeFfn, NormWeights, QuantWeight,
    WalkFfn, WeightData,
};
use crate::{InferenceError, KvCache, Model};

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's `[vocab]` logits (generation).
    Last,
    /// Every position's `[T, vocab]` logits (evaluation, perplexity).
    All,
}

/// Hidden states captured per layer for debugging/tests: entry 0 is the embedding output,
/// entry i the output of layer i (the last replaced by the final-norm output, HF convention).
pub type HiddenStates = Vec<Vec<f32>>;

impl Model<'_> {
    /// KV-dim of every layer, to size a [`KvCache`].
    pub fn kv_dims(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.geometry.kv_dim()).collect()
    }

    /// A KV cache for `context` positions.
    pub fn new_cache(&self, context: usize) -> KvCache {
        KvCache::new(&self.kv_dims(), context)
    }

    /// Run `tokens` at positions `cache.len()..` through every layer, append their K/V to the
    /// cache, and return logits (`[vocab]` or `[T, vocab]`). Errors: empty input, a token id
    /// outside the vocabulary, or a full cache (checked before anything is written).
    pub fn forward(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>, InferenceError> {
        self.forward_inner(backend, tokens, cache, which, None)
    }

    /// Prefill: run the whole prompt as one batch (every layer, matrix-matrix products) and
    /// return the last position's logits `[vocab]`.
    pub fn prefill(
        &self,
        backend: &dyn ComputeBackend,
        prompt: &[u32],
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, InferenceError> {
        self.forward(backend, prompt, cache, Logits::Last)
    }

    /// Decode one token through all layers (the seed's `decode_token`), appending its K/V to
    /// the cache; returns its logits `[vocab]`.
    pub fn decode_token(
        &self,
        backend: &dyn ComputeBackend,
        token: u32,
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, InferenceError> {
        self.forward(backend, &[token], cache, Logits::Last)
    }

    /// Like [`Model::forward`], also returning the hidden states after each layer.
    pub fn forward_with_hidden(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<(Vec<f32>, HiddenStates), InferenceError> {
        let mut hidden = Vec::new();
        let logits = self.forward_inner(backend, tokens, cache, which, Some(&mut hidden))?;
        Ok((logits, hidden))
    }

    /// Runs [`Model::forward_body`] on a worker of rayon's current pool. Called from a thread
    /// outside the pool (the CLI's main thread), every parallel product would otherwise be
    /// injected into the pool and the caller put to sleep on a latch until it is done: two
    /// futex wake-ups per product, ~120 per decoded token. Entering the pool once per forward
    /// pass makes the nested parallel regions plain work-stealing joins.
    fn forward_inner(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        hidden_out: Option<&mut HiddenStates>,
    ) -> Result<Vec<f32>, InferenceError> {
        if rayon::current_num_threads() <= 1 || rayon::current_thread_index().is_some() {
            return self.forward_body(backend, tokens, cache, which, hidden_out);
        }
        rayon::scope(|_| self.forward_body(backend, tokens, cache, which, hidden_out))
    }

    fn forward_body(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        mut hidden_out: Option<&mut HiddenStates>,
    ) -> Result<Vec<f32>, InferenceError> {
        if tokens.is_empty() {
            return Err(InferenceError::EmptyInput);
        }
        cache.check_room(tokens.len())?;
        let t = tokens.len();
        let h = self.hidden_size;
        let start = cache.len();
        let positions: Vec<usize> = (start..start + t).collect();

        let mut x = self.embed(tokens, &positions)?;
        if let Some(hs) = hidden_out.as_deref_mut() {
            hs.push(x.clone());
        }
        for (l, layer) in self.layers.iter().enumerate() {
            self.layer_forward(backend, layer, l, &mut x, &positions, cache)?;
            if let Some(hs) = hidden_out.as_deref_mut() {
                hs.push(x.clone());
            }
        }
        cache.advance(t);

        let rows = match which {
            Logits::Last => &x[(t - 1) * h..],
            Logits::All => &x[..],
        };
        let n_rows = rows.len() / h;
        let mut normed = vec![0.0; rows.len()];
        apply_norm(
            &self.final_norm,
            rows,
            &mut normed,
            self.layers[0].geometry.norm_type,
            self.norm_eps(),
            self.norm_offset(),
        );
        if let Some(hs) = hidden_out {
            if which == Logits::All {
                if let Some(last) = hs.last_mut() {
                    last.clone_from(&normed);
                }
            }
        }
        let mut logits = vec![0.0; n_rows * self.vocab_size];
        match &self.lm_head {
            Some(w) => matmul_weight(backend, w, &normed, n_rows, h, self.vocab_size, &mut logits)?,
            None => backend.matmul_transb(
                &normed,
                &self.embeddings,
                n_rows,
                h,
                self.vocab_size,
                &mut logits,
            ),
        }
        if let Some(b) = &self.lm_head_bias {
            add_bias(&mut logits, b);
        }
        let div = self.arch.logits_divisor();
        if div != 1.0 {
            logits.iter_mut().for_each(|v| *v /= div);
        }
        if let Some(cap) = self.arch.final_logit_softcap() {
            let cap = cap as f32;
            logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        Ok(logits)
    }

    fn norm_eps(&self) -> f32 {
        self.arch.norm_eps() as f32
    }

    fn norm_offset(&self) -> f32 {
        self.arch.norm_weight_offset()
    }

    /// Token (and learned position) embeddings times the embedding scale: `[T, hidden]`.
    fn embed(&self, tokens: &[u32], positions: &[usize]) -> Result<Vec<f32>, InferenceError> {
        let h = self.hidden_size;
        let scale = self.arch.embedding_scale();
        let mut x = Vec::with_capacity(tokens.len() * h);
        for (&tok, &pos) in tokens.iter().zip(positions) {
            let id = tok as usize;
            if id >= self.vocab_size {
                return Err(InferenceError::TokenOutOfRange {
                    id: tok,
                    vocab: self.vocab_size,
                });
            }
            let row = &self.embeddings[id * h..(id + 1) * h];
            x.extend(row.iter().map(|v| v * scale));
            if let Some(pe) = &self.position_embeddings {
                let n = x.len();
                let p = pe
                    .get(pos * h..(pos + 1) * h)
                    .ok_or(InferenceError::ContextFull {
                        needed: pos + 1,
                        capacity: pe.len() / h,
                    })?;
                x[n - h..].iter_mut().zip(p).for_each(|(a, b)| *a += b);
            }
        }
        Ok(x)
    }

    fn layer_forward(
        &self,
        backend: &dyn ComputeBackend,
        layer: &FullPipelineLayer<'_>,
        l: usize,
        x: &mut [f32],
        positions: &[usize],
        cache: &mut KvCache,
    ) -> Result<(), InferenceError> {
        let g = &layer.geometry;
        let t = positions.len();
        let normed = maybe_norm(
            layer.pre_attn_norm.as_ref(),
            x,
            g.norm_type,
            g.eps,
            g.norm_offset,
        );

        // Attention: projections, q/k norms, RoPE, cache, attention, output projection.
        let [mut q, mut k, v] =
            project_many(backend, [&layer.wq, &layer.wk, &layer.wv], &normed, t)?;
        let qk_norm_width = if g.qk_norm_whole_projection {
            None
        } else {
            Some(g.head_dim)
        };
        if let Some(n) = &layer.q_norm {
            norm_rows(n, &mut q, qk_norm_width, g);
        }
        if let Some(n) = &layer.k_norm {
            norm_rows(n, &mut k, qk_norm_width, g);
        }
        if let Some(rope) = &g.rope {
            infer_compute::apply_rope(&mut q, g.num_q_heads, positions, rope);
            infer_compute::apply_rope(&mut k, g.num_kv_heads, positions, rope);
        }
        let (k_all, v_all) = cache.write(l, &k, &v)?;
        let t_kv = positions[0] + t;
        let mut attn = vec![0.0; t * g.q_dim()];
        infer_compute::attention(&q, k_all, v_all, positions, t_kv, &g.attention, &mut attn);
        let mut attn_out = project(backend, &layer.wo, &attn, t)?;
        if let Some(n) = &layer.post_attn_norm {
            attn_out = maybe_norm(Some(n), &attn_out, g.norm_type, g.eps, g.norm_offset);
        }

        if g.parallel_residual {
            // x + attn(norm1(x)) + ffn(norm2(x)); phi shares the first norm.
            let ffn_in = match &layer.pre_ffn_norm {
                Some(n) => maybe_norm(Some(n), x, g.norm_type, g.eps, g.norm_offset),
                None => normed,
            };
            let ffn_out = ffn(backend, &layer.ffn, &ffn_in, t, g)?;
            for ((xi, a), f) in x.iter_mut().zip(&attn_out).zip(&ffn_out) {
                *xi += (a + f) * g.residual_multiplier;
            }
            return Ok(());
        }
        residual_add(x, &attn_out, g.residual_multiplier);
        let ffn_in = maybe_norm(
            layer.pre_ffn_norm.as_ref(),
            x,
            g.norm_type,
            g.eps,
            g.norm_offset,
        );
        let mut ffn_out = ffn(backend, &layer.ffn, &ffn_in, t, g)?;
        if let Some(n) = &layer.post_ffn_norm {
            ffn_out = maybe_norm(Some(n), &ffn_out, g.norm_type, g.eps, g.norm_offset);
        }
        residual_add(x, &ffn_out, g.residual_multiplier);
        Ok(())
    }
}

fn ffn(
    backend: &dyn ComputeBackend,
    w: &Ffn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
) -> Result<Vec<f32>, InferenceError> {
    Ok(match w {
        Ffn::Walk(w) => walk_ffn(backend, w, x, t, g),
        Ffn::Dense(d) => dense_ffn(backend, d, x, t, g)?,
        Ffn::Moe(m) => moe_ffn(backend, m, x, t, g),
    })
}

/// A dense FFN over Linear-layout (quantized) matrices: `down(act(gate(x)) ⊙ up(x))`.
fn dense_ffn(
    backend: &dyn ComputeBackend,
    d: &DenseFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
) -> Result<Vec<f32>, InferenceError> {
    // Quantized tiers: the vectorised activations of `ops::gated_mul_fast` (≤ 4e-7 relative
    // from the exact f64 SiLU, ≤ 1e-5 for tanh-GELU: far below the activation quantization
    // error of these paths).
    let act = match g.activation {
        Activation::Silu => ops::Activation::Silu,
        Activation::GeluTanh => ops::Activation::GeluTanh,
        Activation::Gelu => ops::Activation::Gelu,
    };
    let up = match (&d.gate, g.ffn_type) {
        (Some(gate), FfnType::Gated) => {
            let [gate, mut up] = project_many(backend, [gate, &d.up], x, t)?;
            ops::gated_mul_fast(act, &gate, &mut up);
            up
        }
        _ => {
            let mut up = project(backend, &d.up, x, t)?;
            ops::act_fast_inplace(act, &mut up);
            up
        }
    };
    project(backend, &d.down, &up, t)
}

fn activation_fn(a: Activation) -> fn(f32) -> f32 {
    match a {
        Activation::Silu => ops::silu,
        Activation::GeluTanh => ops::gelu_tanh,
        Activation::Gelu => ops::gelu,
    }
}

/// Walk FFN: `Σᵢ act(gᵢ·x)(uᵢ·x) dᵢ` over all features (exact), as matrix products:
/// `A = act(X·Gᵀ) ⊙ (X·Uᵀ)` `[T, inter]`, then `A · D` (D feature-major `[inter, hidden]`,
/// or `A · Dᵀ` for a Linear-layout down).
fn walk_ffn(
    backend: &dyn ComputeBackend,
    w: &WalkFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
) -> Vec<f32> {
    let (h, inter) = (g.hidden_size, w.intermediate_size);
    let mut up = vec![0.0; t * inter];
    backend.matmul_transb(x, &w.up, t, h, inter, &mut up);
    if let Some(b) = &w.up_bias {
        add_bias(&mut up, b);
    }
    let act = activation_fn(g.activation);
    match (g.ffn_type, &w.gate) {
        (FfnType::Gated, Some(gate_w)) => {
            let mut gate = vec![0.0; t * inter];
            backend.matmul_transb(x, gate_w, t, h, inter, &mut gate);
            up.iter_mut().zip(&gate).for_each(|(u, gv)| *u *= act(*gv));
        }
        _ => up.iter_mut().for_each(|u| *u = act(*u)),
    }
    let mut out = vec![0.0; t * h];
    match w.down_layout {
        DownLayout::FeatureMajor => backend.matmul(&up, &w.down, t, inter, h, &mut out),
        DownLayout::Linear => backend.matmul_transb(&up, &w.down, t, inter, h, &mut out),
    }
    if let Some(b) = &w.down_bias {
        add_bias(&mut out, b);
    }
    out
}

/// Mixture of experts, per token: softmax router, top-k experts weighted by their probability
/// (renormalised when `norm_topk_prob`; ties → lower expert index), plus the shared expert
/// scaled by `sigmoid(x · shared_gate)` (HF `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`).
fn moe_ffn(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
) -> Vec<f32> {
    let h = g.hidden_size;
    let n = m.experts.len();
    let mut router = vec![0.0; t * n];
    backend.matmul_transb(x, &m.router, t, h, n, &mut router);
    let mut out = vec![0.0; t * h];
    for (row, (xr, probs)) in x
        .chunks_exact(h)
        .zip(router.chunks_exact_mut(n))
        .enumerate()
    {
        ops::softmax_inplace(probs);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..m.top_k.min(n)];
        let sum: f32 = chosen.iter().map(|&e| probs[e]).sum();
        let o = &mut out[row * h..(row + 1) * h];
        for &e in chosen {
            let weight = if m.norm_topk_prob {
                probs[e] / sum
            } else {
                probs[e]
            };
            let y = walk_ffn(backend, &m.experts[e], xr, 1, g);
            o.iter_mut().zip(&y).for_each(|(a, b)| *a += weight * b);
        }
    }
    if let Some(shared) = &m.shared {
        let y = walk_ffn(backend, shared, x, t, g);
        for (row, (o, yr)) in out.chunks_exact_mut(h).zip(y.chunks_exact(h)).enumerate() {
            let gate = match &m.shared_gate {
                Some(sg) => {
                    let z = ops::dot(&x[row * h..(row + 1) * h], sg);
                    1.0 / (1.0 + (-z).exp())
                }
                None => 1.0,
            };
            o.iter_mut().zip(yr).for_each(|(a, b)| *a += gate * b);
        }
    }
    out
}

fn residual_add(x: &mut [f32], branch: &[f32], mult: f32) {
    if mult == 1.0 {
        x.iter_mut().zip(branch).for_each(|(a, b)| *a += b);
    } else {
        x.iter_mut().zip(branch).for_each(|(a, b)| *a += b * mult);
    }
}

fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
    }
}

/// `x · Wᵀ + b` for `t` rows.
fn project(
    backend: &dyn ComputeBackend,
    w: &Linear<'_>,
    x: &[f32],
    t: usize,
) -> Result<Vec<f32>, InferenceError> {
    let mut out = vec![0.0; t * w.out_features];
    matmul_weight(
        backend,
        &w.weight,
        x,
        t,
        w.in_features,
        w.out_features,
        &mut out,
    )?;
    if let Some(b) = &w.bias {
        add_bias(&mut out, b);
    }
    Ok(out)
}

/// `x · Wᵢᵀ + bᵢ` for `t` rows and `N` Linear layers with the same input: one
/// [`ComputeBackend::quant_matmul_many`] call (activations quantized once, one parallel region)
/// when every weight is in a ggml block format, else one [`project`] each.
fn project_many<const N: usize>(
    backend: &dyn ComputeBackend,
    ws: [&Linear<'_>; N],
    x: &[f32],
    t: usize,
) -> Result<[Vec<f32>; N], InferenceError> {
    let fused = ws.iter().all(|w| {
        w.in_features == ws[0].in_features
            && matches!(
                w.weight,
                WeightData::Quant(QuantWeight { scales: None, .. })
            )
    });
    if !fused {
        let mut outs: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
        for (o, w) in outs.iter_mut().zip(ws) {
            *o = project(backend, w, x, t)?;
        }
        return Ok(outs);
    }
    let mut outs: [Vec<f32>; N] = std::array::from_fn(|i| vec![0.0; t * ws[i].out_features]);
    let mut projs: Vec<QuantProj<'_>> = Vec::with_capacity(N);
    for (o, w) in outs.iter_mut().zip(ws) {
        if let WeightData::Quant(q) = &w.weight {
            projs.push(QuantProj {
                format: q.format,
                bytes: q.data,
                rows: w.out_features,
                y: o,
            });
        }
    }
    backend.quant_matmul_many(x, t, ws[0].in_features, &mut projs)?;
    for (o, w) in outs.iter_mut().zip(ws) {
        if let Some(b) = &w.bias {
            add_bias(o, b);
        }
    }
    Ok(outs)
}

/// `out[t×n] = x[t×k] · Wᵀ` for a weight `[n, k]` in any supported format; the format tag
/// picks the kernel.
fn matmul_weight(
    backend: &dyn ComputeBackend,
    w: &WeightData<'_>,
    x: &[f32],
    t: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) -> Result<(), InferenceError> {
    match w {
        WeightData::F32(w) => backend.matmul_transb(x, w, t, k, n, out),
        WeightData::Quant(QuantWeight {
            data,
            scales: Some(scales),
            ..
        }) => backend.q8_matmul(data, scales, x, t, n, k, out)?,
        WeightData::Quant(QuantWeight {
            data,
            scales: None,
            format,
        }) if t == 1 => backend.quant_matvec(*format, data, x, n, k, out)?,
        WeightData::Quant(QuantWeight {
            data,
            scales: None,
            format,
        }) => backend.quant_matmul(*format, data, x, t, n, k, out)?,
    }
    Ok(())
}

fn apply_norm(
    n: &NormWeights<'_>,
    x: &[f32],
    out: &mut [f32],
    ty: NormType,
    eps: f32,
    offset: f32,
) {
    match ty {
        NormType::RmsNorm => ops::rms_norm(x, &n.weight, eps, offset, out),
        NormType::LayerNorm => ops::layer_norm(x, &n.weight, n.bias.as_deref(), eps, out),
    }
}

/// Normalise every row (row length = the norm's width), or copy when there is no norm.
fn maybe_norm(
    n: Option<&NormWeights<'_>>,
    x: &[f32],
    ty: NormType,
    eps: f32,
    offset: f32,
) -> Vec<f32> {
    match n {
        Some(n) => {
            let mut out = vec![0.0; x.len()];
            apply_norm(n, x, &mut out, ty, eps, offset);
            out
        }
        None => x.to_vec(),
    }
}

/// q/k norm in place: per head (`width = Some(head_dim)`) or over the whole projection.
fn norm_rows(n: &NormWeights<'_>, x: &mut [f32], width: Option<usize>, g: &crate::LayerGeometry) {
    let _ = width;
    let out = maybe_norm(Some(n), x, NormType::RmsNorm, g.eps, g.norm_offset);
    x.copy_from_slice(&out);
}
