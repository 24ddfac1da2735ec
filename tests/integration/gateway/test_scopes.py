"""Least privilege on a running gateway: which operator scopes may call which methods and send which chat commands.

A real :class:`GatewayServer` on 127.0.0.1 with a plugin that registers a ``require_auth`` command and an open one,
the scripted fake model over TCP, and real WebSocket clients connected with ``operator.admin``, with
``operator.write`` alone and with ``operator.read`` alone. Every refusal has its positive control: an admin
connection does the same thing and it happens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.dispatch import RunRequest
from clawstack.gateway.server import STORE_FILE, GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_ws_protocol import API_KEY, KEY, WAIT_S, Client, config_document, connected

ADMIN = ["operator.read", "operator.write", "operator.admin"]
WRITE = ["operator.write"]
READ = ["operator.read"]

PLUGIN = """
MARK = "scoped-scopes-test"
calls = []

async def guarded(ctx):
    calls.append(("guarded", ctx.args))
    return "guarded ran"

async def open_command(ctx):
    calls.append(("open", ctx.args))
    return "open ran"

def register(api):
    api.register_command("guarded", guarded, description="Owner work", require_auth=True, accepts_args=True)
    api.register_command("open", open_command, description="Anyone may ask", require_auth=False)
"""


def forbidden(scope: str) -> dict[str, Any]:
    """The ``error`` of a refusal for want of ``scope``, method or command alike."""
    return {
        "code": "FORBIDDEN",
        "message": f"missing scope: {scope}",
        "details": {"code": "MISSING_SCOPE", "missingScope": scope, "requiredScopes": [scope]},
    }


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    plugin = tmp_path / "plugins" / "scoped"
    plugin.mkdir(parents=True)
    (plugin / "claw.plugin.json").write_text(json.dumps({"id": "scoped", "version": "1.0.0", "entry": "plugin.py"}))
    (plugin / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    document = config_document(fake.base_url)
    document["operators"] = [{"name": "bob", "roles": ["operator.read"]}]
    config = parse_config(document, base_dir=tmp_path, environ={})
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin]) as gateway:
        yield gateway


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def plugin_calls(server: GatewayServer) -> list[tuple[str, str]]:
    """Each call of the plugin's command handlers so far: ``(command, args)``."""
    assert {p.id: p.state for p in server.plugins} == {"scoped": "loaded"}
    module = next(m for m in list(sys.modules.values()) if getattr(m, "MARK", None) == "scoped-scopes-test")
    calls: list[tuple[str, str]] = module.calls
    return calls


async def send(client: Client, message: str, run_id: str) -> dict[str, Any]:
    return await client.request("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": run_id})


async def turn(server: GatewayServer, client: Client, message: str, run_id: str) -> str:
    """Send ``message``, wait for its ``final`` event and for the run to be recorded; the answer's text."""
    res = await send(client, message, run_id)
    assert res["payload"] == {"runId": run_id, "status": "started"}, res
    final = await client.wait_for_chat(run_id, "final")
    await server.runs.wait_run(run_id, WAIT_S)
    text: str = final["payload"]["message"]["content"][0]["text"]
    return text


async def no_events_reached(client: Client) -> bool:
    """Whether ``client`` got no ``chat`` or ``agent`` event so far: events queued for it before this request's
    answer arrive before the answer."""
    assert (await client.request("sessions.list", {}))["ok"] is True
    return not [f for f in client.events if f["event"] in ("chat", "agent")]


REFUSED_TO_WRITERS: list[tuple[str, str, object]] = [
    ("/reset", "chat.send", "/reset"),
    ("/new", "chat.send", "/new"),
    ("/RESET any case", "chat.send", "/RESET"),
    ("require_auth command", "chat.send", "/guarded do it"),
    ("sessions.reset", "sessions.reset", {"key": KEY}),
    ("users.setRole", "users.setRole", {"profileId": "bob", "role": "operator.write"}),
]


