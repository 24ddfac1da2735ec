"""The MCP session records in front of the SDK's transport, with an injected clock: ownership, the bound per caller
(opening sessions included), ends (DELETE, idleness, the SDK's own 404) and the events that go with a session.

The SDK's app is replaced by a small ASGI stand-in that opens a session on a request without an id; the real
transport is exercised in ``tests/integration/connect/test_http_sessions.py``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from clawstack.connect.event_store import SessionEventStore
from clawstack.connect.mcp_sessions import McpSessions, McpSessionSettings

ALICE, BOB = "user:Alice", "user:Bob"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Sdk:
    """Answers as the transport would: a new session id for a request without one; ``status`` for the others.
    A request stores one event in the current session's log, sets ``entered``, then waits on ``hold`` if set."""

    def __init__(self, events: SessionEventStore) -> None:
        self.events = events
        self.opened = 0
        self.status = 200
        self.open_status = 200
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = dict(scope["headers"])
        self.seen.append(scope["method"])
        await self.events.store_event("s", None)
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        headers = [(b"content-type", b"application/json")]
        status = self.status
        if b"mcp-session-id" not in sent and b"mcp-protocol-version" not in sent:
            self.opened += 1
            status = self.open_status
            if status < 400:
                headers.append((b"mcp-session-id", f"s{self.opened}".encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


def scope(method: str = "POST", session: str | None = None, version: str | None = None) -> Scope:
    headers = [(b"content-type", b"application/json")]
    if session is not None:
        headers.append((b"mcp-session-id", session.encode()))
    if version is not None:
        headers.append((b"mcp-protocol-version", version.encode()))
    return {"type": "http", "method": method, "path": "/mcp", "headers": headers}


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class Reply:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = dict(message["headers"])
        else:
            self.body += message.get("body", b"")

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, **settings: Any) -> tuple[McpSessions, Sdk]:
    events = SessionEventStore()
    return McpSessions(McpSessionSettings(**settings), events, clock=clock), Sdk(events)


async def request(sessions: McpSessions, sdk: Sdk, owner: str, **kw: Any) -> Reply:
    reply = Reply()
    await sessions.serve(owner, scope(**kw), receive, reply, sdk)
    return reply


async def open_session(sessions: McpSessions, sdk: Sdk, owner: str) -> str:
    reply = await request(sessions, sdk, owner)
    assert reply.status == 200, reply.body
    return reply.headers[b"mcp-session-id"].decode()


async def test_only_the_owner_reaches_its_session(clock: Clock) -> None:
    sessions, sdk = make(clock)
    session = await open_session(sessions, sdk, ALICE)
    for method in ("POST", "GET", "DELETE"):
        refused = await request(sessions, sdk, BOB, method=method, session=session)
        unknown = await request(sessions, sdk, BOB, method=method, session="s999")
        assert (refused.status, refused.body) == (unknown.status, unknown.body) == (404, unknown.body)
        assert refused.json["error"] == {"code": -32600, "message": "Session not found"}
    assert sdk.seen == ["POST"]  # no refused request reached the transport
    assert (await request(sessions, sdk, ALICE, session=session)).status == 200  # the owner can


async def test_the_bound_counts_sessions_still_opening(clock: Clock) -> None:
    sessions, sdk = make(clock, max_sessions_per_caller=1)
    sdk.hold = asyncio.Event()
    opening = asyncio.create_task(request(sessions, sdk, ALICE))
    async with asyncio.timeout(10):
        await sdk.entered.wait()
    assert sessions.count(ALICE) == 1
    refused = await request(sessions, sdk, ALICE)
    assert refused.status == 429
    assert refused.json["error"]["data"] == {"code": "mcp_session_limit", "limit": 1}
    sdk.hold.set()
    assert (await opening).status == 200
    sdk.hold = None
    assert (await request(sessions, sdk, BOB)).status == 200  # another caller still opens one
    assert (sessions.count(ALICE), sessions.count(BOB)) == (1, 1)


async def test_an_opening_request_the_sdk_refuses_holds_no_place(clock: Clock) -> None:
    sessions, sdk = make(clock, max_sessions_per_caller=1)
    sdk.open_status = 400
    assert (await request(sessions, sdk, ALICE)).status == 400
    assert sessions.count(ALICE) == 0
    assert sessions.events.size == 0
    sdk.open_status = 200
    await open_session(sessions, sdk, ALICE)


async def test_delete_ends_a_session_only_when_it_succeeds(clock: Clock) -> None:
    sessions, sdk = make(clock)
    session = await open_session(sessions, sdk, ALICE)
    sdk.status = 400
    assert (await request(sessions, sdk, ALICE, method="DELETE", session=session)).status == 400
    assert sessions.count(ALICE) == 1
    sdk.status = 200
    assert (await request(sessions, sdk, ALICE, method="DELETE", session=session)).status == 200
    assert sessions.count(ALICE) == 0
    assert sessions.events.size == 0
    assert (await request(sessions, sdk, ALICE, session=session)).status == 404


async def test_a_session_the_sdk_no_longer_knows_is_forgotten(clock: Clock) -> None:
    sessions, sdk = make(clock)
    session = await open_session(sessions, sdk, ALICE)
    sdk.status = 404
    await request(sessions, sdk, ALICE, session=session)
    assert sessions.count(ALICE) == 0


async def test_an_idle_session_ends_but_not_while_a_request_is_in_flight(clock: Clock) -> None:
    sessions, sdk = make(clock, max_sessions_per_caller=1, idle_timeout_s=60)
    session = await open_session(sessions, sdk, ALICE)
    sdk.hold = asyncio.Event()
    sdk.entered.clear()
    stream = asyncio.create_task(request(sessions, sdk, ALICE, method="GET", session=session))
    async with asyncio.timeout(10):
        await sdk.entered.wait()
    clock.now += 3600  # a long-open GET stream holds the session
    assert (await request(sessions, sdk, ALICE)).status == 429
    sdk.hold.set()
    await stream
    sdk.hold = None
    clock.now += 59  # idle, but not for long enough
    assert (await request(sessions, sdk, ALICE)).status == 429
    clock.now += 1
    assert (await request(sessions, sdk, ALICE, session=session)).status == 404
    await open_session(sessions, sdk, ALICE)


async def test_a_refused_request_does_not_keep_a_session_alive(clock: Clock) -> None:
    sessions, sdk = make(clock, idle_timeout_s=60)
    session = await open_session(sessions, sdk, ALICE)
    clock.now += 50
    assert (await request(sessions, sdk, BOB, session=session)).status == 404
    clock.now += 10
    assert (await request(sessions, sdk, ALICE, session=session)).status == 404


async def test_a_2026_request_has_no_session_and_passes_untouched(clock: Clock) -> None:
    sessions, sdk = make(clock, max_sessions_per_caller=1)
    await open_session(sessions, sdk, ALICE)
    passed = await request(sessions, sdk, ALICE, session="anything", version="2026-07-28")
    assert passed.status == 200
    assert sessions.count(ALICE) == 1


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"max_sessions_per_caller": 0}, "max_sessions_per_caller"),
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
        ({"idle_timeout_s": float("inf")}, "idle_timeout_s"),
        ({"idle_timeout_s": float("nan")}, "idle_timeout_s"),
        ({"sse_retry_ms": -1}, "sse_retry_ms"),
        ({"max_events_per_session": 0}, "event bounds"),
        ({"max_events": 0}, "event bounds"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        McpSessionSettings(**settings)
