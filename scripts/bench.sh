#!/usr/bin/env bash
# Performance benchmark of the sidecar (see docs/performance.md): builds the release binaries,
# then measures the bundled example MCP server directly and through the sidecar, side by side.
# Prints a table and writes target/bench/results.json. Reports the targets; never fails on them.
#
# Usage: scripts/bench.sh            full run (about 6 minutes)
#        scripts/bench.sh --smoke    every phase, tiny (seconds)
#        scripts/bench.sh --soak     10 minutes at 80 % of the measured maximum throughput:
#                                    RSS must stay flat, no request may fail (target/bench/soak.json)
#        scripts/bench.sh --baseline FILE   compare the reduction targets with an earlier run
#        scripts/bench.sh --bare-hop        the sidecar against nginx and a minimal hyper proxy
#                                    (target/bench/bare-hop.json; about 4 minutes)
#        scripts/bench.sh --hot-path-only   only the in-process hot path at 1 and 2 workers
#                                    (target/bench/hot-path.json; about 50 s)
#        scripts/bench.sh --dpop     the sidecar CPU a DPoP-verified call adds over a bearer one,
#                                    and proof verification in process (target/bench/dpop.json;
#                                    about 90 s)
#        scripts/bench.sh --help     all options (sample counts, durations, --keep, ...)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --bin lifeguard --example example_server --example sidecar_bench \
  --example bare_proxy
exec "${CARGO_TARGET_DIR:-target}/release/examples/sidecar_bench" "$@"
