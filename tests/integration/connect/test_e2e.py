"""ClawConnect end to end: the official MCP client (``ClientSession``) drives ``claw connect mcp`` (stdio) and
``claw connect http`` (Streamable HTTP), which talk to a real ``claw gateway serve`` over a real WebSocket, with
``claw fake-llm serve`` (the scripted model, not a language model) behind it. Every piece is its own process.

The tests that take ``peer`` run twice: against ``claw gateway serve`` and against the real OpenClaw gateway
(``scripts/openclaw-up``; those cases skip, saying why, when it is not installed, and fail instead under
``CLAWSTACK_REQUIRE_OPENCLAW=1``). They script the fake model with steps rather than ``@fake`` directives, which
never reach the model through the real gateway.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.connect.conftest import ScriptedModel
from tests.integration.connect.harness import (
    FakeModel,
    GatewayProcess,
    HttpConnect,
    call,
    connect_env,
    free_port,
    http_session,
    peer_agent,
    peer_session,
    poll_until,
    stdio_session,
    wait_terminal,
)
from tests.integration.gateway import peers

pytestmark = pytest.mark.slow
TOKEN = "alice-token-0123456789abcdef"


def requests_for(fake: FakeModel, marker: str) -> int:
    """How many model calls carried ``marker`` in their last user message."""
    count = 0
    for request in fake.chat_requests():
        users = [m for m in request["body"]["messages"] if m.get("role") == "user"]
        if users and marker in str(users[-1].get("content")):
            count += 1
    return count


async def wait_for_requests(fake: FakeModel, marker: str, n: int) -> None:
    async def enough() -> bool:
        return await asyncio.to_thread(requests_for, fake, marker) >= n

    await poll_until(enough)


async def wait_for_completions(fake: peers.FakeModel, marker: str, n: int) -> None:
    """Until ``n`` model calls carried ``marker`` in a user message."""

    async def enough() -> bool:
        return await asyncio.to_thread(fake.completions_mentioning, marker) >= n

    await poll_until(enough)


async def transcript(peer: peers.Peer, session_key: str) -> list[dict[str, Any]]:
    """The session's messages in the gateway's transcript, read as any client could (``chat.history``)."""
    async with aiohttp.ClientSession() as http:
        client = await peers.PeerClient.connected(http, peer.url, auth=peer.credentials)
        try:
            res = await client.request("chat.history", {"sessionKey": session_key})
        finally:
            await client.ws.close()
    messages: list[dict[str, Any]] = res["payload"]["messages"]
    return messages


async def wait_for_answer_in_transcript(peer: peers.Peer, session_key: str) -> None:
    """Read the gateway's transcript (as any client could) until the session has an assistant message."""
    async with aiohttp.ClientSession() as http:
        client = await peers.PeerClient.connected(http, peer.url, auth=peer.credentials)

        async def answered() -> bool:
            res = await client.request("chat.history", {"sessionKey": session_key})
            return any(m["role"] == "assistant" for m in res["payload"]["messages"])

        await poll_until(answered)
        await client.ws.close()


async def test_both_transports_serve_the_identical_tool_list(tmp_path: Path, gateway: GatewayProcess) -> None:
    env = connect_env(gateway)
    async with stdio_session(tmp_path / "stdio", env) as session:
        over_stdio = (await session.list_tools()).tools
    http = HttpConnect(tmp_path / "http", env)
    try:
        async with http_session(http.url) as session:
            over_http = (await session.list_tools()).tools
    finally:
        assert http.close() == 0
    assert [t.model_dump() for t in over_stdio] == [t.model_dump() for t in over_http]
    assert [t.name for t in over_stdio] == [
        "run_task",
        "check_task",
        "get_task",
        "list_tasks",
        "get_session",
        "list_sessions",
        "cancel_task",
    ]
    for tool in over_stdio:
        assert tool.description is not None
        assert tool.description.startswith("READ ONLY:") == (tool.name not in ("run_task", "cancel_task"))


async def test_a_task_runs_to_completion_over_stdio(
    tmp_path: Path, peer: peers.Peer, scripted_model: ScriptedModel
) -> None:
    fake = scripted_model([{"reply": "pong from the fake"}])
    async with peer_session(tmp_path / "c", peer) as session:
        job = await call(session, "run_task", {"task": "done-marker: answer pong", "senderName": "Ada"})
        assert job["status"] == "running"
        assert job["agent"] == peer_agent(peer)
        assert job["nextAction"] == {
            "tool": "check_task",
            "args": {"jobId": job["jobId"], "sessionKey": job["sessionKey"]},
        }
        snap = await wait_terminal(session, job)
        assert snap["status"] == "completed"
        assert snap["summary"] == "pong from the fake"
        assert snap["terminalReason"] == "final"
        assert snap["resultSource"] == "parent"
        assert snap["nextAction"] is None
        assert snap["agentSession"] is None
        assert snap["isError"] is False
        assert "prompt" not in snap
        prompt = await call(session, "get_task", {"taskId": job["taskId"], "detail": "prompt"})
        assert prompt["prompt"]["task"] == "done-marker: answer pong"
        assert prompt["prompt"]["senderName"] == "Ada"
    assert fake.completions_mentioning("done-marker") == 1


