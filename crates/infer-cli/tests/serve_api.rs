//! `infer serve` end to end: a real server process on a loopback port, SmolLM2 (default q4k
//! plan), spoken to over HTTP/1.1. Greedy outputs are compared with `infer run` and with the
//! same requests run one at a time; the chunk protocol, usage counts, stop strings, logprobs,
//! seeds, errors, cancellation, the queue bound and SIGTERM are checked on real responses.

mod common;
mod serve_common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_common::{smol_vindex, stream_text, Server};

/// A greedy completion request. `cache_prompt: false`: the prompt runs whole every time, so
/// repeated requests get the same logits, hence the same tokens. (Through the prefix cache
/// the prompt's last tokens run in another chunk, whose logits are equal only to rounding and
/// can flip a near-tie: tested apart, in `chat_logprobs_n_and_seeds`.)
fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "cache_prompt": false})
}

fn ok_json(r: serve_common::Resp) -> Value {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn streamed(body: &Value) -> Value {
    let mut b = body.clone();
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    b
}

/// `infer_requests_total` of HTTP status `status` (summed over endpoints and finish reasons).
fn requests_with_status(srv: &Server, status: u16) -> f64 {
    let r = srv.request("GET", "/metrics", &[], "");
    assert_eq!(r.status, 200);
    let label = format!("status=\"{status}\"");
    r.body
        .lines()
        .filter(|l| l.starts_with("infer_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A metric's value in the Prometheus text of `/metrics` (summed over label sets).
fn metric(srv: &Server, name: &str) -> f64 {
    let r = srv.request("GET", "/metrics", &[], "");
    assert_eq!(r.status, 200);
    r.body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn completions_equal_infer_run_streamed_or_not_with_stop_and_max_tokens() {
    let vx = smol_vindex();
    let srv = Server::start(vx, &["--parallel", "2", "--ctx-size", "256"]);
    let prompt = "The three primary colors are";
    let n = 24;
    let o = common::infer(&["run", vx.to_str().unwrap(), prompt, "-n", &n.to_string()]);
    assert!(o.status.success(), "{}", common::text(&o));
    let run_text = String::from_utf8(o.stdout).unwrap();
    let run_text = run_text.strip_suffix('\n').unwrap();
    assert!(run_text.len() > 20, "{run_text:?}");

    let v = ok_json(srv.post("/v1/completions", &completion(prompt, n)));
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, run_text, "server vs infer run");
    let prompt_ids = ok_json(srv.post(
        "/tokenize",
        &json!({"content": prompt, "add_special": true}),
    ))["tokens"]
        .as_array()
        .unwrap()
        .len();
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], prompt_ids);
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    if finish == "length" {
        assert_eq!(usage["completion_tokens"], n);
    }
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(prompt_ids as u64 + usage["completion_tokens"].as_u64().unwrap())
    );
    // /detokenize of /tokenize is the text.
    let ids = ok_json(srv.post("/tokenize", &json!({"content": text})))["tokens"].clone();
    assert_eq!(
        ok_json(srv.post("/detokenize", &json!({"tokens": ids})))["content"],
        text
    );

    // Streamed: the same text, the same usage, reported once at the end.
    let events = srv
        .stream("/v1/completions", &streamed(&completion(prompt, n)))
        .all();
    let (st, sf, su) = stream_text(&events, 1);
    assert_eq!(st[0], text);
    assert_eq!(sf[0], finish);
    let su = su.expect("usage chunk");
    assert_eq!(su["prompt_tokens"], usage["prompt_tokens"]);
    assert_eq!(su["completion_tokens"], usage["completion_tokens"]);

    // max_tokens: a prefix of the longer greedy text, finish "length", exact count.
    let v = ok_json(srv.post("/v1/completions", &completion(prompt, 5)));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let short = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(short) && short.len() < text.len(),
        "{short:?} / {text:?}"
    );

    // A stop string from the middle of the greedy text: cut before it, streamed or not, and
    // no chunk ever shows its start.
    let words: Vec<&str> = text.split(' ').filter(|w| w.len() >= 4).collect();
    let stop = format!(" {}", words[words.len() / 2]);
    let at = text.find(&stop).unwrap();
    let mut body = completion(prompt, n);
    body["stop"] = json!([stop.clone(), "\u{1F600}never"]);
    let v = ok_json(srv.post("/v1/completions", &body));
    assert_eq!(v["choices"][0]["text"], &text[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let events = srv.stream("/v1/completions", &streamed(&body)).all();
    let (st, sf, _) = stream_text(&events, 1);
    assert_eq!((st[0].as_str(), sf[0].as_str()), (&text[..at], "stop"));
}

#[test]
fn chat_logprobs_n_and_seeds() {
    let vx = smol_vindex();
    let srv = Server::start(vx, &["--parallel", "4", "--ctx-size", "256"]);
    let msgs = json!([{"role": "system", "content": "You are brief."},
                      {"role": "user", "content": "Name a fruit."}]);
    let greedy = json!({"messages": msgs, "max_tokens": 12, "temperature": 0,
                        "logprobs": true, "top_logprobs": 3, "cache_prompt": false});
    let v = ok_json(srv.post("/v1/chat/completions", &greedy));
    assert_eq!(v["object"], "chat.completion");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    let text = c["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    // Greedy: every chosen token is the top-1 alternative, log-probabilities are ≤ 0 and
    // sorted, and the tokens spell the text.
    let lp = c["logprobs"]["content"].as_array().unwrap();
    let mut spelled = String::new();
    for e in lp {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"]);
        assert!(
            (top[0]["logprob"].as_f64().unwrap() - e["logprob"].as_f64().unwrap()).abs() < 1e-6
        );
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        spelled.push_str(e["token"].as_str().unwrap());
    }
    assert_eq!(spelled, text);
    // Streamed chat: role first, the same text.
    let events = srv.stream("/v1/chat/completions", &streamed(&greedy)).all();
    let (st, _, usage) = stream_text(&events, 1);
    assert_eq!(st[0], text);
    assert_eq!(
        usage.unwrap()["completion_tokens"],
        v["usage"]["completion_tokens"]
    );

    // n = 3 sampled with a seed: reproducible, per-choice seeds differ.
    let sampled = json!({"messages": msgs, "max_tokens": 12, "temperature": 1.0, "top_k": 0,
                         "top_p": 1.0, "min_p": 0.0, "seed": 42, "n": 3, "cache_prompt": false});
    let a = ok_json(srv.post("/v1/chat/completions", &sampled));
    let b = ok_json(srv.post("/v1/chat/completions", &sampled));
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(texts(&a).len(), 3);
    assert_eq!(texts(&a), texts(&b), "same seed, same choices");
    assert!(
        texts(&a).iter().any(|t| t != &texts(&a)[0]),
        "choices differ: {:?}",
        texts(&a)
    );
    let total: u64 = a["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((3..=36).contains(&total), "{total}");
    // The streamed n = 3 equals the non-streamed one.
    let events = srv
        .stream("/v1/chat/completions", &streamed(&sampled))
        .all();
    assert_eq!(stream_text(&events, 3).0, texts(&a));

    // Completions' logprobs shape (legacy): tokens, token_logprobs, top_logprobs, text_offset.
    let mut body = completion("Once upon a time", 6);
    body["logprobs"] = json!(2);
    let v = ok_json(srv.post("/v1/completions", &body));
    let l = &v["choices"][0]["logprobs"];
    assert_eq!(l["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(l["text_offset"][0], 0);

    // A repeated prompt reuses its cached prefix (all but its last token, which must run to
    // give logits); the first position's log-probabilities equal the uncached ones to 1e-3.
    body["cache_prompt"] = json!(true);
    let again = ok_json(srv.post("/v1/completions", &body));
    let prompt_tokens = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt_tokens - 1)
    );
    let first = |v: &Value| v["choices"][0]["logprobs"]["top_logprobs"][0].clone();
    let (fresh, cached) = (first(&v), first(&again));
    for (tok, lp) in fresh.as_object().unwrap() {
        if let Some(c) = cached.get(tok) {
            assert!(
                (c.as_f64().unwrap() - lp.as_f64().unwrap()).abs() < 1e-3,
                "{tok}: {c} vs {lp}"
            );
        }
    }
    assert!(fresh
        .as_object()
        .unwrap()
        .keys()
        .any(|k| cached.get(k).is_some()));
}

#[test]
fn multibyte_utf8_streams_intact() {
    let vx = smol_vindex();
    let srv = Server::start(vx, &["--parallel", "1", "--ctx-size", "256"]);
    for prompt in [
        "日本の首都は東京です。中国の首都は",
        "I love emoji: 😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍",
    ] {
        // The prompt runs whole both times (`cache_prompt: false`): the same logits, so the
        // same greedy tokens; only their release in pieces differs. (From the prefix cache the
        // last prompt token runs alone, and its logits, equal only to rounding, flip a near-tie
        // of this prompt.)
        let mut body = completion(prompt, 24);
        body["cache_prompt"] = json!(false);
        let v = ok_json(srv.post("/v1/completions", &body));
        let text = v["choices"][0]["text"].as_str().unwrap();
        assert!(!text.contains('\u{FFFD}'), "{text:?}");
        assert!(
            text.chars().any(|c| c.len_utf8() > 1),
            "no multi-byte output: {text:?}"
        );
        let events = srv.stream("/v1/completions", &streamed(&body)).all();
        let (st, _, _) = stream_text(&events, 1);
        assert_eq!(st[0], text, "streamed pieces join to the same text");
    }
}

#[test]
fn concurrent_streams_equal_the_same_requests_one_at_a_time() {
    let vx = smol_vindex();
    // Each prompt runs whole in one step (no cached prefix, a budget above 16 prompts), alone
    // or batched: forward_batch then gives each the logits it gets alone (tests/batch.rs),
    // so the same greedy tokens. (A prompt split into other chunks, or partly taken from the
    // prefix cache, is equal only to rounding.)
    let srv = Server::start(
        vx,
        &[
            "--parallel",
            "16",
            "--ctx-size",
            "128",
            "--batch-tokens",
            "2048",
        ],
    );
    let prompts: Vec<String> = (0..32)
        .map(|i| {
            format!(
                "Write a short note number {i} about {}",
                ["cats", "rain", "ships", "tea"][i % 4]
            )
        })
        .collect();
    let body = |p: &str| {
        json!({"messages": [{"role": "user", "content": p}], "max_tokens": 12, "temperature": 0,
               "cache_prompt": false})
    };
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            ok_json(srv.post("/v1/chat/completions", &body(p)))["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let srv = &srv;
                let b = streamed(&body(p));
                s.spawn(move || {
                    stream_text(&srv.stream("/v1/chat/completions", &b).all(), 1)
                        .0
                        .remove(0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // Every sequence ended: no KV positions are held by running sequences.
    assert_eq!(metric(&srv, "infer_kv_cache_used_positions"), 0.0);
}

#[test]
fn malformed_requests_get_4xx_cancellation_frees_and_the_server_still_serves() {
    let vx = smol_vindex();
    let srv = Server::start(
        vx,
        &[
            "--parallel",
            "2",
            "--ctx-size",
            "256",
            "--max-body",
            "65536",
        ],
    );
    let good = completion("Hello, my name is", 8);
    let before = ok_json(srv.post("/v1/completions", &good))["choices"][0]["text"].clone();
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/chat/completions", "{\"messages\": [".into(), 400, None),
        ("/v1/chat/completions", "[1, 2]".into(), 400, None),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": "warm"})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": -1})),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 7})),
            400,
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"best_of": 3})),
            400,
            Some("best_of"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": [{"type": "function"}]})),
            400,
            Some("tools"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": "gpt-4o"})),
            404,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            "{\"messages\": \"hi\"}".into(),
            400,
            Some("messages"),
        ),
        (
            "/v1/completions",
            "{\"prompt\": 5}".into(),
            400,
            Some("prompt"),
        ),
        // A field of the other endpoint is refused by name, not ignored.
        (
            "/v1/chat/completions",
            chat(json!({"prompt": "Say no."})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 100000}).to_string(),
            400,
            None,
        ),
        ("/v1/nothing", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in &cases {
        let r = srv.request("POST", path, &[], body);
        assert_eq!(r.status, *status, "{path} {body}: {}", r.body);
        let e = &r.json()["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            r.body
        );
        assert!(e["type"].is_string(), "{}", r.body);
        if let Some(p) = param {
            assert_eq!(e["param"], *p, "{}", r.body);
        }
    }
    // The context check names the numbers.
    let r = srv.post(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 100000}),
    );
    let e = &r.json()["error"];
    assert_eq!(e["type"], "exceed_context_size_error");
    assert_eq!(e["n_ctx"], 256);
    // A body over --max-body.
    let big = json!({"prompt": "a ".repeat(40000)}).to_string();
    let r = srv.request("POST", "/v1/completions", &[], &big);
    assert_eq!(r.status, 413);
    let m = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        m.contains("larger than the server's --max-body limit of 65536 bytes"),
        "413 names the option and its limit: {m}"
    );
    // A whole number past u64 is out of range (not "not an integer").
    let r = srv.request(
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "x", "max_tokens": 99999999999999999999}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("is outside"), "{}", r.body);
    // The wrong method: 405 with the OpenAI error body.
    let r = srv.request("GET", "/v1/completions", &[], "");
    assert_eq!(r.status, 405);
    assert_eq!(
        r.json()["error"]["type"],
        "invalid_request_error",
        "{}",
        r.body
    );

    // Cancellation mid-stream: read a few chunks, hang up; the slot is freed.
    let cancelled0 = metric(&srv, "infer_sequences_cancelled_total");
    let mut s = srv.stream(
        "/v1/completions",
        &streamed(&completion("Tell me a long story:", 200)),
    );
    for _ in 0..3 {
        assert!(s.next_data().is_some());
    }
    drop(s);
    let t0 = Instant::now();
    while metric(&srv, "infer_sequences_cancelled_total") <= cancelled0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the cancelled sequence was not freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(&srv, "infer_kv_cache_used_positions"), 0.0);
    // Still serving, and the same answer as before.
    let after = ok_json(srv.post("/v1/completions", &good))["choices"][0]["text"].clone();
    assert_eq!(after, before);
    let models = ok_json(srv.request("GET", "/v1/models", &[], ""));
    assert_eq!(models["data"][0]["id"], "smol.vindex");
}

