"""One protocol test script, run unchanged against ``claw gateway serve`` and against the real OpenClaw gateway.

Each peer runs as a process (started once per module: the real gateway takes about 10 s to accept connections)
with the same offline config, and a ``claw fake-llm serve`` process on a fixed port behind it. Every test starts
its own fake model on that port with the script it needs (the real gateway appends context of its own after the
user's message, so ``@fake`` directives in a chat message never reach the fake; script steps do), and counts the
model requests through ``/_fake/requests``.

The assertions are what both peers share. Where the real gateway sends more keys than clawstack, only the shared
keys are checked; where the two differ in a way the reference does not settle, a comment says what is left open.

The ``openclaw`` cases need ``scripts/openclaw-up``: they skip (saying so) when it has not run, and fail instead
when ``CLAWSTACK_REQUIRE_OPENCLAW=1`` (CI).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from tests.integration.gateway.peers import (
    MODEL,
    PROVIDER,
    TOKEN,
    FakeModel,
    Peer,
    PeerClient,
    connect_params,
    free_port,
    openclaw_marks,
    running_peer,
    start_fake_model,
)

PEERS = [pytest.param("claw", id="claw"), pytest.param("openclaw", id="openclaw", marks=openclaw_marks())]

REPLY = "pong from fake"
MAIN_KEY = "agent:main:main"


@pytest.fixture(scope="module")
def model_port() -> int:
    return free_port()


@pytest.fixture(scope="module", params=PEERS)
def peer(request: pytest.FixtureRequest, model_port: int) -> Iterator[Peer]:
    with running_peer(request.param, model_port) as gateway:
        yield gateway


@pytest.fixture
def model(peer: Peer, model_port: int) -> Iterator[Callable[[list[dict[str, Any]]], FakeModel]]:
    """Start the fake model behind ``peer`` with a script (a list of steps); stopped after the test."""
    started: list[FakeModel] = []

    def start(script: list[dict[str, Any]]) -> FakeModel:
        fake = start_fake_model(peer.workdir / "fake-llm.log", port=model_port, script=script)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def new_session_key() -> str:
    """A session of its own for each test: the peer lives for the whole module."""
    return f"agent:main:main:thread:{uuid.uuid4().hex}"


async def wait_for_model_requests(fake: FakeModel, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(await asyncio.to_thread(fake.requests)) < count:
        assert time.monotonic() < deadline, f"the model did not get {count} request(s)"
        await asyncio.sleep(0.05)


# -- handshake ---------------------------------------------------------------------------------------------------


async def test_challenge_is_the_first_frame(peer: Peer, http: aiohttp.ClientSession) -> None:
    client = await PeerClient.open(http, peer.url)
    challenge = client.challenge
    assert challenge is not None
    assert (challenge["type"], challenge["event"]) == ("event", "connect.challenge")
    assert "seq" not in challenge
    assert set(challenge["payload"]) == {"nonce", "ts", "capabilities"}
    uuid.UUID(challenge["payload"]["nonce"])
    assert isinstance(challenge["payload"]["ts"], int)
    # The real gateway lists capabilities of its own (model-catalog-snapshot); clawstack has none to offer.
    assert isinstance(challenge["payload"]["capabilities"], list)
    await client.ws.close()


async def test_connect_with_token_answers_hello_ok(peer: Peer, http: aiohttp.ClientSession) -> None:
    client = await PeerClient.open(http, peer.url)
    res = await client.request("connect", connect_params())
    assert res["type"] == "res"
    assert res["ok"] is True
    hello = res["payload"]
    assert hello["type"] == "hello-ok"
    assert hello["protocol"] == 4
    assert isinstance(hello["server"]["version"], str)
    uuid.UUID(hello["server"]["connId"])
    assert {"chat.send", "chat.history", "chat.abort", "sessions.list"} <= set(hello["features"]["methods"])
    events = {"connect.challenge", "chat", "chat.metadata.changed", "agent", "tick"}
    assert events <= set(hello["features"]["events"])
    assert hello["snapshot"]["sessionDefaults"]["mainSessionKey"] == MAIN_KEY
    assert hello["snapshot"]["sessionDefaults"]["defaultAgentId"] == "main"
    # The real gateway adds a recoveryScope to auth, and attachment and sharing limits to policy.
    auth = hello["auth"]
    assert (auth["method"], auth["role"]) == ("token", "operator")
    assert auth["scopes"] == ["operator.read", "operator.write", "operator.admin"]
    policy = hello["policy"]
    assert {"maxPayload", "maxBufferedBytes", "tickIntervalMs"} <= set(policy)
    assert all(
        isinstance(policy[k], int) and policy[k] > 0 for k in ("maxPayload", "maxBufferedBytes", "tickIntervalMs")
    )
    await client.ws.close()


async def test_wrong_token_is_refused_and_closed_1008(peer: Peer, http: aiohttp.ClientSession) -> None:
    client = await PeerClient.open(http, peer.url)
    res = await client.request("connect", connect_params(auth={"token": "wrong-token"}))
    assert res["ok"] is False
    error = res["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert error["message"].startswith("unauthorized: gateway token mismatch")
    assert error["details"] == {
        "code": "AUTH_TOKEN_MISMATCH",
        "authReason": "token_mismatch",
        "canRetryWithDeviceToken": False,
        "recommendedNextStep": "update_auth_credentials",
    }
    assert TOKEN not in json.dumps(res)
    assert await client.wait_for_close() == 1008


async def test_protocol_mismatch_is_refused_and_closed(peer: Peer, http: aiohttp.ClientSession) -> None:
    client = await PeerClient.open(http, peer.url)
    res = await client.request("connect", connect_params(minProtocol=1, maxProtocol=3))
    assert res["ok"] is False
    error = res["error"]
    assert (error["code"], error["message"]) == ("INVALID_REQUEST", "protocol mismatch")
    assert error["details"] == {
        "code": "PROTOCOL_MISMATCH",
        "clientMinProtocol": 1,
        "clientMaxProtocol": 3,
        "expectedProtocol": 4,
        "minimumProbeProtocol": 3,
    }
    # The reference document says close 1000; the real gateway 2026.9.6 closes with 1002, and so do we.
    assert await client.wait_for_close() == 1002


async def test_unknown_client_id_is_refused(peer: Peer, http: aiohttp.ClientSession) -> None:
    client = await PeerClient.open(http, peer.url)
    unknown = {"id": "ocprobe", "mode": "cli", "version": "0.1.0", "platform": "linux"}
    res = await client.request("connect", connect_params(client=unknown))
    assert res["error"] == {
        "code": "INVALID_REQUEST",
        "message": "invalid connect params: at /client/id: must be equal to one of the allowed values",
    }
    await client.wait_for_close()


async def test_scopeless_client_gets_missing_scope(peer: Peer, http: aiohttp.ClientSession) -> None:
    test_client = {"id": "test", "mode": "test", "version": "0.1.0", "platform": "linux"}
    client = await PeerClient.connected(http, peer.url, client=test_client)
    res = await client.request("chat.history", {"sessionKey": MAIN_KEY, "limit": 1})
    assert res["ok"] is False
    assert res["error"] == {
        "code": "FORBIDDEN",
        "message": "missing scope: operator.read",
        "details": {"code": "MISSING_SCOPE", "missingScope": "operator.read", "requiredScopes": ["operator.read"]},
    }
    await client.ws.close()


async def test_unknown_method_is_an_error_and_the_connection_stays(peer: Peer, http: aiohttp.ClientSession) -> None:
    client = await PeerClient.connected(http, peer.url)
    res = await client.request("nope.nothing", {})
    assert res["ok"] is False
    assert res["error"] == {"code": "INVALID_REQUEST", "message": "unknown method: nope.nothing"}
    assert (await client.request("sessions.list", {}))["ok"] is True
    await client.ws.close()


# -- chat --------------------------------------------------------------------------------------------------------


async def test_chat_send_runs_once_per_idempotency_key(
    peer: Peer, http: aiohttp.ClientSession, model: Callable[[list[dict[str, Any]]], FakeModel]
) -> None:
    # The model waits a little, so that the run is surely in flight when the key comes again.
    fake = model([{"reply": REPLY, "delay_ms": 1000}, {"reply": "a second run"}])
    client = await PeerClient.connected(http, peer.url)
    key, run_id = new_session_key(), str(uuid.uuid4())
    params = {"sessionKey": key, "message": f"ping {run_id}", "idempotencyKey": run_id}
    first = await client.request("chat.send", params)
    assert first["payload"] == {"runId": run_id, "status": "started"}
    again = await client.request("chat.send", params)
    assert again["payload"] == {"runId": run_id, "status": "in_flight"}
    final = await client.wait_for_chat(run_id, "final", "error", "aborted")
    assert final["payload"]["state"] == "final", final
    after = await client.request("chat.send", params)
    if peer.name == "openclaw":
        # The real gateway sends the final event before its dedupe entry records the end: under load a replay
        # right after it may still answer in_flight (the same run, never a second one) for a moment.
        async with asyncio.timeout(10):
            while after["payload"] == {"runId": run_id, "status": "in_flight"}:
                await asyncio.sleep(0.1)
                after = await client.request("chat.send", params)
    assert after["payload"] == {"runId": run_id, "status": "ok"}
    # The same key with another message is a conflict, never a second run.
    conflict = await client.request("chat.send", {**params, "message": f"pong {run_id}"})
    assert conflict["ok"] is False
    assert conflict["error"]["code"] == "INVALID_REQUEST"
    assert conflict["error"]["details"]["reason"] == "chat-request-conflict"
    assert await asyncio.to_thread(fake.completions_mentioning, run_id) == 1
    assert len([c for c in client.run_events("chat", run_id) if c["state"] == "final"]) == 1
    await client.ws.close()


async def test_chat_events_history_and_sessions(
    peer: Peer, http: aiohttp.ClientSession, model: Callable[[list[dict[str, Any]]], FakeModel]
) -> None:
    fake = model([{"reply": REPLY}])
    client = await PeerClient.connected(http, peer.url)
    key, run_id = new_session_key(), str(uuid.uuid4())
    message = f"ping {run_id}"
    res = await client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": run_id})
    assert res["payload"] == {"runId": run_id, "status": "started"}
    await client.wait_for_chat(run_id, "final", "error", "aborted")
    assert len(await asyncio.to_thread(fake.requests)) == 1

    # Frames: every event but the challenge has the connection's seq, 1, 2, 3, …
    seqs = [f["seq"] for f in client.events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

    chats = client.run_events("chat", run_id)
    for chat in chats:
        assert {"runId", "sessionKey", "agentId", "seq", "state"} <= set(chat)
        assert (chat["sessionKey"], chat["agentId"]) == (key, "main")
        assert isinstance(chat["seq"], int)
    states = [c["state"] for c in chats]
    assert states[-1] == "final"
    assert set(states) == {"status", "delta", "final"}
    # The real gateway also reports preparing_workspace, which clawstack has no step for.
    phases = [c["phase"] for c in chats if c["state"] == "status"]
    assert {"preparing_context", "starting_model"} <= set(phases)

    deltas = [c for c in chats if c["state"] == "delta"]
    # How the text is cut into deltas is each peer's own (clawstack: one per streamed chunk; OpenClaw coalesces).
    assert "".join(d["deltaText"] for d in deltas) == REPLY
    so_far = ""
    for delta in deltas:
        so_far += delta["deltaText"]
        assert delta["message"]["role"] == "assistant"
        assert delta["message"]["content"] == [{"type": "text", "text": so_far}]
        assert isinstance(delta["message"]["timestamp"], int)
    final = chats[-1]
    assert final["stopReason"] == "stop"
    assert final["message"]["role"] == "assistant"
    assert final["message"]["content"] == [{"type": "text", "text": REPLY}]
    assert isinstance(final["message"]["timestamp"], int)

    agent = client.run_events("agent", run_id)
    for event in agent:
        assert {"runId", "sessionKey", "agentId", "stream", "data", "seq", "ts"} <= set(event)
        assert (event["sessionKey"], event["agentId"]) == (key, "main")
    assert {"run_status", "lifecycle", "assistant", "usage"} <= {a["stream"] for a in agent}
    statuses = [a["data"]["phase"] for a in agent if a["stream"] == "run_status"]
    assert statuses == phases
    # The real gateway reports a second "model" phase (provider null) between finishing and end.
    lifecycle = [a["data"] for a in agent if a["stream"] == "lifecycle"]
    names = [d["phase"] for d in lifecycle]
    assert (names[0], names[-1]) == ("start", "end")
    assert names.index("model") < names.index("finishing") < len(names) - 1
    model_phase = lifecycle[names.index("model")]
    assert (model_phase["provider"], model_phase["model"]) == (PROVIDER, MODEL)
    assert lifecycle[-1]["terminalReply"] == {"disposition": "visible", "text": REPLY}
    assistant = [a["data"] for a in agent if a["stream"] == "assistant"]
    assert assistant[-1]["text"] == REPLY
    assert "".join(a["delta"] for a in assistant) == REPLY
    (usage,) = [a["data"] for a in agent if a["stream"] == "usage"]
    assert usage["outputTokens"] == len(REPLY.split())
    # chat.metadata.changed: clawstack sends one at the start of every run; the real gateway sends it when its
    # chat metadata changes, which is not on every run. Only its shape is shared.
    for frame in client.events:
        if frame["event"] == "chat.metadata.changed":
            assert frame["payload"] == {}

    history = await client.request("chat.history", {"sessionKey": key, "limit": 20})
    page = history["payload"]
    assert page["sessionKey"] == key
    uuid.UUID(page["sessionId"])
    assert (page["hasMore"], page["totalMessages"]) == (False, 2)
    info = page["sessionInfo"]
    assert (info["key"], info["hasActiveRun"], info["activeRunIds"]) == (key, False, [])
    user, answer = page["messages"]
    assert (user["role"], user["content"], user["idempotencyKey"]) == ("user", message, f"{run_id}:user")
    assert isinstance(user["timestamp"], int)
    assert (answer["role"], answer["content"]) == ("assistant", [{"type": "text", "text": REPLY}])
    assert (answer["provider"], answer["model"], answer["api"], answer["stopReason"]) == (
        PROVIDER,
        MODEL,
        "openai-completions",
        "stop",
    )
    assert isinstance(answer["timestamp"], int)
    # The real gateway adds cacheRead, cacheWrite and cost; its prompt is far larger, so input counts differ.
    assert answer["usage"]["output"] == len(REPLY.split())
    assert answer["usage"]["totalTokens"] == answer["usage"]["input"] + answer["usage"]["output"]

    listing = await client.request("sessions.list", {"limit": 100})
    sessions = listing["payload"]
    assert isinstance(sessions["ts"], int)
    assert sessions["count"] == len(sessions["sessions"])
    (row,) = [s for s in sessions["sessions"] if s["key"] == key]
    assert (row["agentId"], row["sessionId"], row["hasActiveRun"]) == ("main", page["sessionId"], False)
    assert isinstance(row["createdAt"], int)
    assert isinstance(row["updatedAt"], int)
    assert row["updatedAt"] >= row["createdAt"]
    # row["kind"] differs: the real gateway says "direct" for this key, clawstack names the key's own kind.
    await client.ws.close()


async def test_chat_abort_of_a_slow_run(
    peer: Peer, http: aiohttp.ClientSession, model: Callable[[list[dict[str, Any]]], FakeModel]
) -> None:
    fake = model([{"reply": "never", "delay_ms": 60000}, {"reply": "a second run"}])
    client = await PeerClient.connected(http, peer.url)
    key, run_id = new_session_key(), str(uuid.uuid4())
    params = {"sessionKey": key, "message": f"slow {run_id}", "idempotencyKey": run_id}
    assert (await client.request("chat.send", params))["payload"] == {"runId": run_id, "status": "started"}
    await wait_for_model_requests(fake, 1)

    res = await client.request("chat.abort", {"sessionKey": key})
    assert res["payload"] == {"ok": True, "aborted": True, "runIds": [run_id]}
    aborted = await client.wait_for_chat(run_id, "final", "error", "aborted")
    assert aborted["payload"]["state"] == "aborted"
    assert (aborted["payload"]["sessionKey"], aborted["payload"]["agentId"]) == (key, "main")
    # stopReason: clawstack says "aborted", the real gateway "rpc" (aborted by a request).
    assert isinstance(aborted["payload"]["stopReason"], str)
    assert not [c for c in client.run_events("chat", run_id) if c["state"] in ("final", "delta")]

    history = await client.request("chat.history", {"sessionKey": key, "limit": 20})
    assert history["payload"]["sessionInfo"]["hasActiveRun"] is False
    assert [m["role"] for m in history["payload"]["messages"]] == ["user"]
    nothing = await client.request("chat.abort", {"sessionKey": key})
    assert nothing["payload"] == {"ok": True, "aborted": False, "runIds": []}
    # The same key again never starts a second run. Its status differs: clawstack answers "aborted"; the real
    # gateway "timeout", with summary "aborted".
    again = await client.request("chat.send", params)
    assert again["payload"]["runId"] == run_id
    assert again["payload"]["status"] in ("aborted", "timeout")
    assert len(await asyncio.to_thread(fake.requests)) == 1
    await client.ws.close()
