"""``claw connect http``'s MCP sessions over real HTTP (uvicorn on loopback, raw JSON-RPC with httpx): a session
belongs to the caller that opened it (another caller is answered as for an unknown id, on POST, GET and DELETE),
each caller holds a bounded number of sessions, idle sessions end, and SSE streams resume with ``Last-Event-ID``
(priming events with a ``retry``; a cut ``POST`` stream and a cut ``GET`` stream get what they missed; another
caller's event ids replay nothing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from clawstack.connect import (
    ConnectService,
    HttpServer,
    JobStore,
    TokenAuth,
    create_app,
    create_mcp_server,
    parse_agents,
)
from clawstack.connect.http import MCP_PATH
from clawstack.connect.mcp_sessions import McpSessionSettings
from tests.integration.connect.harness import (
    GATEWAY_PASSWORD,
    GatewayProcess,
    HttpConnect,
    connect_env,
    free_port,
    poll_until,
)

ALICE, BOB, PUBLIC = "alice-token-0123456789abcdef", "bob-token-fedcba9876543210", "shared-pass-0123456789"
MODERN, OLDER = "2025-11-25", "2025-06-18"
UNKNOWN_ID = "0123456789abcdef0123456789abcdef"
Event = dict[str, str]


# -- a raw Streamable HTTP client --------------------------------------------------------------------------------


def headers(token: str | None, session: str | None = None, *, version: str = MODERN, **extra: str) -> dict[str, str]:
    found = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    found["MCP-Protocol-Version"] = version
    if token is not None:
        found["Authorization"] = f"Bearer {token}"
    if session is not None:
        found["Mcp-Session-Id"] = session
    return found | extra


async def read_events(reply: httpx2.Response, until: Callable[[Event], bool] = lambda _: False) -> list[Event]:
    """SSE events of ``reply`` (each a dict of its fields) until one satisfies ``until`` or the stream ends."""
    events: list[Event] = []
    current: Event = {}
    async for line in reply.aiter_lines():
        if line:
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
            continue
        if current:
            events.append(current)
            if until(current):
                break
        current = {}
    return events


def answers(request_id: int) -> Callable[[Event], bool]:
    return lambda event: bool(event.get("data")) and json.loads(event["data"]).get("id") == request_id


def initialize(version: str = MODERN) -> dict[str, Any]:
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


class Client:
    """One caller's raw JSON-RPC over Streamable HTTP: ``initialize`` opens a session, then requests in it."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str | None, *, version: str = MODERN) -> None:
        self.http, self.url, self.token, self.version = http, url, token, version
        self.session: str | None = None
        self.next_id = 1

    def headers(self, **extra: str) -> dict[str, str]:
        return headers(self.token, self.session, version=self.version, **extra)

    async def open(self) -> str:
        """``initialize`` and ``notifications/initialized``; the new session's id."""
        body = initialize(self.version)
        reply = await self.http.post(self.url, headers=headers(self.token, version=self.version), json=body)
        assert reply.status_code == 200, reply.text
        self.session = reply.headers["mcp-session-id"]
        note = await self.http.post(
            self.url, headers=self.headers(), json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        assert note.status_code == 202, note.text
        return self.session

    def body(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.next_id += 1
        return self.next_id, {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}

    async def call(self, method: str, params: dict[str, Any] | None = None) -> tuple[list[Event], dict[str, Any]]:
        """A request's SSE events and its answer."""
        request_id, body = self.body(method, params or {})
        async with self.http.stream("POST", self.url, headers=self.headers(), json=body) as reply:
            assert reply.status_code == 200, await reply.aread()
            events = await read_events(reply, answers(request_id))
        return events, json.loads(events[-1]["data"])


@asynccontextmanager
async def serving(
    tmp_path: Path, *, gateway_url: str | None = None, sessions: McpSessionSettings | None = None
) -> AsyncIterator[str]:
    """``create_app`` on loopback for Alice, Bob (personal tokens) and the shared pass; its ``/mcp`` URL."""
    url = gateway_url or f"ws://127.0.0.1:{free_port()}"
    agents = parse_agents({"agents": [{"id": "main", "url": url, "password": GATEWAY_PASSWORD}]})
    service = ConnectService(agents, JobStore(tmp_path / "jobs.sqlite3"))
    await service.start()
    auth = TokenAuth(user_tokens={"Alice": ALICE, "Bob": BOB}, public_pass=PUBLIC)
    server = HttpServer(create_app(service, auth, sessions=sessions))
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()
        await service.stop()


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    async with serving(tmp_path) as value:
        yield value


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as client:
        yield client


def ping() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "ping"}


async def attempt(http: httpx2.AsyncClient, method: str, url: str, token: str | None, session: str) -> httpx2.Response:
    """One request of ``method`` naming ``session``, as an intruder would send it."""
    sent = headers(token, session)
    if method == "POST":
        return await http.post(url, headers=sent, json=ping())
    if method == "GET":
        return await http.get(url, headers=sent)
    return await http.delete(url, headers=sent)


def same_answer(one: httpx2.Response, other: httpx2.Response) -> None:
    assert (one.status_code, one.content) == (other.status_code, other.content)
    assert one.headers.get("content-type") == other.headers.get("content-type") == "application/json"
    assert "mcp-session-id" not in one.headers


# -- ownership ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "intruder"),
    [(ALICE, BOB), (ALICE, PUBLIC), (PUBLIC, ALICE)],
    ids=["token-vs-token", "token-vs-shared-pass", "shared-pass-vs-token"],
)
@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_another_callers_session_is_answered_as_an_unknown_one(
    url: str, http: httpx2.AsyncClient, owner: str, intruder: str, method: str
) -> None:
    mine = Client(http, url, owner)
    session = await mine.open()
    refused = await attempt(http, method, url, intruder, session)
    unknown = await attempt(http, method, url, intruder, UNKNOWN_ID)
    assert refused.status_code == 404
    assert refused.json() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
    same_answer(refused, unknown)
    same_answer(refused, await attempt(http, method, url, owner, UNKNOWN_ID))
    # The owner still uses it (positive control): the refused DELETE ended nothing.
    _, answer = await mine.call("tools/list")
    assert answer["result"]["tools"][0]["name"] == "run_task"


