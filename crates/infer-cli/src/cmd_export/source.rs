//! Which stored copy of each tensor an export writes ([`Plan`], from `--tier`), and the list of
//! tensors in HF layout with their stored bytes ([`resolve`]), borrowed from the vindex's maps.

use std::collections::HashMap;

use anyhow::{bail, Context};
use half::f16;
use infer_quant::QuantFormat;
use infer_vindex::classify::{classify, split_layer, Role};
use infer_vindex::{files, FloatSlice, Tier, Vindex};

/// `--tier`: which stored copy of the matrices to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierArg {
    F32,
    F16,
    Q4K,
    Q8,
    Q4,
}

impl std::str::FromStr for TierArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(TierArg::F32),
            "f16" => Ok(TierArg::F16),
            "q4k" => Ok(TierArg::Q4K),
            "q8" => Ok(TierArg::Q8),
            "q4" => Ok(TierArg::Q4),
            _ => Err(format!(
                "unknown tier '{s}' (expected q4k, q8, q4, f16 or f32)"
            )),
        }
    }
}

impl TierArg {
    fn tier(self) -> Tier {
        match self {
            TierArg::F32 => Tier::F32,
            TierArg::F16 => Tier::F16,
            TierArg::Q4K => Tier::Q4K,
            TierArg::Q8 => Tier::Q8,
            TierArg::Q4 => Tier::Q4,
        }
    }
}

/// Where one group of matrices comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The float tier (f32 or f16 as stored).
    Float,
    Q4K,
    Q8,
    Q4,
}

/// The output projection's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmPick {
    /// The float tier's `lm_head`, or, when the model ties it, the embeddings as stored (no
    /// output tensor is written).
    Float,
    /// The q4k tier's output matrix (`lm_head_q6k.bin`).
    Q6K,
    /// The q4 tier's output matrix (`lm_head_q4.bin`).
    Q4,
}

/// Which copy the attention matrices, the FFN matrices and the output projection come from
/// (everything else — embeddings, norms, biases, routers — is stored once and written as stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub attn: Pick,
    pub ffn: Pick,
    pub lm_head: LmPick,
}

