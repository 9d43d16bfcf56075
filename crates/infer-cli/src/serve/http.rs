//! The HTTP side (axum): routes, API-key check, request → [`Job`] for the engine, and the
//! response (one JSON object, or SSE chunks ending in `data: [DONE]`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use infer_inference::Conversation;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::engine::{Event, Job, Queue, QueueError, Ready};
use super::error::ApiError;
use super::metrics as m;
use super::params::{self, Endpoint, Input};
use super::respond::{apply, ChoiceResult, Meta};

/// Shared by every handler.
pub struct AppState {
    /// Set by the engine thread once the model is loaded.
    pub ready: Arc<OnceLock<Arc<Ready>>>,
    pub queue: Queue,
    pub api_key: Option<String>,
    pub parallel: usize,
    /// Set on SIGTERM: new generation requests get 503.
    pub draining: Arc<AtomicBool>,
    pub metrics: PrometheusHandle,
    /// Largest request body in bytes (`--max-body`), named in the 413 message.
    pub max_body: usize,
}

type St = State<Arc<AppState>>;

impl AppState {
    fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        self.ready
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("the model is loading", Some(1)))
    }
}

/// The router with every endpoint; `body_limit` bytes per request body, `timeout` per request
/// (until the response starts, for a stream).
pub fn router(state: Arc<AppState>, body_limit: usize, timeout: Duration) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/models/{model}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics_text))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(health))
        .merge(api)
        .fallback(|uri: Uri| async move { ApiError::not_found(uri.path()) })
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            deadline(timeout, req, next)
        }))
        .layer(middleware::map_response(error_json))
        .with_state(state)
}

/// Axum's method routing (405) answers with an empty body: give it the OpenAI error body like
/// every other error.
async fn error_json(r: Response) -> Response {
    if r.headers().contains_key(header::CONTENT_TYPE) {
        return r;
    }
    match r.status() {
        StatusCode::METHOD_NOT_ALLOWED => ApiError::method_not_allowed().into_response(),
        _ => r,
    }
}

/// Set (before the request's future is dropped) when `--timeout` ran out, so a non-streamed
/// answer cut short counts as 408, not as a client that went away.
#[derive(Clone, Default)]
struct Expired(Arc<AtomicBool>);

/// `--timeout`: a request whose response has not started after `timeout` is dropped (which
/// frees its sequences) and answered 408.
async fn deadline(timeout: Duration, mut req: Request, next: Next) -> Response {
    let expired = Expired::default();
    req.extensions_mut().insert(expired.clone());
    let mut run = Box::pin(next.run(req));
    match tokio::time::timeout(timeout, &mut run).await {
        Ok(r) => r,
        Err(_) => {
            expired.0.store(true, Ordering::SeqCst);
            drop(run);
            ApiError::timeout().into_response()
        }
    }
}

/// `Authorization: Bearer KEY` on every route but `/health` when `--api-key` is set.
async fn auth(State(st): St, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            // The scheme is case-insensitive (RFC 9110, 11.1).
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, k)| k.trim_start());
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn health(State(st): St) -> Response {
    match st.ready.get() {
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response(),
    }
}

/// The served model as `/v1/models` lists it.
fn model_object(r: &Ready) -> Value {
    json!({"id": r.model_id, "object": "model", "created": r.created, "owned_by": "infer",
           "meta": {"n_ctx": r.ctx, "n_vocab": r.vocab}})
}

async fn models(State(st): St) -> Result<Response, ApiError> {
    let r = st.ready()?;
    Ok(Json(json!({"object": "list", "data": [model_object(&r)]})).into_response())
}

/// `GET /v1/models/{model}` (the `openai` client's `models.retrieve`): the served model, or
/// 404 `model_not_found`.
async fn model(
    State(st): St,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let r = st.ready()?;
    let Path(id) =
        id.map_err(|e| ApiError::bad_request(format!("the model id: {}", e.body_text())))?;
    if id != r.model_id {
        return Err(ApiError::unknown_model(&id, &r.model_id));
    }
    Ok(Json(model_object(&r)).into_response())
}

async fn metrics_text(State(st): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

fn json_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("the body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

/// `POST /tokenize {"content": TEXT, "add_special": false, "with_pieces": false}` →
/// `{"tokens": [ids]}` (with pieces: `[{"id", "piece"}]`), as llama-server.
async fn tokenize(State(st): St, body: Body) -> Result<Response, ApiError> {
    let body = read(&st, body)?;
    let r = st.ready()?;
    let o = json_body(&body)?;
    let content = o
        .get("content")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::field("content", "expected a string"))?;
    let flag = |k: &str| -> Result<bool, ApiError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ApiError::field(
                k,
                format!("expected true or false, got {v}"),
            )),
        }
    };
    let (add_special, with_pieces) = (flag("add_special")?, flag("with_pieces")?);
    let ids = r
        .tokenizer
        .encode(content, add_special)
        .map_err(|e| ApiError::bad_request(format!("tokenizing: {e}")))?;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let piece = r.tokenizer.decode(&[id], false).unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

