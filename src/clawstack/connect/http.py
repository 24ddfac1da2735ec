"""``claw connect http``: MCP over Streamable HTTP at ``/mcp``, plus ``/health``.

The MCP SDK's Streamable HTTP transport is an ASGI application (Starlette), served here by uvicorn; a small guard
in front of it admits callers (:class:`~clawstack.connect.auth.TokenAuth`):

* ``/health`` answers ``GET`` with ``{"status", "jobStore", "agents"}``, without a token;
* ``/mcp`` needs a token from ``Authorization: Bearer …`` or ``?pass=…`` unless the server is open; a refused call
  gets HTTP 403 with the JSON-RPC error ``{"code": -32001, "message": …}``; an admitted ``POST`` whose body is not
  declared JSON (``Content-Type: application/json``) gets 415. The admitted
  :class:`~clawstack.connect.callers.Caller` (a token's owner, the shared pass's ``public``, or the one anonymous
  caller of an open endpoint) reaches the tools with the request.
* Each MCP session belongs to the caller that opened it, and a caller holds a bounded number of them
  (:mod:`clawstack.connect.mcp_sessions`); its SSE streams carry event ids and resume with ``Last-Event-ID`` from a
  bounded per-session store (:mod:`clawstack.connect.event_store`), which the SDK's transport is given, with the
  ``retry`` interval of its priming events and the idle period after which it closes a session
  (:class:`~clawstack.connect.mcp_sessions.McpSessionSettings`).

uvicorn's access log is off: a query string may carry a pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any, Final
from urllib.parse import parse_qs

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.auth import TokenAuth
from clawstack.connect.event_store import SessionEventStore
from clawstack.connect.mcp_sessions import McpSessions, McpSessionSettings
from clawstack.connect.server import CALLER_STATE_KEY, create_mcp_server
from clawstack.connect.service import ConnectService

MCP_PATH: Final = "/mcp"
HEALTH_PATH: Final = "/health"
FORBIDDEN_CODE: Final = -32001


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _offered_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("pass")
    return values[0] if values else None


def _content_type(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-type":
            return str(value.decode("latin-1")).split(";")[0].strip().lower()
    return ""


class AuthGuard:
    """ASGI middleware: ``/health``, then the token check and the JSON check in front of ``/mcp``, then the MCP
    session checks of ``sessions`` (:class:`~clawstack.connect.mcp_sessions.McpSessions`)."""

    def __init__(
        self, app: ASGIApp, auth: TokenAuth, health: Callable[[], dict[str, Any]], sessions: McpSessions
    ) -> None:
        self.app = app
        self.auth = auth
        self.health = health
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == HEALTH_PATH:
            if scope["method"] not in ("GET", "HEAD"):
                await _send_json(send, 405, {"error": "method not allowed"})
                return
            await _send_json(send, 200, self.health())
            return
        if path == MCP_PATH or path.startswith(MCP_PATH + "/"):
            caller = self.auth.identify(_offered_token(scope))
            if caller is None:
                message = "forbidden: a valid token is required (Authorization: Bearer <token> or ?pass=<token>)"
                body = {"jsonrpc": "2.0", "id": None, "error": {"code": FORBIDDEN_CODE, "message": message}}
                await _send_json(send, 403, body)
                return
            if scope["method"] == "POST" and _content_type(scope) != "application/json":
                body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "the body must be JSON"}}
                await _send_json(send, 415, body)
                return
            scope.setdefault("state", {})[CALLER_STATE_KEY] = caller
            if path == MCP_PATH:
                await self.sessions.serve(caller.key, scope, receive, send, self.app)
                return
        await self.app(scope, receive, send)


def create_app(
    service: ConnectService,
    auth: TokenAuth,
    *,
    host: str = "127.0.0.1",
    agent_session_runtimes: AgentSessionRuntimeRegistry | None = None,
    sessions: McpSessionSettings | None = None,
) -> ASGIApp:
    """The HTTP application: the SDK's Streamable HTTP app for :func:`create_mcp_server`, behind :class:`AuthGuard`.

    ``agent_session_runtimes`` is injected as :func:`create_mcp_server` does. ``sessions`` (default:
    :class:`~clawstack.connect.mcp_sessions.McpSessionSettings`'s defaults) sets the per-caller bound on MCP
    sessions, their idle period, the priming events' ``retry`` and the resumable event store's bounds."""
    sessions = sessions if sessions is not None else McpSessionSettings()
    server = create_mcp_server(service, agent_session_runtimes=agent_session_runtimes)
    events = SessionEventStore(max_events_per_session=sessions.max_events_per_session, max_events=sessions.max_events)
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=host,
        event_store=events,
        retry_interval=sessions.sse_retry_ms,
        session_idle_timeout=sessions.idle_timeout_s,
    )
    return AuthGuard(app, auth, service.health, McpSessions(sessions, events))


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the caller decides when to stop (:meth:`HttpServer.stop`)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()


class HttpServer:
    """Serve an ASGI app on ``host:port`` (0 picks a free port); :meth:`start` returns once it accepts."""

    def __init__(self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", log_config=None)
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT/mcp``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{MCP_PATH}"

    async def start(self) -> None:
        task = self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        listening = asyncio.create_task(self._server.listening.wait())
        await asyncio.wait((task, listening), return_when=asyncio.FIRST_COMPLETED)
        listening.cancel()
        if task.done():
            task.result()
            raise OSError("the HTTP server stopped while starting")

    async def stop(self) -> None:
        """Stop accepting, finish requests in flight, close the socket. Idempotent."""
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._sock.close()


__all__ = ["FORBIDDEN_CODE", "HEALTH_PATH", "MCP_PATH", "AuthGuard", "HttpServer", "create_app"]
