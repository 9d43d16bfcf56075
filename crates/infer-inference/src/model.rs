//! [`Model`]: the whole network assembled from a vindex and its `ModelArchitecture`.

use std::borrow::Cow;

use infer_compute::{AttentionParams, QuantFormat, RopeConfig, RopeScaling as ComputeRopeScaling};
use infer_models::{architecture_for, ModelArchitecture, RopeScaling};
use infer_vindex::{FloatSlice, Tier, Vindex};

use crate::layer::{
    AttnPath, DenseFfn, DownLayout, Ffn, FfnPath, FloatRows, FullPipelineLayer, LayerGeometry,
    Linear, MoeFfn, NormWeights, WalkFfn, WeightData,
};
use crate::plan::{FormatPlan, FormatRequest, LmHeadPath};
use crate::InferenceError;

/// A model ready to run: embeddings, one [`FullPipelineLayer`] per layer, final norm, lm_head.
/// Borrows the vindex's mmap (zero-copy): matrices of the f16 tier stay f16 and are multiplied
/// in place; only norms, biases and other vectors are widened to f32 at load.
pub struct Model<'a> {
    pub arch: Box<dyn ModelArchitecture>,
    /// `[vocab, hidden]` token embeddings (also the output projection when tied).
    pub embeddings: FloatRows<'a>,
    /// Learned absolute position embeddings `[max_positions, hidden]` (GPT-2), if any.
    pub position_embeddings: Option<Cow<'a, [f32]>>,
    pub layers: Vec<FullPipelineLayer<'a>>,
    pub final_norm: NormWeights<'a>,
    /// `[vocab, hidden]` output projection from the plan's tier; `None` when it is the f32
    /// embeddings (tied, float tier).
    pub lm_head: Option<WeightData<'a>>,
    /// `[vocab]` output bias (phi), if any.
    pub lm_head_bias: Option<Cow<'a, [f32]>>,
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// Which tier each part runs from.
    pub plan: FormatPlan,
}

fn widen(s: FloatSlice<'_>) -> Cow<'_, [f32]> {
    match s {
        FloatSlice::F32(v) => Cow::Borrowed(v),
        _ => Cow::Owned(s.to_f32_vec()),
    }
}

/// A matrix with rows of `cols` values in its stored precision (zero-copy).
fn rows(s: FloatSlice<'_>, cols: usize) -> FloatRows<'_> {
    match s {
        FloatSlice::F32(v) => FloatRows::F32(Cow::Borrowed(v)),
        FloatSlice::F16(v) => FloatRows::F16(Cow::Borrowed(v)),
        FloatSlice::Blocks { format, bytes } => block_rows(format, bytes, cols),
    }
}

/// Rows of `cols` values stored as ggml blocks of `format`; a quantized tier's F16 fallback
/// (rows no block divides) becomes f16 float rows, which every kernel takes.
fn block_rows(format: QuantFormat, bytes: &[u8], cols: usize) -> FloatRows<'_> {
    if format == QuantFormat::F16 {
        let values = bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
            .collect();
        return FloatRows::F16(Cow::Owned(values));
    }
    FloatRows::Blocks {
        format,
        bytes,
        cols,
    }
}

/// Check a matrix's element count.
fn check_rows<'a>(
    data: FloatRows<'a>,
    what: &str,
    len: usize,
) -> Result<FloatRows<'a>, InferenceError> {
    if data.len() != len {
        return Err(InferenceError::BadShape {
            key: what.to_string(),
            expected: len,
            found: data.len(),
        });
    }
    Ok(data)
}

/// Look up a matrix the architecture requires, in its stored precision; check its size.
fn required_rows<'a>(
    v: &'a Vindex,
    key: &str,
    len: usize,
) -> Result<FloatRows<'a>, InferenceError> {
    let (s, shape) = v
        .tensor(key)
        .map_err(|_| InferenceError::MissingTensor(key.to_string()))?;
    let cols = shape.last().copied().unwrap_or(0);
    check_rows(rows(s, cols), key, len)
}

