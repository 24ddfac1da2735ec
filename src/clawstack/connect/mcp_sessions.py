"""MCP sessions of ``claw connect http`` belong to the caller that opened them, and each caller has a bound.

The SDK's Streamable HTTP transport issues an ``Mcp-Session-Id`` in its answer to the ``initialize`` request that
opens a session. :class:`McpSessions` stands in front of it, for every request to ``/mcp`` of a session-based
protocol revision (up to 2025-11-25; a 2026-07-28 request has no session and passes untouched):

* **Ownership.** The session id is recorded with the :attr:`~clawstack.connect.callers.Caller.key` of the caller
  whose request opened it. A request naming a session id that is not recorded, or recorded for another caller (a
  personal token, the shared pass's ``public`` and an open endpoint's ``anonymous`` are three different callers), is
  answered exactly as the SDK answers an unknown id: HTTP 404 with ``{"jsonrpc": "2.0", "id": null, "error":
  {"code": -32600, "message": "Session not found"}}``, and never reaches the transport. That holds for ``POST``,
  ``GET`` (the standalone stream, and resumption) and ``DELETE``. A refused request does not keep the session alive.
* **A bound per caller.** A caller holds at most ``max_sessions_per_caller`` sessions (opening ones included); one
  more is refused with HTTP 429 and a JSON-RPC error (code -32000, ``data: {"code": "mcp_session_limit", "limit":
  N}``) before the SDK sees it. Other callers are not affected; the SDK's own limit over all callers (10,000, HTTP
  503) still applies.
* **Ends.** A session ends when its owner deletes it (``DELETE`` answered 2xx), when it has had no request in
  flight (an open ``GET`` stream counts) for ``idle_timeout_s`` (the SDK closes it after the same idle period; this
  record is forgotten no sooner), or when the SDK answers 404 for it. Its record and its events
  (:mod:`clawstack.connect.event_store`) go with it, and its id answers 404 from then on.

Every request of an admitted session runs with that session's event log current
(:meth:`~clawstack.connect.event_store.SessionEventStore.use`), which is how resumption stays within the session.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clawstack.connect.event_store import (
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_EVENTS_PER_SESSION,
    SessionEvents,
    SessionEventStore,
)

DEFAULT_MAX_SESSIONS_PER_CALLER: Final = 32
DEFAULT_IDLE_TIMEOUT_S: Final = 1800.0
DEFAULT_SSE_RETRY_MS: Final = 1000
SESSION_LIMIT_CODE: Final = -32000
"""The JSON-RPC error code of a refusal at the per-caller bound (``data.code`` is ``mcp_session_limit``)."""
SESSION_ID_HEADER: Final = b"mcp-session-id"
_VERSION_HEADER: Final = b"mcp-protocol-version"
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class McpSessionSettings:
    """How many MCP sessions a caller may hold, how long an idle one lives, and how streams resume.

    ``sse_retry_ms`` is the ``retry`` field of each priming event (how long a client waits before it reconnects);
    ``max_events_per_session`` and ``max_events`` bound the resumable events kept in memory."""

    max_sessions_per_caller: int = DEFAULT_MAX_SESSIONS_PER_CALLER
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    sse_retry_ms: int = DEFAULT_SSE_RETRY_MS
    max_events_per_session: int = DEFAULT_MAX_EVENTS_PER_SESSION
    max_events: int = DEFAULT_MAX_EVENTS

    def __post_init__(self) -> None:
        if self.max_sessions_per_caller < 1:
            raise ValueError("max_sessions_per_caller must be at least 1")
        if not (math.isfinite(self.idle_timeout_s) and self.idle_timeout_s > 0):
            raise ValueError("idle_timeout_s must be a positive number of seconds")
        if self.sse_retry_ms < 0:
            raise ValueError("sse_retry_ms must not be negative")
        if self.max_events_per_session < 1 or self.max_events < 1:
            raise ValueError("event bounds must be at least 1")


@dataclass(eq=False)
class McpSession:
    """One MCP session as recorded here: its owner, its events, and whether a request is in flight."""

    owner: str
    events: SessionEvents
    session_id: str | None = None
    in_flight: int = 0
    idle_since: float = 0.0


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as the SDK reads it."""
    return next((value.decode("latin-1") for key, value in headers if key.lower() == name), None)


def _json_rpc_error(status: int, error: ErrorData) -> Response:
    body = JSONRPCError(jsonrpc="2.0", id=None, error=error)
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True), status_code=status, media_type="application/json"
    )


