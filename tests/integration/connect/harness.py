"""Real processes for ClawConnect's end-to-end tests: ``claw fake-llm serve``, ``claw gateway serve`` (restartable
on the same port) and ``claw connect`` over stdio or Streamable HTTP, driven by the official MCP ``ClientSession``.
:func:`peer_session` points ``claw connect`` at a gateway peer from ``tests/integration/gateway/peers.py`` instead
(``claw gateway serve`` or the real OpenClaw gateway).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.gateway import peers

GATEWAY_PASSWORD = "connect-e2e-gateway-password"
FAKE_KEY = "sk-connect-e2e"
START_S = 30.0


async def poll_until(predicate: Callable[[], Awaitable[bool]], *, timeout_s: float = START_S) -> None:
    """Check ``predicate`` every 50 ms until it holds; fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.05)):
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _claw(*args: str) -> list[str]:
    return [sys.executable, "-m", "clawstack", *args]


def start_process(
    argv: list[str], prefix: str, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})}
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(prefix):
        proc.kill()
        proc.wait()
        raise AssertionError(f"{argv[3:5]} did not start: {line!r}")
    return proc, line.removeprefix(prefix)


def stop(proc: subprocess.Popen[str], *, kill: bool = False) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        code = proc.wait(START_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return code


class FakeModel:
    """``claw fake-llm serve`` as a process."""

    def __init__(self) -> None:
        self.proc, self.base_url = start_process(
            _claw("fake-llm", "serve"), "fake-llm listening on ", {"CLAW_FAKE_LLM_API_KEY": FAKE_KEY}
        )

    def chat_requests(self) -> list[dict[str, Any]]:
        reply = httpx2.get(self.base_url.removesuffix("/v1") + "/_fake/requests", timeout=10)
        return [r for r in reply.json()["requests"] if r["path"].endswith("/chat/completions")]

    def close(self) -> None:
        stop(self.proc)


class GatewayProcess:
    """``claw gateway serve`` on a fixed port, so that it can be killed and started again at the same address."""

    def __init__(self, directory: Path, fake: FakeModel, *, plugin_paths: Sequence[Path] = ()) -> None:
        self.port = free_port()
        self.plugin_paths = tuple(plugin_paths)
        self.config = directory / "gateway.json5"
        self.data_dir = directory / "gateway-data"
        document = {
            "models": {"providers": {"fake": {"baseUrl": fake.base_url, "apiKey": FAKE_KEY, "models": [{"id": "m"}]}}},
            "agents": {"defaults": {"model": {"primary": "fake/m"}}},
            "gateway": {"port": self.port, "auth": {"mode": "password", "password": GATEWAY_PASSWORD}},
        }
        self.config.write_text(json.dumps(document))
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = _claw("gateway", "serve", "--config", str(self.config), "--data-dir", str(self.data_dir))
        for path in self.plugin_paths:
            argv += ["--plugins", str(path)]
        self.proc, _ = start_process(argv, "gateway listening on ")

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None:
            stop(self.proc, kill=kill)
            self.proc = None


def connect_env(gateway: GatewayProcess, **extra: str) -> dict[str, str]:
    """The environment a ``claw connect`` needs to reach ``gateway`` (the OPENCLAW_* fallback)."""
    env = {"OPENCLAW_URL": gateway.url, "OPENCLAW_PASSWORD": GATEWAY_PASSWORD, "OPENCLAW_AGENT_ID": "main"}
    for name in ("MCP_USER_TOKENS", "MCP_USER_TOKENS_FILE", "PUBLIC_MCP_PASS"):
        env[name] = ""
    env.update(extra)
    return env


@asynccontextmanager
async def stdio_session(
    data_dir: Path, env: Mapping[str, str], *, args: Sequence[str] = ()
) -> AsyncIterator[ClientSession]:
    """``claw connect mcp`` (with ``args`` added) as a subprocess of the official stdio client, initialised."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "clawstack", "connect", "mcp", "--data-dir", str(data_dir), "--log-level", "warning", *args],
        env={"HOME": str(data_dir), **env},
    )
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 (opening /dev/null does not block)
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


def peer_agent(peer: peers.Peer) -> str:
    """The ClawConnect agent id :func:`peer_session` configures for ``peer``."""
    return "main" if peer.auth_mode == "token" else "openclaw"


@asynccontextmanager
async def peer_session(data_dir: Path, peer: peers.Peer) -> AsyncIterator[ClientSession]:
    """:func:`stdio_session` on ``peer``: a peer in token mode through an ``agents.json`` (beside ``data_dir``) with
    ``token``; a peer in password mode through the ``OPENCLAW_*`` environment fallback."""
    if peer.auth_mode == "password":
        env = {"OPENCLAW_URL": peer.url, "OPENCLAW_PASSWORD": peers.PASSWORD, "OPENCLAW_AGENT_ID": "main"}
        async with stdio_session(data_dir, env) as session:
            yield session
        return
    agents = data_dir.parent / "agents.json"
    agents.parent.mkdir(parents=True, exist_ok=True)
    agents.write_text(json.dumps({"agents": [{"id": peer_agent(peer), "url": peer.url, "token": peers.TOKEN}]}))
    agents.chmod(0o600)
    async with stdio_session(data_dir, {}, args=["--agents", str(agents)]) as session:
        yield session


class HttpConnect:
    """``claw connect http --port 0`` as a process."""

    def __init__(self, data_dir: Path, env: Mapping[str, str]) -> None:
        argv = _claw("connect", "http", "--port", "0", "--data-dir", str(data_dir), "--log-level", "warning")
        self.proc, rest = start_process(argv, "clawconnect listening on ", {"HOME": str(data_dir), **env})
        self.url, _, self.mode = rest.partition(" ")

    @property
    def base(self) -> str:
        return self.url.removesuffix("/mcp")

    def close(self) -> int:
        return stop(self.proc)


@asynccontextmanager
async def http_session(url: str, *, token: str | None = None) -> AsyncIterator[ClientSession]:
    """The official Streamable HTTP client on ``url``, initialised."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool call's structured content (an error result included)."""
    result = await session.call_tool(name, arguments or {})
    assert isinstance(result.structured_content, dict), result
    data = dict(result.structured_content)
    assert isinstance(data.get("error"), dict) == bool(result.is_error), data
    return data


async def wait_terminal(session: ClientSession, job: dict[str, Any], *, wait_ms: int = 5000) -> dict[str, Any]:
    """Follow a job with check_task waits until it is terminal (bounded)."""
    async with asyncio.timeout(START_S * 2):
        while True:
            snap = await call(session, "check_task", {**job["nextAction"]["args"], "waitMs": wait_ms})
            if snap["isTerminal"]:
                return snap
