#!/usr/bin/env bash
# CUDA backend check: parity tests of every CUDA kernel against the CPU scalar reference,
# model-level parity on the archrefs cases (Model::forward with CudaBackend vs HF and vs the
# CPU backend), then the kernel benchmark (GB/s per format at the real models' shapes, device
# copy bandwidth, launch time), table last. Optionally a real model: bench and greedy tokens,
# CPU vs CUDA.
#
#   scripts/gpu-check.sh build   # here (x86-64, no GPU needed): build the test binaries and the
#                                # `infer` binary with the `cuda` feature into CUDA_TARGET_DIR
#                                # (default target/cuda, apart from the main target dir),
#                                # strip them into .gpu/bin and copy the archrefs cases into
#                                # .gpu/shared/archrefs{,-next} (.gpu/ is ignored through
#                                # .git/info/exclude)
#   scripts/gpu-check.sh run     # on the GPU machine (device tool, `carry: [".gpu/bin",
#                                # ".gpu/shared"]`): parity, archrefs, benchmark
#   scripts/gpu-check.sh split GGUF   # here: split a GGUF (up to 80 MiB + 64 MiB) into .gpu/m1
#                                # (40 MiB, carried with .gpu/bin) and .gpu/m2 (the rest), one per
#                                # device call: one call's carry is limited to 64 MiB
#   scripts/gpu-check.sh model   # on the GPU machine, once .gpu/m1 and .gpu/m2 both arrived
#                                # (two calls on a warm machine): reassemble the GGUF, run
#                                # cuda_real_model (greedy tokens and pp/tg speed, CPU vs CUDA),
#                                # then with the carried `infer`: extract a q4k vindex, greedy text
#                                # and `infer bench` with --device cpu and --device cuda
#   scripts/gpu-check.sh skel GGUF...  # here: header-only copies (metadata + tensor table, a few
#                                # MB) of GGUFs into .gpu/skel, with this machine's `infer synth`
#   scripts/gpu-check.sh synth [prep]  # on the GPU machine (carry .gpu/bin and .gpu/skel): random
#                                # weights of each skeleton's shapes and ggml types (`infer
#                                # synth`), a q4k vindex of each, `infer bench` with the device
#                                # decoder and with --host-loop, and llama.cpp's CUDA llama-bench
#                                # on the same GGUF when scripts/gpu-llamacpp.sh has built it;
#                                # `prep`: only make the files (no timing)
#   scripts/gpu-check.sh configs [NAME[:LAYERS]...]  # here: copy ../shared/configs/NAME/config.json
#                                # (default: llama-3.2-1b llama-3.1-8b:4 llama-3.1-8b; ":4" keeps
#                                # 4 layers) into .gpu/cfg/NAME[-4l]/ with llama.cpp's
#                                # ggml-vocab-llama-bpe.gguf (scripts/fetch-vocabs.sh)
#   scripts/gpu-check.sh decode  # on the GPU machine (carry .gpu/bin, .gpu/cfg, optionally
#                                # .gpu/skel and .gpu/llama after `gpu-llamacpp.sh start`): a
#                                # Q4_K_M GGUF of each config (`infer synth --gguf Q4_K_M
#                                # --random-blocks --vocab`: seconds, not minutes) and of each
#                                # skeleton, a vindex of each, then per model one `infer bench
#                                # -p 0 -n 128 -d 0,...` at depth 0 and each of DEPTHS
#                                # (default "4096 16384") with each KV cache type of KV_TYPES
#                                # (default f16), and llama-bench's tg128 (f16 cache) at the same
#                                # depths on the same GGUF when built
#   scripts/gpu-check.sh         # build + run, where cargo and a GPU are on one machine
#
# Full logs go to $OUT/gpu-check.log when OUT is set (the device tool), else .gpu/gpu-check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
GPU_DIR=.gpu
BIN="$GPU_DIR/bin"
# .gpu/ holds built binaries and copied data: never part of the repository.
if [[ -d .git ]]; then
    grep -qxF "/$GPU_DIR/" .git/info/exclude 2>/dev/null || echo "/$GPU_DIR/" >>.git/info/exclude
fi

# Fail with the fix when a carried folder is missing on the GPU machine.
need() {
    local what
    for what in "$@"; do
        [[ -e "$what" ]] || { echo "gpu-check: $what is missing: run \`scripts/gpu-check.sh build\` (and \`skel\` / \`split\`) here and carry ${what%/*} with the device call" >&2; exit 1; }
    done
}

# Build one cargo target set and copy the named executables (stripped) into .gpu/bin.
build_copy() {
    local names="$1"
    shift
    cargo "$@" --message-format=json 2>/dev/null |
        NAMES="$names" python3 -c '
import json, os, sys
names = os.environ["NAMES"].split()
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in names:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
        cp "$exe" "$BIN/$name"
        strip "$BIN/$name"
    done
}

