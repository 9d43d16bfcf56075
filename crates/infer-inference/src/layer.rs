//! [`FullPipelineLayer`]: one transformer block's weights (zero-copy slices of the vindex where
//! the tier is f32) and its geometry, as the seed's "FullPipelineLayer Construction" describes.

use std::borrow::Cow;
use std::fmt;

use half::f16;

use infer_compute::{AttentionParams, RopeConfig};
use infer_compute::{MatData, Matrix, QuantFormat};
use infer_models::{Activation, FfnType, NormType};

/// Per-layer geometry and constants, all answered by `ModelArchitecture` for this layer.
#[derive(Clone, Debug)]
pub struct LayerGeometry {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub head_dim: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    /// RoPE tables (base, rotary dim, scaling) of this layer; `None` for learned positions
    /// and for layers without positional encoding (Cohere-2's global layers).
    pub rope: Option<RopeConfig>,
    /// The model adds learned position embeddings (GPT-2) instead of rotating.
    pub learned_positions: bool,
    /// Attention scale, sliding window and soft-cap of this layer (its `sinks` are `None`:
    /// they are weights, [`FullPipelineLayer::attn_sinks`], joined at the attention call).
    pub attention: AttentionParams<'static>,
    pub eps: f32,
    pub norm_type: NormType,
    /// Added to RMSNorm weights (Gemma's `1 + w`).
    pub norm_offset: f32,
    /// Per-head RMSNorm of q and k (Qwen3, Gemma-3); OLMo-2 normalises the whole projection.
    pub qk_norm_whole_projection: bool,
    pub parallel_residual: bool,
    pub residual_multiplier: f32,
    pub ffn_type: FfnType,
    pub activation: Activation,
    /// The experts' clamped SwiGLU `(limit, alpha)` instead of `act(gate) · up` (gpt-oss,
    /// `infer_compute::ops::clamped_swiglu`).
    pub clamped_swiglu: Option<(f32, f32)>,
    /// The layer's attention has sinks (gpt-oss; the weights are
    /// [`FullPipelineLayer::attn_sinks`]).
    pub attention_sinks: bool,
}

impl LayerGeometry {
    /// Width of the q projection output (`num_q_heads · head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_q_heads * self.head_dim
    }
    /// Width of the k and v projection outputs (`num_kv_heads · head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// A norm's parameters: weight (and bias for LayerNorm), `[hidden]` or `[head_dim]`, f32.
#[derive(Clone, Debug)]
pub struct NormWeights<'a> {
    pub weight: Cow<'a, [f32]>,
    pub bias: Option<Cow<'a, [f32]>>,
}