/// Look up a tensor the architecture requires; check its element count.
fn required<'a>(v: &'a Vindex, key: &str, len: usize) -> Result<Cow<'a, [f32]>, InferenceError> {
    let (s, _shape) = v
        .tensor(key)
        .map_err(|_| InferenceError::MissingTensor(key.to_string()))?;
    let data = widen(s);
    if data.len() != len {
        return Err(InferenceError::BadShape {
            key: key.to_string(),
            expected: len,
            found: data.len(),
        });
    }
    Ok(data)
}

/// Look up a tensor that may legitimately be absent (biases, optional norms).
fn optional<'a>(
    v: &'a Vindex,
    key: &str,
    len: usize,
) -> Result<Option<Cow<'a, [f32]>>, InferenceError> {
    if !v.has_tensor(key) {
        return Ok(None);
    }
    required(v, key, len).map(Some)
}

/// A norm the architecture names: weight required, LayerNorm bias when the family has one.
fn norm<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    key: &str,
    len: usize,
) -> Result<NormWeights<'a>, InferenceError> {
    let bias = match arch.norm_bias_key(key) {
        Some(b) => optional(v, &b, len)?,
        None => None,
    };
    Ok(NormWeights {
        weight: required(v, key, len)?,
        bias,
    })
}

/// A norm the architecture may have (`None` key: the family has no such norm).
fn optional_norm<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    key: Option<String>,
    len: usize,
) -> Result<Option<NormWeights<'a>>, InferenceError> {
    key.map(|k| norm(v, arch, &k, len)).transpose()
}

/// A Linear layer `[out, in]` with the bias the architecture names, if any.
fn linear<'a>(
    v: &'a Vindex,
    key: &str,
    bias_key: Option<String>,
    out_features: usize,
    in_features: usize,
) -> Result<Linear<'a>, InferenceError> {
    let bias = match bias_key {
        Some(b) => optional(v, &b, out_features)?,
        None => None,
    };
    Ok(Linear {
        weight: WeightData::float(required_rows(v, key, out_features * in_features)?),
        bias,
        out_features,
        in_features,
    })
}

/// Convert the config's RoPE scaling to the compute crate's (which cannot import infer-models).
fn compute_scaling(s: Option<RopeScaling>) -> ComputeRopeScaling {
    match s {
        None => ComputeRopeScaling::None,
        Some(RopeScaling::Linear { factor }) => ComputeRopeScaling::Linear { factor },
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => ComputeRopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        },
        Some(RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max_position_embeddings,
            attention_factor,
            truncate,
        }) => ComputeRopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max_position_embeddings,
            attention_factor,
            truncate,
        },
    }
}

/// Everything the forward pass needs to know about layer `l`, from the architecture.
pub fn layer_geometry(arch: &dyn ModelArchitecture, l: usize) -> LayerGeometry {
    let head_dim = arch.head_dim_for_layer(l);
    // The formula the config check validated (even, ≥ 2, ≤ head_dim for RoPE families).
    let rotary_dim = infer_models::config::rotary_dim(head_dim, arch.rotary_fraction_for_layer(l));
    let rope = arch.has_rope_for_layer(l).then(|| RopeConfig {
        head_dim,
        rotary_dim,
        base: arch.rope_base_for_layer(l),
        scaling: compute_scaling(arch.rope_scaling_for_layer(l)),
        interleaved: arch.rope_interleaved(),
    });
    LayerGeometry {
        hidden_size: arch.hidden_size(),
        intermediate_size: arch.intermediate_size_for_layer(l),
        head_dim,
        num_q_heads: arch.num_q_heads_for_layer(l),
        num_kv_heads: arch.num_kv_heads_for_layer(l),
        rope,
        learned_positions: arch.has_learned_positions(),
        attention: AttentionParams {
            n_q_heads: arch.num_q_heads_for_layer(l),
            n_kv_heads: arch.num_kv_heads_for_layer(l),
            head_dim,
            scale: arch.attention_scale_for_layer(l) as f32,
            sliding_window: arch.sliding_window_for_layer(l),
            softcap: arch.attn_logit_softcap().map(|c| c as f32),
            // The layer's sink weights join at the attention call (`forward::attend`).
            sinks: None,
        },
        eps: arch.norm_eps() as f32,
        norm_type: arch.norm_type(),
        norm_offset: arch.norm_weight_offset(),
        qk_norm_whole_projection: arch.qk_norm_whole_projection(),
        parallel_residual: arch.parallel_residual(),
        residual_multiplier: arch.residual_multiplier(),
        ffn_type: arch.ffn_type(),
        activation: arch.activation(),
        clamped_swiglu: arch
            .clamped_swiglu()
            .map(|(limit, alpha)| (limit as f32, alpha as f32)),
        attention_sinks: arch.attn_sinks_key(l).is_some(),
    }
}

