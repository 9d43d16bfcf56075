//! `infer`: build a vindex from a checkpoint and run inference from it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd_bench;
mod cmd_chat;
mod cmd_export;
mod cmd_inspect;
mod cmd_perplexity;
mod cmd_quant_stats;
mod cmd_run;
mod cmd_synth;
mod cmd_tokenize;
mod cmd_vindex;
mod cmd_walk;
mod device_args;
mod format_args;
mod kv_memory;
mod serve;
mod signals;

/// infer — transformer checkpoints to vindex, and fast inference from a vindex.
#[derive(Parser)]
#[command(name = "infer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Threads of the CPU work (matrix products, quantization), for every command; default:
    /// all cores.
    #[arg(short = 't', long = "threads", global = true,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
}

#[derive(Subcommand)]
enum Command {
    /// Show architecture, config and tensors of a HF folder, a GGUF file or a vindex.
    Inspect(cmd_inspect::InspectArgs),
    /// Build a vindex from a HF folder or a GGUF file.
    Extract(cmd_vindex::ExtractArgs),
    /// Re-hash every file of a vindex against its index.json.
    Verify(cmd_vindex::VerifyArgs),
    /// Write a vindex back as a GGUF file (llama.cpp) or, with --safetensors, a Hugging Face
    /// folder (quantized blocks copied as stored).
    Export(cmd_export::ExportArgs),
    /// Continue a prompt: streams the continuation to stdout, tokens/s to stderr.
    #[command(allow_negative_numbers = true)]
    Run(cmd_run::RunArgs),
    /// Interactive chat using the model's chat template (or one-shot with -p).
    #[command(allow_negative_numbers = true)]
    Chat(cmd_chat::ChatArgs),
    /// One full-sequence forward: top-10 of the last position, optionally all logits to a file.
    #[command(allow_negative_numbers = true)]
    Logits(cmd_run::LogitsArgs),
    /// Prompt and decode tokens/s (median of repeats), effective GB/s, peak RSS.
    #[command(allow_negative_numbers = true)]
    Bench(cmd_bench::BenchArgs),
    /// Perplexity of a text file (llama-perplexity scoring: second half of each window).
    #[command(allow_negative_numbers = true)]
    Perplexity(cmd_perplexity::PerplexityArgs),
    /// Relative RMSE of every stored quantized tensor against the vindex's float tier.
    QuantStats(cmd_quant_stats::QuantStatsArgs),
    /// Last token of a prompt: per layer, the FFN features with the largest activation and the
    /// tokens each one writes (from down_meta.bin: `infer extract --down-meta`).
    #[command(allow_negative_numbers = true)]
    Walk(cmd_walk::WalkArgs),
    /// Random weights of a real model's shapes and formats (GGUF header or HF config.json),
    /// for benchmarks without the real weights.
    Synth(cmd_synth::SynthArgs),
    /// OpenAI-compatible HTTP server with continuous batching (chat, completions, SSE).
    #[command(allow_negative_numbers = true)]
    Serve(serve::ServeArgs),
    Tokenize(cmd_tokenize::TokenizeArgs),
    Detokenize(cmd_tokenize::DetokenizeArgs),
}

/// Write to stdout; a closed pipe (`infer inspect … | head`) ends quietly, any other write
/// error (a full disk) is reported and exits 1.
pub(crate) fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        exit_on_output_error(&e.to_string());
    }
}

/// A closed pipe is a normal end (exit 0); any other failure to write output is an error
/// (exit 1), never a panic.
fn exit_on_output_error(msg: &str) -> ! {
    if msg.contains("Broken pipe") {
        std::process::exit(0);
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "error: cannot write output: {msg}");
    std::process::exit(1);
}

/// `println!`/`eprintln!` panic when the stream cannot be written (`>/dev/full`, a closed
/// pipe); turn exactly those panics into a clean exit instead of a backtrace.
fn install_output_error_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to") {
            exit_on_output_error(msg);
        }
        default(info);
    }));
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
    install_output_error_hook();
    let cli = Cli::parse();
    if let Some(t) = cli.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(t.into())
            .build_global()
        {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "error: --threads {t}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Inspect(a) => cmd_inspect::run(a),
        Command::Extract(a) => cmd_vindex::extract(a),
        Command::Verify(a) => cmd_vindex::verify(a),
        Command::Export(a) => cmd_export::run(a),
        Command::QuantStats(a) => cmd_quant_stats::run(a),
        Command::Run(a) => cmd_run::run(a),
        Command::Chat(a) => cmd_chat::chat(a),
        Command::Logits(a) => cmd_run::logits(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Perplexity(a) => cmd_perplexity::run(a),
        Command::Walk(a) => cmd_walk::run(a),
        Command::Synth(a) => cmd_synth::run(a),
        Command::Serve(a) => serve::serve(a),
        Command::Tokenize(a) => cmd_tokenize::tokenize(a),
        Command::Detokenize(a) => cmd_tokenize::detokenize(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
