//! `infer synth`: a model file of a real model's shapes and formats with random weights, for
//! benchmarks where the real weights cannot be carried (e.g. to a remote GPU machine).
//!
//! - `--like MODEL.gguf -o OUT.gguf`: same GGUF header (metadata in order, tensor table) with
//!   random data quantized to each tensor's ggml type ([`gguf`]).
//! - `--like MODEL.gguf --header-only -o SKEL.gguf`: just the header, a few MB to carry;
//!   `--like SKEL.gguf` then gives the same bytes as `--like MODEL.gguf`.
//! - `--like config.json -o DIR`: a HF folder with random safetensors weights ([`hf`]).
//!
//! Output is staged beside the target and renamed into place ([`stage`]).

mod gguf;
mod hf;
mod random;
mod stage;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;

use hf::StDtype;

/// Arguments of `infer synth`.
#[derive(Args)]
pub struct SynthArgs {
    /// The model to imitate: a GGUF file (only its header is read; a header-only file works)
    /// or a HF `config.json`.
    #[arg(long, value_name = "MODEL.gguf|config.json")]
    pub like: PathBuf,
    /// Output: a GGUF file for `--like *.gguf`, a folder for `--like config.json`.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Seed of the random values (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Replace an existing output (a file for GGUF; for a folder only an empty one or one
    /// holding config.json).
    #[arg(long)]
    pub force: bool,
    /// GGUF only: write just the header (metadata and tensor table, no data).
    #[arg(long)]
    pub header_only: bool,
    /// config.json only: dtype of the safetensors weights, f32 or bf16 (default f32).
    #[arg(long)]
    pub dtype: Option<StDtype>,
}

/// What `--like` names.
enum Like {
    Gguf,
    HfConfig,
}

fn like_kind(p: &Path) -> anyhow::Result<Like> {
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "gguf" => Ok(Like::Gguf),
        "json" => Ok(Like::HfConfig),
        _ => bail!(
            "{}: unknown kind of --like file (expected a .gguf file or a HF config.json)",
            p.display()
        ),
    }
}

/// Run `infer synth`.
pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let kind = like_kind(&args.like)?;
    if !args.like.is_file() {
        bail!("{}: no such file", args.like.display());
    }
    let start = std::time::Instant::now();
    match kind {
        Like::Gguf => {
            if args.dtype.is_some() {
                bail!("--dtype applies to --like config.json only (GGUF tensors keep their types)");
            }
            synth_gguf(&args)?
        }
        Like::HfConfig => {
            if args.header_only {
                bail!("--header-only applies to --like *.gguf only");
            }
            synth_hf(&args)?
        }
    }
    eprintln!("in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

fn synth_gguf(args: &SynthArgs) -> anyhow::Result<()> {
    let header = gguf::read_header(&args.like)?;
    crate::cmd_vindex::install_interrupt_cleanup(&args.output);
    let staged = stage::Staged::new(&args.output, false, args.force)?;
    let written = if args.header_only {
        gguf::write_header_only(&header, staged.path(), &args.output)?
    } else {
        gguf::write_random(&args.like, &header, staged.path(), &args.output, args.seed)?
    };
    staged.commit()?;
    eprint!(
        "wrote {} ({}{} tensors, {:.1} MiB) ",
        args.output.display(),
        if args.header_only { "header of " } else { "" },
        written.tensors,
        written.bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}

fn synth_hf(args: &SynthArgs) -> anyhow::Result<()> {
    let config = infer_models::ModelConfig::from_hf_file(&args.like)
        .with_context(|| format!("reading {}", args.like.display()))?;
    let (tensors, arch) = hf::expected_tensors(&config, &args.like)?;
    let norm_centre = 1.0 - arch.norm_weight_offset();
    crate::cmd_vindex::install_interrupt_cleanup(&args.output);
    let staged = stage::Staged::new(&args.output, true, args.force)?;
    let dir = staged.path();
    std::fs::copy(&args.like, dir.join("config.json"))
        .with_context(|| format!("copying {}", args.like.display()))?;
    let src_dir = args.like.parent().unwrap_or(Path::new("."));
    let mut copied = Vec::new();
    for name in hf::COPIED_FILES {
        let src = src_dir.join(name);
        if src.is_file() {
            std::fs::copy(&src, dir.join(name))
                .with_context(|| format!("copying {}", src.display()))?;
            copied.push(*name);
        }
    }
    let dtype = args.dtype.unwrap_or(StDtype::F32);
    let bytes = hf::write_safetensors(
        &tensors,
        norm_centre,
        dtype,
        args.seed,
        &dir.join("model.safetensors"),
    )?;
    staged.commit()?;
    eprint!(
        "wrote {} ({} {} tensors, {:.1} MiB; copied config.json{}) ",
        args.output.display(),
        tensors.len(),
        format!("{dtype:?}").to_lowercase(),
        bytes as f64 / (1 << 20) as f64,
        copied.iter().map(|n| format!(", {n}")).collect::<String>()
    );
    Ok(())
}