impl<'a> Model<'a> {
    /// Assemble the model from an open vindex with the best available formats. Errors:
    /// unknown architecture, a tensor the architecture needs is missing or has the wrong size.
    pub fn from_vindex(v: &'a Vindex) -> Result<Self, InferenceError> {
        Self::from_vindex_with(v, &FormatRequest::default())
    }

    /// Assemble the model with explicit format requests (`--attn`, `--ffn`, `--lm-head`).
    /// Errors: as [`Model::from_vindex`], or a requested tier the vindex lacks.
    pub fn from_vindex_with(
        v: &'a Vindex,
        request: &FormatRequest,
    ) -> Result<Self, InferenceError> {
        let plan = request.resolve(v)?;
        let config = v.config().clone();
        let arch = architecture_for(&config).map_err(InferenceError::Architecture)?;
        // `Vindex::open` applied the config checks (`ModelConfig::check`): norm_eps positive,
        // a context of at least one position, KV heads dividing the heads, …
        let hidden = arch.hidden_size();
        let vocab = arch.vocab_size();
        let (emb, _) = v.embeddings();
        let embeddings = check_rows(rows(emb, hidden), "embeddings", vocab * hidden)?;
        let mut layers = Vec::with_capacity(arch.num_layers());
        for l in 0..arch.num_layers() {
            layers.push(build_layer(v, arch.as_ref(), l, &plan)?);
        }
        let final_norm = norm(v, arch.as_ref(), &arch.final_norm_key(), hidden)?;
        let lm_head = match plan.lm_head {
            LmHeadPath::Q6K | LmHeadPath::Q4 => {
                let (data, format) = if plan.lm_head == LmHeadPath::Q6K {
                    v.lm_head_q6k_data()?
                } else {
                    v.lm_head_q4_data()?
                };
                Some(quant_weight(
                    "lm_head".into(),
                    data,
                    None,
                    format,
                    vocab,
                    hidden,
                )?)
            }
            LmHeadPath::Float => v
                .lm_head()
                .map(|(s, _)| {
                    check_rows(rows(s, hidden), "lm_head", vocab * hidden).map(WeightData::float)
                })
                .transpose()?,
        };
        let lm_head_bias = arch
            .lm_head_bias_key()
            .map(|k| required(v, &k, vocab))
            .transpose()?;
        let position_embeddings = match arch.position_embed_key() {
            Some(k) => Some(widen(
                v.tensor(&k)
                    .map_err(|_| InferenceError::MissingTensor(k))?
                    .0,
            )),
            None => None,
        };
        Ok(Model {
            arch,
            embeddings,
            position_embeddings,
            layers,
            final_norm,
            lm_head,
            lm_head_bias,
            hidden_size: hidden,
            vocab_size: vocab,
            plan,
        })
    }

    /// Bytes of weights one decoded token reads: every layer's matrices and norms, the final
    /// norm and the output projection (embeddings count once more only when untied, since a
    /// token's embedding row is negligible).
    pub fn weight_bytes_per_token(&self) -> usize {
        let layer_bytes: usize = self.layers.iter().map(|l| l.weight_bytes()).sum();
        let lm = self
            .lm_head
            .as_ref()
            .map_or(self.embeddings.byte_len(), |w| w.byte_len());
        layer_bytes + self.final_norm.weight.len() * 4 + lm
    }

