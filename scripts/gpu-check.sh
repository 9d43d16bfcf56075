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
#                                # .gpu/shared/archrefs{,-next}, and compile the kernels for
#                                # sm_90 into .gpu/cache/kernels (carry it: the device runs
#                                # then start without NVRTC; .gpu/ is ignored through
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
#                                # synth`), a q4k vindex of each, `infer bench` (a table with
#                                # --profile, then --json), and llama.cpp's CUDA llama-bench
#                                # on the same GGUF when scripts/gpu-llamacpp.sh has built it;
#                                # `prep`: only make the files (no timing)
#   scripts/gpu-check.sh configs [NAME[:LAYERS[:DIV]]...|all]  # here: copy
#                                # ../shared/configs/NAME/config.json (default: llama-3.2-1b
#                                # llama-3.1-8b:4 llama-3.1-8b; `all`: every config there; ":4"
#                                # keeps 4 layers, ":2:4" 2 layers with the widths and head counts
#                                # divided by 4, for dry runs on a CPU) into
#                                # .gpu/cfg/NAME[-4l|-2l-d4]/, and the vocabulary GGUF llama.cpp
#                                # needs to load a GGUF of each family into .gpu/cfg/ (vocab_for:
#                                # llama.cpp's ggml-vocab-{llama-bpe,llama-spm,qwen2}.gguf from
#                                # scripts/fetch-vocabs.sh; for gemma3 ggml-vocab-gemma3.gguf, the
#                                # header-only copy of the Gemma-3-270M GGUF in INFER_MODELS);
#                                # `infer synth --vocab` pads a shorter vocabulary to vocab_size
#   scripts/gpu-check.sh decode  # on the GPU machine (carry .gpu/bin, .gpu/cfg, optionally
#                                # .gpu/skel and .gpu/llama after `gpu-llamacpp.sh start`): a
#                                # Q4_K_M GGUF of each config in .gpu/cfg, all at once (`infer
#                                # synth --gguf Q4_K_M --random-blocks --vocab`: seconds, not
#                                # minutes; so not after `configs all`) and of each skeleton, a
#                                # vindex of each, then per model one `infer bench -p 0 -n 128
#                                # -d 0,...` at depth 0 and each of DEPTHS
#                                # (default "4096 16384") with each KV cache type of KV_TYPES
#                                # (default f16), and llama-bench's tg128 (f16 cache) at the same
#                                # depths on the same GGUF when built
#   scripts/gpu-check.sh sizes [--plan] [NAME...]  # on the GPU machine (carry .gpu/bin and
#                                # .gpu/cfg after `configs all`; .gpu/llama and `gpu-llamacpp.sh
#                                # start` / `wait` in earlier calls for the llama.cpp column): the
#                                # real-size shapes (default: qwen2.5-7b gemma-3-4b mixtral-8x7b
#                                # qwen3-30b-a3b llama-3.1-70b), one model at a time: plan (a
#                                # header-only synth with the family's vocabulary gives the GGUF's
#                                # size; the GGUF and the vindex go where `df` and MemAvailable
#                                # say they fit: both in /tmp, else the vindex or the GGUF in
#                                # /dev/shm (a 70B's 40 GiB twice does not fit a 64 GiB disk),
#                                # else refuse with the numbers), `infer synth --gguf Q4_K_M
#                                # --random-blocks --vocab`, `infer extract --no-tokenizer`,
#                                # `infer bench --device cuda $SIZES_BENCH`, llama.cpp's
#                                # `llama-bench -ngl 99 -fa 1 $SIZES_BENCH` on the same GGUF
#                                # (when $LLAMA_GPU_BUILD/bin/llama-bench is built), each step
#                                # timed; then the model's files are deleted and its markdown row
#                                # printed (both engines' tokens/s, the ratios, infer's memory
#                                # line); the table of all rows last. A model whose estimated time
#                                # (from its size, calibrated on the models already run) would pass
#                                # SIZES_BUDGET stops the run cleanly with what to run next.
#                                # `--plan`: only the plan of each (no data written).
#                                # Env: SIZES_BUDGET (seconds from the start, default 540: a
#                                # device call runs at most 600 s), SIZES_BENCH (default "-p 512
#                                # -n 128 -r 3", given to both engines), SIZES_DEVICE (default
#                                # cuda; cpu runs the same pipeline here as a dry run, with
#                                # INFER_BIN (default .gpu/bin/infer) and LLAMA_GPU_BUILD (default
#                                # /tmp/llama-build) pointing at CPU builds)
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
    # The kernels compiled for sm_90 (H100/H200) into the kernel cache the device runs use
    # (find_libs), so a fresh device neither runs NVRTC nor JIT-compiles PTX (minutes there).
    rm -rf "$GPU_DIR/cache/kernels"
    local nvrtc
    nvrtc=$(bash scripts/fetch-nvrtc.sh)
    INFER_CACHE="$PWD/$GPU_DIR/cache" LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$BIN/cuda_parity" --exact kernels_compile_with_nvrtc --nocapture | grep -E '^kernels:' ||
        { echo "gpu-check: compiling the kernels for sm_90 failed" >&2; exit 1; }
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

