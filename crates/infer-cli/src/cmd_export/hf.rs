//! `infer export VINDEX -o DIR --safetensors`: a Hugging Face folder — `config.json`
//! ([`infer_models::ModelConfig::to_hf_json`]), the weights under the family's HF names and
//! layouts (fused q/k/v and gate/up joined again, GPT-2 Conv1D transposed back, FFN down back
//! to `[hidden, intermediate]`) in `model.safetensors`, or in shards of at most `--shard-size`
//! bytes with `model.safetensors.index.json` (transformers' `max_shard_size` layout), and the
//! vindex's tokenizer files. Values are written as stored (f32, or f16 for an f16 tier's
//! matrices; 1-D tensors f32), so `infer extract` of the folder gives the float tier back bit
//! for bit. A vindex without a float tier is written from a quantized tier, dequantized
//! exactly (ggml's dequantization) to f32.
//!
//! Tensors are produced one at a time while the `safetensors` crate streams them to disk.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use half::f16;
use infer_models::ModelArchitecture;
use infer_vindex::{files, Vindex};
use safetensors::{tensor::View, Dtype};
use serde_json::json;

use super::source::{transpose, Data, Tensor};
use super::{join_order, Written};

/// transformers' default `max_shard_size` ("5GB").
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

/// Values of one HF tensor, in its dtype.
enum Values {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// The values of a part in its export dtype (f16 stays f16, everything else f32), HF layout.
fn part_values(t: &Tensor<'_>) -> anyhow::Result<Values> {
    Ok(match t.data {
        Data::F16(v) => Values::F16(v.to_vec()),
        Data::FeatureMajor(s) if s.as_f16().is_some() => {
            let (h, i) = (t.shape[0], t.shape[1]);
            Values::F16(transpose(s.as_f16().unwrap_or_default(), i, h))
        }
        _ => Values::F32(t.to_f32()?),
    })
}

/// One HF tensor: its name, shape, dtype and the parts it is joined from.
struct HfTensor<'t, 'a> {
    name: String,
    shape: Vec<usize>,
    dtype: Dtype,
    parts: Vec<&'t Tensor<'a>>,
    transform: infer_models::arch::TensorTransform,
}

impl HfTensor<'_, '_> {
    fn byte_len(&self) -> usize {
        let n: usize = self.shape.iter().product();
        n * if self.dtype == Dtype::F16 { 2 } else { 4 }
    }