    /// Bytes of this model's weights as stored (quantized blocks at their size, f16, f32):
    /// `(device, host)`. `device`: what a device backend uploads and keeps resident, the
    /// embeddings (also the output projection when tied), learned position embeddings, every
    /// layer's norms, attention and dense FFN ([`FullPipelineLayer::stored_weight_bytes`]),
    /// the final norm and an untied output projection with its bias; `host`: the walk and MoE
    /// FFNs, which run on the host even with a device (every expert counted). On the CPU both
    /// parts are read from the vindex's mapping.
    pub fn stored_weight_bytes(&self) -> (usize, usize) {
        let (mut device, mut host) = (0, 0);
        for l in &self.layers {
            let (d, h) = l.stored_weight_bytes();
            device += d;
            host += h;
        }
        let f32s = |v: &Option<Cow<'_, [f32]>>| v.as_ref().map_or(0, |v| v.len() * 4);
        device += self.embeddings.byte_len()
            + f32s(&self.position_embeddings)
            + self.final_norm.weight.len() * 4
            + f32s(&self.final_norm.bias)
            + self.lm_head.as_ref().map_or(0, |w| w.byte_len())
            + f32s(&self.lm_head_bias);
        (device, host)
    }

    /// One line per layer: which path its attention and FFN take (`--explain`).
    pub fn explain(&self) -> String {
        let lm = self.lm_head.as_ref().map_or(
            format!("{} (tied embeddings)", self.embeddings.dtype()),
            |w| w.describe(),
        );
        let mut s = format!("plan: {}\noutput projection: {lm}\n", self.plan);
        for (l, layer) in self.layers.iter().enumerate() {
            s.push_str(&format!(
                "layer {l:>3}: {} (q {}, k {}, v {}, o {}); {}{}\n           {}\n",
                layer.attn_path,
                layer.wq.weight.describe(),
                layer.wk.weight.describe(),
                layer.wv.weight.describe(),
                layer.wo.weight.describe(),
                layer.ffn_path,
                layer.ffn_formats(),
                describe_geometry(&layer.geometry),
            ));
        }
        s
    }
}

/// One line of a layer's architecture: attention kind (sliding/global), heads, RoPE (base,
/// rotary dims, scaling), norm type, FFN type and activation, residual form.
pub fn describe_geometry(g: &LayerGeometry) -> String {
    let window = match g.attention.sliding_window {
        Some(w) => format!("sliding window {w}"),
        None => "global attention".into(),
    };
    let rope = match &g.rope {
        Some(r) => {
            let scaling = match r.scaling {
                ComputeRopeScaling::None => String::new(),
                ComputeRopeScaling::Linear { factor } => format!(", linear scaling ×{factor}"),
                ComputeRopeScaling::Llama3 { factor, .. } => format!(", llama3 scaling ×{factor}"),
                ComputeRopeScaling::Yarn {
                    factor,
                    attention_factor,
                    ..
                } => format!(", YaRN scaling ×{factor} (cos/sin ×{attention_factor:.4})"),
            };
            let pairs = if r.interleaved {
                " (interleaved pairs)"
            } else {
                ""
            };
            format!(
                "RoPE base {} rotary {}/{}{pairs}{scaling}",
                r.base, r.rotary_dim, r.head_dim
            )
        }
        None if g.learned_positions => "learned positions".into(),
        None => "no RoPE".into(),
    };
    let norm: &str = match (g.norm_type, g.norm_offset) {
        (infer_models::NormType::RmsNorm, o) if o != 0.0 => "RMSNorm (1 + w)",
        (infer_models::NormType::RmsNorm, _) => "RMSNorm",
        (infer_models::NormType::LayerNorm, _) => "LayerNorm",
    };
    let ffn = match g.ffn_type {
        infer_models::FfnType::Gated => format!("gated FFN ({:?})", g.activation),
        infer_models::FfnType::Standard => format!("standard FFN ({:?})", g.activation),
    };
    let residual = if g.parallel_residual {
        ", parallel residual"
    } else {
        ""
    };
    let softcap = g
        .attention
        .softcap
        .map_or(String::new(), |c| format!(", soft-cap {c}"));
    let sinks = if g.attention_sinks {
        ", attention sinks"
    } else {
        ""
    };
    let ffn = match g.clamped_swiglu {
        Some((limit, alpha)) => format!("{ffn}, clamped SwiGLU (limit {limit}, alpha {alpha})"),
        None => ffn,
    };
    format!(
        "{window}, {} q / {} kv heads × {}, {rope}, scale {:.5}{softcap}{sinks}; {norm}; {ffn}{residual}",
        g.num_q_heads, g.num_kv_heads, g.head_dim, g.attention.scale
    )
}