impl Plan {
    /// The export's summary: the tiers of the attention and FFN matrices, and the stored format
    /// of the output projection as written (`output Q6_K`), or when no output tensor is written
    /// (a tied model), the format of the embeddings it reads (`output tied to the embeddings
    /// (Q8_0)`). `tensors` is [`resolve`]'s list.
    pub fn describe(&self, v: &Vindex, tensors: &[Tensor<'_>]) -> String {
        let output = match tensors.iter().find(|t| t.key == "lm_head.weight") {
            Some(t) => t.data.format().to_string(),
            None => format!("tied to the embeddings ({})", v.embeddings().0.format()),
        };
        format!(
            "attention {:?}, FFN {:?}, output {output}",
            self.attn, self.ffn
        )
    }
}

/// The float tier of `v` (`F32` / `F16`), if any.
pub fn float_tier(v: &Vindex) -> Option<Tier> {
    [Tier::F32, Tier::F16].into_iter().find(|t| v.has_tier(*t))
}

/// Resolve `--tier` against the tiers `v` has, as `infer run` picks by default when `tier` is
/// `None`: attention q4k → q8 → float, FFN q4k → q4 → float, and the tier's own output matrix
/// when the FFN is quantized. `--tier f32|f16` takes every matrix from that float tier; `q4k`
/// attention and FFN from q4k; `q8` attention from q8 (the FFN as by default); `q4` the FFN
/// from q4 (attention as by default). `prefer_float` (the safetensors export): without
/// `--tier`, the float tier when there is one.
///
/// Errors: a tier the vindex lacks, naming the tiers it has.
pub fn plan(v: &Vindex, tier: Option<TierArg>, prefer_float: bool) -> anyhow::Result<Plan> {
    let has = |t: Tier| v.has_tier(t);
    let float = float_tier(v);
    let names = || {
        v.tiers()
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(t) = tier {
        if !has(t.tier()) {
            let hint = match (t, float) {
                (TierArg::F16, Some(Tier::F32)) => {
                    " (its float tier is f32: converting f32 to f16 rounds, so use --tier f32 or rebuild with `infer extract --float f16`)"
                }
                (TierArg::F32, Some(Tier::F16)) => " (its float tier is f16: use --tier f16)",
                _ => "",
            };
            bail!(
                "{}: no '{}' tier (it has {}){hint}",
                v.path().display(),
                t.tier(),
                names()
            );
        }
    }
    let auto_attn = || {
        if has(Tier::Q4K) {
            Pick::Q4K
        } else if has(Tier::Q8) {
            Pick::Q8
        } else {
            Pick::Float
        }
    };
    let auto_ffn = || {
        if has(Tier::Q4K) {
            Pick::Q4K
        } else if has(Tier::Q4) {
            Pick::Q4
        } else {
            Pick::Float
        }
    };
    let (attn, ffn) = match tier {
        Some(TierArg::F32 | TierArg::F16) => (Pick::Float, Pick::Float),
        None if prefer_float && float.is_some() => (Pick::Float, Pick::Float),
        None => (auto_attn(), auto_ffn()),
        Some(TierArg::Q4K) => (Pick::Q4K, Pick::Q4K),
        Some(TierArg::Q8) => (Pick::Q8, auto_ffn()),
        Some(TierArg::Q4) => (auto_attn(), Pick::Q4),
    };
    if (attn == Pick::Float || ffn == Pick::Float) && float.is_none() {
        bail!(
            "{}: the attention and FFN matrices must come from a tier that holds them; it has {} (pick one with --tier)",
            v.path().display(),
            names()
        );
    }
    let lm_head = match ffn {
        Pick::Q4K if v.has_lm_head_copy(Tier::Q4K) => LmPick::Q6K,
        Pick::Q4 if v.has_lm_head_copy(Tier::Q4) => LmPick::Q4,
        _ => LmPick::Float,
    };
    Ok(Plan { attn, ffn, lm_head })
}

/// A tensor's stored values, borrowed from the vindex.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// f32 values in HF layout.
    F32(&'a [f32]),
    /// f16 values in HF layout.
    F16(&'a [f16]),
    /// f32 / f16 values of a feature-major FFN down matrix `[intermediate, hidden]` (the float
    /// tier's layout): transposed to HF's `[hidden, intermediate]` on output.
    FeatureMajor(FloatSlice<'a>),
    /// ggml blocks in HF layout (rows are whole blocks).
    Blocks {
        format: QuantFormat,
        bytes: &'a [u8],
    },
    /// The q8 tier's int8 values `[out, in]` and f32 scales `[out, in/32]`.
    SplitQ8 { values: &'a [u8], scales: &'a [f32] },
}

impl Data<'_> {
    /// The format the values are stored (and exported) in; the q8 tier's split values are
    /// written as `Q8_0`.
    pub fn format(&self) -> QuantFormat {
        match self {
            Data::F32(_) => QuantFormat::F32,
            Data::F16(_) => QuantFormat::F16,
            Data::FeatureMajor(s) => s.format(),
            Data::Blocks { format, .. } => *format,
            Data::SplitQ8 { .. } => QuantFormat::Q8_0,
        }
    }
}

/// One tensor to write: canonical key, HF Linear shape, stored data.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    pub key: String,
    pub shape: Vec<usize>,
    pub data: Data<'a>,
}

impl Tensor<'_> {
    /// The values as f32 in HF layout (f16 widened, blocks dequantized: exact).
    pub fn to_f32(&self) -> anyhow::Result<Vec<f32>> {
        let n: usize = self.shape.iter().product();
        Ok(match self.data {
            Data::F32(s) => s.to_vec(),
            Data::F16(s) => s.iter().map(|v| v.to_f32()).collect(),
            Data::FeatureMajor(s) => {
                let (i, h) = (self.shape[1], self.shape[0]);
                transpose(&s.to_f32_vec(), i, h)
            }
            Data::Blocks { format, bytes } => {
                let cols = self.shape.last().copied().unwrap_or(1).max(1);
                let mut out = vec![0f32; n];
                infer_quant::interleave::dequantize_matrix(format, bytes, n / cols, cols, &mut out)
                    .with_context(|| format!("dequantizing '{}' ({format})", self.key))?;
                out
            }
            Data::SplitQ8 { values, scales } => values
                .iter()
                .enumerate()
                .map(|(i, &q)| q as i8 as f32 * scales[i / 32])
                .collect(),
        })
    }
}

/// Row-major `[rows, cols]` → `[cols, rows]`.
pub fn transpose<T: Copy + Default>(data: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::default(); data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// What the plan decides a key's copy by.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    Attn,
    Ffn,
    LmHead,
    Stored,
}

fn group_of(key: &str, shape: &[usize]) -> Group {
    let p = classify(key, shape);
    match p.role {
        Role::LmHead => Group::LmHead,
        Role::Attention
            if ["q_proj", "k_proj", "v_proj", "o_proj"]
                .iter()
                .any(|m| key.ends_with(&format!("self_attn.{m}.weight"))) =>
        {
            Group::Attn
        }
        Role::FfnGate | Role::FfnUp | Role::FfnDown => Group::Ffn,
        _ if shape.len() == 2 && is_expert(key) => Group::Ffn,
        _ => Group::Stored,
    }
}

/// An MoE expert matrix (routed or shared), which the quantized FFN tiers hold.
fn is_expert(key: &str) -> bool {
    let Some((_, rest)) = split_layer(key) else {
        return false;
    };
    let proj = ["gate_proj.weight", "up_proj.weight", "down_proj.weight"];
    if let Some(p) = rest.strip_prefix("mlp.shared_expert.") {
        return proj.contains(&p);
    }
    rest.strip_prefix("mlp.experts.")
        .and_then(|r| r.split_once('.'))
        .is_some_and(|(e, p)| e.parse::<usize>().is_ok() && proj.contains(&p))
}

fn float_data<'a>(s: FloatSlice<'a>) -> Data<'a> {
    match s {
        FloatSlice::F32(v) => Data::F32(v),
        FloatSlice::F16(v) => Data::F16(v),
        FloatSlice::Blocks { format, bytes } => Data::Blocks { format, bytes },
    }
}

