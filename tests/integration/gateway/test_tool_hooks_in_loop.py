"""Plugin tool hooks on the agent loop's real tool calls: a block never runs the tool, a rewrite is what runs, a
rewrite that breaks the tool's schema is refused, and ``after_tool_call`` sees every result."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_ws_protocol import API_KEY, config_document, connected

KEY = "agent:main:main"

HOOK_PLUGIN = """
from clawstack.gateway.plugins import BeforeToolCallResult

async def before(event):
    if event.tool_name == "sessions_spawn":
        return BeforeToolCallResult(block=True, block_reason="spawning is off here")
    if event.tool_name == "sessions_history" and event.params.get("limit") == 1:
        return BeforeToolCallResult(params={"limit": "many"})
    if event.tool_name == "sessions_history":
        return BeforeToolCallResult(params={"limit": 2})
    return None

def register(api):
    async def after(event):
        seen = await api.store.get("seen", [])
        await api.store.set("seen", [*seen, [event.tool_name, event.params, event.error is None]])

    api.register_hook("before_tool_call", before)
    api.register_hook("after_tool_call", after)
"""


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[GatewayServer, FakeModelServer]]:
    plugin = tmp_path / "plugins" / "hooker"
    plugin.mkdir(parents=True)
    (plugin / "claw.plugin.json").write_text(json.dumps({"id": "hooker", "version": "1.0.0", "entry": "plugin.py"}))
    (plugin / "plugin.py").write_text(textwrap.dedent(HOOK_PLUGIN))
    async with FakeModelServer(api_key=API_KEY) as fake:
        config = parse_config(config_document(fake.base_url), base_dir=tmp_path, environ={})
        async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin]) as server:
            yield server, fake


async def test_hooks_block_rewrite_and_observe_real_tool_calls(gateway: tuple[GatewayServer, FakeModelServer]) -> None:
    server, fake = gateway
    calls = [
        {"name": "sessions_spawn", "arguments": {"task": "never spawned"}},
        {"name": "sessions_history", "arguments": {"limit": 50}},
        {"name": "sessions_history", "arguments": {"limit": 1}},
    ]
    fake.add_script_steps(parse_script([{"tool_calls": calls}, {"reply": "done"}]))
    async with aiohttp.ClientSession() as http:
        client = await connected(http, server.port)
        res = await client.request("chat.send", {"sessionKey": KEY, "message": "go", "idempotencyKey": "hooks-1"})
        async with asyncio.timeout(20):
            await client.wait_for_chat(res["payload"]["runId"], "final", "error")
        history = await client.request("chat.history", {"sessionKey": KEY})
    tools = [m["content"][0] for m in history["payload"]["messages"] if m["role"] == "tool"]
    blocked, rewritten, invalid = tools
    assert blocked["isError"] is True
    assert "spawning is off here" in blocked["text"]
    assert rewritten["isError"] is False
    assert len(json.loads(rewritten["text"])["messages"]) <= 2
    assert invalid["isError"] is True
    assert server._children is not None
    assert server._children.for_parent(KEY) == []  # the blocked spawn never ran
    api: Any = next(p for p in server.plugins if p.id == "hooker").api
    # Only the call that ran is observed, with the parameters it ran with; blocked and refused calls never ran.
    assert await api.store.get("seen") == [["sessions_history", {"limit": 2}, True]]