/// A row-major matrix `[rows, cols]` from the vindex in its stored precision: the float tier's
/// f32 or f16 values (the f16 tier is multiplied in place through
/// [`infer_compute::ComputeBackend::matmul_transb_f16`], never widened to an f32 copy), or a
/// quantized tier's ggml blocks (a vindex without a float tier: embeddings, FFN rows), whose
/// rows are dequantized as they are read.
#[derive(Clone, Debug)]
pub enum FloatRows<'a> {
    F32(Cow<'a, [f32]>),
    F16(Cow<'a, [f16]>),
    /// ggml blocks of `format`, each row `cols / format.block_elems()` whole blocks.
    Blocks {
        format: QuantFormat,
        bytes: &'a [u8],
        cols: usize,
    },
}

impl FloatRows<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            FloatRows::F32(v) => v.len(),
            FloatRows::F16(v) => v.len(),
            FloatRows::Blocks { .. } => self.table().len(),
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of storage (4 or 2 per value, or the blocks' bytes).
    pub fn byte_len(&self) -> usize {
        match self {
            FloatRows::F32(v) => v.len() * 4,
            FloatRows::F16(v) => v.len() * 2,
            FloatRows::Blocks { bytes, .. } => bytes.len(),
        }
    }

    /// `"f32"`, `"f16"` or the block format's name (`"Q6_K"`, …).
    pub fn dtype(&self) -> &'static str {
        match self {
            FloatRows::F32(_) => "f32",
            FloatRows::F16(_) => "f16",
            FloatRows::Blocks { format, .. } => format.name(),
        }
    }

    /// Row `i` of a block table dequantized into `out` (`cols` values; an interleaved layout's
    /// row gathered from its group). Panics if row `i` is out of range or the bytes are not
    /// whole rows of blocks (checked when the model is built).
    fn dequantize_row(format: QuantFormat, bytes: &[u8], i: usize, out: &mut [f32]) {
        let rb = format.bytes_for(out.len()).expect("rows of whole blocks");
        let rows = bytes.len() / rb.max(1);
        let row = infer_quant::interleave::row_bytes_of(format, bytes, rows, out.len(), i)
            .expect("a row of the checked matrix");
        infer_quant::dequantize(format.row_format(), &row, out)
            .expect("a block row of the checked size");
    }

    /// `row(i) · x` where rows have `x.len()` values. Panics if row `i` is out of range.
    pub fn dot_row(&self, i: usize, x: &[f32]) -> f32 {
        let k = x.len();
        match self {
            FloatRows::F32(v) => infer_compute::ops::dot(&v[i * k..(i + 1) * k], x),
            FloatRows::F16(v) => infer_compute::dot_f16(x, &v[i * k..(i + 1) * k]),
            FloatRows::Blocks { format, bytes, .. } => {
                let mut row = vec![0.0; k];
                Self::dequantize_row(*format, bytes, i, &mut row);
                infer_compute::ops::dot(&row, x)
            }
        }
    }

    /// `y += alpha · row(i)` where rows have `y.len()` values. Panics if row `i` is out of range.
    pub fn axpy_row(&self, alpha: f32, i: usize, y: &mut [f32]) {
        let k = y.len();
        match self {
            FloatRows::F32(v) => {
                let row = &v[i * k..(i + 1) * k];
                y.iter_mut().zip(row).for_each(|(a, b)| *a += alpha * b);
            }
            FloatRows::F16(v) => infer_compute::axpy_f16(alpha, &v[i * k..(i + 1) * k], y),
            FloatRows::Blocks { format, bytes, .. } => {
                let mut row = vec![0.0; k];
                Self::dequantize_row(*format, bytes, i, &mut row);
                y.iter_mut().zip(&row).for_each(|(a, b)| *a += alpha * b);
            }
        }
    }

    /// The compute crate's view of these values (zero-copy).
    pub fn table(&self) -> infer_compute::FloatTable<'_> {
        match self {
            FloatRows::F32(v) => infer_compute::FloatTable::F32(v),
            FloatRows::F16(v) => infer_compute::FloatTable::F16(v),
            FloatRows::Blocks { format, bytes, .. } => infer_compute::FloatTable::Blocks {
                format: *format,
                bytes,
            },
        }
    }

    /// These values as a `[rows, cols]` weight matrix (zero-copy; the tied lm_head).
    pub fn matrix(&self, rows: usize, cols: usize) -> infer_compute::Matrix<'_> {
        let data = match self {
            FloatRows::F32(v) => infer_compute::MatData::F32(v),
            FloatRows::F16(v) => infer_compute::MatData::F16(v),
            FloatRows::Blocks { format, bytes, .. } => infer_compute::MatData::Blocks {
                format: *format,
                bytes,
            },
        };
        infer_compute::Matrix { data, rows, cols }
    }

    /// `C[m×n] = A[m×k] · selfᵀ`, self `[n, k]` (a Linear weight or feature-major key table).
    /// Errors: the backend's (device failures).
    pub fn matmul_transb(
        &self,
        backend: &dyn infer_compute::ComputeBackend,
        a: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), infer_compute::ComputeError> {
        match self {
            FloatRows::F32(w) => backend.matmul_transb(a, w, m, k, n, c),
            FloatRows::F16(w) => backend.matmul_transb_f16(a, w, m, k, n, c),
            FloatRows::Blocks { format, bytes, .. } => {
                let w = Matrix {
                    data: MatData::Blocks {
                        format: *format,
                        bytes,
                    },
                    rows: n,
                    cols: k,
                };
                backend.linear(&w, a, m, c)
            }
        }
    }

    /// `C[m×n] = A[m×k] · self`, self `[k, n]` (a feature-major value table such as down).
    /// Errors: the backend's (device failures); block storage, which is only ever a Linear
    /// layout (`[out, in]`, see [`DownLayout::Linear`]).
    pub fn matmul(
        &self,
        backend: &dyn infer_compute::ComputeBackend,
        a: &[f32],
        m: usize,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) -> Result<(), infer_compute::ComputeError> {
        match self {
            FloatRows::F32(w) => backend.matmul(a, w, m, k, n, c),
            FloatRows::F16(w) => backend.matmul_f16(a, w, m, k, n, c),
            FloatRows::Blocks { format, .. } => Err(infer_compute::ComputeError::NotBlocks {
                storage: format!("feature-major {format}"),
            }),
        }
    }
}

