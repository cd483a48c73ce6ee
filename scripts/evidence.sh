#!/usr/bin/env bash
# The evidence pack against the bundled example server: builds, starts the example server and a
# standalone sidecar (SQLite ledger, audit file, a copy of examples/evidence/policy.yaml, the
# development issuer), runs `lifeguard evidence`, stops both, and exits with the pack's status.
# Reports land in target/evidence/. See docs/evidence-pack.md.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --bin lifeguard --example example_server
BIN=target/debug
OUT=${EVIDENCE_OUT:-target/evidence}
STATE=$(mktemp -d "${TMPDIR:-/tmp}/lifeguard-evidence.XXXXXX")
SERVER_PID=
SIDECAR_PID=
cleanup() {
  for pid in $SIDECAR_PID $SERVER_PID; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$STATE"
}
trap cleanup EXIT INT TERM

# The pack's reload check edits the policy, so the sidecar reads a copy.
cp examples/evidence/policy.yaml "$STATE/policy.yaml"
cp examples/standalone/dev-jwks.json "$STATE/dev-jwks.json"

# Waits until FILE has a line containing MARKER and prints what follows it.
wait_for() {
  local file=$1 marker=$2 line
  for _ in $(seq 1 300); do
    line=$(grep -m1 -F "$marker" "$file" 2>/dev/null || true)
    if [ -n "$line" ]; then echo "${line#*"$marker"}"; return 0; fi
    sleep 0.1
  done
  echo "evidence.sh: no \"$marker\" in $file:" >&2; cat "$file" >&2; return 1
}

# Port 0 everywhere: each process prints the address it got.
"$BIN/examples/example_server" --listen 127.0.0.1:0 >"$STATE/example-server.out" 2>"$STATE/example-server.log" &
SERVER_PID=$!
UPSTREAM=$(wait_for "$STATE/example-server.out" "listening on ")
"$BIN/lifeguard" sidecar \
  --policy "$STATE/policy.yaml" \
  --upstream "$UPSTREAM" \
  --listen 127.0.0.1:0 \
  --admin 127.0.0.1:0 \
  --ledger "$STATE/ledger.db" \
  --audit-file "$STATE/audit.jsonl" 2>"$STATE/sidecar.log" &
SIDECAR_PID=$!
TARGET=$(wait_for "$STATE/sidecar.log" "listening on ")
ADMIN=$(wait_for "$STATE/sidecar.log" "admin on ")
for _ in $(seq 1 100); do
  curl -fsS "$ADMIN/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "$ADMIN/ready" >/dev/null || { cat "$STATE/sidecar.log" >&2; exit 1; }

status=0
"$BIN/lifeguard" evidence \
  --target "$TARGET" \
  --admin "$ADMIN" \
  --policy "$STATE/policy.yaml" \
  --audit-file "$STATE/audit.jsonl" \
  --key examples/standalone/dev-issuer-key.pem --kid dev-1 \
  --upstream-debug "${UPSTREAM%/mcp}" \
  --out "$OUT" || status=$?
if [ "$status" -ne 0 ]; then
  echo "evidence.sh: the pack failed (status $status); sidecar log:" >&2
  tail -n 50 "$STATE/sidecar.log" >&2
fi
exit "$status"
