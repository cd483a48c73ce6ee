#!/usr/bin/env bash
# Runs the coverage-guided fuzz targets under fuzz/ (cargo-fuzz, libFuzzer), each for a bounded
# time; exits non-zero when any target finds a crash or a broken property, leaving the input
# that did it under fuzz/artifacts/TARGET/.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  default 3600 (on-demand runs); .ci/run passes a few seconds
#   TARGET...           default: every target (`cargo fuzz list`)
#
# The toolchain is stable Rust; cargo-fuzz needs nightly-only compiler flags (the coverage
# instrumentation passes), which RUSTC_BOOTSTRAP=1 allows on stable. Targets are built without
# a sanitizer (the crate forbids `unsafe`, so AddressSanitizer has little to find and would
# need a nightly std built with it) but with debug assertions and overflow checks, in release
# mode with 16 codegen units (a build of minutes rather than tens of minutes).
#
# Inputs libFuzzer finds interesting go to fuzz/work/corpus/TARGET (not committed); the seeds
# in fuzz/corpus/TARGET are only read. Libfuzzer's output of each target is in
# fuzz/work/logs/TARGET.log, shown when the target fails. Environment:
#   FUZZ_TARGET_DIR  build directory (default fuzz/target)
#   FUZZ_JOBS        parallel fuzzing processes per target (default 1)
#   FUZZ_PROFILE     release (default) or dev (unoptimized, quicker to build; what .ci/run uses)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-3600}
shift || true
if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || [ "$SECONDS_PER_TARGET" -lt 1 ]; then
  echo "scripts/fuzz.sh: SECONDS_PER_TARGET must be a positive number of seconds" >&2
  exit 2
fi

CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
  cargo install --locked --quiet "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi

export RUSTC_BOOTSTRAP=1
TARGET_DIR=${FUZZ_TARGET_DIR:-$PWD/fuzz/target}
BUILD_FLAGS=(--sanitizer none --debug-assertions --target-dir "$TARGET_DIR")
# FUZZ_PROFILE=release (default: optimized, many times the executions per second, for long runs)
# or dev (unoptimized: a third of the build time, for the short run in .ci/run).
case "${FUZZ_PROFILE:-release}" in
  release) BUILD_FLAGS+=(--codegen-units 16) ;;
  dev) BUILD_FLAGS+=(--dev) ;;
  *)
    echo "scripts/fuzz.sh: FUZZ_PROFILE must be release or dev, not ${FUZZ_PROFILE}" >&2
    exit 2
    ;;
esac

cd fuzz
if [ "$#" -gt 0 ]; then
  TARGETS=("$@")
else
  mapfile -t TARGETS < <(cargo fuzz list)
fi

# cargo fuzz has no --locked: check that fuzz/Cargo.lock is up to date first.
cargo metadata --locked --format-version 1 >/dev/null
cargo fuzz build "${BUILD_FLAGS[@]}"

mkdir -p work/logs
# With -jobs libFuzzer writes each process's output to fuzz-N.log: only when asked for.
PARALLEL=()
if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then
  PARALLEL=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
fi
FAILED=()
for target in "${TARGETS[@]}"; do
  mkdir -p "work/corpus/$target" "artifacts/$target"
  log="work/logs/$target.log"
  echo "fuzz: $target for ${SECONDS_PER_TARGET}s" >&2
  # -timeout: an input that takes 30 s is a hang, reported like a crash. -rss_limit_mb: a
  # parser that grows without bound is a finding too.
  if cargo fuzz run "${BUILD_FLAGS[@]}" "$target" "work/corpus/$target" "corpus/$target" -- \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=30 -rss_limit_mb=2048 \
    "${PARALLEL[@]}" -print_final_stats=1 >"$log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" | tr '\n' ' ' >&2 || true
    echo >&2
  else
    echo "fuzz: $target FAILED; libFuzzer's output ($log):" >&2
    tail -n 60 "$log" >&2
    FAILED+=("$target")
  fi
done

if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "fuzz: ${#FAILED[@]} of ${#TARGETS[@]} targets found a defect: ${FAILED[*]};" \
    "the inputs are under fuzz/artifacts/" >&2
  exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets ran ${SECONDS_PER_TARGET}s each without a finding" >&2
