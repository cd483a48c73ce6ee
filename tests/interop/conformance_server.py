"""The FastMCP server the MCP conformance suite (`@modelcontextprotocol/conformance`) tests, for
tests/it/interop_conformance.rs: direct, through a token-adding proxy, and behind the sidecar.

Usage: python conformance_server.py

It listens on a loopback port the system picks and prints `listening on http://127.0.0.1:PORT/mcp`
once the socket accepts connections.

It carries the fixtures the suite's scenarios name, written the FastMCP 4.1.4 way (guard pattern:
a tool that needs client input returns an `InputRequiredResult` and reads `ctx.input_responses`
on the retry; FastMCP seals `requestState` itself):
- the everything-server tools, resources and prompts (`test_*`, `test://...`), after the suite's
  reference server `examples/servers/typescript/everything-server.ts`;
- the multi round-trip (SEP-2322) tools `test_input_required_result_*` and the prompt
  `test_input_required_result_prompt`;
- the tasks fixtures (SEP-2663): `greet`, `slow_compute{seconds,label}`, `failing_job`,
  `protocol_error_job`, `confirm_delete{filename}`, `multi_input`, `test_tool_with_task`.
What FastMCP cannot express (an MRTR round before task creation, x-mcp-header parameters,
JSON Schema 2020-12 preservation) fails both directly and through the sidecar; docs/interop.md
lists those scenarios.
"""

from __future__ import annotations

import asyncio
import json
import socket

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.prompts import Message
from fastmcp.tools.base import ToolResult
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError

mcp = FastMCP("lifeguard-conformance")
mcp.add_extension(TasksExtension(url="memory://"))

# A 1x1 PNG and a tiny WAV, as in the suite's reference server.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA="

CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"


def text(value: str) -> mcp_types.TextContent:
    return mcp_types.TextContent(type="text", text=value)


def result(*content) -> ToolResult:
    return ToolResult(content=list(content))


def client_capabilities(ctx: Context) -> dict:
    rc = ctx.request_context
    meta = rc.meta if rc is not None else None
    caps = meta.get(CLIENT_CAPABILITIES) if meta else None
    return caps if isinstance(caps, dict) else {}


def elicit(message: str, **properties: str) -> mcp_types.ElicitRequest:
    return mcp_types.ElicitRequest(
        params=mcp_types.ElicitRequestFormParams(
            message=message,
            requested_schema={
                "type": "object",
                "properties": {name: {"type": kind} for name, kind in properties.items()},
                "required": list(properties),
            },
        )
    )


def sample(prompt: str, max_tokens: int) -> mcp_types.CreateMessageRequest:
    return mcp_types.CreateMessageRequest(
        params=mcp_types.CreateMessageRequestParams(
            messages=[mcp_types.SamplingMessage(role="user", content=text(prompt))],
            max_tokens=max_tokens,
        )
    )


def answer(ctx: Context, key: str):
    responses = ctx.input_responses or {}
    return responses.get(key)


def accepted(ctx: Context, key: str, field: str):
    """The accepted elicitation field `field` of the answer to `key`, or None."""
    got = answer(ctx, key)
    if isinstance(got, mcp_types.ElicitResult) and got.action == "accept" and got.content:
        return got.content.get(field)
    return None


def ask(requests: dict, state: dict | None = None) -> mcp_types.InputRequiredResult:
    return mcp_types.InputRequiredResult(
        input_requests=requests, request_state=json.dumps(state) if state is not None else None
    )


def state(ctx: Context) -> dict:
    try:
        return json.loads(ctx.request_state or "{}")
    except ValueError:
        return {}


# ===== Content tools =====


@mcp.tool
def test_simple_text() -> ToolResult:
    """Tests simple text content response"""
    return result(text("This is a simple text response for testing."))


@mcp.tool
def test_image_content() -> ToolResult:
    """Tests image content response"""
    return result(mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png"))


@mcp.tool
def test_audio_content() -> ToolResult:
    """Tests audio content response"""
    return result(mcp_types.AudioContent(type="audio", data=WAV, mime_type="audio/wav"))


def embedded(uri: str, mime: str, body: str) -> mcp_types.EmbeddedResource:
    return mcp_types.EmbeddedResource(
        type="resource",
        resource=mcp_types.TextResourceContents(uri=uri, mime_type=mime, text=body),
    )


@mcp.tool
def test_embedded_resource() -> ToolResult:
    """Tests embedded resource content response"""
    return result(embedded("test://embedded-resource", "text/plain", "This is an embedded resource content."))


@mcp.tool
def test_multiple_content_types() -> ToolResult:
    """Tests response with multiple content types (text, image, resource)"""
    return result(
        text("Multiple content types test:"),
        mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png"),
        embedded("test://mixed-content-resource", "application/json", json.dumps({"test": "data", "value": 123})),
    )


@mcp.tool
async def test_tool_with_progress(ctx: Context) -> ToolResult:
    """Tests tool that reports progress notifications"""
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100, f"Completed step {step} of 100")
        await asyncio.sleep(0.05)
    return result(text("progress reported"))