/// The per-layer plan of `inspect`: one line per distinct layer geometry, with the layers that
/// have it (`layers 0-4, 6-10: …`), in order of their first layer, so 30 identical layers
/// take one line.
pub fn layer_plan(arch: &dyn ModelArchitecture) -> String {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for l in 0..arch.num_layers() {
        let d = describe_geometry(&layer_geometry(arch, l));
        match groups.iter_mut().find(|(g, _)| *g == d) {
            Some((_, layers)) => layers.push(l),
            None => groups.push((d, vec![l])),
        }
    }
    groups
        .iter()
        .map(|(d, layers)| {
            let noun = if layers.len() == 1 { "layer" } else { "layers" };
            format!(
                "{noun} {}: {d}
",
                layer_ranges(layers)
            )
        })
        .collect()
}

/// Sorted layer numbers as ranges: `[0, 1, 2, 5, 7, 8]` → `0-2, 5, 7-8`.
fn layer_ranges(layers: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            layers[i].to_string()
        } else {
            format!("{}-{}", layers[i], layers[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// A quantized matrix `[out, in]` from the vindex; its byte count must match the geometry. An
/// F16 entry (the quantized tiers' fallback for rows no block divides) becomes a float weight.
fn quant_weight<'a>(
    what: String,
    data: &'a [u8],
    scales: Option<&'a [f32]>,
    format: QuantFormat,
    out_features: usize,
    in_features: usize,
) -> Result<WeightData<'a>, InferenceError> {
    let w = match scales {
        Some(scales) => WeightData::SplitQ8 {
            values: data,
            scales,
        },
        None => WeightData::Blocks {
            format,
            bytes: data,
        },
    };
    w.matrix(out_features, in_features)
        .check()
        .map_err(|e| InferenceError::Plan(format!("{what}: {e}")))?;
    if let WeightData::Blocks {
        format: QuantFormat::F16,
        bytes,
    } = w
    {
        // A quantized tier's F16 fallback (rows no block divides): a float weight, so every
        // backend multiplies it as the f16 float tier.
        let values = bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
            .collect();
        return Ok(WeightData::F16(Cow::Owned(values)));
    }
    Ok(w)
}

fn with_weight<'a>(mut lin: Linear<'a>, weight: WeightData<'a>) -> Linear<'a> {
    lin.weight = weight;
    lin
}

/// Attention projections per the plan: biases always come from the float tier.
fn attention_weights<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    l: usize,
    g: &LayerGeometry,
    plan: &FormatPlan,
) -> Result<[Linear<'a>; 4], InferenceError> {
    let hidden = g.hidden_size;
    let shapes = [
        (g.q_dim(), hidden),
        (g.kv_dim(), hidden),
        (g.kv_dim(), hidden),
        (hidden, g.q_dim()),
    ];
    let keys = [
        arch.attn_q_key(l),
        arch.attn_k_key(l),
        arch.attn_v_key(l),
        arch.attn_o_key(l),
    ];
    let biases = [
        arch.attn_q_bias_key(l),
        arch.attn_k_bias_key(l),
        arch.attn_v_bias_key(l),
        arch.attn_o_bias_key(l),
    ];
    let float = |i: usize| linear(v, &keys[i], biases[i].clone(), shapes[i].0, shapes[i].1);
    let bias_only = |i: usize| -> Result<Linear<'a>, InferenceError> {
        let bias = match &biases[i] {
            Some(b) => optional(v, b, shapes[i].0)?,
            None => None,
        };
        Ok(Linear {
            weight: WeightData::F32(Cow::Borrowed(&[])),
            bias,
            out_features: shapes[i].0,
            in_features: shapes[i].1,
        })
    };
    let mut out = Vec::with_capacity(4);
    match plan.attn {
        AttnPath::F32 => {
            for i in 0..4 {
                out.push(float(i)?);
            }
        }
        AttnPath::Q4K => {
            let data = v.attn_q4k_layer_data(l)?;
            for (i, (bytes, format)) in data.into_iter().enumerate() {
                let w = quant_weight(
                    keys[i].clone(),
                    bytes,
                    None,
                    format,
                    shapes[i].0,
                    shapes[i].1,
                )?;
                out.push(with_weight(bias_only(i)?, w));
            }
        }
        AttnPath::Q8 => {
            let data = v.attn_q8_layer_data(l)?;
            for (i, (values, scales)) in data.into_iter().enumerate() {
                let w = quant_weight(
                    keys[i].clone(),
                    values,
                    Some(scales),
                    QuantFormat::Q8_0,
                    shapes[i].0,
                    shapes[i].1,
                )?;
                out.push(with_weight(bias_only(i)?, w));
            }
        }
    }
    let [q, k, vv, o]: [Linear<'a>; 4] = out
        .try_into()
        .map_err(|_| InferenceError::Plan("attention weights".into()))?;
    Ok([q, k, vv, o])
}

