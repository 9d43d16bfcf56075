//! `infer quant-stats`: relative RMSE of every stored quantized tensor against the vindex's
//! float tier.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Arguments of `infer quant-stats`.
#[derive(Args)]
pub struct QuantStatsArgs {
    /// The vindex directory (built with `infer extract --quant ...`).
    pub vindex: PathBuf,
    /// Print JSON (an array of `{file, key, format, shape, passthrough, rel_rmse, max_abs_err}`).
    #[arg(long)]
    pub json: bool,
}

/// Print per quantized tensor ‖deq − ref‖/‖ref‖ against the float tier (the exact dequantized
/// source for GGUF sources), as a table with a per-file/format summary, or as JSON.
pub fn run(args: QuantStatsArgs) -> anyhow::Result<()> {
    let v = infer_vindex::Vindex::open(&args.vindex)
        .with_context(|| format!("open {}", args.vindex.display()))?;
    let stats = infer_vindex::quant_stats(&v)?;
    if args.json {
        crate::print_stdout(&format!("{}\n", serde_json::to_string_pretty(&stats)?));
        return Ok(());
    }
    if stats.is_empty() {
        anyhow::bail!(
            "{}: no quantized tiers (tiers: {})",
            args.vindex.display(),
            v.index().tiers.join(", ")
        );
    }
    let mut out = format!(
        "{:<24} {:<48} {:<5} {:>14} {:>4} {:>10} {:>10}\n",
        "file", "tensor", "fmt", "shape", "pass", "rel_rmse", "max_abs"
    );
    for s in &stats {
        out += &format!(
            "{:<24} {:<48} {:<5} {:>14} {:>4} {:>10.3e} {:>10.3e}\n",
            s.file,
            s.key,
            s.format.name(),
            format!("{}x{}", s.shape[0], s.shape.get(1).copied().unwrap_or(1)),
            if s.passthrough { "yes" } else { "" },
            s.rel_rmse,
            s.max_abs_err
        );
    }
    // Summary per (file, format): tensor count, passthrough count, mean and max rel RMSE.
    let mut groups: Vec<(String, &str, Vec<&infer_vindex::QuantStat>)> = Vec::new();
    for s in &stats {
        match groups
            .iter_mut()
            .find(|(f, fmt, _)| *f == s.file && *fmt == s.format.name())
        {
            Some(g) => g.2.push(s),
            None => groups.push((s.file.clone(), s.format.name(), vec![s])),
        }
    }
    out += "\nsummary (file, format): tensors, passthrough, mean / max rel_rmse\n";
    for (f, fmt, v) in groups {
        let mean = v.iter().map(|s| s.rel_rmse).sum::<f64>() / v.len() as f64;
        let max = v.iter().map(|s| s.rel_rmse).fold(0.0, f64::max);
        let pass = v.iter().filter(|s| s.passthrough).count();
        out += &format!(
            "  {f:<24} {fmt:<5} {:>4} tensors, {pass:>4} passthrough, {mean:.3e} / {max:.3e}\n",
            v.len()
        );
    }
    crate::print_stdout(&out);
    Ok(())
}
