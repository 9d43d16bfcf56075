#!/usr/bin/env bash
# Runs every test (optimised: numeric tests on real models are ~30x slower in debug builds).
# Needs ../shared (or INFER_SHARED) and python3 (venv); fetches the real models (scripts/fetch-models.sh), llama.cpp's
# tokenizer test vectors (scripts/fetch-vocabs.sh) and NVRTC (scripts/fetch-nvrtc.sh, to compile
# the CUDA kernels without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export INFER_SHARED="${INFER_SHARED:-$(cd .. && pwd)/shared}"
export INFER_MODELS="${INFER_MODELS:-${INFER_CACHE:-$HOME/.cache/infer}/models}"
bash scripts/fetch-models.sh >/dev/null
INFER_VOCABS="$(bash scripts/fetch-vocabs.sh)"
export INFER_VOCABS
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace --no-fail-fast
# The official `openai` Python client against `infer serve` (pinned, in a cached venv).
bash scripts/openai-check.sh
# Fuzz smoke run: every cargo-fuzz target of fuzz/ at once, 60 s each (FUZZING.md).
bash scripts/fuzz.sh smoke 60
# The CUDA backend must compile (and lint) without CUDA; its GPU tests are #[ignore]d here and run
# on a GPU machine by scripts/gpu-check.sh. Separate target dir: the feature rebuilds infer-compute.
CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-target/cuda}" cargo clippy --release -p infer-compute --features cuda --all-targets -- -D warnings
# `kernels_compile_with_nvrtc` compiles every kernel with NVRTC (no GPU needed): fetch libnvrtc
# (pinned PyPI wheel, sha256-checked, cached) and put it on LD_LIBRARY_PATH for this test only.
nvrtc_dir=$(bash scripts/fetch-nvrtc.sh)
LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-target/cuda}" cargo test --release -p infer-compute --features cuda --lib --test cuda_parity
# The model-level GPU tests (cuda_archrefs, cuda_real_model) and the CLI's `cuda` feature.
CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-target/cuda}" cargo clippy --release -p infer-inference -p infer-cli --features infer-inference/cuda,infer-cli/cuda --all-targets -- -D warnings
