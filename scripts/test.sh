#!/usr/bin/env bash
# Runs every test (optimised: numeric tests on real models are ~30x slower in debug builds).
# Needs ../shared (or INFER_SHARED) and the real models (scripts/fetch-models.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export INFER_SHARED="${INFER_SHARED:-$(cd .. && pwd)/shared}"
export INFER_MODELS="${INFER_MODELS:-${INFER_CACHE:-$HOME/.cache/infer}/models}"
bash scripts/fetch-models.sh >/dev/null
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace --no-fail-fast
