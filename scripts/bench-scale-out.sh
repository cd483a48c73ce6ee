#!/usr/bin/env bash
# Scale-out benchmark (see docs/performance.md, "Scale-out"): builds the release binaries, then
# measures the sidecar on SQLite and on a shared PostgreSQL ledger side by side, and three
# replicas against one. Needs PostgreSQL (LIFEGUARD_BENCH_POSTGRES, default
# postgres://postgres@127.0.0.1:5432/postgres); the bench creates and drops its own database.
# Prints a table and writes target/bench/scale-out.json. Reports the targets; never fails on them.
#
# Usage: scripts/bench-scale-out.sh            full run (a few minutes)
#        scripts/bench-scale-out.sh --smoke    every phase, tiny (seconds)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --bin lifeguard --example example_server --example scale_out_bench
exec target/release/examples/scale_out_bench "$@"
