//! `infer export`: a vindex back to a file other engines run.
//!
//! - `infer export VINDEX -o MODEL.gguf [--tier q4k|q8|q4|f16|f32]`: a GGUF llama.cpp loads
//!   ([`gguf`]), with the stored quantized blocks copied byte for byte.
//! - `infer export VINDEX -o DIR --safetensors`: a Hugging Face folder ([`hf`]) that
//!   `infer extract` reads back bit for bit on the float tier.
//!
//! Which stored copy of each matrix is written is [`source::plan`] (by default what `infer run`
//! runs). The output is written to `.NAME.tmp-PID` beside the target and renamed into place
//! when complete (removed on error, Ctrl-C or SIGTERM), as `infer extract` and `infer synth`
//! do; an existing output path is never replaced.

mod gguf;
mod hf;
mod source;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use infer_models::arch::TensorTransform;
use infer_models::{ModelArchitecture, ModelConfig};
use infer_vindex::Vindex;

use crate::cmd_synth::{space, stage};
use source::{Data, Tensor, TierArg};

/// The command name in messages and staging.
const TOOL: &str = "infer export";

/// Arguments of `infer export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// Output: a GGUF file, or with --safetensors a folder. Must not exist.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Which stored copy of the matrices to write: q4k (Q4_K/Q6_K with their fallbacks), q8
    /// (attention as Q8_0), q4 (FFN and output as Q4_0), f16 or f32 (the float tier; it must be
    /// the vindex's own dtype). Default: what `infer run` runs (q4k, then q8 / q4, then the
    /// float tier); with --safetensors the float tier when there is one. Matrices of a tier that
    /// does not hold them (q8: the FFN; q4: attention) come as by default.
    #[arg(long, value_parser = parse_tier)]
    pub tier: Option<TierArg>,
    /// Write a Hugging Face folder (config.json, safetensors, tokenizer files) instead of GGUF.
    #[arg(long)]
    pub safetensors: bool,
    /// With --safetensors: the largest shard in bytes; above it the weights are split into
    /// model-0000N-of-0000M.safetensors with model.safetensors.index.json (transformers'
    /// layout). Default 5000000000 (transformers' "5GB").
    #[arg(long, value_name = "BYTES", requires = "safetensors",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub shard_size: Option<u64>,
    /// Leave the tokenizer out: a GGUF gets llama.cpp's `none` vocabulary, a folder no
    /// tokenizer files (for a vindex whose tokenizer has no GGUF form).
    #[arg(long)]
    pub no_tokenizer: bool,
}

fn parse_tier(s: &str) -> Result<TierArg, String> {
    s.parse()
}

/// What an export wrote.
pub struct Written {
    /// Tensors in the output (a fused projection counts once).
    pub tensors: usize,
    /// Bytes of the weight files.
    pub bytes: u64,
}

