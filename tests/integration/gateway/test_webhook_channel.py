"""The webhook channel in a real gateway: signed inbound messages, channel text commands, outbound replies.

A real :class:`GatewayServer` on 127.0.0.1 with a real scripted fake model over TCP; a bridge is played by an
aiohttp client signing its requests, and the outbound side by a real aiohttp receiver on 127.0.0.1 that records
what it gets and answers as each test tells it to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from clawstack.gateway import channels
from clawstack.gateway.channels import MAX_BODY_BYTES, sign, signed_headers, verify
from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_ws_protocol import API_KEY, WAIT_S, config_document, connected

SECRET = "webhook-secret-0123456789abcdef"
PATH = "/channels/webhook"

PLUGIN = """
captured = {}

def _describe(ctx):
    return f"channel={ctx.channel} sender={ctx.sender_id} authenticated={ctx.authenticated} operator={ctx.operator}"

async def who(ctx):
    captured.setdefault("who", []).append(ctx)
    return _describe(ctx)

async def open_command(ctx):
    return "open: " + _describe(ctx)

async def before(ctx):
    if not ctx.message.startswith("delegate:"):
        return None
    run = await ctx.subagent.run(
        session_key="agent:main:subagent:delegated",
        message=ctx.message.removeprefix("delegate:").strip(),
        completion_delivery="current-requester",
    )
    captured["run"] = run
    return "Delegated."

def register(api):
    api.register_command("who", who, description="Who is asking", require_auth=True, accepts_args=True)
    api.register_command("open", open_command, description="Anyone may ask", require_auth=False)
    api.register_hook("before_dispatch", before)
