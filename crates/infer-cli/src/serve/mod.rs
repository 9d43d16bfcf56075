//! `infer serve`: an OpenAI-compatible HTTP server with continuous batching.
//!
//! The HTTP side ([`http`], axum on tokio) parses and checks each request ([`params`]),
//! tokenizes it and queues a [`engine::Job`]; the engine thread ([`engine`]) loads the model
//! and runs every request's sequences together, one batched forward pass per step
//! ([`scheduler`]), sending text back per request ([`choice`]) that the HTTP side turns into
//! JSON or SSE chunks ([`respond`]). `GET /metrics` is Prometheus text ([`metrics`]).

mod choice;
mod engine;
mod http;
mod metrics;
mod respond;
mod scheduler;
// Request parsing and the error type live in the library target (src/lib.rs), which the
// `serve_request` fuzz target links.
use infer_cli::serve::{error, params};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::cmd_chat::chat_template;
use crate::cmd_run::{build_model, context_size, eog_ids, load_tokenizer, open_vindex};
use crate::device_args::DeviceArgs;
use crate::format_args::FormatArgs;
use engine::{Engine, EngineConfig, Ready};
use infer_vindex::Vindex;

/// Arguments of `infer serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences run at once (KV slots; each choice of a request takes one).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub parallel: u16,
    /// Context size of each sequence in tokens (prompt + output); KV memory is
    /// parallel × ctx-size positions. Default min(4096, model maximum).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Tokens one batched step may run: a decode token per running sequence, the rest prompt
    /// chunks (chunked prefill).
    #[arg(long = "batch-tokens", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_tokens: u32,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Requests that may wait for a free slot; more get 503 with Retry-After.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Seconds a request may take before its response starts (408 after).
    #[arg(long = "timeout", default_value_t = 600)]
    pub timeout: u64,
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Run `infer serve` until SIGTERM / SIGINT: then stop accepting, let running streams
/// finish, exit 0.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Every flag and the vindex are checked before listening: a server that is announced
    // never exits over its command line.
    if args.max_body == 0 {
        bail!("--max-body 0: must be at least 1 (bytes per request body)");
    }
    if args.max_queue == 0 {
        bail!("--max-queue 0: must be at least 1 (requests that may wait for a free slot)");
    }
    if args.timeout == 0 {
        bail!("--timeout 0: must be at least 1 (seconds a request may take)");
    }
    args.device.check()?;
    let vindex = open_vindex(&args.vindex)?;
    let ctx = context_size(vindex.config(), args.ctx_size, "--ctx-size")?;
    if args.device.device == crate::device_args::Device::Cpu {
        // Before listening; a device's memory is checked once the model is assembled (the
        // engine, below), before the weights and slots are allocated.
        crate::kv_memory::check_host_config(
            vindex.config(),
            args.device.kv_type(),
            args.parallel as usize,
            ctx,
            &format!(
                "--parallel {} slots × --ctx-size {ctx} positions",
                args.parallel
            ),
            "lower --parallel or --ctx-size",
        )?;
    }
    let prom = metrics::install()?;
    let ready: Arc<OnceLock<Arc<Ready>>> = Arc::new(OnceLock::new());
    let (queue, jobs) = engine::queue(args.max_queue);
    let stop = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = format!("{}:{}", args.host, args.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("--host/--port: cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!(
        "infer serve: listening on http://{local} (loading {})",
        args.vindex.display()
    );
    let state = Arc::new(http::AppState {
        ready: ready.clone(),
        queue,
        api_key: args.api_key.clone(),
        parallel: args.parallel as usize,
        draining: draining.clone(),
        metrics: prom,
        max_body: args.max_body,
    });
    let app = http::router(state, args.max_body, Duration::from_secs(args.timeout));
    let engine_stop = stop.clone();
    let engine_thread = std::thread::Builder::new()
        .name("infer-engine".into())
        .spawn(move || -> anyhow::Result<()> {
            run_engine(&args, vindex, ctx, &ready, jobs, &engine_stop)
        })?;
    // The engine failing to load ends the server (its error is reported below).
    let engine_done = Arc::new(tokio::sync::Notify::new());
    let result = rt.block_on(async {
        let shutdown = {
            let draining = draining.clone();
            let engine_done = engine_done.clone();
            async move {
                tokio::select! {
                    _ = signal() => eprintln!("infer serve: shutting down (finishing running requests)"),
                    _ = engine_done.notified() => {}
                }
                draining.store(true, Ordering::SeqCst);
            }
        };
        let watch = {
            let engine_done = engine_done.clone();
            let h = &engine_thread;
            async move {
                while !h.is_finished() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                engine_done.notify_one();
            }
        };
        tokio::select! {
            r = axum::serve(listener, app).with_graceful_shutdown(shutdown) => r,
            _ = async { watch.await; std::future::pending::<()>().await } => Ok(()),
        }
    });
    stop.store(true, Ordering::SeqCst);
    let engine_result = match engine_thread.join() {
        Ok(r) => r,
        Err(_) => bail!("the engine thread panicked"),
    };
    engine_result?;
    result.context("serving HTTP")?;
    Ok(())
}

/// SIGTERM or SIGINT.
async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The engine thread: load the model from the opened `vindex`, publish what the HTTP side
/// needs, serve jobs with `ctx` positions per sequence.
fn run_engine(
    args: &ServeArgs,
    vindex: Vindex,
    ctx: usize,
    ready: &OnceLock<Arc<Ready>>,
    jobs: engine::QueueRx,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let tokenizer = load_tokenizer(&vindex, &args.vindex)?;
    let model = build_model(&vindex, &args.vindex, &args.formats)?;
    let backend = args.device.backend()?;
    let template = chat_template(&vindex, &tokenizer)
        .with_context(|| format!("{}: chat template", args.vindex.display()))?;
    let eog = eog_ids(&model, &tokenizer);
    let model_id = args
        .vindex
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| args.vindex.display().to_string());
    let r = Arc::new(Ready {
        tokenizer,
        template,
        model_id,
        vocab: model.vocab_size,
        ctx,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    });
    let engine = Engine {
        model: &model,
        backend: &*backend,
        tokenizer: &r.tokenizer,
        eog,
        ctx,
        config: EngineConfig {
            parallel: args.parallel as usize,
            batch_tokens: args.batch_tokens as usize,
        },
    };
    // Weights + slot caches + step scratch against the device's free memory (on the CPU the
    // slots against the host's, as checked before listening), before they are allocated.
    let slots = args.parallel as usize;
    let work = crate::kv_memory::Workload {
        sequences: slots,
        positions: ctx,
        step_tokens: (args.batch_tokens as usize).max(slots),
        logit_rows: slots,
    };
    let (need, room) = args.device.check_memory(
        &model,
        &*backend,
        &work,
        &format!("--parallel {slots} slots × --ctx-size {ctx} positions"),
        "lower --parallel or --ctx-size (or --batch-tokens)",
        false,
    )?;
    eprintln!("infer serve: {}", crate::kv_memory::line(&need, &room));
    let caches = engine.slot_caches()?;
    if stop.load(std::sync::atomic::Ordering::SeqCst) {
        // SIGTERM while loading: never announce a server that is shutting down.
        return Ok(());
    }
    engine::publish(ready, r.clone());
    eprintln!(
        "infer serve: ready ({} slots × {ctx} positions, model '{}')",
        args.parallel, r.model_id
    );
    engine.run(caches, jobs, stop);
    Ok(())
}
