//! `infer synth --like config.json`: a Hugging Face folder with random weights of every tensor
//! the config's architecture loads, named and shaped as the checkpoint stores them.
//!
//! Names and shapes come from [`ModelArchitecture`]'s canonical keys (the ones `infer extract`
//! looks up), mapped back to the family's checkpoint names where they differ (StarCoder2 `c_fc`,
//! Mixtral `block_sparse_moe`, phi `dense`/`fc1`/`fc2`); every mapped name is checked to map
//! forward to its key again. Families that store fused or transposed tensors (gpt2, gpt_neox,
//! phi3, gpt_oss's fused experts) are refused.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};
use infer_models::arch::TensorTransform;
use infer_models::{architecture_for, ModelArchitecture, ModelConfig};
use infer_quant::QuantFormat;

use super::random::{stream_tensor, Fill, RandomTensor, CHUNK_VALUES};

/// Stored dtype of the safetensors file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F32,
    Bf16,
}

impl std::str::FromStr for StDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(StDtype::F32),
            "bf16" => Ok(StDtype::Bf16),
            _ => Err(format!("unknown dtype '{s}' (f32 or bf16)")),
        }
    }
}

impl StDtype {
    /// The same encoding as an infer-quant format (its name is the safetensors dtype tag).
    fn format(self) -> QuantFormat {
        match self {
            StDtype::F32 => QuantFormat::F32,
            StDtype::Bf16 => QuantFormat::BF16,
        }
    }
}

/// Checkpoint tensor name → row-major shape, sorted by name.
pub type TensorShapes = BTreeMap<String, Vec<usize>>;

/// Families whose checkpoints store fused or transposed tensors this writer does not produce.
const UNSUPPORTED: &[&str] = &["gpt2", "gpt_neox", "phi3", "gpt_oss"];

/// Checkpoint name of a canonical key for families that rename modules.
fn checkpoint_name(family: &str, key: &str) -> String {
    let table: &[(&str, &str)] = match family {
        "starcoder2" => &[
            (".mlp.up_proj.", ".mlp.c_fc."),
            (".mlp.down_proj.", ".mlp.c_proj."),
        ],
        "mixtral" => &[
            (".mlp.gate.", ".block_sparse_moe.gate."),
            (".gate_proj.", ".w1."),
            (".up_proj.", ".w3."),
            (".down_proj.", ".w2."),
            (".mlp.experts.", ".block_sparse_moe.experts."),
        ],
        "phi" => &[
            (".self_attn.o_proj.", ".self_attn.dense."),
            (".mlp.up_proj.", ".mlp.fc1."),
            (".mlp.down_proj.", ".mlp.fc2."),
            ("model.norm.", "model.final_layernorm."),
        ],
        _ => &[],
    };
    let mut name = key.to_string();
    for (from, to) in table {
        name = name.replacen(from, to, 1);
    }
    name
}

/// Checkpoint names and shapes of every tensor the architecture of `config` loads, sorted by
/// name (the order of the written safetensors file). `config_path` names the file in errors.
///
/// Errors: an unknown `model_type` or inconsistent config, a family storing fused/transposed
/// tensors ([`UNSUPPORTED`]), a name that would not map back to its canonical key.
pub fn expected_tensors(
    config: &ModelConfig,
    config_path: &Path,
) -> anyhow::Result<(TensorShapes, Box<dyn ModelArchitecture>)> {
    let arch =
        architecture_for(config).map_err(|e| anyhow::anyhow!("{}: {e}", config_path.display()))?;
    let family = arch.family().to_string();
    if UNSUPPORTED.contains(&family.as_str()) {
        bail!(
            "{}: synth cannot write model_type '{family}' (its checkpoints store fused or transposed tensors; supported: the other model types)",
            config_path.display()
        );
    }
    let mut map = BTreeMap::new();
    for infer_models::arch::ExpectedTensor { key, shape, .. } in
        infer_models::arch::expected_tensors(arch.as_ref())
    {
        let name = checkpoint_name(&family, &key);
        if arch.canonical_name(&name).as_deref() != Some(key.as_str())
            || arch.source_transform(&name) != TensorTransform::AsIs
        {
            bail!("internal: synth name '{name}' does not map back to '{key}' for {family}");
        }
        if map.insert(name.clone(), shape).is_some() {
            bail!("internal: tensor '{name}' listed twice for {family}");
        }
    }
    Ok((map, arch))
}

/// The safetensors header of `tensors` (JSON padded with spaces to a multiple of 8 bytes) and
/// the byte length of the data section after it. `config_path` names the file in errors.
///
/// Errors: a tensor with a zero-sized dimension, or whose byte size (or the running total)
/// overflows u64 — naming the tensor and its shape.
pub fn safetensors_header(
    tensors: &TensorShapes,
    dtype: StDtype,
    config_path: &Path,
) -> anyhow::Result<(Vec<u8>, u64)> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, shape) in tensors {
        if shape.contains(&0) {
            bail!(
                "{}: tensor '{name}' would have a zero-sized dimension (shape {shape:?}); check the config's sizes",
                config_path.display()
            );
        }
        let n = shape
            .iter()
            .try_fold(dtype.format().block_bytes() as u64, |a, &d| {
                a.checked_mul(d as u64)
            });
        let end = n.and_then(|n| offset.checked_add(n)).with_context(|| {
            format!(
                "{}: tensor '{name}' of shape {shape:?} is absurdly large (its size overflows); check the config's sizes",
                config_path.display()
            )
        })?;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype.format().name(), "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut head = serde_json::to_vec(&serde_json::Value::Object(header))?;
    head.resize(head.len().div_ceil(8) * 8, b' ');
    Ok((head, offset))
}

/// Write `model.safetensors` at `out`: `head` (from [`safetensors_header`] for the same
/// `tensors` and `dtype`), then random values for `tensors` (sorted by name, as listed). Norm
/// weights are centred on `1 - norm_weight_offset` (so `1 + w` families get effective weights
/// ≈ 1), other 1-D tensors ± 0.02, matrices N(0, 0.02). Returns the bytes written.
pub fn write_safetensors(
    tensors: &TensorShapes,
    head: &[u8],
    norm_centre: f32,
    dtype: StDtype,
    seed: u64,
    out: &Path,
) -> anyhow::Result<u64> {
    let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", out.display());
    let file = std::fs::File::create(out).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    w.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(head).map_err(io)?;
    let mut written = 8 + head.len() as u64;
    for (index, (name, shape)) in tensors.iter().enumerate() {
        let row_len = *shape.last().unwrap_or(&1);
        let rows = shape.iter().product::<usize>() / row_len.max(1);
        let tensor = RandomTensor {
            name,
            index,
            format: dtype.format(),
            fill: Fill::for_tensor(name, shape.len(), norm_centre),
            rows,
            row_len,
        };
        stream_tensor(&tensor, seed, CHUNK_VALUES, &mut |b| {
            w.write_all(b).map_err(io)?;
            written += b.len() as u64;
            Ok(())
        })?;
    }
    let file = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {}", out.display(), e.error()))?;
    file.sync_all().map_err(io)?;
    Ok(written)
}

/// Files copied from beside `config.json` when present.
pub const COPIED_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
];
