"""Which input responses does FastMCP accept for a sampling or roots input request?

Starts `fastmcp_server.py` (FastMCP with the Tasks extension), then, with plain HTTP and no
sidecar, answers each of its four asking tools with each candidate shape and records what
happened:

- synchronous (multi round-trip on `tools/call`): `ask_sampling` / `ask_roots` answer
  `resultType: "input_required"`; the probe retries the call with `inputResponses` and the
  `requestState` it got. Recorded: HTTP status and the JSON-RPC error, or what the tool
  received.
- in a task: `ask_sampling_task` / `ask_roots_task` become tasks that go `input_required`;
  the probe sends `tasks/update` with the candidate under the surfaced key, then polls
  `tasks/get` until the task is terminal or 3 s pass. Recorded: the `tasks/update` status and
  body, and the task's status (and result text or error) afterwards.

Usage: python probe_declines.py [--json] [--url URL]
Prints a Markdown table (or JSON lines with --json). docs/interop.md records a run.
With --url, probes an already running server instead (synchronous half only), e.g. the
TypeScript SDK v2 fixture `ts_declines_server.mjs`.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
DECLINE_MESSAGE = "sampling/createMessage was declined by the Lifeguard policy (no_exception)"

TEXT_ANSWER = {
    "role": "assistant",
    "content": {"type": "text", "text": "declined by policy"},
    "model": "lifeguard-policy",
    "stopReason": "endTurn",
}

# (label, value or OMIT) per capability. OMIT: the key is left out of inputResponses.
OMIT = object()
SAMPLING_CANDIDATES = [
    ("JSON-RPC error object (the sidecar's former decline)", {"error": {"code": -32603, "message": DECLINE_MESSAGE}}),
    ("CreateMessageResult, text content", TEXT_ANSWER),
    ("CreateMessageResult, empty text", {**TEXT_ANSWER, "content": {"type": "text", "text": ""}}),
    ("CreateMessageResult, stopReason \"refusal\"", {**TEXT_ANSWER, "stopReason": "refusal"}),
    ("CreateMessageResult, content []", {**TEXT_ANSWER, "content": []}),
    ("CreateMessageResult + error member", {**TEXT_ANSWER, "error": {"code": -32603, "message": DECLINE_MESSAGE}}),
    ("ElicitResult {action: decline}", {"action": "decline"}),
    ("ListRootsResult {roots: []} (wrong type)", {"roots": []}),
    ("empty object {}", {}),
    ("null", None),
    ("key omitted", OMIT),
]
ROOTS_CANDIDATES = [
    ("JSON-RPC error object (the sidecar's former decline)", {"error": {"code": -32603, "message": DECLINE_MESSAGE.replace("sampling/createMessage", "roots/list")}}),
    ("ListRootsResult {roots: []}", {"roots": []}),
    ("ListRootsResult, one root (control)", {"roots": [{"uri": "file:///tmp/project", "name": "project"}]}),
    ("ListRootsResult {roots: []} + error member", {"roots": [], "error": {"code": -32603, "message": "declined"}}),
    ("ElicitResult {action: decline}", {"action": "decline"}),
    ("empty object {}", {}),
    ("null", None),
    ("key omitted", OMIT),
]


class Server:
    def __init__(self, url: str | None = None) -> None:
        self.next_id = 0
        self.proc = None
        if url is not None:
            self.url = urlparse(url)
            return
        script = Path(__file__).with_name("fastmcp_server.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"fastmcp_server.py did not start: {line!r}")
        self.url = urlparse(line.split("listening on ", 1)[1].strip())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def post(self, method: str, params: dict, caps: dict, name: str | None = None) -> tuple[int, dict]:
        """One JSON-RPC request with the 2026-07-28 `_meta` and headers; returns (status, body)."""
        self.next_id += 1
        params = {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": caps,
                "io.modelcontextprotocol/clientInfo": {"name": "probe_declines", "version": "1"},
            },
        }
        body = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
        }
        if name is not None:
            headers["Mcp-Name"] = name
        conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=30)
        conn.request("POST", self.url.path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read().decode()
        conn.close()
        if response.getheader("Content-Type", "").startswith("text/event-stream"):
            # The last `data:` line of the stream is the response.
            data = [l[5:].strip() for l in raw.splitlines() if l.startswith("data:")]
            raw = data[-1] if data else "{}"
        return response.status, json.loads(raw) if raw else {}


def tool_text(result: dict) -> str:
    return " ".join(c.get("text", "") for c in result.get("content", []) if isinstance(c, dict))


def outcome(status: int, body: dict) -> str:
    if "error" in body:
        e = body["error"]
        return f"HTTP {status}, error {e.get('code')}: {e.get('message', '')[:140]}"
    result = body.get("result", {})
    if result.get("resultType") == "input_required":
        return f"HTTP {status}, input_required again (keys {sorted(result.get('inputRequests', {}))})"
    text = tool_text(result)
    flag = " isError" if result.get("isError") else ""
    return f"HTTP {status}, complete{flag}: {text[:160]}"


def probe_sync(server: Server, tool: str, key: str, caps: dict, value) -> str:
    status, first = server.post("tools/call", {"name": tool, "arguments": {}}, caps, name=tool)
    result = first.get("result", {})
    if result.get("resultType") != "input_required" or key not in result.get("inputRequests", {}):
        return f"setup failed: {outcome(status, first)}"
    responses = {} if value is OMIT else {key: value}
    params = {
        "name": tool,
        "arguments": {},
        "inputResponses": responses,
        "requestState": result.get("requestState"),
    }
    status, body = server.post("tools/call", params, caps, name=tool)
    return outcome(status, body)


def probe_task(server: Server, tool: str, caps: dict, value) -> tuple[str, str]:
    caps = {**caps, "extensions": {TASKS: {}}}
    status, created = server.post("tools/call", {"name": tool, "arguments": {}}, caps, name=tool)
    task_id = created.get("result", {}).get("taskId")
    if not task_id:
        return f"setup failed: {outcome(status, created)}", ""
    task = wait_task(server, task_id, caps, lambda t: t.get("status") != "working", 10)
    keys = list(task.get("inputRequests", {}))
    if task.get("status") != "input_required" or not keys:
        return f"setup failed: task {task.get('status')}", ""
    responses = {} if value is OMIT else {keys[0]: value}
    status, body = server.post(
        "tasks/update", {"taskId": task_id, "inputResponses": responses}, caps, name=task_id
    )
    if "error" in body:
        update = f"HTTP {status}, error {body['error'].get('code')}: {body['error'].get('message', '')[:140]}"
    else:
        update = f"HTTP {status}, {json.dumps(body.get('result'))}"
    after = wait_task(server, task_id, caps, lambda t: t.get("status") in ("completed", "failed", "cancelled"), 3)
    state = after.get("status", "?")
    if state == "completed":
        state += f": {tool_text(after.get('result', {}))[:160]}"
    elif state == "failed":
        state += f": {json.dumps(after.get('error'))[:160]}"
    elif state == "input_required":
        same = sorted(after.get("inputRequests", {})) == sorted(keys)
        state += " (same key still outstanding)" if same else f" (keys {sorted(after.get('inputRequests', {}))})"
    return update, state


def wait_task(server: Server, task_id: str, caps: dict, done, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        _, body = server.post("tasks/get", {"taskId": task_id}, caps, name=task_id)
        task = body.get("result", body)
        if done(task) or time.monotonic() > deadline:
            return task
        time.sleep(0.1)


def main() -> None:
    as_json = "--json" in sys.argv
    url = sys.argv[sys.argv.index("--url") + 1] if "--url" in sys.argv else None
    server = Server(url)
    rows = []
    try:
        for capability, tool, key, caps, candidates in [
            ("sampling", "ask_sampling", "sample", {"sampling": {}}, SAMPLING_CANDIDATES),
            ("roots", "ask_roots", "roots", {"roots": {}}, ROOTS_CANDIDATES),
        ]:
            for label, value in candidates:
                sync = probe_sync(server, tool, key, caps, value)
                update, after = ("n/a", "n/a") if url else probe_task(server, f"{tool}_task", caps, value)
                rows.append(
                    {"capability": capability, "shape": label, "sync": sync, "tasks/update": update, "task afterwards": after}
                )
    finally:
        server.close()
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    print("| capability | input response | synchronous retry of tools/call | tasks/update | task afterwards (≤3 s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        cells = [r["capability"], r["shape"], r["sync"], r["tasks/update"], r["task afterwards"]]
        print("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")


if __name__ == "__main__":
    main()