build() {
    # The cuda feature rebuilds infer-compute: a target dir of its own (as scripts/test.sh).
    export CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-target/cuda}"
    mkdir -p "$BIN"
    rm -f "$BIN"/cuda_parity "$BIN"/cuda_bench "$BIN"/cuda_archrefs "$BIN"/cuda_real_model "$BIN"/infer
    build_copy "cuda_parity cuda_bench" test --release -p infer-compute --features cuda \
        --test cuda_parity --test cuda_bench --no-run
    build_copy "cuda_archrefs cuda_real_model" test --release -p infer-inference --features cuda \
        --test cuda_archrefs --test cuda_real_model --no-run
    build_copy "infer" build --release -p infer-cli --features cuda --bin infer
    for t in cuda_parity cuda_bench cuda_archrefs cuda_real_model infer; do
        [[ -x "$BIN/$t" ]] || { echo "gpu-check: build of $t failed (run the cargo command without --message-format to see why)" >&2; exit 1; }
    done
    # The archrefs cases, laid out as INFER_SHARED expects (INFER_SHARED/archrefs/<case>/ and
    # INFER_SHARED/archrefs-next/<case>/).
    local shared="${INFER_SHARED:-$(cd .. && pwd)/shared}"
    [[ -d "$shared/archrefs" ]] || { echo "gpu-check: no archrefs at $shared/archrefs (set INFER_SHARED)" >&2; exit 1; }
    [[ -d "$shared/archrefs-next" ]] || { echo "gpu-check: no archrefs-next at $shared/archrefs-next (set INFER_SHARED)" >&2; exit 1; }
    rm -rf "$GPU_DIR/shared"
    mkdir -p "$GPU_DIR/shared"
    cp -r "$shared/archrefs" "$shared/archrefs-next" "$GPU_DIR/shared/"
    du -sh "$BIN"/* "$GPU_DIR/shared"
}

split_model() {
    local gguf="$1"
    [[ -f "$gguf" ]] || { echo "gpu-check: no such GGUF: $gguf" >&2; exit 1; }
    rm -rf "$GPU_DIR/m1" "$GPU_DIR/m2"
    mkdir -p "$GPU_DIR/m1" "$GPU_DIR/m2"
    local size first=$((40 << 20))
    size=$(stat -c %s "$gguf")
    ((size - first <= 60 << 20)) || { echo "gpu-check: $gguf is over 100 MiB: two parts do not fit two calls" >&2; exit 1; }
    head -c "$first" "$gguf" >"$GPU_DIR/m1/part0"
    tail -c +$((first + 1)) "$gguf" >"$GPU_DIR/m2/part1"
    basename "$gguf" >"$GPU_DIR/m1/name"
    sha256sum "$gguf" | cut -d' ' -f1 >"$GPU_DIR/m1/sha256"
    ls -la "$GPU_DIR/m1" "$GPU_DIR/m2"
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

log_path() {
    local log="${OUT:-$GPU_DIR}/$1"
    mkdir -p "$(dirname "$log")"
    echo "$log"
}

run() {
    need "$BIN/cuda_parity" "$BIN/cuda_archrefs" "$BIN/cuda_bench" "$GPU_DIR/shared/archrefs"
    local log
    log=$(log_path gpu-check.log)
    find_libs
    {
        echo "== $(date -u +%FT%TZ) gpu-check"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true
        echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    } | tee "$log"
    local rc=0
    # Kernel parity first, then model parity (stop on failure), the benchmark table last.
    "$BIN/cuda_parity" --ignored --nocapture --test-threads=1 2>&1 | tee -a "$log" || rc=1
    INFER_SHARED="$PWD/$GPU_DIR/shared" "$BIN/cuda_archrefs" --ignored --nocapture --test-threads=1 2>&1 |
        tee -a "$log" || rc=1
    if [[ $rc -ne 0 ]]; then
        echo "gpu-check: PARITY FAILED (log: $log)"
        grep -E 'panicked|FAILED|failed' "$log" | head -40
        exit 1
    fi
    "$BIN/cuda_bench" --ignored --nocapture --test-threads=1 2>&1 | tee -a "$log" || rc=1
    echo
    echo "== parity (max |gpu-cpu| / sum|terms|) =="
    grep -o 'parity .*' "$log" || true
    echo "== archrefs on CUDA (max|Δ| / std; float tier vs HF/CPU <= 1e-4; quantized vs CPU: median position <= 1e-5, max <= 0.1) =="
    grep -E '^cuda archrefs (llama|gemma3) ' "$log" || true
    grep -E '^cuda archrefs [^ ]+: (ok|FAILED)' "$log" | tr '\n' ' ' || true
    echo
    sed -n '/^== CUDA quantized mat-vec/,/^test /p' "$log" | grep -v '^test '
    [[ $rc -eq 0 ]] && echo "gpu-check: OK" || { echo "gpu-check: BENCHMARK FAILED"; exit 1; }
}

# Real model on the device: reassemble, extract (q4k tier), bench CPU vs CUDA, greedy tokens.
model() {
    need "$BIN/cuda_real_model" "$BIN/infer" "$GPU_DIR/m1/name" "$GPU_DIR/m2/part1"
    local log
    log=$(log_path gpu-model.log)
    find_libs
    local name work="/tmp/infer-model"
    name=$(cat "$GPU_DIR/m1/name")
    mkdir -p "$work"
    cat "$GPU_DIR/m1/part0" "$GPU_DIR/m2/part1" >"$work/$name"
    echo "$(cat "$GPU_DIR/m1/sha256")  $work/$name" | sha256sum -c - | tee "$log"
    INFER_MODELS="$work" "$BIN/cuda_real_model" --ignored --nocapture --test-threads=1 2>&1 |
        tee -a "$log" || true
    if ! "$BIN/infer" bench --help | grep -q -- --device; then
        echo "gpu-check: this infer has no --device: CLI part skipped" | tee -a "$log"
        return
    fi
    local v="$work/model.vindex"
    [[ -d "$v" ]] || "$BIN/infer" extract "$work/$name" -o "$v" --quant q4k --float f32 2>&1 | tail -3 | tee -a "$log"
    local prompt='<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
'
    for dev in cpu cuda; do
        echo "== greedy, --device $dev" | tee -a "$log"
        "$BIN/infer" run "$v" "$prompt" -n 24 --temp 0 --device "$dev" >"$work/out.$dev" 2>"$work/err.$dev" || true
        cat "$work/out.$dev" "$work/err.$dev" | tee -a "$log"
    done
    if cmp -s "$work/out.cpu" "$work/out.cuda" && [[ -s "$work/out.cpu" ]]; then
        echo "greedy text: CPU and CUDA identical" | tee -a "$log"
    else
        echo "greedy text: CPU and CUDA DIFFER" | tee -a "$log"
    fi
    for dev in cpu cuda; do
        echo "== bench, --device $dev" | tee -a "$log"
        "$BIN/infer" bench "$v" --device "$dev" -p 128 -n 64 -r 3 2>&1 | tee -a "$log" || true
    done
}

skel() {
    local infer="${INFER_BIN:-${CARGO_TARGET_DIR:-target}/release/infer}" g
    [[ $# -gt 0 ]] || { echo "usage: $0 skel GGUF..." >&2; exit 2; }
    [[ -x "$infer" ]] || { echo "gpu-check: no $infer (cargo build --release)" >&2; exit 1; }
    mkdir -p "$GPU_DIR/skel"
    for g in "$@"; do
        # synth never replaces a GGUF file: remove the old skeleton first.
        rm -f "$GPU_DIR/skel/$(basename "$g")"
        "$infer" synth --like "$g" --header-only -o "$GPU_DIR/skel/$(basename "$g")"
    done
    du -sh "$GPU_DIR/skel"/*
}

# Same-file speed comparison on synthesised weights (see the header).
synth() {
    need "$BIN/infer"
    compgen -G "$GPU_DIR/skel/*.gguf" >/dev/null || { echo "gpu-check: no $GPU_DIR/skel/*.gguf: run \`scripts/gpu-check.sh skel GGUF...\` here and carry $GPU_DIR/skel" >&2; exit 1; }
    local log work=/tmp/infer-synth s name g v
    log=$(log_path gpu-synth.log)
    find_libs
    mkdir -p "$work"
    for s in "$GPU_DIR"/skel/*.gguf; do
        name=$(basename "$s" .gguf)
        g="$work/$name.gguf"
        v="$work/$name.vindex"
        [[ -f "$g" ]] || "$BIN/infer" synth --like "$s" -o "$g" 2>&1 | tail -2 | tee -a "$log"
        [[ -d "$v" ]] || "$BIN/infer" extract "$g" -o "$v" --quant q4k --float f32 --no-tokenizer 2>&1 | tail -2 | tee -a "$log"
        [[ "${1:-}" == prep ]] && continue
        echo "== $name: infer bench --device cuda (device decoder, then --host-loop)" | tee -a "$log"
        "$BIN/infer" bench "$v" --device cuda -p 128 -n 64 -r 5 --profile 2>&1 | tee -a "$log" || true
        "$BIN/infer" bench "$v" --device cuda -p 128 -n 64 -r 5 --json 2>&1 | tee -a "$log" || true
        "$BIN/infer" bench "$v" --device cuda --host-loop -p 0 -n 64 -r 3 2>&1 | tee -a "$log" || true
        if [[ -x /tmp/llama-build/bin/llama-bench ]]; then
            echo "== $name: llama.cpp CUDA llama-bench" | tee -a "$log"
            bash scripts/gpu-llamacpp.sh bench "$g" 2>&1 | tee -a "$log" || true
        else
            echo "== $name: llama-bench not built (scripts/gpu-llamacpp.sh start)" | tee -a "$log"
        fi
    done
}

# Real-size configs for `decode`, with the tokenizer vocabulary their GGUFs carry.
configs() {
    local shared="${INFER_SHARED:-$(cd .. && pwd)/shared}" spec name layers out vocabs
    [[ $# -gt 0 ]] || set -- llama-3.2-1b llama-3.1-8b:4 llama-3.1-8b
    vocabs=$(bash scripts/fetch-vocabs.sh)
    rm -rf "$GPU_DIR/cfg"
    mkdir -p "$GPU_DIR/cfg"
    cp "$vocabs/ggml-vocab-llama-bpe.gguf" "$GPU_DIR/cfg/"
    for spec in "$@"; do
        name=${spec%%:*}
        layers=${spec#"$name"}
        layers=${layers#:}
        [[ -f "$shared/configs/$name/config.json" ]] || { echo "gpu-check: no $shared/configs/$name/config.json" >&2; exit 1; }
        out="$GPU_DIR/cfg/$name${layers:+-${layers}l}"
        mkdir -p "$out"
        python3 - "$shared/configs/$name/config.json" "$out/config.json" "$layers" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if sys.argv[3]:
    c["num_hidden_layers"] = int(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
    done
    du -sh "$GPU_DIR/cfg"/*
}

# Decode at real sizes: tg128 at depth 0 and DEPTHS, infer (each of KV_TYPES) vs llama.cpp on
# the same GGUFs.
decode() {
    need "$BIN/infer" "$GPU_DIR/cfg/ggml-vocab-llama-bpe.gguf"
    local log work=/tmp/infer-decode c s n d kv depths="${DEPTHS:-4096 16384}" bench=/tmp/llama-build/bin/llama-bench
    log=$(log_path gpu-decode.log)
    find_libs
    mkdir -p "$work"
    make_model() { # NAME LIKE [synth args...]
        local n=$1 like=$2
        shift 2
        [[ -f "$work/$n.gguf" ]] || "$BIN/infer" synth --like "$like" "$@" -o "$work/$n.gguf" 2>&1 | tail -1
        [[ -d "$work/$n.vindex" ]] || "$BIN/infer" extract "$work/$n.gguf" -o "$work/$n.vindex" --no-tokenizer 2>&1 | tail -1
    }
    local names=()
    for c in "$GPU_DIR"/cfg/*/config.json; do
        n=$(basename "$(dirname "$c")")
        names+=("$n")
        make_model "$n" "$c" --gguf Q4_K_M --random-blocks --vocab "$GPU_DIR/cfg/ggml-vocab-llama-bpe.gguf" &
    done
    for s in "$GPU_DIR"/skel/*.gguf; do
        [[ -f "$s" ]] || continue
        n=$(basename "$s" .gguf)
        names+=("$n")
        make_model "$n" "$s" &
    done
    wait
    {
        for n in "${names[@]}"; do
            for kv in ${KV_TYPES:-f16}; do
                echo "== $n: infer tg128 @ d0,${depths// /,}, --kv-type $kv"
                if "$BIN/infer" bench "$work/$n.vindex" --device cuda --kv-type "$kv" -p 0 -n 128 -d "0,${depths// /,}" -r 3 >"$work/bench.out" 2>&1; then
                    grep -E '^\|.*tg|decode reads|^memory' "$work/bench.out"
                else
                    echo "infer bench failed: $(tail -1 "$work/bench.out")"
                fi
            done
        done
        if [[ -x "$bench" ]]; then
            local dl="0,${depths// /,}"
            for n in "${names[@]}"; do
                echo "== $n: llama-bench tg128 @ d$dl (f16 cache)"
                "$bench" -m "$work/$n.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d "$dl" -r 3 -o md 2>/dev/null | grep tg128 || true
            done
        else
            echo "== llama-bench not built (scripts/gpu-llamacpp.sh start, then wait)"
        fi
    } 2>&1 | tee -a "$log"
}

case "$mode" in
build) build ;;
run) run ;;
split) split_model "${2:?usage: $0 split GGUF}" ;;
model) model ;;
skel) shift; skel "$@" ;;
synth) synth "${2:-}" ;;
configs) shift; configs "$@" ;;
decode) decode ;;
all) build && run ;;
*) echo "usage: $0 [build|run|split GGUF|model|skel GGUF...|synth|configs [NAME[:LAYERS]...]|decode]" >&2; exit 2 ;;
esac
