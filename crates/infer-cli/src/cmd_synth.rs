//! `infer synth`: a model file of a real model's shapes and formats with random weights, for
//! benchmarks where the real weights cannot be carried (e.g. to a remote GPU machine).
//!
//! - `--like MODEL.gguf -o OUT.gguf`: same GGUF header (metadata in order, tensor table) with
//!   random data quantized to each tensor's ggml type ([`gguf`]).
//! - `--like MODEL.gguf --header-only -o SKEL.gguf`: just the header, a few MB to carry;
//!   `--like SKEL.gguf` then gives the same bytes as `--like MODEL.gguf`.
//! - `--like config.json -o DIR` (or `--like HF_DIR`): a HF folder with random safetensors
//!   weights ([`hf`]).
//! - `--like config.json --gguf Q4_K_M|Q4_0|Q8_0|F16 [--vocab VOCAB.gguf] -o OUT.gguf`: the
//!   GGUF llama.cpp's converter and `llama-quantize` would write for that config (tensor names,
//!   metadata, the preset's type mix, a real tokenizer from a vocabulary-only GGUF;
//!   [`gguf_like`]), with random data streamed as for a GGUF `--like`.
//! - `--random-blocks` (either GGUF output): every quantized matrix's blocks are drawn directly
//!   — uniform random quants under fixed per-format scales, standard deviation 0.02 like the
//!   default's normal values but uniform-ish ([`blocks`]) — instead of quantizing drawn values
//!   with ggml's reference quantizers, so the file is written at about disk speed (a 70 B
//!   Q4_K_M in minutes, not the tens of minutes quantizing takes). Different bytes from the
//!   default; still deterministic in `--seed`; 1-D and float tensors are made as by default.
//!
//! The kind of `--like` is recognised by content ([`like`]). Before anything is written the
//! output's directory must exist, the sizes must be sane ([`limits`], llama.cpp's tensor
//! offsets) and the output must fit in the free space of its filesystem ([`space`]). Output is
//! staged beside the target and moved into place ([`stage`]). A GGUF output never replaces an
//! existing path, `--force` or not; `--force` replaces only an empty or synth-written folder (HF).

mod blocks;
mod gguf;
pub(crate) use gguf::{create_gguf, finish_gguf};
mod gguf_like;
mod hf;
mod like;
mod limits;
mod random;
pub(crate) mod space;
pub(crate) mod stage;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;

use blocks::BlockMode;
use hf::StDtype;
use like::Like;

/// Arguments of `infer synth`.
#[derive(Args)]
pub struct SynthArgs {
    /// The model to imitate, recognised by content: a GGUF file (starts with the magic "GGUF";
    /// only its header is read, a header-only file works), a HF folder holding config.json, or
    /// a HF config.json (*.json).
    #[arg(long, value_name = "MODEL.gguf|HF_DIR|config.json")]
    pub like: PathBuf,
    /// Output: a GGUF file for a GGUF --like, a folder for a HF --like.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Seed of the random values (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// HF only: replace an existing output folder, only when it is empty or was written by
    /// synth (holds its `.infer-synth` marker). A GGUF output file is never replaced, even with
    /// --force: remove it first.
    #[arg(long)]
    pub force: bool,
    /// GGUF only: write just the header (metadata and tensor table, no data).
    #[arg(long)]
    pub header_only: bool,
    /// HF only: dtype of the safetensors weights, f32 or bf16 (default f32).
    #[arg(long)]
    pub dtype: Option<StDtype>,
    /// With a config --like: write a GGUF in this llama-quantize preset instead of a HF
    /// folder (Q4_K_M, Q4_0, Q8_0 or F16; llama.cpp's tensor names, metadata and type mix).
    #[arg(long, value_name = "PRESET", value_parser = parse_preset)]
    pub gguf: Option<gguf_like::Preset>,
    /// With --gguf: a vocabulary-only GGUF (llama.cpp's models/ggml-vocab-*.gguf, see
    /// scripts/fetch-vocabs.sh, or any GGUF's header-only copy) whose tokenizer.* metadata the
    /// output carries; at most the config's vocab_size tokens, padded up to it with `[PAD{id}]`
    /// tokens (type UNUSED) as llama.cpp's convert_hf_to_gguf.py pads.
    #[arg(long, value_name = "VOCAB.gguf", requires = "gguf")]
    pub vocab: Option<PathBuf>,
    /// GGUF output with data only: draw every quantized matrix's blocks directly (uniform
    /// random quants under fixed per-format scales; values uniform-ish with the default's
    /// standard deviation 0.02) instead of quantizing normal values with ggml's quantizers:
    /// about disk speed, for models too big to quantize in time. Other bytes than without it,
    /// same header; deterministic in --seed; 1-D and float tensors as without it.
    #[arg(long)]
    pub random_blocks: bool,
}

