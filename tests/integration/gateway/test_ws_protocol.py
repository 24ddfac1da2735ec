"""The gateway WebSocket protocol against a real server on 127.0.0.1 and a real scripted fake model over TCP.

Clients are real aiohttp WebSocket clients; every frame is checked against the shapes observed on a real OpenClaw
gateway (``shared/reference/openclaw-gateway-protocol.md``). The restart and CLI cases run ``claw gateway serve``
as a separate process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.common.clock import ManualClock
from clawstack.gateway.config import GatewayConfig, parse_config
from clawstack.gateway.protocol import ConnectParams, ParamsError, ProtocolError, parse_params, parse_request_frame
from clawstack.gateway.server import GatewayServer, ServerState
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway import peers

TOKEN = "gateway-test-token-0123456789"
PASSWORD = "gateway-test-password"
API_KEY = "sk-gateway-ws-test"
KEY = "agent:main:main"
WAIT_S = 10.0

Frame = dict[str, Any]


def config_document(base_url: str, *, auth: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "models": {"providers": {"fake": {"baseUrl": base_url, "apiKey": API_KEY, "models": [{"id": "fake-model"}]}}},
        "agents": {"defaults": {"model": {"primary": "fake/fake-model"}}},
        "gateway": {"port": 0, "auth": auth or {"mode": "token", "token": TOKEN}},
    }


def make_config(tmp_path: Path, base_url: str, *, auth: dict[str, str] | None = None) -> GatewayConfig:
    return parse_config(config_document(base_url, auth=auth), base_dir=tmp_path, environ={})


def connect_params(**overrides: Any) -> dict[str, Any]:
    return peers.connect_params(**{"auth": {"token": TOKEN}, "userAgent": "clawstack-tests/0.1", **overrides})


class Client(peers.PeerClient):
    """A peer client with raw sends and a strict close: after a refusal the very next message is the close."""

    async def send_raw(self, text: str) -> None:
        await self.ws.send_str(text)

    async def wait_for_close(self) -> int | None:
        async with asyncio.timeout(WAIT_S):
            msg = await self.ws.receive()
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
        return self.ws.close_code

    def chat_events(self, run_id: str) -> list[dict[str, Any]]:
        return self.run_events("chat", run_id)


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    async with GatewayServer(make_config(tmp_path, fake.base_url), data_dir=tmp_path / "data") as gateway:
        yield gateway


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def open_client(http: aiohttp.ClientSession, port: int) -> Client:
    ws = await http.ws_connect(f"ws://127.0.0.1:{port}/")
    client = Client(ws)
    challenge = await client.recv()
    assert challenge["event"] == "connect.challenge"
    return client


async def connected(http: aiohttp.ClientSession, port: int, **overrides: Any) -> Client:
    client = await open_client(http, port)
    res = await client.request("connect", connect_params(**overrides))
    assert res["ok"] is True, res
    return client


# -- handshake ---------------------------------------------------------------------------------------------------


async def test_challenge_is_the_first_frame(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    ws = await http.ws_connect(f"ws://127.0.0.1:{server.port}/ws")
    frame = await Client(ws).recv()
    assert frame["type"] == "event"
    assert frame["event"] == "connect.challenge"
    assert "seq" not in frame
    assert set(frame["payload"]) == {"nonce", "ts", "capabilities"}
    uuid.UUID(frame["payload"]["nonce"])
    assert isinstance(frame["payload"]["ts"], int)
    await ws.close()


async def test_hello_ok_shape(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await open_client(http, server.port)
    res = await client.request("connect", connect_params())
    assert res["ok"] is True
    hello = res["payload"]
    assert hello["type"] == "hello-ok"
    assert hello["protocol"] == 4
    assert isinstance(hello["server"]["version"], str)
    assert {"chat.send", "chat.history", "chat.abort", "sessions.list", "sessions.messages.subscribe"} <= set(
        hello["features"]["methods"]
    )
    assert {"connect.challenge", "chat", "chat.metadata.changed", "agent", "tick"} <= set(hello["features"]["events"])
    assert hello["snapshot"]["sessionDefaults"]["mainSessionKey"] == "agent:main:main"
    assert hello["auth"] == {
        "method": "token",
        "role": "operator",
        "scopes": ["operator.read", "operator.write", "operator.admin"],
    }
    assert hello["policy"] == {"maxPayload": 26214400, "maxBufferedBytes": 52428800, "tickIntervalMs": 30000}


async def test_cli_client_keeps_its_scopes(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await open_client(http, server.port)
    cli = {"id": "cli", "mode": "cli", "version": "0.1.0", "platform": "linux"}
    res = await client.request("connect", connect_params(client=cli, scopes=["operator.read"]))
    assert res["payload"]["auth"]["scopes"] == ["operator.read"]
    history = await client.request("chat.history", {"sessionKey": KEY, "limit": 1})
    assert history["ok"] is True
    send = await client.request("chat.send", {"sessionKey": KEY, "message": "hi", "idempotencyKey": "k"})
    assert send["error"]["details"] == {
        "code": "MISSING_SCOPE",
        "missingScope": "operator.write",
        "requiredScopes": ["operator.write"],
    }


async def test_scopeless_client_id_gets_missing_scope(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    test_client = {"id": "test", "mode": "test", "version": "0.1.0", "platform": "linux"}
    client = await connected(http, server.port, client=test_client)
    res = await client.request("chat.history", {"sessionKey": KEY, "limit": 1})
    assert res == {
        "type": "res",
        "id": res["id"],
        "ok": False,
        "error": {
            "code": "FORBIDDEN",
            "message": "missing scope: operator.read",
            "details": {"code": "MISSING_SCOPE", "missingScope": "operator.read", "requiredScopes": ["operator.read"]},
        },
    }


BAD_CONNECTS: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown client id",
        {"client": {"id": "ocprobe", "mode": "cli", "version": "0.1.0", "platform": "linux"}},
        "invalid connect params: at /client/id: must be equal to one of the allowed values",
    ),
    (
        "empty version",
        {"client": {"id": "cli", "mode": "cli", "version": "", "platform": "linux"}},
        "invalid connect params: at /client/version: must NOT have fewer than 1 characters",
    ),
    (
        "missing platform",
        {"client": {"id": "cli", "mode": "cli", "version": "1"}},
        "invalid connect params: at /client: must have required property 'platform'",
    ),
    ("unknown key", {"bogus": True}, "invalid connect params: at root: unexpected property 'bogus'"),
    ("string protocol", {"minProtocol": "4"}, "invalid connect params: at /minProtocol: must be integer"),
    ("role", {"role": "admin"}, "invalid connect params: at /role: must be equal to one of the allowed values"),
    ("scopes not array", {"scopes": "operator.read"}, "invalid connect params: at /scopes: must be array"),
    ("auth unknown key", {"auth": {"secret": "x"}}, "invalid connect params: at /auth: unexpected property 'secret'"),
]


@pytest.mark.parametrize(("overrides", "message"), [c[1:] for c in BAD_CONNECTS], ids=[c[0] for c in BAD_CONNECTS])
async def test_bad_connect_params_are_refused(
    server: GatewayServer, http: aiohttp.ClientSession, overrides: dict[str, Any], message: str
) -> None:
    client = await open_client(http, server.port)
    res = await client.request("connect", connect_params(**overrides))
    assert res["ok"] is False
    assert res["error"] == {"code": "INVALID_REQUEST", "message": message}
    assert await client.wait_for_close() == 1000


async def test_missing_params_object_is_refused(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await open_client(http, server.port)
    res = await client.request("connect", [1])
    assert res["error"] == {"code": "INVALID_REQUEST", "message": "invalid connect params: at root: must be object"}
    assert await client.wait_for_close() == 1000


async def test_protocol_mismatch(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await open_client(http, server.port)
    res = await client.request("connect", connect_params(minProtocol=1, maxProtocol=3))
    assert res["ok"] is False
    assert res["error"] == {
        "code": "INVALID_REQUEST",
        "message": "protocol mismatch",
        "details": {
            "code": "PROTOCOL_MISMATCH",
            "clientMinProtocol": 1,
            "clientMaxProtocol": 3,
            "expectedProtocol": 4,
            "minimumProbeProtocol": 3,
        },
    }
    assert await client.wait_for_close() == 1002


@pytest.mark.parametrize(
    ("auth", "code"),
    [
        ({"token": "wrong-token"}, "AUTH_TOKEN_MISMATCH"),
        ({"password": TOKEN}, "AUTH_TOKEN_MISSING"),
        ({"password": "nope", "token": TOKEN + "x"}, "AUTH_TOKEN_MISMATCH"),
        ({}, "AUTH_TOKEN_MISSING"),
    ],
)
async def test_wrong_token_is_refused_with_1008(
    server: GatewayServer, http: aiohttp.ClientSession, auth: dict[str, str], code: str
) -> None:
    client = await open_client(http, server.port)
    res = await client.request("connect", connect_params(auth=auth))
    assert res["ok"] is False
    assert res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"]["code"] == code
    assert res["error"]["message"].startswith("unauthorized: ")
    assert TOKEN not in json.dumps(res)
    assert await client.wait_for_close() == 1008


async def test_wrong_password_is_refused_with_1008(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    config = make_config(tmp_path, fake.base_url, auth={"mode": "password", "password": PASSWORD})
    async with GatewayServer(config, data_dir=tmp_path / "data") as gateway:
        client = await open_client(http, gateway.port)
        res = await client.request("connect", connect_params(auth={"password": "nope"}))
        assert res["error"]["details"]["code"] == "AUTH_PASSWORD_MISMATCH"
        assert res["error"]["details"]["authReason"] == "password_mismatch"
        assert await client.wait_for_close() == 1008

        good = await connected(http, gateway.port, auth={"password": PASSWORD})
        assert (await good.request("sessions.list"))["ok"] is True


async def test_first_request_must_be_connect(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await open_client(http, server.port)
    res = await client.request("chat.history", {"sessionKey": KEY})
    assert res["error"] == {"code": "INVALID_REQUEST", "message": "invalid handshake: first request must be connect"}
    assert await client.wait_for_close() == 1008


async def test_handshake_times_out(tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    config = make_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", handshake_timeout_s=0.2) as gateway:
        client = await open_client(http, gateway.port)
        assert await client.wait_for_close() == 1008


async def test_oversized_frame_closes_with_1009(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    config = make_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", max_payload=4096) as gateway:
        client = await connected(http, gateway.port)
        assert (await client.request("sessions.list"))["payload"]["count"] == 0
        await client.send_raw(json.dumps({"type": "req", "id": "big", "method": "sessions.list", "x": "y" * 5000}))
        assert await client.wait_for_close() == 1009


async def test_malformed_first_frame_closes_with_1008(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await open_client(http, server.port)
    await client.send_raw("{nope")
    res = await client.response(None)
    assert res["error"] == {"code": "INVALID_REQUEST", "message": "invalid request frame: not JSON"}
    assert await client.wait_for_close() == 1008


async def test_tick_events_follow_the_clock(tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    clock = ManualClock()
    config = make_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", clock=clock, tick_interval_ms=5000) as gateway:
        client = await connected(http, gateway.port)
        async with asyncio.timeout(WAIT_S):
            while clock.sleepers < 1:  # noqa: ASYNC110 (yield until the ticker has reached its sleep)
                await asyncio.sleep(0)
        clock.advance(5.0)
        tick = await client.wait_for_event(lambda f: f["event"] == "tick")
        assert tick["seq"] == 1
        assert tick["payload"] == {"ts": int(clock.now().timestamp() * 1000)}


# -- frames ------------------------------------------------------------------------------------------------------

MALFORMED: list[tuple[str, str, str | None, str]] = [
    ("not json", "{nope", None, "invalid request frame: not JSON"),
    ("array", "[1, 2]", None, "invalid request frame: must be object"),
    ("event frame", '{"type": "event", "id": "a1", "event": "x"}', "a1", 'at /type: must be equal to "req"'),
    ("no id", '{"type": "req", "method": "sessions.list"}', None, "at /id: must be a non-empty string"),
    ("empty id", '{"type": "req", "id": "", "method": "sessions.list"}', None, "at /id: must be a non-empty string"),
    ("no method", '{"type": "req", "id": "a2"}', "a2", "at /method: must be a non-empty string"),
    ("number method", '{"type": "req", "id": "a3", "method": 7}', "a3", "at /method: must be a non-empty string"),
    (
        "extra key",
        '{"type": "req", "id": "a4", "method": "sessions.list", "x": 1}',
        "a4",
        "at root: unexpected property 'x'",
    ),
]


@pytest.mark.parametrize(("text", "frame_id", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
async def test_malformed_frames_get_invalid_request(
    server: GatewayServer, http: aiohttp.ClientSession, text: str, frame_id: str | None, message: str
) -> None:
    client = await connected(http, server.port)
    await client.send_raw(text)
    res = await client.response(frame_id)
    assert res["ok"] is False
    assert res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["message"].endswith(message)
    # The connection stays usable.
    assert (await client.request("sessions.list"))["ok"] is True


async def test_binary_frame_gets_invalid_request(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await connected(http, server.port)
    await client.ws.send_bytes(b'{"type": "req"}')
    res = await client.response(None)
    assert res["error"] == {"code": "INVALID_REQUEST", "message": "invalid request frame: binary"}
    assert (await client.request("sessions.list"))["ok"] is True


async def test_unknown_method(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await connected(http, server.port)
    res = await client.request("nope.nothing", {})
    assert res["error"] == {"code": "INVALID_REQUEST", "message": "unknown method: nope.nothing"}
    again = await client.request("connect", connect_params())
    assert again["error"]["code"] == "INVALID_REQUEST"


BAD_PARAMS: list[tuple[str, str, object, str]] = [
    (
        "send without key",
        "chat.send",
        {"sessionKey": KEY, "message": "hi"},
        "invalid chat.send params: at root: must have required property 'idempotencyKey'",
    ),
    (
        "send extra",
        "chat.send",
        {"sessionKey": KEY, "message": "hi", "idempotencyKey": "k", "deliver": True},
        "invalid chat.send params: at root: unexpected property 'deliver'",
    ),
    ("history limit 0", "chat.history", {"sessionKey": KEY, "limit": 0}, "invalid chat.history params: at /limit"),
    ("history limit str", "chat.history", {"sessionKey": KEY, "limit": "5"}, "at /limit: must be integer"),
    ("bad session key", "chat.history", {"sessionKey": "main"}, "invalid sessionKey: "),
    ("abort no key", "chat.abort", {}, "invalid chat.abort params: at root: must have required property"),
    ("subscribe hook", "sessions.messages.subscribe", {"sessionKey": "agent:x y:main"}, "invalid sessionKey"),
    ("send hook key", "chat.send", {"sessionKey": "hook:a", "message": "m", "idempotencyKey": "k"}, "agent session"),
    ("send unknown agent", "chat.send", {"sessionKey": "agent:nobody:main", "message": "m", "idempotencyKey": "k"}, ""),
]


@pytest.mark.parametrize(("method", "params", "message"), [b[1:] for b in BAD_PARAMS], ids=[b[0] for b in BAD_PARAMS])
async def test_bad_params_get_invalid_request(
    server: GatewayServer, http: aiohttp.ClientSession, method: str, params: object, message: str
) -> None:
    client = await connected(http, server.port)
    res = await client.request(method, params)
    assert res["ok"] is False
    assert res["error"]["code"] == "INVALID_REQUEST"
    assert message in res["error"]["message"]


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.dictionaries(
            st.sampled_from(["type", "id", "method", "params", "x"]),
            st.one_of(st.none(), st.integers(), st.text(max_size=5), st.sampled_from(["req", "connect"])),
        ).map(json.dumps),
    )
)
def test_nothing_malformed_parses_as_a_request(text: str) -> None:
    codes: list[str] = []
    try:
        frame = parse_request_frame(text)
    except ProtocolError as exc:
        codes.append(exc.wire_code)
    if codes:
        assert codes == ["INVALID_REQUEST"]
        return
    raw = json.loads(text)
    assert raw["type"] == "req"
    assert isinstance(raw["id"], str)
    assert raw["id"]
    assert isinstance(raw["method"], str)
    assert raw["method"]
    assert set(raw) <= {"type", "id", "method", "params"}
    assert (frame.id, frame.method) == (raw["id"], raw["method"])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["minProtocol", "maxProtocol", "client", "role", "scopes", "auth", "caps", "extra"]),
        st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.text(max_size=3), max_size=2)),
    )
)
def test_no_malformed_connect_params_are_accepted(params: dict[str, Any]) -> None:
    # "client" is never an object here, so every generated document must be refused with a pointer message.
    with pytest.raises(ParamsError) as caught:
        parse_params(ConnectParams, "connect", params)
    assert caught.value.message.startswith("invalid connect params: at ")


# -- chat --------------------------------------------------------------------------------------------------------


async def test_chat_send_streams_deltas_and_final(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    client = await connected(http, server.port)
    run_id = str(uuid.uuid4())
    res = await client.request(
        "chat.send", {"sessionKey": KEY, "message": "ping\n@fake reply: pong from fake", "idempotencyKey": run_id}
    )
    assert res["payload"] == {"runId": run_id, "status": "started"}
    final = await client.wait_for_chat(run_id, "final")

    assert final["payload"]["stopReason"] == "stop"
    assert final["payload"]["message"]["role"] == "assistant"
    assert final["payload"]["message"]["content"] == [{"type": "text", "text": "pong from fake"}]
    assert isinstance(final["payload"]["message"]["timestamp"], int)
    chats = client.chat_events(run_id)
    deltas = [c for c in chats if c["state"] == "delta"]
    assert len(deltas) >= 2
    assert "".join(d["deltaText"] for d in deltas) == "pong from fake"
    assert deltas[-1]["message"]["content"] == [{"type": "text", "text": "pong from fake"}]
    assert {(c["sessionKey"], c["agentId"]) for c in chats} == {(KEY, "main")}
    agent = [f["payload"] for f in client.events if f["event"] == "agent"]
    assert {a["stream"] for a in agent} == {"run_status", "lifecycle", "assistant", "usage"}
    assert [a["data"]["phase"] for a in agent if a["stream"] == "lifecycle"] == ["start", "model", "finishing", "end"]
    assert agent[-1]["data"]["terminalReply"] == {"disposition": "visible", "text": "pong from fake"}
    assert [a["data"] for a in agent if a["stream"] == "usage"] == [{"outputTokens": 3}]
    # Each run status arrives twice: as a chat "status" event, then as the agent event with the same run seq.
    phases = ["preparing_context", "starting_model"]
    assert [(c["state"], c["phase"]) for c in chats if c["state"] == "status"] == [("status", p) for p in phases]
    assert [a["data"] for a in agent if a["stream"] == "run_status"] == [{"phase": p} for p in phases]
    status_seqs = [(f["event"], f["payload"]["seq"]) for f in client.events if f["event"] in ("chat", "agent")][:2]
    assert status_seqs == [("chat", 1), ("agent", 1)]
    # chat.metadata.changed comes first, once per run.
    assert [(f["event"], f["payload"]) for f in client.events[:1]] == [("chat.metadata.changed", {})]
    assert len([f for f in client.events if f["event"] == "chat.metadata.changed"]) == 1
    seqs = [f["seq"] for f in client.events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(fake.requests) == 1

    history = await client.request("chat.history", {"sessionKey": KEY, "limit": 20})
    page = history["payload"]
    assert page["sessionKey"] == KEY
    uuid.UUID(page["sessionId"])
    assert (page["hasMore"], page["totalMessages"]) == (False, 2)
    info = page["sessionInfo"]
    assert {k: info[k] for k in ("key", "hasActiveRun", "activeRunIds", "agentId")} == {
        "key": KEY,
        "hasActiveRun": False,
        "activeRunIds": [],
        "agentId": "main",
    }
    assert info["updatedAt"] >= info["createdAt"]
    assert page["defaults"] == {"modelProvider": "fake", "model": "fake-model"}
    user, assistant = page["messages"]
    assert user["role"] == "user"
    assert user["content"] == "ping\n@fake reply: pong from fake"
    assert user["idempotencyKey"] == f"{run_id}:user"
    assert isinstance(user["timestamp"], int)
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [{"type": "text", "text": "pong from fake"}]
    assert (assistant["provider"], assistant["model"], assistant["stopReason"], assistant["api"]) == (
        "fake",
        "fake-model",
        "stop",
        "openai-completions",
    )
    assert set(assistant["usage"]) == {"input", "output", "totalTokens"}

    window = await client.request("chat.history", {"sessionKey": KEY, "limit": 1, "maxChars": 4})
    assert window["payload"]["hasMore"] is True
    assert window["payload"]["nextOffset"] == 1
    assert window["payload"]["messages"][0]["content"][0]["text"].startswith("pong")
    assert window["payload"]["messages"][0]["truncated"] is True


async def test_same_idempotency_key_never_starts_a_second_run(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "@fake delay-ms: 400\n@fake reply: once", "idempotencyKey": "key-1"}
    first = await client.request("chat.send", params)
    assert first["payload"] == {"runId": "key-1", "status": "started"}
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    again = await client.request("chat.send", params)
    assert again["payload"] == {"runId": "key-1", "status": "in_flight"}
    history = await client.request("chat.history", {"sessionKey": KEY})
    info = history["payload"]["sessionInfo"]
    assert (info["hasActiveRun"], info["activeRunIds"]) == (True, ["key-1"])
    await client.wait_for_chat("key-1", "final")
    after = await client.request("chat.send", params)
    assert after["payload"] == {"runId": "key-1", "status": "ok"}
    assert len(fake.requests) == 1
    history = await client.request("chat.history", {"sessionKey": KEY})
    assert history["payload"]["totalMessages"] == 2


async def test_concurrent_duplicates_share_one_run(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "@fake reply: one", "idempotencyKey": "dup"}
    for frame_id in ("d1", "d2", "d3"):
        await client.send_raw(json.dumps({"type": "req", "id": frame_id, "method": "chat.send", "params": params}))
    statuses = [(await client.response(frame_id))["payload"]["status"] for frame_id in ("d1", "d2", "d3")]
    assert statuses == ["started", "in_flight", "in_flight"]
    await client.wait_for_chat("dup", "final")
    assert len([c for c in client.chat_events("dup") if c["state"] == "final"]) == 1
    assert len(fake.requests) == 1


async def test_chat_abort_mid_run(server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "@fake delay-ms: 60000\n@fake reply: never", "idempotencyKey": "slow"}
    assert (await client.request("chat.send", params))["payload"]["status"] == "started"
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    res = await client.request("chat.abort", {"sessionKey": KEY})
    assert res["payload"] == {"ok": True, "aborted": True, "runIds": ["slow"]}
    aborted = await client.wait_for_chat("slow", "aborted")
    assert aborted["payload"]["sessionKey"] == KEY
    assert not [c for c in client.chat_events("slow") if c["state"] in ("final", "delta")]
    history = await client.request("chat.history", {"sessionKey": KEY})
    assert history["payload"]["sessionInfo"]["hasActiveRun"] is False
    assert [m["role"] for m in history["payload"]["messages"]] == ["user"]
    again = await client.request("chat.send", params)
    assert again["payload"] == {"runId": "slow", "status": "aborted"}
    nothing = await client.request("chat.abort", {"sessionKey": KEY, "runId": "slow"})
    assert nothing["payload"] == {"ok": True, "aborted": False, "runIds": []}


async def test_abort_of_a_queued_run(server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer) -> None:
    client = await connected(http, server.port)
    slow = {"sessionKey": KEY, "message": "@fake delay-ms: 60000\n@fake reply: a", "idempotencyKey": "first"}
    queued = {"sessionKey": KEY, "message": "@fake reply: b", "idempotencyKey": "second"}
    await client.request("chat.send", slow)
    await client.request("chat.send", queued)
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    res = await client.request("chat.abort", {"sessionKey": KEY, "runId": "second"})
    assert res["payload"]["runIds"] == ["second"]
    await client.wait_for_chat("second", "aborted")
    assert (await client.request("chat.send", queued))["payload"]["status"] == "aborted"
    await client.request("chat.abort", {"sessionKey": KEY})
    await client.wait_for_chat("first", "aborted")
    assert len(fake.requests) == 1


async def test_model_failure_sends_error_event(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "@fake fail: 400", "idempotencyKey": "bad"}
    await client.request("chat.send", params)
    error = await client.wait_for_chat("bad", "error")
    assert error["payload"]["errorKind"] == "error"
    assert error["payload"]["errorMessage"]
    assert set(error["payload"]["errorDetail"]) == {"code", "message"}
    assert (await client.request("chat.send", params))["payload"]["status"] == "error"
    conflict = await client.request("chat.send", {**params, "message": "x"})
    assert conflict["error"] == {
        "code": "INVALID_REQUEST",
        "message": "this idempotency key already started a run with a different message",
        "details": {"code": "idempotency_conflict", "reason": "chat-request-conflict"},
    }


async def test_subscribers_receive_the_session_events(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    sender = await connected(http, server.port)
    watcher = await connected(http, server.port)
    bystander = await connected(http, server.port)
    sub = await watcher.request("sessions.messages.subscribe", {"sessionKey": "agent:MAIN:main"})
    assert sub["payload"] == {"subscribed": True, "sessionKey": KEY}
    await sender.request("chat.send", {"sessionKey": KEY, "message": "@fake reply: hello all", "idempotencyKey": "s"})
    final = await watcher.wait_for_chat("s", "final")
    assert final["payload"]["message"]["content"][0]["text"] == "hello all"
    await sender.wait_for_chat("s", "final")
    listing = await bystander.request("sessions.list", {"limit": 10})
    assert bystander.events == []
    (row,) = listing["payload"]["sessions"]
    assert (row["key"], row["agentId"], row["kind"], row["hasActiveRun"]) == (KEY, "main", "main", False)
    assert listing["payload"]["count"] == 1


async def test_stop_aborts_runs_and_closes_with_1012(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    gateway = GatewayServer(make_config(tmp_path, fake.base_url), data_dir=tmp_path / "data")
    await gateway.start()
    try:
        client = await connected(http, gateway.port)
        params = {"sessionKey": KEY, "message": "@fake delay-ms: 60000", "idempotencyKey": "cut"}
        await client.request("chat.send", params)
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
    finally:
        stopping = asyncio.create_task(gateway.stop())
    await client.wait_for_chat("cut", "aborted")
    assert await client.wait_for_close() == 1012
    await stopping
    assert gateway.state is ServerState.STOPPED
    await gateway.stop()


# -- the process -------------------------------------------------------------------------------------------------


def start_process(config_path: Path, data_dir: Path) -> tuple[subprocess.Popen[str], int]:
    code = "import sys; from clawstack.cli.gateway import gateway; gateway(sys.argv[1:])"
    args = ["serve", "--config", str(config_path), "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("gateway listening on ws://127.0.0.1:"), line
    return proc, int(line.rsplit(":", 1)[1])


async def test_serve_prints_readiness_and_exits_0_on_sigterm(tmp_path: Path, fake: FakeModelServer) -> None:
    config_path = tmp_path / "gateway.json5"
    config_path.write_text(json.dumps(config_document(fake.base_url)))
    proc, port = await asyncio.to_thread(start_process, config_path, tmp_path / "data")
    try:
        async with aiohttp.ClientSession() as http:
            client = await connected(http, port)
            assert (await client.request("sessions.list"))["ok"] is True
            await client.ws.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


async def test_restart_marks_an_in_flight_run_interrupted(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    config_path = tmp_path / "gateway.json5"
    config_path.write_text(json.dumps(config_document(fake.base_url)))
    data_dir = tmp_path / "data"
    proc, port = await asyncio.to_thread(start_process, config_path, data_dir)
    try:
        client = await connected(http, port)
        params = {"sessionKey": KEY, "message": "@fake delay-ms: 60000", "idempotencyKey": "cut-by-crash"}
        assert (await client.request("chat.send", params))["payload"]["status"] == "started"
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait, WAIT_S)
        assert proc.stdout is not None
        proc.stdout.close()
    async with GatewayServer(make_config(tmp_path, fake.base_url), data_dir=data_dir) as gateway:
        assert gateway.interrupted_run_ids == ("cut-by-crash",)
        client = await connected(http, gateway.port)
        history = await client.request("chat.history", {"sessionKey": KEY})
        assert history["payload"]["sessionInfo"]["hasActiveRun"] is False
        assert [m["role"] for m in history["payload"]["messages"]] == ["user"]
        again = await client.request("chat.send", params)
        assert again["payload"] == {"runId": "cut-by-crash", "status": "interrupted"}
    assert len(fake.requests) == 1