"""


@dataclass
class Receiver:
    """The outbound end of the channel: records every POST and answers with the queued statuses, then 200."""

    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((dict(request.headers), await request.read()))
        self.arrived.set()
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"ok": status < 300}, status=status)

    async def wait_for(self, count: int) -> list[dict[str, Any]]:
        """The bodies of the first ``count`` POSTs, once they have arrived."""
        async with asyncio.timeout(WAIT_S):
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return [json.loads(body) for _, body in self.received]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recv = Receiver()
    app = web.Application()
    app.router.add_post("/out", recv.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    recv.url = f"http://127.0.0.1:{runner.addresses[0][1]}/out"
    try:
        yield recv
    finally:
        await runner.cleanup()


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # The retry schedule is not what these tests are about; keep its waits short.
    monkeypatch.setattr(channels, "DEFAULT_RETRY_DELAYS_S", (0.01, 0.02, 0.04))


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def write_plugin(root: Path) -> Path:
    directory = root / "channeltest"
    directory.mkdir(parents=True)
    manifest = {"id": "channeltest", "version": "1.0.0", "entry": "plugin.py"}
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    return directory


def gateway_config(tmp_path: Path, base_url: str, outbound_url: str | None, *, enabled: bool = True) -> Any:
    document = config_document(base_url)
    webhook: dict[str, Any] = {"enabled": enabled, "secret": SECRET, "allowFrom": ["alice", "rita", "dave"]}
    if outbound_url is not None:
        webhook["outbound"] = {"url": outbound_url, "timeoutSeconds": 2}
    document["channels"] = {"webhook": webhook}
    document["plugins"] = {"entries": {"channeltest": {"trust": "trusted"}}}
    document["operators"] = [
        {"name": "alice-admin", "roles": ["operator.admin"], "links": [{"channel": "webhook", "id": "alice"}]},
        {"name": "rita-reader", "roles": ["operator.read"], "links": [{"channel": "webhook", "id": "rita"}]},
        {"name": "carol-admin", "roles": ["operator.admin"], "links": [{"channel": "webhook", "id": "carol"}]},
    ]
    return parse_config(document, base_dir=tmp_path, environ={})


async def start_gateway(
    tmp_path: Path, fake: FakeModelServer, outbound_url: str | None, *, enabled: bool = True
) -> GatewayServer:
    config = gateway_config(tmp_path, fake.base_url, outbound_url, enabled=enabled)
    plugin = write_plugin(tmp_path / "plugins")
    server = GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin])
    await server.start()
    return server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer, receiver: Receiver) -> AsyncIterator[GatewayServer]:
    gateway = await start_gateway(tmp_path, fake, receiver.url)
    try:
        yield gateway
    finally:
        await gateway.stop()


def message(sender: str, text: str, message_id: str = "m-1", **extra: Any) -> bytes:
    return json.dumps({"messageId": message_id, "sender": {"id": sender}, "text": text, **extra}).encode()


async def post(
    http: aiohttp.ClientSession,
    server: GatewayServer,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    if headers is None:
        headers = signed_headers(SECRET, body, timestamp=int(time.time()))
    async with http.post(f"http://127.0.0.1:{server.port}{PATH}", data=body, headers=headers) as response:
        return response.status, await response.json()


async def history(http: aiohttp.ClientSession, server: GatewayServer, key: str) -> list[tuple[str, str]]:
    client = await connected(http, server.port)
    res = await client.request("chat.history", {"sessionKey": key})
    await client.ws.close()
    return [
        (m["role"], m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
        for m in res["payload"]["messages"]
    ]


async def session_keys(http: aiohttp.ClientSession, server: GatewayServer) -> list[str]:
    client = await connected(http, server.port)
    res = await client.request("sessions.list", {})
    await client.ws.close()
    return [row["key"] for row in res["payload"]["sessions"]]


async def ended(server: GatewayServer, run_id: str) -> str:
    run = await server.runs.wait_run(run_id, WAIT_S)
    assert run is not None
    return run.state


def check_signed(headers: dict[str, str], body: bytes) -> None:
    verify(
        SECRET,
        timestamp=headers.get("X-Claw-Timestamp"),
        signature=headers.get("X-Claw-Signature"),
        body=body,
        now_s=time.time(),
        max_skew_s=60,
    )


# -- the happy path --------------------------------------------------------------------------------------------------


async def test_a_signed_message_runs_and_the_answer_goes_out_signed(
    server: GatewayServer, fake: FakeModelServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, server, message("carol", "@fake reply: hi there"))
    assert (status, body) == (202, {"ok": True, "runId": "webhook:m-1", "status": "started"})
    assert await ended(server, "webhook:m-1") == "ok"
    [reply] = await receiver.wait_for(1)
    assert reply == {"inReplyTo": "m-1", "recipient": "carol", "text": "hi there", "runId": "webhook:m-1"}
    headers, raw = receiver.received[0]
    check_signed(headers, raw)
    key = "agent:main:channel:webhook:carol"
    assert await history(http, server, key) == [("user", "@fake reply: hi there"), ("assistant", "hi there")]
    assert len(fake.requests) == 1
    assert fake.requests[0].body["messages"][-1]["content"] == "@fake reply: hi there"


async def test_a_failed_run_sends_a_notice_on_the_channel(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    status, _ = await post(http, server, message("carol", "@fake fail: 500", "m-fail"))
    assert status == 202
    assert await ended(server, "webhook:m-fail") == "error"
    [reply] = await receiver.wait_for(1)
    assert reply["recipient"] == "carol"
    assert reply["runId"] == "webhook:m-fail"
    assert reply["text"].startswith("Sorry, the answer failed: ")


async def test_a_thread_gets_its_own_session_and_the_reply_names_it(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, server, message("carol", "@fake reply: in thread", threadId="t-1"))
    assert status == 202, body
    assert await ended(server, body["runId"]) == "ok"
    [reply] = await receiver.wait_for(1)
    assert reply["threadId"] == "t-1"
    key = "agent:main:channel:webhook:carol:thread:t-1"
    assert await history(http, server, key) == [("user", "@fake reply: in thread"), ("assistant", "in thread")]
    assert key in await session_keys(http, server)


async def test_a_redelivered_message_never_starts_a_second_run(
    server: GatewayServer, fake: FakeModelServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    body = message("carol", "@fake reply: once")
    first, second = await asyncio.gather(post(http, server, body), post(http, server, body))
    assert {first[1]["runId"], second[1]["runId"]} == {"webhook:m-1"}
    statuses = sorted([first[1]["status"], second[1]["status"]])
    # The duplicate finds the run in flight, or, on a slow machine, already finished.
    assert statuses in (["in_flight", "started"], ["ok", "started"])
    assert await ended(server, "webhook:m-1") == "ok"
    status, again = await post(http, server, body)
    assert (status, again) == (202, {"ok": True, "runId": "webhook:m-1", "status": "ok"})
    assert len(fake.requests) == 1
    assert len(await receiver.wait_for(1)) == 1
    await server_idle(server)
    assert len(receiver.received) == 1
    assert len(await history(http, server, "agent:main:channel:webhook:carol")) == 2


async def test_a_redelivered_message_id_with_other_text_is_a_conflict(
    server: GatewayServer, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, server, message("carol", "@fake reply: first"))
    assert status == 202
    assert await ended(server, body["runId"]) == "ok"
    status, body = await post(http, server, message("carol", "@fake reply: second"))
    assert status == 409
    assert body["ok"] is False
    assert body["error"]["code"] == "idempotency_conflict"
    assert len(fake.requests) == 1


async def server_idle(server: GatewayServer) -> None:
    """Wait for the channel's outbound POSTs in flight."""
    webhook = server.channels["webhook"]
    assert isinstance(webhook, channels.WebhookChannel)
    await webhook.wait_for_idle()


