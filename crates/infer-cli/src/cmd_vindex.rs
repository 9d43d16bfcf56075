//! `infer extract` and `infer verify` (vindex build and integrity check).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use infer_vindex::{BuildOptions, Dtype, QuantTiers};

/// Arguments of `infer extract`.
#[derive(Args)]
pub struct ExtractArgs {
    /// HF folder (config.json + safetensors) or GGUF file.
    pub source: PathBuf,
    /// Output directory, conventionally NAME.vindex.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The float tier: none (default when the quantized tiers hold every matrix: q4k, or q8
    /// and q4 together, so a Q4_K_M GGUF gives a vindex of about its own size), f32 (exact;
    /// the default otherwise, e.g. with --quant none) or f16 (half the size of f32). Without a
    /// float tier the embeddings are stored quantized (a GGUF's own token_embd blocks, byte
    /// for byte) and norms, biases and routers in f32.
    #[arg(long, value_parser = parse_float)]
    pub float: Option<FloatTier>,
    /// Same as --float f32|f16 (its older name, kept for older scripts).
    #[arg(long, value_name = "f32|f16", value_parser = parse_dtype, conflicts_with = "float")]
    pub dtype: Option<Dtype>,
    /// Replace an existing output directory (only once the new vindex is complete). Only a
    /// vindex (a directory with index.json) or an empty directory is replaced; a file or any
    /// other directory is refused, so user data is never deleted.
    #[arg(long)]
    pub force: bool,
    /// A tokenizer.json to store (wins over the source's own tokenizer).
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Build a weights-only vindex: store no tokenizer.json, tokenizer_config.json or
    /// chat_template.jinja, even when the source has them (without this flag a source with no
    /// usable tokenizer is an error). Such a vindex runs on token ids only.
    #[arg(long, conflicts_with = "tokenizer")]
    pub no_tokenizer: bool,
    /// Quantized tiers to write besides the float tier: q4k (Q4_K attention + interleaved Q4_K
    /// FFN; V and FFN down in Q6_K), q8 (int8 attention + f32 scales), q4 (Q4_0 FFN, gate
    /// vectors, lm_head), all, none, or a comma list. K-quants fall back to Q5_0/Q8_0 for rows
    /// that are not a multiple of 256 values, and to F16 for rows not a multiple of 32.
    #[arg(long, default_value = "q4k", value_parser = parse_quant)]
    pub quant: QuantTiers,
    /// Store FFN down in Q4_K instead of Q6_K in interleaved_q4k.bin.
    #[arg(long)]
    pub down_q4k: bool,
    /// Store the q4 tier's FFN and lm_head as Q4_0x16: the Q4_0 blocks re-laid sixteen rows
    /// per group for the CPU's int8 kernels (the same bytes and outputs; a GGUF's Q4_0 blocks
    /// pass through re-laid). The CUDA backend refuses it; `infer export` writes Q4_0 back.
    #[arg(long)]
    pub q4_x16: bool,
    /// Dequantize and requantize GGUF tensors even when they already have the target format
    /// (default: copy their blocks unchanged).
    #[arg(long)]
    pub requantize: bool,
    /// Also store down_meta.bin: for every FFN feature, the N tokens its down vector writes
    /// most (projected through lm_head or the tied embeddings), for `infer walk`. N defaults
    /// to 10, at most 1000 (the file holds 2·N records of 8 bytes per feature).
    /// Costs one [features × hidden] · [hidden × vocab] product per layer.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "10",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub down_meta: Option<u32>,
}

fn parse_quant(s: &str) -> Result<QuantTiers, String> {
    s.parse()
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    s.parse()
}

/// `--float`: a float tier of this dtype, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatTier {
    Dtype(Dtype),
    None,
}

fn parse_float(s: &str) -> Result<FloatTier, String> {
    match s.to_ascii_lowercase().as_str() {
        "none" => Ok(FloatTier::None),
        other => other
            .parse()
            .map(FloatTier::Dtype)
            .map_err(|_| format!("unknown float tier '{s}' (expected f32, f16 or none)")),
    }
}

