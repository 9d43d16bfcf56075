#!/usr/bin/env bash
# llama.cpp's CUDA build on the GPU machine, for the speed comparisons of issues #9, #14 and #19:
# llama.cpp from the llama-cpp-python sdist (vendor/llama.cpp, fetched as scripts/lib/llamacpp.sh
# does), packed here as a pruned source tree, carried to the device, built there with
# -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90, then llama-bench, llama-batched-bench or
# llama-server next to `infer serve`. llama.cpp's code is never committed: the tarball lives in
# .gpu/ (ignored through .git/info/exclude).
#
#   scripts/gpu-llamacpp.sh pack            # here: write .gpu/llama/llama-src.tar.gz (a tree with
#                                           # only what llama-bench, llama-batched-bench,
#                                           # llama-server, llama-quantize and llama-completion
#                                           # need, CPU + CUDA backends; llama-server without its
#                                           # web UI)
#   scripts/gpu-llamacpp.sh start           # device (carry: [".gpu/llama"]): unpack into
#                                           # /tmp/llama-src, configure and build in /tmp/llama-build
#                                           # in the background (setsid), return at once; the
#                                           # build goes on across calls while the machine is warm
#   scripts/gpu-llamacpp.sh wait [SECONDS]  # device: wait for the build (default 500 s, keep it
#                                           # under the call's timeout), print the log's tail;
#                                           # exit 0 built, 1 failed, 2 still building
#   scripts/gpu-llamacpp.sh bench GGUF...   # device: llama-bench -ngl 99 -p 128 -n 64 -r 5,
#                                           # flash attention off and on, markdown table
#   scripts/gpu-llamacpp.sh batched GGUF... # device: llama-batched-bench -ngl 99, prompts of
#                                           # BENCH_P tokens, BENCH_N generated, B = BENCH_B
#                                           # (default 1,4,16,64) parallel sequences
#   scripts/gpu-llamacpp.sh serve GGUF VINDEX  # device (carry .gpu/bin too): `infer serve VINDEX
#                                           # --device cuda` vs `llama-server -m GGUF -ngl 99 -fa
#                                           # on`, one server at a time, SERVE_R interleaved
#                                           # rounds, scripts/load.py at each of SERVE_C clients
#                                           # (R = max(C, 4) requests of SERVE_P prompt token ids,
#                                           # SERVE_N output tokens), after a short warm-up pass;
#                                           # both with max(C) slots of P + N + 16 positions; a
#                                           # missing VINDEX is extracted from GGUF (q4k, with the
#                                           # tokenizer). Prints one markdown row per run, then the
#                                           # medians; JSON lines in $OUT (or BUILD)/serve.jsonl
#
# Env: LLAMA_CPP_SRC (an unpacked vendor/llama.cpp, to skip the fetch when packing), INFER_CACHE
# (default ~/.cache/infer; the sdist goes to its peers/), LLAMA_GPU_SRC / LLAMA_GPU_BUILD (default
# /tmp/llama-src, /tmp/llama-build), BENCH_P / BENCH_N / BENCH_R (default 128 / 64 / 5),
# INFER_BIN (default .gpu/bin/infer), SERVE_C / SERVE_R / SERVE_P / SERVE_N (default "1 8 64" /
# 2 / 128 / 128).
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$0")/.."
mode="${1:-}"
GPU_DIR=.gpu
TARBALL="$GPU_DIR/llama/llama-src.tar.gz"
SRC="${LLAMA_GPU_SRC:-/tmp/llama-src}"
BUILD="${LLAMA_GPU_BUILD:-/tmp/llama-build}"
LOG="$BUILD/build.log"
TARGETS_MAIN="llama-bench llama-batched-bench"
TARGETS_EXTRA="llama-server llama-quantize llama-completion"

die() {
    echo "gpu-llamacpp: $*" >&2
    exit 1
}

