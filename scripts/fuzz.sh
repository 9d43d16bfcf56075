#!/usr/bin/env bash
# Fuzz infer's parsers with cargo-fuzz (libFuzzer) targets of fuzz/ (FUZZING.md lists them).
#
#   bash scripts/fuzz.sh TARGET SECONDS [libFuzzer flags]   one target
#   bash scripts/fuzz.sh all SECONDS                         every target, one after another
#   bash scripts/fuzz.sh smoke [SECONDS]                     every target at once, SECONDS
#                                                            (default 60) each: the CI step
#
# Works on a stable toolchain: RUSTC_BOOTSTRAP=1 lets stable rustc accept the -Z flags
# cargo-fuzz passes (sanitizer coverage, AddressSanitizer); on nightly it is harmless. Targets
# are built optimised with AddressSanitizer and debug assertions (integer overflow checks on).
# cargo-fuzz is installed (`cargo install cargo-fuzz --locked`) when missing.
#
# Inputs: fuzz/seeds/TARGET (committed, read only) and fuzz/corpus/TARGET (grows, ignored by
# git); fuzz/dicts/TARGET.dict. A crash, a leak, an input using more than 2 GB (-rss_limit_mb)
# or taking more than 10 s (-timeout) stops the target, leaves the input in
# fuzz/artifacts/TARGET/ and makes this script exit non-zero. Each run appends
# "TARGET SECONDS EXECUTIONS CORPUS_FILES COVERAGE exit=N" to fuzz/artifacts/runs.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
mode=$1
seconds=${2:-60}
[ $# -ge 2 ] && shift 2 || shift 1
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
all=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^infer-fuzz$')
case $mode in
  all|smoke) targets=$all ;;
  *) grep -qx "$mode" <<<"$all" || { echo "unknown target '$mode' (targets: $(echo $all))" >&2; exit 2; }
     targets=$mode ;;
esac
# `cargo fuzz build` takes one target, or none for all of them.
if [ "$mode" = all ] || [ "$mode" = smoke ]; then
  cargo fuzz build --fuzz-dir fuzz -O
else
  cargo fuzz build --fuzz-dir fuzz -O "$mode"
fi
mkdir -p fuzz/artifacts

# run_one TARGET: fuzz it for $seconds; print its stats line; exit status of libFuzzer.
run_one() {
  local t=$1 status=0
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  local dict=(); [ -f "fuzz/dicts/$t.dict" ] && dict=(-dict="fuzz/dicts/$t.dict")
  local log="fuzz/artifacts/$t/last-run.log"
  cargo fuzz run --fuzz-dir fuzz -O "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=1048576 \
    -print_final_stats=1 "${dict[@]}" "${extra[@]}" >"$log" 2>&1 || status=$?
  local execs cov corpus
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
  echo "$t $seconds ${execs:-?} $corpus ${cov:-?} exit=$status" | tee -a fuzz/artifacts/runs.txt
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log" >&2
    echo "fuzz target $t failed: input saved under fuzz/artifacts/$t, log $log" >&2
  fi
  return "$status"
}

extra=("$@")
failed=0
if [ "$mode" = smoke ]; then
  pids=()
  for t in $targets; do run_one "$t" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
else
  for t in $targets; do run_one "$t" || failed=1; done
fi
exit $failed