fn parse_preset(s: &str) -> Result<gguf_like::Preset, String> {
    s.parse()
}

impl SynthArgs {
    /// How quantized matrices get their blocks (`--random-blocks`).
    fn block_mode(&self) -> BlockMode {
        if self.random_blocks {
            BlockMode::Draw
        } else {
            BlockMode::Quantize
        }
    }
}

/// Run `infer synth`.
pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let kind = like::recognise(&args.like)?;
    space::check_output_dir(&args.output)?;
    let start = std::time::Instant::now();
    if args.random_blocks && args.header_only {
        bail!("--random-blocks applies to a GGUF output with data; --header-only writes none");
    }
    match kind {
        Like::Gguf(_) if args.gguf.is_some() => {
            bail!("--gguf applies to a config --like (a GGUF --like keeps its own types)")
        }
        Like::Gguf(like) => {
            if args.dtype.is_some() {
                bail!("--dtype applies to a HF --like (config.json or folder) only (GGUF tensors keep their types)");
            }
            synth_gguf(&args, &like)?
        }
        Like::HfConfig(config) if args.gguf.is_some() => {
            if args.dtype.is_some() {
                bail!("--dtype applies to a HF folder output; --gguf sets the types by preset");
            }
            synth_gguf_from_config(&args, &config)?
        }
        Like::HfConfig(config) => {
            if args.header_only {
                bail!("--header-only applies to a GGUF --like only");
            }
            if args.random_blocks {
                bail!("--random-blocks applies to a GGUF output (a GGUF --like, or --gguf); a HF folder holds float weights");
            }
            synth_hf(&args, &config)?
        }
    }
    eprintln!("in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The note of a GGUF written with `--random-blocks`, for the closing message.
fn drawn_note(args: &SynthArgs) -> &'static str {
    match args.block_mode() {
        BlockMode::Draw => ", quantized blocks drawn",
        BlockMode::Quantize => "",
    }
}

/// `b` is the existing file or directory `a`, or (with `inside`) lies inside `a`.
pub(crate) fn same_or_inside(a: &Path, b: &Path, inside: bool) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b || (inside && b.starts_with(a)),
        _ => false,
    }
}

/// Write `header` (and, unless --header-only, random data streamed after it) to `-o`: the
/// planned size checked against the free space first, staged beside the target and moved into
/// place only when complete (removed on an interrupt). `like` names the source in messages.
fn write_staged(
    args: &SynthArgs,
    like: &Path,
    header: &infer_models::gguf::GgufHeader,
) -> anyhow::Result<gguf::Written> {
    let need = gguf::planned_size(like, header, args.header_only)?;
    space::check_fits(&args.output, need, &like.display().to_string())?;
    crate::cmd_vindex::install_interrupt_cleanup(&args.output);
    let staged = stage::Staged::new(&args.output, false, args.force)?;
    let written = if args.header_only {
        gguf::write_header_only(header, staged.path(), &args.output)?
    } else {
        gguf::write_random(
            like,
            header,
            staged.path(),
            &args.output,
            args.seed,
            args.block_mode(),
        )?
    };
    staged.commit()?;
    Ok(written)
}