/// The storage of a weight matrix `[out, in]` (HF Linear layout): float values (borrowed from
/// the vindex mmap, or owned), or quantized bytes straight from the mmap. Products see it as
/// the compute crate's one matrix view ([`infer_compute::Matrix`], through [`Linear::matrix`]
/// or [`WeightData::matrix`]).
#[derive(Clone, Debug)]
pub enum WeightData<'a> {
    F32(Cow<'a, [f32]>),
    F16(Cow<'a, [f16]>),
    /// ggml blocks of `format`, one row of blocks per output feature.
    Blocks {
        format: QuantFormat,
        bytes: &'a [u8],
    },
    /// The seed's Q8 attention format: int8 values and one f32 scale per 32 values.
    SplitQ8 {
        values: &'a [u8],
        scales: &'a [f32],
    },
}

impl<'a> WeightData<'a> {
    /// Wrap a stored matrix (float tier, or blocks).
    pub fn float(rows: FloatRows<'a>) -> Self {
        match rows {
            FloatRows::F32(v) => WeightData::F32(v),
            FloatRows::F16(v) => WeightData::F16(v),
            FloatRows::Blocks { format, bytes, .. } => WeightData::Blocks { format, bytes },
        }
    }
}

impl WeightData<'_> {
    /// The compute crate's view of this storage (zero-copy).
    pub fn view(&self) -> MatData<'_> {
        match self {
            WeightData::F32(v) => MatData::F32(v),
            WeightData::F16(v) => MatData::F16(v),
            WeightData::Blocks { format, bytes } => MatData::Blocks {
                format: *format,
                bytes,
            },
            WeightData::SplitQ8 { values, scales } => MatData::SplitQ8 { values, scales },
        }
    }

    /// This storage as a matrix `[rows, cols]`.
    pub fn matrix(&self, rows: usize, cols: usize) -> Matrix<'_> {
        Matrix {
            data: self.view(),
            rows,
            cols,
        }
    }

    /// Bytes read when the whole matrix is used once.
    pub fn byte_len(&self) -> usize {
        self.matrix(0, 0).byte_len()
    }

    /// Short description for `--explain`: `f32`, `f16`, `Q4_K`, `Q8` (int8 + f32 scales).
    pub fn describe(&self) -> String {
        self.matrix(0, 0).describe()
    }
}

/// A Linear layer: weight `[out, in]` (HF layout) and optional f32 bias `[out]`.
#[derive(Clone, Debug)]
pub struct Linear<'a> {
    pub weight: WeightData<'a>,
    pub bias: Option<Cow<'a, [f32]>>,
    pub out_features: usize,
    pub in_features: usize,
}

/// Which kernel path a layer's attention takes (printed by `--explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPath {
    /// Float projections from the vindex f32 or f16 tier (`matmul_transb[_f16]`).
    F32,
    /// The seed's Q8 tier: int8 + f32 scales, int8 activations.
    Q8,
    /// The Q4_K tier (Q, K, O Q4_K; V Q6_K; Q5_0/Q8_0 where rows are not multiples of 256).
    Q4K,
}

/// Which kernel path a layer's FFN takes (printed by `--explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnPath {
    /// Walk FFN over the float tier's feature-major gate/up/down vectors (f32 or f16).
    WalkF32,
    /// Walk FFN over a quantized tier's gate/up rows and Linear-layout down (a vindex without
    /// a float tier; rows dequantized as they are read; exact over all features only).
    WalkQuantized,
    /// Mixture of experts: router, top-k experts (f32), optional shared expert.
    MoeF32,
    /// Mixture of experts with every expert from the quantized FFN tier (router in f32).
    MoeQuantized,
    /// Interleaved Q4_K tier (gate, up Q4_K; down Q6_K; fallbacks per row length).
    Q4K,
    /// Interleaved Q4_0 tier.
    Q4,
}

impl fmt::Display for AttnPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttnPath::F32 => f.write_str("attention float tier"),
            AttnPath::Q8 => f.write_str("attention Q8 (int8 + f32 scales)"),
            AttnPath::Q4K => f.write_str("attention Q4_K tier"),
        }
    }
}

