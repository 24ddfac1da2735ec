"""Native MCP tasks: ``run_task`` as a task of the protocol's 2025-11-25 revision.

A client that negotiated 2025-11-25 may call ``run_task`` as a task (``tools/call`` with a ``task`` field). The call
starts the same durable job as ``run_task`` (the caller's, through :meth:`ConnectService.call`) and answers at once
with the task; its ``taskId`` is the job's ``jobId``. Then:

* ``tasks/get`` maps the job's status: ``running`` is ``working``, or ``input_required`` while the agent session
  this turn delegated to waits on a human (``agentSession.actionRequired``); ``completed`` and
  ``completed_no_summary`` are ``completed``, ``error`` is ``failed``, ``cancelled`` is ``cancelled``;
* ``tasks/result`` waits until the job ended and answers ``check_task``'s final payload as a ``CallToolResult``;
* ``tasks/list`` pages through the caller's jobs, newest first, with a cursor that never shifts;
* ``tasks/cancel`` is ``cancel_task``;
* ``notifications/tasks/status`` goes to the session that created a task whenever its status changes, where the
  transport has a channel for it (not over stateless HTTP, and never after a restart).

Every job is a task, so ``ttl`` is ``null`` (a task lives as long as its job) and task ids survive restarts.
Refusals are JSON-RPC errors with ClawConnect's stable code in ``data.code``: -32602 for what the caller got wrong
(an unknown task id, another caller's included; a malformed cursor; a refused ``run_task``; cancelling a task that
ended otherwise), -32603 for what the server could not do (the job store, the gateway), -32601 for a task-augmented
call of a tool without task support and for ``tasks/*`` on an older revision. 2026-07-28 has its own
``tasks/get`` and ``tasks/cancel`` (:mod:`clawstack.connect.mcp_tasks_ext`) and no ``tasks/list`` or ``tasks/result``.

The SDK (mcp 2.x) knows the task types as data only; this module is the runtime. A ``CreateTaskResult`` cannot be
a ``tools/call`` handler's result (the SDK checks that against the 2025-11-25 ``CallToolResult``), so
:meth:`McpTasks.middleware` opens a slot around the call, :meth:`McpTasks.create` puts the task in it, and the
middleware answers with the task instead of the handler's placeholder.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import mcp_types as t
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from clawstack.connect.callers import Caller
from clawstack.connect.errors import ToolError
from clawstack.connect.jobs import Job
from clawstack.connect.service import ConnectService
from clawstack.connect.snapshots import POLL_RETRY_AFTER_MS, core
from clawstack.connect.tools import MAX_WAIT_MS

TASKS_PROTOCOL_VERSION: Final = "2025-11-25"
"""The one handshake revision whose tasks are served (2026-07-28 moved them to the ``io.modelcontextprotocol/tasks``
extension, served by :mod:`clawstack.connect.mcp_tasks_ext`)."""
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
"""The 2026-07-28 tasks extension (:mod:`clawstack.connect.mcp_tasks_ext`), never declared to a handshake revision."""
TASK_TOOLS: Final = frozenset({"run_task"})
"""The tools that support task execution (``optional``)."""
POLL_INTERVAL_MS: Final = POLL_RETRY_AFTER_MS
TASKS_PAGE_SIZE: Final = 50
RELATED_TASK_META_KEY: Final = "io.modelcontextprotocol/related-task"
NOTIFY_TIMEOUT_S: Final = 5.0
TERMINAL_TASK_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})
TASKS_CAPABILITY: Final = t.ServerTasksCapability(
    list=t.TasksListCapability(),
    cancel=t.TasksCancelCapability(),
    requests=t.ServerTasksRequestsCapability(tools=t.TasksToolsCapability(call=t.TasksCallCapability())),
)

CallerOf = Callable[[ServerRequestContext[Any, Any]], Caller]
_STATUS: Final[dict[str, t.TaskStatus]] = {
    "running": "working",
    "completed": "completed",
    "completed_no_summary": "completed",
    "error": "failed",
    "cancelled": "cancelled",
}
_CALLER_FAULTS: Final = frozenset(
    {
        "invalid_arguments",
        "unknown_tool",
        "agent_not_found",
        "agent_mismatch",
        "session_not_found",
        "session_mismatch",
        "session_busy",
        "task_terminal",
    }
)
_NOT_FOUND: Final = frozenset({"job_not_found", "task_not_found"})
_CURSOR_RE: Final = re.compile(r"(0|[1-9][0-9]{0,15}):(job_[A-Za-z0-9_-]{1,128})")
_log = logging.getLogger(__name__)


def serves_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's connection negotiated the revision whose tasks are served."""
    return ctx.protocol_version == TASKS_PROTOCOL_VERSION