impl ExtractArgs {
    /// The float tier to write: as asked, else none when the quantized tiers hold every
    /// matrix (q4k, or q8 with q4), else f32.
    fn float_tier(&self) -> FloatTier {
        match (self.float, self.dtype) {
            (Some(f), _) => f,
            (None, Some(d)) => FloatTier::Dtype(d),
            (None, None) => {
                let q = self.quant;
                let complete = q.q4k || (q.q8 && q.q4);
                if complete && self.down_meta.is_none() {
                    FloatTier::None
                } else {
                    FloatTier::Dtype(Dtype::F32)
                }
            }
        }
    }
}

/// Arguments of `infer verify`.
#[derive(Args)]
pub struct VerifyArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
}

/// Build a vindex from a checkpoint (streamed layer by layer into a temp directory beside the
/// output, renamed into place when complete). Ctrl-C removes the temp directory.
pub fn extract(args: ExtractArgs) -> anyhow::Result<()> {
    install_interrupt_cleanup(&args.output);
    let float = args.float_tier();
    let opts = BuildOptions {
        dtype: match float {
            FloatTier::Dtype(d) => d,
            FloatTier::None => Dtype::F32,
        },
        float_tier: float != FloatTier::None,
        force: args.force,
        tokenizer: args.tokenizer.clone(),
        allow_no_tokenizer: args.no_tokenizer,
        skip_tokenizer: args.no_tokenizer,
        progress: true,
        quant: args.quant,
        down_q4k: args.down_q4k,
        q4_x16: args.q4_x16,
        requantize: args.requantize,
        down_meta: args.down_meta.map(|n| n as usize),
    };
    let start = std::time::Instant::now();
    let index = infer_vindex::extract(&args.source, &args.output, &opts).with_context(|| {
        format!(
            "extract {} → {}",
            args.source.display(),
            args.output.display()
        )
    })?;
    let bytes: u64 = index.files.iter().map(|f| f.bytes).sum();
    eprintln!(
        "wrote {} ({}, tiers {}, {} passthrough tensors, {} layers, {} files, {:.1} MiB) in {:.1} s",
        args.output.display(),
        index.model_type,
        index.tiers.join("+"),
        index.passthrough.len(),
        index.shapes.num_layers,
        index.files.len() + 1,
        bytes as f64 / (1 << 20) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// On Ctrl-C or SIGTERM, remove this process's temp build directory (or file: `infer synth`,
/// `infer export`, `logits --out` and `perplexity --kl-divergence-base` stage their output under
/// the same name, `.NAME.tmp-PID`) and say so before exiting with `128 + signal` (a SIGKILL
/// leaves it; the next build of the same target removes it).
pub(crate) fn install_interrupt_cleanup(target: &std::path::Path) {
    let Some(name) = target.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = parent.join(infer_vindex::files::temp_dir_name(name, std::process::id()));
    crate::signals::set_handler(move || {
        // The build goes on while this runs: move the directory out of its way first (the
        // builder then fails to create anything more there by path, and a concurrent commit
        // either happened already or fails), so that removing it cannot race new files.
        let mut away = tmp.clone().into_os_string();
        away.push(".removing");
        let victim = match std::fs::rename(&tmp, &away) {
            Ok(()) => PathBuf::from(away),
            Err(_) => tmp.clone(),
        };
        let _ = std::fs::remove_dir_all(&victim).or_else(|_| std::fs::remove_file(&victim));
        eprintln!("interrupted; removed {}", tmp.display());
        std::process::exit(crate::signals::exit_code());
    });
}

/// Re-hash every file of a vindex; fails (non-zero exit) on a changed index.json, or any
/// changed, missing or unlisted file, naming them.
pub fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let report = infer_vindex::verify(&args.vindex)?;
    println!("{report}");
    if !report.is_ok() {
        anyhow::bail!(
            "{}: {} problem(s): {}",
            args.vindex.display(),
            report.problems(),
            report.summary()
        );
    }
    Ok(())
}