impl fmt::Display for FfnPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FfnPath::WalkF32 => f.write_str("walk FFN, float tier"),
            FfnPath::WalkQuantized => {
                f.write_str("walk FFN over the quantized tier's rows (no float tier)")
            }
            FfnPath::MoeF32 => f.write_str("MoE f32 (router, top-k experts)"),
            FfnPath::MoeQuantized => {
                f.write_str("MoE (f32 router, top-k experts from the quantized FFN tier)")
            }
            FfnPath::Q4K => f.write_str("FFN interleaved Q4_K tier"),
            FfnPath::Q4 => f.write_str("FFN interleaved Q4_0 tier (Q4_0 or Q4_0x16)"),
        }
    }
}

/// How a down projection is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownLayout {
    /// `[intermediate, hidden]`: one feature's down vector is a row (the vindex FFN tier).
    FeatureMajor,
    /// `[hidden, intermediate]`: HF Linear layout (MoE experts as stored).
    Linear,
}

/// Walk-FFN weights: `[intermediate, hidden]` gate and up vectors, down per [`DownLayout`],
/// f32 or f16 as stored. `gate` is `None` for non-gated (`FfnType::Standard`) FFNs.
#[derive(Clone, Debug)]
pub struct WalkFfn<'a> {
    pub intermediate_size: usize,
    pub gate: Option<FloatRows<'a>>,
    pub up: FloatRows<'a>,
    pub down: FloatRows<'a>,
    pub down_layout: DownLayout,
    /// `[intermediate]` (gpt-oss experts).
    pub gate_bias: Option<Cow<'a, [f32]>>,
    pub up_bias: Option<Cow<'a, [f32]>>,
    pub down_bias: Option<Cow<'a, [f32]>>,
    /// Sparse top-K walk of this layer (`--walk-k`); `None`: all features (exact).
    pub sparse: Option<crate::walk::SparseWalk<'a>>,
}

/// Mixture-of-experts FFN (Mixtral, Qwen2-MoE, gpt-oss): softmax router over experts, the top
/// `top_k` experts weighted by their router probability (renormalised when `norm_topk_prob`),
/// plus an always-on shared expert scaled by `sigmoid(x · shared_gate)` (Qwen2-MoE).
#[derive(Clone, Debug)]
pub struct MoeFfn<'a> {
    /// `[num_experts, hidden]`.
    pub router: Cow<'a, [f32]>,
    /// `[num_experts]`, added to the router logits (gpt-oss).
    pub router_bias: Option<Cow<'a, [f32]>>,
    pub experts: Vec<WalkFfn<'a>>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub shared: Option<WalkFfn<'a>>,
    /// `[hidden]`.
    pub shared_gate: Option<Cow<'a, [f32]>>,
}

impl MoeFfn<'_> {
    /// The router `[num_experts, hidden]` as a matrix for the backend's products.
    pub(crate) fn router_matrix(&self, hidden: usize) -> infer_compute::Matrix<'_> {
        infer_compute::Matrix {
            data: infer_compute::MatData::F32(&self.router),
            rows: self.experts.len(),
            cols: hidden,
        }
    }

    /// The shared-expert gate `sg` (`[hidden]`) as a one-row matrix (its product with `x` is
    /// the logit of `sigmoid(x · shared_gate)`).
    pub(crate) fn shared_gate_matrix(sg: &[f32], hidden: usize) -> infer_compute::Matrix<'_> {
        infer_compute::Matrix {
            data: infer_compute::MatData::F32(sg),
            rows: 1,
            cols: hidden,
        }
    }

    /// Whether any expert has a bias (gpt-oss): such experts run one at a time, their biases
    /// added after each product, rather than through the routed or grouped products.
    pub(crate) fn experts_biased(&self) -> bool {
        self.experts
            .iter()
            .any(|e| e.gate_bias.is_some() || e.up_bias.is_some() || e.down_bias.is_some())
    }

    /// Whether a one-row (decode) step runs this layer's experts as dense products on the
    /// backend (forward.rs `moe_ffn_one_row`): every expert, and the shared one, in the HF
    /// Linear layout, gated as the layer says, without gpt-oss's clamped SwiGLU or a sparse
    /// walk.
    pub fn runs_as_products(&self, g: &LayerGeometry) -> bool {
        g.clamped_swiglu.is_none()
            && self.experts.iter().chain(&self.shared).all(|e| {
                e.down_layout == DownLayout::Linear
                    && e.sparse.is_none()
                    && (e.gate.is_some() == (g.ffn_type == FfnType::Gated))
            })
    }
}

