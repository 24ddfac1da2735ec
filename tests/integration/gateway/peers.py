"""Gateway peers as processes: ``claw gateway serve`` and the real OpenClaw gateway, on the same scripted fake model.

Shared by the peer protocol tests (``test_peer_protocol.py``) and ``bench/gateway_vs_openclaw.py``. Both peers get
the same offline config document (clawstack accepts OpenClaw's key names and ignores the offline-only keys), a free
port on 127.0.0.1, token auth (or password auth, on request), and a ``claw fake-llm serve`` process as their only
model provider.

The real gateway is installed by ``scripts/openclaw-up`` under ``.peers/`` (``.peers/bin/node`` and
``.peers/openclaw/node_modules/openclaw/openclaw.mjs``); :func:`openclaw_missing_reason` says when it is not. It
runs with a scratch ``HOME``/``OPENCLAW_HOME`` so nothing outside the work directory is read or written. The same
script installs the MCP Inspector (:data:`INSPECTOR_CLI`, run with :data:`NODE`; :func:`inspector_missing_reason`).
:func:`openclaw_marks` and :func:`inspector_marks` skip tests that need them where they are missing, except under
``CLAWSTACK_REQUIRE_OPENCLAW=1`` (CI), where such a test fails instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

__all__ = [
    "AUTH_MODES",
    "INSPECTOR_CLI",
    "MODEL",
    "NODE",
    "OPENCLAW_ENTRY",
    "PASSWORD",
    "PEER_NAMES",
    "PROVIDER",
    "REQUIRE_OPENCLAW_ENV",
    "TOKEN",
    "FakeModel",
    "Peer",
    "PeerClient",
    "claw_executable",
    "connect_params",
    "descendants",
    "free_port",
    "inspector_marks",
    "inspector_missing_reason",
    "offline_config",
    "openclaw_marks",
    "openclaw_missing_reason",
    "running_peer",
    "start_fake_model",
    "start_peer",
    "tree_rss_kib",
    "wait_ready",
]

REPO = Path(__file__).resolve().parents[3]
PEERS_DIR = REPO / ".peers"
NODE = PEERS_DIR / "bin" / "node"
OPENCLAW_ENTRY = PEERS_DIR / "openclaw" / "node_modules" / "openclaw" / "openclaw.mjs"
#: The MCP Inspector's launcher (the package's ``mcp-inspector`` bin); ``--cli`` selects its CLI mode.
INSPECTOR_CLI = (
    PEERS_DIR / "inspector" / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients/launcher/build/index.js"
)

REQUIRE_OPENCLAW_ENV = "CLAWSTACK_REQUIRE_OPENCLAW"
"""Set to ``1`` where the real gateway must be installed (CI): its tests then fail instead of skipping."""

PEER_NAMES = ("claw", "openclaw")
TOKEN = "peer-test-token-0123456789"
PASSWORD = "peer-test-password-0123456789"
AUTH_MODES = ("token", "password")
FAKE_API_KEY = "sk-peer-fake-0123456789"
PROVIDER = "fake"
MODEL = "fake-model"

#: How long a peer may take to listen: the real gateway needs about 11 s on 2 cores; leave room for a busy CI box.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
WAIT_S = 30.0

Frame = dict[str, Any]


def openclaw_missing_reason() -> str | None:
    """Why the real gateway cannot be started here, or ``None`` when ``scripts/openclaw-up`` installed it."""
    for path in (NODE, OPENCLAW_ENTRY):
        if not path.exists():
            return f"the real OpenClaw gateway is not installed ({path} is missing); run scripts/openclaw-up"
    return None


def inspector_missing_reason() -> str | None:
    """Why the MCP Inspector CLI cannot run here, or ``None`` when ``scripts/openclaw-up`` installed it."""
    for path in (NODE, INSPECTOR_CLI):
        if not path.exists():
            return f"the MCP Inspector is not installed ({path} is missing); run scripts/openclaw-up"
    return None


def _required_marks(mark: pytest.MarkDecorator, what: str, reason: str | None) -> list[pytest.MarkDecorator]:
    marks = [mark, pytest.mark.slow]
    if os.environ.get(REQUIRE_OPENCLAW_ENV) != "1":
        marks.append(pytest.mark.skipif(reason is not None, reason=f"needs {what}: {reason}"))
    return marks


def openclaw_marks() -> list[pytest.MarkDecorator]:
    """``openclaw`` and ``slow``, and a skip saying why when the real gateway is missing (unless required)."""
    return _required_marks(pytest.mark.openclaw, "the real OpenClaw gateway", openclaw_missing_reason())


def inspector_marks() -> list[pytest.MarkDecorator]:
    """``inspector`` and ``slow``, and a skip saying why when the MCP Inspector is missing (unless required)."""
    return _required_marks(pytest.mark.inspector, "the MCP Inspector CLI", inspector_missing_reason())


def claw_executable() -> str:
    """The ``claw`` entry point of the interpreter running the tests (the project's ``.venv/bin/claw``)."""
    beside = Path(sys.executable).parent / "claw"
    if beside.exists():
        return str(beside)
    found = shutil.which("claw")
    if found is None:
        raise RuntimeError("no claw executable beside the interpreter or on PATH")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, read from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_rss_kib(pid: int) -> int:
    """The resident memory of ``pid`` and all its descendants, in KiB (``VmRSS`` from ``/proc/<pid>/status``)."""
    total = 0
    for member in (pid, *descendants(pid)):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, wait, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers the leader left behind
    if proc.poll() is None:
        proc.wait(STOP_TIMEOUT_S)


@dataclass
class FakeModel:
    """A ``claw fake-llm serve`` process; ``base_url`` ends in ``/v1``."""

    proc: subprocess.Popen[bytes]
    base_url: str

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def requests(self) -> list[Frame]:
        """Every ``/v1`` request received so far (``GET /_fake/requests``)."""
        with urllib.request.urlopen(f"{self.root}/_fake/requests", timeout=10) as response:
            body = json.load(response)
        requests: list[Frame] = body["requests"]
        return requests

    def completions_mentioning(self, marker: str) -> int:
        """How many chat completions carried ``marker`` in a user message.

        Any user message, not only the last: the real gateway appends a context message of its own after the user's.
        """
        count = 0
        for request in self.requests():
            if request["path"] != "/v1/chat/completions":
                continue
            users = [m for m in request["body"].get("messages", []) if m.get("role") == "user"]
            if any(marker in json.dumps(m.get("content"), ensure_ascii=False) for m in users):
                count += 1
        return count

    def stop(self) -> None:
        _stop_process(self.proc)


def start_fake_model(log_path: Path, *, port: int = 0, script: list[dict[str, Any]] | None = None) -> FakeModel:
    """Start ``claw fake-llm serve`` on ``port`` (0: a free one), requiring the fake's API key; return once it listens.

    ``script`` is a list of script steps (docs/fake-llm.md), answered in order; without one every answer is the
    fake's fixed default text.
    """
    env = {**os.environ, "CLAW_FAKE_LLM_API_KEY": FAKE_API_KEY}
    argv = [claw_executable(), "fake-llm", "serve", "--port", str(port), "--log-level", "warning"]
    if script is not None:
        script_path = log_path.with_name(f"{log_path.stem}-{uuid.uuid4().hex[:8]}.json")
        script_path.write_text(json.dumps(script))
        argv += ["--script", str(script_path)]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    proc.stdout.close()
    prefix = "fake-llm listening on "
    if not line.startswith(prefix):
        _stop_process(proc)
        raise RuntimeError(f"claw fake-llm serve did not start: {line!r}\n{_tail(log_path)}")
    return FakeModel(proc, line.removeprefix(prefix).strip())


def _credentials(auth_mode: str) -> dict[str, str]:
    """What a client sends as ``connect`` ``auth`` to a peer in ``auth_mode``."""
    if auth_mode not in AUTH_MODES:
        raise ValueError(f"unknown auth mode {auth_mode!r}; one of {AUTH_MODES}")
    return {"token": TOKEN} if auth_mode == "token" else {"password": PASSWORD}


def offline_config(
    port: int, fake_base_url: str, workdir: Path, *, auth_mode: str = "token", extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The one config document both peers run with (the reference's offline OpenClaw config).

    ``auth_mode`` ``token`` (the default) admits :data:`TOKEN`; ``password`` admits :data:`PASSWORD`. Each top-level
    key of ``extra`` replaces that section of the document (or adds it).
    """
    document: dict[str, Any] = {
        "gateway": {
            "mode": "local",
            "port": port,
            "bind": "loopback",
            "auth": {"mode": auth_mode, **_credentials(auth_mode)},
            "tailscale": {"mode": "off"},
        },
        "update": {"checkOnStart": False},
        "logging": {"file": str(workdir / "gateway-file.log")},
        "telemetry": {"enabled": False},
        "discovery": {"mdns": {"mode": "off"}},
        "models": {
            "mode": "replace",
            "catalogRefresh": {"enabled": False},
            "providers": {
                PROVIDER: {
                    "baseUrl": fake_base_url,
                    "apiKey": FAKE_API_KEY,
                    "api": "openai-completions",
                    "models": [
                        {
                            "id": MODEL,
                            "name": "Scripted fake model",
                            "reasoning": False,
                            "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": 128000,
                            "maxTokens": 4096,
                        }
                    ],
                }
            },
        },
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{MODEL}"}, "workspace": str(workdir / "workspace")}},
    }
    return {**document, **(extra or {})}


@dataclass
class Peer:
    """One running gateway process; ``spawned_at``, ``listening_at`` and ``ready_at`` are ``time.perf_counter()``.

    ``ready_at`` is when a ``connect`` first answered ``hello-ok``: the real gateway listens before it accepts
    connections (until then ``connect`` answers ``UNAVAILABLE`` "gateway starting; retry shortly").
    """

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    spawned_at: float
    listening_at: float
    ready_at: float = 0.0
    auth_mode: str = "token"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    @property
    def credentials(self) -> dict[str, str]:
        """The ``connect`` ``auth`` this peer admits: ``{"token": TOKEN}`` or ``{"password": PASSWORD}``."""
        return _credentials(self.auth_mode)

    @property
    def startup_s(self) -> float:
        """From spawn to a listening socket."""
        return self.listening_at - self.spawned_at

    @property
    def ready_s(self) -> float:
        """From spawn to the first ``hello-ok``."""
        return self.ready_at - self.spawned_at

    def rss_kib(self) -> int:
        return tree_rss_kib(self.proc.pid)

    def log_tail(self) -> str:
        return _tail(self.log_path)

    def stop(self) -> None:
        _stop_process(self.proc)


def _command(name: str, workdir: Path, config_path: Path) -> tuple[list[str], dict[str, str]]:
    if name == "claw":
        args = [claw_executable(), "gateway", "serve", "--config", str(config_path)]
        return [*args, "--data-dir", str(workdir / "data"), "--log-level", "warning"], dict(os.environ)
    if name == "openclaw":
        reason = openclaw_missing_reason()
        if reason is not None:
            raise RuntimeError(reason)
        home, tmp = workdir / "home", workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "NODE_"))},
            "HOME": str(home),
            "OPENCLAW_HOME": str(home),
            "TMPDIR": str(tmp),
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "OPENCLAW_DISABLE_BONJOUR": "1",
            "DO_NOT_TRACK": "1",
            "PATH": f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        return [str(NODE), str(OPENCLAW_ENTRY), "gateway", "run"], env
    raise ValueError(f"unknown peer {name!r}; one of {PEER_NAMES}")


def start_peer(
    name: str,
    workdir: Path,
    fake_base_url: str,
    *,
    timeout_s: float = START_TIMEOUT_S,
    auth_mode: str = "token",
    extra: dict[str, Any] | None = None,
) -> Peer:
    """Start peer ``name`` (``claw`` or ``openclaw``) in ``workdir``; return once its socket accepts connections.

    ``extra`` replaces (or adds) top-level sections of the config document (:func:`offline_config`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    document = offline_config(port, fake_base_url, workdir, auth_mode=auth_mode, extra=extra)
    (workdir / "workspace").mkdir(exist_ok=True)
    # The real gateway reads $OPENCLAW_HOME/.openclaw/openclaw.json; claw takes --config.
    config_path = workdir / ("home/.openclaw/openclaw.json" if name == "openclaw" else "gateway.json5")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(document, indent=2))
    argv, env = _command(name, workdir, config_path)
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as log:
        spawned_at = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=workdir, start_new_session=True
        )
    deadline = spawned_at + timeout_s
    while not _listening(port):
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening:\n{_tail(log_path)}")
        if time.perf_counter() > deadline:
            _stop_process(proc)
            raise RuntimeError(f"{name} did not listen on {port} within {timeout_s:g} s:\n{_tail(log_path)}")
        time.sleep(0.02)
    return Peer(name, proc, port, workdir, log_path, spawned_at, time.perf_counter(), auth_mode=auth_mode)


async def wait_ready(peer: Peer, *, timeout_s: float = START_TIMEOUT_S) -> None:
    """Connect until ``connect`` answers ``hello-ok`` (retrying ``UNAVAILABLE``, and a WebSocket handshake the
    starting peer does not serve yet: the real gateway answers 404 until its routes are mounted, which on a loaded
    machine can come well after its port listens); sets ``peer.ready_at``."""
    deadline = peer.spawned_at + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                client = await PeerClient.open(http, peer.url)
            except (aiohttp.WSServerHandshakeError, aiohttp.ClientConnectionError) as exc:
                if time.perf_counter() > deadline:
                    raise RuntimeError(
                        f"{peer.name} refused the WebSocket handshake: {exc}\n{peer.log_tail()}"
                    ) from exc
                await asyncio.sleep(0.1)
                continue
            try:
                res = await client.request("connect", connect_params(auth=peer.credentials))
            finally:
                await client.ws.close()
            if res["ok"]:
                peer.ready_at = time.perf_counter()
                return
            error = res["error"]
            if error.get("code") != "UNAVAILABLE" or time.perf_counter() > deadline:
                raise RuntimeError(f"{peer.name} refused connect: {error}\n{peer.log_tail()}")
            await asyncio.sleep(min(float(error.get("retryAfterMs", 200)), 1000.0) / 1000)


@contextlib.contextmanager
def running_peer(
    name: str, model_port: int, *, auth_mode: str = "token", extra: dict[str, Any] | None = None
) -> Iterator[Peer]:
    """Peer ``name`` in a scratch directory under /tmp, ready (``hello-ok``), with its model on ``model_port``.

    Stopped and removed on exit. A missing real gateway fails here: tests that may skip carry
    :func:`openclaw_marks`, so reaching this without it means ``CLAWSTACK_REQUIRE_OPENCLAW=1``.
    """
    if name == "openclaw":
        reason = openclaw_missing_reason()
        if reason is not None:
            pytest.fail(f"{REQUIRE_OPENCLAW_ENV}=1 but {reason}")
    workdir = Path(tempfile.mkdtemp(prefix=f"peer-{name}-", dir="/tmp"))
    try:
        gateway = start_peer(name, workdir, f"http://127.0.0.1:{model_port}/v1", auth_mode=auth_mode, extra=extra)
        try:
            asyncio.run(wait_ready(gateway))
            yield gateway
        finally:
            gateway.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def connect_params(**overrides: Any) -> dict[str, Any]:
    """``connect`` params for a backend client with all operator scopes and the peers' token."""
    params: dict[str, Any] = {
        "minProtocol": 4,
        "maxProtocol": 4,
        "client": {"id": "gateway-client", "mode": "backend", "version": "0.1.0", "platform": "linux"},
        "role": "operator",
        "scopes": ["operator.read", "operator.write", "operator.admin"],
        "caps": [],
        "auth": {"token": TOKEN},
        "locale": "en-US",
        "userAgent": "clawstack-peer-tests/0.1",
    }
    params.update(overrides)
    return params


@dataclass
class PeerClient:
    """One WebSocket connection: responses by request id, events kept in arrival order."""

    ws: aiohttp.ClientWebSocketResponse
    events: list[Frame] = field(default_factory=list)
    challenge: Frame | None = None
    _responses: dict[str | None, Frame] = field(default_factory=dict)

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, url: str) -> PeerClient:
        """Open a socket and read the ``connect.challenge`` the server sends first."""
        client = cls(await http.ws_connect(url, max_msg_size=0))
        client.challenge = await client.recv()
        return client

    @classmethod
    async def connected(cls, http: aiohttp.ClientSession, url: str, **overrides: Any) -> PeerClient:
        client = await cls.open(http, url)
        res = await client.request("connect", connect_params(**overrides))
        assert res["ok"] is True, res
        return client

    async def recv(self) -> Frame:
        """The next frame, which must be a text frame holding a JSON object."""
        async with asyncio.timeout(WAIT_S):
            msg = await self.ws.receive()
        assert msg.type is aiohttp.WSMsgType.TEXT, f"expected a text frame, got {msg.type} ({self.ws.close_code})"
        frame = json.loads(msg.data)
        assert isinstance(frame, dict)
        return frame

    async def _pump(self) -> None:
        frame = await self.recv()
        if frame.get("type") == "event":
            self.events.append(frame)
        else:
            self._responses[frame.get("id")] = frame

    async def response(self, frame_id: str | None) -> Frame:
        while frame_id not in self._responses:
            await self._pump()
        return self._responses.pop(frame_id)

    async def send_request(self, method: str, params: object = None) -> str:
        frame_id = str(uuid.uuid4())
        frame: Frame = {"type": "req", "id": frame_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.ws.send_str(json.dumps(frame))
        return frame_id

    async def request(self, method: str, params: object = None) -> Frame:
        return await self.response(await self.send_request(method, params))

    async def wait_for_event(self, predicate: Callable[[Frame], bool]) -> Frame:
        index = 0
        while True:
            while index < len(self.events):
                if predicate(self.events[index]):
                    return self.events[index]
                index += 1
            await self._pump()

    async def wait_for_chat(self, run_id: str, *states: str) -> Frame:
        return await self.wait_for_event(
            lambda f: f["event"] == "chat" and f["payload"].get("runId") == run_id and f["payload"]["state"] in states
        )

    async def wait_for_close(self) -> int | None:
        """Read until the socket closes (skipping any frame still on its way); the close code."""
        async with asyncio.timeout(WAIT_S):
            while True:
                msg = await self.ws.receive()
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                    return self.ws.close_code

    def run_events(self, event: str, run_id: str) -> list[Frame]:
        """The payloads of ``event`` frames for ``run_id``, in arrival order."""
        return [f["payload"] for f in self.events if f["event"] == event and f["payload"].get("runId") == run_id]
