"""A FastMCP server with the Tasks extension (in-memory backend), for interop tests.

Usage: python fastmcp_server.py

Besides `slow_add` and `echo` it has four tools that ask the client for a deprecated capability
through the multi round-trip (SEP-2322) guard pattern, for `probe_declines.py` (what input
responses FastMCP accepts for sampling and roots): `ask_sampling` and `ask_roots` ask on the
`tools/call` itself (`resultType: "input_required"`), `ask_sampling_task` and `ask_roots_task`
ask from inside a task (`tasks/get` shows the request, `tasks/update` answers it). Each reports
what it received: the Python type and the JSON of the answer.

It listens on a loopback port the system picks and prints `listening on http://127.0.0.1:PORT/mcp`
once the socket accepts connections (the test harness reads the URL from that line).
"""

import asyncio
import socket

import mcp_types
from fastmcp import Context, FastMCP
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


SAMPLING_KEY = "sample"
ROOTS_KEY = "roots"


def _sampling_request() -> mcp_types.InputRequiredResult:
    return mcp_types.InputRequiredResult(
        input_requests={
            SAMPLING_KEY: mcp_types.CreateMessageRequest(
                params=mcp_types.CreateMessageRequestParams(
                    messages=[
                        mcp_types.SamplingMessage(
                            role="user",
                            content=mcp_types.TextContent(type="text", text="Say hello"),
                        )
                    ],
                    max_tokens=16,
                )
            )
        },
        request_state="asked-sampling",
    )


def _roots_request() -> mcp_types.InputRequiredResult:
    return mcp_types.InputRequiredResult(
        input_requests={ROOTS_KEY: mcp_types.ListRootsRequest()},
        request_state="asked-roots",
    )


def _received(ctx: Context, key: str) -> str | None:
    """What the client answered for `key`, as `TypeName {json}`, or None before it answered."""
    answers = ctx.input_responses
    if not answers or key not in answers:
        return None
    answer = answers[key]
    return f"{type(answer).__name__} {answer.model_dump_json(by_alias=True, exclude_none=True)}"


@mcp.tool
async def ask_sampling(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Ask the client to sample (MRTR on tools/call); report the answer's type and JSON."""
    return _received(ctx, SAMPLING_KEY) or _sampling_request()


@mcp.tool
async def ask_roots(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Ask the client for its roots (MRTR on tools/call); report the answer's type and JSON."""
    return _received(ctx, ROOTS_KEY) or _roots_request()


@mcp.tool(task=True)
async def ask_sampling_task(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """As ask_sampling, from inside a task (tasks/get asks, tasks/update answers)."""
    return _received(ctx, SAMPLING_KEY) or _sampling_request()


@mcp.tool(task=True)
async def ask_roots_task(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """As ask_roots, from inside a task (tasks/get asks, tasks/update answers)."""
    return _received(ctx, ROOTS_KEY) or _roots_request()


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
