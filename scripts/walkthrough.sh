#!/usr/bin/env bash
# The Lifeguard story against a running `scripts/demo.sh`: create -> poll -> another user is
# denied exactly like a stranger -> cancel, with the audit lines each step produced.
set -euo pipefail
cd "$(dirname "$0")/.."

LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8080}
URL="http://$LISTEN_ADDR/mcp"
AUDIT=target/demo/audit.jsonl
BIN=target/debug/lifeguard
ADMIN_ADDR=${ADMIN_ADDR:-127.0.0.1:9090}
command -v jq >/dev/null || { echo "walkthrough.sh needs jq"; exit 1; }
curl -fsS "http://$ADMIN_ADDR/ready" >/dev/null 2>&1 || {
  echo "No Lifeguard demo is running: start scripts/demo.sh in another terminal first."; exit 1; }
touch "$AUDIT"

token() {
  "$BIN" dev token --key examples/standalone/dev-issuer-key.pem --kid dev-1 \
    --issuer https://dev-issuer.lifeguard.local --audience "$URL" \
    --subject "$1" --tenant "$2" --client "$3" --scope "${4:-}"
}
ALICE=$(token alice tenant-a console rows:write)
BOB=$(token bob tenant-a console rows:write)

# mcp TOKEN METHOD NAME PARAMS_JSON
mcp() {
  local params
  params=$(jq -c '. + {"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
    "io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}' <<<"$4")
  curl -s -w '\n' "$URL" -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $2" -H "Mcp-Name: $3" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":$params}"
}
audit_since() { tail -n +"$(( $1 + 1 ))" "$AUDIT" | jq -c '{event, subject, tool, task, decision, reason}'; }
lines() { wc -l < "$AUDIT" 2>/dev/null || echo 0; }

step() { printf '\n== %s\n' "$1"; }

step "1. alice starts write_rows as a task"
n=$(lines)
created=$(mcp "$ALICE" tools/call write_rows '{"name":"write_rows","arguments":{"count":40,"intervalMs":250}}')
echo "$created" | jq .
TASK=$(jq -r .result.taskId <<<"$created")
sleep 0.3; audit_since "$n"

step "2. alice polls it"
n=$(lines)
mcp "$ALICE" tasks/get "$TASK" "{\"taskId\":\"$TASK\"}" | jq -c .result
sleep 0.3; audit_since "$n"

step "3. bob (same tenant) polls and cancels it; a made-up ID gets the very same answer"
n=$(lines)
echo "bob tasks/get:    $(mcp "$BOB" tasks/get "$TASK" "{\"taskId\":\"$TASK\"}")"
echo "bob tasks/cancel: $(mcp "$BOB" tasks/cancel "$TASK" "{\"taskId\":\"$TASK\"}")"
FAKE=lgt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
echo "made-up ID:       $(mcp "$ALICE" tasks/get "$FAKE" "{\"taskId\":\"$FAKE\"}")"
sleep 0.3; audit_since "$n"

step "4. alice's task is untouched; alice cancels it"
n=$(lines)
mcp "$ALICE" tasks/get "$TASK" "{\"taskId\":\"$TASK\"}" | jq -c '.result | {status}'
mcp "$ALICE" tasks/cancel "$TASK" "{\"taskId\":\"$TASK\"}" | jq -c .
mcp "$ALICE" tasks/get "$TASK" "{\"taskId\":\"$TASK\"}" | jq -c '.result | {status, statusMessage}'
sleep 0.3; audit_since "$n"
