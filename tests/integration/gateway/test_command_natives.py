"""``ctx.runtime_context.subagents``: native children of a command that asked for them, in a real gateway."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.plugins.api import PluginRetiredError
from clawstack.gateway.plugins.native_facade import COMMAND_CAPABILITY
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_native_facade import KEY, STEPS, WAIT_S, Gateway, make_config
from tests.integration.gateway.test_subagent_complete import wait_until
from tests.integration.gateway.test_ws_protocol import API_KEY, Client, connected

PLUGIN = (
    STEPS
    + """
import json

captured = {}


async def review(ctx):
    native = ctx.runtime_context.subagents
    captured.setdefault("natives", []).append(native)
    if native is None:
        return "unavailable"
    return json.dumps(await run_steps(native, json.loads(ctx.args)["steps"]))


def register(api):
    api.register_command(
        "review", review, description="Review natively", accepts_args=True, runtime_capabilities=["subagents"]
    )
    api.register_command(
        "open-review", review, description="No auth", require_auth=False, accepts_args=True,
        runtime_capabilities=["subagents"],
    )
    api.register_command("plain", review, description="No capability", accepts_args=True)
"""
)


def write_plugin(root: Path) -> Path:
    directory = root / "commander"
    directory.mkdir(parents=True)
    manifest = {
        "id": "commander",
        "version": "1.0.0",
        "entry": "plugin.py",
        "contracts": {"commandRuntimeCapabilities": ["subagents"]},
    }
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text("MARK = 'commander'\n" + textwrap.dedent(PLUGIN))
    return directory


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


async def open_gateway(tmp_path: Path, fake: FakeModelServer, **extra: Any) -> tuple[GatewayServer, Client, Any]:
    config = make_config(tmp_path, fake.base_url, **extra)
    server = GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[write_plugin(tmp_path / "plugins")])
    await server.start()
    http = aiohttp.ClientSession()
    return server, await connected(http, server.port), http


def module() -> Any:
    return next(m for m in sys.modules.values() if getattr(m, "MARK", None) == "commander")


def steps(*items: dict[str, Any]) -> str:
    return json.dumps({"steps": list(items)})


async def test_an_owners_command_spawns_and_collects(tmp_path: Path, fake: FakeModelServer) -> None:
    server, client, http = await open_gateway(tmp_path, fake)
    try:
        gateway = Gateway(server, fake, client)
        record = {p.id: p for p in server.plugins}["commander"]
        assert record.api is not None
        assert COMMAND_CAPABILITY in record.api.runtime.capabilities
        spawn = {"op": "spawn", "args": {"task": "@fake reply: reviewed", "request_id": "review"}}
        collect = {"op": "collect", "args": {"ids": ["$0"], "await_results": True}}
        accepted, collected = json.loads(await gateway.say("/review " + steps(spawn, collect)))
        assert accepted["request_id"] == "review"
        assert collected["results"][0]["result"] == "reviewed"
        # The command text is the turn's input, recorded once; the reply adds only the response.
        history = await client.request("chat.history", {"sessionKey": KEY, "limit": 50})
        messages = history["payload"]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        # A later command in the same parent incarnation lists and collects what the first one accepted.
        listed, again = json.loads(
            await gateway.say(
                "/review "
                + steps({"op": "list"}, {"op": "collect", "args": {"ids": [accepted["run_id"]], "timeout_seconds": 0}})
            )
        )
        assert [entry["run_id"] for entry in listed] == [accepted["run_id"]]
        assert again["results"][0]["status"] == "done"
        # The facade ended with its command.
        kept = module().captured["natives"][0]
        with pytest.raises(PluginRetiredError):
            await kept.list()
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


async def test_commands_without_the_capability_or_auth_get_none(tmp_path: Path, fake: FakeModelServer) -> None:
    server, client, http = await open_gateway(tmp_path, fake)
    try:
        gateway = Gateway(server, fake, client)
        assert await gateway.say("/open-review " + steps()) == "unavailable"
        assert await gateway.say("/plain " + steps()) == "unavailable"
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()
    assert not any(r.path.endswith("/chat/completions") for r in fake.requests)


async def test_a_tool_policy_without_the_collector_means_no_facade(tmp_path: Path, fake: FakeModelServer) -> None:
    server, client, http = await open_gateway(tmp_path, fake, tools={"deny": ["sessions_spawn"]})
    try:
        assert await Gateway(server, fake, client).say("/review " + steps()) == "unavailable"
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


async def test_stop_aborts_a_command_waiting_on_its_children(tmp_path: Path, fake: FakeModelServer) -> None:
    server, client, http = await open_gateway(tmp_path, fake)
    try:
        spawn = {"op": "spawn", "args": {"task": "@fake delay-ms: 20000\n@fake reply: late"}}
        join = {"op": "collect", "args": {"ids": ["$0"], "await_results": True}}
        sent = await client.request(
            "chat.send", {"sessionKey": KEY, "message": "/review " + steps(spawn, join), "idempotencyKey": "long"}
        )
        assert sent["ok"], sent
        run_id = sent["payload"]["runId"]
        await wait_until(lambda: bool(module().captured.get("natives")), steps=100_000)
        started = asyncio.get_running_loop().time()
        stop = await client.request("chat.send", {"sessionKey": KEY, "message": "/stop", "idempotencyKey": "stop"})
        assert stop["ok"], stop
        async with asyncio.timeout(WAIT_S):
            ended = await client.wait_for_chat(run_id, "aborted", "final", "error")
        assert ended["payload"]["state"] == "aborted"
        assert asyncio.get_running_loop().time() - started < 10  # not the child's 20 s
        with pytest.raises(PluginRetiredError):
            await module().captured["natives"][-1].list()
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()
