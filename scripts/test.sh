#!/usr/bin/env bash
# The whole test suite. Installs and starts what the tests need, then runs them.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --locked --all-targets "$@"
