//! `infer inspect`: architecture, config and tensor table of a checkpoint or vindex.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use infer_models::{architecture_for, open_source};

/// Arguments of `infer inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// HF folder, GGUF file, or vindex directory.
    pub path: PathBuf,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let path = &args.path;
    if path.join("index.json").is_file() {
        let v = infer_vindex::Vindex::open(path)
            .with_context(|| format!("opening vindex {}", path.display()))?;
        let mut out = infer_vindex::describe(&v);
        if let Ok(arch) = architecture_for(v.config()) {
            out.push_str("per-layer plan:\n");
            out.push_str(&infer_inference::model::layer_plan(arch.as_ref()));
        }
        crate::print_stdout(&out);
        return Ok(());
    }
    let src = open_source(path)?;
    let mut out = String::new();
    let c = &src.config;
    let arch = architecture_for(c).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    writeln!(out, "source:        {} ({:?})", path.display(), src.kind)?;
    writeln!(out, "architecture:  {}", c.model_type)?;
    writeln!(out, "layers:        {}", c.num_hidden_layers)?;
    writeln!(out, "hidden_size:   {}", c.hidden_size)?;
    writeln!(out, "intermediate:  {}", c.intermediate_size)?;
    writeln!(
        out,
        "heads:         {} (KV heads {}, head_dim {})",
        c.num_attention_heads, c.num_key_value_heads, c.head_dim
    )?;
    writeln!(out, "vocab:         {}", c.vocab_size)?;
    writeln!(out, "norm eps:      {}", c.norm_eps)?;
    write!(out, "rope:          base {}", c.rope_theta)?;
    if let Some(local) = c.rope_local_theta {
        write!(out, ", local base {local}")?;
    }
    if let Some(s) = &c.rope_scaling {
        write!(out, ", scaling {s:?}")?;
    }
    if c.partial_rotary_factor != 1.0 {
        write!(out, ", partial rotary {}", c.partial_rotary_factor)?;
    }
    writeln!(out)?;
    if let Some(w) = c.sliding_window {
        let sliding: Vec<String> = (0..arch.num_layers())
            .filter(|&l| arch.sliding_window_for_layer(l).is_some())
            .map(|l| l.to_string())
            .collect();
        writeln!(
            out,
            "sliding:       window {w} on layers [{}]",
            sliding.join(", ")
        )?;
    }
    writeln!(out, "tied embeddings: {}", c.tie_word_embeddings)?;
    writeln!(out, "per-layer plan:")?;
    out.push_str(&infer_inference::model::layer_plan(arch.as_ref()));
    writeln!(out, "config:        {}", serde_json::to_string(c)?)?;
    let tensors = src.tensors.tensors();
    let total: usize = tensors.iter().map(|t| t.bytes).sum();
    writeln!(
        out,
        "\n{} tensors, {:.1} MB",
        tensors.len(),
        total as f64 / 1e6
    )?;
    writeln!(
        out,
        "{:<60} {:<20} {:<6} {:>12}",
        "name", "shape", "dtype", "bytes"
    )?;
    for t in tensors {
        writeln!(
            out,
            "{:<60} {:<20} {:<6} {:>12}",
            t.name,
            format!("{:?}", t.shape),
            t.dtype.name(),
            t.bytes
        )?;
    }
    crate::print_stdout(&out);
    Ok(())
}