async def test_without_a_token_a_session_id_is_refused_before_it_is_looked_up(
    url: str, http: httpx2.AsyncClient
) -> None:
    session = await Client(http, url, ALICE).open()
    known, unknown = await attempt(http, "POST", url, None, session), await attempt(http, "POST", url, None, UNKNOWN_ID)
    assert known.status_code == 403
    assert (known.status_code, known.content) == (unknown.status_code, unknown.content)


async def test_the_owner_uses_posts_gets_and_deletes_its_session(url: str, http: httpx2.AsyncClient) -> None:
    alice = Client(http, url, ALICE)
    session = await alice.open()
    async with http.stream("GET", url, headers=alice.headers()) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
    deleted = await http.delete(url, headers=alice.headers())
    assert deleted.status_code == 200
    gone = await attempt(http, "POST", url, ALICE, session)
    same_answer(gone, await attempt(http, "POST", url, ALICE, UNKNOWN_ID))


async def test_the_refusal_is_the_sdks_own_answer_to_an_unknown_session(
    tmp_path: Path, url: str, http: httpx2.AsyncClient
) -> None:
    session = await Client(http, url, ALICE).open()
    ours = await attempt(http, "POST", url, BOB, session)
    agents = parse_agents({"agents": [{"id": "main", "url": f"ws://127.0.0.1:{free_port()}", "password": "p"}]})
    service = ConnectService(agents, JobStore(tmp_path / "bare" / "jobs.sqlite3"))
    bare = HttpServer(create_mcp_server(service).streamable_http_app(streamable_http_path=MCP_PATH))
    await bare.start()
    try:
        sdk = await http.post(bare.url, headers=headers(None, UNKNOWN_ID), json=ping())
    finally:
        await bare.stop()
    assert (ours.status_code, ours.content, ours.headers["content-type"]) == (
        sdk.status_code,
        sdk.content,
        sdk.headers["content-type"],
    )


# -- the bound per caller, and idle sessions -------------------------------------------------------------------------


async def test_a_caller_holds_a_bounded_number_of_sessions(tmp_path: Path, http: httpx2.AsyncClient) -> None:
    async with serving(tmp_path, sessions=McpSessionSettings(max_sessions_per_caller=2)) as url:
        first, _ = [await Client(http, url, ALICE).open() for _ in range(2)]
        refused = await http.post(url, headers=headers(ALICE), json=initialize())
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["code"], error["data"]) == (-32000, {"code": "mcp_session_limit", "limit": 2})
        assert "limit per caller" in error["message"]
        assert "mcp-session-id" not in refused.headers
        # Another caller is not held back by Alice's sessions, nor is the shared pass (positive controls).
        await Client(http, url, BOB).open()
        await Client(http, url, PUBLIC).open()
        # Ending one of hers makes room for another.
        assert (await http.delete(url, headers=headers(ALICE, first))).status_code == 200
        await Client(http, url, ALICE).open()
        assert (await http.post(url, headers=headers(ALICE), json=ping())).status_code == 429


async def test_claw_connect_http_takes_the_bound_from_its_environment(
    tmp_path: Path, http: httpx2.AsyncClient, gateway: GatewayProcess
) -> None:
    env = connect_env(gateway, MCP_USER_TOKENS=f"Alice:{ALICE}", CLAWCONNECT_MAX_SESSIONS_PER_CALLER="1")
    server = HttpConnect(tmp_path / "c", env)
    try:
        await Client(http, server.url, ALICE).open()
        refused = await http.post(server.url, headers=headers(ALICE), json=initialize())
        assert refused.status_code == 429
        assert refused.json()["error"]["data"] == {"code": "mcp_session_limit", "limit": 1}
    finally:
        assert server.close() == 0