@pytest.mark.parametrize(
    ("method", "what"), [c[1:] for c in REFUSED_TO_WRITERS], ids=[c[0] for c in REFUSED_TO_WRITERS]
)
async def test_a_write_connection_is_refused_admin_work_that_an_admin_connection_does(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer, method: str, what: object
) -> None:
    admin = await connected(http, server.port, scopes=ADMIN)
    writer = await connected(http, server.port, scopes=WRITE)
    assert await turn(server, admin, "@fake reply: hello", "first") == "hello"
    session_id = (await admin.request("chat.history", {"sessionKey": KEY}))["payload"]["sessionId"]
    params = {"sessionKey": KEY, "message": what, "idempotencyKey": "asked"} if method == "chat.send" else what

    refused = await writer.request(method, params)
    assert refused == {"type": "res", "id": refused["id"], "ok": False, "error": forbidden("operator.admin")}
    assert await server.runs.wait_run("asked", 0) is None
    assert plugin_calls(server) == []
    assert (await admin.request("chat.history", {"sessionKey": KEY}))["payload"]["sessionId"] == session_id

    done = await admin.request(method, params)
    assert done["ok"] is True, done
    if method == "chat.send":
        await admin.wait_for_chat("asked", "final")
        assert await server.runs.wait_run("asked", WAIT_S) is not None
        assert await no_events_reached(writer)  # the refused chat.send did not subscribe the writer
    if what == "/guarded do it":
        assert plugin_calls(server) == [("guarded", "do it")]
    elif method == "users.setRole":
        # ``changed``: the refused request had left bob's role as it was.
        assert done["payload"] == {
            "ok": True,
            "profileId": "bob",
            "roles": ["operator.write"],
            "changed": True,
            "revoked": 0,
        }
    else:
        fresh = (await admin.request("chat.history", {"sessionKey": KEY}))["payload"]["sessionId"]
        assert fresh != session_id
    assert len(fake.requests) == 1


