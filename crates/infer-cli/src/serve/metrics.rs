//! Prometheus metrics of `infer serve` (`GET /metrics`), through the `metrics` facade and
//! `metrics-exporter-prometheus`. Names follow Prometheus conventions (`_total` counters,
//! `_seconds` histograms).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Requests answered, labelled `endpoint`, `status` (HTTP code) and `finish_reason`.
pub const REQUESTS: &str = "infer_requests_total";
/// Sequences generating (decode phase) after the last step.
pub const RUNNING: &str = "infer_sequences_running";
/// Sequences prefilling their prompt after the last step.
pub const PREFILLING: &str = "infer_sequences_prefilling";
/// Requests queued for a free KV slot.
pub const WAITING: &str = "infer_requests_waiting";
/// KV cache positions held by running sequences, and the total (slots × context).
pub const KV_USED: &str = "infer_kv_cache_used_positions";
pub const KV_CAPACITY: &str = "infer_kv_cache_capacity_positions";
/// Prompt tokens run through the model (cached prefix tokens excluded).
pub const PROMPT_TOKENS: &str = "infer_prompt_tokens_total";
/// Tokens generated.
pub const GENERATED_TOKENS: &str = "infer_generated_tokens_total";
/// Prompt tokens taken from the prefix cache, and the sequences that reused any.
pub const PREFIX_CACHED_TOKENS: &str = "infer_prefix_cache_tokens_total";
pub const PREFIX_CACHE_HITS: &str = "infer_prefix_cache_hits_total";
/// Sequences freed because their client went away.
pub const CANCELLED: &str = "infer_sequences_cancelled_total";
/// Time from a request's arrival to its first generated token, and between tokens.
pub const TTFT: &str = "infer_time_to_first_token_seconds";
pub const ITL: &str = "infer_inter_token_latency_seconds";
/// Wall time of one batched forward step, and the tokens it ran.
pub const STEP_SECONDS: &str = "infer_step_seconds";
pub const STEP_TOKENS: &str = "infer_step_tokens";

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Install the process-wide recorder; the handle renders the text exposition format.
/// Errors: a recorder is already installed.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let b = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(STEP_TOKENS.into()), TOKEN_BUCKETS)?;
    let handle = b.install_recorder()?;
    describe();
    Ok(handle)
}

/// `# HELP` lines (and zero values from the start for the counters a dashboard alerts on).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        REQUESTS,
        "Requests answered, by endpoint, HTTP status and finish reason"
    );
    describe_gauge!(RUNNING, "Sequences generating tokens");
    describe_gauge!(PREFILLING, "Sequences prefilling their prompt");
    describe_gauge!(WAITING, "Requests queued for a free KV slot");
    describe_gauge!(KV_USED, "KV cache positions held by running sequences");
    describe_gauge!(
        KV_CAPACITY,
        "KV cache positions allocated (slots x context)"
    );
    describe_counter!(
        PROMPT_TOKENS,
        "Prompt tokens run through the model (cached ones excluded)"
    );
    describe_counter!(GENERATED_TOKENS, "Tokens generated");
    describe_counter!(
        PREFIX_CACHED_TOKENS,
        "Prompt tokens taken from the prefix cache"
    );
    describe_counter!(
        PREFIX_CACHE_HITS,
        "Sequences that reused a cached prompt prefix"
    );
    describe_counter!(CANCELLED, "Sequences freed because their client went away");
    describe_histogram!(
        TTFT,
        Unit::Seconds,
        "Time from a request's arrival to its first token"
    );
    describe_histogram!(
        ITL,
        Unit::Seconds,
        "Time between consecutive tokens of a sequence"
    );
    describe_histogram!(
        STEP_SECONDS,
        Unit::Seconds,
        "Wall time of one batched forward step"
    );
    describe_histogram!(STEP_TOKENS, "Tokens run by one batched forward step");
    for c in [
        PREFIX_CACHED_TOKENS,
        PREFIX_CACHE_HITS,
        CANCELLED,
        PROMPT_TOKENS,
        GENERATED_TOKENS,
    ] {
        metrics::counter!(c).absolute(0);
    }
    gauge_waiting(0);
}

/// Set the [`WAITING`] gauge.
pub fn gauge_waiting(n: usize) {
    metrics::gauge!(WAITING).set(n as f64);
}
