#!/usr/bin/env bash
# The whole test suite. Installs what the tests need, then runs them.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# OpenSSL 3: tests/exception_cli.rs checks the documented standard-tool signing recipe.
if ! command -v openssl >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing openssl" >&2
    apt-get update -qq && apt-get install -y -qq openssl >/dev/null
  else
    echo "scripts/test.sh: the tests need the openssl command (OpenSSL 3); install it" >&2
    exit 1
  fi
fi

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