#[test]
fn api_key_queue_bound_and_sigterm() {
    let vx = smol_vindex();
    let srv = Server::start(
        vx,
        &[
            "--parallel",
            "1",
            "--ctx-size",
            "512",
            "--max-queue",
            "1",
            "--api-key",
            "sekret",
        ],
    );
    let body = json!({"prompt": "Count: one, two, three,", "max_tokens": 400, "temperature": 0, "ignore_eos": true,
                      "stream": true});
    assert_eq!(
        srv.request("GET", "/health", &[], "").status,
        200,
        "/health is public"
    );
    let r = srv.request("POST", "/v1/completions", &[], &body.to_string());
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let wrong = [("Authorization", "Bearer nope")];
    assert_eq!(srv.request("GET", "/v1/models", &wrong, "").status, 401);
    let auth = [("Authorization", "Bearer sekret")];
    assert_eq!(srv.request("GET", "/v1/models", &auth, "").status, 200);

    // One running (the only slot), one queued, the next refused with 503 + Retry-After.
    let open = |b: &Value| {
        let c = srv
            .open("POST", "/v1/completions", &auth, &b.to_string())
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        std::io::BufReader::new(c)
    };
    use std::io::{BufRead, Read};
    let mut first = open(&body);
    let mut line = String::new();
    first.read_line(&mut line).unwrap();
    assert!(line.contains(" 200 "), "{line}");
    // Wait for its first token so it holds the slot.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let mut b = [0u8; 256];
        let k = first.read(&mut b).unwrap();
        assert!(k > 0);
        seen.extend_from_slice(&b[..k]);
    }
    let mut second = open(&json!({"prompt": "Hi", "max_tokens": 4, "temperature": 0}));
    let t0 = Instant::now();
    while metric_auth(&srv, "infer_requests_waiting") < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the second request never queued"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let third = srv.request(
        "POST",
        "/v1/completions",
        &auth,
        &json!({"prompt": "Hi"}).to_string(),
    );
    assert_eq!(third.status, 503, "{}", third.body);
    assert_eq!(third.header("retry-after"), Some("1"));

    // SIGTERM: running and queued requests finish, then exit 0.
    let pid = srv.child.id() as i32;
    // SAFETY: kill(2) on the pid of our own child process; no memory is touched.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let mut rest = String::new();
    first.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let mut rest2 = String::new();
    second.read_to_string(&mut rest2).unwrap();
    assert!(rest2.starts_with("HTTP/1.1 200"), "{rest2}");
    let mut srv = srv;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = srv.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{}", srv.stderr.lock().unwrap());
}