# -- refusals --------------------------------------------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


GOOD = message("carol", "@fake reply: x")


def _headers(body: bytes = GOOD, **change: str | None) -> dict[str, str]:
    headers = signed_headers(SECRET, body, timestamp=_now())
    for name, value in change.items():
        header = {"ts": "X-Claw-Timestamp", "sig": "X-Claw-Signature"}[name]
        if value is None:
            del headers[header]
        else:
            headers[header] = value
    return headers


REFUSALS: list[tuple[str, Any, int, str]] = [
    ("no-signature", lambda: (GOOD, _headers(sig=None)), 401, "webhook_unauthorized"),
    ("no-timestamp", lambda: (GOOD, _headers(ts=None)), 401, "webhook_unauthorized"),
    ("no-headers", lambda: (GOOD, {"Content-Type": "application/json"}), 401, "webhook_unauthorized"),
    ("wrong-secret", lambda: (GOOD, signed_headers("x" * 32, GOOD, timestamp=_now())), 401, "webhook_unauthorized"),
    ("bad-signature", lambda: (GOOD, _headers(sig="v1=" + "0" * 64)), 401, "webhook_unauthorized"),
    ("garbage-signature", lambda: (GOOD, _headers(sig="hello")), 401, "webhook_unauthorized"),
    (
        "stale",
        lambda: (GOOD, signed_headers(SECRET, GOOD, timestamp=_now() - 301 - 5)),
        401,
        "webhook_unauthorized",
    ),
    (
        "future",
        lambda: (GOOD, signed_headers(SECRET, GOOD, timestamp=_now() + 400)),
        401,
        "webhook_unauthorized",
    ),
    (
        "resigned-timestamp",  # the signature of one timestamp sent with another
        lambda: (GOOD, _headers(sig=sign(SECRET, _now() - 10, GOOD))),
        401,
        "webhook_unauthorized",
    ),
    ("tampered-body", lambda: (GOOD.replace(b"carol", b"alice"), _headers()), 401, "webhook_unauthorized"),
    ("malformed-json", lambda: (b"{not json", _headers(b"{not json")), 400, "webhook_body_invalid"),
    ("not-an-object", lambda: (b"[1]", _headers(b"[1]")), 400, "webhook_body_invalid"),
    (
        "unknown-key",
        lambda: (message("carol", "x", admin=True), _headers(message("carol", "x", admin=True))),
        400,
        "webhook_body_invalid",
    ),
    (
        "bad-sender-id",
        lambda: (message("ca:rol", "x"), _headers(message("ca:rol", "x"))),
        400,
        "webhook_body_invalid",
    ),
    (
        "bad-thread-id",
        lambda: (message("carol", "x", threadId="a b"), _headers(message("carol", "x", threadId="a b"))),
        400,
        "webhook_body_invalid",
    ),
    (
        "oversize",
        lambda: (message("carol", "x" * MAX_BODY_BYTES), _headers(message("carol", "x" * MAX_BODY_BYTES))),
        413,
        "webhook_body_too_large",
    ),
]


