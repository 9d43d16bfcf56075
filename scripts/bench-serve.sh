#!/usr/bin/env bash
# Side-by-side load: `infer serve` vs llama.cpp's `llama-server` on the same GGUF (Q4_K_M;
# infer on the default q4k vindex extracted from it), same thread count, one server at a time,
# the two interleaved (R rounds), scripts/load.py as the client: prompts of P random token ids,
# N output tokens (`ignore_eos`), at each client count C. Prints one markdown row per run and
# the medians.
#
# Usage: scripts/bench-serve.sh [-t 2] [-c "1 8 32"] [-p 128] [-n 128] [-r 2] [-m "smollm2 gemma3"]
# Env: INFER_CACHE (default ~/.cache/infer), LLAMA_CPP_BIN (a folder with llama-server and
# llama-quantize; default: the build of scripts/bench-vs-llamacpp.sh in $INFER_CACHE/peers).
# Needs an idle machine: both engines are CPU-bound at every client count.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/llamacpp.sh
source scripts/lib/llamacpp.sh
T=2 CLIENTS="1 8 32" P=128 N=128 R=2 MODELS="smollm2 gemma3"
while getopts "t:c:p:n:r:m:" o; do
  case $o in t) T=$OPTARG ;; c) CLIENTS=$OPTARG ;; p) P=$OPTARG ;; n) N=$OPTARG ;; r) R=$OPTARG ;; m) MODELS=$OPTARG ;; *) exit 2 ;; esac
done
cache="${INFER_CACHE:-$HOME/.cache/infer}"
bin="${LLAMA_CPP_BIN:-$(llamacpp_src "$cache/peers")/build/bin}"
for tool in llama-server llama-quantize; do
  [[ -x "$bin/$tool" ]] || { echo "bench-serve: no $bin/$tool: build llama.cpp (scripts/bench-vs-llamacpp.sh builds it; add the llama-server target)" >&2; exit 1; }
done
bash scripts/fetch-models.sh "$cache" >/dev/null
cargo build --release --quiet --bin infer
infer="${CARGO_TARGET_DIR:-target}/release/infer"
work="$cache/bench-serve"
mkdir -p "$work"
maxc=0
for c in $CLIENTS; do ((c > maxc)) && maxc=$c; done
ctx=$((P + N + 16))

# The Q4_K_M GGUF of each model (Gemma-3's file is one; SmolLM2's Q4_1 is requantized) and the
# infer vindex extracted from it.
prepare() {
  local m=$1 src g v
  case $m in
  smollm2) src="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" g="$work/smollm2-q4_k_m.gguf" ;;
  gemma3) src="$cache/models/gemma-3-270m-q4_k_m.gguf" g="$src" ;;
  *) echo "bench-serve: unknown model $m" >&2; exit 2 ;;
  esac
  [[ -f "$g" ]] || "$bin/llama-quantize" --allow-requantize "$src" "$g.part" Q4_K_M 2 >/dev/null 2>&1
  [[ -f "$g.part" ]] && mv "$g.part" "$g"
  v="$work/$m.vindex"
  [[ -d "$v" ]] || "$infer" extract "$g" -o "$v" >/dev/null
  echo "$g $v"
}

# Start a server in the background, wait until it answers, print its pid.
wait_up() {
  local port=$1 i
  for i in $(seq 1 600); do
    curl -fs "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "bench-serve: server on port $port did not come up" >&2
  return 1
}

run_load() {
  local engine=$1 model=$2 port=$3 c reqs
  for c in $CLIENTS; do
    reqs=$((c < 4 ? 4 : c))
    python3 scripts/load.py --url "http://127.0.0.1:$port" -c "$c" --requests "$reqs" \
      --prompt-tokens "$P" --max-tokens "$N" --json |
      ENGINE=$engine MODEL=$model C=$c python3 -c '
import json, os, sys
r = json.loads(sys.stdin.read())
r["ttft_p50"] = r["ttft_ms"]["p50"]
print(json.dumps({"engine": os.environ["ENGINE"], "model": os.environ["MODEL"], "clients": int(os.environ["C"]), **r}))'
  done
}

results="$work/results.jsonl"
: >"$results"
for m in $MODELS; do
  read -r gguf vindex < <(prepare "$m")
  for round in $(seq 1 "$R"); do
    "$infer" serve "$vindex" --port 18131 --threads "$T" --parallel "$maxc" --ctx-size "$ctx" \
      >"$work/infer-serve.log" 2>&1 &
    pid=$!
    wait_up 18131 && run_load infer "$m" 18131 >>"$results"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    "$bin/llama-server" -m "$gguf" --port 18132 -t "$T" -np "$maxc" -c $((ctx * maxc)) \
      >"$work/llama-server.log" 2>&1 &
    pid=$!
    wait_up 18132 && run_load llama-server "$m" 18132 >>"$results"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["model"], r["clients"])
print("| model | clients | infer output tok/s | llama-server output tok/s | ratio | infer TTFT p50 (ms) | llama-server TTFT p50 (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for k in sorted({key(r) for r in rows}):
    def med(engine, f):
        v = [r[f] for r in rows if key(r) == k and r["engine"] == engine]
        return statistics.median(v) if v else float("nan")
    a, b = med("infer", "output_tok_per_s"), med("llama-server", "output_tok_per_s")
    ta, tb = med("infer", "ttft_p50"), med("llama-server", "ttft_p50")
    print(f"| {k[0]} | {k[1]} | {a:.1f} | {b:.1f} | {a / b:.2f} | {ta:.0f} | {tb:.0f} |")
EOF
