#!/usr/bin/env bash
# Fetch llama.cpp's tokenizer test vectors — the vocabulary-only GGUFs
# vendor/llama.cpp/models/ggml-vocab-*.gguf and their .gguf.inp / .gguf.out pairs — from the
# llama-cpp-python sdist pinned in scripts/lib/llamacpp.sh (sha256-checked), into a cache folder
# outside the repo. Prints that folder (the tests read it as INFER_VOCABS).
# Usage: scripts/fetch-vocabs.sh [CACHE_DIR]   (default: $INFER_CACHE or ~/.cache/infer)
# Idempotent: nothing is fetched when the folder already holds this version's files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/llamacpp.sh
. "$here/lib/llamacpp.sh"
cache="${1:-${INFER_CACHE:-$HOME/.cache/infer}}"
py="${PYTHON:-python3}"
out="$cache/vocabs"
stamp="$out/llama-cpp-python-$LLAMACPP_PY_VERSION"
if [ -f "$stamp" ]; then echo "$out"; exit 0; fi

name="llama_cpp_python-$LLAMACPP_PY_VERSION"
sdist="$cache/peers/$name.tar.gz"   # shared with scripts/bench-vs-llamacpp.sh
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$LLAMACPP_PY_SHA256" ]; }
if ! sha_ok "$sdist"; then
  echo "fetching llama-cpp-python==$LLAMACPP_PY_VERSION (sdist, for llama.cpp's tokenizer vectors)" >&2
  tmp=$(mktemp -d "$cache/.vocabs.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  "$py" -m pip download --quiet --no-deps --no-build-isolation --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMACPP_PY_VERSION" -d "$tmp" >/dev/null 2>&1 ||
    "$py" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMACPP_PY_VERSION" -d "$tmp" >&2
  sha_ok "$tmp/$name.tar.gz" || { echo "error: sha256 mismatch for $name.tar.gz (want $LLAMACPP_PY_SHA256)" >&2; exit 1; }
  mkdir -p "$cache/peers"
  mv "$tmp/$name.tar.gz" "$sdist.part" && mv "$sdist.part" "$sdist"
fi
mkdir -p "$out"
part=$(mktemp -d "$cache/.vocabs.XXXXXX")
tar -xzf "$sdist" -C "$part" --wildcards "$name/vendor/llama.cpp/models/ggml-vocab-*"
find "$out" -maxdepth 1 -name 'ggml-vocab-*' -delete
mv "$part/$name/vendor/llama.cpp/models/"ggml-vocab-* "$out/"
rm -rf "$part"
ls "$out"/ggml-vocab-*.gguf >/dev/null
find "$out" -maxdepth 1 -name 'llama-cpp-python-*' -delete
: > "$stamp"
echo "$out"
