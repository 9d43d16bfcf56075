#!/usr/bin/env bash
# The official `openai` Python client against `infer serve` (scripts/tests/test_openai_client.py).
# Installs the pinned client into a venv cached outside the repo; needs a release build of infer
# and the real models (scripts/fetch-models.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.51.0
cache="${INFER_CACHE:-$HOME/.cache/infer}"
venv="$cache/venv-openai-$OPENAI_VERSION"
if ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install -q "openai==$OPENAI_VERSION"
fi
export INFER_MODELS="${INFER_MODELS:-$cache/models}"
export INFER_BIN="${INFER_BIN:-$(pwd)/target/release/infer}"
cargo build --release -q -p infer-cli
"$venv/bin/python" -m unittest -v scripts/tests/test_openai_client.py
