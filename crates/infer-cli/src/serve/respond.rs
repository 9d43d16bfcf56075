//! OpenAI response bodies from engine [`Event`]s: the whole JSON of a non-streamed request,
//! or the `chat.completion.chunk` / `text_completion` chunks of a streamed one (the first
//! chunk of each choice carries the role, the last its `finish_reason`; usage is reported
//! once, in the final object or, with `stream_options.include_usage`, a last chunk).

use serde_json::{json, Value};

use super::choice::{LogprobEntry, TokenLogprob};
use super::engine::{Event, Finish};
use super::params::Endpoint;

/// What every chunk or response of one request shares.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    pub prompt_tokens: usize,
    pub n: usize,
    pub logprobs: bool,
    pub include_usage: bool,
}

/// One choice's result as it accumulates.
#[derive(Clone, Debug, Default)]
pub struct ChoiceResult {
    pub text: String,
    pub logprobs: Vec<LogprobEntry>,
    pub finish: Option<Finish>,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// `usage`: prompt tokens counted once (not per choice), completion tokens of all
    /// choices, the prefix-cache hit of choice 0.
    pub fn usage(&self, choices: &[ChoiceResult]) -> Value {
        let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {
                "cached_tokens": choices.first().map_or(0, |c| c.cached_tokens)
            },
        })
    }

    /// The `logprobs` member of a choice for `entries` (`text_offset` counted from `offset`
    /// bytes into the choice's text, for completions).
    fn logprobs_json(&self, entries: &[LogprobEntry], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let one =
            |t: &TokenLogprob| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes});
        match self.endpoint {
            Endpoint::Chat => json!({
                "content": entries.iter().map(|e| {
                    let mut v = one(&e.chosen);
                    v["top_logprobs"] = e.top.iter().map(one).collect();
                    v
                }).collect::<Vec<_>>(),
            }),
            Endpoint::Completion => {
                let mut at = offset;
                let offsets: Vec<usize> = entries
                    .iter()
                    .map(|e| {
                        let o = at;
                        at += e.chosen.bytes.len();
                        o
                    })
                    .collect();
                json!({
                    "tokens": entries.iter().map(|e| &e.chosen.token).collect::<Vec<_>>(),
                    "token_logprobs": entries.iter().map(|e| e.chosen.logprob).collect::<Vec<_>>(),
                    "top_logprobs": entries.iter().map(|e| {
                        e.top.iter().map(|t| (t.token.clone(), json!(t.logprob)))
                            .collect::<serde_json::Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    /// The complete (non-streamed) response.
    pub fn full(&self, choices: &[ChoiceResult]) -> Value {
        let list: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let finish = c.finish.map(Finish::as_str);
                let lp = self.logprobs_json(&c.logprobs, 0);
                match self.endpoint {
                    Endpoint::Chat => json!({
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": lp,
                        "finish_reason": finish,
                    }),
                    Endpoint::Completion => json!({
                        "index": i, "text": c.text, "logprobs": lp, "finish_reason": finish,
                    }),
                }
            })
            .collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": list,
            "usage": self.usage(choices),
        })
    }

    fn chunk(&self, choice: Value) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The opening chunk of choice `i` (chat: the assistant role and empty content; none for
    /// completions).
    pub fn opening(&self, i: usize) -> Option<Value> {
        (self.endpoint == Endpoint::Chat).then(|| {
            self.chunk(json!({
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": Value::Null,
                "finish_reason": Value::Null,
            }))
        })
    }

    /// The chunk of choice `i`'s new `text` (`offset`: bytes of its text streamed before).
    pub fn text_chunk(&self, i: usize, text: &str, lp: &[LogprobEntry], offset: usize) -> Value {
        let lp = self.logprobs_json(lp, offset);
        match self.endpoint {
            Endpoint::Chat => self.chunk(json!({
                "index": i, "delta": {"content": text}, "logprobs": lp, "finish_reason": Value::Null,
            })),
            Endpoint::Completion => self.chunk(json!({
                "index": i, "text": text, "logprobs": lp, "finish_reason": Value::Null,
            })),
        }
    }

    /// The last chunk of choice `i`.
    pub fn closing(&self, i: usize, finish: Finish) -> Value {
        match self.endpoint {
            Endpoint::Chat => self.chunk(json!({
                "index": i, "delta": {}, "logprobs": Value::Null, "finish_reason": finish.as_str(),
            })),
            Endpoint::Completion => self.chunk(json!({
                "index": i, "text": "", "logprobs": Value::Null, "finish_reason": finish.as_str(),
            })),
        }
    }

    /// The usage chunk after every choice ended (`choices` empty, as OpenAI sends it).
    pub fn usage_chunk(&self, choices: &[ChoiceResult]) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(choices),
        })
    }
}

/// Fold one event into the choices; returns the engine's error message for
/// [`Event::Failed`].
pub fn apply(choices: &mut [ChoiceResult], ev: Event) -> Result<(), String> {
    match ev {
        Event::Text {
            choice,
            text,
            logprobs,
        } => {
            let c = &mut choices[choice];
            c.text.push_str(&text);
            c.logprobs.extend(logprobs);
        }
        Event::Done {
            choice,
            finish,
            completion_tokens,
            cached_tokens,
        } => {
            let c = &mut choices[choice];
            c.finish = Some(finish);
            c.completion_tokens = completion_tokens;
            c.cached_tokens = cached_tokens;
        }
        Event::Failed(msg) => return Err(msg),
    }
    Ok(())
}
