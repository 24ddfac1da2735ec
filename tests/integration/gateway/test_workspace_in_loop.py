"""The core workspace tools as agents call them: each agent works in its own workspace, its bootstrap files reach
its prompt, and a blind child sees its workspace only as ``<workspace>``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_ws_protocol import API_KEY, Client, config_document, connected


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[GatewayServer, FakeModelServer, Client, Path]]:
    async with FakeModelServer(api_key=API_KEY) as fake:
        document = config_document(fake.base_url)
        document["agents"]["list"] = [
            {"id": "main", "default": True, "workspace": str(tmp_path / "ws-main")},
            {"id": "ops", "workspace": str(tmp_path / "ws-ops")},
        ]
        config = parse_config(document, base_dir=tmp_path, environ={})
        async with GatewayServer(config, data_dir=tmp_path / "data") as server, aiohttp.ClientSession() as http:
            yield server, fake, await connected(http, server.port), tmp_path


async def turn(client: Client, key: str, message: str, idem: str) -> list[dict[str, Any]]:
    res = await client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": idem})
    async with asyncio.timeout(20):
        await client.wait_for_chat(res["payload"]["runId"], "final", "error")
    history = await client.request("chat.history", {"sessionKey": key, "limit": 100})
    return [m["content"][0] for m in history["payload"]["messages"] if m["role"] == "tool"]


async def test_each_agent_works_in_its_own_workspace(gateway: Any) -> None:
    _server, fake, client, tmp_path = gateway
    (tmp_path / "ws-ops").mkdir(exist_ok=True)
    (tmp_path / "ws-ops" / "AGENTS.md").write_text("OPS-RULES: keep it short.\n")
    fake.add_script_steps(
        parse_script(
            [
                {
                    "match_user": "OPS-1",
                    "tool_calls": [
                        {"name": "write", "arguments": {"path": "note.txt", "content": "from ops"}},
                        {"name": "exec", "arguments": {"command": "pwd; cat note.txt; ls /work 2>&1 | head -1"}},
                        {"name": "read", "arguments": {"path": "../ws-main/AGENTS.md"}},
                    ],
                },
                {"match_user": "OPS-1", "reply": "done"},
            ]
        )
    )
    write, run, escape = await turn(client, "agent:ops:main", "OPS-1 work", "ops-1")
    assert write["isError"] is False
    assert (tmp_path / "ws-ops" / "note.txt").read_text() == "from ops"
    assert not (tmp_path / "ws-main" / "note.txt").exists()
    assert str(tmp_path / "ws-ops") in run["text"]
    assert "from ops" in run["text"]
    assert escape["isError"] is True
    system = fake.requests[0].body["messages"][0]["content"]
    assert "OPS-RULES: keep it short." in system


async def test_a_blind_child_sees_its_workspace_as_a_placeholder(gateway: Any) -> None:
    _server, fake, client, tmp_path = gateway
    fake.add_script_steps(
        parse_script(
            [
                {
                    "match_user": "PARENT-B",
                    "tool_calls": [{"name": "sessions_spawn", "arguments": {"task": "CHILD-B look", "blind": True}}],
                },
                {"match_user": "CHILD-B", "tool_calls": [{"name": "exec", "arguments": {"command": "pwd"}}]},
                {"match_user": "CHILD-B", "reply": "looked"},
                {"match_user": "PARENT-B", "reply": "spawned"},
            ]
        )
    )
    [receipt] = await turn(client, "agent:main:main", "PARENT-B spawn blind", "blind-1")
    child_key = json.loads(receipt["text"])["childSessionKey"]
    async with asyncio.timeout(20):
        while True:
            history = await client.request("chat.history", {"sessionKey": child_key})
            tools = [m for m in history["payload"]["messages"] if m["role"] == "tool"]
            if tools:
                break
            await asyncio.sleep(0.05)
    text = tools[0]["content"][0]["text"]
    assert "<workspace>" in text
    assert str(tmp_path) not in text
    child_requests = [
        r for r in fake.requests if any("[Subagent Task]" in str(m.get("content")) for m in r.body["messages"])
    ]
    assert len(child_requests) == 2  # the exec call, then the answer
    for request in child_requests:
        sent = json.dumps(request.body["messages"])
        assert str(tmp_path) not in sent
        assert child_key not in sent
        assert "agent:main:main" not in sent
