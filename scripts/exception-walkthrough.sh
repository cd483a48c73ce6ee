#!/usr/bin/env bash
# A signed CapabilityException from start to end: written, signed with the example approver key,
# verified, applied to a standalone sidecar in front of the example server, used by a sampling
# task, and refused once it has expired — with the audit lines each step produced.
# Runs on its own ports and temporary files; takes about half a minute (the exception is made
# to expire 20 seconds after it is signed). Needs curl and jq.
set -euo pipefail
cd "$(dirname "$0")/.."

UPSTREAM_ADDR=${UPSTREAM_ADDR:-127.0.0.1:3100}
LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8180}
ADMIN_ADDR=${ADMIN_ADDR:-127.0.0.1:9190}
URL="http://$LISTEN_ADDR/mcp"
command -v jq >/dev/null || { echo "exception-walkthrough.sh needs jq"; exit 1; }

cargo build --quiet --bin lifeguard --example example_server
BIN=target/debug
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT INT TERM
step() { printf '\n== %s\n' "$1"; }

step "1. The grant, as a reviewer reads it in a pull request (signature still empty)"
NOT_BEFORE=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
EXPIRES_AT=$(date -u -d '+20 seconds' +%Y-%m-%dT%H:%M:%SZ)
cat > "$WORK/exception.yaml" <<EOF
apiVersion: lifeguard.dev/v1alpha1
kind: CapabilityException
metadata:
  name: demo-summaries
  namespace: default
spec:
  policyRef: {name: demo}
  capability: sampling
  clients: [console]
  purpose: summarize_with_sampling asks the user's own model for a summary.
  modelRoute: gateway/default/summaries
  limits: {maxTokens: 1000, maxIterationsPerTask: 2, maxRequestsPerMinute: 30}
  allowedTools: []
  notBefore: "$NOT_BEFORE"
  expiresAt: "$EXPIRES_AT"
  approvalId: CHG-DEMO-1
  signature: unsigned
EOF
cat "$WORK/exception.yaml"

step "2. The approver signs it (in practice: with their own key, in their own tooling)"
"$BIN/lifeguard" exception sign --key examples/approvers/example-approver.pem \
  --kid security-approver-1 --in-place "$WORK/exception.yaml"
grep 'signature:' "$WORK/exception.yaml"

step "3. Anyone can check it against the trusted approver keys"
"$BIN/lifeguard" exception verify --keys examples/approvers/approvers.jwks.json "$WORK/exception.yaml"

step "4. Applied: the demo policy with sampling: exception, plus the signed exception"
sed -e "s#http://127.0.0.1:8080/mcp#$URL#" \
    -e 's/tools: \[write_rows,/tools: [summarize_with_sampling, write_rows,/' \
    -e 's/sampling: deny/sampling: exception/' examples/standalone/policy.yaml > "$WORK/policy.yaml"
printf -- '---\n' >> "$WORK/policy.yaml"
cat "$WORK/exception.yaml" >> "$WORK/policy.yaml"
cp examples/standalone/dev-jwks.json "$WORK/"
"$BIN/examples/example_server" --listen "$UPSTREAM_ADDR" > "$WORK/example-server.log" 2>&1 &
"$BIN/lifeguard" sidecar --policy "$WORK/policy.yaml" --upstream "http://$UPSTREAM_ADDR/mcp" \
  --listen "$LISTEN_ADDR" --admin "$ADMIN_ADDR" --ledger "$WORK/ledger.db" \
  --audit-file "$WORK/audit.jsonl" --approver-keys examples/approvers/approvers.jwks.json \
  2> "$WORK/sidecar.log" &
for _ in $(seq 1 100); do
  curl -fsS "http://$ADMIN_ADDR/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://$ADMIN_ADDR/ready" >/dev/null || { cat "$WORK/sidecar.log"; exit 1; }
grep 'capability exception' "$WORK/sidecar.log" | sed 's/\x1b\[[0-9;]*m//g'

TOKEN=$("$BIN/lifeguard" dev token --key examples/standalone/dev-issuer-key.pem --kid dev-1 \
  --issuer https://dev-issuer.lifeguard.local --audience "$URL" \
  --subject alice --tenant tenant-a --client console --scope "")
# mcp METHOD NAME PARAMS_JSON: one request declaring the tasks extension and sampling.
mcp() {
  local params
  params=$(jq -c '. + {"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
    "io.modelcontextprotocol/clientCapabilities":{"sampling":{},
      "extensions":{"io.modelcontextprotocol/tasks":{}}}}}' <<<"$3")
  curl -s "$URL" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $1" -H "Mcp-Name: $2" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":$params}"
}
# poll TASK: tasks/get until the task asks for input or ends; prints the state.
poll() {
  local state
  for _ in $(seq 1 50); do
    state=$(mcp tasks/get "$1" "{\"taskId\":\"$1\"}" | jq -c .result)
    [ "$(jq -r .status <<<"$state")" != working ] && { echo "$state"; return; }
    sleep 0.2
  done
  echo "$state"
}
summarize() {
  mcp tools/call summarize_with_sampling \
    '{"name":"summarize_with_sampling","arguments":{"text":"Q3: revenue 7, cost 3","maxTokens":200}}' \
    | jq -r .result.taskId
}
audit() { jq -c 'select(.event | startswith("capability.")) | {event, reason, detail}' "$WORK/audit.jsonl"; }

step "5. Used: the task's sampling request reaches the client, which answers it"
TASK=$(summarize)
poll "$TASK" | jq -c '{status, inputRequests}'
mcp tasks/update "$TASK" "{\"taskId\":\"$TASK\",\"inputResponses\":{\"sample-1\":{\"role\":\"assistant\",\"content\":{\"type\":\"text\",\"text\":\"Margin 57%.\"},\"model\":\"demo\",\"stopReason\":\"endTurn\"}}}" >/dev/null
poll "$TASK" | jq -c '{status, result: .result.content[0].text}'
audit

step "6. Expired: after $EXPIRES_AT the same request is refused, unseen by the client, and the task fails"
while [ "$(date -u +%s)" -le "$(date -u -d "$EXPIRES_AT" +%s)" ]; do sleep 1; done
TASK=$(summarize)
poll "$TASK" | jq -c '{status, statusMessage, reason: .error.data.reason}'
audit | tail -n 2