# ggml backends other than CPU and CUDA: left out of the pack (GGML_<NAME> stay OFF).
OTHER_BACKENDS="blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn"
# ggml-cpu code for other processors (the device and this machine are x86-64).
OTHER_CPU="arch/arm arch/loongarch arch/powerpc arch/riscv arch/s390 arch/wasm kleidiai spacemit"
# Paths of vendor/llama.cpp that go into the pack; everything else (models, docs, tests,
# examples, other tools, a build folder) stays out. llama-server needs tools/mtmd (its library)
# and, of tools/ui, only the templates that scripts/ui-assets.cmake fills (no web UI assets: the
# build embeds none, LLAMA_BUILD_UI and LLAMA_USE_PREBUILT_UI stay OFF).
KEEP=(CMakeLists.txt LICENSE licenses cmake include src common vendor
    ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src
    tools/llama-bench tools/batched-bench tools/quantize tools/completion
    tools/server tools/mtmd tools/ui/CMakeLists.txt tools/ui/ui.cpp.in tools/ui/ui.h.in
    tools/ui/sources.cmake scripts/ui-assets.cmake)
# Inside the kept tools: tests, sample media and scripts no build step reads.
DROP=(tools/server/tests tools/server/bench tools/mtmd/tests tools/mtmd/legacy-models
    tools/mtmd/test-1.jpeg tools/mtmd/test-2.mp3 tools/mtmd/test-3.mp4)

pack() {
    # shellcheck source=scripts/lib/llamacpp.sh
    source scripts/lib/llamacpp.sh
    local src stage excludes=() b
    src=$(llamacpp_src "${INFER_CACHE:-$HOME/.cache/infer}/peers")
    for b in $OTHER_BACKENDS; do excludes+=(--exclude="./ggml/src/ggml-$b"); done
    for b in $OTHER_CPU; do excludes+=(--exclude="./ggml/src/ggml-cpu/$b"); done
    for b in "${DROP[@]}"; do excludes+=(--exclude="./$b"); done
    stage=$(mktemp -d /tmp/llama-pack.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$stage'" EXIT
    mkdir -p "$stage/llama.cpp"
    (cd "$src" && tar -cf - "${excludes[@]}" "${KEEP[@]/#/./}") | tar -xf - -C "$stage/llama.cpp"
    # tools/: only the tools above (the sdist's list adds a dozen more).
    cat >"$stage/llama.cpp/tools/CMakeLists.txt" <<'EOF'
# Written by infer's scripts/gpu-llamacpp.sh pack: only the tools that script builds.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(batched-bench)
add_subdirectory(quantize)
add_subdirectory(completion)
add_subdirectory(mtmd)
add_subdirectory(ui)
add_subdirectory(server)
EOF
    [[ -f "$stage/llama.cpp/tools/server/server.cpp" ]] || die "no tools/server in $src"
    [[ -f "$stage/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt" ]] || die "no ggml/src/ggml-cuda in $src"
    {
        echo "llama.cpp from llama-cpp-python ${LLAMACPP_PY_VERSION} (vendor/llama.cpp), pruned by scripts/gpu-llamacpp.sh"
        echo "source: $src"
        echo "left out: ggml backends: $OTHER_BACKENDS; ggml-cpu: $OTHER_CPU; ${DROP[*]}; the web UI"
    } >"$stage/llama.cpp/PACKED.txt"
    grep -qxF "/$GPU_DIR/" .git/info/exclude 2>/dev/null || echo "/$GPU_DIR/" >>.git/info/exclude
    mkdir -p "$GPU_DIR/llama"
    tar -C "$stage" -cf - llama.cpp | gzip -9 >"$TARBALL.tmp"
    mv "$TARBALL.tmp" "$TARBALL"
    echo "$TARBALL: $(du -h "$TARBALL" | cut -f1) ($(stat -c %s "$TARBALL") bytes)," \
        "$(find "$stage/llama.cpp" -type f | wc -l) files, $(find "$stage/llama.cpp/ggml/src/ggml-cuda" -name '*.cu' | wc -l) .cu"
}

# nvcc: on PATH, else the toolkit's, else the pip wheel's (nvidia/cu13/bin).
find_nvcc() {
    local c wheel
    wheel=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin", "nvcc"))' 2>/dev/null || true)
    for c in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc "$wheel"; do
        [[ -n "$c" && -x "$c" ]] && { echo "$c"; return; }
    done
    return 1
}

# The CUDA runtime and cuBLAS on the loader path (the toolkit's lib64, else the pip wheels').
find_libs() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do
        [[ -e "$d/libcudart.so" || -e "$d/libcudart.so.13" ]] && { export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; return; }
    done
    return 0
}