fn metric_auth(srv: &Server, name: &str) -> f64 {
    let r = srv.request("GET", "/metrics", &[("Authorization", "Bearer sekret")], "");
    r.body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resident memory of a process in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Memory stays bounded over many distinct requests: after a warm-up, 800 more distinct prompts
/// (16 clients) grow the resident set by less than 16 MiB, and no KV position stays held.
/// (The issue asks for 2,000: `scripts/load.py --requests 2000` does that run; 800 keeps CI
/// time small, and a per-request leak of even 20 KiB would exceed the bound.)
#[test]
fn memory_is_stable_over_distinct_prompts() {
    let vx = smol_vindex();
    let srv = Server::start(vx, &["--parallel", "16", "--ctx-size", "64"]);
    let run = |from: usize, count: usize| {
        std::thread::scope(|s| {
            for t in 0..16 {
                let srv = &srv;
                s.spawn(move || {
                    for i in (from + t..from + count).step_by(16) {
                        let r = srv.post("/v1/completions", &completion(&format!("Item {i}:"), 1));
                        assert_eq!(r.status, 200, "{}", r.body);
                    }
                });
            }
        })
    };
    run(0, 160);
    let before = rss_kib(srv.child.id());
    run(160, 800);
    let after = rss_kib(srv.child.id());
    eprintln!("RSS after warm-up {before} KiB, after 800 more requests {after} KiB");
    assert!(after < before + 16 * 1024, "RSS {before} → {after} KiB");
    assert_eq!(metric(&srv, "infer_kv_cache_used_positions"), 0.0);
    assert!(metric(&srv, "infer_requests_total") >= 960.0);
}

/// `--timeout`: a request that runs past it gets a 408 with the OpenAI error body (the timeout
/// layer's own answer is empty), and the server still serves.
#[test]
fn a_request_past_the_timeout_gets_an_openai_408() {
    let srv = Server::start(smol_vindex(), &["--timeout", "1"]);
    let long = json!({"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
        "ignore_eos": true, "cache_prompt": false});
    let r = srv.post("/v1/completions", &long);
    assert_eq!(r.status, 408, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["type"], "timeout_error", "{e}");
    assert_eq!(e["error"]["code"], "timeout", "{e}");
    // Counted by status (newcomer finding: a 408 was missing from infer_requests_total).
    assert_eq!(requests_with_status(&srv, 408), 1.0);
    let ok = ok_json(srv.post("/v1/completions", &completion("Hello", 2)));
    assert_eq!(ok["choices"][0]["finish_reason"], "length", "{ok}");
}

/// `n > 1`: the prompt is prefilled once (in choice 0's slot) and its KV rows copied to the
/// other choices' slots: `infer_prompt_tokens_total` rises by the prompt length, not n times
/// it. Each choice then samples from the same last-position logits with its own seed
/// (seed + i), so the choices equal n separate requests with seeds seed, seed + 1, …, and the
/// streamed request gives the same. Through the prefix cache, a repeated n = 4 request runs
/// only the prompt's last token, once.
#[test]
fn n_choices_share_one_prefill() {
    let srv = Server::start(smol_vindex(), &["--parallel", "4", "--ctx-size", "256"]);
    let msgs = json!([{"role": "user", "content": "Write one sentence about the sea."}]);
    let body = |n: usize, seed: u64| {
        json!({"messages": msgs, "max_tokens": 10, "temperature": 1.0, "top_k": 0,
               "top_p": 1.0, "min_p": 0.0, "seed": seed, "n": n, "cache_prompt": false})
    };
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect()
    };
    let (p0, g0) = (
        metric(&srv, "infer_prompt_tokens_total"),
        metric(&srv, "infer_generated_tokens_total"),
    );
    let v = ok_json(srv.post("/v1/chat/completions", &body(4, 7)));
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    assert!(prompt_tokens > 5.0, "{v}");
    assert_eq!(
        metric(&srv, "infer_prompt_tokens_total") - p0,
        prompt_tokens,
        "an n = 4 request runs its prompt once"
    );
    assert_eq!(
        metric(&srv, "infer_generated_tokens_total") - g0,
        v["usage"]["completion_tokens"].as_f64().unwrap()
    );
    let together = texts(&v);
    assert_eq!(together.len(), 4);
    assert!(
        together.iter().any(|t| t != &together[0]),
        "choices differ: {together:?}"
    );
    let alone: Vec<String> = (0..4)
        .map(|i| texts(&ok_json(srv.post("/v1/chat/completions", &body(1, 7 + i))))[0].clone())
        .collect();
    assert_eq!(together, alone, "choice i = a request with seed + i");
    let events = srv
        .stream("/v1/chat/completions", &streamed(&body(4, 7)))
        .all();
    assert_eq!(stream_text(&events, 4).0, together);

    // From the prefix cache: only the last prompt token runs, once for the four choices.
    let p1 = metric(&srv, "infer_prompt_tokens_total");
    let mut cached = body(4, 7);
    cached["cache_prompt"] = json!(true);
    let v = ok_json(srv.post("/v1/chat/completions", &cached));
    assert_eq!(metric(&srv, "infer_prompt_tokens_total") - p1, 1.0);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_f64(),
        Some(prompt_tokens - 1.0)
    );
    assert_eq!(texts(&v).len(), 4);
    assert_eq!(metric(&srv, "infer_kv_cache_used_positions"), 0.0);
}

