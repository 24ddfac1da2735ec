"""The gateway WebSocket client against a real in-process gateway and against scripted hostile servers: the
handshake (and its refusals and timeout), reconnect backoff, chat.send retried with the same key, bounded event
buffering, the grace period after a close, malformed frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from clawstack.common.clock import ManualClock
from clawstack.connect import GatewayClient, GatewayRequestError, GatewayTransportError
from clawstack.gateway.server import GatewayServer
from tests.integration.connect.harness import free_port
from tests.unit.connect.conftest import PASSWORD

KEY = "agent:main:main"
WAIT_S = 10.0
Handler = Callable[["Peer"], Awaitable[None]]


class Peer:
    """One connection to a scripted gateway."""

    def __init__(self, ws: web.WebSocketResponse, index: int) -> None:
        self.ws = ws
        self.index = index

    async def send(self, frame: object) -> None:
        await self.ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self) -> dict[str, Any]:
        msg = await self.ws.receive()
        assert msg.type is WSMsgType.TEXT, msg
        frame = json.loads(msg.data)
        assert isinstance(frame, dict)
        return frame

    async def drain(self) -> None:
        """Read (and ignore) frames until the client closes."""
        async for _ in self.ws:
            pass

    async def handshake(self) -> dict[str, Any]:
        await self.send({"type": "event", "event": "connect.challenge", "payload": {"nonce": "n", "ts": 1}})
        frame = await self.recv()
        await self.send({"type": "res", "id": frame["id"], "ok": True, "payload": {"type": "hello-ok", "protocol": 4}})
        return frame

    async def answer(self, frame: dict[str, Any], payload: dict[str, Any]) -> None:
        await self.send({"type": "res", "id": frame["id"], "ok": True, "payload": payload})


class ScriptedGateway:
    """A WebSocket server that runs ``handler`` for each connection, numbered from 0."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.port = free_port()
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    async def _handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        index = self.connections
        self.connections += 1
        await self.handler(Peer(ws, index))
        await ws.close()
        return ws

    async def __aenter__(self) -> ScriptedGateway:
        app = web.Application()
        app.router.add_get("/", self._handle)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


