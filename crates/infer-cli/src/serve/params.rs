//! Request bodies of `/v1/chat/completions` and `/v1/completions`, read from JSON into a
//! [`GenRequest`]: every field checked for type and range (a 400 naming the field), fields
//! this server does not implement refused by name, fields of the other endpoint (`prompt` in a
//! chat request, `messages` in a completion) refused by name, other unknown fields ignored (as
//! OpenAI's API and llama-server do).

use infer_inference::chat::Message;
use infer_inference::SamplingParams;
use serde_json::{Map, Value};

use super::error::ApiError;

/// Which endpoint a body was posted to (some fields differ: `messages` vs `prompt`, and the
/// shape of `logprobs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    /// The endpoint's path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }
}

/// Fields of the other endpoint, with that endpoint's path: a 400 naming the field when present
/// (not null), never ignored. A chat request with a `prompt` (or a completion with `messages`)
/// is ambiguous about what to continue; `top_logprobs` is chat's (completions take
/// `logprobs: k`), `echo` is the completions'.
fn foreign_fields(endpoint: Endpoint) -> &'static [(&'static str, &'static str)] {
    match endpoint {
        Endpoint::Chat => &[("prompt", "/v1/completions"), ("echo", "/v1/completions")],
        Endpoint::Completion => &[
            ("messages", "/v1/chat/completions"),
            ("top_logprobs", "/v1/chat/completions"),
        ],
    }
}

/// What the model continues.
#[derive(Clone, Debug)]
pub enum Input {
    /// Chat messages, rendered through the model's chat template.
    Messages(Vec<Message>),
    /// A completion prompt as text (tokenized as `infer run` does: the tokenizer's BOS rule
    /// applies, special-token markup is recognised).
    Text(String),
    /// A completion prompt given as token ids.
    Ids(Vec<u32>),
}

/// Sampling of one request: the [`SamplingParams`] of the shared sampler plus the OpenAI
/// penalties and biases applied to the logits before it.
#[derive(Clone, Debug)]
pub struct SamplingSpec {
    /// Temperature, top-k/p, min-p, repetition penalty and the seed of choice 0 (choice `i`
    /// draws with `seed + i`).
    pub params: SamplingParams,
    /// OpenAI `presence_penalty` in [-2, 2]: subtracted once from the logit of every token
    /// generated so far.
    pub presence_penalty: f32,
    /// OpenAI `frequency_penalty` in [-2, 2]: subtracted per occurrence in the generated text.
    pub frequency_penalty: f32,
    /// `logit_bias`: (token id, bias in [-100, 100]) added to the logits.
    pub logit_bias: Vec<(u32, f32)>,
}

impl SamplingSpec {
    /// True when sampling is a plain argmax of the logits.
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0
            && self.params.repeat_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.logit_bias.is_empty()
    }
}

