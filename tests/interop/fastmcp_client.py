"""Drives a task to completion with FastMCP's own task client, printing JSON lines.

Usage: python fastmcp_client.py URL TOKEN
"""

import asyncio
import json
import sys

from fastmcp import Client
from fastmcp_tasks import call_tool_task


async def main(url: str, token: str) -> None:
    async with Client(url, auth=token) as client:
        task = await call_tool_task(client, "slow_add", {"a": 2, "b": 40})
        print(json.dumps({"event": "created", "taskId": task.task_id}), flush=True)
        status = await task.status()
        print(json.dumps({"event": "status", "status": status.status}), flush=True)
        result = await task.result()
        print(json.dumps({"event": "result", "data": result.data}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