async def test_a_write_connection_chats_stops_aborts_and_reads(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    writer = await connected(http, server.port, scopes=WRITE)
    assert await turn(server, writer, "@fake reply: plain answer", "plain") == "plain answer"
    assert (await turn(server, writer, "/status", "status")).startswith("🧠 Model: fake/fake-model")
    assert (await turn(server, writer, "/help", "help")).startswith("ℹ️ Help")
    assert (await turn(server, writer, "/model", "model")).startswith("Current: fake/fake-model")
    # /model with arguments only answers: it changes no model, so it is not admin work.
    assert "not supported" in await turn(server, writer, "/model fake/other", "model-args")
    assert (await turn(server, writer, "/model", "model-again")).startswith("Current: fake/fake-model")
    assert await turn(server, writer, "/open", "open") == "open ran"
    assert plugin_calls(server) == [("open", "")]

    slow = "@fake delay-ms: 60000\n@fake reply: never"
    assert (await send(writer, slow, "slow-1"))["payload"]["status"] == "started"
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(2)
    stopped = await send(writer, "/stop", "stop")
    assert stopped["payload"] == {"ok": True, "aborted": True, "runIds": ["slow-1"]}
    await writer.wait_for_chat("slow-1", "aborted")
    assert (await send(writer, slow, "slow-2"))["payload"]["status"] == "started"
    aborted = await writer.request("chat.abort", {"sessionKey": KEY, "runId": "slow-2"})
    assert aborted["payload"] == {"ok": True, "aborted": True, "runIds": ["slow-2"]}

    history = await writer.request("chat.history", {"sessionKey": KEY, "limit": 2})
    assert history["ok"] is True
    assert history["payload"]["sessionInfo"]["hasActiveRun"] is False
    assert (await writer.request("sessions.list", {}))["payload"]["count"] == 1
    subscribed = await writer.request("sessions.messages.subscribe", {"sessionKey": KEY})
    assert subscribed["payload"] == {"subscribed": True, "sessionKey": KEY}


async def test_a_read_connection_reads_but_sends_nothing(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    reader = await connected(http, server.port, scopes=READ)
    writer = await connected(http, server.port, scopes=WRITE)
    for index, message in enumerate(["@fake reply: hi", "/status", "/stop", "/open", "/reset"]):
        refused = await send(reader, message, f"read-{index}")
        # The method's own scope is checked first: without operator.write no chat.send gets further.
        assert refused["error"] == forbidden("operator.write"), message
        assert await server.runs.wait_run(f"read-{index}", 0) is None
    assert (await reader.request("chat.abort", {"sessionKey": KEY}))["error"] == forbidden("operator.write")
    assert len(fake.requests) == 0
    assert await no_events_reached(reader)

    assert await turn(server, writer, "@fake reply: hi", "written") == "hi"
    history = await reader.request("chat.history", {"sessionKey": KEY})
    assert [m["role"] for m in history["payload"]["messages"]] == ["user", "assistant"]
    assert (await reader.request("sessions.list", {}))["payload"]["count"] == 1
    assert (await reader.request("sessions.messages.subscribe", {"sessionKey": KEY}))["ok"] is True
    assert (await reader.request("users.setRole", {"profileId": "bob", "role": None}))["error"] == forbidden(
        "operator.admin"
    )


def store_bytes(server_data: Path) -> tuple[bytes, bytes]:
    """The session store's database file and its write-ahead log, as bytes."""
    main = server_data / STORE_FILE
    wal = main.with_name(main.name + "-wal")
    return main.read_bytes(), wal.read_bytes() if wal.exists() else b""


async def test_a_refused_reset_leaves_the_transcript_byte_for_byte(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer, tmp_path: Path
) -> None:
    admin = await connected(http, server.port, scopes=ADMIN)
    writer = await connected(http, server.port, scopes=WRITE)
    assert await turn(server, admin, "@fake reply: keep me", "kept") == "keep me"
    before_history = await admin.request("chat.history", {"sessionKey": KEY})
    before_session = server.store.get(KEY)
    before_bytes = store_bytes(tmp_path / "data")

    for message in ("/reset", "/new", "/reset now", "/guarded"):
        refused = await send(writer, message, "kept")  # even the key of a finished run gets no further
        assert refused["error"] == forbidden("operator.admin"), message
    assert (await writer.request("sessions.reset", {"key": KEY}))["error"] == forbidden("operator.admin")

    assert store_bytes(tmp_path / "data") == before_bytes
    after_history = await admin.request("chat.history", {"sessionKey": KEY})
    assert after_history["payload"] == before_history["payload"]
    assert server.store.get(KEY) == before_session
    assert len(fake.requests) == 1

    assert await turn(server, admin, "/reset", "reset") == "✅ Session reset."
    assert store_bytes(tmp_path / "data") != before_bytes
    fresh = await admin.request("chat.history", {"sessionKey": KEY})
    assert fresh["payload"]["sessionId"] != before_history["payload"]["sessionId"]
    assert [m["content"] for m in fresh["payload"]["messages"]] == [
        "/reset",
        [{"type": "text", "text": "✅ Session reset."}],
    ]


async def test_a_reset_refused_for_a_plugin_owned_session_aborts_nothing(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    admin = await connected(http, server.port, scopes=ADMIN)
    owned = "agent:main:subagent:owned"
    slow = "@fake delay-ms: 60000\n@fake reply: never"
    started = await server.runs.start_run(RunRequest(owned, "main", slow, "subagent", owner="plugin:scoped"))
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    for message in ("/reset", "/new"):
        res = await admin.request("chat.send", {"sessionKey": owned, "message": message, "idempotencyKey": message})
        assert res["error"] == {"code": "FORBIDDEN", "message": "the session belongs to someone else"}
    assert server.runs.active_run_ids(owned) == [started.run_id]

    # The positive control: on an ordinary session /reset aborts the run in flight.
    assert (await send(admin, slow, "mine"))["payload"]["status"] == "started"
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(2)
    assert (await send(admin, "/reset", "reset"))["payload"]["status"] == "started"
    await admin.wait_for_chat("mine", "aborted")
    assert server.runs.active_run_ids(owned) == [started.run_id]