/// A dense FFN from a quantized interleaved tier (gate, up `[inter, hidden]`; down `[hidden, inter]`).
fn dense_ffn<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    l: usize,
    g: &LayerGeometry,
    path: FfnPath,
) -> Result<DenseFfn<'a>, InferenceError> {
    let (hidden, inter) = (g.hidden_size, g.intermediate_size);
    let tier = match path {
        FfnPath::Q4 => Tier::Q4,
        _ => Tier::Q4K,
    };
    let (gate_data, [(ub, uf), (db, df)]) = v.ffn_quant_layer(tier, l)?;
    let bias = |k: Option<String>, n: usize| k.map(|k| required(v, &k, n)).transpose();
    let gate = match (g.ffn_type, gate_data) {
        (infer_models::FfnType::Gated, Some((gb, gf))) => Some(Linear {
            weight: quant_weight(format!("layer {l} gate"), gb, None, gf, inter, hidden)?,
            bias: bias(arch.ffn_gate_bias_key(l), inter)?,
            out_features: inter,
            in_features: hidden,
        }),
        (infer_models::FfnType::Gated, None) => {
            return Err(InferenceError::MissingTensor(format!(
                "layer {l} quantized FFN gate"
            )))
        }
        (infer_models::FfnType::Standard, _) => None,
    };
    Ok(DenseFfn {
        gate,
        up: Linear {
            weight: quant_weight(format!("layer {l} up"), ub, None, uf, inter, hidden)?,
            bias: bias(arch.ffn_up_bias_key(l), inter)?,
            out_features: inter,
            in_features: hidden,
        },
        down: Linear {
            weight: quant_weight(format!("layer {l} down"), db, None, df, hidden, inter)?,
            bias: bias(arch.ffn_down_bias_key(l), hidden)?,
            out_features: hidden,
            in_features: inter,
        },
    })
}