/// Every tensor of `v` under `plan`, in write order: embeddings, then each layer's tensors
/// (in the architecture's order), then the other global tensors. Each key once, from the copy
/// the plan picks; the output projection is left out when it is the tied embedding table.
///
/// Errors: a key the picked tier does not hold (naming both), a float read that fails.
pub fn resolve<'a>(v: &'a Vindex, plan: &Plan) -> anyhow::Result<Vec<Tensor<'a>>> {
    let cfg = v.config();
    let arch = infer_models::architecture_for(cfg)
        .map_err(|m| anyhow::anyhow!("{}: {m}", v.path().display()))?;
    // Tied: the quantized tiers' `lm_head.weight` is a copy of the embeddings. (Untied without
    // a float tier, it is the only copy of the output matrix.)
    let tied = cfg.tie_word_embeddings;
    // Every stored key with its HF shape.
    let mut shapes: HashMap<String, Vec<usize>> = HashMap::new();
    for k in v.keys() {
        if let Some((_, e)) = v.entry(k) {
            let shape = if is_feature_major_down(v, k) {
                vec![e.shape[1], e.shape[0]]
            } else {
                e.shape.clone()
            };
            shapes.insert(k.to_string(), shape);
        }
    }
    for &(bin, _) in files::QUANT_BINS {
        if matches!(bin, files::ATTN_Q8_SCALES_BIN | files::GATE_Q4_BIN) {
            continue;
        }
        for e in v.quant_entries(bin) {
            if e.key == "lm_head.weight" && tied {
                continue; // a copy of the embeddings
            }
            shapes
                .entry(e.key.clone())
                .or_insert_with(|| e.shape.clone());
        }
    }
    for e in v.q8_value_entries() {
        shapes
            .entry(e.key.clone())
            .or_insert_with(|| e.shape.clone());
    }
    // A tied model whose output matrix comes from a quantized tier's copy gets it as its own
    // tensor (llama.cpp then reads `output` instead of the embeddings).
    if tied && plan.lm_head != LmPick::Float {
        shapes.insert("lm_head.weight".into(), v.embeddings().1.to_vec());
    }

    let order: HashMap<String, usize> = infer_models::arch::expected_tensors(arch.as_ref())
        .into_iter()
        .enumerate()
        .map(|(i, e)| (e.key, i))
        .collect();
    let embed = arch.embed_key();
    let mut keys: Vec<String> = shapes.keys().cloned().collect();
    keys.sort_by_key(|k| {
        let layer = split_layer(k).map(|(l, _)| l);
        (
            k != &embed,
            layer.is_none(),
            layer.unwrap_or(0),
            order.get(k).copied().unwrap_or(usize::MAX),
            k.clone(),
        )
    });

    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let shape = shapes[&key].clone();
        let data = data_for(v, plan, &key, &shape)?;
        out.push(Tensor { key, shape, data });
    }
    Ok(out)
}