# Put the driver and NVRTC on the loader path: the CUDA toolkit's lib64, else the pip wheel's;
# and use the kernels `build` compiled for sm_90 (.gpu/cache/kernels) unless INFER_CACHE is set.
find_libs() {
    local d
    [[ -d "$GPU_DIR/cache/kernels" ]] && export INFER_CACHE="${INFER_CACHE:-$PWD/$GPU_DIR/cache}"
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
    if [[ $rc -eq 0 ]]; then echo "gpu-check: OK"; else echo "gpu-check: BENCHMARK FAILED"; exit 1; fi
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
        echo "== $name: infer bench --device cuda (--profile, then --json)" | tee -a "$log"
        "$BIN/infer" bench "$v" --device cuda -p 128 -n 64 -r 5 --profile 2>&1 | tee -a "$log" || true
        "$BIN/infer" bench "$v" --device cuda -p 128 -n 64 -r 5 --json 2>&1 | tee -a "$log" || true
        if [[ -x /tmp/llama-build/bin/llama-bench ]]; then
            echo "== $name: llama.cpp CUDA llama-bench" | tee -a "$log"
            bash scripts/gpu-llamacpp.sh bench "$g" 2>&1 | tee -a "$log" || true
        else
            echo "== $name: llama-bench not built (scripts/gpu-llamacpp.sh start)" | tee -a "$log"
        fi
    done
}

# The vocabulary GGUF (a file name in .gpu/cfg) whose tokenizer a GGUF of CONFIG carries, so
# that llama.cpp loads it: Llama 3 (128256 tokens) llama.cpp's llama-bpe, Llama 2 / Mistral /
# Mixtral (32000) llama-spm, Qwen2 / Qwen2.5 / Qwen3 (MoE too) qwen2 (151936), Gemma 3 the
# Gemma-3-270M GGUF's header (262144). `infer synth --vocab` pads it to the config's vocab_size
# with [PAD{id}] tokens as convert_hf_to_gguf.py does (Qwen2.5-7B: 152064, Gemma-3-4B: 262208).
vocab_for() {
    python3 - "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
t = c.get("model_type", "")
v = {"llama": "llama-bpe" if c.get("vocab_size", 0) >= 128000 else "llama-spm",
     "mistral": "llama-spm", "mixtral": "llama-spm",
     "qwen2": "qwen2", "qwen2_moe": "qwen2", "qwen3": "qwen2", "qwen3_moe": "qwen2",
     "gemma3": "gemma3", "gemma3_text": "gemma3"}.get(t)
if v is None:
    sys.exit(f"gpu-check: {sys.argv[1]}: no vocabulary GGUF known for model_type {t!r} (see vocab_for)")
print(f"ggml-vocab-{v}.gguf")
PY
}

