//! `infer`: build a vindex from a checkpoint and run inference from it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd_bench;
mod cmd_inspect;
mod cmd_perplexity;
mod cmd_quant_stats;
mod cmd_run;
mod cmd_vindex;
mod format_args;

/// infer — transformer checkpoints to vindex, and fast inference from a vindex.
#[derive(Parser)]
#[command(name = "infer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show architecture, config and tensors of a HF folder, a GGUF file or a vindex.
    Inspect(cmd_inspect::InspectArgs),
    /// Build a vindex from a HF folder or a GGUF file.
    Extract(cmd_vindex::ExtractArgs),
    /// Re-hash every file of a vindex against its index.json.
    Verify(cmd_vindex::VerifyArgs),
    /// Continue a prompt: streams the continuation to stdout, tokens/s to stderr.
    Run(cmd_run::RunArgs),
    /// Interactive chat using the model's chat template (or one-shot with -p).
    Chat(cmd_run::ChatArgs),
    /// One full-sequence forward: top-10 of the last position, optionally all logits to a file.
    Logits(cmd_run::LogitsArgs),
    /// Prompt and decode tokens/s (median of repeats), effective GB/s, peak RSS.
    Bench(cmd_bench::BenchArgs),
    /// Perplexity of a text file (llama-perplexity scoring: second half of each window).
    Perplexity(cmd_perplexity::PerplexityArgs),
    /// Relative RMSE of every stored quantized tensor against the vindex's float tier.
    QuantStats(cmd_quant_stats::QuantStatsArgs),
}

/// Write to stdout; a closed pipe (`infer inspect … | head`) ends quietly instead of panicking.
pub(crate) fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// The error and its causes, skipping a cause whose text the message already contains
/// (several of our errors embed their source's text next to the file name).
fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => cmd_inspect::run(a),
        Command::Extract(a) => cmd_vindex::extract(a),
        Command::Verify(a) => cmd_vindex::verify(a),
        Command::QuantStats(a) => cmd_quant_stats::run(a),
        Command::Run(a) => cmd_run::run(a),
        Command::Chat(a) => cmd_run::chat(a),
        Command::Logits(a) => cmd_run::logits(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Perplexity(a) => cmd_perplexity::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