async def test_a_long_task_is_followed_with_check_task_waits_over_http(tmp_path: Path, gateway: GatewayProcess) -> None:
    http = HttpConnect(tmp_path / "c", connect_env(gateway, MCP_USER_TOKENS=f"Alice:{TOKEN}"))
    try:
        async with http_session(http.url, token=TOKEN) as session:
            job = await call(session, "run_task", {"task": "@fake delay-ms: 2500\n@fake reply: slow answer"})
            first = await call(session, "check_task", {**job["nextAction"]["args"], "waitMs": 1000})
            assert first["status"] == "running"
            assert first["continuePolling"] is True
            assert first["nextAction"]["tool"] == "check_task"
            seen = first["logCursor"]
            snap = await wait_terminal(session, job, wait_ms=1000)
            assert snap["summary"] == "slow answer"
            more = await call(session, "check_task", {"jobId": job["jobId"], "knownLogCount": seen, "mode": "poll"})
            assert [line["index"] for line in more["logs"]] == list(range(seen, more["logCursor"]))
            diagnostics = await call(session, "get_task", {"taskId": job["taskId"], "detail": "diagnostics"})
            assert diagnostics["diagnostics"]["caller"] == "user:Alice"
    finally:
        assert http.close() == 0


async def test_a_second_task_on_a_busy_session_is_refused(
    tmp_path: Path, peer: peers.Peer, scripted_model: ScriptedModel
) -> None:
    fake = scripted_model([{"reply": "first", "delay_ms": 1500}, {"reply": "second"}])
    async with peer_session(tmp_path / "c", peer) as session:
        job = await call(session, "run_task", {"task": "the first task"})
        refused = await call(session, "run_task", {"task": "busy-marker second", "sessionKey": job["sessionKey"]})
        assert refused["error"]["code"] == "session_busy"
        assert refused["error"]["activeJobId"] == job["jobId"]
        assert len((await call(session, "list_tasks", {"view": "all"}))["tasks"]) == 1
        assert (await wait_terminal(session, job))["summary"] == "first"
        again = await call(session, "run_task", {"task": "the second task", "sessionKey": job["sessionKey"]})
        assert (await wait_terminal(session, again))["summary"] == "second"
    assert fake.completions_mentioning("busy-marker") == 0
    assert fake.completions_mentioning("the second task") == 1


async def test_a_gateway_restart_mid_task_ends_the_task_interrupted_never_twice(
    tmp_path: Path, gateway: GatewayProcess, fake_model: FakeModel
) -> None:
    async with stdio_session(tmp_path / "c", connect_env(gateway)) as session:
        job = await call(session, "run_task", {"task": "restart-marker\n@fake delay-ms: 60000"})
        await wait_for_requests(fake_model, "restart-marker", 1)
        gateway.stop(kill=True)
        during = await call(session, "check_task", {**job["nextAction"]["args"], "waitMs": 1000})
        assert during["status"] == "running"
        assert during["liveness"] in ("reconnecting", "unreachable")
        gateway.start()
        snap = await wait_terminal(session, job)
        assert snap["status"] == "error"
        assert snap["terminalReason"] == "interrupted"
        assert snap["errorInfo"]["code"] == "run_interrupted"
        assert requests_for(fake_model, "restart-marker") == 1
        after = await call(session, "run_task", {"task": "@fake reply: back", "sessionKey": job["sessionKey"]})
        assert (await wait_terminal(session, after))["summary"] == "back"


async def test_a_connect_restart_mid_task_loses_nothing(
    tmp_path: Path, gateway: GatewayProcess, fake_model: FakeModel
) -> None:
    data = tmp_path / "c"
    env = connect_env(gateway)
    async with stdio_session(data, env) as session:
        job = await call(session, "run_task", {"task": "inflight-marker\n@fake delay-ms: 3000\n@fake reply: kept"})
        await wait_for_requests(fake_model, "inflight-marker", 1)
    async with stdio_session(data, env) as session:
        snap = await wait_terminal(session, job)
        assert snap["status"] == "completed"
        assert snap["summary"] == "kept"
        logs = (await call(session, "get_task", {"taskId": job["taskId"], "detail": "updates"}))["logs"]
        assert any(line["kind"] == "recovery" for line in logs)
    assert requests_for(fake_model, "inflight-marker") == 1


async def test_an_answer_given_while_connect_was_down_is_read_from_the_transcript(
    tmp_path: Path, peer: peers.Peer, scripted_model: ScriptedModel
) -> None:
    fake = scripted_model([{"reply": "done meanwhile", "delay_ms": 1000}])
    data = tmp_path / "c"
    async with peer_session(data, peer) as session:
        job = await call(session, "run_task", {"task": "away-marker: answer later"})
        await wait_for_completions(fake, "away-marker", 1)
    await wait_for_answer_in_transcript(peer, job["sessionKey"])
    async with peer_session(data, peer) as session:
        snap = await wait_terminal(session, job)
        assert (snap["status"], snap["terminalReason"], snap["summary"]) == (
            "completed",
            "transcript",
            "done meanwhile",
        )
    # The task reached the gateway once, and the restarted ClawConnect did not send it again: one user message
    # carries it. (Not the model's request count: the gateway calls the model again for the same run when a call
    # fails, e.g. when its connection drops, and the scripted fake gives that retry the same step.)
    users = [m for m in await transcript(peer, job["sessionKey"]) if m["role"] == "user"]
    assert ["away-marker" in json.dumps(m.get("content")) for m in users] == [True], users


