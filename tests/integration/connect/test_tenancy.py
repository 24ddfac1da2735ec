"""Tenancy end to end: two real callers (personal tokens) and the shared pass on one ``claw connect http`` in front
of one ``claw gateway serve``; each caller reaches only what is its own, and the gateway's operator keeps theirs.

Every refusal has its positive control (the owner can), and a foreign key reads exactly as one that does not exist.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp.client.session import ClientSession

from tests.integration.connect.harness import (
    GATEWAY_PASSWORD,
    FakeModel,
    GatewayProcess,
    HttpConnect,
    call,
    connect_env,
    http_session,
    wait_terminal,
)
from tests.integration.gateway.peers import PeerClient

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-fedcba9876543210"
SHARED = "shared-pass-0123456789"
PLUGIN = """
from pathlib import Path

def register(api):
    async def note(ctx):
        Path(MARKER).write_text(ctx.args or "ran")
        return "noted"

    api.register_command("note", note, description="Writes a marker file", require_auth=True, accepts_args=True)
"""
OPERATOR_KEY = "agent:main:main"
FOREIGN_KEYS = (OPERATOR_KEY, "agent:main:webhook:hook-1", "agent:main:channel:clawconnect:never-created")


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "note-ran"


@pytest.fixture
def gateway(tmp_path: Path, fake_model: FakeModel, marker: Path) -> Iterator[GatewayProcess]:
    plugin = tmp_path / "plugins" / "notes"
    plugin.mkdir(parents=True)
    (plugin / "claw.plugin.json").write_text(json.dumps({"id": "notes", "version": "1.0.0", "entry": "plugin.py"}))
    (plugin / "plugin.py").write_text(f"MARKER = {str(marker)!r}\n" + PLUGIN)
    process = GatewayProcess(tmp_path, fake_model, plugin_paths=[plugin])
    process.start()
    try:
        yield process
    finally:
        process.stop()


def start_connect(tmp_path: Path, gateway: GatewayProcess) -> HttpConnect:
    env = connect_env(gateway, MCP_USER_TOKENS=f"Alice:{ALICE},Bob:{BOB}", PUBLIC_MCP_PASS=SHARED)
    return HttpConnect(tmp_path / "connect", env)


@pytest.fixture
def connect(tmp_path: Path, gateway: GatewayProcess) -> Iterator[HttpConnect]:
    server = start_connect(tmp_path, gateway)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def operator(gateway: GatewayProcess) -> AsyncIterator[PeerClient]:
    """The gateway's own operator, on an admin connection: the owner of ``agent:main:main``."""
    async with aiohttp.ClientSession() as http:
        client = await PeerClient.connected(http, gateway.url, auth={"password": GATEWAY_PASSWORD})
        try:
            yield client
        finally:
            await client.ws.close()


async def operator_says(client: PeerClient, text: str) -> None:
    started = await client.request(
        "chat.send", {"sessionKey": OPERATOR_KEY, "message": text, "idempotencyKey": f"op-{len(text)}-{text[-6:]}"}
    )
    assert started["ok"] is True, started
    await client.wait_for_chat(started["payload"]["runId"], "final", "error")


async def transcript(client: PeerClient, key: str = OPERATOR_KEY) -> str:
    """The session's incarnation and full transcript, as one canonical string."""
    history = await client.request("chat.history", {"sessionKey": key, "limit": 1000})
    assert history["ok"] is True, history
    payload = history["payload"]
    return json.dumps([payload["sessionId"], payload["messages"], payload["totalMessages"]], sort_keys=True)


async def run(session: ClientSession, **arguments: Any) -> dict[str, Any]:
    job = await call(session, "run_task", arguments)
    assert "error" not in job, job
    return await wait_terminal(session, job)


