"""``claw connect``: ClawConnect, the MCP server in front of a gateway (``mcp`` over stdio, ``http``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from clawstack.cli._serving import configure_logging, serve_until_signal
from clawstack.connect import (
    AgentRegistry,
    ConnectError,
    ConnectService,
    HttpServer,
    JobStore,
    TokenAuth,
    create_app,
    load_agents,
    serve_stdio,
)
from clawstack.connect.agent_session import ENV_VAR, AgentSessionRuntimeRegistry, load_runtime_modules
from clawstack.connect.jobs import STORE_FILE
from clawstack.connect.mcp_sessions import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_SESSIONS_PER_CALLER, McpSessionSettings

__all__ = ["READY_PREFIX", "connect"]

READY_PREFIX = "clawconnect listening on "
"""``claw connect http`` prints this prefix, ``http://HOST:PORT/mcp`` and how callers are admitted."""

DEFAULT_DATA_DIR = Path("~/.clawconnect")
_log = logging.getLogger("clawstack.connect")


def _options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        show_default=True,
        help="Logging on stderr (never task text, passwords or tokens).",
    )(command)
    command = click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Where the job store (jobs.sqlite3) lives (default: ~/.clawconnect).",
    )(command)
    return click.option(
        "--agents",
        "agents_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="agents.json (default: ~/.clawconnect/agents.json, else OPENCLAW_URL / OPENCLAW_PASSWORD / "
        "OPENCLAW_AGENT_ID).",
    )(command)


@click.group(name="connect")
def connect() -> None:
    """ClawConnect: run tasks on gateway agents from MCP clients (docs/connect.md).

    Agent-session runtimes come only from the host modules named by CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES
    (comma- or newline-separated module paths or .py files); without it none is registered. Each callback runs
    under AGENT_SESSION_CALL_TIMEOUT_MS (default 60000).
    """


def _prepare(agents_path: Path | None, data_dir: Path | None, log_level: str) -> tuple[AgentRegistry, JobStore]:
    configure_logging(log_level)
    try:
        agents = load_agents(agents_path)
    except ConnectError as exc:
        raise click.ClickException(f"[{exc.code}] {exc.message}") from exc
    directory = (data_dir if data_dir is not None else DEFAULT_DATA_DIR).expanduser()
    return agents, JobStore(directory / STORE_FILE)


def _agent_session_runtimes() -> AgentSessionRuntimeRegistry:
    """A new registry holding only what the operator's host modules register (nothing without the variable)."""
    registry = AgentSessionRuntimeRegistry()
    load_runtime_modules(registry, os.environ.get(ENV_VAR))
    return registry


async def _start(service: ConnectService) -> None:
    try:
        await service.start()
    except ConnectError as exc:
        raise click.ClickException(f"[{exc.code}] {exc.message}") from exc


@connect.command()
@_options
def mcp(agents_path: Path | None, data_dir: Path | None, log_level: str) -> None:
    """Serve MCP over stdio (for Claude Desktop, Cursor, …) until stdin closes or SIGTERM.

    Only MCP messages are written to stdout; logs go to stderr. Jobs still running when it stops are recovered
    from the gateway at the next start.
    """
    agents, store = _prepare(agents_path, data_dir, log_level)
    runtimes = _agent_session_runtimes()
    asyncio.run(_serve_mcp(ConnectService(agents, store, agent_session_runtimes=runtimes), runtimes))


async def _serve_mcp(service: ConnectService, runtimes: AgentSessionRuntimeRegistry) -> None:
    await _start(service)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    serving = asyncio.create_task(serve_stdio(service, agent_session_runtimes=runtimes))
    stop_wait = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait((serving, stop_wait), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (serving, stop_wait):
            task.cancel()
        # Best-effort shutdown step: the stdio loop ends by cancellation; its outcome no longer matters.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await serving
        await service.stop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


@connect.command()
@_options
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option(
    "--max-sessions-per-caller",
    envvar="CLAWCONNECT_MAX_SESSIONS_PER_CALLER",
    show_envvar=True,
    default=DEFAULT_MAX_SESSIONS_PER_CALLER,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="How many MCP sessions one caller (a personal token, the shared pass, or everyone on an open endpoint) "
    "may hold at once; one more is refused with HTTP 429.",
)
@click.option(
    "--session-idle-timeout",
    "session_idle_timeout_s",
    envvar="CLAWCONNECT_SESSION_IDLE_TIMEOUT_S",
    show_envvar=True,
    default=DEFAULT_IDLE_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(1, 7 * 24 * 3600),
    metavar="SECONDS",
    help="An MCP session with no request in flight (an open GET stream counts) for this long ends, and its "
    "place in its caller's bound is freed.",
)
def http(
    agents_path: Path | None,
    data_dir: Path | None,
    log_level: str,
    host: str,
    port: int,
    max_sessions_per_caller: int,
    session_idle_timeout_s: float,
) -> None:
    """Serve MCP over Streamable HTTP at /mcp (and /health) until SIGTERM or SIGINT.

    Callers need a token: MCP_USER_TOKENS ('Name:token,…'), MCP_USER_TOKENS_FILE (a JSON object of name: token,
    reloaded when it changes) or PUBLIC_MCP_PASS, sent as 'Authorization: Bearer TOKEN' or '?pass=TOKEN'. With
    none set the endpoint is open, and the readiness line says so. Once listening it prints one line on stdout:
    'clawconnect listening on http://HOST:PORT/mcp (…)'.

    An MCP session belongs to the caller that opened it: any other caller naming its Mcp-Session-Id is answered
    404, as for an unknown one. SSE streams carry event ids and resume with Last-Event-ID (events kept in memory).
    """
    agents, store = _prepare(agents_path, data_dir, log_level)
    try:
        auth = TokenAuth.from_env(os.environ)
    except ConnectError as exc:
        raise click.ClickException(f"[{exc.code}] {exc.message}") from exc
    runtimes = _agent_session_runtimes()
    service = ConnectService(agents, store, agent_session_runtimes=runtimes)
    sessions = McpSessionSettings(
        max_sessions_per_caller=max_sessions_per_caller, idle_timeout_s=session_idle_timeout_s
    )
    asyncio.run(_serve_http(service, runtimes, auth, host, port, sessions))


async def _serve_http(
    service: ConnectService,
    runtimes: AgentSessionRuntimeRegistry,
    auth: TokenAuth,
    host: str,
    port: int,
    sessions: McpSessionSettings,
) -> None:
    server: HttpServer | None = None

    async def start() -> str:
        nonlocal server
        try:
            app = create_app(service, auth, host=host, agent_session_runtimes=runtimes, sessions=sessions)
            server = HttpServer(app, host=host, port=port)
        except OSError as exc:
            raise click.ClickException(f"cannot listen: {exc.strerror or exc}") from exc
        await _start(service)
        await server.start()
        if auth.open:
            _log.warning("the MCP endpoint is open: %s", auth.describe())
        return f"{READY_PREFIX}{server.url} ({auth.describe()})"

    async def stop() -> None:
        if server is not None:
            await server.stop()
        await service.stop()

    await serve_until_signal(start, stop, name="clawstack.connect")
