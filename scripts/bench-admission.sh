#!/usr/bin/env bash
# Admission latency benchmark of the webhook (see docs/performance.md, "Admission webhook"):
# builds the release binary and the benchmark, then drives `lifeguard webhook` (watching the
# Kubernetes API emulator: an opted-in namespace, N McpServerPolicies, the approver-keys Secret)
# with an open-loop load of AdmissionReviews at a fixed rate over TLS — pod CREATEs to /inject,
# policy and signed-exception CREATEs to /validate — checking every answer. Prints a table and
# writes target/bench/admission-results.json. Reports the target (p99 ≤ 5 ms at 100 requests/s);
# never fails on it.
#
# Usage: scripts/bench-admission.sh                 full run: 100 req/s for 60 s, 50 policies
#        scripts/bench-admission.sh --smoke         small: 20 req/s for 3 s, 10 policies (seconds)
#        scripts/bench-admission.sh --rate N --duration S --policies N [--keep]
#        scripts/bench-admission.sh --help          every option
#
# Needs the Python venv of the Kubernetes API emulator (LIFEGUARD_TEST_PYTHON, else
# target/interop-venv/bin/python), built as scripts/test.sh does:
#   python3 -m venv target/interop-venv && target/interop-venv/bin/pip install -r tests/interop/requirements.txt
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --bin lifeguard --example admission_bench
exec "${CARGO_TARGET_DIR:-target}/release/examples/admission_bench" "$@"