# -- the mapping ---------------------------------------------------------------------------------------------------


def task_status(snapshot: Mapping[str, Any]) -> t.TaskStatus:
    """The task status of a task snapshot (``jobId``, ``status``, ``agentSession``)."""
    status = _STATUS[snapshot["status"]]
    session = snapshot.get("agentSession") or {}
    # Only the turn that delegated to the session waits for it; a later turn of the conversation does not.
    if status == "working" and session.get("actionRequired") and session.get("delegatedTurnId") == snapshot["jobId"]:
        return "input_required"
    return status


def _status_message(snapshot: Mapping[str, Any], status: t.TaskStatus) -> str | None:
    if status == "input_required":
        session = snapshot["agentSession"]
        where = f" at {session['remoteUrl']}" if session.get("remoteUrl") else ""
        return (
            f"the agent session {session['runtime']}/{session['sessionId']} waits for a human "
            f"({session['lastReportedState']}){where}"
        )
    if status == "working":
        liveness = snapshot.get("liveness")
        return f"running (liveness: {liveness})" if liveness else None
    reason: str | None = snapshot.get("terminalReason")
    if status == "failed" and snapshot.get("error"):
        return f"{reason}: {snapshot['error']}"
    return reason


def task_of(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol's ``Task`` for a task snapshot, every required key present (``ttl`` is ``null``)."""
    status = task_status(snapshot)
    task: dict[str, Any] = {
        "taskId": snapshot["jobId"],
        "status": status,
        "createdAt": snapshot["createdAt"],
        "lastUpdatedAt": snapshot["updatedAt"],
        "ttl": None,
        "pollInterval": POLL_INTERVAL_MS,
    }
    message = _status_message(snapshot, status)
    if message is not None:
        task["statusMessage"] = message
    return task


def tool_result(data: dict[str, Any], *, is_error: bool = False) -> t.CallToolResult:
    """A tool's answer: ``data`` as ``structuredContent`` and as its JSON text."""
    text = json.dumps(data, ensure_ascii=False)
    return t.CallToolResult(content=[t.TextContent(type="text", text=text)], structured_content=data, is_error=is_error)


def final_result(snapshot: dict[str, Any], protocol_version: str) -> dict[str, Any]:
    """A task's result: its final ``check_task`` payload as ``tools/call`` answers it on ``protocol_version``."""
    answer = tool_result(snapshot, is_error=bool(snapshot["isError"]))
    return serialize_server_result("tools/call", protocol_version, answer.model_dump(by_alias=True, mode="json"))


def encode_cursor(created_at_ms: int, job_id: str) -> str:
    """The ``tasks/list`` cursor after the job created at ``created_at_ms`` with ``job_id``."""
    return base64.urlsafe_b64encode(f"{created_at_ms}:{job_id}".encode()).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str] | None:
    """The position a cursor of :func:`encode_cursor` names; ``None`` for anything else."""
    if not 0 < len(cursor) <= 256 or not cursor.isascii():
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        return None
    match = _CURSOR_RE.fullmatch(text)
    if match is None:
        return None
    position = (int(match[1]), match[2])
    return position if encode_cursor(*position) == cursor else None  # one spelling per position


def _not_found() -> MCPError:
    return MCPError(t.INVALID_PARAMS, "taskId: no task has this id", {"code": "task_not_found"})


def _rpc_error(exc: ToolError) -> MCPError:
    if exc.code in _NOT_FOUND:
        return _not_found()  # another caller's task reads exactly as an unknown one
    code = t.INVALID_PARAMS if exc.code in _CALLER_FAULTS else t.INTERNAL_ERROR
    return MCPError(code, exc.message, exc.to_result())


def job_id(task_id: str) -> str:
    """The job a task id names (it is one); -32602 ``task_not_found`` for what cannot be a job id."""
    if not task_id.startswith("job_") or len(task_id) > 256:
        raise _not_found()
    return task_id


async def call_service(service: ConnectService, tool: str, arguments: object, caller: Caller) -> dict[str, Any]:
    """Run one of ``service``'s tools for ``caller``; a refusal becomes the JSON-RPC error described above."""
    try:
        return await service.call(tool, arguments, caller=caller)
    except ToolError as exc:
        raise _rpc_error(exc) from exc


# -- the runtime ---------------------------------------------------------------------------------------------------


