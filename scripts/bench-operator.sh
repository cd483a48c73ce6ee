#!/usr/bin/env bash
# Control-plane benchmark of the operator (see docs/performance.md, "Control plane: propagation
# to 1,000 sidecars"): builds the release binary and the benchmark, then measures how fast a
# PrincipalRevocation, a pushed security event and a policy spec change reach N light sidecars,
# and the operator's memory and CPU meanwhile. Prints a table and writes
# target/bench/operator-results.json. Reports the targets; never fails on them.
#
# Usage: scripts/bench-operator.sh                  full run: 1,000 sidecars, 1,000 policies, 20 runs
#        scripts/bench-operator.sh --smoke          tiny: 20 sidecars, 20 policies, 3 runs (seconds)
#        scripts/bench-operator.sh --sidecars N --policies N --runs N [--keep]
#        scripts/bench-operator.sh --help           every option
#
# Needs the Python venv of the Kubernetes API emulator (LIFEGUARD_TEST_PYTHON, else
# target/interop-venv/bin/python), built as scripts/test.sh does:
#   python3 -m venv target/interop-venv && target/interop-venv/bin/pip install -r tests/interop/requirements.txt
set -euo pipefail
cd "$(dirname "$0")/.."

# Every sidecar holds a connection in this process and one in the operator.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 65536 ]; then hard=65536; fi
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$hard" ]; then ulimit -n "$hard"; fi

cargo build --release --locked --bin lifeguard --example operator_bench
exec "${CARGO_TARGET_DIR:-target}/release/examples/operator_bench" "$@"