/// `infer serve ARGS` with a deadline: its exit status and stderr, or a panic naming what it
/// printed when it is still running (it listened instead of refusing).
fn serve_refused(args: &[&str]) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} was accepted: {err}");
    assert!(!err.contains("listening"), "{args:?} listened first: {err}");
    err
}

/// Newcomer findings: `--max-body 0` was accepted; `--ctx-size 0` said `--ctx` and came after
/// "listening on"; a missing vindex was "not a vindex folder". Every flag and the path are now
/// checked before listening, each error naming the flag as typed (`--ctx` for run), and a
/// missing path is reported as `infer run` reports it.
#[test]
fn bad_flags_and_paths_are_refused_before_listening() {
    let vx = smol_vindex().to_str().unwrap();
    for (args, want) in [
        (
            ["--max-body", "0"],
            "error: --max-body 0: must be at least 1",
        ),
        (
            ["--ctx-size", "0"],
            "error: --ctx-size must be at least 1\n",
        ),
        (
            ["--ctx-size", "9000"],
            "error: --ctx-size 9000 exceeds the model's maximum context 8192",
        ),
    ] {
        let err = serve_refused(&[&[vx][..], &args].concat());
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let o = common::infer(&["run", vx, "hi", "-c", "0"]);
    assert!(!o.status.success());
    assert!(
        common::text(&o).contains("error: --ctx must be at least 1\n"),
        "{}",
        common::text(&o)
    );

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexist.vindex");
    let missing = missing.to_str().unwrap();
    let err = serve_refused(&[missing]);
    let want = format!("error: opening vindex {missing}: {missing} does not exist");
    assert!(err.contains(&want), "{err}");
    let run = common::text(&common::infer(&["run", missing, "hi"]));
    assert!(run.contains(&want), "run and serve say the same: {run}");
}

/// Newcomer findings: `--max-queue 0` and `--timeout 0` were taken as 1 without a word;
/// `--device cuda` in a build without CUDA was refused only after "listening on"; and
/// `--parallel 1024 --ctx-size 8192` (360 GiB of KV cache for SmolLM2) said "listening on",
/// then grew until the OOM killer ended it. Each is now an error before listening.
#[test]
fn impossible_queue_timeout_device_and_kv_size_are_refused_before_listening() {
    let vx = smol_vindex().to_str().unwrap();
    for (args, want) in [
        (
            ["--max-queue", "0"],
            "error: --max-queue 0: must be at least 1",
        ),
        (["--timeout", "0"], "error: --timeout 0: must be at least 1"),
    ] {
        let err = serve_refused(&[&[vx][..], &args].concat());
        assert!(err.contains(want), "{args:?}: {err}");
    }
    #[cfg(not(feature = "cuda"))]
    {
        let err = serve_refused(&[vx, "--device", "cuda"]);
        assert!(err.contains("built without CUDA"), "{err}");
    }
    // A KV cache type the CPU cannot store (a newcomer saw it refused only after "listening").
    let err = serve_refused(&[vx, "--kv-type", "q8_0"]);
    assert!(
        err.contains("--kv-type q8_0: the CPU backend stores its KV cache as f32 or f16 only"),
        "{err}"
    );
    // 30 layers × 3 KV heads × 64 × 8 bytes (f32 K and V) per position.
    let need = 1024.0 * 8192.0 * 46080.0;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> f64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l[key.len()..].split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::INFINITY)
    };
    let available = (kib("MemAvailable:") + kib("SwapFree:")) * 1024.0;
    if need > available {
        let err = serve_refused(&[vx, "--parallel", "1024", "--ctx-size", "8192"]);
        assert!(
            err.contains(
                "KV cache: --parallel 1024 slots × --ctx-size 8192 positions need 360.0 GiB"
            ) && err.contains("lower --parallel or --ctx-size"),
            "{err}"
        );
    } else {
        eprintln!("skipped the KV-size refusal: {available} bytes available");
    }
}