fn build_layer<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    l: usize,
    plan: &FormatPlan,
) -> Result<FullPipelineLayer<'a>, InferenceError> {
    let g = layer_geometry(arch, l);
    let hidden = g.hidden_size;
    let (q_norm_len, k_norm_len) = if g.qk_norm_whole_projection {
        (g.q_dim(), g.kv_dim())
    } else {
        (g.head_dim, g.head_dim)
    };
    let (ffn, ffn_path) = if arch.num_experts_for_layer(l) > 0 {
        let tier = match plan.ffn {
            FfnPath::Q4K => Some(Tier::Q4K),
            FfnPath::Q4 => Some(Tier::Q4),
            // A vindex without a float tier holds its experts in the quantized FFN tier only.
            FfnPath::WalkQuantized if v.has_tier(Tier::Q4K) => Some(Tier::Q4K),
            FfnPath::WalkQuantized => Some(Tier::Q4),
            _ => None,
        };
        let path = match tier {
            Some(_) => FfnPath::MoeQuantized,
            None => FfnPath::MoeF32,
        };
        (Ffn::Moe(moe_ffn(v, arch, l, hidden, tier)?), path)
    } else if plan.ffn == FfnPath::WalkF32 {
        (Ffn::Walk(walk_ffn(v, arch, l, &g)?), FfnPath::WalkF32)
    } else if plan.ffn == FfnPath::WalkQuantized {
        (
            Ffn::Walk(walk_ffn_quantized(v, arch, l, &g)?),
            FfnPath::WalkQuantized,
        )
    } else {
        (Ffn::Dense(dense_ffn(v, arch, l, &g, plan.ffn)?), plan.ffn)
    };
    let [wq, wk, wv, wo] = attention_weights(v, arch, l, &g, plan)?;
    let norm_len = hidden;
    Ok(FullPipelineLayer {
        attn_path: plan.attn,
        ffn_path,
        pre_attn_norm: optional_norm(v, arch, arch.pre_attn_norm_key(l), norm_len)?,
        post_attn_norm: optional_norm(v, arch, arch.post_attn_norm_key(l), norm_len)?,
        pre_ffn_norm: optional_norm(v, arch, arch.pre_ffn_norm_key(l), norm_len)?,
        post_ffn_norm: optional_norm(v, arch, arch.post_ffn_norm_key(l), norm_len)?,
        q_norm: optional_norm(v, arch, arch.q_norm_key(l), q_norm_len)?,
        k_norm: optional_norm(v, arch, arch.k_norm_key(l), k_norm_len)?,
        wq,
        wk,
        wv,
        wo,
        attn_sinks: arch
            .attn_sinks_key(l)
            .map(|k| required(v, &k, g.num_q_heads))
            .transpose()?,
        ffn,
        geometry: g,
    })
}

/// The dense FFN of layer `l` from the vindex FFN tier (feature-major, zero-copy).
fn walk_ffn<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    l: usize,
    g: &LayerGeometry,
) -> Result<WalkFfn<'a>, InferenceError> {
    let (hidden, inter) = (g.hidden_size, g.intermediate_size);
    let gate = match g.ffn_type {
        infer_models::FfnType::Gated => Some(check_rows(
            rows(v.gate_layer(l)?, hidden),
            &format!("layer {l} gate vectors"),
            inter * hidden,
        )?),
        infer_models::FfnType::Standard => None,
    };
    Ok(WalkFfn {
        intermediate_size: inter,
        gate,
        up: check_rows(
            rows(v.up_layer(l)?, hidden),
            &format!("layer {l} up features"),
            inter * hidden,
        )?,
        down: check_rows(
            rows(v.down_layer(l)?, hidden),
            &format!("layer {l} down features"),
            inter * hidden,
        )?,
        down_layout: DownLayout::FeatureMajor,
        gate_bias: arch
            .ffn_gate_bias_key(l)
            .map(|k| required(v, &k, inter))
            .transpose()?,
        up_bias: arch
            .ffn_up_bias_key(l)
            .map(|k| required(v, &k, inter))
            .transpose()?,
        down_bias: arch
            .ffn_down_bias_key(l)
            .map(|k| required(v, &k, hidden))
            .transpose()?,
        sparse: None,
    })
}

/// The walk FFN of layer `l` over a quantized tier's rows (a vindex without a float tier): the
/// q4k tier's gate/up rows `[intermediate, hidden]` and Linear-layout down `[hidden,
/// intermediate]` (the q4 tier's without q4k), dequantized as they are read.
fn walk_ffn_quantized<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    l: usize,
    g: &LayerGeometry,
) -> Result<WalkFfn<'a>, InferenceError> {
    let (hidden, inter) = (g.hidden_size, g.intermediate_size);
    let tier = if v.has_tier(Tier::Q4K) {
        Tier::Q4K
    } else {
        Tier::Q4
    };
    let (gate, [(ub, uf), (db, df)]) = v.ffn_quant_layer(tier, l)?;
    let table = |what: &str, bytes: &'a [u8], format, rows: usize, cols: usize| {
        quant_weight(format!("layer {l} {what}"), bytes, None, format, rows, cols)?;
        check_rows(
            block_rows(format, bytes, cols),
            &format!("layer {l} {what}"),
            rows * cols,
        )
    };
    let gate = match (g.ffn_type, gate) {
        (infer_models::FfnType::Gated, Some((gb, gf))) => {
            Some(table("gate", gb, gf, inter, hidden)?)
        }
        (infer_models::FfnType::Gated, None) => {
            return Err(InferenceError::MissingTensor(format!(
                "layer {l} quantized FFN gate"
            )))
        }
        (infer_models::FfnType::Standard, _) => None,
    };
    Ok(WalkFfn {
        intermediate_size: inter,
        gate,
        up: table("up", ub, uf, inter, hidden)?,
        down: table("down", db, df, hidden, inter)?,
        down_layout: DownLayout::Linear,
        gate_bias: arch
            .ffn_gate_bias_key(l)
            .map(|k| required(v, &k, inter))
            .transpose()?,
        up_bias: arch
            .ffn_up_bias_key(l)
            .map(|k| required(v, &k, inter))
            .transpose()?,
        down_bias: arch
            .ffn_down_bias_key(l)
            .map(|k| required(v, &k, hidden))
            .transpose()?,
        sparse: None,
    })
}