    /// The tensor's bytes (little-endian), joined and laid out as the HF checkpoint stores it.
    fn bytes(&self, cfg: &infer_models::ModelConfig) -> anyhow::Result<Vec<u8>> {
        let vals: Vec<Values> = self
            .parts
            .iter()
            .map(|p| part_values(p))
            .collect::<anyhow::Result<_>>()?;
        let err = |m: String| anyhow::anyhow!("'{}': {m}", self.name);
        match self.dtype {
            Dtype::F16 => {
                let parts: Vec<Vec<f16>> = vals
                    .into_iter()
                    .map(|v| match v {
                        Values::F16(v) => Ok(v),
                        Values::F32(_) => Err(err("f32 and f16 parts".into())),
                    })
                    .collect::<anyhow::Result<_>>()?;
                let joined =
                    infer_vindex::transform::unapply(cfg, &parts, &self.shape, self.transform)
                        .map_err(err)?;
                Ok(joined.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
            _ => {
                let parts: Vec<Vec<f32>> = vals
                    .into_iter()
                    .map(|v| match v {
                        Values::F32(v) => Ok(v),
                        Values::F16(_) => Err(err("f32 and f16 parts".into())),
                    })
                    .collect::<anyhow::Result<_>>()?;
                let joined =
                    infer_vindex::transform::unapply(cfg, &parts, &self.shape, self.transform)
                        .map_err(err)?;
                Ok(joined.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
        }
    }
}

/// A tensor the `safetensors` crate pulls its bytes from when it writes it; a failure is kept
/// in `error` (the crate's `View::data` cannot fail) and fails the export afterwards.
struct Lazy<'h, 't, 'a> {
    t: &'h HfTensor<'t, 'a>,
    cfg: &'h infer_models::ModelConfig,
    error: &'h RefCell<Option<anyhow::Error>>,
}

impl View for Lazy<'_, '_, '_> {
    fn dtype(&self) -> Dtype {
        self.t.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.t.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self.t.bytes(self.cfg) {
            Ok(b) if b.len() == self.t.byte_len() => Cow::Owned(b),
            Ok(b) => {
                self.error.borrow_mut().get_or_insert_with(|| {
                    anyhow::anyhow!(
                        "'{}': {} bytes, expected {}",
                        self.t.name,
                        b.len(),
                        self.t.byte_len()
                    )
                });
                Cow::Owned(vec![0; self.t.byte_len()])
            }
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.t.byte_len()])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.t.byte_len()
    }
}

/// Group the canonical tensors into HF tensors (fused projections joined, in the order the
/// family's extract splits them).
fn hf_tensors<'t, 'a>(
    v: &Vindex,
    arch: &dyn ModelArchitecture,
    tensors: &'t [Tensor<'a>],
) -> anyhow::Result<Vec<HfTensor<'t, 'a>>> {
    let cfg = v.config();
    let mut groups: Vec<(String, Vec<&'t Tensor<'a>>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for t in tensors {
        let name = arch.source_name(&t.key);
        match index.get(&name) {
            Some(&i) => groups[i].1.push(t),
            None => {
                index.insert(name.clone(), groups.len());
                groups.push((name, vec![t]));
            }
        }
    }
    let mut out = Vec::with_capacity(groups.len());
    for (name, parts) in groups {
        let (order, shape, transform) = join_order(cfg, arch, &name, &parts)?;
        let parts: Vec<&Tensor> = order.into_iter().map(|i| parts[i]).collect();
        let f16 = |p: &Tensor| match p.data {
            Data::F16(_) => true,
            Data::FeatureMajor(s) => s.as_f16().is_some(),
            _ => false,
        };
        let dtype = if parts.iter().all(|p| f16(p)) {
            Dtype::F16
        } else if parts.iter().any(|p| f16(p)) {
            bail!("'{name}': its parts are stored in f16 and f32");
        } else {
            Dtype::F32
        };
        out.push(HfTensor {
            name,
            shape,
            dtype,
            parts,
            transform,
        });
    }
    Ok(out)
}

/// Split `tensors` into shards of at most `max` bytes each (a larger tensor alone in its
/// shard), in order.
fn shards(sizes: &[usize], max: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut acc) = (0usize, 0u64);
    for (i, &s) in sizes.iter().enumerate() {
        if i > start && acc + s as u64 > max {
            out.push(start..i);
            start = i;
            acc = 0;
        }
        acc += s as u64;
    }
    if start < sizes.len() || out.is_empty() {
        out.push(start..sizes.len());
    }
    out
}

/// Bytes the folder will take (weights and copied files; headers not counted).
pub fn planned_size(tensors: &[Tensor<'_>]) -> u64 {
    tensors
        .iter()
        .map(|t| {
            let n: u64 = t.shape.iter().product::<usize>() as u64;
            let f16 = matches!(t.data, Data::F16(_))
                || matches!(t.data, Data::FeatureMajor(s) if s.as_f16().is_some());
            n * if f16 { 2 } else { 4 }
        })
        .sum()
}

/// Write the HF folder of `v` into the (staged, empty) directory `dir`: `config.json`, the
/// weights (`model.safetensors`, or shards of at most `shard_bytes` with
/// `model.safetensors.index.json`), and the vindex's `tokenizer.json`, `tokenizer_config.json`
/// and `chat_template.jinja` when it has them (and not `no_tokenizer`). The written
/// `config.json` is parsed back and must give the vindex's config.
///
/// Errors: fused parts in different dtypes, a config that does not read back, I/O and
/// safetensors errors naming the file.
pub fn write(
    v: &Vindex,
    tensors: &[Tensor<'_>],
    no_tokenizer: bool,
    shard_bytes: u64,
    dir: &Path,
) -> anyhow::Result<Written> {
    let cfg = v.config();
    let vpath = v.path().display().to_string();
    let arch = infer_models::architecture_for(cfg).map_err(|m| anyhow::anyhow!("{vpath}: {m}"))?;
    let hf = hf_tensors(v, arch.as_ref(), tensors)?;
    let matrices_f16 = hf
        .iter()
        .any(|t| t.dtype == Dtype::F16 && t.shape.len() == 2);
    let config = cfg.to_hf_json(if matrices_f16 { "float16" } else { "float32" });
    let back = infer_models::ModelConfig::from_hf_json(&dir.join("config.json"), &config)
        .with_context(|| format!("{vpath}: the written config.json does not read back"))?;
    if &back != cfg {
        bail!("{vpath}: the written config.json reads back as another config: {back:?}");
    }
    let text = serde_json::to_string_pretty(&config)?;
    std::fs::write(dir.join("config.json"), text + "\n")
        .with_context(|| format!("writing {}", dir.join("config.json").display()))?;

    let sizes: Vec<usize> = hf.iter().map(HfTensor::byte_len).collect();
    let ranges = shards(&sizes, shard_bytes);
    let n = ranges.len();
    let error = RefCell::new(None);
    let meta = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let mut weight_map = serde_json::Map::new();
    let mut bytes = 0u64;
    for (k, r) in ranges.iter().enumerate() {
        let file = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", k + 1)
        };
        let path = dir.join(&file);
        let views: Vec<(String, Lazy)> = hf[r.clone()]
            .iter()
            .map(|t| {
                weight_map.insert(t.name.clone(), json!(file));
                (
                    t.name.clone(),
                    Lazy {
                        t,
                        cfg,
                        error: &error,
                    },
                )
            })
            .collect();
        safetensors::serialize_to_file(views, &meta, &path).map_err(|e| {
            anyhow::anyhow!(
                "writing {}: {}",
                path.display(),
                infer_models::hf::safetensors_error_text(&e)
            )
        })?;
        if let Some(e) = error.borrow_mut().take() {
            return Err(e.context(format!("writing {}", path.display())));
        }
        bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    }
    if n > 1 {
        let total: usize = sizes.iter().sum();
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let p = dir.join("model.safetensors.index.json");
        std::fs::write(&p, serde_json::to_string_pretty(&index)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if !no_tokenizer {
        if v.index().has_tokenizer {
            let p = dir.join(files::TOKENIZER_JSON);
            std::fs::write(&p, v.tokenizer_json()?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        for (name, text) in [
            (files::TOKENIZER_CONFIG_JSON, v.tokenizer_config_json()),
            (files::CHAT_TEMPLATE_JINJA, v.chat_template()),
        ] {
            if let Some(t) = text {
                let p = dir.join(name);
                std::fs::write(&p, t).with_context(|| format!("writing {}", p.display()))?;
            }
        }
    }
    Ok(Written {
        tensors: hf.len(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_respect_the_limit() {
        assert_eq!(shards(&[4, 4, 4], 100), vec![0..3]);
        assert_eq!(shards(&[4, 4, 4], 8), vec![0..2, 2..3]);
        assert_eq!(shards(&[10, 4, 4], 8), vec![0..1, 1..3]);
        assert_eq!(shards(&[], 8), vec![0..0]);
    }
}