class TaskServer(Server[Any]):
    """The SDK's low-level server, declaring the ``tasks`` capability on the handshake revisions, and the tasks
    extension (from :attr:`Server.extensions`) on 2026-07-28's ``server/discover`` only."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> t.ServerCapabilities:
        capabilities = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return capabilities
        others = {k: v for k, v in (capabilities.extensions or {}).items() if k != TASKS_EXTENSION}
        return capabilities.model_copy(update={"tasks": TASKS_CAPABILITY, "extensions": others or None})


class _TaskStatusNotification(t.Notification[dict[str, Any], Literal["notifications/tasks/status"]]):
    """``notifications/tasks/status`` with plain params, so ``ttl: null`` survives the SDK's ``exclude_none``."""

    method: Literal["notifications/tasks/status"] = "notifications/tasks/status"
    params: dict[str, Any]


@dataclass
class _Slot:
    """Where :meth:`McpTasks.create` hands the created task to :meth:`McpTasks.middleware`."""

    task: dict[str, Any] | None = None


@dataclass
class _Watch:
    """A task created here: the session to tell about it, the status it was last told, the send in flight."""

    session: ServerSession
    status: str
    sending: asyncio.Task[None] | None = None


_SLOT: Final[contextvars.ContextVar[_Slot | None]] = contextvars.ContextVar("clawconnect_task_slot", default=None)