/// A gated expert stored as HF Linear matrices (gate/up `[inter, hidden]`, down `[hidden,
/// inter]`): from the float tier, or per expert from the quantized FFN tier `tier` (rows
/// dequantized by the products, as the walk FFN over quantized rows), with the (gate, up, down)
/// biases `bias_keys` names (f32, gpt-oss).
fn expert<'a>(
    v: &'a Vindex,
    keys: [String; 3],
    bias_keys: Option<[String; 3]>,
    inter: usize,
    hidden: usize,
    tier: Option<Tier>,
) -> Result<WalkFfn<'a>, InferenceError> {
    let [gate, up, down] = keys;
    let [gate_bias, up_bias, down_bias] = match bias_keys {
        Some([g, u, d]) => [
            Some(required(v, &g, inter)?),
            Some(required(v, &u, inter)?),
            Some(required(v, &d, hidden)?),
        ],
        None => [None, None, None],
    };
    let table = |key: &str, rows: usize, cols: usize| -> Result<FloatRows<'a>, InferenceError> {
        let Some(t) = tier else {
            return required_rows(v, key, rows * cols);
        };
        let (bytes, format) = v
            .ffn_quant_tensor(t, key)
            .map_err(|_| InferenceError::MissingTensor(format!("{key} (tier {t})")))?;
        quant_weight(key.to_string(), bytes, None, format, rows, cols)?;
        check_rows(block_rows(format, bytes, cols), key, rows * cols)
    };
    Ok(WalkFfn {
        intermediate_size: inter,
        gate: Some(table(&gate, inter, hidden)?),
        up: table(&up, inter, hidden)?,
        down: table(&down, hidden, inter)?,
        down_layout: DownLayout::Linear,
        gate_bias,
        up_bias,
        down_bias,
        sparse: None,
    })
}

fn moe_ffn<'a>(
    v: &'a Vindex,
    arch: &dyn ModelArchitecture,
    l: usize,
    hidden: usize,
    tier: Option<Tier>,
) -> Result<MoeFfn<'a>, InferenceError> {
    let n = arch.num_experts_for_layer(l);
    let inter = arch.intermediate_size_for_layer(l);
    let router_key = arch
        .moe_router_key(l)
        .ok_or_else(|| InferenceError::Architecture(format!("layer {l}: MoE without a router")))?;
    let experts = (0..n)
        .map(|e| {
            expert(
                v,
                [
                    arch.expert_gate_key(l, e),
                    arch.expert_up_key(l, e),
                    arch.expert_down_key(l, e),
                ],
                arch.expert_bias_keys(l, e),
                inter,
                hidden,
                tier,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let shared = match (
        arch.shared_expert_keys(l),
        arch.shared_expert_intermediate_size(),
    ) {
        (Some(keys), Some(si)) => Some(expert(v, keys, None, si, hidden, tier)?),
        _ => None,
    };
    Ok(MoeFfn {
        router: required(v, &router_key, n * hidden)?,
        router_bias: arch
            .moe_router_bias_key(l)
            .map(|k| required(v, &k, n))
            .transpose()?,
        experts,
        top_k: arch.num_experts_per_tok(),
        norm_topk_prob: arch.norm_topk_prob(),
        shared,
        shared_gate: arch
            .shared_expert_gate_key(l)
            .map(|k| required(v, &k, hidden))
            .transpose()?,
    })
}
