# shellcheck shell=bash
# Shared by scripts/bench-vs-llamacpp.sh, scripts/bench-serve.sh and scripts/gpu-llamacpp.sh
# (sourced, not run).
#
# llama.cpp comes from the PyPI sdist of llama-cpp-python (its vendor/llama.cpp), one pinned
# version, fetched with pip and unpacked outside the repo. llama.cpp's code is never committed.

LLAMACPP_PY_VERSION=0.3.36
# sha256 of llama_cpp_python-$LLAMACPP_PY_VERSION.tar.gz (the PyPI sdist), checked by scripts/fetch-vocabs.sh.
LLAMACPP_PY_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# llamacpp_src PEERS: print the llama.cpp source folder, fetching the sdist into PEERS first if
# it is not there yet. $LLAMA_CPP_SRC, when set, is used as is (a vendor/llama.cpp folder).
llamacpp_src() {
  local peers="$1"
  if [ -n "${LLAMA_CPP_SRC:-}" ]; then
    [ -f "$LLAMA_CPP_SRC/CMakeLists.txt" ] || { echo "llamacpp: no CMakeLists.txt in LLAMA_CPP_SRC=$LLAMA_CPP_SRC" >&2; return 1; }
    echo "$LLAMA_CPP_SRC"
    return
  fi
  local name="llama_cpp_python-$LLAMACPP_PY_VERSION"
  local src="$peers/$name/vendor/llama.cpp"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    mkdir -p "$peers"
    [ -f "$peers/$name.tar.gz" ] ||
      python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMACPP_PY_VERSION" -d "$peers" >&2
    tar -xzf "$peers/$name.tar.gz" -C "$peers"
    [ -f "$src/CMakeLists.txt" ] || { echo "llamacpp: $peers/$name.tar.gz holds no vendor/llama.cpp" >&2; return 1; }
  fi
  echo "$src"
}

# llamacpp_build_cpu SRC: configure a native CPU build and build llama-bench and
# llama-quantize in SRC/build. A CPU that advertises AMX where the virtual machine does not
# enable its tile state would run llama.cpp's native AMX kernels into SIGILL: there the AMX
# instructions are left out (the best llama.cpp such a host can run).
llamacpp_build_cpu() {
  local src="$1" flags=""
  command -v cmake >/dev/null || python3 -m pip install --quiet cmake
  if ! llamacpp_amx_runs; then
    echo "llamacpp: AMX advertised but not enabled here: building without it" >&2
    flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  fi
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  cmake --build "$src/build" -j2 --target llama-bench llama-quantize >/dev/null
}

# llamacpp_amx_runs: true unless the CPU advertises AMX (amx_tile) and a tile instruction,
# after the kernel's permission request, dies here (the tile state not enabled in XCR0).
llamacpp_amx_runs() {
  grep -qw amx_tile /proc/cpuinfo 2>/dev/null || return 0
  local dir rc=0
  dir=$(mktemp -d)
  cat >"$dir/amx.c" <<'C'
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
    unsigned char cfg[64] = {0};
    cfg[0] = 1;   /* palette 1 */
    cfg[16] = 64; /* tile 0: 64 bytes per row */
    cfg[48] = 16; /* tile 0: 16 rows */
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
C
  if gcc -O1 -mamx-tile "$dir/amx.c" -o "$dir/amx" 2>/dev/null; then
    # A child shell runs it so that the SIGILL report goes to its silenced stderr.
    bash -c '"$1"; exit $?' amx-probe "$dir/amx" 2>/dev/null || rc=$?
  fi
  rm -rf "$dir"
  [ "$rc" -eq 0 ]
}
