//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status that goes with them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error answered to a client. `kind` is the OpenAI `type` (`invalid_request_error`,
/// `authentication_error`, …), `param` the request field at fault, when there is one.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Extra top-level members of `error` (e.g. the token counts of a too-long prompt).
    pub extra: Option<Box<Value>>,
    /// Seconds for a `Retry-After` header (503 when the queue is full).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            extra: None,
            retry_after: None,
        }
    }

    /// 400 about request field `param`.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad_request(format!("{param}: {}", message.into()));
        e.param = Some(param.to_string());
        e
    }

    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 for a field this server does not implement.
    pub fn unsupported(param: &str, why: &str) -> Self {
        let mut e = Self::field(param, format!("not supported by this server ({why})"));
        e.code = Some("unsupported_parameter");
        e
    }

    /// 401: the `Authorization: Bearer` key is missing or wrong.
    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key (send `Authorization: Bearer KEY`)",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 404 for a model name this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("model '{asked}' does not exist; this server serves '{served}'"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 400 `exceed_context_size_error`: prompt + max_tokens do not fit one sequence's context.
    pub fn context_exceeded(prompt: usize, max_tokens: Option<usize>, ctx: usize) -> Self {
        let asked = match max_tokens {
            Some(m) => format!("{prompt} prompt tokens + max_tokens {m} = {}", prompt + m),
            None => format!("{prompt} prompt tokens (and at least one to generate)"),
        };
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "exceed_context_size_error",
            format!(
                "the request needs {asked} positions, more than the context size {ctx} of a \
                 sequence (--ctx-size)"
            ),
        );
        e.code = Some("context_length_exceeded");
        e.extra = Some(Box::new(
            json!({"n_prompt_tokens": prompt, "n_ctx": ctx, "max_tokens": max_tokens}),
        ));
        e
    }

    /// 503 while the model loads, the queue is full, or the server shuts down.
    pub fn unavailable(message: impl Into<String>, retry_after: Option<u32>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = retry_after;
        e
    }

    /// 500 for an engine failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 408: the request ran past the server's `--timeout`.
    pub fn timeout() -> Self {
        let mut e = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            "the request took longer than the server's --timeout",
        );
        e.code = Some("timeout");
        e
    }

    /// 405: the endpoint exists but not for this HTTP method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this endpoint does not answer this HTTP method (see README: GET /v1/models, \
             /health, /metrics; POST for the others)",
        )
    }

    /// 404 for an unknown path.
    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no such endpoint: {path}"),
        )
    }

    /// The error object (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> Value {
        let mut err = json!({
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        });
        if let (Some(Value::Object(extra)), Value::Object(e)) = (self.extra.as_deref(), &mut err) {
            for (k, v) in extra {
                e.insert(k.clone(), v.clone());
            }
        }
        json!({ "error": err })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
