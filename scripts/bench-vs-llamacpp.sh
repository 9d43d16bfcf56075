#!/usr/bin/env bash
# Side-by-side speed: `infer bench` vs llama.cpp's `llama-bench` on the same model, quantization
# and thread count, the two engines interleaved. Builds llama.cpp from the PyPI sdist
# llama-cpp-python (vendor/llama.cpp) outside the repo if absent, makes the comparison GGUFs
# with llama-quantize --allow-requantize, and prints one markdown table.
#
# Usage: scripts/bench-vs-llamacpp.sh [-p 512] [-n 128] [-r 3] [-t "1 2"]
# Env: INFER_CACHE (default ~/.cache/infer), LLAMA_CPP_BIN (a folder with llama-bench and
# llama-quantize, to skip the build), LLAMA_CPP_SRC (an unpacked vendor/llama.cpp, to skip the fetch).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/llamacpp.sh
source scripts/lib/llamacpp.sh
P=512 N=128 R=3 THREADS="1 2"
while getopts "p:n:r:t:" o; do
  case $o in p) P=$OPTARG ;; n) N=$OPTARG ;; r) R=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac
done
cache="${INFER_CACHE:-$HOME/.cache/infer}"
peers="$cache/peers"
mkdir -p "$peers"
bash scripts/fetch-models.sh "$cache" >/dev/null

bin="${LLAMA_CPP_BIN:-}"
if [ -z "$bin" ]; then
  src=$(llamacpp_src "$peers")
  bin="$src/build/bin"
  if [ ! -x "$bin/llama-bench" ]; then
    echo "building llama.cpp (about 10 minutes on 2 cores)" >&2
    llamacpp_build_cpu "$src"
  fi
fi

cargo build --release --quiet --bin infer
infer="${CARGO_TARGET_DIR:-target}/release/infer"

declare -A GGUF=([smollm2]="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" [gemma3]="$cache/models/gemma-3-270m-q4_k_m.gguf")
for m in smollm2 gemma3; do
  for q in Q4_K_M Q4_0 Q8_0 F16; do
    out="$peers/$m-$q.gguf"
    [ -f "$out" ] || "$bin/llama-quantize" --allow-requantize "${GGUF[$m]}" "$out" "$q" >/dev/null 2>&1
  done
  [ -d "$peers/$m.vindex" ] || $infer extract "${GGUF[$m]}" -o "$peers/$m.vindex" --quant all --float f32 --no-tokenizer >&2
  [ -d "$peers/$m-f16.vindex" ] ||
    $infer extract "${GGUF[$m]}" -o "$peers/$m-f16.vindex" --dtype f16 --quant none --no-tokenizer >&2
done

# pairs: label | llama.cpp GGUF suffix | vindex suffix | infer format flags
pairs=(
  "q4k vs Q4_K_M|Q4_K_M||--attn q4k --ffn q4k --lm-head q6k"
  "q4 (q4k attn) vs Q4_0|Q4_0||--attn q4k --ffn q4 --lm-head q4"
  "q8 attn + q4k FFN vs Q8_0|Q8_0||--attn q8 --ffn q4k --lm-head q6k"
  "f16 vs F16|F16|-f16|--attn f32 --ffn walk --lm-head f32"
  "f32 vs F16|F16||--attn f32 --ffn walk --lm-head f32"
)

llama_ts() { # gguf threads -> "pp tg"
  "$bin/llama-bench" -m "$1" -t "$2" -p "$P" -n "$N" -r "$R" -o json 2>/dev/null | python3 -c '
import json, sys
rows = json.load(sys.stdin)
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
print(pp[0] if pp else 0, tg[0] if tg else 0)'
}
infer_ts() { # vindex threads flags... -> "pp tg"
  local v=$1 t=$2; shift 2
  $infer bench "$v" -t "$t" -p "$P" -n "$N" -r "$R" --json "$@" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]  # one object per test
pp = [r["pp_tokens_per_s"] for r in rows if r["pp_tokens_per_s"]]
tg = [r["tg_tokens_per_s"] for r in rows if r["tg_tokens_per_s"]]
print(pp[0] if pp else 0, tg[0] if tg else 0)'
}

echo "| model | pair | threads | infer pp$P | llama.cpp pp$P | ratio | infer tg$N | llama.cpp tg$N | ratio |"
echo "|---|---|---|---|---|---|---|---|---|"
for m in smollm2 gemma3; do
  for t in $THREADS; do
    for pair in "${pairs[@]}"; do
      IFS='|' read -r label suffix vsuffix flags <<<"$pair"
      # shellcheck disable=SC2086
      read -r ipp itg < <(infer_ts "$peers/$m$vsuffix.vindex" "$t" $flags)
      read -r lpp ltg < <(llama_ts "$peers/$m-$suffix.gguf" "$t")
      python3 -c "
ipp, lpp, itg, ltg = $ipp, $lpp, $itg, $ltg
r = lambda a, b: f'{a / b:.2f}' if b else '-'
print(f'| $m | $label | $t | {ipp:.1f} | {lpp:.1f} | {r(ipp, lpp)} | {itg:.1f} | {ltg:.1f} | {r(itg, ltg)} |')"
    done
  done
done