/// A parsed generation request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub model: Option<String>,
    pub input: Input,
    /// `max_tokens` / `max_completion_tokens`; `None` = until the context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Number of choices (each runs as its own sequence).
    pub n: usize,
    /// `Some(k)`: report the chosen token's log-probability and the `k` most likely.
    pub logprobs: Option<usize>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` (and `"usage": null` before).
    pub include_usage: bool,
    /// `ignore_eos` (llama-server, vLLM): end-of-generation tokens do not stop the choice.
    pub ignore_eos: bool,
    /// `cache_prompt` (llama-server's name, default true): reuse a cached prompt prefix. Off,
    /// the prompt runs whole, so greedy output cannot depend on what the cache held (a
    /// prefix from the cache or a prompt prefilled in other chunks gives logits equal only to
    /// rounding, which can flip a near-tie).
    pub cache_prompt: bool,
    pub sampling: SamplingSpec,
}

/// Fields that would change the result but are not implemented: a 400 when present (and not
/// null or the neutral value), never silently ignored.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("best_of", "only one completion per choice is generated"),
    ("suffix", "no fill-in-the-middle"),
    ("tools", "no tool calling"),
    ("tool_choice", "no tool calling"),
    ("functions", "no function calling"),
    ("function_call", "no function calling"),
    ("audio", "text only"),
    ("prediction", "no predicted outputs"),
];

/// Most top log-probabilities per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most stop strings (OpenAI's limit).
pub const MAX_STOPS: usize = 4;

type Obj = Map<String, Value>;

fn present<'a>(o: &'a Obj, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn number(o: &Obj, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(v) => {
            let x = v
                .as_f64()
                .ok_or_else(|| ApiError::field(k, format!("expected a number, got {v}")))?;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::field(k, format!("{x} is outside [{lo}, {hi}]")));
            }
            Ok(Some(x))
        }
    }
}

fn integer(o: &Obj, k: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(v) => {
            // A whole number too large for u64 (parsed as a float) is out of range, not of the
            // wrong type.
            let too_big = v
                .as_f64()
                .is_some_and(|f| f.fract() == 0.0 && f > u64::MAX as f64);
            if too_big {
                return Err(ApiError::field(k, format!("{v} is outside [{lo}, {hi}]")));
            }
            let x = v.as_u64().ok_or_else(|| {
                ApiError::field(k, format!("expected a non-negative integer, got {v}"))
            })?;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::field(k, format!("{x} is outside [{lo}, {hi}]")));
            }
            Ok(Some(x))
        }
    }
}

fn boolean(o: &Obj, k: &str) -> Result<Option<bool>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::field(
            k,
            format!("expected true or false, got {v}"),
        )),
    }
}

/// Read a request body posted to `endpoint`. `vocab` bounds token ids (`logit_bias`, id
/// prompts); `max_n` is the number of sequences the server runs at once.
pub fn parse(
    body: &[u8],
    endpoint: Endpoint,
    vocab: usize,
    max_n: usize,
) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    for (k, why) in UNSUPPORTED {
        match present(&o, k) {
            None => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(Value::String(s)) if s.is_empty() || (*k == "tool_choice" && s == "none") => {}
            Some(Value::Number(n)) if *k == "best_of" && n.as_u64() == Some(1) => {}
            Some(_) => return Err(ApiError::unsupported(k, why)),
        }
    }
    for (k, home) in foreign_fields(endpoint) {
        if present(&o, k).is_some() {
            return Err(ApiError::field(
                k,
                format!(
                    "belongs to {home}, not to this endpoint ({}); send it there, or leave it out",
                    endpoint.path()
                ),
            ));
        }
    }
    if let Some(rf) = present(&o, "response_format") {
        if rf.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::unsupported(
                "response_format",
                "only {\"type\": \"text\"}",
            ));
        }
    }
    let model = match present(&o, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::field(
                "model",
                format!("expected a string, got {v}"),
            ))
        }
    };
    let input = match endpoint {
        Endpoint::Chat => Input::Messages(messages(&o)?),
        Endpoint::Completion => prompt(&o, vocab)?,
    };
    let max_tokens = match integer(&o, "max_completion_tokens", 1, u32::MAX as u64)? {
        Some(m) => Some(m),
        None => integer(&o, "max_tokens", 1, u32::MAX as u64)?,
    }
    .map(|m| m as usize);
    let n = integer(&o, "n", 1, max_n as u64)
        .map_err(|e| ApiError {
            message: format!("{} (at most --parallel {max_n} choices)", e.message),
            ..e
        })?
        .unwrap_or(1) as usize;
    if endpoint == Endpoint::Completion && boolean(&o, "echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "the prompt is not echoed"));
    }
    let logprobs = match endpoint {
        Endpoint::Chat => match boolean(&o, "logprobs")? {
            Some(true) => {
                Some(integer(&o, "top_logprobs", 0, MAX_TOP_LOGPROBS as u64)?.unwrap_or(0) as usize)
            }
            _ => {
                if present(&o, "top_logprobs").is_some() {
                    return Err(ApiError::field("top_logprobs", "needs \"logprobs\": true"));
                }
                None
            }
        },
        Endpoint::Completion => {
            integer(&o, "logprobs", 0, MAX_TOP_LOGPROBS as u64)?.map(|k| k as usize)
        }
    };
    let stream = boolean(&o, "stream")?.unwrap_or(false);
    let include_usage = match present(&o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => match present(so, "include_usage") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ApiError::field(
                    "stream_options.include_usage",
                    format!("expected true or false, got {v}"),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::field(
                "stream_options",
                format!("expected an object, got {v}"),
            ))
        }
    };
    let ignore_eos = boolean(&o, "ignore_eos")?.unwrap_or(false);
    let cache_prompt = boolean(&o, "cache_prompt")?.unwrap_or(true);
    let stop = stops(&o)?;
    let sampling = sampling(&o, vocab)?;
    Ok(GenRequest {
        model,
        input,
        max_tokens,
        stop,
        n,
        logprobs,
        stream,
        include_usage,
        ignore_eos,
        cache_prompt,
        sampling,
    })
}

fn sampling(o: &Obj, vocab: usize) -> Result<SamplingSpec, ApiError> {
    // Defaults are llama-server's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).
    let d = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    };
    let seed = match present(o, "seed") {
        None => fresh_seed(),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|i| i as u64))
            .ok_or_else(|| ApiError::field("seed", format!("expected an integer, got {v}")))?,
    };
    let top_p = number(o, "top_p", 0.0, 1.0)?.unwrap_or(d.top_p as f64) as f32;
    if top_p <= 0.0 {
        return Err(ApiError::field("top_p", "must be > 0"));
    }
    let repeat_penalty = number(o, "repetition_penalty", 0.0, 10.0)?
        .or(number(o, "repeat_penalty", 0.0, 10.0)?)
        .unwrap_or(1.0) as f32;
    if repeat_penalty <= 0.0 {
        return Err(ApiError::field("repetition_penalty", "must be > 0"));
    }
    let params = SamplingParams {
        temperature: number(o, "temperature", 0.0, 2.0)?.unwrap_or(d.temperature as f64) as f32,
        top_k: integer(o, "top_k", 0, vocab as u64)?.unwrap_or(d.top_k as u64) as usize,
        top_p,
        min_p: number(o, "min_p", 0.0, 1.0)?.unwrap_or(d.min_p as f64) as f32,
        repeat_penalty,
        repeat_last_n: d.repeat_last_n,
        seed,
    };
    let mut logit_bias = Vec::new();
    match present(o, "logit_bias") {
        None => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let param = format!("logit_bias.{k}");
                let id: u32 = k
                    .parse()
                    .ok()
                    .filter(|&id: &u32| (id as usize) < vocab)
                    .ok_or_else(|| {
                        ApiError::field(&param, format!("not a token id below {vocab}"))
                    })?;
                let b = v
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| ApiError::field(&param, "expected a number in [-100, 100]"))?;
                logit_bias.push((id, b as f32));
            }
        }
        Some(v) => {
            return Err(ApiError::field(
                "logit_bias",
                format!("expected an object of token id → bias, got {v}"),
            ))
        }
    }
    Ok(SamplingSpec {
        params,
        presence_penalty: number(o, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: number(o, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        logit_bias,
    })
}

/// A seed for a request that gives none (different per request).
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ COUNTER
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn stops(o: &Obj) -> Result<Vec<String>, ApiError> {
    let list = match present(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::field("stop", format!("expected strings, got {s}")))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::field(
                "stop",
                format!("expected a string or a list of strings, got {v}"),
            ))
        }
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::field(
            "stop",
            format!("at most {MAX_STOPS} stop strings"),
        ));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

fn messages(o: &Obj) -> Result<Vec<Message>, ApiError> {
    let Some(v) = present(o, "messages") else {
        return Err(ApiError::field("messages", "required"));
    };
    let Value::Array(list) = v else {
        return Err(ApiError::field("messages", "expected a list of messages"));
    };
    if list.is_empty() {
        return Err(ApiError::field("messages", "must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |f: &str| format!("messages[{i}].{f}");
            let Value::Object(m) = m else {
                return Err(ApiError::field(
                    &format!("messages[{i}]"),
                    "expected an object",
                ));
            };
            let role = match m.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(r @ ("system" | "user" | "assistant")) => r,
                Some("tool" | "function") => {
                    return Err(ApiError::unsupported(&at("role"), "no tool calling"))
                }
                _ => {
                    return Err(ApiError::field(
                        &at("role"),
                        "expected system, developer, user or assistant",
                    ))
                }
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None if role == "assistant" => String::new(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (
                            p.get("type").and_then(Value::as_str),
                            p.get("text").and_then(Value::as_str),
                        ) {
                            (Some("text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::unsupported(
                                    &at(&format!("content[{j}]")),
                                    "only text parts",
                                ))
                            }
                        }
                    }
                    text
                }
                _ => return Err(ApiError::field(&at("content"), "expected a string")),
            };
            Ok(Message::new(role, &content))
        })
        .collect()
}

fn prompt(o: &Obj, vocab: usize) -> Result<Input, ApiError> {
    let bad_id = |v: &Value| {
        v.as_u64()
            .filter(|&id| (id as usize) < vocab)
            .map(|id| id as u32)
            .ok_or_else(|| {
                ApiError::field("prompt", format!("{v} is not a token id below {vocab}"))
            })
    };
    let input = match present(o, "prompt") {
        None => return Err(ApiError::field("prompt", "required")),
        Some(Value::String(s)) => Input::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Input::Text(s.clone()),
            [Value::Array(ids)] => Input::Ids(ids.iter().map(bad_id).collect::<Result<_, _>>()?),
            ids if ids.iter().all(Value::is_number) => {
                Input::Ids(ids.iter().map(bad_id).collect::<Result<_, _>>()?)
            }
            // Several prompts (strings, or lists of ids).
            many if many.iter().all(Value::is_string) || many.iter().all(Value::is_array) => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "one prompt per request (a string or a list of token ids)",
                ))
            }
            _ => {
                return Err(ApiError::field(
                    "prompt",
                    "expected a string or a list of token ids (a list mixes kinds)",
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::field(
                "prompt",
                format!("expected a string or token ids, got {v}"),
            ))
        }
    };
    match &input {
        Input::Text(t) if t.is_empty() => Err(ApiError::field("prompt", "must not be empty")),
        Input::Ids(ids) if ids.is_empty() => Err(ApiError::field("prompt", "must not be empty")),
        _ => Ok(input),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenRequest, ApiError> {
        parse(body.as_bytes(), Endpoint::Chat, 100, 4)
    }

    #[test]
    fn reads_fields_and_ignores_unknown_ones() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,
                "temperature":0,"stop":"\n","n":2,"logprobs":true,"top_logprobs":3,
                "seed":7,"logit_bias":{"5":-100},"whatever":{"x":1},
                "stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert_eq!(
            (r.n, r.logprobs, r.stream, r.include_usage),
            (2, Some(3), true, true)
        );
        assert_eq!(r.sampling.params.seed, 7);
        assert_eq!(r.sampling.logit_bias, vec![(5, -100.0)]);
        assert!(!r.sampling.is_greedy());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"top_p":3}"#,
                "top_p",
            ),
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"n":9}"#,
                "n",
            ),
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"best_of":2}"#,
                "best_of",
            ),
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"logit_bias":{"999":1}}"#,
                "logit_bias.999",
            ),
            (
                r#"{"messages":[{"role":"robot","content":"hi"}]}"#,
                "messages[0].role",
            ),
            (r#"{"messages":[]}"#, "messages"),
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"stop":[1]}"#,
                "stop",
            ),
        ];
        for (body, field) in cases {
            let e = chat(body).expect_err(body);
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            assert_eq!(e.status, 400);
        }
        assert_eq!(chat("{not json").unwrap_err().status, 400);
    }

    #[test]
    fn a_field_of_the_other_endpoint_is_refused_by_name() {
        let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
        for (endpoint, body, field) in [
            (
                Endpoint::Chat,
                format!(r#"{{{msgs},"prompt":"x"}}"#),
                "prompt",
            ),
            (
                Endpoint::Chat,
                format!(r#"{{{msgs},"echo":false}}"#),
                "echo",
            ),
            (
                Endpoint::Completion,
                format!(r#"{{"prompt":"x",{msgs}}}"#),
                "messages",
            ),
            (
                Endpoint::Completion,
                r#"{"prompt":"x","logprobs":2,"top_logprobs":3}"#.to_string(),
                "top_logprobs",
            ),
        ] {
            let e = parse(body.as_bytes(), endpoint, 100, 4).expect_err(&body);
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(field)));
            assert!(
                e.message.contains(field) && e.message.contains("belongs to"),
                "{}",
                e.message
            );
        }
        // null is absent.
        let body = format!(r#"{{{msgs},"prompt":null}}"#);
        assert!(parse(body.as_bytes(), Endpoint::Chat, 100, 4).is_ok());
    }

    #[test]
    fn completion_prompts_text_or_ids() {
        let p = |b: &str| parse(b.as_bytes(), Endpoint::Completion, 100, 4);
        assert!(matches!(p(r#"{"prompt":"a"}"#).unwrap().input, Input::Text(t) if t == "a"));
        assert!(matches!(p(r#"{"prompt":[1,2]}"#).unwrap().input, Input::Ids(i) if i == [1, 2]));
        assert_eq!(
            p(r#"{"prompt":[1,200]}"#).unwrap_err().param.as_deref(),
            Some("prompt")
        );
        assert_eq!(
            p(r#"{"prompt":["a","b"]}"#).unwrap_err().param.as_deref(),
            Some("prompt")
        );
        assert_eq!(
            p(r#"{"prompt":"a","logprobs":2}"#).unwrap().logprobs,
            Some(2)
        );
    }
}