class McpTasks:
    """The task runtime of one MCP server over ``service``; :meth:`install` wires it into the server.

    ``caller_of`` names a request's caller (as for tools); ``page_size`` is how many tasks a ``tasks/list`` page
    holds."""

    def __init__(self, service: ConnectService, *, caller_of: CallerOf, page_size: int = TASKS_PAGE_SIZE) -> None:
        if page_size < 1:
            raise ValueError("a tasks/list page holds at least one task")
        self._service = service
        self._caller_of = caller_of
        self._page_size = page_size
        self._watches: dict[str, _Watch] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def install(self, server: Server[Any]) -> None:
        server.middleware.append(self.middleware)
        server.add_request_handler("tasks/get", t.GetTaskRequestParams, self.tasks_get)
        server.add_request_handler("tasks/result", t.GetTaskPayloadRequestParams, self.tasks_result)
        server.add_request_handler("tasks/list", t.PaginatedRequestParams, self.tasks_list)
        server.add_request_handler("tasks/cancel", t.CancelTaskRequestParams, self.tasks_cancel)
        self._service.add_end_listener(self._ended)

    # -- tools/call --------------------------------------------------------------------------------------------

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Answer a task-augmented ``tools/call`` with the task the handler created; strip the ``tasks``
        capability from an ``initialize`` that negotiated an older revision."""
        if ctx.method == "initialize":
            answer = await call_next(ctx)
            if isinstance(answer, dict) and answer.get("protocolVersion") != TASKS_PROTOCOL_VERSION:
                capabilities = {k: v for k, v in answer.get("capabilities", {}).items() if k != "tasks"}
                answer = {**answer, "capabilities": capabilities}
            return answer
        params = ctx.params
        if ctx.method != "tools/call" or not serves_tasks(ctx) or not isinstance(params, Mapping):
            return await call_next(ctx)
        if params.get("task") is None:
            return await call_next(ctx)
        slot = _Slot()
        token = _SLOT.set(slot)
        try:
            answer = await call_next(ctx)  # the SDK's whole path: the init gate, params validation, the handler
        finally:
            _SLOT.reset(token)
        return {"task": slot.task} if slot.task is not None else answer

    @staticmethod
    def requested(params: t.CallToolRequestParams) -> bool:
        """Whether a ``tools/call`` asks for a task on a connection where tasks are served."""
        return params.task is not None and _SLOT.get() is not None

    async def create(self, ctx: ServerRequestContext[Any, Any], params: t.CallToolRequestParams) -> t.CallToolResult:
        """Start the job and hand its task to the middleware (the ``ttl`` asked for is not used: a task lives as
        long as its job)."""
        slot = _SLOT.get()
        if slot is None:
            raise RuntimeError("McpTasks.create called outside a task-augmented tools/call")
        if params.name not in TASK_TOOLS:
            raise MCPError(t.METHOD_NOT_FOUND, f"the tool {params.name[:64]!r} does not support task execution")
        caller = self._caller_of(ctx)
        started = await self._call("run_task", params.arguments, caller)
        snapshot = await self._call("get_task", {"taskId": started["jobId"], "detail": "summary"}, caller)
        slot.task = task = task_of(snapshot)
        if task["status"] not in TERMINAL_TASK_STATUSES:
            self._watches[task["taskId"]] = _Watch(ctx.session, task["status"])
        return t.CallToolResult(content=[])  # the middleware answers with the task instead

    # -- tasks/* -----------------------------------------------------------------------------------------------

    async def tasks_get(self, ctx: ServerRequestContext[Any, Any], params: t.GetTaskRequestParams) -> HandlerResult:
        self._check_revision(ctx)
        arguments = {"taskId": job_id(params.task_id), "detail": "summary"}
        return self._seen(task_of(await self._call("get_task", arguments, self._caller_of(ctx))))

    async def tasks_result(
        self, ctx: ServerRequestContext[Any, Any], params: t.GetTaskPayloadRequestParams
    ) -> HandlerResult:
        self._check_revision(ctx)
        arguments = {"jobId": job_id(params.task_id), "waitMs": MAX_WAIT_MS}
        snapshot = await self._call("check_task", arguments, self._caller_of(ctx))
        while not snapshot["isTerminal"]:
            snapshot = await self._call("check_task", arguments, self._caller_of(ctx))
        self._seen(task_of(snapshot))
        answer = final_result(snapshot, ctx.protocol_version)
        return {**answer, "_meta": {RELATED_TASK_META_KEY: {"taskId": params.task_id}}}

    async def tasks_list(self, ctx: ServerRequestContext[Any, Any], params: t.PaginatedRequestParams) -> HandlerResult:
        self._check_revision(ctx)
        after = None
        if params.cursor is not None:
            after = decode_cursor(params.cursor)
            if after is None:
                raise MCPError(
                    t.INVALID_PARAMS, "cursor: not a cursor this server returned", {"code": "invalid_cursor"}
                )
        try:
            snapshots, more = await self._service.page_tasks(
                limit=self._page_size, after=after, caller=self._caller_of(ctx)
            )
        except ToolError as exc:
            raise _rpc_error(exc) from exc
        answer: dict[str, Any] = {"tasks": [self._seen(task_of(snapshot)) for snapshot in snapshots]}
        if more is not None:
            answer["nextCursor"] = encode_cursor(*more)
        return answer

    async def tasks_cancel(
        self, ctx: ServerRequestContext[Any, Any], params: t.CancelTaskRequestParams
    ) -> HandlerResult:
        self._check_revision(ctx)
        arguments = {"jobId": job_id(params.task_id)}
        return self._seen(task_of(await self._call("cancel_task", arguments, self._caller_of(ctx))))

    @staticmethod
    def _check_revision(ctx: ServerRequestContext[Any, Any]) -> None:
        if not serves_tasks(ctx):
            raise MCPError(t.METHOD_NOT_FOUND, "Method not found", ctx.method)

    async def _call(self, tool: str, arguments: object, caller: Caller) -> dict[str, Any]:
        return await call_service(self._service, tool, arguments, caller)

    # -- notifications -----------------------------------------------------------------------------------------

    def _ended(self, job: Job) -> None:
        if job.job_id in self._watches:
            self._seen(task_of(core(job, job.updated_at_ms)))  # elapsedMs is no part of a task

    def _seen(self, task: dict[str, Any]) -> dict[str, Any]:
        """Tell the creating session about ``task`` if its status changed since it was last told."""
        watch = self._watches.get(task["taskId"])
        if watch is None:
            return task
        if task["status"] in TERMINAL_TASK_STATUSES:
            del self._watches[task["taskId"]]
        if watch.status != task["status"]:
            watch.status = task["status"]
            sending = asyncio.create_task(self._send(watch.session, task, after=watch.sending))
            self._sending.add(sending)  # held until sent: the loop keeps only a weak reference
            sending.add_done_callback(self._sending.discard)
            watch.sending = sending
        return task

    @staticmethod
    async def _send(session: ServerSession, task: dict[str, Any], *, after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait({after})  # one task's notifications keep their order
        try:
            async with asyncio.timeout(NOTIFY_TIMEOUT_S):
                # The SDK's ServerNotification union lists no 2025-11-25 task notification.
                await session.send_notification(_TaskStatusNotification(params=task))  # type: ignore[arg-type]
        except Exception as exc:
            # Best effort by the spec: the session may be gone (closed, stateless) or stuck; the task is unaffected.
            _log.debug("notifications/tasks/status for %s dropped: %r", task["taskId"], exc)


__all__ = [
    "POLL_INTERVAL_MS",
    "RELATED_TASK_META_KEY",
    "TASKS_CAPABILITY",
    "TASKS_EXTENSION",
    "TASKS_PAGE_SIZE",
    "TASKS_PROTOCOL_VERSION",
    "TASK_TOOLS",
    "McpTasks",
    "TaskServer",
    "call_service",
    "decode_cursor",
    "encode_cursor",
    "final_result",
    "job_id",
    "serves_tasks",
    "task_of",
    "task_status",
    "tool_result",
]
