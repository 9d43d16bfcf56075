//! `infer export VINDEX -o MODEL.gguf`: llama.cpp's tensor names (through the family's HF names,
//! [`infer_models::names::hf_to_gguf_name`]), its metadata ([`model_metadata`],
//! [`tokenizer_metadata`]) and value conventions (Q/K rows in interleaved-RoPE order for
//! llama, `1 + w` Gemma norms), with every quantized tensor's ggml blocks copied as stored
//! (whole rows moved for the Q/K order, never requantized). The q8 tier's int8 values with
//! f32 scales are written as Q8_0 blocks when every scale is an f16 value (always, for a q8
//! tier infer built: its scales are Q8_0's f16 `d` widened), byte-identical to the Q8_0
//! blocks they were split from; a scale that is not is refused. Streamed one tensor at a time.

use std::path::Path;

use anyhow::{bail, Context};
use half::f16;
use infer_models::gguf::{
    config_from_gguf, export_family, model_metadata, permute_qk_byte_rows, permute_qk_rows,
    tokenizer_metadata, ExportFamily, GgufFile, GgufHeader, GgufTensorInfo, GgufValue,
    DEFAULT_ALIGNMENT,
};
use infer_models::names::hf_to_gguf_name;
use infer_models::{ModelArchitecture, ModelConfig};
use infer_quant::QuantFormat;
use infer_vindex::{Tier, Vindex};

use super::source::{transpose, Data, LmPick, Pick, Plan, Tensor};
use super::{join_order, Written};
use crate::cmd_synth::{create_gguf, finish_gguf};

/// A value fix applied on the way to GGUF.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fix {
    None,
    /// Permute rows into llama.cpp's interleaved-RoPE order, with this many heads.
    Permute(usize),
    /// Gemma: store `1 + w`.
    PlusOne,
}

/// One GGUF tensor: its parts (canonical tensors; several for a fused projection), format and
/// value fix.
struct Out<'t, 'a> {
    name: String,
    parts: Vec<&'t Tensor<'a>>,
    /// HF shape of the (joined) tensor.
    shape: Vec<usize>,
    format: QuantFormat,
    fix: Fix,
}

/// The GGUF format a part is written in.
fn out_format(t: &Tensor<'_>) -> anyhow::Result<QuantFormat> {
    Ok(match t.data {
        Data::F32(_) => QuantFormat::F32,
        Data::F16(_) => QuantFormat::F16,
        Data::FeatureMajor(s) => s.format(),
        // An interleaved layout (Q4_0x16) is written back as its ggml row format.
        Data::Blocks { format, .. } => format.row_format(),
        Data::SplitQ8 { scales, .. } => {
            if let Some((i, s)) = scales
                .iter()
                .enumerate()
                .find(|(_, s)| f16::from_f32(**s).to_f32().to_bits() != s.to_bits())
            {
                bail!(
                    "'{}': q8 scale {i} ({s:e}) is not an f16 value, so its blocks cannot be written as Q8_0 exactly (GGUF's Q8_0 stores f16 scales); export another tier with --tier",
                    t.key
                );
            }
            QuantFormat::Q8_0
        }
    })
}