async def test_an_idle_session_ends_and_frees_its_place(tmp_path: Path, http: httpx2.AsyncClient) -> None:
    settings = McpSessionSettings(max_sessions_per_caller=1, idle_timeout_s=0.5)
    async with serving(tmp_path, sessions=settings) as url:
        session = await Client(http, url, ALICE).open()
        opened: list[str] = []

        async def room_again() -> bool:
            reply = await http.post(url, headers=headers(ALICE), json=initialize())
            if reply.status_code == 429:
                return False
            opened.append(reply.headers["mcp-session-id"])
            return True

        await poll_until(room_again, timeout_s=10)
        gone = await attempt(http, "POST", url, ALICE, session)
        same_answer(gone, await attempt(http, "POST", url, ALICE, UNKNOWN_ID))
        assert opened[0] != session


# -- resumability -------------------------------------------------------------------------------------------------


async def test_post_streams_start_with_a_priming_event_and_every_event_has_an_id(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    async with serving(tmp_path, sessions=McpSessionSettings(sse_retry_ms=1234)) as url:
        alice = Client(http, url, ALICE)
        await alice.open()
        events, answer = await alice.call("tools/list")
        priming, *rest = events
        assert (priming["data"], priming["retry"]) == ("", "1234")
        assert priming["id"]
        assert rest
        assert all(event.get("id") for event in rest)
        assert len({event["id"] for event in events}) == len(events)
        assert answer["result"]["tools"]
        older = Client(http, url, BOB, version=OLDER)  # before 2025-11-25 a client gets no priming event
        await older.open()
        events, _ = await older.call("tools/list")
        assert all(event.get("id") and event.get("data") for event in events)


@pytest.fixture
async def gateway_url(gateway: GatewayProcess) -> str:
    return gateway.url


async def test_a_cut_post_stream_resumes_with_last_event_id(
    tmp_path: Path, http: httpx2.AsyncClient, gateway_url: str
) -> None:
    async with serving(tmp_path, gateway_url=gateway_url) as url:
        alice, bob = Client(http, url, ALICE), Client(http, url, BOB)
        await alice.open()
        await bob.open()
        call = {"name": "run_task", "arguments": {"task": "@fake delay-ms: 1500\n@fake reply: missed it"}, "task": {}}
        _, created = await alice.call("tools/call", call)
        task_id = created["result"]["task"]["taskId"]

        # tasks/result waits for the task; the stream is cut right after its priming event.
        request_id, body = alice.body("tasks/result", {"taskId": task_id})
        async with http.stream("POST", url, headers=alice.headers(), json=body) as reply:
            (priming,) = await read_events(reply, lambda event: "id" in event)
        assert priming["data"] == ""

        # Another caller naming Alice's event id in its own session replays nothing, as for an unknown id.
        for last in (priming["id"], "nope-1"):
            async with http.stream("GET", url, headers=bob.headers(**{"Last-Event-ID": last})) as theirs:
                assert theirs.status_code == 200
                assert await read_events(theirs) == []
        # Nor may it name Alice's session.
        refused = await http.get(url, headers=headers(BOB, alice.session, **{"Last-Event-ID": priming["id"]}))
        assert refused.status_code == 404

        async with (
            asyncio.timeout(30),
            http.stream("GET", url, headers=alice.headers(**{"Last-Event-ID": priming["id"]})) as resumed,
        ):
            assert resumed.status_code == 200
            events = await read_events(resumed, answers(request_id))
        result = json.loads(events[-1]["data"])["result"]
        assert result["structuredContent"]["summary"] == "missed it"
        assert all(event.get("id") for event in events)


async def test_a_cut_get_stream_resumes_with_last_event_id(
    tmp_path: Path, http: httpx2.AsyncClient, gateway_url: str
) -> None:
    async with serving(tmp_path, gateway_url=gateway_url) as url:
        alice = Client(http, url, ALICE)
        await alice.open()

        async def finished_task(reply: str) -> str:
            call = {"name": "run_task", "arguments": {"task": f"@fake reply: {reply}"}, "task": {}}
            _, created = await alice.call("tools/call", call)
            task_id: str = created["result"]["task"]["taskId"]
            await alice.call("tasks/result", {"taskId": task_id})
            return task_id

        def completed(task_id: str) -> Callable[[Event], bool]:
            def match(event: Event) -> bool:
                message: dict[str, Any] = json.loads(event.get("data") or "{}")
                params: dict[str, Any] = message.get("params", {})
                return message.get("method") == "notifications/tasks/status" and params.get("taskId") == task_id

            return match

        async with asyncio.timeout(30), http.stream("GET", url, headers=alice.headers()) as standalone:
            first = await finished_task("first")
            seen = await read_events(standalone, completed(first))
        # The standalone stream is cut; the next task's status change happens while nobody listens.
        second = await finished_task("second")
        async with (
            asyncio.timeout(30),
            http.stream("GET", url, headers=alice.headers(**{"Last-Event-ID": seen[-1]["id"]})) as resumed,
        ):
            missed = await read_events(resumed, completed(second))
        assert json.loads(missed[-1]["data"])["params"]["status"] == "completed"
        assert all(event.get("id") for event in missed)