@mcp.tool
def test_error_handling() -> ToolResult:
    """Tests error response handling"""
    raise ToolError("This tool intentionally returns an error for testing")


@mcp.tool
def test_missing_capability(ctx: Context) -> ToolResult:
    """Test tool requiring sampling"""
    if "sampling" not in client_capabilities(ctx):
        raise MCPError(
            code=-32021,
            message="MissingRequiredClientCapabilityError",
            data={"requiredCapabilities": {"sampling": {}}},
        )
    return result(text("Success"))


# ===== Multi round-trip (SEP-2322) =====


@mcp.tool
def test_input_required_result_elicitation(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: returns InputRequiredResult with elicitation request"""
    if answer(ctx, "user_name") is not None:
        return result(text(f"Hello, {accepted(ctx, 'user_name', 'name')}!"))
    return ask({"user_name": elicit("What is your name?", name="string")})


@mcp.tool
def test_input_required_result_sampling(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: returns InputRequiredResult with sampling request"""
    got = answer(ctx, "sample_request")
    if got is not None:
        content = getattr(got, "content", None)
        return result(text(f"Sampling result: {getattr(content, 'text', 'no response')}"))
    return ask({"sample_request": sample("What is the capital of France?", 100)})


@mcp.tool
def test_input_required_result_list_roots(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: returns InputRequiredResult with roots/list request"""
    got = answer(ctx, "roots_request")
    if got is not None:
        return result(text(f"Found {len(getattr(got, 'roots', []))} root(s)"))
    return ask({"roots_request": mcp_types.ListRootsRequest()})


@mcp.tool
def test_input_required_result_request_state(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: returns InputRequiredResult with requestState"""
    if state(ctx).get("kind") == "request-state" and accepted(ctx, "confirm", "ok") is True:
        return result(text("state-ok: requestState validated"))
    return ask({"confirm": elicit("Please confirm", ok="boolean")}, {"kind": "request-state"})


@mcp.tool
def test_input_required_result_multiple_inputs(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: returns InputRequiredResult with multiple input requests"""
    keys = ("user_name", "greeting", "client_roots")
    if state(ctx).get("kind") == "multiple-inputs" and all(answer(ctx, k) is not None for k in keys):
        greeting = getattr(getattr(answer(ctx, "greeting"), "content", None), "text", "Hello there!")
        roots = getattr(answer(ctx, "client_roots"), "roots", [])
        return result(text(f"Name: {accepted(ctx, 'user_name', 'name')}; Greeting: {greeting}; Roots: {len(roots)}"))
    return ask(
        {
            "user_name": elicit("What is your name?", name="string"),
            "greeting": sample("Generate a greeting", 50),
            "client_roots": mcp_types.ListRootsRequest(),
        },
        {"kind": "multiple-inputs"},
    )


@mcp.tool
def test_input_required_result_multi_round(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: multi-round InputRequiredResult workflow"""
    current = state(ctx)
    if current.get("round") == 1 and answer(ctx, "step1") is not None:
        name = accepted(ctx, "step1", "name")
        return ask({"step2": elicit("Step 2: What is your favorite color?", color="string")}, {"round": 2, "name": name})
    if current.get("round") == 2 and answer(ctx, "step2") is not None:
        return result(text(f"Multi-round complete for {current.get('name')} who likes {accepted(ctx, 'step2', 'color')}"))
    return ask({"step1": elicit("Step 1: What is your name?", name="string")}, {"round": 1})


@mcp.tool
def test_input_required_result_tampered_state(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: integrity-protected requestState (FastMCP seals and verifies it)"""
    if state(ctx).get("kind") == "tamper-test" and answer(ctx, "confirm") is not None:
        return result(text("integrity-ok: state verified"))
    return ask({"confirm": elicit("Please confirm", ok="boolean")}, {"kind": "tamper-test"})


@mcp.tool
def test_input_required_result_capabilities(ctx: Context) -> ToolResult | mcp_types.InputRequiredResult:
    """MRTR: respects client capabilities in inputRequests"""
    caps = client_capabilities(ctx)
    requests = {}
    if "elicitation" in caps:
        requests["elicit_input"] = elicit("Elicitation input", value="string")
    if "sampling" in caps:
        requests["sample_input"] = sample("Sample request", 50)
    if ctx.input_responses:
        return result(text(f"capabilities-ok: received {','.join(ctx.input_responses)}"))
    if not requests:
        return result(text("No supported capabilities declared"))
    return ask(requests, {"kind": "capabilities-test"})


@mcp.prompt
def test_input_required_result_prompt(ctx: Context) -> list | mcp_types.InputRequiredResult:
    """MRTR: prompt that requires elicitation input"""
    context = accepted(ctx, "user_context", "context")
    if context is None:
        return ask({"user_context": elicit("What context should the prompt use?", context="string")})
    return [Message(f"Prompt with context: {context}")]


# ===== Resources =====


@mcp.resource("test://static-text", name="static-text", mime_type="text/plain")
def static_text() -> str:
    """A static text resource for testing"""
    return "This is the content of the static text resource."


@mcp.resource("test://static-binary", name="static-binary", mime_type="image/png")
def static_binary() -> bytes:
    """A static binary resource (image) for testing"""
    import base64

    return base64.b64decode(PNG)


@mcp.resource("test://template/{id}/data", name="template", mime_type="application/json")
def template(id: str) -> str:
    """A resource template with parameter substitution"""
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


# ===== Prompts =====


@mcp.prompt
def test_simple_prompt() -> str:
    """A simple prompt without arguments"""
    return "This is a simple prompt for testing."


@mcp.prompt
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with required arguments"""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@mcp.prompt
def test_prompt_with_embedded_resource(resourceUri: str) -> list:
    """A prompt that includes an embedded resource"""
    return [
        Message(embedded(resourceUri, "text/plain", "Embedded resource content for testing.")),
        Message(text("Please process the embedded resource above.")),
    ]


@mcp.prompt
def test_prompt_with_image() -> list:
    """A prompt that includes image content"""
    return [
        Message(mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png")),
        Message(text("Please analyze the image above.")),
    ]


@mcp.completion
def complete(ref, argument, context):
    return []


# ===== Tasks (SEP-2663) =====


@mcp.tool
def greet(name: str) -> str:
    """Sync-only: returns Hello, {name}!"""
    return f"Hello, {name}!"


@mcp.tool(task=True)
async def slow_compute(seconds: float = 1, label: str = "") -> str:
    """Task-supporting: sleeps `seconds`, then answers."""
    await asyncio.sleep(seconds)
    return f"computed {label} after {seconds}s"


@mcp.tool(task=TaskConfig(mode="required"))
async def failing_job() -> str:
    """Task-required: always ends in a tool execution error."""
    raise ToolError("failing_job always fails")


@mcp.tool(task=True)
async def protocol_error_job() -> str:
    """Task-supporting: ends in a JSON-RPC (protocol) error."""
    raise MCPError(code=-32603, message="protocol_error_job raised a protocol error")


@mcp.tool(task=True)
async def confirm_delete(filename: str, ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Task-supporting: asks for confirmation once, then deletes (pretends to)."""
    if answer(ctx, "confirm") is None:
        return ask({"confirm": elicit(f"Delete {filename}?", confirm="boolean")})
    return f"deleted {filename}" if accepted(ctx, "confirm", "confirm") else f"kept {filename}"


@mcp.tool(task=True)
async def multi_input(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Task-supporting: asks two questions at once."""
    if answer(ctx, "first") is None or answer(ctx, "second") is None:
        return ask(
            {
                "first": elicit("First answer?", name="string", confirm="boolean"),
                "second": elicit("Second answer?", name="string", confirm="boolean"),
            }
        )
    return f"got {accepted(ctx, 'first', 'name')} and {accepted(ctx, 'second', 'name')}"


@mcp.tool(task=TaskConfig(mode="required"))
async def test_tool_with_task(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Task-required; asks for user_name (FastMCP asks inside the task, not before creating it)."""
    name = accepted(ctx, "user_name", "name")
    if name is None:
        return ask({"user_name": elicit("What is your name?", name="string")})
    return f"Hello, {name}! (from a task)"


if __name__ == "__main__":
    # Bind port 0 here and hand the socket to uvicorn: no other process can take the port
    # between choosing it and listening on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
    mcp.run(transport="http", host="127.0.0.1", port=port, sockets=[sock], show_banner=False)