/// The bytes of one part in `format`, in HF layout, `fix` applied.
fn part_bytes(t: &Tensor<'_>, fix: Fix) -> anyhow::Result<Vec<u8>> {
    let rows = t.shape.first().copied().unwrap_or(1);
    let permute_bytes = |b: Vec<u8>, heads: usize| -> anyhow::Result<Vec<u8>> {
        permute_qk_byte_rows(&b, rows, heads).map_err(|m| anyhow::anyhow!("'{}': {m}", t.key))
    };
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let f16_bytes = |v: &[f16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let floats_f32 = |mut v: Vec<f32>| -> anyhow::Result<Vec<u8>> {
        match fix {
            Fix::None => {}
            Fix::PlusOne => v.iter_mut().for_each(|x| *x += 1.0),
            Fix::Permute(h) => {
                v = permute_qk_rows(&v, rows, h).map_err(|m| anyhow::anyhow!("'{}': {m}", t.key))?
            }
        }
        Ok(f32_bytes(&v))
    };
    let floats_f16 = |v: Vec<f16>| -> anyhow::Result<Vec<u8>> {
        match fix {
            Fix::None => Ok(f16_bytes(&v)),
            Fix::Permute(h) => Ok(f16_bytes(
                &permute_qk_rows(&v, rows, h).map_err(|m| anyhow::anyhow!("'{}': {m}", t.key))?,
            )),
            Fix::PlusOne => bail!("'{}': a Gemma norm stored in f16", t.key),
        }
    };
    match t.data {
        Data::F32(v) => floats_f32(v.to_vec()),
        Data::F16(v) => floats_f16(v.to_vec()),
        Data::FeatureMajor(s) => {
            let (h, i) = (t.shape[0], t.shape[1]);
            match (s.as_f32(), s.as_f16()) {
                (Some(v), _) => floats_f32(transpose(v, i, h)),
                (_, Some(v)) => floats_f16(transpose(v, i, h)),
                _ => bail!("'{}': a feature-major matrix in blocks", t.key),
            }
        }
        Data::Blocks { format, bytes } => {
            let cols = t.shape.last().copied().unwrap_or(1);
            let plain = infer_quant::interleave::to_rows(format, bytes, rows, cols)
                .with_context(|| format!("'{}': un-laying {format}", t.key))?;
            match fix {
                Fix::None => Ok(plain.into_owned()),
                Fix::Permute(h) => permute_bytes(plain.into_owned(), h),
                Fix::PlusOne => bail!("'{}': a Gemma norm stored in blocks", t.key),
            }
        }
        Data::SplitQ8 { values, scales } => {
            let mut b = Vec::with_capacity(scales.len() * 34);
            for (s, q) in scales.iter().zip(values.chunks_exact(32)) {
                b.extend_from_slice(&f16::from_f32(*s).to_le_bytes());
                b.extend_from_slice(q);
            }
            match fix {
                Fix::None => Ok(b),
                Fix::Permute(h) => permute_bytes(b, h),
                Fix::PlusOne => bail!("'{}': a Gemma norm stored in q8", t.key),
            }
        }
    }
}

/// llama.cpp's `general.file_type` for the plan (`enum llama_ftype`; informational).
fn file_type(plan: &Plan, float: Option<Tier>) -> u32 {
    match (plan.ffn, plan.attn) {
        (Pick::Q4K, _) => 15, // MOSTLY_Q4_K_M
        (Pick::Q4, _) => 2,   // MOSTLY_Q4_0
        (_, Pick::Q8) => 7,   // MOSTLY_Q8_0
        _ if float == Some(Tier::F16) => 1,
        _ => 0,
    }
}

/// Group `tensors` into GGUF tensors with names, formats and fixes.
fn plan_outputs<'t, 'a>(
    cfg: &ModelConfig,
    arch: &dyn ModelArchitecture,
    fam: ExportFamily,
    tensors: &'t [Tensor<'a>],
) -> anyhow::Result<Vec<Out<'t, 'a>>> {
    let mut outs: Vec<Out> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = Default::default();
    let mut hf_names: Vec<String> = Vec::new();
    for t in tensors {
        let hf = arch.source_name(&t.key);
        let name = hf_to_gguf_name(fam.gguf_arch, &hf).with_context(|| {
            format!(
                "tensor '{}' (HF '{hf}') has no GGUF name for llama.cpp's '{}' architecture",
                t.key, fam.gguf_arch
            )
        })?;
        let fix = if fam.qk_permuted && hf.contains(".self_attn.q_proj.") {
            Fix::Permute(cfg.num_attention_heads)
        } else if fam.qk_permuted && hf.contains(".self_attn.k_proj.") {
            Fix::Permute(cfg.num_key_value_heads)
        } else if fam.norm_plus_one && name.ends_with("norm.weight") {
            Fix::PlusOne
        } else {
            Fix::None
        };
        let format = out_format(t)?;
        match index.get(&name) {
            Some(&i) => outs[i].parts.push(t),
            None => {
                index.insert(name.clone(), outs.len());
                hf_names.push(hf);
                outs.push(Out {
                    name,
                    parts: vec![t],
                    shape: t.shape.clone(),
                    format,
                    fix,
                });
            }
        }
    }
    let mut joined = Vec::with_capacity(outs.len());
    for (mut o, hf) in outs.into_iter().zip(&hf_names) {
        if o.parts.len() == 1 {
            joined.push(o);
            continue;
        }
        let (order, shape, t) = join_order(cfg, arch, hf, &o.parts)?;
        use infer_models::arch::{QkvLayout, TensorTransform as T};
        if !matches!(t, T::SplitGateUp | T::SplitQkv(QkvLayout::Concat)) {
            bail!("GGUF tensor '{}': cannot join {t:?} parts", o.name);
        }
        o.parts = order.into_iter().map(|i| o.parts[i]).collect();
        o.shape = shape;
        let formats: Vec<QuantFormat> = o
            .parts
            .iter()
            .map(|p| out_format(p))
            .collect::<anyhow::Result<_>>()?;
        if formats.iter().all(|f| *f == formats[0]) {
            o.format = formats[0];
            joined.push(o);
            continue;
        }
        // One GGUF tensor has one type: q, k and v stored in different types are written as
        // llama.cpp's separate attn_q / attn_k / attn_v (which its loaders accept in place of
        // attn_qkv); a fused gate/up has no such alternative.
        if !matches!(t, T::SplitQkv(_)) {
            bail!(
                "GGUF tensor '{}' joins {} stored as {}: one GGUF tensor has one type, and llama.cpp's '{}' needs it fused (export a float tier with --tier f32|f16)",
                o.name,
                o.parts.iter().map(|p| p.key.as_str()).collect::<Vec<_>>().join(", "),
                formats.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
                fam.gguf_arch
            );
        }
        for (p, f) in o.parts.iter().zip(formats) {
            let name = hf_to_gguf_name(fam.gguf_arch, &p.key)
                .with_context(|| format!("tensor '{}' has no separate GGUF name", p.key))?;
            joined.push(Out {
                name,
                parts: vec![*p],
                shape: p.shape.clone(),
                format: f,
                fix: o.fix,
            });
        }
    }
    Ok(joined)
}

