"""The model-facing session tools, with OpenClaw's names and shapes: ``sessions_spawn``, ``agents_wait``,
``subagents``, ``sessions_list``, ``sessions_history``, ``sessions_send`` and ``session_status``.

Every result is a JSON object (indented as OpenClaw's tool results are). A policy refusal is a result with
``"status": "forbidden"`` (or ``"error"`` for arguments the tool cannot use) and an ``error`` text; arguments of the
wrong type are an error result (``isError``).

Visibility (``tools.sessions.visibility``): ``tree`` (the default here) lets a turn see its own session and the
native children of its current incarnation; ``agent`` adds every session of its agent; ``all`` every session.
Sessions owned by a plugin are never visible, and native children are one-shot: ``sessions_send`` refuses them
(spawn another child instead).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal

from clawstack.gateway.custody import ChildRecord
from clawstack.gateway.dispatch import RunRequest
from clawstack.gateway.keys import SessionKeyError, parse_session_key
from clawstack.gateway.native import (
    NATIVE_OWNER,
    PREVIEW_CHARS,
    NativeChildren,
    Parent,
    SpawnRefusedError,
    SpawnRequest,
)
from clawstack.gateway.runner import GatewayRuns
from clawstack.gateway.sessions import Message, Session, SessionStore, content_text
from clawstack.gateway.tools import Tool, ToolError, ToolInvocation

__all__ = [
    "SESSION_TOOL_NAMES",
    "Visibility",
    "session_tools",
]

Visibility = Literal["self", "tree", "agent", "all"]

SESSION_TOOL_NAMES: Final = (
    "sessions_spawn",
    "agents_wait",
    "subagents",
    "sessions_list",
    "sessions_history",
    "sessions_send",
    "session_status",
)
#: ``sessions_history`` returns at most this many messages, each text cut to this many characters, and at most
#: this many bytes in all (older messages are dropped first).
MAX_HISTORY_MESSAGES: Final = 200
HISTORY_TEXT_CHARS: Final = 4000
HISTORY_MAX_BYTES: Final = 80_000
#: ``sessions_send`` waits this long for the reply by default, and at most this long.
DEFAULT_SEND_WAIT_S: Final = 30
MAX_SEND_WAIT_S: Final = 600
#: The ``sessions_spawn`` arguments this gateway does not support, and why.
_UNSUPPORTED_SPAWN: Final[Mapping[str, str]] = {
    "runtime": 'only runtime "subagent" exists here',
    "thread": "thread binding is not supported",
    "visible": "visible (dashboard) sessions are not supported",
    "cwd": "children work in their agent's workspace",
    "attachments": "attachments are not supported",
    "attachAs": "attachments are not supported",
    "placement": "only local execution exists",
    "sandbox": "sandbox selection is not supported",
    "completionTarget": "native children are always collected with agents_wait",
    "outputSchema": "structured child output is not supported yet",
    "groupId": "collector groups are not supported",
    "projectId": "visible sessions are not supported",
    "projectGitUrl": "visible sessions are not supported",
    "worktree": "visible sessions are not supported",
    "worktreeName": "visible sessions are not supported",
    "worktreeBaseRef": "visible sessions are not supported",
    "group": "visible sessions are not supported",
    "lightContext": "light bootstrap is not supported",
    "resumeSessionId": "ACP is not supported",
    "streamTo": "ACP is not supported",
}
_DELIVERY_KEYS: Final = ("target", "channel", "to", "threadId", "replyTo", "transport")

Handler = Callable[[dict[str, Any], ToolInvocation], Awaitable[str]]


def _result(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, indent=2, ensure_ascii=False)


def _string(arguments: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = arguments.get(name)
    if value is None:
        if required:
            raise ToolError(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise ToolError(f"{name} must be a string")
    return value


def _integer(arguments: Mapping[str, Any], name: str, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ToolError(f"{name} must be an integer")
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ToolError(f"{name} must be {bound}")
    return number


def _parent(invocation: ToolInvocation) -> Parent:
    return Parent(
        session_key=invocation.session_key,
        session_id=invocation.session_id,
        agent_id=invocation.agent_id,
        run_id=invocation.run_id,
        tools=invocation.tools,
        model=invocation.model,
        blind=invocation.blind,
    )


class _SessionTools:
    def __init__(self, store: SessionStore, runs: GatewayRuns, natives: NativeChildren, visibility: Visibility) -> None:
        self._store = store
        self._runs = runs
        self._natives = natives
        self._visibility = visibility

    # -- visibility --------------------------------------------------------------------------------------------

    async def _visible(self, invocation: ToolInvocation, key: str) -> tuple[Session | None, ChildRecord | None]:
        """The session ``key`` if this turn may see it, and its custody record when it is a native child."""
        try:
            key = str(parse_session_key(key))
        except SessionKeyError:
            return None, None
        session = await asyncio.to_thread(self._store.get, key)
        if session is None:
            return None, None
        record = await self._natives.child(key) if session.owner == NATIVE_OWNER else None
        if key == invocation.session_key:
            return session, record
        if session.owner is not None and session.owner != NATIVE_OWNER:
            return None, None  # plugin-owned sessions are never reachable from a model
        if record is not None and record.parent_key == invocation.session_key:
            own = record.parent_session_id == invocation.session_id
            return (session, record) if own and self._visibility != "self" else (None, None)
        if self._visibility == "all" or (self._visibility == "agent" and session.agent_id == invocation.agent_id):
            return session, record
        return None, None

    # -- sessions_spawn / agents_wait / subagents --------------------------------------------------------------

    async def spawn(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        for key in _DELIVERY_KEYS:
            if key in arguments:
                raise ToolError(f'sessions_spawn does not support "{key}"; remove channel-delivery parameters')
        if "timeoutSeconds" in arguments:
            raise ToolError(
                'sessions_spawn does not support "timeoutSeconds". Use "runTimeoutSeconds" for a per-run timeout.'
            )
        for key, why in _UNSUPPORTED_SPAWN.items():
            value = arguments.get(key)
            if key == "runtime" and value in (None, "subagent"):
                continue
            if value is not None and value is not False and value != []:
                return _result({"status": "error", "error": f'sessions_spawn "{key}" is not supported here: {why}'})
        mode = arguments.get("mode")
        if mode not in (None, "run"):
            return _result({"status": "error", "error": 'native children are one-shot: only mode "run" exists'})
        if arguments.get("collect") is False or arguments.get("expectsCompletionMessage") is True:
            return _result(
                {"status": "error", "error": "native children are always collected with agents_wait (collect=true)"}
            )
        context = _string(arguments, "context")
        if context not in (None, "isolated", "fork"):
            raise ToolError('context must be "isolated" or "fork"')
        cleanup = _string(arguments, "cleanup") or "keep"
        if cleanup not in ("keep", "delete"):
            raise ToolError('cleanup must be "keep" or "delete"')
        blind = arguments.get("blind", False)
        if not isinstance(blind, bool):
            raise ToolError("blind must be a boolean")
        if arguments.get("fastMode") is True:
            raise ToolError('fastMode: this gateway has no fast mode (false or "auto" only)')
        if "fastMode" in arguments and arguments["fastMode"] not in (False, "auto"):
            raise ToolError('fastMode must be true, false or "auto"')
        request = SpawnRequest(
            task=_string(arguments, "task", required=True) or "",
            label=_string(arguments, "label") or None,
            task_name=_string(arguments, "taskName"),
            agent_id=_string(arguments, "agentId"),
            model=_string(arguments, "model"),
            thinking=_string(arguments, "thinking"),
            run_timeout_s=_integer(arguments, "runTimeoutSeconds"),
            context=context,  # type: ignore[arg-type]
            cleanup=cleanup,  # type: ignore[arg-type]
            blind=blind,
        )
        try:
            return _result(await self._natives.spawn(_parent(invocation), request))
        except SpawnRefusedError as exc:
            return _result({"status": exc.status, "error": exc.message})

    async def wait(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        ids = arguments.get("ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            raise ToolError("ids must be a non-empty list of run ids")
        timeout = arguments.get("timeoutSeconds")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0):
            raise ToolError("timeoutSeconds must be a number of seconds, at least 0")
        try:
            state = await self._natives.wait(_parent(invocation), ids, None if timeout is None else float(timeout))
        except SpawnRefusedError as exc:
            raise ToolError(exc.message) from None
        return _result(state)

    async def subagents(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        action = _string(arguments, "action") or "list"
        parent = _parent(invocation)
        if action == "list":
            records = await self._natives.children_of(parent)
            return _result({"status": "ok", "action": "list", "count": len(records), "children": _rows(records)})
        if action in ("cancel", "kill"):
            target = _string(arguments, "taskId") or _string(arguments, "target") or _string(arguments, "runId")
            if not target:
                raise ToolError(f"subagents {action} needs a taskId")
            record = await self._natives.owned(parent, target)
            if record is None:
                return _result(
                    {"status": "forbidden", "action": action, "error": "no child of this session has that id"}
                )
            killed = await self._natives.kill(record)
            return _result({"status": "ok", "action": action, "taskId": record.run_id, "cancelled": killed})
        if action == "steer":
            return _result(
                {"status": "forbidden", "action": "steer", "error": "native children are one-shot: spawn another child"}
            )
        if action == "wait":
            task_ids = arguments.get("taskIds")
            if not isinstance(task_ids, list) or not 1 <= len(task_ids) <= 32:
                raise ToolError("subagents wait needs taskIds (1 to 32 ids)")
            timeout = _integer(arguments, "timeoutSeconds", maximum=60)
            state = await self._natives.wait(parent, task_ids, 30.0 if timeout is None else float(timeout))
            return _result({"status": "ok", "action": "wait", **state})
        raise ToolError('action must be "list", "wait" or "cancel"')

    # -- sessions_list / sessions_history / session_status / sessions_send --------------------------------------

    async def list_sessions(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        limit = _integer(arguments, "limit", minimum=1, maximum=200) or 50
        sessions: list[dict[str, Any]] = []
        own = await asyncio.to_thread(self._store.get, invocation.session_key)
        candidates = [] if own is None else [own]
        if self._visibility in ("agent", "all"):
            agent = None if self._visibility == "all" else invocation.agent_id
            candidates += await asyncio.to_thread(self._store.list, agent_id=agent, limit=1000)
        candidates += [
            s
            for record in await self._natives.children_of(_parent(invocation))
            if (s := await asyncio.to_thread(self._store.get, record.child_key)) is not None
        ]
        seen: set[str] = set()
        busy = self._runs.busy_sessions()
        for session in candidates:
            if session.key in seen or len(sessions) >= limit:
                continue
            visible, record = await self._visible(invocation, session.key)
            if visible is None:
                continue
            seen.add(session.key)
            entry: dict[str, Any] = {
                "key": session.key,
                "kind": "subagent" if record is not None else "direct",
                "agentId": session.agent_id,
                "sessionId": session.session_id,
                "updatedAt": session.updated_at_ms,
                "status": "running" if session.key in busy else "idle",
            }
            if session.label:
                entry["label"] = session.label
            if record is not None:
                entry["runId"] = record.run_id
                entry["spawnedBy"] = record.parent_key
                if record.completion is not None:
                    entry["status"] = record.completion
            sessions.append(entry)
        return _result({"count": len(sessions), "sessions": sessions, "visibility": self._visibility})

    async def history(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        key = _string(arguments, "sessionKey") or invocation.session_key
        limit = _integer(arguments, "limit", minimum=1, maximum=MAX_HISTORY_MESSAGES) or 20
        include_tools = arguments.get("includeTools", False)
        if not isinstance(include_tools, bool):
            raise ToolError("includeTools must be a boolean")
        session, _ = await self._visible(invocation, key)
        if session is None:
            return _result({"status": "forbidden", "error": "that session is not visible from this session"})
        page = await asyncio.to_thread(self._store.history, session.key, limit=limit, max_chars=HISTORY_TEXT_CHARS)
        messages = [m for m in page.messages if include_tools or m.role != "tool"]
        wire = [_history_entry(m, include_tools) for m in messages]
        content_truncated = any(m.truncated for m in messages)
        dropped = False
        while wire and len(json.dumps(wire).encode()) > HISTORY_MAX_BYTES:
            wire.pop(0)
            dropped = True
        return _result(
            {
                "sessionKey": session.key,
                "messages": wire,
                "truncated": page.has_more or dropped,
                "droppedMessages": dropped,
                "contentTruncated": content_truncated,
                "contentRedacted": False,
                "bytes": len(json.dumps(wire).encode()),
            }
        )

    async def status(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        key = _string(arguments, "sessionKey")
        if key in (None, "", "current"):
            key = invocation.session_key
        if _string(arguments, "model") is not None:
            return _result({"status": "error", "error": "changing a session's model is not supported here"})
        session, record = await self._visible(invocation, key)
        if session is None:
            return _result({"status": "forbidden", "error": "that session is not visible from this session"})
        children = await self._natives.children_of(
            Parent(session.key, session.session_id, session.agent_id, "", (), "")
        )
        payload: dict[str, Any] = {
            "sessionKey": session.key,
            "sessionId": session.session_id,
            "agentId": session.agent_id,
            "model": invocation.model if session.key == invocation.session_key else (record.model if record else ""),
            "updatedAt": session.updated_at_ms,
            "activeRuns": len(self._runs.active_run_ids(session.key)),
            "children": {"active": sum(1 for c in children if c.active), "total": len(children)},
        }
        if record is not None:
            payload["subagent"] = {
                "runId": record.run_id,
                "depth": record.depth,
                "status": record.completion or record.execution,
            }
        return _result(payload)

    async def send(self, arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        message = _string(arguments, "message", required=True) or ""
        key = _string(arguments, "sessionKey")
        if key is None:
            return _result({"status": "error", "error": "sessionKey is required"})
        mode = _string(arguments, "mode")
        if mode not in (None, "followup"):
            return _result({"status": "error", "error": f'sessions_send mode "{mode}" is not supported here'})
        wait_s = _integer(arguments, "timeoutSeconds", maximum=MAX_SEND_WAIT_S)
        wait_s = DEFAULT_SEND_WAIT_S if wait_s is None else wait_s
        session, record = await self._visible(invocation, key)
        if session is None:
            return _result({"status": "forbidden", "error": "that session is not visible from this session"})
        if record is not None:
            return _result(
                {
                    "status": "forbidden",
                    "error": "native children are one-shot: they accept no follow-up input; spawn another child",
                }
            )
        if session.key == invocation.session_key:
            return _result({"status": "error", "error": "a session cannot send to itself"})
        started = await self._runs.start(
            RunRequest(
                session_key=session.key,
                agent_id=session.agent_id,
                message=f"[Inter-session message from {invocation.session_key} isUser=false]\n{message}",
                lane="main",
                deliver=False,
            )
        )
        if wait_s == 0:
            return _result(
                {
                    "runId": started.run_id,
                    "status": "accepted",
                    "sessionKey": session.key,
                    "targetDisposition": "queued",
                }
            )
        run = await self._runs.wait_run(started.run_id, float(wait_s))
        if run is None or run.active:
            return _result(
                {
                    "runId": started.run_id,
                    "status": "timeout",
                    "error": f"no reply within {wait_s} s; the run goes on",
                    "sentBeforeError": True,
                    "sessionKey": session.key,
                }
            )
        if run.state != "ok":
            return _result(
                {"runId": run.run_id, "status": "error", "error": run.error or run.state, "sessionKey": session.key}
            )
        messages = await asyncio.to_thread(self._store.run_messages, run.run_id)
        reply = next(
            (content_text(m.content) for m in reversed(messages) if m.role == "assistant" and content_text(m.content)),
            "",
        )
        if not reply:
            return _result(
                {"runId": run.run_id, "status": "no_reply", "sessionKey": session.key, "message": "no visible reply"}
            )
        return _result({"runId": run.run_id, "status": "ok", "sessionKey": session.key, "reply": reply})


def _rows(records: list[ChildRecord]) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        row: dict[str, Any] = {
            "taskId": record.run_id,
            "runId": record.run_id,
            "sessionKey": record.child_key,
            "agentId": record.agent_id,
            "status": record.completion or record.execution,
            "execution": record.execution,
            "model": record.model,
            "createdAt": record.created_at_ms,
        }
        if record.label:
            row["label"] = record.label
        if record.task_name:
            row["taskName"] = record.task_name
        if record.ended_at_ms is not None:
            row["endedAt"] = record.ended_at_ms
        if record.result:
            row["preview"] = record.result[:PREVIEW_CHARS]
        rows.append(row)
    return rows


def _history_entry(message: Message, include_tools: bool) -> dict[str, Any]:
    wire = message.to_wire()
    if not include_tools and isinstance(wire.get("content"), list):
        wire["content"] = [b for b in wire["content"] if not (isinstance(b, dict) and b.get("type") == "toolCall")]
    return wire


_SCHEMAS: Final[Mapping[str, tuple[str, dict[str, Any]]]] = {
    "sessions_spawn": (
        "Spawn a one-shot native sub-agent for a task; collect its result later with agents_wait.",
        {
            "type": "object",
            "properties": {
                "task": {"type": "string"},
                "taskName": {"type": "string"},
                "label": {"type": "string"},
                "agentId": {"type": "string"},
                "model": {"type": "string"},
                "thinking": {"type": "string"},
                "runTimeoutSeconds": {"type": "integer", "minimum": 0},
                "context": {"type": "string", "enum": ["isolated", "fork"]},
                "cleanup": {"type": "string", "enum": ["delete", "keep"]},
                "collect": {"type": "boolean"},
                "blind": {"type": "boolean"},
                "fastMode": {"anyOf": [{"type": "boolean"}, {"const": "auto"}]},
                "mode": {"type": "string", "enum": ["run"]},
            },
            "required": ["task"],
        },
    ),
    "agents_wait": (
        "Wait for collector children by run id; returns completed results and the ids still pending.",
        {
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1000},
                "timeoutSeconds": {"type": "number", "minimum": 0},
            },
            "required": ["ids"],
        },
    ),
    "subagents": (
        "List, wait for or cancel the sub-agents this session spawned.",
        {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["list", "wait", "cancel"]},
                "taskId": {"type": "string"},
                "taskIds": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "minItems": 1,
                    "maxItems": 32,
                },
                "timeoutSeconds": {"type": "integer", "minimum": 0, "maximum": 60},
            },
        },
    ),
    "sessions_list": (
        "List the sessions visible from this session.",
        {"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1}}},
    ),
    "sessions_history": (
        "Read a bounded window of a visible session's transcript.",
        {
            "type": "object",
            "properties": {
                "sessionKey": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "includeTools": {"type": "boolean"},
            },
        },
    ),
    "sessions_send": (
        "Send a message to another visible session and optionally wait for its reply.",
        {
            "type": "object",
            "properties": {
                "sessionKey": {"type": "string"},
                "message": {"type": "string"},
                "timeoutSeconds": {"type": "integer", "minimum": 0},
                "mode": {"type": "string", "enum": ["followup"]},
            },
            "required": ["message"],
        },
    ),
    "session_status": (
        "Show the status of this session or another visible one.",
        {"type": "object", "properties": {"sessionKey": {"type": "string"}, "model": {"type": "string"}}},
    ),
}


def session_tools(
    store: SessionStore, runs: GatewayRuns, natives: NativeChildren, *, visibility: Visibility = "tree"
) -> list[Tool]:
    """The session tools as gateway-owned :class:`~clawstack.gateway.tools.Tool` objects."""
    impl = _SessionTools(store, runs, natives, visibility)
    handlers: dict[str, Handler] = {
        "sessions_spawn": impl.spawn,
        "agents_wait": impl.wait,
        "subagents": impl.subagents,
        "sessions_list": impl.list_sessions,
        "sessions_history": impl.history,
        "sessions_send": impl.send,
        "session_status": impl.status,
    }
    return [Tool(name, _SCHEMAS[name][0], _SCHEMAS[name][1], handlers[name]) for name in SESSION_TOOL_NAMES]