/// `POST /detokenize {"tokens": [ids]}` → `{"content": TEXT}`.
async fn detokenize(State(st): St, body: Body) -> Result<Response, ApiError> {
    let body = read(&st, body)?;
    let r = st.ready()?;
    let o = json_body(&body)?;
    let ids: Vec<u32> = o
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::field("tokens", "expected a list of token ids"))?
        .iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| (id as usize) < r.vocab)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::field("tokens", format!("{v} is not a token id below {}", r.vocab))
                })
        })
        .collect::<Result<_, _>>()?;
    let content = r
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::bad_request(format!("detokenizing: {e}")))?;
    Ok(Json(json!({ "content": content })).into_response())
}

/// A request body, or its rejection (over `--max-body`: 413; unreadable: 400) as an
/// OpenAI error.
type Body = Result<Bytes, BytesRejection>;

fn read(st: &AppState, body: Body) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "the request body is larger than the server's --max-body limit of {} bytes \
                 (start the server with a larger --max-body)",
                st.max_body
            )
        } else {
            format!("the request body: {}", e.body_text())
        };
        let mut err = ApiError::bad_request(message);
        err.status = e.status();
        err
    })
}

async fn chat(State(st): St, Extension(expired): Extension<Expired>, body: Body) -> Response {
    answer(st, body, Endpoint::Chat, expired).await
}

async fn completions(
    State(st): St,
    Extension(expired): Extension<Expired>,
    body: Body,
) -> Response {
    answer(st, body, Endpoint::Completion, expired).await
}

fn endpoint_label(e: Endpoint) -> &'static str {
    match e {
        Endpoint::Chat => "chat",
        Endpoint::Completion => "completions",
    }
}

/// Count a request that ended before generating (an error).
fn count_error(e: Endpoint, err: &ApiError) {
    metrics::counter!(m::REQUESTS, "endpoint" => endpoint_label(e),
        "status" => err.status.as_u16().to_string(), "finish_reason" => "none")
    .increment(1);
}

async fn answer(st: Arc<AppState>, body: Body, endpoint: Endpoint, expired: Expired) -> Response {
    match read(&st, body).and_then(|body| start(&st, &body, endpoint)) {
        Ok(s) if s.stream => stream(s.meta, s.rx).into_response(),
        Ok(s) => collect(s.meta, s.rx, expired).await,
        Err(e) => {
            count_error(endpoint, &e);
            e.into_response()
        }
    }
}

/// A queued request.
struct Started {
    meta: Meta,
    stream: bool,
    rx: mpsc::UnboundedReceiver<Event>,
}

static REQUEST_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Parse, tokenize, check the context, and queue the job. Every error here comes before any
/// byte of the response.
fn start(st: &AppState, body: &[u8], endpoint: Endpoint) -> Result<Started, ApiError> {
    let ready = st.ready()?;
    if st.draining.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down", None));
    }
    let req = params::parse(body, endpoint, ready.vocab, st.parallel)?;
    if let Some(m) = req.model.as_deref() {
        if !m.is_empty() && m != ready.model_id {
            return Err(ApiError::unknown_model(m, &ready.model_id));
        }
    }
    let prompt = match &req.input {
        Input::Messages(msgs) => Conversation::from_messages(msgs.clone())
            .render_ids(&ready.template, &ready.tokenizer)
            .map_err(|e| ApiError::bad_request(format!("messages: chat template: {e}")))?,
        Input::Text(t) => ready
            .tokenizer
            .encode(t, true)
            .map_err(|e| ApiError::field("prompt", format!("tokenizing: {e}")))?,
        Input::Ids(ids) => ids.clone(),
    };
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt has no tokens"));
    }
    let room = ready.ctx.saturating_sub(prompt.len());
    let max_tokens = match req.max_tokens {
        Some(m) if m > room => {
            return Err(ApiError::context_exceeded(prompt.len(), Some(m), ready.ctx))
        }
        Some(m) => m,
        None if room == 0 => return Err(ApiError::context_exceeded(prompt.len(), None, ready.ctx)),
        None => room,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let n = req.n;
    let meta = Meta {
        id: format!(
            "{}-{:x}{:04x}",
            if endpoint == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            ready.created,
            REQUEST_COUNTER.fetch_add(1, Ordering::Relaxed)
        ),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: ready.model_id.clone(),
        endpoint,
        prompt_tokens: prompt.len(),
        n,
        logprobs: req.logprobs.is_some(),
        include_usage: req.include_usage,
    };
    let job = Job {
        prompt: Arc::new(prompt),
        max_tokens,
        stop: req.stop,
        n,
        logprobs: req.logprobs,
        ignore_eos: req.ignore_eos,
        cache_prompt: req.cache_prompt,
        sampling: req.sampling,
        events: tx,
        arrived: Instant::now(),
    };
    match st.queue.push(job) {
        Ok(()) => Ok(Started {
            meta,
            stream: req.stream,
            rx,
        }),
        Err(QueueError::Full) => Err(ApiError::unavailable(
            "the server is busy: the request queue is full (--max-queue)",
            Some(1),
        )),
        Err(QueueError::Closed) => Err(ApiError::unavailable("the engine has stopped", None)),
    }
}