async def refused(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await call(session, tool, arguments)
    assert "error" in result, result
    error: dict[str, Any] = result["error"]
    return error


async def test_callers_short_names_are_their_own_sessions(connect: HttpConnect, fake_model: FakeModel) -> None:
    async with http_session(connect.url, token=ALICE) as alice, http_session(connect.url, token=BOB) as bob:
        hers = await run(alice, task="@fake reply: the-alice-secret", sessionKey="review")
        his = await run(bob, task="@fake reply: bob-answer", sessionKey="review")
        assert hers["sessionKey"] != his["sessionKey"]
        # Bob's turn ran in a gateway session of its own: Alice's history never reached his model context.
        bobs_request = fake_model.chat_requests()[-1]
        assert "bob-answer" in json.dumps(bobs_request)
        assert "the-alice-secret" not in json.dumps(bobs_request)
        again = await run(alice, task="@fake reply: more", sessionKey="review")  # the owner continues hers
        assert again["sessionKey"] == hers["sessionKey"]
        assert "the-alice-secret" in json.dumps(fake_model.chat_requests()[-1])


async def test_no_caller_reaches_a_session_it_does_not_own(
    tmp_path: Path, gateway: GatewayProcess, connect: HttpConnect, operator: PeerClient, marker: Path
) -> None:
    await operator_says(operator, "@fake reply: the operator's own words")
    before = await transcript(operator)
    async with (
        http_session(connect.url, token=ALICE) as alice,
        http_session(connect.url, token=BOB) as bob,
        http_session(connect.url, token=SHARED) as shared,
    ):
        hers = await run(alice, task="@fake reply: hers")
        for session in (bob, shared):
            for key in (*FOREIGN_KEYS, hers["sessionKey"]):
                for task in ("/reset", "/note foreign", "@fake reply: hijack"):
                    error = await refused(session, "run_task", {"task": task, "sessionKey": key})
                    assert (error["code"], error["field"]) == ("session_not_found", "sessionKey")
        for key in FOREIGN_KEYS:  # Alice owns her session, not the gateway's others
            error = await refused(alice, "run_task", {"task": "/reset", "sessionKey": key})
            assert error["code"] == "session_not_found"
        # Nothing reached the gateway: the operator's transcript is unchanged byte for byte, no command ran.
        assert await transcript(operator) == before
        assert not await asyncio.to_thread(marker.exists)
        assert (await transcript(operator, hers["sessionKey"])).count("hers") >= 1
        # The positive controls: Alice continues her own session, and the operator runs the plugin command.
        again = await run(alice, task="@fake reply: hers again", sessionKey=hers["sessionKey"])
        assert (again["status"], again["summary"]) == ("completed", "hers again")
    started = await operator.request(
        "chat.send", {"sessionKey": OPERATOR_KEY, "message": "/note by-the-operator", "idempotencyKey": "op-note"}
    )
    assert started["ok"] is True, started
    await operator.wait_for_chat(started["payload"]["runId"], "final")
    assert await asyncio.to_thread(marker.read_text) == "by-the-operator"


async def test_through_clawconnect_no_caller_resets_or_runs_owner_commands(
    connect: HttpConnect, operator: PeerClient, marker: Path
) -> None:
    """ClawConnect holds no ``operator.admin``: even in a caller's own session, ``/reset`` and an auth-requiring
    plugin command are refused by the gateway (a bare message), or reach the model as text (an identified caller's
    message names its sender first); either way the session keeps its incarnation and transcript."""
    async with http_session(connect.url, token=SHARED) as shared, http_session(connect.url, token=ALICE) as alice:
        for session in (shared, alice):
            first = await run(session, task="@fake reply: keep me")
            key = first["sessionKey"]
            before = json.loads(await transcript(operator, key))
            statuses = [(await run(session, task=task, sessionKey=key))["status"] for task in ("/reset", "/note mine")]
            after = json.loads(await transcript(operator, key))
            assert after[0] == before[0]  # the same incarnation: no reset
            assert after[1][: len(before[1])] == before[1]  # the transcript only grew
            if session is shared:
                assert statuses == ["error", "error"]  # refused by the gateway: missing scope operator.admin
                assert after == before
            kept = await run(session, task="@fake reply: still here", sessionKey=key)
            assert kept["status"] == "completed"
    assert not await asyncio.to_thread(marker.exists)


async def test_reads_answer_only_from_the_callers_own_records(connect: HttpConnect) -> None:
    async with http_session(connect.url, token=ALICE) as alice, http_session(connect.url, token=BOB) as bob:
        hers = await run(alice, task="@fake reply: private", sessionKey="notes")
        mine = await run(bob, task="@fake reply: his")
        unknown_job = await refused(bob, "check_task", {"jobId": "job_doesnotexist", "mode": "poll"})
        foreign_job = await refused(bob, "check_task", {"jobId": hers["jobId"], "mode": "poll"})
        assert {**foreign_job, "message": ""} == {**unknown_job, "message": ""}
        assert foreign_job["message"] == unknown_job["message"]
        for tool, arguments in (
            ("get_task", {"taskId": hers["taskId"], "detail": "full"}),
            ("cancel_task", {"jobId": hers["jobId"]}),
        ):
            error = await refused(bob, tool, arguments)
            assert error["code"] in ("task_not_found", "job_not_found")
        for mode in ("snapshot", "events", "tail", "tasks"):
            foreign = await call(bob, "get_session", {"sessionId": hers["sessionKey"], "mode": mode})
            missing = await call(bob, "get_session", {"sessionId": hers["sessionKey"] + "0", "mode": mode})
            assert {**foreign, "sessionId": ""} == {**missing, "sessionId": ""}
            assert foreign["found"] is False
        assert (await call(alice, "get_session", {"sessionId": hers["sessionKey"]}))["found"] is True
        assert (await call(alice, "get_session", {"sessionId": "notes"}))["found"] is True  # her short name
        assert (await call(bob, "get_session", {"sessionId": "notes"}))["found"] is False
        listed = await call(bob, "list_tasks", {"view": "all"})
        assert [t["jobId"] for t in listed["tasks"]] == [mine["jobId"]]
        sessions = await call(bob, "list_sessions", {})
        assert [s["sessionKey"] for s in sessions["sessions"]] == [mine["sessionKey"]]
        prompt = await call(alice, "get_task", {"taskId": hers["taskId"], "detail": "prompt"})
        assert prompt["prompt"]["senderName"] == "Alice"


async def test_a_restart_keeps_every_owner_record(tmp_path: Path, gateway: GatewayProcess) -> None:
    first = start_connect(tmp_path, gateway)
    try:
        async with http_session(first.url, token=ALICE) as alice:
            hers = await run(alice, task="@fake reply: before", sessionKey="review")
    finally:
        first.close()
    second = start_connect(tmp_path, gateway)
    try:
        async with http_session(second.url, token=ALICE) as alice, http_session(second.url, token=BOB) as bob:
            error = await refused(bob, "run_task", {"task": "x", "sessionKey": hers["sessionKey"]})
            assert error["code"] == "session_not_found"
            assert (await call(bob, "get_session", {"sessionId": hers["sessionKey"]}))["found"] is False
            again = await run(alice, task="@fake reply: after", sessionKey="review")
            assert again["sessionKey"] == hers["sessionKey"]
            assert (await call(alice, "get_task", {"taskId": hers["taskId"]}))["taskId"] == hers["taskId"]
    finally:
        second.close()
