#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (`infer serve`, llama-server, vLLM).

N concurrent clients each send streamed /v1/completions requests back to back for a fixed
time or count; every request has a prompt of exactly --prompt-tokens token ids (random per
request, so no prefix is shared) and asks for exactly --max-tokens tokens (`ignore_eos`).
Reports request throughput, output tokens/s, time to first token and inter-token latency
(mean, p50, p99). Standard library only.

    python3 scripts/load.py --url http://127.0.0.1:8080 -c 8 --requests 32
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def one_request(url, body, headers):
    """Send one streamed request; return (ttft, [inter-token gaps], completion tokens)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, last, gaps, tokens, usage = None, None, [], 0, None
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    continue
                v = json.loads(data)
                if v.get("usage"):
                    usage = v["usage"]
                for c in v.get("choices", []):
                    # A token whose text is held back (part of a UTF-8 character) comes with
                    # a later chunk; a first chunk without text but with the finish counts.
                    if c.get("text") or (ttft is None and c.get("finish_reason")):
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - t0
                        else:
                            gaps.append(now - last)
                        last = now
                        tokens += 1
    conn.close()
    if usage:
        tokens = usage["completion_tokens"]
    return ttft, gaps, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("-c", "--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=None,
                    help="total requests (default: 4 per client)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab-lo", type=int, default=1000, help="lowest random prompt token id")
    ap.add_argument("--vocab-hi", type=int, default=20000, help="highest random prompt token id")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON line of results")
    a = ap.parse_args()
    total = a.requests or 4 * a.clients
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = f"Bearer {a.api_key}"
    rng = random.Random(a.seed)
    bodies = []
    for _ in range(total):
        b = {"prompt": [rng.randint(a.vocab_lo, a.vocab_hi) for _ in range(a.prompt_tokens)],
             "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True,
             "stream": True, "stream_options": {"include_usage": True}}
        if a.model:
            b["model"] = a.model
        bodies.append(b)
    lock = threading.Lock()
    ttfts, gaps, out_tokens, errors, done_n = [], [], [0], [], [0]

    def client():
        while True:
            with lock:
                if not bodies:
                    return
                body = bodies.pop()
            try:
                t, g, n = one_request(a.url, body, headers)
            except Exception as e:  # reported, not fatal: the run goes on
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                done_n[0] += 1
                if t is not None:
                    ttfts.append(t)
                gaps.extend(g)
                out_tokens[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = done_n[0]
    res = {
        "clients": a.clients, "requests": done, "errors": len(errors),
        "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens, "wall_s": round(wall, 3),
        "req_per_s": round(done / wall, 3), "output_tok_per_s": round(out_tokens[0] / wall, 2),
        "ttft_ms": {"mean": 1e3 * statistics.fmean(ttfts) if ttfts else None,
                    "p50": 1e3 * percentile(ttfts, 50), "p99": 1e3 * percentile(ttfts, 99)},
        "itl_ms": {"mean": 1e3 * statistics.fmean(gaps) if gaps else None,
                   "p50": 1e3 * percentile(gaps, 50), "p99": 1e3 * percentile(gaps, 99)},
    }
    if a.json:
        print(json.dumps(res))
        return
    print(f"clients {a.clients}, {done} requests ({len(errors)} errors) of {a.prompt_tokens} prompt "
          f"+ {a.max_tokens} output tokens in {wall:.1f} s")
    print(f"  throughput   {res['req_per_s']:.2f} req/s, {res['output_tok_per_s']:.1f} output tok/s")
    for k in ("ttft_ms", "itl_ms"):
        m = res[k]
        if m["mean"] is not None:
            print(f"  {k[:-3].upper():<4} (ms)  mean {m['mean']:.1f}  p50 {m['p50']:.1f}  p99 {m['p99']:.1f}")
    if errors:
        print("  first error:", errors[0])


if __name__ == "__main__":
    main()
