"""The MCP server: the seven tools of :class:`~clawstack.connect.service.ConnectService` on the official SDK's
low-level :class:`mcp.server.lowlevel.Server`, whatever the transport (stdio here, Streamable HTTP in
:mod:`clawstack.connect.http`). Both transports build their server with :func:`create_mcp_server`, so they serve
the identical tool list.

A tool's answer is a JSON object, sent as ``structuredContent`` and as its JSON text. A refused call (bad
arguments, an unknown id, a busy session, an unusable store) is a tool result with ``isError: true`` and
``structuredContent: {"error": {"code", "message", "retryable", …}}``; it changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)

from clawstack import __version__
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.errors import ToolError
from clawstack.connect.service import ConnectService
from clawstack.connect.tools import TOOLS

SERVER_NAME = "clawconnect"
INSTRUCTIONS = (
    "Run tasks on OpenClaw agents. Start one with run_task, then call check_task with the jobId and sessionKey it "
    "returns (nextAction says exactly how) until isTerminal is true; the answer is in summary. Reuse sessionKey to "
    "continue a conversation."
)
CALLER_STATE_KEY = "clawconnect_caller"
"""The key under the HTTP request's ``state`` where the authenticated caller's name is kept."""


def tool_definitions() -> list[Tool]:
    """The tool list both transports serve."""
    return [
        Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema(),
            annotations=ToolAnnotations(
                read_only_hint=spec.read_only, destructive_hint=False, idempotent_hint=spec.read_only
            ),
        )
        for spec in TOOLS
    ]


def _result(data: dict[str, Any], *, is_error: bool = False) -> CallToolResult:
    text = json.dumps(data, ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data, is_error=is_error)


def _caller(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    state = getattr(request, "state", None)
    caller = getattr(state, CALLER_STATE_KEY, None) if state is not None else None
    return caller if isinstance(caller, str) else None


def create_mcp_server(
    service: ConnectService, *, agent_session_runtimes: AgentSessionRuntimeRegistry | None = None
) -> Server[Any]:
    """The MCP server for ``service``.

    ``agent_session_runtimes`` is the host's agent-session runtime registry, injected into ``service`` (a
    :class:`ValueError` if the service already has a different one); ``None`` keeps the service's own, which is
    empty unless one was given to :class:`ConnectService`. The tool list is the same either way.
    """
    if agent_session_runtimes is not None:
        service.use_agent_session_runtimes(agent_session_runtimes)

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=tool_definitions())

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> CallToolResult:
        try:
            data = await service.call(params.name, params.arguments, caller=_caller(ctx))
        except ToolError as exc:
            return _result({"error": exc.to_result()}, is_error=True)
        return _result(data)

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(
    service: ConnectService, *, agent_session_runtimes: AgentSessionRuntimeRegistry | None = None
) -> None:
    """Serve MCP on this process's stdin/stdout until stdin closes. Only protocol goes to stdout."""
    server = create_mcp_server(service, agent_session_runtimes=agent_session_runtimes)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


__all__ = ["CALLER_STATE_KEY", "SERVER_NAME", "create_mcp_server", "serve_stdio", "tool_definitions"]
