//! `infer inspect`: architecture, config and tensor table of a checkpoint or vindex.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use infer_models::gguf::{GgufFile, GgufHeader, GgufValue};
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
    if let Some(text) = header_only_gguf(path)? {
        crate::print_stdout(&text);
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
    if let Some(s) = c.logit_scale {
        writeln!(out, "logit scale:   {s}")?;
    }
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

/// A GGUF whose header reads but whose tensor data is absent or cut short (`infer synth
/// --header-only` writes such skeletons): its header, metadata and tensor table. `None` for
/// anything else (a whole GGUF, a HF folder, a file that is not a GGUF at all).
fn header_only_gguf(path: &std::path::Path) -> anyhow::Result<Option<String>> {
    if !path.is_file() {
        return Ok(None);
    }
    if GgufFile::open(path).is_ok() {
        return Ok(None);
    }
    let Ok(h) = GgufHeader::read(path) else {
        return Ok(None);
    };
    let mut out = String::new();
    writeln!(
        out,
        "source:        {} (GGUF header only: the tensor data is absent or cut short)",
        path.display()
    )?;
    writeln!(out, "version:       {}", h.version)?;
    writeln!(out, "alignment:     {}", h.alignment)?;
    writeln!(out, "tensor data:   {} bytes needed", h.data_len())?;
    writeln!(out, "\n{} metadata entries", h.metadata.len())?;
    for (k, v) in &h.metadata {
        writeln!(out, "{k:<48} {:<7} {}", v.type_name(), value_text(v))?;
    }
    let total: usize = h.tensors.iter().map(|t| t.n_bytes).sum();
    writeln!(
        out,
        "\n{} tensors, {:.1} MB",
        h.tensors.len(),
        total as f64 / 1e6
    )?;
    writeln!(
        out,
        "{:<60} {:<20} {:<6} {:>12}",
        "name", "shape", "format", "bytes"
    )?;
    for t in &h.tensors {
        writeln!(
            out,
            "{:<60} {:<20} {:<6} {:>12}",
            t.name,
            format!("{:?}", t.hf_shape()),
            t.format.to_string(),
            t.n_bytes
        )?;
    }
    Ok(Some(out))
}

/// A metadata value on one line: scalars as they are, strings cut at 60 characters, arrays
/// as their length.
fn value_text(v: &GgufValue) -> String {
    match v {
        GgufValue::String(s) if s.chars().count() > 60 => {
            format!("{:?}…", s.chars().take(60).collect::<String>())
        }
        GgufValue::String(s) => format!("{s:?}"),
        GgufValue::Array(a) => format!("[{} items]", a.len()),
        GgufValue::F32(x) => x.to_string(),
        GgufValue::F64(x) => x.to_string(),
        GgufValue::Bool(b) => b.to_string(),
        other => other
            .as_i64()
            .map(|i| i.to_string())
            .or_else(|| other.as_u64().map(|u| u.to_string()))
            .unwrap_or_default(),
    }
}
