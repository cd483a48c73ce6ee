"""A FastMCP server with the Tasks extension (in-memory backend), for interop tests.

Usage: python fastmcp_server.py

It listens on a loopback port the system picks and prints `listening on http://127.0.0.1:PORT/mcp`
once the socket accepts connections (the test harness reads the URL from that line).
"""

import asyncio
import socket

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
    # Bind port 0 here and hand the socket to uvicorn: no other process can take the port
    # between choosing it and listening on it. Connections made before uvicorn serves wait in
    # the backlog.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
    mcp.run(
        transport="http",
        host="127.0.0.1",
        port=port,
        sockets=[sock],
        show_banner=False,
    )