/// A dense FFN with HF Linear-layout matrices (the quantized interleaved tiers):
/// `down(act(gate(x)) · up(x))`, or `down(act(up(x)))` without a gate.
#[derive(Clone, Debug)]
pub struct DenseFfn<'a> {
    pub gate: Option<Linear<'a>>,
    pub up: Linear<'a>,
    pub down: Linear<'a>,
}

/// A layer's FFN.
#[derive(Clone, Debug)]
pub enum Ffn<'a> {
    Walk(WalkFfn<'a>),
    Dense(DenseFfn<'a>),
    Moe(MoeFfn<'a>),
}

/// One transformer block ready to run.
#[derive(Clone, Debug)]
pub struct FullPipelineLayer<'a> {
    pub geometry: LayerGeometry,
    pub attn_path: AttnPath,
    pub ffn_path: FfnPath,
    pub pre_attn_norm: Option<NormWeights<'a>>,
    pub post_attn_norm: Option<NormWeights<'a>>,
    pub pre_ffn_norm: Option<NormWeights<'a>>,
    pub post_ffn_norm: Option<NormWeights<'a>>,
    pub q_norm: Option<NormWeights<'a>>,
    pub k_norm: Option<NormWeights<'a>>,
    pub wq: Linear<'a>,
    pub wk: Linear<'a>,
    pub wv: Linear<'a>,
    pub wo: Linear<'a>,
    /// Attention sinks `[num_q_heads]` (gpt-oss), joined to the layer's attention parameters
    /// at the attention call.
    pub attn_sinks: Option<Cow<'a, [f32]>>,
    pub ffn: Ffn<'a>,
}

impl NormWeights<'_> {
    /// These weights as the compute crate's norm of `kind` with `eps`.
    pub fn view(&self, kind: infer_compute::NormKind, eps: f32) -> infer_compute::Norm<'_> {
        infer_compute::Norm {
            kind,
            weight: &self.weight,
            bias: self.bias.as_deref(),
            eps,
        }
    }

    fn byte_len(&self) -> usize {
        (self.weight.len() + self.bias.as_ref().map_or(0, |b| b.len())) * 4
    }
}

impl Linear<'_> {
    /// The weight as the compute crate's matrix view `[out_features, in_features]`.
    pub fn matrix(&self) -> Matrix<'_> {
        self.weight.matrix(self.out_features, self.in_features)
    }

    fn byte_len(&self) -> usize {
        self.weight.byte_len() + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }
}

impl WalkFfn<'_> {
    /// Bytes one token reads: every gate row, and the up and down rows of the features used
    /// (all, or the sparse walk's K); with the Q4_0 selection, the Q4_0 gate copy plus the K
    /// selected float gate rows instead of every gate row.
    fn byte_len(&self) -> usize {
        let gate = self.gate.as_ref().map_or(0, |g| g.byte_len());
        let (up, down) = (self.up.byte_len(), self.down.byte_len());
        match &self.sparse {
            None => gate + up + down,
            Some(s) => {
                let frac = s.k as f64 / self.intermediate_size.max(1) as f64;
                let rows = |bytes: usize| (bytes as f64 * frac) as usize;
                match s.gate_q4 {
                    None => gate + rows(up + down),
                    Some(q) => q.len() + rows(gate + up + down),
                }
            }
        }
    }

    /// Bytes of all its weights as stored: gate, up and down of every feature, the biases, and
    /// the sparse walk's Q4_0 gate copy (`--walk-select q4`).
    fn stored_bytes(&self) -> usize {
        let bias = |b: &Option<Cow<'_, [f32]>>| b.as_ref().map_or(0, |b| b.len() * 4);
        self.gate.as_ref().map_or(0, |g| g.byte_len())
            + self.up.byte_len()
            + self.down.byte_len()
            + bias(&self.gate_bias)
            + bias(&self.up_bias)
            + bias(&self.down_bias)
            + self
                .sparse
                .as_ref()
                .and_then(|s| s.gate_q4)
                .map_or(0, |q| q.len())
    }

    /// `" (K 768 of 1536 features per token, selected by the float-tier gate)"` or
    /// `" (all 1536 features, exact)"` (`--explain`).
    pub fn describe_k(&self) -> String {
        match &self.sparse {
            None => format!(" (all {} features, exact)", self.intermediate_size),
            Some(s) => format!(
                " (K {} of {} features per token, selected by the {})",
                s.k,
                self.intermediate_size,
                match s.gate_q4 {
                    Some(_) => crate::Selection::Q4,
                    None => crate::Selection::F32,
                }
            ),
        }
    }
}

