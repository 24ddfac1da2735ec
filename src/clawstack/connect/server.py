"""The MCP server: the seven tools of :class:`~clawstack.connect.service.ConnectService` on the official SDK's
low-level :class:`mcp.server.lowlevel.Server`, whatever the transport (stdio here, Streamable HTTP in
:mod:`clawstack.connect.http`). Both transports build their server with :func:`create_mcp_server`, so they serve
the identical tool list, and both serve ``run_task`` as a native task to a client that asks for one: on
2025-11-25 (:mod:`clawstack.connect.mcp_tasks`) and through 2026-07-28's tasks extension
(:mod:`clawstack.connect.mcp_tasks_ext`).

A tool's answer is a JSON object, sent as ``structuredContent`` and as its JSON text. A refused call (bad
arguments, an unknown id, a busy session, an unusable store) is a tool result with ``isError: true`` and
``structuredContent: {"error": {"code", "message", "retryable", …}}``; it changes nothing.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    ListToolsResult,
    PaginatedRequestParams,
    Tool,
    ToolAnnotations,
    ToolExecution,
)

from clawstack import __version__
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.callers import ANONYMOUS, OPERATOR, Caller
from clawstack.connect.errors import ToolError
from clawstack.connect.mcp_tasks import TASK_TOOLS, TASKS_PAGE_SIZE, McpTasks, TaskServer, serves_tasks, tool_result
from clawstack.connect.mcp_tasks_ext import ExtensionTasks
from clawstack.connect.service import ConnectService
from clawstack.connect.tools import TOOLS

SERVER_NAME = "clawconnect"
INSTRUCTIONS = (
    "Run tasks on OpenClaw agents. Start one with run_task, then call check_task with the jobId and sessionKey it "
    "returns (nextAction says exactly how) until isTerminal is true; the answer is in summary. Reuse sessionKey to "
    "continue a conversation."
)
CALLER_STATE_KEY = "clawconnect_caller"
"""The key under the HTTP request's ``state`` where the admitted :class:`Caller` is kept."""


def tool_definitions(*, task_support: bool = True) -> list[Tool]:
    """The tool list both transports serve; with ``task_support`` (a 2025-11-25 client) ``run_task`` declares
    ``execution.taskSupport: "optional"``."""
    optional = ToolExecution(task_support="optional") if task_support else None
    return [
        Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema(),
            annotations=ToolAnnotations(
                read_only_hint=spec.read_only, destructive_hint=False, idempotent_hint=spec.read_only
            ),
            execution=optional if spec.name in TASK_TOOLS else None,
        )
        for spec in TOOLS
    ]


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """Who sent this request: over stdio (no HTTP request) the local operator; over HTTP the caller the guard
    admitted, and the anonymous caller when none was recorded (never the operator)."""
    request = ctx.request
    if request is None:
        return OPERATOR
    state = getattr(request, "state", None)
    caller = getattr(state, CALLER_STATE_KEY, None) if state is not None else None
    return caller if isinstance(caller, Caller) else ANONYMOUS


def create_mcp_server(
    service: ConnectService,
    *,
    agent_session_runtimes: AgentSessionRuntimeRegistry | None = None,
    tasks_page_size: int = TASKS_PAGE_SIZE,
) -> Server[Any]:
    """The MCP server for ``service``.

    ``agent_session_runtimes`` is the host's agent-session runtime registry, injected into ``service`` (a
    :class:`ValueError` if the service already has a different one); ``None`` keeps the service's own, which is
    empty unless one was given to :class:`ConnectService`. The tool list is the same either way.
    ``tasks_page_size`` is how many tasks a ``tasks/list`` page holds.
    """
    if agent_session_runtimes is not None:
        service.use_agent_session_runtimes(agent_session_runtimes)
    tasks = McpTasks(service, caller_of=caller_of, page_size=tasks_page_size)
    extension = ExtensionTasks(service, caller_of=caller_of)

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=tool_definitions(task_support=serves_tasks(ctx)))

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> HandlerResult:
        if tasks.requested(params):
            return await tasks.create(ctx, params)
        if extension.requested(ctx, params):
            return await extension.create(ctx, params)
        try:
            data = await service.call(params.name, params.arguments, caller=caller_of(ctx))
        except ToolError as exc:
            return tool_result({"error": exc.to_result()}, is_error=True)
        return tool_result(data)

    server = TaskServer(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS, on_list_tools=list_tools)
    # Registered by hand: a task of the extension is not a CallToolResult.
    server.add_request_handler("tools/call", CallToolRequestParams, call_tool)
    tasks.install(server)
    extension.install(server)  # in front of the 2025-11-25 tasks/* handlers
    return server


async def serve_stdio(
    service: ConnectService, *, agent_session_runtimes: AgentSessionRuntimeRegistry | None = None
) -> None:
    """Serve MCP on this process's stdin/stdout until stdin closes. Only protocol goes to stdout."""
    server = create_mcp_server(service, agent_session_runtimes=agent_session_runtimes)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


__all__ = ["CALLER_STATE_KEY", "SERVER_NAME", "caller_of", "create_mcp_server", "serve_stdio", "tool_definitions"]
