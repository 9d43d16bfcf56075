#!/usr/bin/env bash
# CUDA backend check: parity tests of every CUDA kernel against the CPU scalar reference, then the
# kernel benchmark (GB/s per format at the real models' shapes, device copy bandwidth, launch
# time), table last.
#
#   scripts/gpu-check.sh build   # here (x86-64, no GPU needed): build the test binaries with the
#                                # `cuda` feature into CARGO_TARGET_DIR (default /work/target-cuda,
#                                # apart from the main target dir), strip them into .gpu/
#                                # (ignored through .git/info/exclude)
#   scripts/gpu-check.sh run     # on the GPU machine (device tool, `carry: [".gpu"]`): run them
#   scripts/gpu-check.sh         # both, where cargo and a GPU are on one machine
#
# Full logs go to $OUT/gpu-check.log when OUT is set (the device tool), else .gpu/gpu-check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
GPU_DIR=.gpu

build() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-cuda}"
    grep -qxF "/$GPU_DIR/" .git/info/exclude 2>/dev/null || echo "/$GPU_DIR/" >>.git/info/exclude
    mkdir -p "$GPU_DIR"
    rm -f "$GPU_DIR"/cuda_parity "$GPU_DIR"/cuda_bench
    cargo test --release -p infer-compute --features cuda --test cuda_parity --test cuda_bench \
        --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("cuda_parity", "cuda_bench"):
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
        cp "$exe" "$GPU_DIR/$name"
        strip "$GPU_DIR/$name"
    done
    for t in cuda_parity cuda_bench; do
        [[ -x "$GPU_DIR/$t" ]] || { echo "gpu-check: build of $t failed (run the cargo command above without --message-format to see why)" >&2; exit 1; }
    done
    ls -la "$GPU_DIR"
}

# Put the driver and NVRTC on the loader path: the CUDA toolkit's lib64, else the pip wheel's.
find_libs() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do
        [[ -e "$d/libnvrtc.so" || -e "$d/libnvrtc.so.13" ]] && { export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; return; }
    done
    d=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
    [[ -n "$d" && -d "$d" ]] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    return 0
}

run() {
    local log="${OUT:-$GPU_DIR}/gpu-check.log"
    mkdir -p "$(dirname "$log")"
    find_libs
    {
        echo "== $(date -u +%FT%TZ) gpu-check"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true
        echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    } | tee "$log"
    local rc=0
    # Parity first (stop here on failure), the benchmark table last.
    "$GPU_DIR/cuda_parity" --ignored --nocapture --test-threads=1 2>&1 | tee -a "$log" || rc=1
    if [[ $rc -ne 0 ]]; then
        echo "gpu-check: PARITY FAILED (log: $log)"
        exit 1
    fi
    grep -o 'parity .*' "$log" >"$log.parity" || true
    "$GPU_DIR/cuda_bench" --ignored --nocapture --test-threads=1 2>&1 | tee -a "$log" || rc=1
    echo
    echo "== parity (max |gpu-cpu| / sum|terms|) =="
    cat "$log.parity"
    rm -f "$log.parity"
    sed -n '/^== CUDA quantized mat-vec/,/^test /p' "$log" | grep -v '^test '
    [[ $rc -eq 0 ]] && echo "gpu-check: OK" || { echo "gpu-check: BENCHMARK FAILED"; exit 1; }
}

case "$mode" in
build) build ;;
run) run ;;
all) build && run ;;
*) echo "usage: $0 [build|run]" >&2; exit 2 ;;
esac