/// Newcomer findings: a non-streamed request whose client hung up was missing from
/// `infer_requests_total` (a stream counted 499); `stream_options.include_usage` of the wrong
/// type named the field twice; a prompt list mixing ids and text was called "several prompts";
/// megabytes of stop strings slowed every engine step (they are clipped to the text's length:
/// `serve::choice` tests the speed; here they still cut where they match, and only there).
#[test]
fn hangups_are_counted_and_huge_stop_strings_still_match() {
    let srv = Server::start(smol_vindex(), &["--parallel", "2", "--ctx-size", "512"]);
    // A client that hangs up while its non-streamed answer is generated: counted as 499.
    let long = json!({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
        "ignore_eos": true});
    let c = srv
        .open("POST", "/v1/completions", &[], &long.to_string())
        .unwrap();
    let t0 = Instant::now();
    while metric(&srv, "infer_sequences_running") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    while requests_with_status(&srv, 499) < 1.0
        || metric(&srv, "infer_sequences_cancelled_total") < 1.0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the hang-up was not counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    for (body, param, message) in [
        (
            json!({"prompt": "x", "stream_options": {"include_usage": 1}}),
            "stream_options.include_usage",
            "stream_options.include_usage: expected true or false, got 1",
        ),
        (
            json!({"prompt": [1, "a"]}),
            "prompt",
            "prompt: expected a string or a list of token ids",
        ),
    ] {
        let r = srv.post("/v1/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{e}");
        assert!(e["message"].as_str().unwrap().starts_with(message), "{e}");
    }

    // Stop strings of megabytes: the one that matches cuts the text there.
    let plain = ok_json(srv.post("/v1/completions", &completion("1, 2, 3, 4,", 30)));
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    let cut = text
        .find(" 7")
        .unwrap_or_else(|| panic!("the model counts on: {text}"));
    let mut huge = completion("1, 2, 3, 4,", 30);
    huge["stop"] = json!([
        "x".repeat(2_000_000),
        format!(" 7{}", "y".repeat(2_000_000)),
        format!(" 7{}", &text[cut + 2..]),
    ]);
    let v = ok_json(srv.post("/v1/completions", &huge));
    assert_eq!(v["choices"][0]["text"], text[..cut], "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
}

/// Newcomer findings: `Authorization: bearer KEY` was refused (the scheme is
/// case-insensitive, RFC 9110); `GET /v1/models/{id}` (the `openai` client's
/// `models.retrieve`) was 404 "no such endpoint".
#[test]
fn bearer_scheme_any_case_and_model_retrieve() {
    let srv = Server::start(smol_vindex(), &["--parallel", "1", "--api-key", "sekret"]);
    for (auth, status) in [
        ("bearer sekret", 200),
        ("BEARER sekret", 200),
        ("Bearer  sekret", 200),
        ("Basic sekret", 401),
        ("Bearer", 401),
        ("sekret", 401),
    ] {
        let r = srv.request("GET", "/v1/models", &[("Authorization", auth)], "");
        assert_eq!(r.status, status, "{auth}: {}", r.body);
    }
    let auth = [("Authorization", "Bearer sekret")];
    let r = srv.request("GET", "/v1/models/smol.vindex", &auth, "");
    let m = ok_json(r);
    assert_eq!(
        (m["id"].as_str(), m["object"].as_str()),
        (Some("smol.vindex"), Some("model"))
    );
    let listed = ok_json(srv.request("GET", "/v1/models", &auth, ""));
    assert_eq!(listed["data"][0], m);
    let r = srv.request("GET", "/models/gpt-4", &auth, "");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert_eq!(
        srv.request("GET", "/v1/models/smol.vindex", &[], "").status,
        401
    );
}