class RecordingClock(ManualClock):
    """A manual clock that remembers every delay slept."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    async def sleep(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        await super().sleep(delay_s)


async def wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def client_for(url: str, **kwargs: Any) -> GatewayClient:
    options: dict[str, Any] = {"secret": PASSWORD, "backoff_initial_s": 0.05, "backoff_max_s": 0.2}
    options.update(kwargs)
    return GatewayClient(url, **options)


async def test_a_run_against_the_real_gateway(gateway: GatewayServer) -> None:
    client = client_for(gateway.url)
    await client.start()
    try:
        assert await client.wait_connected(WAIT_S)
        assert client.hello["protocol"] == 4
        assert client.hello["auth"]["scopes"] == ["operator.read", "operator.write"]
        answer = await client.chat_send(KEY, "@fake reply: hi there", "run-one")
        assert answer == {"runId": "run-one", "status": "started"}
        watch = client.watch("run-one", KEY)
        while True:
            event = await watch.next(WAIT_S)
            assert event is not None
            if event.kind == "chat" and event.payload["state"] == "final":
                break
        history = await client.chat_history(KEY)
        assert history["messages"][-1]["content"][0]["text"] == "hi there"
        again = await client.chat_send(KEY, "@fake reply: hi there", "run-one")
        assert again["status"] == "ok"
    finally:
        await client.aclose()
    assert client.liveness == "closed"


async def test_a_wrong_password_is_a_refused_handshake(gateway: GatewayServer) -> None:
    client = client_for(gateway.url, secret="wrong")
    await client.start()
    try:
        await wait_until(lambda: client.last_error is not None)
        assert client.last_error is not None
        assert client.last_error.code == "gateway_handshake_refused"
        assert "AUTH_PASSWORD_MISMATCH" in client.last_error.message
        assert client.liveness == "unreachable"
        with pytest.raises(GatewayTransportError):
            await client.request("sessions.list", {}, timeout_s=0.1)
    finally:
        await client.aclose()


async def test_the_handshake_frame_and_token_auth() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(peer: Peer) -> None:
        seen.append(await peer.handshake())
        await peer.drain()

    async with ScriptedGateway(handler) as server:
        client = client_for(server.url, auth_kind="token", secret="tok")
        await client.start()
        try:
            assert await client.wait_connected(WAIT_S)
        finally:
            await client.aclose()
    params = seen[0]["params"]
    assert seen[0]["method"] == "connect"
    assert (params["minProtocol"], params["maxProtocol"]) == (4, 4)
    assert params["client"]["id"] == "gateway-client"
    assert params["client"]["mode"] == "backend"
    assert params["client"]["version"]
    assert params["client"]["platform"]
    assert params["role"] == "operator"
    assert params["scopes"] == ["operator.read", "operator.write"]
    assert params["auth"] == {"token": "tok"}


async def test_every_method_clawconnect_calls_works_without_admin_and_admin_work_is_refused(
    gateway: GatewayServer,
) -> None:
    client = client_for(gateway.url)
    await client.start()
    try:
        assert await client.wait_connected(WAIT_S)
        assert client.hello["auth"]["scopes"] == ["operator.read", "operator.write"]
        watch = client.watch("plain", KEY)
        assert (await client.chat_send(KEY, "@fake reply: hi", "plain"))["status"] == "started"
        while (event := await watch.next(WAIT_S)) is not None and event.payload.get("state") != "final":
            pass
        assert event is not None
        started = await client.chat_send(KEY, "@fake delay-ms: 60000\n@fake reply: never", "slow")
        assert started == {"runId": "slow", "status": "started"}
        subscribed = await client.request("sessions.messages.subscribe", {"sessionKey": KEY})
        assert subscribed == {"subscribed": True, "sessionKey": KEY}
        aborted = await client.request("chat.abort", {"sessionKey": KEY, "runId": "slow"})
        assert aborted == {"ok": True, "aborted": True, "runIds": ["slow"]}
        before = await client.chat_history(KEY)
        assert before["messages"][1]["content"] == [{"type": "text", "text": "hi"}]
        missing_admin = {
            "code": "MISSING_SCOPE",
            "missingScope": "operator.admin",
            "requiredScopes": ["operator.admin"],
        }
        for message in ("/reset", "/new"):
            with pytest.raises(GatewayRequestError) as refused:
                await client.chat_send(KEY, message, f"reset-{message}")
            assert (refused.value.code, refused.value.message) == ("FORBIDDEN", "missing scope: operator.admin")
            assert refused.value.details == missing_admin
        with pytest.raises(GatewayRequestError) as refused:
            await client.request("sessions.reset", {"key": KEY})
        assert refused.value.details == missing_admin
        assert await client.chat_history(KEY) == before
    finally:
        await client.aclose()


async def test_a_gateway_that_never_answers_times_the_handshake_out() -> None:
    async def handler(peer: Peer) -> None:
        await peer.send({"type": "event", "event": "connect.challenge", "payload": {}})
        await peer.drain()

    async with ScriptedGateway(handler) as server:
        client = client_for(server.url, handshake_timeout_s=0.2)
        await client.start()
        try:
            await wait_until(lambda: server.connections >= 2)
            assert client.last_error is not None
            assert client.last_error.code == "gateway_handshake_timeout"
            assert not client.connected
        finally:
            await client.aclose()


async def test_malformed_frames_are_ignored() -> None:
    async def handler(peer: Peer) -> None:
        for junk in ("not json", "[1]", '{"no": "type"}'):
            await peer.send(junk)
        await peer.ws.send_bytes(b"\x00")
        await peer.handshake()
        await peer.send("{{{")
        await peer.send({"type": "event", "event": "chat", "payload": {"state": "final"}})
        request = await peer.recv()
        await peer.answer(request, {"ok": True})
        await peer.drain()

    async with ScriptedGateway(handler) as server:
        client = client_for(server.url)
        await client.start()
        try:
            assert await client.request("sessions.list", {}, timeout_s=WAIT_S) == {"ok": True}
            assert client.malformed_frames == 6
            assert client.connects == 1
        finally:
            await client.aclose()


async def test_chat_send_is_retried_with_the_same_key_after_a_transport_loss() -> None:
    sends: list[dict[str, Any]] = []

    async def handler(peer: Peer) -> None:
        await peer.handshake()
        frame = await peer.recv()
        sends.append(frame)
        if peer.index == 0:
            return  # the socket closes before the answer
        await peer.answer(frame, {"runId": frame["params"]["idempotencyKey"], "status": "in_flight"})
        await peer.drain()

    async with ScriptedGateway(handler) as server:
        client = client_for(server.url)
        await client.start()
        try:
            answer = await client.chat_send(KEY, "hello", "key-1")
        finally:
            await client.aclose()
    assert answer["status"] == "in_flight"
    assert [f["params"]["idempotencyKey"] for f in sends] == ["key-1", "key-1"]
    assert [f["method"] for f in sends] == ["chat.send", "chat.send"]


async def test_a_refused_request_carries_the_gateway_code() -> None:
    async def handler(peer: Peer) -> None:
        await peer.handshake()
        frame = await peer.recv()
        error = {"code": "INVALID_REQUEST", "message": "unknown agent: x", "details": {"code": "X"}}
        await peer.send({"type": "res", "id": frame["id"], "ok": False, "error": error})
        await peer.drain()

    async with ScriptedGateway(handler) as server:
        client = client_for(server.url)
        await client.start()
        try:
            with pytest.raises(GatewayRequestError) as info:
                await client.chat_send(KEY, "hello", "key-1")
        finally:
            await client.aclose()
    assert (info.value.code, info.value.details) == ("INVALID_REQUEST", {"code": "X"})


async def test_events_before_the_run_is_known_are_buffered_and_bounded() -> None:
    async def handler(peer: Peer) -> None:
        await peer.handshake()
        frame = await peer.recv()
        for seq in range(5):
            payload = {"runId": "r1", "sessionKey": KEY, "state": "delta", "seq": seq}
            await peer.send({"type": "event", "event": "chat", "payload": payload, "seq": seq + 1})
        await peer.send({"type": "event", "event": "chat", "payload": {"runId": "other", "state": "delta"}})
        await peer.answer(frame, {"runId": "r1", "status": "started"})
        await peer.drain()

    async with ScriptedGateway(handler) as server:
        client = client_for(server.url, max_buffered_events=3)
        await client.start()
        try:
            await client.chat_send(KEY, "hello", "r1")
            assert client.buffered_events == 3
            watch = client.watch("r1", KEY)
            seqs = []
            while (event := await watch.next(0.05)) is not None:
                seqs.append(event.payload["seq"])
            assert seqs == [3, 4]
            assert client.buffered_events == 1
        finally:
            await client.aclose()


async def test_backoff_doubles_from_1_s_to_30_s() -> None:
    clock = RecordingClock()
    client = GatewayClient(f"ws://127.0.0.1:{free_port()}/", secret="x", clock=clock)
    await client.start()
    try:
        for _ in range(8):
            await wait_until(lambda: clock.sleepers == 1)
            clock.advance(30)
        assert clock.delays[:8] == [1, 2, 4, 8, 16, 30, 30, 30]
        assert client.last_error is not None
        assert client.last_error.code == "gateway_transport_lost"
    finally:
        await client.aclose()


async def test_watchers_hear_of_a_loss_and_a_return_and_liveness_has_a_grace_period() -> None:
    subscribed: list[str] = []
    cut = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.handshake()
        if peer.index == 0:
            await cut.wait()  # then the server closes the socket
            return
        frame = await peer.recv()
        subscribed.append(frame["params"]["sessionKey"])
        await peer.answer(frame, {"subscribed": True})
        await peer.drain()

    clock = RecordingClock()
    async with ScriptedGateway(handler) as server:
        client = GatewayClient(server.url, secret="x", clock=clock, close_grace_s=0.5)
        await client.start()
        try:
            assert await client.wait_connected(WAIT_S)
            watch = client.watch("r1", KEY)
            cut.set()
            event = await watch.next(WAIT_S)
            assert event is not None
            assert event.kind == "disconnected"
            assert client.liveness == "reconnecting"
            await wait_until(lambda: clock.sleepers == 1)
            assert clock.delays == [1]
            clock.advance(0.75)  # past the grace period, before the first backoff ends
            assert client.liveness == "unreachable"
            clock.advance(0.25)
            event = await watch.next(WAIT_S)
            assert event is not None
            assert event.kind == "reconnected"
            assert client.liveness == "connected"
        finally:
            await client.aclose()
    assert subscribed == [KEY]