def session_not_found() -> Response:
    """The SDK's own answer to an unknown ``Mcp-Session-Id``, to the byte."""
    return _json_rpc_error(404, ErrorData(code=INVALID_REQUEST, message="Session not found"))


class McpSessions:
    """The MCP sessions of one ``claw connect http`` and their owners (see the module docstring)."""

    def __init__(
        self,
        settings: McpSessionSettings,
        events: SessionEventStore,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.events = events
        self._clock = clock
        self._by_id: dict[str, McpSession] = {}
        self._by_owner: dict[str, set[McpSession]] = {}

    def count(self, owner: str) -> int:
        """How many sessions ``owner`` holds, opening ones included."""
        return len(self._by_owner.get(owner, ()))

    async def serve(self, owner: str, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """Serve one request to the MCP endpoint for ``owner`` (a caller's key) through ``app`` (the SDK's)."""
        version = _header(scope["headers"], _VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await app(scope, receive, send)  # the SDK serves it without a session
            return
        session_id = _header(scope["headers"], SESSION_ID_HEADER)
        if session_id is None:
            await self._open(owner, scope, receive, send, app)
            return
        session = self._find(session_id, owner)
        if session is None:
            await session_not_found()(scope, receive, send)
            return
        status: int | None = None

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._run(session, scope, receive, watch, app)
        finally:
            deleted = scope["method"] == "DELETE" and status is not None and 200 <= status < 300
            if deleted or status == 404:
                self._end(session)

    async def _open(self, owner: str, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        self._expire_idle()
        limit = self.settings.max_sessions_per_caller
        if self.count(owner) >= limit:
            _log.warning("refused a new MCP session for %s: it holds %d, the limit per caller", owner, limit)
            await self._limit_response()(scope, receive, send)
            return
        session = McpSession(owner, self.events.open_session(), idle_since=self._clock())
        self._by_owner.setdefault(owner, set()).add(session)

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                session_id = _header(list(message.get("headers", [])), SESSION_ID_HEADER)
                if session_id is not None:
                    session.session_id = session_id
                    self._by_id[session_id] = session
                    _log.debug("MCP session opened for %s (%d open)", owner, self.count(owner))
            await send(message)

        try:
            await self._run(session, scope, receive, watch, app)
        finally:
            if session.session_id is None:
                self._end(session)

    async def _run(self, session: McpSession, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        # The session's message loop starts inside the request that opens it, so it inherits this log too.
        token = self.events.use(session.events)
        session.in_flight += 1
        try:
            await app(scope, receive, send)
        finally:
            session.in_flight -= 1
            session.idle_since = self._clock()
            self.events.release(token)

    def _limit_response(self) -> Response:
        limit = self.settings.max_sessions_per_caller
        message = (
            f"too many open MCP sessions: this caller already holds {limit}, the limit per caller; end one "
            f"(DELETE with its Mcp-Session-Id) or let one expire ({self.settings.idle_timeout_s:g} s without a request)"
        )
        data = {"code": "mcp_session_limit", "limit": limit}
        return _json_rpc_error(429, ErrorData(code=SESSION_LIMIT_CODE, message=message, data=data))

    def _find(self, session_id: str, owner: str) -> McpSession | None:
        session = self._by_id.get(session_id)
        if session is None:
            return None
        if self._expired(session):
            self._end(session)
            return None
        return session if session.owner == owner else None

    def _expired(self, session: McpSession) -> bool:
        idle_s = self._clock() - session.idle_since
        return session.in_flight == 0 and idle_s >= self.settings.idle_timeout_s

    def _expire_idle(self) -> None:
        for session in [s for s in self._by_id.values() if self._expired(s)]:
            self._end(session)

    def _end(self, session: McpSession) -> None:
        """Forget ``session`` and its events. Idempotent."""
        if session.session_id is not None and self._by_id.get(session.session_id) is session:
            del self._by_id[session.session_id]
            _log.debug("MCP session of %s ended", session.owner)
        owned = self._by_owner.get(session.owner)
        if owned is not None:
            owned.discard(session)
            if not owned:
                del self._by_owner[session.owner]
        self.events.close_session(session.events)


__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_SESSIONS_PER_CALLER",
    "DEFAULT_SSE_RETRY_MS",
    "SESSION_LIMIT_CODE",
    "McpSession",
    "McpSessionSettings",
    "McpSessions",
    "session_not_found",
]