impl FullPipelineLayer<'_> {
    /// Bytes of this layer's weights as stored (blocks at their size, f16, f32, biases and
    /// norms included): `(device, host)`, the part a device backend holds resident (norms,
    /// attention, attention sinks, a dense FFN, an MoE FFN whose decode steps run as products:
    /// [`MoeFfn::runs_as_products`]) and the part that runs on the host even then (a walk FFN,
    /// another MoE FFN: every expert, router and shared expert).
    pub fn stored_weight_bytes(&self) -> (usize, usize) {
        let norms = self.norm_bytes();
        let attn = self.wq.byte_len()
            + self.wk.byte_len()
            + self.wv.byte_len()
            + self.wo.byte_len()
            + self.attn_sinks.as_ref().map_or(0, |s| s.len() * 4);
        let device = norms + attn;
        match &self.ffn {
            Ffn::Dense(d) => (
                device
                    + d.gate.as_ref().map_or(0, |g| g.byte_len())
                    + d.up.byte_len()
                    + d.down.byte_len(),
                0,
            ),
            Ffn::Walk(w) => (device, w.stored_bytes()),
            Ffn::Moe(m) => {
                let f32s = |v: &Option<Cow<'_, [f32]>>| v.as_ref().map_or(0, |v| v.len() * 4);
                let all = m.router.len() * 4
                    + f32s(&m.router_bias)
                    + f32s(&m.shared_gate)
                    + m.experts.iter().map(|e| e.stored_bytes()).sum::<usize>()
                    + m.shared.as_ref().map_or(0, |s| s.stored_bytes());
                // Decode steps multiply the chosen experts on the device, which keeps every
                // expert it has read (prompts still run the experts on the host copy).
                if m.runs_as_products(&self.geometry) {
                    (device + all, 0)
                } else {
                    (device, all)
                }
            }
        }
    }

    /// `" (gate Q4_K, up Q4_K, down Q6_K)"` for quantized dense FFNs, the features used per
    /// token for walk FFNs ([`WalkFfn::describe_k`]), empty otherwise.
    pub fn ffn_formats(&self) -> String {
        match &self.ffn {
            Ffn::Dense(d) => format!(
                " (gate {}, up {}, down {})",
                d.gate.as_ref().map_or("-".into(), |g| g.weight.describe()),
                d.up.weight.describe(),
                d.down.weight.describe()
            ),
            Ffn::Walk(w) => w.describe_k(),
            Ffn::Moe(m) => m.experts.first().map_or(String::new(), |e| {
                format!(
                    " ({} experts, top {}; each gate {}, up {}, down {})",
                    m.experts.len(),
                    m.top_k,
                    e.gate.as_ref().map_or("-", |g| g.dtype()),
                    e.up.dtype(),
                    e.down.dtype()
                )
            }),
        }
    }

    /// Bytes of the layer's norm weights (and biases), f32.
    fn norm_bytes(&self) -> usize {
        [
            &self.pre_attn_norm,
            &self.post_attn_norm,
            &self.pre_ffn_norm,
            &self.post_ffn_norm,
            &self.q_norm,
            &self.k_norm,
        ]
        .iter()
        .map(|n| n.as_ref().map_or(0, |n| n.byte_len()))
        .sum()
    }

    /// Bytes of weights one token reads in this layer (MoE: the first top-k experts as
    /// representative, plus router and shared expert).
    pub fn weight_bytes(&self) -> usize {
        let norms = self.norm_bytes();
        let attn =
            self.wq.byte_len() + self.wk.byte_len() + self.wv.byte_len() + self.wo.byte_len();
        let ffn = match &self.ffn {
            Ffn::Walk(w) => w.byte_len(),
            Ffn::Dense(d) => {
                d.gate.as_ref().map_or(0, |g| g.byte_len()) + d.up.byte_len() + d.down.byte_len()
            }
            Ffn::Moe(m) => {
                m.router.len() * 4
                    + m.experts
                        .iter()
                        .take(m.top_k)
                        .map(|e| e.byte_len())
                        .sum::<usize>()
                    + m.shared.as_ref().map_or(0, |s| s.byte_len())
            }
        };
        norms + attn + ffn
    }
}