building() {
    [[ -f "$BUILD/pid" ]] && kill -0 "$(cat "$BUILD/pid")" 2>/dev/null
}

start() {
    [[ -f "$TARBALL" ]] || die "no $TARBALL: run 'scripts/gpu-llamacpp.sh pack' here and carry .gpu/llama"
    if building; then
        echo "gpu-llamacpp: build already running (pid $(cat "$BUILD/pid")); see 'wait'"
        return
    fi
    local sum
    sum=$(sha256sum "$TARBALL" | cut -d' ' -f1)
    if [[ -x "$BUILD/bin/llama-bench" && "$(cat "$BUILD/tarball.sha256" 2>/dev/null)" == "$sum" ]]; then
        echo "gpu-llamacpp: already built from this tarball: $BUILD/bin/llama-bench"
        return
    fi
    local nvcc gen=Ninja
    nvcc=$(find_nvcc) || die "no nvcc on PATH nor under /usr/local/cuda*"
    command -v ninja >/dev/null || gen="Unix Makefiles"
    rm -rf "$SRC" "$BUILD"
    mkdir -p "$SRC" "$BUILD"
    tar -xzf "$TARBALL" -C "$SRC" --strip-components=1
    echo "$sum" >"$BUILD/tarball.sha256"
    # The background build runs a copy of this script: the next call may replace the repo's.
    cp "$SELF" "$BUILD/gpu-llamacpp.sh"
    NVCC="$nvcc" GEN="$gen" LLAMA_GPU_SRC="$SRC" LLAMA_GPU_BUILD="$BUILD" \
        setsid nohup bash "$BUILD/gpu-llamacpp.sh" _build >"$LOG" 2>&1 </dev/null &
    echo $! >"$BUILD/pid"
    echo "gpu-llamacpp: build started (pid $!, $gen, $nvcc, $(nproc) jobs), log $LOG"
}

# Runs detached (setsid) from start: configure, then llama-bench, then llama-server and the
# cheap extras.
_build() {
    local t0 rc=0
    : "${NVCC:?}" "${GEN:?}"
    t0=$(date +%s)
    echo "== $(date -u +%FT%TZ) configure ($GEN, $NVCC)"
    "$NVCC" --version | tail -2
    cmake -S "$SRC" -B "$BUILD" -G "$GEN" \
        -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")" -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF || rc=$?
    if [[ $rc -eq 0 ]]; then
        echo "== $(date -u +%FT%TZ) build $TARGETS_MAIN"
        # shellcheck disable=SC2086
        cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS_MAIN || rc=$?
    fi
    if [[ $rc -eq 0 ]]; then
        echo "== $(date -u +%FT%TZ) build $TARGETS_EXTRA"
        # shellcheck disable=SC2086
        cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS_EXTRA ||
            echo "gpu-llamacpp: extras failed (llama-bench is built)"
    fi
    echo "== $(date -u +%FT%TZ) done rc=$rc after $(($(date +%s) - t0)) s"
    echo "$rc" >"$BUILD/status"
}

wait_build() {
    local limit="${1:-500}" t0
    t0=$(date +%s)
    [[ -f "$BUILD/pid" ]] || die "no build started in $BUILD (run 'start' first, on a warm machine)"
    while building && (($(date +%s) - t0 < limit)); do sleep 5; done
    echo "== build log (last lines of $LOG)"
    # Ninja's progress lines go on one line each; show the last one and the last other lines.
    grep -E '^\[[0-9]+/[0-9]+\]' "$LOG" | tail -1 || true
    grep -vE '^\[[0-9]+/[0-9]+\]' "$LOG" | tail -25 || true
    local st
    st=$(cat "$BUILD/status" 2>/dev/null || echo running)
    if [[ -x "$BUILD/bin/llama-bench" ]]; then
        echo "gpu-llamacpp: llama-bench built: $BUILD/bin/llama-bench (status $st)"
        ls "$BUILD/bin"
        [[ "$st" == running ]] && return 2
        return 0
    fi
    if [[ "$st" == running ]]; then
        echo "gpu-llamacpp: still building after ${limit} s (no llama-bench yet)"
        return 2
    fi
    echo "gpu-llamacpp: BUILD FAILED (status $st); errors:"
    grep -E 'error|Error' "$LOG" | head -20 || true
    return 1
}

