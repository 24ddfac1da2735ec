"""The agent-session seam end to end: ``claw connect mcp`` and ``claw connect http`` load a host module named by
``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES``; a task carrying a marker is attached, the marker never reaches the
agent (read back from the gateway's own transcript), and the answer of the attached session is recovered when
the gateway's agent gives none. Every piece is its own process; the model is ``claw fake-llm serve``."""

from __future__ import annotations

import json
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
    stdio_session,
    wait_terminal,
)
from tests.integration.gateway.test_ws_protocol import connected

pytestmark = pytest.mark.slow

HOST_MODULE = '''
"""A host module for the test: sessions live in a JSON file the test writes."""
import json
import os
import time


async def inspect(ref, options):
    with open(os.environ["E2E_RUNTIME_STATE"]) as handle:
        sessions = json.load(handle)
    reply = sessions.get(ref.session_id)
    if reply is None:
        return None
    return {**reply, "lastEventAt": time.time()}


def register_agent_session_runtimes(registry):
    registry.register("e2e-runtime", provider="scripted", inspect=inspect)
'''

SECRET_SESSION = "sess-e2e-7f3a"


def marker(**extra: Any) -> str:
    body = {"runtime": "e2e-runtime", "sessionId": SECRET_SESSION, "state": "running", **extra}
    return "<agent-session>" + json.dumps(body) + "</agent-session>"


def host_env(tmp_path: Path, gateway: GatewayProcess, sessions: dict[str, Any]) -> dict[str, str]:
    module = tmp_path / "host_runtime.py"
    module.write_text(HOST_MODULE)
    state = tmp_path / "sessions.json"
    state.write_text(json.dumps(sessions))
    broken = tmp_path / "broken_runtime.py"
    broken.write_text("raise RuntimeError('a broken host module')\n")
    return connect_env(
        gateway,
        CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES=f"{broken},{module}",
        E2E_RUNTIME_STATE=str(state),
    )


async def transcript(gateway: GatewayProcess, session_key: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        client = await connected(http, gateway.port, auth={"password": GATEWAY_PASSWORD})
        try:
            res = await client.request("chat.history", {"sessionKey": session_key})
        finally:
            await client.ws.close()
    messages: list[dict[str, Any]] = res["payload"]["messages"]
    return messages


async def test_a_marked_task_is_attached_and_the_agent_never_sees_the_marker(
    tmp_path: Path, gateway: GatewayProcess, fake_model: FakeModel
) -> None:
    sessions = {SECRET_SESSION: {"state": "completed", "finalResponse": "answer from the managed session"}}
    env = host_env(tmp_path, gateway, sessions)
    async with stdio_session(tmp_path / "c", env) as session:
        context = f"Some background.\n{marker(metadata={'ticket': 'T-1'})}\nMore background."
        job = await call(session, "run_task", {"task": "@fake empty", "context": context})
        snap = await wait_terminal(session, job)
        assert snap["status"] == "completed"
        assert snap["summary"] == "answer from the managed session"
        assert snap["resultSource"] == "agent-session"
        attached = snap["agentSession"]
        assert (attached["runtime"], attached["sessionId"], attached["provider"]) == (
            "e2e-runtime",
            SECRET_SESSION,
            "scripted",
        )
        assert (attached["state"], attached["status"], attached["metadata"]) == (
            "completed",
            "current",
            {"ticket": "T-1"},
        )
        got = await call(session, "get_session", {"sessionId": job["sessionKey"]})
        assert got["agentSession"]["attachmentId"] == attached["attachmentId"]
    messages = await transcript(gateway, job["sessionKey"])
    text = json.dumps(messages)
    assert "Some background." in text
    assert "agent-session" not in text
    assert SECRET_SESSION not in text
    assert SECRET_SESSION not in json.dumps(fake_model.chat_requests())


async def test_over_http_and_without_the_runtime(tmp_path: Path, gateway: GatewayProcess) -> None:
    env = host_env(tmp_path, gateway, {SECRET_SESSION: {"state": "needs_input", "latestResponse": "which one?"}})
    http = HttpConnect(tmp_path / "h", env)
    try:
        async with http_session(http.url) as session:
            job = await call(session, "run_task", {"task": "@fake empty", "context": marker()})
            snap = await wait_terminal(session, job)
            assert snap["agentSession"]["state"] == "needs_input"
            assert snap["summary"].startswith("Action required (needs_input)")
            assert snap["resultSource"] is None
    finally:
        assert http.close() == 0
    # The same data directory without the host module (the same open endpoint's caller): the record reads back
    # unavailable/unknown_runtime.
    again = HttpConnect(tmp_path / "h", connect_env(gateway))
    try:
        async with http_session(again.url) as session:
            await without_the_runtime(session, job)
    finally:
        assert again.close() == 0
    # Over stdio, the operator is another caller: the anonymous caller's task is not theirs to read.
    async with stdio_session(tmp_path / "h", connect_env(gateway)) as session:
        refused = await call(session, "check_task", {"jobId": job["jobId"], "mode": "poll"})
        assert refused["error"]["code"] == "job_not_found"


async def without_the_runtime(session: ClientSession, job: dict[str, Any]) -> None:
    snap = await call(session, "check_task", {"jobId": job["jobId"], "mode": "poll"})
    assert snap["status"] == "completed_no_summary"
    assert snap["agentSession"]["state"] == "unavailable"
    assert snap["agentSession"]["lastReportedState"] == "needs_input"
    assert snap["agentSession"]["lastError"]["code"] == "unknown_runtime"
    fresh = await call(session, "run_task", {"task": "@fake reply: normal", "context": marker()})
    done = await wait_terminal(session, fresh)
    assert (done["status"], done["summary"], done["resultSource"]) == ("completed", "normal", "parent")