/// Compare the configs field by field (numbers at f32 precision, as GGUF stores them) and
/// name the fields that differ, leaving out `ignore` and the fields that do not change the
/// forward pass.
fn config_differences(want: &ModelConfig, got: &ModelConfig, ignore: &[&str]) -> Vec<String> {
    fn eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value as V;
        match (a, b) {
            (V::Number(x), V::Number(y)) => match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => (x as f32).to_bits() == (y as f32).to_bits(),
                _ => x == y,
            },
            (V::Array(x), V::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| eq(a, b))
            }
            (V::Object(x), V::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| eq(a, b)))
            }
            _ => a == b,
        }
    }
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(want), serde_json::to_value(got))
    else {
        return vec!["the configs do not serialize".into()];
    };
    a.iter()
        .filter(|(k, _)| {
            !ignore.contains(&k.as_str()) && !ModelConfig::EXEMPT_FIELDS.contains(&k.as_str())
        })
        .filter(|(k, x)| !b.get(*k).is_some_and(|y| eq(x, y)))
        .map(|(k, x)| {
            format!(
                "{k}: {x} would be read as {}",
                b.get(k).unwrap_or(&serde_json::Value::Null)
            )
        })
        .collect()
}

/// Write `tensors` of `v` (resolved with `plan`) as a GGUF file at `out` (`shown` names the
/// final path in messages), then read it back with infer's GGUF reader and check that it gives
/// the vindex's config (what llama.cpp reads from the same keys); a difference fails the export.
///
/// Errors: a family or feature llama.cpp cannot run as the vindex does (see
/// [`model_metadata`]), a tokenizer with no GGUF form ([`tokenizer_metadata`]; `--no-tokenizer`
/// writes the `none` vocabulary), a fused tensor whose parts differ in type, a q8 scale that is
/// not an f16 value, I/O.
pub fn write(
    v: &Vindex,
    plan: &Plan,
    tensors: &[Tensor<'_>],
    no_tokenizer: bool,
    out: &Path,
    shown: &Path,
) -> anyhow::Result<Written> {
    let cfg = v.config();
    let vpath = v.path().display().to_string();
    let fam = export_family(&cfg.model_type);
    let mut md = model_metadata(cfg, &v.index().model_name)
        .map_err(|m| anyhow::anyhow!("{vpath}: cannot export to GGUF: {m}"))?;
    let fam = fam.context("export family")?;
    md.push((
        "general.file_type".into(),
        GgufValue::U32(file_type(plan, super::source::float_tier(v))),
    ));
    md.push(("general.quantization_version".into(), GgufValue::U32(2)));
    if no_tokenizer || !v.index().has_tokenizer {
        md.push((
            "tokenizer.ggml.model".into(),
            GgufValue::String("none".into()),
        ));
    } else {
        let json = v.tokenizer_json()?;
        md.extend(
            tokenizer_metadata(&json, cfg, v.chat_template()).map_err(|m| {
                anyhow::anyhow!(
                    "{vpath}: cannot export the tokenizer to GGUF: {m} (--no-tokenizer writes the weights without it)"
                )
            })?,
        );
    }

    let arch = infer_models::architecture_for(cfg).map_err(|m| anyhow::anyhow!("{vpath}: {m}"))?;
    let outs = plan_outputs(cfg, arch.as_ref(), fam, tensors)?;
    let align = DEFAULT_ALIGNMENT;
    let mut infos = Vec::with_capacity(outs.len());
    let mut offset = 0usize;
    for o in &outs {
        let n: usize = o.shape.iter().product();
        let n_bytes = o
            .format
            .bytes_for(n)
            .with_context(|| format!("'{}': {n} values in {}", o.name, o.format))?;
        infos.push(GgufTensorInfo {
            name: o.name.clone(),
            dims: o.shape.iter().rev().copied().collect(),
            format: o.format,
            offset,
            n_bytes,
        });
        offset += n_bytes.div_ceil(align) * align;
    }
    let header = GgufHeader {
        version: 3,
        metadata: md,
        tensors: infos,
        alignment: align,
    };
    let mut w = create_gguf(&header, out, shown)?;
    for o in &outs {
        for p in &o.parts {
            w.write_data(&part_bytes(p, o.fix)?)?;
        }
    }
    let bytes = finish_gguf(w, out)?;

    // Read it back as llama.cpp would read the keys: the same config, or no file.
    let g = GgufFile::open(out).with_context(|| format!("reading back {}", shown.display()))?;
    let back = config_from_gguf(&g)
        .with_context(|| format!("reading back the config of {}", shown.display()))?;
    let untied_copy = cfg.tie_word_embeddings && plan.lm_head != LmPick::Float;
    let ignore: &[&str] = if untied_copy {
        &["tie_word_embeddings"]
    } else {
        &[]
    };
    let diff = config_differences(cfg, &back, ignore);
    if !diff.is_empty() {
        bail!(
            "{vpath}: GGUF cannot hold this model's config as the vindex runs it: {}",
            diff.join("; ")
        );
    }
    Ok(Written {
        tensors: header.tensors.len(),
        bytes,
    })
}
