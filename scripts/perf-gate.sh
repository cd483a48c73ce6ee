#!/usr/bin/env bash
# The instruction-count gate: instructions the sidecar adds per request kind, counted by
# valgrind's callgrind, against perf/instruction-counts.json. Fails (exit 1) when a kind grew
# more than 10 %. Counts, not times: the machine's load does not move them.
#
# Usage:
#   scripts/perf-gate.sh                 compare with the baseline (what .ci/run does)
#   scripts/perf-gate.sh --update        record a new baseline (commit it, say why)
#   scripts/perf-gate.sh --plant KIND    plant a 20 % regression in KIND and pass only if the
#                                        gate catches it there (.ci/run plants one in greet)
# KIND: greet, tasks/get, "task creation", refusal, "listen delivery".
# The build is the test profile's (`cargo build --example perf_gate`), which the suite already
# compiled. docs/performance.md, "Instruction-count gate", explains the method.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=check
PLANT=
case "${1:-}" in
  "") ;;
  --update) MODE=update ;;
  --plant)
    MODE=plant
    PLANT=${2:?--plant needs a request kind}
    ;;
  *)
    echo "usage: scripts/perf-gate.sh [--update | --plant KIND]" >&2
    exit 2
    ;;
esac

if ! command -v valgrind >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing valgrind" >&2
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
  else
    echo "scripts/perf-gate.sh: the gate needs valgrind (callgrind); install it" >&2
    exit 2
  fi
fi

cargo build --locked --quiet --example perf_gate
TARGET=${CARGO_TARGET_DIR:-target}
GATE=$TARGET/debug/examples/perf_gate
WORK=$TARGET/perf-gate/${MODE}
rm -rf "$WORK"
mkdir -p "$WORK"

MEASURE=("$GATE" measure --work "$WORK" --repo .)
if [ -n "$PLANT" ]; then
  MEASURE+=(--plant "$PLANT")
fi
# --fair-sched: threads take turns in a fixed order, so the interleaving (and with it the
# count) varies as little as it can; --dump-before: one dump per phase (examples/perf_gate).
if ! valgrind --tool=callgrind --fair-sched=yes --dump-instr=no --log-file="$WORK/valgrind.log" \
  --callgrind-out-file="$WORK/callgrind.out" \
  --dump-before='*perf_gate_phase_boundary*' \
  "${MEASURE[@]}" >"$WORK/measure.log" 2>&1; then
  echo "scripts/perf-gate.sh: the measured run failed; its output and valgrind's log:" >&2
  tail -n 30 "$WORK/measure.log" "$WORK/valgrind.log" >&2
  exit 2
fi

CHECK=("$GATE" check --work "$WORK" --baseline perf/instruction-counts.json)
case "$MODE" in
  update) CHECK+=(--update) ;;
  plant) CHECK+=(--expect-regression "$PLANT") ;;
esac
"${CHECK[@]}"