fn count_done(meta: &Meta, status: u16, choices: &[ChoiceResult]) {
    for c in choices {
        let reason = c.finish.map_or("cancelled", |f| f.as_str());
        metrics::counter!(m::REQUESTS, "endpoint" => endpoint_label(meta.endpoint),
            "status" => status.to_string(), "finish_reason" => reason)
        .increment(1);
    }
}

/// The choices of a non-streamed answer as they arrive, counted in `infer_requests_total`
/// once: with the answer's status, or when dropped unanswered (`--timeout` ran out: 408; the
/// client went away: 499).
struct Collected<'m> {
    meta: &'m Meta,
    choices: Vec<ChoiceResult>,
    expired: Expired,
    counted: bool,
}

impl Collected<'_> {
    fn count(&mut self, status: u16) {
        count_done(self.meta, status, &self.choices);
        self.counted = true;
    }
}

impl Drop for Collected<'_> {
    fn drop(&mut self) {
        if !self.counted {
            let timed_out = self.expired.0.load(Ordering::SeqCst);
            self.count(if timed_out { 408 } else { 499 });
        }
    }
}

/// A non-streamed answer: wait for every choice.
async fn collect(meta: Meta, mut rx: mpsc::UnboundedReceiver<Event>, expired: Expired) -> Response {
    let mut c = Collected {
        meta: &meta,
        choices: vec![ChoiceResult::default(); meta.n],
        expired,
        counted: false,
    };
    while c.choices.iter().any(|c| c.finish.is_none()) {
        let Some(ev) = rx.recv().await else {
            let e = ApiError::internal("the engine stopped before the answer was complete");
            c.count(500);
            return e.into_response();
        };
        if let Err(msg) = apply(&mut c.choices, ev) {
            c.count(500);
            return ApiError::internal(msg).into_response();
        }
    }
    c.count(200);
    Json(meta.full(&c.choices)).into_response()
}

/// A streamed answer: SSE chunks, `: keepalive` comments while nothing is produced (a long
/// prefill or a wait in the queue), `data: [DONE]` at the end. The forwarding task ends when
/// the client goes away, which drops the engine's channel and frees the sequences.
fn stream(meta: Meta, mut rx: mpsc::UnboundedReceiver<Event>) -> impl IntoResponse {
    let (out, out_rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        for i in 0..meta.n {
            if let Some(v) = meta.opening(i) {
                if out.send(data(v)).await.is_err() {
                    return;
                }
            }
        }
        let mut choices = vec![ChoiceResult::default(); meta.n];
        while choices.iter().any(|c| c.finish.is_none()) {
            let ev = tokio::select! {
                _ = out.closed() => {
                    // 499: the client closed the request (nginx's convention).
                    count_done(&meta, 499, &choices);
                    return;
                }
                ev = rx.recv() => ev,
            };
            let chunk = match ev {
                None => {
                    let e = ApiError::internal("the engine stopped before the answer was complete");
                    let _ = out.send(data(e.body())).await;
                    count_done(&meta, 500, &choices);
                    return;
                }
                Some(Event::Failed(msg)) => {
                    let _ = out.send(data(ApiError::internal(msg).body())).await;
                    count_done(&meta, 500, &choices);
                    return;
                }
                Some(Event::Text {
                    choice,
                    text,
                    logprobs,
                }) => {
                    let c = &mut choices[choice];
                    let v = meta.text_chunk(choice, &text, &logprobs, c.text.len());
                    c.text.push_str(&text);
                    v
                }
                Some(ev @ Event::Done { .. }) => {
                    let Event::Done { choice, finish, .. } = ev else {
                        unreachable!()
                    };
                    let _ = apply(&mut choices, ev);
                    meta.closing(choice, finish)
                }
            };
            if out.send(data(chunk)).await.is_err() {
                return;
            }
        }
        if meta.include_usage {
            let _ = out.send(data(meta.usage_chunk(&choices))).await;
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
        count_done(&meta, 200, &choices);
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(out_rx)).keep_alive(
        KeepAlive::new()
            .interval(Duration::from_secs(5))
            .text("keepalive"),
    )
}
