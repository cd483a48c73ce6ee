#!/usr/bin/env bash
# Tasks bound to a key (DPoP, RFC 9449) against a running `scripts/demo.sh`: Alice's token is
# bound to her client's key; a copy of it stolen from a log is useless, her own bearer token
# cannot touch the task either, a replayed proof is refused, and her key cancels the task.
set -euo pipefail
cd "$(dirname "$0")/.."

LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8080}
URL="http://$LISTEN_ADDR/mcp"
# What proofs name (htu): the policy's `resource`, the URI clients address.
RESOURCE=${RESOURCE:-http://127.0.0.1:8080/mcp}
AUDIT=target/demo/audit.jsonl
BIN=target/debug/lifeguard
ADMIN_ADDR=${ADMIN_ADDR:-127.0.0.1:9090}
command -v jq >/dev/null || { echo "dpop-walkthrough.sh needs jq"; exit 1; }
curl -fsS "http://$ADMIN_ADDR/ready" >/dev/null 2>&1 || {
  echo "No Lifeguard demo is running: start scripts/demo.sh in another terminal first."; exit 1; }
touch "$AUDIT"
KEY=$(mktemp -d)/alice-dpop.pem   # created by `dev token --dpop-key` (mode 0600)

token() {
  "$BIN" dev token --key examples/standalone/dev-issuer-key.pem --kid dev-1 \
    --issuer https://dev-issuer.lifeguard.local --audience "$RESOURCE" \
    --subject alice --tenant tenant-a --client console --scope rows:write "$@"
}
BOUND=$(token --dpop-key "$KEY")
BEARER=$(token)
proof() { "$BIN" dev dpop-proof --dpop-key "$KEY" --htu "$RESOURCE" --token "$BOUND"; }

# mcp "AUTHORIZATION" METHOD NAME PARAMS_JSON [DPOP_PROOF]: prints the status and the body
mcp() {
  local params
  params=$(jq -c '. + {"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
    "io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}' <<<"$4")
  local extra=()
  [ -n "${5:-}" ] && extra=(-H "DPoP: $5")
  curl -s -w ' (HTTP %{http_code})\n' "$URL" -H "Authorization: $1" \
    -H 'Content-Type: application/json' -H 'MCP-Protocol-Version: 2026-07-28' \
    -H "Mcp-Method: $2" -H "Mcp-Name: $3" "${extra[@]}" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":$params}"
}
challenge() {
  curl -s -o /dev/null -D - "$URL" -H "Authorization: $1" -H 'Content-Type: application/json' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tasks/get' -H "Mcp-Name: $TASK" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks/get\",\"params\":{\"taskId\":\"$TASK\"}}" \
    | grep -i '^www-authenticate' || true
}
audit_since() { tail -n +"$(( $1 + 1 ))" "$AUDIT" | jq -c '{event, decision, reason, key: .detail.keyBinding}'; }
lines() { wc -l < "$AUDIT" 2>/dev/null || echo 0; }
step() { printf '\n== %s\n' "$1"; }

step "0. alice's token is bound to her key"
cut -d. -f2 <<<"$BOUND" | tr '_-' '/+' | base64 -d 2>/dev/null | jq -c '{sub, cnf}' || true

step "1. alice starts write_rows with the DPoP scheme and a proof"
n=$(lines)
created=$(mcp "DPoP $BOUND" tools/call write_rows \
  '{"name":"write_rows","arguments":{"count":40,"intervalMs":250}}' "$(proof)")
echo "$created"
TASK=$(sed 's/ (HTTP.*//' <<<"$created" | jq -r .result.taskId)
sleep 0.3; audit_since "$n"

step "2. she polls it: each request with a fresh proof"
P=$(proof)
mcp "DPoP $BOUND" tasks/get "$TASK" "{\"taskId\":\"$TASK\"}" "$P"

step "3. the same proof again (a replay) is refused"
mcp "DPoP $BOUND" tasks/get "$TASK" "{\"taskId\":\"$TASK\"}" "$P"

step "4. her token, copied from a log, used as a bearer token"
n=$(lines)
mcp "Bearer $BOUND" tasks/cancel "$TASK" "{\"taskId\":\"$TASK\"}"
challenge "Bearer $BOUND"

step "5. alice's own bearer token (no key) gets what a stranger gets"
mcp "Bearer $BEARER" tasks/cancel "$TASK" "{\"taskId\":\"$TASK\"}"
sleep 0.3; audit_since "$n"

step "6. her key cancels the task"
n=$(lines)
mcp "DPoP $BOUND" tasks/cancel "$TASK" "{\"taskId\":\"$TASK\"}" "$(proof)"
sleep 0.3; audit_since "$n"