/// True when `key` is a dense FFN down matrix of the float tier (stored feature-major).
fn is_feature_major_down(v: &Vindex, key: &str) -> bool {
    let Some((l, rest)) = split_layer(key) else {
        return false;
    };
    rest == "mlp.down_proj.weight"
        && v.index()
            .layers
            .get(l)
            .and_then(|e| e.down.as_ref())
            .is_some_and(|e| e.key == key)
}

/// The data of `key` from the copy `plan` picks.
fn data_for<'a>(
    v: &'a Vindex,
    plan: &Plan,
    key: &str,
    shape: &[usize],
) -> anyhow::Result<Data<'a>> {
    let quant = |file: &'static str, tier: &str| -> anyhow::Result<Data<'a>> {
        let (bytes, e) = v
            .quant_tensor(file, key)
            .with_context(|| format!("tier '{tier}' has no copy of '{key}'"))?;
        Ok(Data::Blocks {
            format: e.format,
            bytes,
        })
    };
    let float = |key: &str| -> anyhow::Result<Data<'a>> {
        if is_feature_major_down(v, key) {
            let l = split_layer(key).map(|(l, _)| l).unwrap_or(0);
            return Ok(Data::FeatureMajor(v.down_layer(l)?));
        }
        if let Some((l, rest)) = split_layer(key) {
            let dense =
                |e: &Option<infer_vindex::TensorEntry>| e.as_ref().is_some_and(|e| e.key == key);
            let entries = v.index().layers.get(l);
            if rest == "mlp.gate_proj.weight" && entries.is_some_and(|e| dense(&e.gate)) {
                return Ok(float_data(v.gate_layer(l)?));
            }
            if rest == "mlp.up_proj.weight" && entries.is_some_and(|e| dense(&e.up)) {
                return Ok(float_data(v.up_layer(l)?));
            }
        }
        let (s, _) = v
            .tensor(key)
            .with_context(|| format!("the float tier has no '{key}'"))?;
        Ok(float_data(s))
    };
    match group_of(key, shape) {
        Group::Attn => match plan.attn {
            Pick::Float => float(key),
            Pick::Q4K => quant(files::ATTN_Q4K_BIN, "q4k"),
            Pick::Q8 => {
                let (values, scales) = v
                    .q8_tensor(key)
                    .with_context(|| format!("tier 'q8' has no copy of '{key}'"))?;
                Ok(Data::SplitQ8 { values, scales })
            }
            Pick::Q4 => bail!("internal: the q4 tier holds no attention"),
        },
        Group::Ffn => match plan.ffn {
            Pick::Float => float(key),
            Pick::Q4K => quant(files::INTERLEAVED_Q4K_BIN, "q4k"),
            Pick::Q4 => quant(files::INTERLEAVED_Q4_BIN, "q4"),
            Pick::Q8 => bail!("internal: the q8 tier holds no FFN"),
        },
        Group::LmHead => match plan.lm_head {
            LmPick::Float => float(key),
            LmPick::Q6K => quant(files::LM_HEAD_Q6K_BIN, "q4k"),
            LmPick::Q4 => quant(files::LM_HEAD_Q4_BIN, "q4"),
        },
        Group::Stored => float(key),
    }
}
