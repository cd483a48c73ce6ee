"""Calls `echo` through a rate limit with FastMCP's client, acting on the structured refusal.

Usage: python fastmcp_rate_limited.py URL TOKEN

Calls until the sidecar refuses one and prints each outcome as a JSON line: `ok` per call that
passed, then `refused` with the error's code and data as the client library surfaced them.
Acts on the data as docs/sidecar.md "Refusals" says a client should: for `remediation: retry`,
waits `retryAfterMs` and calls again (`ok_after_wait`); anything else is printed and ends it.
"""

import asyncio
import json
import sys

from fastmcp import Client
from mcp.shared.exceptions import MCPError


async def main(url: str, token: str) -> None:
    async with Client(url, auth=token) as client:
        for attempt in range(50):
            try:
                await client.call_tool("echo", {"text": f"call {attempt}"})
            except MCPError as refused:
                data = refused.data or {}
                print(
                    json.dumps({"event": "refused", "code": refused.code, "data": data}),
                    flush=True,
                )
                if data.get("remediation") != "retry":
                    return
                await asyncio.sleep(data["retryAfterMs"] / 1000)
                result = await client.call_tool("echo", {"text": "after the wait"})
                print(json.dumps({"event": "ok_after_wait", "data": result.data}), flush=True)
                return
            print(json.dumps({"event": "ok", "attempt": attempt}), flush=True)
        sys.exit("50 calls and no refusal")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