@pytest.mark.parametrize(("case", "make", "status", "code"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_refusals_record_nothing(
    case: str,
    make: Any,
    status: int,
    code: str,
    server: GatewayServer,
    fake: FakeModelServer,
    receiver: Receiver,
    http: aiohttp.ClientSession,
) -> None:
    body, headers = make()
    got, answer = await post(http, server, body, headers=headers)
    assert got == status, answer
    assert answer["ok"] is False
    assert answer["error"]["code"] == code
    assert SECRET not in json.dumps(answer)
    assert await session_keys(http, server) == []
    assert fake.requests == []
    await server_idle(server)
    assert receiver.received == []


async def test_the_route_is_absent_when_the_channel_is_disabled(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    server = await start_gateway(tmp_path, fake, None, enabled=False)
    try:
        body = message("carol", "x")
        async with http.post(f"http://127.0.0.1:{server.port}{PATH}", data=body, headers=_headers(body)) as response:
            assert response.status == 404
    finally:
        await server.stop()


# -- channel text commands and operator authority -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "expected"),
    [
        ("alice", "authenticated=True operator=alice-admin"),  # allowed, linked to an operator.admin
        ("rita", "authenticated=True operator=None"),  # allowed, linked to an operator.read only
        ("dave", "authenticated=True operator=None"),  # allowed, unlinked
    ],
)
async def test_an_allowed_sender_runs_a_command(
    sender: str,
    expected: str,
    server: GatewayServer,
    fake: FakeModelServer,
    receiver: Receiver,
    http: aiohttp.ClientSession,
) -> None:
    status, body = await post(http, server, message(sender, "/who now"))
    assert (status, body["ok"], body["status"]) == (202, True, "started")
    assert await ended(server, body["runId"]) == "ok"
    [reply] = await receiver.wait_for(1)
    assert reply["text"] == f"channel=webhook sender={sender} {expected}"
    assert reply["inReplyTo"] == "m-1"
    key = f"agent:main:channel:webhook:{sender}"
    assert await history(http, server, key) == [("user", "/who now"), ("assistant", reply["text"])]
    assert fake.requests == []


async def test_a_sender_outside_allow_from_is_refused_a_command_on_the_channel(
    server: GatewayServer, fake: FakeModelServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    # carol is linked to an operator.admin, but the channel does not let her run commands: no run, no authority.
    status, body = await post(http, server, message("carol", "/who"))
    assert status == 202
    assert body["ok"] is False
    assert body["error"]["code"] == "command_auth_required"
    assert "runId" not in body
    [notice] = await receiver.wait_for(1)
    assert notice["recipient"] == "carol"
    assert notice["inReplyTo"] == "m-1"
    assert "needs an authenticated sender" in notice["text"]
    assert "runId" not in notice
    assert await session_keys(http, server) == []
    assert fake.requests == []


async def test_a_command_without_require_auth_runs_for_any_verified_sender_without_authority(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, server, message("carol", "/open"))
    assert (status, body["ok"]) == (202, True)
    assert await ended(server, body["runId"]) == "ok"
    [reply] = await receiver.wait_for(1)
    assert reply["text"] == "open: channel=webhook sender=carol authenticated=False operator=None"


async def test_command_arguments_are_refused_when_not_accepted(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, server, message("alice", "/open please"))
    assert (status, body["ok"], body["error"]["code"]) == (202, False, "command_no_args")
    [notice] = await receiver.wait_for(1)
    assert "takes no arguments" in notice["text"]


async def test_gateway_chat_commands_carry_the_gateway_operator(
    server: GatewayServer, http: aiohttp.ClientSession
) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": "agent:main:main", "message": "/who", "idempotencyKey": "chat-who"}
    assert (await client.request("chat.send", params))["payload"]["status"] == "started"
    final = await client.wait_for_chat("chat-who", "final")
    text = final["payload"]["message"]["content"][0]["text"]
    assert text == "channel=gateway sender=None authenticated=True operator=gateway"
    await client.ws.close()


# -- announcements ---------------------------------------------------------------------------------------------------


async def test_a_delegated_completion_is_announced_on_the_channel(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, server, message("alice", "delegate: @fake reply: the child's result"))
    assert (status, body["ok"]) == (202, True)
    replies = await receiver.wait_for(2)
    by_text = {reply["text"]: reply for reply in replies}
    assert by_text["Delegated."]["runId"] == "webhook:m-1"
    [announced] = [reply for reply in replies if reply["text"] != "Delegated."]
    assert announced["text"].endswith("the child's result")
    assert announced["recipient"] == "alice"
    assert announced["runId"].endswith(":announce")
    assert "inReplyTo" not in announced


# -- outbound faults -------------------------------------------------------------------------------------------------


async def test_outbound_retries_a_500_then_delivers(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    receiver.statuses = [500, 503]
    status, body = await post(http, server, message("carol", "@fake reply: persistent"))
    assert status == 202
    assert await ended(server, body["runId"]) == "ok"
    replies = await receiver.wait_for(3)
    assert [reply["text"] for reply in replies] == ["persistent"] * 3
    await server_idle(server)
    assert len(receiver.received) == 3


async def test_outbound_gives_up_after_three_retries_and_not_on_a_4xx(
    server: GatewayServer, receiver: Receiver, http: aiohttp.ClientSession
) -> None:
    receiver.statuses = [500] * 10
    await post(http, server, message("carol", "@fake reply: lost"))
    await receiver.wait_for(4)
    await server_idle(server)
    assert len(receiver.received) == 4
    receiver.statuses = [400]
    await post(http, server, message("carol", "@fake reply: refused", message_id="m-2"))
    await receiver.wait_for(5)
    await server_idle(server)
    assert len(receiver.received) == 5


async def test_outbound_down_leaves_the_run_ok_and_logs_no_secret_or_text(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # A port nothing listens on: bind one, note it, close it.
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    caplog.set_level(logging.DEBUG, logger="clawstack")
    server = await start_gateway(tmp_path, fake, f"http://127.0.0.1:{port}/out")
    try:
        status, body = await post(http, server, message("carol", "@fake reply: PRIVATE-ANSWER"))
        assert status == 202
        assert await ended(server, body["runId"]) == "ok"
        await server_idle(server)
        assert await history(http, server, "agent:main:channel:webhook:carol") == [
            ("user", "@fake reply: PRIVATE-ANSWER"),
            ("assistant", "PRIVATE-ANSWER"),
        ]
        assert "not delivered after 4 attempt(s)" in caplog.text
    finally:
        await server.stop()
    assert "PRIVATE-ANSWER" not in caplog.text
    assert SECRET not in caplog.text


async def test_without_an_outbound_url_replies_are_only_recorded(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    server = await start_gateway(tmp_path, fake, None)
    try:
        status, body = await post(http, server, message("carol", "@fake reply: kept"))
        assert status == 202
        assert await ended(server, body["runId"]) == "ok"
        assert await history(http, server, "agent:main:channel:webhook:carol") == [
            ("user", "@fake reply: kept"),
            ("assistant", "kept"),
        ]
    finally:
        await server.stop()
