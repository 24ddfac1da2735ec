"""The gateway's front door against hostile peers: what an unauthenticated client can make the gateway read, and
what hostile nesting does before and after the handshake, against a real in-process gateway.

Every hostile frame gets the protocol's own answer (``INVALID_REQUEST``) or a close, never a traceback in the log,
and the gateway keeps serving: after each case a normal client still connects and chats.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.gateway.protocol import DEFAULT_MAX_PAYLOAD, MAX_FRAME_DEPTH, PREAUTH_MAX_PAYLOAD
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_ws_protocol import (
    API_KEY,
    KEY,
    WAIT_S,
    Client,
    connect_params,
    connected,
    make_config,
    open_client,
)

pytestmark = pytest.mark.security

TOO_LARGE = f"invalid request frame: larger than {PREAUTH_MAX_PAYLOAD} bytes"
TOO_DEEP = f"invalid request frame: nested deeper than {MAX_FRAME_DEPTH} levels"


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


def nested(depth: int) -> Any:
    """A value nesting arrays and objects ``depth`` levels deep."""
    value: Any = "x"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def deep_text(depth: int) -> str:
    """The JSON text of :func:`nested` ``(depth)``, built without recursion."""
    openers = ['{"k": ' if level % 2 == 0 else "[" for level in reversed(range(depth))]
    return "".join(openers) + '"x"' + "".join("}" if o.startswith("{") else "]" for o in reversed(openers))


def connect_frame(**overrides: Any) -> dict[str, Any]:
    return {"type": "req", "id": "c1", "method": "connect", "params": connect_params(**overrides)}


async def refusal(client: Client, frame_id: str | None = None) -> tuple[dict[str, Any], int | None]:
    """The error answer to a refused handshake frame, and the close code that follows it."""
    res = await client.response(frame_id)
    assert res["ok"] is False, res
    return res["error"], await client.wait_for_close()


async def chats(http: aiohttp.ClientSession, port: int, n: int = 1) -> None:
    """A normal client still connects and gets an answer from the model."""
    client = await connected(http, port)
    sent = await client.request("chat.send", {"sessionKey": KEY, "message": "ping", "idempotencyKey": f"after-{n}"})
    assert sent["ok"] is True, sent
    async with asyncio.timeout(WAIT_S):
        final = await client.wait_for_chat(sent["payload"]["runId"], "final")
    assert final["payload"]["message"]["content"][0]["text"]
    await client.ws.close()


def assert_clean(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info is not None]
    assert bad == [], [r.getMessage() for r in bad]


# -- the pre-handshake size cap ------------------------------------------------------------------------------------


async def test_an_oversized_frame_before_connect_is_refused_without_being_read(
    server: GatewayServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    client = await open_client(http, server.port)
    # A 4 MiB frame (within maxPayload): the gateway answers and closes while the client is still sending it,
    # because it stops reading at the cap.
    frame = json.dumps(connect_frame(userAgent="u" * (4 * 1024 * 1024)))
    sending = asyncio.create_task(client.send_raw(frame))
    try:
        error, code = await refusal(client)
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
    assert error == {"code": "INVALID_REQUEST", "message": TOO_LARGE}
    assert code == 1008
    await chats(http, server.port)
    assert_clean(caplog)


async def test_a_frame_over_max_payload_before_connect_is_closed(
    server: GatewayServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    client = await open_client(http, server.port)
    frame = json.dumps(connect_frame(userAgent="u" * DEFAULT_MAX_PAYLOAD))
    sending = asyncio.create_task(client.send_raw(frame))
    try:
        async with asyncio.timeout(WAIT_S):
            msg = await client.ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                # The cap was spent before the frame's header was parsed: the pre-handshake refusal.
                assert json.loads(msg.data)["error"] == {"code": "INVALID_REQUEST", "message": TOO_LARGE}
                msg = await client.ws.receive()
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
    # Otherwise its header alone declared more than maxPayload: closed 1009 before any of it is buffered.
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
    assert client.ws.close_code in (1008, 1009)
    await chats(http, server.port)
    assert_clean(caplog)


async def test_the_cap_is_exactly_the_preauth_payload(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    base = len(json.dumps(connect_frame(userAgent="")))
    fits = json.dumps(connect_frame(userAgent="u" * (PREAUTH_MAX_PAYLOAD - base)))
    assert len(fits) == PREAUTH_MAX_PAYLOAD
    client = await open_client(http, server.port)
    await client.send_raw(fits)
    assert (await client.response("c1"))["ok"] is True  # the largest allowed connect still connects
    # After the handshake the cap is policy.maxPayload again.
    listed = await client.request("sessions.list", {"limit": 1})
    assert listed["ok"] is True
    big = await client.request("chat.history", {"sessionKey": KEY, "limit": 1, "padding": "p" * PREAUTH_MAX_PAYLOAD})
    assert big["error"]["message"] == "invalid chat.history params: at root: unexpected property 'padding'"

    over = await open_client(http, server.port)
    await over.send_raw(fits.replace('"userAgent": "', '"userAgent": "u', 1))
    error, code = await refusal(over)
    assert (error["message"], code) == (TOO_LARGE, 1008)


async def test_bytes_piped_behind_connect_count_against_the_cap(
    server: GatewayServer, http: aiohttp.ClientSession
) -> None:
    # A client must wait for hello-ok before sending more than the cap: the unread rest cannot be resumed.
    client = await open_client(http, server.port)
    await client.send_raw(json.dumps(connect_frame()))
    sending = asyncio.create_task(client.send_raw("x" * (2 * PREAUTH_MAX_PAYLOAD)))
    try:
        res = await client.recv()
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
    # Either the connect was answered before the rest arrived (and the rest is an ordinary bad frame), or the cap
    # was spent first and the handshake is refused; never a connection that reads past the cap unauthenticated.
    if res["ok"]:
        assert res["id"] == "c1"
        garbage = await client.response(None)
        assert garbage["error"]["message"] == "invalid request frame: not JSON"
    else:
        assert res["id"] in (None, "c1")
        assert res["error"] == {"code": "INVALID_REQUEST", "message": TOO_LARGE}
        assert await client.wait_for_close() == 1008


# -- nesting -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_FRAME_DEPTH + 1, 100_000])
async def test_deep_nesting_before_connect_is_refused(
    server: GatewayServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    text = "[" * depth + "]" * depth if depth > PREAUTH_MAX_PAYLOAD // 2 else json.dumps(nested(depth))
    client = await open_client(http, server.port)
    await client.send_raw(text)
    error, code = await refusal(client)
    assert error["code"] == "INVALID_REQUEST"
    assert error["message"] in (TOO_DEEP, TOO_LARGE)
    assert code == 1008
    deep_connect = connect_frame()
    deep_connect["params"]["device"] = nested(MAX_FRAME_DEPTH)
    client = await open_client(http, server.port)
    await client.send_raw(json.dumps(deep_connect))
    error, code = await refusal(client)  # refused before any of it is read, its id neither
    assert (error, code) == ({"code": "INVALID_REQUEST", "message": TOO_DEEP}, 1008)
    await chats(http, server.port)
    assert_clean(caplog)


@pytest.mark.parametrize("depth", [MAX_FRAME_DEPTH + 1, 10_000, 1_000_000])
async def test_deep_nesting_after_connect_is_refused_and_the_connection_stays(
    server: GatewayServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    client = await connected(http, server.port)
    params = "[" * depth + "]" * depth
    await client.send_raw('{"type": "req", "id": "deep", "method": "sessions.list", "params": ' + params + "}")
    res = await client.response(None)  # nothing of a frame that is not parsed is read, its id neither
    assert res["error"] == {"code": "INVALID_REQUEST", "message": TOO_DEEP}
    # Just under the bound is parsed (and refused by the method's schema, not by the parser).
    ok_depth = {"type": "req", "id": "d", "method": "sessions.list", "params": {"agentId": nested(MAX_FRAME_DEPTH - 2)}}
    await client.send_raw(json.dumps(ok_depth))
    res = await client.response("d")
    assert res["error"]["message"] == "invalid sessions.list params: at /agentId: must be string"
    sent = await client.request("chat.send", {"sessionKey": KEY, "message": "ping", "idempotencyKey": f"d{depth}"})
    assert sent["ok"] is True
    async with asyncio.timeout(WAIT_S):
        await client.wait_for_chat(sent["payload"]["runId"], "final")
    assert_clean(caplog)


# -- fuzzing the handshake -----------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FRAME_KEYS = st.sampled_from(["type", "id", "method", "params", "extra"])
HANDSHAKE_FRAMES = st.one_of(
    st.binary(max_size=256),
    st.text(max_size=256),
    JSON_VALUES.map(json.dumps),
    st.dictionaries(FRAME_KEYS, JSON_VALUES | st.sampled_from(["req", "connect", "c1"]), max_size=5).map(json.dumps),
    st.builds(
        lambda params: json.dumps({"type": "req", "id": "c1", "method": "connect", "params": params}),
        st.dictionaries(
            st.sampled_from(["minProtocol", "maxProtocol", "client", "auth", "role", "scopes", "device", "x"]),
            JSON_VALUES,
            max_size=6,
        ),
    ),
    st.integers(min_value=MAX_FRAME_DEPTH - 2, max_value=5000).map(deep_text),
    st.sampled_from(['{"a": 1, "a": 2}', '{"type": "req", "id": "c1", "id": "c2"}', "NaN", '"\\ud800"', "9" * 400]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=HANDSHAKE_FRAMES)
async def test_any_first_frame_gets_a_protocol_error_or_a_close(
    server: GatewayServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, frame: str | bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await open_client(http, server.port)
    if isinstance(frame, bytes):
        await client.ws.send_bytes(frame)
    else:
        await client.send_raw(frame)
    async with asyncio.timeout(WAIT_S):
        msg = await client.ws.receive()
        if msg.type is aiohttp.WSMsgType.TEXT:
            answer = json.loads(msg.data)
            assert answer["type"] == "res"
            assert answer["ok"] is False, answer  # no generated frame carries the token
            assert answer["error"]["code"] == "INVALID_REQUEST"
            msg = await client.ws.receive()
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
    assert client.ws.close_code in (1000, 1002, 1008)
    await client.ws.close()
    assert_clean(caplog)
    # The gateway keeps serving.
    alive = await connected(http, server.port)
    assert (await alive.request("sessions.list", {"limit": 1}))["ok"] is True
    await alive.ws.close()
