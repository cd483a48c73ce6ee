#!/usr/bin/env bash
# Runs the main job on its embedded defaults: the bundled example MCP server behind a standalone
# Lifeguard sidecar (SQLite ledger, policy file, local development issuer).
# Stop with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

UPSTREAM_ADDR=${UPSTREAM_ADDR:-127.0.0.1:3000}
LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8080}
ADMIN_ADDR=${ADMIN_ADDR:-127.0.0.1:9090}
STATE=target/demo
mkdir -p "$STATE"

cargo build --quiet --bin lifeguard --example example_server
BIN=target/debug

"$BIN/examples/example_server" --listen "$UPSTREAM_ADDR" > "$STATE/example-server.log" 2>&1 &
SERVER_PID=$!
"$BIN/lifeguard" sidecar \
  --policy examples/standalone/policy.yaml \
  --upstream "http://$UPSTREAM_ADDR/mcp" \
  --listen "$LISTEN_ADDR" \
  --admin "$ADMIN_ADDR" \
  --ledger "$STATE/ledger.db" \
  --audit-file "$STATE/audit.jsonl" 2> "$STATE/sidecar.log" &
SIDECAR_PID=$!
trap 'kill $SIDECAR_PID $SERVER_PID 2>/dev/null; wait 2>/dev/null' EXIT INT TERM

for _ in $(seq 1 100); do
  curl -fsS "http://$ADMIN_ADDR/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://$ADMIN_ADDR/ready" >/dev/null || { cat "$STATE/sidecar.log"; exit 1; }

token() {
  "$BIN/lifeguard" dev token --key examples/standalone/dev-issuer-key.pem --kid dev-1 \
    --issuer https://dev-issuer.lifeguard.local --audience "http://$LISTEN_ADDR/mcp" \
    --subject "$1" --tenant "$2" --client "$3" --scope "$4"
}

cat <<INFO
Lifeguard demo is running.

  MCP endpoint (through the sidecar)  http://$LISTEN_ADDR/mcp
  example server (direct, unprotected) http://$UPSTREAM_ADDR/mcp
  admin: /ready /metrics               http://$ADMIN_ADDR
  ledger, audit trail, logs            $STATE/

A token for alice (tenant-a, client console, may write rows):
  export ALICE=$(token alice tenant-a console rows:write)

Call a tool as a task:
  curl -s http://$LISTEN_ADDR/mcp \\
    -H "Authorization: Bearer \$ALICE" -H 'Content-Type: application/json' \\
    -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' -H 'Mcp-Name: write_rows' \\
    -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_rows","arguments":{"count":20,"intervalMs":500},
         "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}'

Or run the whole story in another terminal:  scripts/walkthrough.sh
Audit trail:                                 tail -f $STATE/audit.jsonl
Press Ctrl-C to stop.
INFO
wait $SIDECAR_PID