# Real-size configs for `decode` and `sizes`, with the tokenizer vocabularies their GGUFs carry.
configs() {
    local shared="${INFER_SHARED:-$(cd .. && pwd)/shared}" spec name rest layers div out vocabs v
    local infer="${INFER_BIN:-${CARGO_TARGET_DIR:-target}/release/infer}"
    local gemma="${INFER_MODELS:-${INFER_CACHE:-$HOME/.cache/infer}/models}/gemma-3-270m-q4_k_m.gguf"
    [[ $# -gt 0 ]] || set -- llama-3.2-1b llama-3.1-8b:4 llama-3.1-8b
    if [[ "$*" == all ]]; then
        set --
        for spec in "$shared"/configs/*/config.json; do set -- "$@" "$(basename "$(dirname "$spec")")"; done
    fi
    vocabs=$(bash scripts/fetch-vocabs.sh)
    rm -rf "$GPU_DIR/cfg"
    mkdir -p "$GPU_DIR/cfg"
    for spec in "$@"; do
        name=${spec%%:*}
        rest=${spec#"$name"}
        rest=${rest#:}
        layers=${rest%%:*}
        div=${rest#"$layers"}
        div=${div#:}
        [[ -f "$shared/configs/$name/config.json" ]] || { echo "gpu-check: no $shared/configs/$name/config.json" >&2; exit 1; }
        out="$GPU_DIR/cfg/$name${layers:+-${layers}l}${div:+-d$div}"
        mkdir -p "$out"
        python3 - "$shared/configs/$name/config.json" "$out/config.json" "$layers" "$div" <<'PY'
import json, sys
src, dst, layers, div = sys.argv[1:]
c = json.load(open(src))
if layers:
    c["num_hidden_layers"] = int(layers)
    if isinstance(c.get("layer_types"), list):
        c["layer_types"] = c["layer_types"][: int(layers)]
if div:
    d = int(div)
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    for k in ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads"):
        if k in c:
            if c[k] % d:
                sys.exit(f"gpu-check: {src}: {k} {c[k]} is not a multiple of {d}")
            c[k] //= d
    c["num_key_value_heads"] = max(1, c["num_key_value_heads"] // d)
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        sys.exit(f"gpu-check: {src}: divided by {d}, {c['num_attention_heads']} heads are no multiple of {c['num_key_value_heads']} KV heads")
json.dump(c, open(dst, "w"), indent=1)
PY
        v=$(vocab_for "$out/config.json")
        [[ -f "$GPU_DIR/cfg/$v" ]] && continue
        if [[ "$v" == ggml-vocab-gemma3.gguf ]]; then
            # No ggml-vocab file for Gemma 3: the header (metadata and tensor table, 6 MB) of the
            # Gemma-3-270M GGUF carries its tokenizer.
            [[ -x "$infer" ]] || { echo "gpu-check: no $infer to copy the Gemma-3 header (cargo build --release, or set INFER_BIN)" >&2; exit 1; }
            [[ -f "$gemma" ]] || { echo "gpu-check: no $gemma (../shared/models/README.md; set INFER_MODELS)" >&2; exit 1; }
            "$infer" synth --like "$gemma" --header-only -o "$GPU_DIR/cfg/$v"
        else
            cp "$vocabs/$v" "$GPU_DIR/cfg/"
        fi
    done
    du -sh "$GPU_DIR/cfg"/*
    du -sh "$GPU_DIR/cfg"
}

# Decode at real sizes: tg128 at depth 0 and DEPTHS, infer (each of KV_TYPES) vs llama.cpp on
# the same GGUFs.
decode() {
    need "$BIN/infer"
    compgen -G "$GPU_DIR/cfg/*/config.json" >/dev/null || { echo "gpu-check: no $GPU_DIR/cfg/*/config.json: run \`scripts/gpu-check.sh configs\` here and carry $GPU_DIR/cfg" >&2; exit 1; }
    local log work=/tmp/infer-decode c s n d v kv depths="${DEPTHS:-4096 16384}" bench=/tmp/llama-build/bin/llama-bench
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
        v="$GPU_DIR/cfg/$(vocab_for "$c")"
        need "$v"
        make_model "$n" "$c" --gguf Q4_K_M --random-blocks --vocab "$v" &
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

# The real-size shapes of `sizes` (../shared/configs names; `configs all` copies them).
SIZES_MODELS="qwen2.5-7b gemma-3-4b mixtral-8x7b qwen3-30b-a3b llama-3.1-70b"

# Seconds since $1 (an $EPOCHREALTIME), one decimal.
since() {
    awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

# Where a GGUF of GBYTES and its vindex of VBYTES go: prints "GGUF_DIR VINDEX_DIR", the first
# that fits of (both in DISK), (GGUF in DISK, vindex in SHM), (GGUF in SHM, vindex in DISK),
# (both in SHM): each filesystem keeps 1 GiB free, and what goes to a tmpfs (RAM) leaves
# MemAvailable 16 GiB for the benchmarks. Else the numbers and exit 1.
place() {
    python3 - "$@" <<'PY'
import os, subprocess, sys
g, v, disk, shm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
GiB = 1 << 30
mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
def fs(d):
    if not os.path.isdir(d):
        return None
    st = os.statvfs(d)
    kind = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
    return {"dir": d, "dev": os.stat(d).st_dev, "free": st.f_bavail * st.f_frsize, "tmpfs": kind == "tmpfs"}
dirs = [f for f in (fs(disk), fs(shm)) if f]
def fits(gd, vd):
    need = {}
    for f, b in ((gd, g), (vd, v)):
        need.setdefault(f["dev"], [f, 0])[1] += b
    ram = sum(b for f, b in need.values() if f["tmpfs"])
    return all(b + GiB <= f["free"] for f, b in need.values()) and (ram == 0 or ram + 16 * GiB <= mem)
for gd, vd in ((0, 0), (0, 1), (1, 0), (1, 1)):
    if gd < len(dirs) and vd < len(dirs) and fits(dirs[gd], dirs[vd]):
        print(dirs[gd]["dir"], dirs[vd]["dir"])
        sys.exit(0)
free = ", ".join(f"{f['dir']} {f['free'] / GiB:.1f} GiB free{' (tmpfs)' if f['tmpfs'] else ''}" for f in dirs)
sys.exit(f"does not fit: GGUF {g / GiB:.1f} GiB + vindex ~{v / GiB:.1f} GiB, each filesystem keeping 1 GiB "
         f"and a tmpfs leaving 16 GiB of MemAvailable ({mem / GiB:.1f} GiB); {free}")
PY
}

# The markdown header (HEADER) or one row (ROW NAME GIB INFER_OUT LLAMA_JSON TIMES NOTE) of
# `sizes`: per test of SIZES_BENCH (pp<p>, tg<n>) infer's and llama.cpp's tokens/s and their
# ratio, then the step times, infer's decode and memory lines and any note.
sizes_row() {
    python3 - "$@" <<'PY'
import json, re, sys
bench = sys.argv[1]
ints = lambda flag: [int(x) for m in re.findall(rf"(?:^|\s){flag}\s+(\S+)", bench) for x in m.split(",")]
tests = [f"pp{p}" for p in (ints("-p") or [512]) if p] + [f"tg{n}" for n in (ints("-n") or [128]) if n]
if sys.argv[2] == "HEADER":
    cols = ["model", "GGUF GiB"] + [c for t in tests for c in (f"{t} infer t/s", f"{t} llama.cpp t/s", f"{t} infer/llama")]
    cols += ["synth / extract / infer bench / llama-bench s", "infer memory"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" if i == 0 or i >= len(cols) - 2 else "---:" for i in range(len(cols))) + "|")
    sys.exit(0)
_, _, name, gib, infer_out, llama_json, times, note = sys.argv
ours, mem, dec = {}, "", ""
try:
    for line in open(infer_out):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4 and cells[2] in tests:
            ours[cells[2]] = float(cells[3])
        elif line.startswith("memory:"):
            mem = line.strip()[len("memory:"):].strip()
        elif line.startswith("decode:"):
            dec = line.strip()
except (OSError, ValueError):
    pass
theirs = {}
try:
    for r in json.load(open(llama_json)):
        t = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        theirs[t] = float(r["avg_ts"])
except (OSError, ValueError, KeyError, TypeError):
    pass
cells = [name, gib]
for t in tests:
    a, b = ours.get(t), theirs.get(t)
    cells += [f"{a:.1f}" if a else "–", f"{b:.1f}" if b else "–", f"{a / b:.2f}x" if a and b else "–"]
cells += [times, "; ".join(x for x in (dec, mem, note) if x) or "–"]
print("| " + " | ".join(cells) + " |")
PY
}

# One timed step of `sizes`: LABEL CMD...; the output goes to $disk/LABEL.out and the log, one
# line here (time, then the output's last line); the step's times are collected in $times.
sizes_step() {
    local label=$1 st=$EPOCHREALTIME out="$disk/$1.out" r=0 took last
    shift
    "$@" >"$out" 2>&1 || r=$?
    cat "$out" >>"$log"
    took=$(since "$st")
    times="${times:+$times / }$took"
    last=$(grep -v '^[[:space:]]*$' "$out" | tail -1 | tr -d '\r|' | cut -c1-160)
    ((r == 0)) || last="FAILED (rc $r): $last"
    printf '  %-12s %6s s  %s\n' "$label" "$took" "$last" | tee -a "$log"
    return "$r"
}

# llama.cpp's llama-bench on GGUF, its JSON into $disk/llama.json.
sizes_llama() {
    # shellcheck disable=SC2086
    "$lbench" -m "$1" "${lbench_dev[@]}" -fa 1 $bargs -o json >"$disk/llama.json"
}

# Real-size shapes, infer vs llama.cpp on the same GGUF, one model at a time (see the header).
sizes() {
    local plan=0
    [[ "${1:-}" == --plan ]] && { plan=1; shift; }
    # shellcheck disable=SC2086
    [[ $# -gt 0 ]] || set -- $SIZES_MODELS
    local infer="${INFER_BIN:-$BIN/infer}" dev="${SIZES_DEVICE:-cuda}" budget="${SIZES_BUDGET:-540}"
    local bargs="${SIZES_BENCH:--p 512 -n 128 -r 3}" lbench="${LLAMA_GPU_BUILD:-/tmp/llama-build}/bin/llama-bench"
    local disk=/tmp/infer-sizes shm=/dev/shm/infer-sizes t0=$EPOCHREALTIME
    local log rows i name cfg v head data gb vb gib vgib est where gdir vdir g x s times note
    local done_n=0 done_gib=0 done_s=0 setup=45 rate=9 left call_s=0
    local -a calls=()
    local -a lbench_dev=(-ngl 99)
    [[ "$dev" == cpu ]] && lbench_dev=()
    [[ -x "$infer" ]] || { echo "gpu-check: no $infer: run \`scripts/gpu-check.sh build\` here and carry $BIN (or set INFER_BIN)" >&2; exit 1; }
    for name in "$@"; do
        cfg="$GPU_DIR/cfg/$name/config.json"
        [[ -f "$cfg" ]] || { echo "gpu-check: no $cfg: run \`scripts/gpu-check.sh configs all\` here and carry $GPU_DIR/cfg" >&2; exit 1; }
        v="$GPU_DIR/cfg/$(vocab_for "$cfg")"
        [[ -f "$v" ]] || { echo "gpu-check: no $v: run \`scripts/gpu-check.sh configs\` with $name here and carry $GPU_DIR/cfg" >&2; exit 1; }
    done
    log=$(log_path gpu-sizes.log)
    rows=$(mktemp /tmp/infer-sizes-rows.XXXXXX)
    find_libs
    # Files of an earlier call stopped mid-model (by the device's time limit) go first.
    rm -rf "$disk" "$shm"
    mkdir -p "$disk"
    mkdir -p "$shm" 2>/dev/null || true
    # shellcheck disable=SC2064
    trap "rm -rf '$disk' '$shm' '$rows'" EXIT
    {
        echo "== $(date -u +%FT%TZ) sizes: $* (device $dev, bench $bargs, budget ${budget} s)"
        ! command -v nvidia-smi >/dev/null ||
            nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 || true
        df -h "$disk" "$shm" 2>/dev/null | sed 's/^/  /' || true
        grep -E '^(MemTotal|MemAvailable):' /proc/meminfo | sed 's/^/  /'
        [[ -x "$lbench" ]] || echo "  no $lbench: llama.cpp columns empty (scripts/gpu-llamacpp.sh start, then wait)"
    } | tee -a "$log"
    for ((i = 1; i <= $#; i++)); do
        name=${!i}
        cfg="$GPU_DIR/cfg/$name/config.json"
        v="$GPU_DIR/cfg/$(vocab_for "$cfg")"
        # The plan: a header-only synth (a few MB) gives the file's size without writing it.
        head="$disk/$name.head.gguf"
        rm -f "$head"
        if ! x=$("$infer" synth --like "$cfg" --gguf Q4_K_M --vocab "$v" --header-only -o "$head" 2>&1); then
            echo "== $name: synth refuses the config: $x" | tee -a "$log"
            sizes_row "$bargs" "$name" "–" /dev/null /dev/null "–" "synth refused: ${x//|/}" >>"$rows"
            continue
        fi
        data=$("$infer" inspect "$head" | sed -n 's/^tensor data: *\([0-9][0-9]*\) bytes needed.*/\1/p')
        [[ -n "$data" ]] || { echo "gpu-check: \`infer inspect $head\` gave no tensor data size" >&2; exit 1; }
        gb=$(($(stat -c %s "$head") + data))
        rm -f "$head"
        # The vindex: the GGUF's blocks passed through plus small files (under 1.05x measured).
        vb=$((gb + gb / 16 + (64 << 20)))
        gib=$(awk -v b="$gb" 'BEGIN { printf "%.1f", b / 2^30 }')
        vgib=$(awk -v b="$vb" 'BEGIN { printf "%.1f", b / 2^30 }')
        # Time: 45 s of process starts and loading plus 9 s per GiB (synth, extract, two loads,
        # the runs), until the models run so far give their own rate.
        if ((done_n > 0)) && awk -v g="$done_gib" 'BEGIN { exit !(g >= 1) }'; then
            rate=$(awk -v s="$done_s" -v g="$done_gib" -v c="$setup" -v n="$done_n" 'BEGIN { r = (s - c * n) / g; printf "%.1f", r < 1 ? 1 : r }')
        fi
        est=$(awk -v g="$gib" -v r="$rate" -v c="$setup" 'BEGIN { printf "%d", c + r * g }')
        left=$(awk -v b="$budget" -v t="$(since "$t0")" 'BEGIN { printf "%d", b - t }')
        if ! where=$(place "$gb" "$vb" "$disk" "$shm" 2>&1); then
            echo "== $name: GGUF $gib GiB ($data B of tensor data, tokenizer $(basename "$v")), vindex ~$vgib GiB: REFUSED, $where" | tee -a "$log"
            sizes_row "$bargs" "$name" "$gib" /dev/null /dev/null "–" "refused: $where" >>"$rows"
            continue
        fi
        read -r gdir vdir <<<"$where"
        echo "== $name: GGUF $gib GiB (tokenizer $(basename "$v")) in $gdir, vindex ~$vgib GiB in $vdir; ~${est} s estimated (${setup} s + ${rate} s/GiB), ${left} s of the budget left" | tee -a "$log"
        if ((plan)); then
            sizes_row "$bargs" "$name" "$gib" /dev/null /dev/null "–" "plan: GGUF in $gdir, vindex in $vdir, ~${est} s" >>"$rows"
            # Calls of SIZES_BUDGET seconds: a model starts a new call when the current one is full.
            if ((${#calls[@]} == 0 || call_s + est > budget)); then
                calls+=("$name")
                call_s=$est
            else
                calls[-1]+=" $name"
                call_s=$((call_s + est))
            fi
            continue
        fi
        if ((est > left)); then
            echo "== stopped before $name (~${est} s estimated, ${left} s of SIZES_BUDGET=${budget} left); next call: scripts/gpu-check.sh sizes ${*:i}" | tee -a "$log"
            break
        fi
        g="$gdir/$name.gguf"
        x="$vdir/$name.vindex"
        s=$EPOCHREALTIME
        times="" note=""
        : >"$disk/llama.json"
        : >"$disk/infer-bench.out"
        # shellcheck disable=SC2086
        if sizes_step synth "$infer" synth --like "$cfg" --gguf Q4_K_M --random-blocks --vocab "$v" -o "$g" &&
            sizes_step extract "$infer" extract "$g" -o "$x" --no-tokenizer &&
            du -sb "$g" "$x" | awk '{ printf "  %-12s %6.2f GiB %s\n", "on disk", $1 / 2^30, $2 }' | tee -a "$log" &&
            sizes_step infer-bench "$infer" bench "$x" --device "$dev" $bargs; then
            rm -rf "$x"
            if [[ -x "$lbench" ]]; then
                sizes_step llama-bench sizes_llama "$g" || note="llama-bench failed: $(grep -v '^[[:space:]]*$' "$disk/llama-bench.out" | tail -1 | tr -d '|' | cut -c1-200)"
            else
                note="llama-bench not built"
            fi
        else
            note="failed: $(tail -qn1 "$disk"/*.out 2>/dev/null | tail -1 | tr -d '|' | cut -c1-200)"
        fi
        rm -rf "$x" "$g"
        sizes_row "$bargs" "$name" "$gib" "$disk/infer-bench.out" "$disk/llama.json" "${times:-–}" "$note" >>"$rows"
        tail -1 "$rows" | tee -a "$log"
        rm -f "$disk"/*.out "$disk/llama.json"
        done_n=$((done_n + 1))
        done_gib=$(awk -v a="$done_gib" -v b="$gib" 'BEGIN { print a + b }')
        done_s=$(awk -v a="$done_s" -v b="$(since "$s")" 'BEGIN { printf "%d", a + b }')
        echo "  model total  $(since "$s") s; $(since "$t0") s since the start" | tee -a "$log"
    done
    {
        echo
        sizes_row "$bargs" HEADER
        cat "$rows"
        for name in "${calls[@]}"; do echo "one call within SIZES_BUDGET=$budget s: scripts/gpu-check.sh sizes $name"; done
    } | tee -a "$log"
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
sizes) shift; sizes "$@" ;;
all) build && run ;;
*) echo "usage: $0 [build|run|split GGUF|model|skel GGUF...|synth|configs [NAME[:LAYERS[:DIV]]...|all]|decode|sizes [--plan] [NAME...]]" >&2; exit 2 ;;
esac
