"""Native MCP tasks with a raw JSON-RPC client over Streamable HTTP, against ``claw connect http`` as a process and a
real gateway: the 2025-11-25 handshake declares tasks, a task-augmented ``run_task`` answers at once with a task,
``tasks/get`` and ``tasks/result`` follow it, ``tasks/cancel`` aborts a running one, a finished one cannot be
cancelled (-32602), and another caller's task is not theirs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.integration.connect.harness import GatewayProcess, HttpConnect, connect_env

ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-fedcba9876543210"
VERSION = "2025-11-25"


class Raw:
    """A JSON-RPC client session over Streamable HTTP, by hand: headers, session id, SSE or JSON answers."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str) -> None:
        self.http, self.url, self.token = http, url, token
        self.session: str | None = None
        self.next_id = 0

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}",
            "MCP-Protocol-Version": VERSION,
        }
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        return headers

    async def notify(self, method: str) -> None:
        reply = await self.http.post(self.url, headers=self._headers(), json={"jsonrpc": "2.0", "method": method})
        assert reply.status_code in (200, 202), reply.text

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        reply = await self.http.post(self.url, headers=self._headers(), json=body)
        assert reply.status_code == 200, reply.text
        self.session = reply.headers.get("mcp-session-id", self.session)
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            # A priming event (SEP-1699) has empty data.
            lines = reply.text.splitlines()
            messages = [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]
            answer = next(m for m in messages if m.get("id") == self.next_id)
        else:
            answer = reply.json()
        return answer  # type: ignore[no-any-return]

    async def initialize(self) -> dict[str, Any]:
        info = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        answer = await self.request("initialize", info)
        await self.notify("notifications/initialized")
        return answer


@pytest.fixture
async def server(tmp_path: Path, gateway: GatewayProcess) -> AsyncIterator[str]:
    http = HttpConnect(tmp_path / "c", connect_env(gateway, MCP_USER_TOKENS=f"Alice:{ALICE},Bob:{BOB}"))
    try:
        yield http.url
    finally:
        assert http.close() == 0


async def test_a_raw_client_runs_follows_and_cancels_tasks(server: str) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        alice, bob = Raw(http, server, ALICE), Raw(http, server, BOB)
        hello = await alice.initialize()
        assert hello["result"]["protocolVersion"] == VERSION
        assert hello["result"]["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
        await bob.initialize()
        tools = (await alice.request("tools/list", {}))["result"]["tools"]
        assert [t["name"] for t in tools if t.get("execution")] == ["run_task"]
        assert next(t for t in tools if t["name"] == "run_task")["execution"] == {"taskSupport": "optional"}

        call = {"name": "run_task", "arguments": {"task": "@fake reply: raw answer"}, "task": {"ttl": 60000}}
        created = (await alice.request("tools/call", call))["result"]["task"]
        assert created["status"] == "working"
        assert created["taskId"].startswith("job_")
        assert "ttl" in created
        result = (await alice.request("tasks/result", {"taskId": created["taskId"]}))["result"]
        assert result["structuredContent"]["summary"] == "raw answer"
        assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": created["taskId"]}
        done = (await alice.request("tasks/get", {"taskId": created["taskId"]}))["result"]
        assert done["status"] == "completed"
        finished = await alice.request("tasks/cancel", {"taskId": created["taskId"]})
        assert finished["error"]["code"] == -32602  # a finished task cannot be cancelled
        theirs = await bob.request("tasks/get", {"taskId": created["taskId"]})
        assert theirs["error"]["code"] == -32602  # another caller's task is not found
        assert (await bob.request("tasks/list", {}))["result"]["tasks"] == []

        slow = {"name": "run_task", "arguments": {"task": "@fake delay-ms: 30000\n@fake reply: late"}, "task": {}}
        running = (await alice.request("tools/call", slow))["result"]["task"]
        cancelled = (await alice.request("tasks/cancel", {"taskId": running["taskId"]}))["result"]
        assert cancelled["status"] == "cancelled"
        listed = (await alice.request("tasks/list", {}))["result"]["tasks"]
        assert [(t["taskId"], t["status"]) for t in listed] == [
            (running["taskId"], "cancelled"),
            (created["taskId"], "completed"),
        ]


async def test_over_stdio_a_task_survives_a_restart_of_claw_connect(tmp_path: Path, gateway: GatewayProcess) -> None:
    from tests.integration.connect.harness import stdio_session

    env = connect_env(gateway)
    call = {"name": "run_task", "arguments": {"task": "@fake delay-ms: 1500\n@fake reply: after a restart"}, "task": {}}
    async with stdio_session(tmp_path / "s", env) as session:
        created = await session._dispatcher.send_raw_request("tools/call", call, None)  # type: ignore[attr-defined]
        task_id = created["task"]["taskId"]
        assert created["task"]["status"] == "working"
    async with stdio_session(tmp_path / "s", env) as session:  # a new claw connect on the same data directory
        result = await session._dispatcher.send_raw_request("tasks/result", {"taskId": task_id}, None)  # type: ignore[attr-defined]
        assert result["structuredContent"]["summary"] == "after a restart"
        got = await session._dispatcher.send_raw_request("tasks/get", {"taskId": task_id}, None)  # type: ignore[attr-defined]
        assert got["status"] == "completed"