async def test_bad_input_gets_structured_errors_and_stores_nothing(tmp_path: Path, gateway: GatewayProcess) -> None:
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("run_task", {}, "invalid_arguments"),
        ("run_task", {"task": 5}, "invalid_arguments"),
        ("run_task", {"task": ""}, "invalid_arguments"),
        ("run_task", {"task": "x", "agent": 1}, "invalid_arguments"),
        ("run_task", {"task": "x", "context": ["a"]}, "invalid_arguments"),
        ("run_task", {"task": "x", "sessionKey": "has spaces"}, "invalid_arguments"),
        ("run_task", {"task": "x", "senderName": True}, "invalid_arguments"),
        ("run_task", {"task": "x", "surprise": 1}, "invalid_arguments"),
        ("run_task", {"task": "x", "agent": "nobody"}, "agent_not_found"),
        ("check_task", {}, "invalid_arguments"),
        ("check_task", {"jobId": 7}, "invalid_arguments"),
        ("check_task", {"jobId": "job_x", "waitMs": "5000"}, "invalid_arguments"),
        ("check_task", {"jobId": "job_x", "mode": "forever"}, "invalid_arguments"),
        ("check_task", {"jobId": "job_x", "knownLogCount": "3"}, "invalid_arguments"),
        ("check_task", {"jobId": "job_unknown"}, "job_not_found"),
        ("get_task", {}, "invalid_arguments"),
        ("get_task", {"taskId": ["t"]}, "invalid_arguments"),
        ("get_task", {"taskId": "task_x", "detail": "everything"}, "invalid_arguments"),
        ("get_task", {"taskId": "task_unknown"}, "task_not_found"),
        ("list_tasks", {"view": "mine"}, "invalid_arguments"),
        ("list_tasks", {"view": 1}, "invalid_arguments"),
        ("get_session", {}, "invalid_arguments"),
        ("get_session", {"sessionId": 3}, "invalid_arguments"),
        ("get_session", {"sessionId": "s", "mode": "all"}, "invalid_arguments"),
        ("get_session", {"sessionId": "s", "limit": "10"}, "invalid_arguments"),
        ("get_session", {"sessionId": "s", "after": 1.5}, "invalid_arguments"),
        ("list_sessions", {"extra": True}, "invalid_arguments"),
    ]
    async with stdio_session(tmp_path / "c", connect_env(gateway)) as session:
        for name, arguments, code in bad:
            result = await call(session, name, arguments)
            assert result["error"]["code"] == code, (name, arguments, result)
        assert (await call(session, "list_tasks", {"view": "all"}))["tasks"] == []
        assert (await call(session, "list_sessions"))["sessions"] == []
        unknown = await call(session, "get_session", {"sessionId": "agent:main:nope"})
        assert unknown["found"] is False
        assert unknown["tasks"] == []


async def test_wait_ms_is_clamped(tmp_path: Path, gateway: GatewayProcess) -> None:
    async with stdio_session(tmp_path / "c", connect_env(gateway)) as session:
        job = await call(session, "run_task", {"task": "@fake delay-ms: 3000\n@fake reply: late"})
        loop = asyncio.get_running_loop()
        started = loop.time()
        short = await call(session, "check_task", {"jobId": job["jobId"], "waitMs": -50})
        assert short["status"] == "running"
        assert 0.9 <= loop.time() - started < 2.5  # -50 waits the minimum, 1000 ms
        for huge in (1e9, float("nan")):
            snap = await call(session, "check_task", {"jobId": job["jobId"], "waitMs": huge})
            assert "error" not in snap or snap["error"] is None
        assert snap["isTerminal"] is True


def test_stdio_writes_nothing_but_protocol_to_stdout(tmp_path: Path) -> None:
    """Logs (here: a gateway that cannot be reached) go to stderr; stdout carries only JSON-RPC lines."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    messages = [
        init,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run_task", "arguments": {"task": "t"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "list_tasks", "arguments": {}}},
    ]
    env = {**os.environ, "HOME": str(tmp_path), "OPENCLAW_URL": f"ws://127.0.0.1:{free_port()}"}
    argv = [sys.executable, "-m", "clawstack", "connect", "mcp", "--data-dir", str(tmp_path / "c")]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    lines = []
    for message in messages:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        if "id" in message:
            lines.append(proc.stdout.readline())
    proc.stdin.close()
    rest = proc.stdout.read()
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.wait(30) == 0
    replies = [json.loads(line) for line in lines]
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4]
    assert all(reply["jsonrpc"] == "2.0" for reply in replies)
    assert rest == ""
    assert "gateway" in stderr  # the unreachable gateway was logged, on stderr
