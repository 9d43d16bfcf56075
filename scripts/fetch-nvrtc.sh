#!/usr/bin/env bash
# Fetch NVRTC (the CUDA runtime compiler, from the PyPI wheel nvidia-cuda-nvrtc) into a cache
# directory outside the repo, so the CUDA kernels can be compiled by the tests without a GPU or a
# CUDA toolkit (crates/infer-compute/tests/cuda_parity.rs `kernels_compile_with_nvrtc`).
# Usage: scripts/fetch-nvrtc.sh [CACHE_DIR]
#   CACHE_DIR default: $INFER_CACHE or ~/.cache/infer.
# Prints the library directory ($CACHE_DIR/nvrtc/<version>) on stdout, for LD_LIBRARY_PATH;
# messages go to stderr. Idempotent: libraries whose sha256 already match are not fetched again.
# The wheel (~58 MB, x86_64 Linux only) is sha256-checked, only nvidia/cu13/lib/* is extracted,
# and `libnvrtc.so` is linked to `libnvrtc.so.13` (the name cudarc's dynamic loader looks for).
set -euo pipefail
cache="${1:-${INFER_CACHE:-$HOME/.cache/infer}}"
py="${PYTHON:-python3}"

version=13.5.37
wheel_name="nvidia_cuda_nvrtc-${version}-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
wheel_sha=86b4d68058807988b7d9af5b44917a0601e9c337f35ccd657bfb3c759ff8d8bc
# member of the wheel (under nvidia/cu13/lib/) -> sha256
libs=(
  "libnvrtc.so.13 98a317ff5d2176dee5a04235c6663f8d553d5ed95b3104cbf7fb198cbf76a10d"
  "libnvrtc-builtins.so.13.5 6cecb2fd3e562bab1cb1c6e192f8f828157683c8febb22a00e178f9faf4e7f6a"
)
dir="$cache/nvrtc/$version"

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

intact() { # every pinned library matches and the libnvrtc.so link resolves to libnvrtc.so.13
  local entry
  for entry in "${libs[@]}"; do
    sha_ok "$dir/${entry%% *}" "${entry##* }" || return 1
  done
  [ "$(readlink "$dir/libnvrtc.so" 2>/dev/null || true)" = libnvrtc.so.13 ]
}

if intact; then
  echo "$dir"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "error: the pinned NVRTC wheel ($wheel_name) is for Linux x86_64 only, not $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
if ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "error: '$py -m pip' is not available; pip is needed to download nvidia-cuda-nvrtc==$version from PyPI" >&2
  exit 1
fi

mkdir -p "$cache/wheels" "$cache/nvrtc"
whl="$cache/wheels/$wheel_name"
if ! sha_ok "$whl" "$wheel_sha"; then
  rm -f "$whl"
  echo "fetching NVRTC (nvidia-cuda-nvrtc==$version, ~58 MB)" >&2
  if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$cache/wheels" "nvidia-cuda-nvrtc==$version" >&2; then
    echo "error: pip download of nvidia-cuda-nvrtc==$version failed (is PyPI reachable?)" >&2
    exit 1
  fi
  [ -f "$whl" ] || { echo "error: pip did not produce $whl" >&2; exit 1; }
  sha_ok "$whl" "$wheel_sha" || { echo "error: sha256 mismatch for $whl (expected $wheel_sha)" >&2; rm -f "$whl"; exit 1; }
fi

echo "extracting nvidia/cu13/lib/* from $whl into $dir" >&2
tmp="$dir.part"
rm -rf "$tmp"
mkdir -p "$tmp"
"$py" - "$whl" "$tmp" <<'PY'
import os, shutil, sys, zipfile
whl, dest = sys.argv[1:]
prefix = "nvidia/cu13/lib/"
with zipfile.ZipFile(whl) as z:
    members = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not members:
        sys.exit(f"error: {whl} has no {prefix}* members")
    for name in members:
        out_path = os.path.join(dest, name[len(prefix):])
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with z.open(name) as src, open(out_path, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
PY
ln -s libnvrtc.so.13 "$tmp/libnvrtc.so"
rm -rf "$dir"
mv "$tmp" "$dir"
if ! intact; then
  echo "error: extracted NVRTC libraries in $dir do not match the pinned sha256s" >&2
  rm -rf "$dir"
  exit 1
fi
rm -f "$whl" # the checked libraries are the cache; the wheel is not needed again
echo "$dir"
