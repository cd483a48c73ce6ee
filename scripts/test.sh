#!/usr/bin/env bash
# The whole test suite. Installs what the tests need, then runs them.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# Python protocol peers (FastMCP with the Tasks extension), pinned.
VENV=target/interop-venv
REQUIREMENTS=tests/interop/requirements.txt
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQUIREMENTS" "$VENV/.installed-requirements"; then
  echo "installing Python interop peers into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/.installed-requirements"
fi
export LIFEGUARD_TEST_PYTHON="$PWD/$VENV/bin/python"

cargo test --locked --all-targets "$@"
