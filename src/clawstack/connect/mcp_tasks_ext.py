"""Native MCP tasks on the 2026-07-28 revision: the extension ``io.modelcontextprotocol/tasks``.

On 2026-07-28 tasks left the core protocol for this extension. ``server/discover`` declares it under
``capabilities.extensions``; a request whose own capabilities declare it may be answered with a task, and the
server decides: ``tools/call`` of ``run_task`` from such a request starts the same job as ``run_task`` and answers
at once with the task (``resultType: "task"``); a refused one starts nothing and gets today's error result. A
request that does not declare it gets today's answer. Then, for
requests that declare it (-32021 otherwise):

* ``tasks/get`` answers the task; once it ended ``completed``, with ``result``: ``check_task``'s final payload as a
  tool result (``isError: true`` for an ``error`` job, which the extension counts as ``completed``: its ``failed``
  is for JSON-RPC errors, and a job never ends with one); a ``cancelled`` task carries no result;
* ``tasks/update`` acknowledges: ClawConnect never asks the client for input (``inputRequests``), so any response
  answers a request that is not outstanding, which the extension says to ignore;
* ``tasks/cancel`` cancels through ``cancel_task`` and acknowledges; cancelling a task that has ended changes
  nothing and is acknowledged too (cancellation is cooperative).

A delegated agent session waiting on a human reads ``working``, its ``statusMessage`` saying so: the extension's
``input_required`` announces ``inputRequests`` for the client, and there are none. Unknown task ids, another
caller's included, are -32602 (``data.code`` ``task_not_found``). ``notifications/tasks`` (``subscriptions/listen``
with ``taskIds``) are not sent, and ``tasks/list`` and ``tasks/result`` do not exist on this revision.
"""

from __future__ import annotations

from typing import Any

import mcp_types as t
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import RequestHandler
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from clawstack.connect.errors import ToolError
from clawstack.connect.mcp_tasks import (
    TASK_TOOLS,
    TASKS_EXTENSION,
    CallerOf,
    call_service,
    final_result,
    job_id,
    task_of,
    tool_result,
)
from clawstack.connect.service import ConnectService


class UpdateTaskRequestParams(t.RequestParams):
    """``tasks/update``'s params (the SDK has no type for them)."""

    task_id: str
    input_responses: dict[str, Any]


def declares_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this 2026-07-28 request declares the tasks extension in its capabilities."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)


def extension_task(snapshot: dict[str, Any], protocol_version: str | None = None) -> dict[str, Any]:
    """The extension's ``Task`` of a ``check_task`` snapshot; with the request's ``protocol_version`` (a detailed
    task, for ``tasks/get``), a completed task carries its ``result``."""
    core = task_of(snapshot)
    status = {"input_required": "working", "failed": "completed"}.get(core["status"], core["status"])
    task = {
        "taskId": core["taskId"],
        "status": status,
        "createdAt": core["createdAt"],
        "lastUpdatedAt": core["lastUpdatedAt"],
        "ttlMs": None,
        "pollIntervalMs": core["pollInterval"],
    }
    if "statusMessage" in core:
        task["statusMessage"] = core["statusMessage"]
    if protocol_version is not None and status == "completed":
        task["result"] = final_result(snapshot, protocol_version)
    return task


class ExtensionTasks:
    """The extension over ``service``; :meth:`install` puts it in front of the 2025-11-25 handlers, which keep
    answering every other revision."""

    def __init__(self, service: ConnectService, *, caller_of: CallerOf) -> None:
        self._service = service
        self._caller_of = caller_of

    def install(self, server: Server[Any]) -> None:
        server.extensions[TASKS_EXTENSION] = {}
        self._route(server, "tasks/get", t.GetTaskRequestParams, self.tasks_get)
        self._route(server, "tasks/cancel", t.CancelTaskRequestParams, self.tasks_cancel)
        self._route(server, "tasks/update", UpdateTaskRequestParams, self.tasks_update)

    @staticmethod
    def _route(
        server: Server[Any], method: str, params_type: type[BaseModel], modern: RequestHandler[Any, Any]
    ) -> None:
        entry = server.get_request_handler(method)

        async def route(ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                return await modern(ctx, params)
            if entry is None:
                raise MCPError(t.METHOD_NOT_FOUND, "Method not found", method)
            return await entry.handler(ctx, params)

        server.add_request_handler(method, params_type, route)

    @staticmethod
    def requested(ctx: ServerRequestContext[Any, Any], params: t.CallToolRequestParams) -> bool:
        """Whether to answer this ``tools/call`` with a task: a tool with task support, for a declaring request."""
        return params.name in TASK_TOOLS and declares_extension(ctx)

    async def create(self, ctx: ServerRequestContext[Any, Any], params: t.CallToolRequestParams) -> HandlerResult:
        caller = self._caller_of(ctx)
        try:
            started = await self._service.call(params.name, params.arguments, caller=caller)
        except ToolError as exc:
            return tool_result({"error": exc.to_result()}, is_error=True)  # no job, so no task: today's refusal
        snapshot = await call_service(self._service, "check_task", {"jobId": started["jobId"], "mode": "poll"}, caller)
        return {"resultType": "task", **extension_task(snapshot)}

    async def tasks_get(self, ctx: ServerRequestContext[Any, Any], params: t.GetTaskRequestParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        arguments = {"jobId": job_id(params.task_id), "mode": "poll"}
        snapshot = await call_service(self._service, "check_task", arguments, self._caller_of(ctx))
        return extension_task(snapshot, ctx.protocol_version)

    async def tasks_update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskRequestParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        arguments = {"taskId": job_id(params.task_id), "detail": "core"}
        await call_service(self._service, "get_task", arguments, self._caller_of(ctx))  # an unknown id is refused
        return {}

    async def tasks_cancel(
        self, ctx: ServerRequestContext[Any, Any], params: t.CancelTaskRequestParams
    ) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        arguments = {"jobId": job_id(params.task_id)}
        try:
            await call_service(self._service, "cancel_task", arguments, self._caller_of(ctx))
        except MCPError as exc:
            if not (isinstance(exc.data, dict) and exc.data.get("code") == "task_terminal"):
                raise
        return {}


__all__ = ["ExtensionTasks", "UpdateTaskRequestParams", "declares_extension", "extension_task"]
