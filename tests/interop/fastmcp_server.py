"""A FastMCP server with the Tasks extension (in-memory backend), for interop tests.

Usage: python fastmcp_server.py PORT
"""

import asyncio
import sys

from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension

mcp = FastMCP("lifeguard-interop")
mcp.add_extension(TasksExtension(url="memory://"))


@mcp.tool(task=True)
async def slow_add(a: int, b: int, seconds: float = 0.3) -> int:
    """Add two numbers, slowly, as a background task."""
    await asyncio.sleep(seconds)
    return a + b


@mcp.tool
def echo(text: str) -> str:
    """Echo text back synchronously."""
    return text


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
