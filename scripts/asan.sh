#!/usr/bin/env bash
# The unit and integration tests of the crates with `unsafe` code (SIMD kernels, mmap, shared
# output buffers, signal handlers) under AddressSanitizer: out-of-bounds reads and writes,
# use-after-free and leaks in our code fail the test that caused them. Opt-in (a full rebuild
# of every crate with ASan, ~15 min on 2 cores); FUZZING.md records its last run.
#
#   bash scripts/asan.sh [cargo test arguments]    e.g. bash scripts/asan.sh -- --test-threads 1
#
# Works on a stable toolchain (RUSTC_BOOTSTRAP=1 admits -Zsanitizer). The explicit --target
# keeps the flags off build scripts and proc macros, which cannot load the ASan runtime; the
# standard library itself is not instrumented (no -Zbuild-std), as in cargo-fuzz's builds.
# Separate target dir (target/asan). Needs the shared reference data as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
export INFER_SHARED="${INFER_SHARED:-$(cd .. && pwd)/shared}"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
# Leak reports stay on; the mapped test files and the process-wide thread pools are freed at exit.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
host=$(rustc -vV | sed -n 's/^host: //p')
CARGO_TARGET_DIR="${ASAN_TARGET_DIR:-target/asan}" cargo test --release --target "$host" \
  -p infer-compute -p infer-quant -p infer-vindex -p infer-models -p infer-inference "$@"