bench() {
    (($# > 0)) || die "usage: $0 bench GGUF [GGUF...]"
    local bin="$BUILD/bin/llama-bench" g log="$BUILD/bench.log"
    [[ -x "$bin" ]] || die "no $bin: run 'start' and 'wait' first"
    find_libs
    ! command -v nvidia-smi >/dev/null ||
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 || true
    local p="${BENCH_P:-128}" n="${BENCH_N:-64}" r="${BENCH_R:-5}"
    for g in "$@"; do
        [[ -f "$g" ]] || die "no such GGUF: $g"
        echo "== $g"
        # Flash attention off and on in one run; if the option is refused, llama.cpp's default.
        if ! "$bin" -m "$g" -ngl 99 -p "$p" -n "$n" -r "$r" -fa 0,1 -o md 2>"$log"; then
            echo "(-fa 0,1 failed: $(tail -1 "$log"); without -fa)"
            "$bin" -m "$g" -ngl 99 -p "$p" -n "$n" -r "$r" -o md 2>"$log" || {
                tail -20 "$log"
                die "llama-bench failed on $g"
            }
        fi
    done
}

batched() {
    (($# > 0)) || die "usage: $0 batched GGUF [GGUF...]"
    local bin="$BUILD/bin/llama-batched-bench" g
    [[ -x "$bin" ]] || die "no $bin: run 'start' and 'wait' first"
    find_libs
    local p="${BENCH_P:-128}" n="${BENCH_N:-128}" b="${BENCH_B:-1,4,16,64}"
    local maxb=${b##*,}
    for g in "$@"; do
        [[ -f "$g" ]] || die "no such GGUF: $g"
        echo "== $g: llama-batched-bench -npp $p -ntg $n -npl $b"
        "$bin" -m "$g" -ngl 99 -fa 1 -c $(((p + n) * maxb)) -b 2048 -ub 512 \
            -npp "$p" -ntg "$n" -npl "$b" 2>&1 | grep -E '^\|' || die "llama-batched-bench failed on $g"
    done
}

# One server in the background on PORT; wait until /v1/models answers (up to 300 s).
serve_up() {
    local port=$1 pid=$2 i
    for i in $(seq 1 1500); do
        curl -fs "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}

# scripts/load.py at each client count against the server on PORT, one JSON line per run
# (tagged with engine, round and clients); a warm-up pass first (SERVE_N/8 tokens, not kept).
serve_load() {
    local engine=$1 round=$2 port=$3 c reqs url="http://127.0.0.1:$3"
    for c in $SERVE_C; do
        python3 scripts/load.py --url "$url" -c "$c" --requests "$c" --prompt-tokens "$SERVE_P" \
            --max-tokens $((SERVE_N / 8)) --seed 99 --json >/dev/null || return 1
    done
    for c in $SERVE_C; do
        reqs=$((c < 4 ? 4 : c))
        python3 scripts/load.py --url "$url" -c "$c" --requests "$reqs" --prompt-tokens "$SERVE_P" \
            --max-tokens "$SERVE_N" --seed "$round" --json |
            ENGINE=$engine ROUND=$round python3 -c '
import json, os, sys
r = json.loads(sys.stdin.read())
print(json.dumps({"engine": os.environ["ENGINE"], "round": int(os.environ["ROUND"]), **r}))' || return 1
    done
}

serve() {
    (($# == 2)) || die "usage: $0 serve GGUF VINDEX"
    local gguf=$1 vindex=$2 bin="$BUILD/bin/llama-server" infer="${INFER_BIN:-.gpu/bin/infer}"
    [[ -x "$bin" ]] || die "no $bin: run 'start' and 'wait' first"
    [[ -x "$infer" ]] || die "no $infer: run 'scripts/gpu-check.sh build' here and carry .gpu/bin"
    [[ -f "$gguf" ]] || die "no such GGUF: $gguf"
    find_libs
    # infer's CUDA backend also needs NVRTC: the pip wheel's lib folder when there is no toolkit.
    local d
    d=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
    [[ -n "$d" && -d "$d" ]] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
    SERVE_C="${SERVE_C:-1 8 64}"
    SERVE_P="${SERVE_P:-128}"
    SERVE_N="${SERVE_N:-128}"
    local rounds="${SERVE_R:-2}" maxc=0 c ctx round pid rc=0
    for c in $SERVE_C; do ((c > maxc)) && maxc=$c; done
    ctx=$((SERVE_P + SERVE_N + 16))
    local out="${OUT:-$BUILD}" results
    results="$out/serve.jsonl"
    mkdir -p "$out"
    : >"$results"
    if [[ ! -d "$vindex" ]]; then
        "$infer" extract "$gguf" -o "$vindex" 2>&1 | tail -1
    fi
    ! command -v nvidia-smi >/dev/null ||
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 || true
    echo "== $gguf / $vindex: clients $SERVE_C, prompts $SERVE_P, output $SERVE_N, $maxc slots x $ctx, $rounds rounds"
    for round in $(seq 1 "$rounds"); do
        "$infer" serve "$vindex" --device cuda --port 18131 --parallel "$maxc" --ctx-size "$ctx" \
            >"$out/infer-serve.$round.log" 2>&1 &
        pid=$!
        if serve_up 18131 "$pid"; then
            serve_load infer "$round" 18131 >>"$results" || { echo "infer serve: load failed"; rc=1; }
        else
            echo "infer serve did not come up:"; tail -5 "$out/infer-serve.$round.log"; rc=1
        fi
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        "$bin" -m "$gguf" --port 18132 -ngl 99 -fa on -np "$maxc" -c $((ctx * maxc)) \
            >"$out/llama-server.$round.log" 2>&1 &
        pid=$!
        if serve_up 18132 "$pid"; then
            serve_load llama-server "$round" 18132 >>"$results" || { echo "llama-server: load failed"; rc=1; }
        else
            echo "llama-server did not come up:"; tail -5 "$out/llama-server.$round.log"; rc=1
        fi
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| engine | round | clients | requests | errors | output tok/s | TTFT p50 (ms) | ITL p50 (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['engine']} | {r['round']} | {r['clients']} | {r['requests']} | {r['errors']} | "
          f"{r['output_tok_per_s']:.1f} | {r['ttft_ms']['p50']:.0f} | {r['itl_ms']['p50']:.2f} |")
print()
def med(e, c, f):
    v = [f(r) for r in rows if r["engine"] == e and r["clients"] == c]
    return statistics.median(v) if v else float("nan")
tok = lambda r: r["output_tok_per_s"]
ttft = lambda r: r["ttft_ms"]["p50"]
print("| engine | clients | output tok/s (median) | TTFT p50 (ms, median) | infer / llama-server |")
print("|---|---:|---:|---:|---:|")
for c in sorted({r["clients"] for r in rows}):
    for e in ("infer", "llama-server"):
        ratio = med("infer", c, tok) / med("llama-server", c, tok)
        print(f"| {e} | {c} | {med(e, c, tok):.1f} | {med(e, c, ttft):.0f} | "
              + (f"{ratio:.2f}x |" if e == "infer" else " |"))
EOF
    return "$rc"
}

case "$mode" in
pack) pack ;;
batched) shift && batched "$@" ;;
start) start ;;
_build) _build ;;
wait) wait_build "${2:-500}" ;;
bench) shift && bench "$@" ;;
serve) shift && serve "$@" ;;
*) die "usage: $0 pack | start | wait [SECONDS] | bench GGUF [GGUF...] | batched GGUF [GGUF...] | serve GGUF VINDEX" ;;
esac