/// The order in which `parts` (canonical tensors that share the HF tensor `hf_name`) join
/// into it, the HF tensor's shape and the family's transform: the parts sorted as the
/// family's extract splits the HF tensor ([`infer_vindex::transform::plan_outputs`] of the
/// joined shape), each checked to be exactly the key and shape extract would give. A lone
/// part of an untransformed tensor is its own HF tensor.
///
/// Errors: parts that are not exactly what the HF tensor splits into (a missing q/k/v part,
/// a key the family's names do not give back).
pub(crate) fn join_order(
    cfg: &ModelConfig,
    arch: &dyn ModelArchitecture,
    hf_name: &str,
    parts: &[&Tensor<'_>],
) -> anyhow::Result<(Vec<usize>, Vec<usize>, TensorTransform)> {
    let t = arch.source_transform(hf_name);
    let canonical = arch
        .canonical_name(hf_name)
        .with_context(|| format!("HF tensor '{hf_name}' has no canonical name"))?;
    let first = &parts[0].shape;
    let rows: usize = parts
        .iter()
        .map(|p| p.shape.first().copied().unwrap_or(0))
        .sum();
    use infer_models::arch::QkvLayout;
    let shape = match (t, first.as_slice()) {
        (TensorTransform::AsIs, _) => first.clone(),
        (TensorTransform::Transpose, [r, c]) => vec![*c, *r],
        (TensorTransform::Transpose, _) => first.clone(),
        (TensorTransform::SplitQkv(QkvLayout::Conv1dConcat), [_, c]) => vec![*c, rows],
        (TensorTransform::SplitQkv(_) | TensorTransform::SplitGateUp, _) => {
            let mut s = first.clone();
            if let Some(r) = s.first_mut() {
                *r = rows;
            }
            s
        }
        // gpt-oss fused experts, from one expert's part (the inverse of the split's shapes).
        (TensorTransform::SplitExperts(part), _) => {
            use infer_models::arch::ExpertsPart;
            let e = cfg.num_experts;
            match (part, first.as_slice()) {
                (ExpertsPart::GateUp, [i, h]) => vec![e, *h, 2 * i],
                (ExpertsPart::GateUpBias, [i]) => vec![e, 2 * i],
                (ExpertsPart::Down, [h, i]) => vec![e, *i, *h],
                (ExpertsPart::DownBias, [h]) => vec![e, *h],
                // Stacked experts are a GGUF layout, never an HF tensor `source_name` gives.
                _ => bail!("HF tensor '{hf_name}': expert part of shape {first:?} ({part:?})"),
            }
        }
    };
    let specs = infer_vindex::transform::plan_outputs(cfg, &canonical, &shape, t)
        .map_err(|m| anyhow::anyhow!("HF tensor '{hf_name}': {m}"))?;
    let keys = || {
        parts
            .iter()
            .map(|p| format!("{} {:?}", p.key, p.shape))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if specs.len() != parts.len() {
        bail!(
            "HF tensor '{hf_name}' is made of {} tensors, but the vindex has {}: {}",
            specs.len(),
            parts.len(),
            keys()
        );
    }
    let mut order = Vec::with_capacity(parts.len());
    for s in &specs {
        let i = parts
            .iter()
            .position(|p| p.key == s.key && p.shape == s.shape)
            .with_context(|| {
                format!(
                    "HF tensor '{hf_name}' needs '{}' {:?}; the vindex has {}",
                    s.key,
                    s.shape,
                    keys()
                )
            })?;
        order.push(i);
    }
    Ok((order, shape, t))
}

/// Bytes a tensor takes in a GGUF export (its stored encoding; q8 as Q8_0).
fn gguf_bytes(t: &Tensor<'_>) -> u64 {
    let n: u64 = t.shape.iter().product::<usize>() as u64;
    match t.data {
        Data::F32(_) => 4 * n,
        Data::F16(_) => 2 * n,
        Data::FeatureMajor(s) => n * if s.as_f16().is_some() { 2 } else { 4 },
        Data::Blocks { bytes, .. } => bytes.len() as u64,
        Data::SplitQ8 { .. } => n / 32 * 34,
    }
}

/// Refuse an output inside the vindex directory (it would add files the vindex does not list).
fn check_not_inside(vindex: &Path, output: &Path) -> anyhow::Result<()> {
    let dir = space::output_dir(output);
    if let (Ok(v), Ok(d)) = (std::fs::canonicalize(vindex), std::fs::canonicalize(&dir)) {
        if d.starts_with(&v) {
            bail!(
                "-o {} lies inside the vindex {}; write the export elsewhere",
                output.display(),
                vindex.display()
            );
        }
    }
    Ok(())
}

/// Run `infer export`.
pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let v = Vindex::open(&args.vindex)
        .with_context(|| format!("opening vindex {}", args.vindex.display()))?;
    space::check_output_dir(&args.output)?;
    check_not_inside(&args.vindex, &args.output)?;
    stage::check_target_as(TOOL, &args.output, args.safetensors, false)?;
    let plan = source::plan(&v, args.tier, args.safetensors)?;
    let tensors = source::resolve(&v, &plan)?;
    let need = if args.safetensors {
        hf::planned_size(&tensors)
    } else {
        tensors.iter().map(gguf_bytes).sum()
    };
    space::check_fits(&args.output, need, &args.vindex.display().to_string())?;
    crate::cmd_vindex::install_interrupt_cleanup(&args.output);
    let staged = stage::Staged::new_for(TOOL, &args.output, args.safetensors, false)?;
    let written = if args.safetensors {
        let shard = args.shard_size.unwrap_or(hf::DEFAULT_SHARD_BYTES);
        hf::write(&v, &tensors, args.no_tokenizer, shard, staged.path())?
    } else {
        gguf::write(
            &v,
            &plan,
            &tensors,
            args.no_tokenizer,
            staged.path(),
            &args.output,
        )?
    };
    staged.commit()?;
    eprintln!(
        "wrote {} ({}, {} tensors, {:.1} MiB; {}) in {:.1} s",
        args.output.display(),
        if args.safetensors {
            "Hugging Face folder"
        } else {
            "GGUF"
        },
        written.tensors,
        written.bytes as f64 / (1 << 20) as f64,
        plan.describe(&v, &tensors),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