fn synth_gguf(args: &SynthArgs, like: &Path) -> anyhow::Result<()> {
    if same_or_inside(&args.output, like, false) {
        bail!(
            "-o {} is the --like file {} itself; refusing to overwrite the model",
            args.output.display(),
            like.display()
        );
    }
    stage::check_target(&args.output, false, args.force)?;
    let header = gguf::read_header(like)?;
    let written = write_staged(args, like, &header)?;
    eprint!(
        "wrote {} ({}{} tensors, {:.1} MiB{}) ",
        args.output.display(),
        if args.header_only { "header of " } else { "" },
        written.tensors,
        written.bytes as f64 / (1 << 20) as f64,
        drawn_note(args)
    );
    Ok(())
}

/// `--like config.json --gguf PRESET`: build the GGUF header the config implies, then write it
/// (header only, or with streamed random data) as [`synth_gguf`] does.
fn synth_gguf_from_config(args: &SynthArgs, like: &Path) -> anyhow::Result<()> {
    let preset = args.gguf.context("--gguf")?;
    stage::check_target(&args.output, false, args.force)?;
    limits::check_config_sizes(like)?;
    let config = infer_models::ModelConfig::from_hf_file(like)
        .with_context(|| format!("reading {}", like.display()))?;
    let vocab = match &args.vocab {
        Some(p) => Some((p.as_path(), gguf::read_header(p)?)),
        None => None,
    };
    let header = gguf_like::header(&config, preset, vocab.as_ref().map(|(p, h)| (*p, h)), like)?;
    let written = write_staged(args, like, &header)?;
    eprint!(
        "wrote {} ({:?} GGUF, {}{} tensors, {:.1} MiB{}{}) ",
        args.output.display(),
        preset,
        if args.header_only { "header of " } else { "" },
        written.tensors,
        written.bytes as f64 / (1 << 20) as f64,
        drawn_note(args),
        if vocab.is_some() {
            ", tokenizer from --vocab"
        } else {
            ", no tokenizer: extract with --no-tokenizer"
        }
    );
    Ok(())
}

fn synth_hf(args: &SynthArgs, like: &Path) -> anyhow::Result<()> {
    let src_dir = space::output_dir(like);
    if same_or_inside(&args.output, &src_dir, true) {
        bail!(
            "-o {} is (or holds) the folder of the --like config {}; refusing to replace it",
            args.output.display(),
            like.display()
        );
    }
    stage::check_target(&args.output, true, args.force)?;
    limits::check_config_sizes(like)?;
    let config = infer_models::ModelConfig::from_hf_file(like)
        .with_context(|| format!("reading {}", like.display()))?;
    let (tensors, arch) = hf::expected_tensors(&config, like)?;
    let norm_centre = 1.0 - arch.norm_weight_offset();
    let dtype = args.dtype.unwrap_or(StDtype::F32);
    let (head, data_len) = hf::safetensors_header(&tensors, dtype, like)?;
    let copies: Vec<(PathBuf, &str)> = std::iter::once((like.to_path_buf(), "config.json"))
        .chain(
            hf::COPIED_FILES
                .iter()
                .map(|n| (src_dir.join(n), *n))
                .filter(|(p, _)| p.is_file()),
        )
        .collect();
    let copied_len: u64 = copies
        .iter()
        .map(|(p, _)| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let need = (8 + head.len() as u64)
        .saturating_add(data_len)
        .saturating_add(copied_len);
    space::check_fits(&args.output, need, &like.display().to_string())?;
    crate::cmd_vindex::install_interrupt_cleanup(&args.output);
    let staged = stage::Staged::new(&args.output, true, args.force)?;
    let dir = staged.path();
    for (src, name) in &copies {
        std::fs::copy(src, dir.join(name)).with_context(|| format!("copying {}", src.display()))?;
    }
    let bytes = hf::write_safetensors(
        &tensors,
        &head,
        norm_centre,
        dtype,
        args.seed,
        &dir.join("model.safetensors"),
    )?;
    staged.commit()?;
    eprint!(
        "wrote {} ({} {} tensors, {:.1} MiB; copied {}) ",
        args.output.display(),
        tensors.len(),
        format!("{dtype:?}").to_lowercase(),
        bytes as f64 / (1 << 20) as f64,
        copies
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
