//! A real `infer serve` process on a loopback port, and a minimal HTTP/1.1 client for it
//! (requests with `Connection: close`; chunked bodies decoded; SSE events read one by one).

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The real SmolLM2 GGUF extracted once per test binary (default q4k plan), kept for the
/// binary's lifetime.
pub fn smol_vindex() -> &'static Path {
    static VX: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &VX.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let vx = dir.path().join("smol.vindex");
        let gguf = super::common::model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
        let o = super::common::infer(&[
            "extract",
            gguf.to_str().unwrap(),
            "-o",
            vx.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", super::common::text(&o));
        (dir, vx)
    })
    .1
}

/// A running `infer serve`; killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Start `infer serve VX --port 0 ARGS` and wait until `/health` says ok.
    pub fn start(vx: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["serve", vx.to_str().unwrap(), "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn infer serve");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    let _ = tx.send(port.parse::<u16>().unwrap());
                }
                log2.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no port: {}", log.lock().unwrap()));
        let s = Server {
            child,
            port,
            stderr: log,
        };
        let t0 = Instant::now();
        loop {
            if let Ok(r) = s.try_request("GET", "/health", &[], "") {
                if r.status == 200 {
                    break;
                }
                assert_eq!(r.status, 503, "{}", r.body);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "server never became ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<Resp> {
        let mut s = self.open(method, path, headers, body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        Ok(Resp::parse(&raw))
    }

    /// One request; the whole response.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// POST a JSON body; the response.
    pub fn post(&self, path: &str, body: &Value) -> Resp {
        self.request("POST", path, &[], &body.to_string())
    }

    /// Send a request and return the connection, the response still to read.
    pub fn open(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<TcpStream> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(300)))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        s.write_all(body.as_bytes())?;
        Ok(s)
    }

    /// POST a streaming request; the SSE reader after the response head (status checked 200).
    pub fn stream(&self, path: &str, body: &Value) -> SseReader {
        let s = self.open("POST", path, &[], &body.to_string()).unwrap();
        let mut r = BufReader::new(s);
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.contains(" 200 "), "{status}");
        let mut chunked = false;
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            if l.to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked")
            {
                chunked = true;
            }
            if l == "\r\n" {
                break;
            }
        }
        assert!(chunked, "SSE responses are chunked");
        SseReader {
            r,
            buf: Vec::new(),
            done: false,
        }
    }
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    fn parse(raw: &[u8]) -> Resp {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("response head");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        if headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v == "chunked")
        {
            body = dechunk(&body);
        }
        Resp {
            status,
            headers,
            body: String::from_utf8(body).expect("UTF-8 body"),
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.as_str())
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// Reads the `data:` payloads of an SSE body (chunked transfer encoding), comments skipped.
pub struct SseReader {
    r: BufReader<TcpStream>,
    buf: Vec<u8>,
    done: bool,
}

impl SseReader {
    /// The next `data:` payload, `None` at the end of the body.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = self.buf.drain(..end + 2).collect();
                let ev = String::from_utf8(ev).expect("an SSE event is whole UTF-8");
                let data: Vec<&str> = ev
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                    .collect();
                if data.is_empty() {
                    continue; // a comment (`: keepalive`)
                }
                return Some(data.join("\n"));
            }
            if self.done {
                return None;
            }
            let mut size = String::new();
            if self.r.read_line(&mut size).ok()? == 0 {
                self.done = true;
                continue;
            }
            let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
            if n == 0 {
                self.done = true;
                continue;
            }
            let mut chunk = vec![0; n + 2];
            self.r.read_exact(&mut chunk).ok()?;
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Every remaining payload up to and including `[DONE]`.
    pub fn all(mut self) -> Vec<String> {
        let mut v = Vec::new();
        while let Some(d) = self.next_data() {
            let end = d == "[DONE]";
            v.push(d);
            if end {
                break;
            }
        }
        v
    }
}

/// The text a stream carried for choice `i` (chat `delta.content` or completion `text`), its
/// finish_reason, and the usage chunk if any. Checks the chunk protocol on the way: `[DONE]`
/// last, the role first (chat), one finish_reason per choice, nothing after it.
pub fn stream_text(events: &[String], n: usize) -> (Vec<String>, Vec<String>, Option<Value>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = vec![String::new(); n];
    let mut finish = vec![String::new(); n];
    let mut role_seen = vec![false; n];
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|_| panic!("{e}"));
        assert!(v.get("error").is_none(), "{e}");
        if v["choices"].as_array().unwrap().is_empty() {
            usage = Some(v["usage"].clone());
            continue;
        }
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            assert!(
                finish[i].is_empty(),
                "a chunk after choice {i} finished: {e}"
            );
            if let Some(d) = c.get("delta") {
                if d.get("role").is_some() {
                    assert!(
                        !role_seen[i] && text[i].is_empty(),
                        "role twice or late: {e}"
                    );
                    role_seen[i] = true;
                } else {
                    assert!(role_seen[i], "no role chunk first: {e}");
                }
                text[i].push_str(d["content"].as_str().unwrap_or(""));
            } else {
                text[i].push_str(c["text"].as_str().unwrap());
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish[i] = f.to_string();
            }
        }
    }
    assert!(
        finish.iter().all(|f| !f.is_empty()),
        "a choice without finish_reason: {events:?}"
    );
    (text, finish, usage)
}
