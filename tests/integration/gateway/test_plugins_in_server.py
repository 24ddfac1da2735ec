"""Plugins in a real gateway server: loading at start, channel text commands over Gateway chat, capabilities.

A real :class:`GatewayServer` on 127.0.0.1 loads ``examples/plugins/hello`` and a plugin whose ``register`` raises;
the ``/hello`` command runs ``subagent.complete`` against a real scripted fake model over TCP. Other servers load
plugins that ask for command runtime capabilities, declare contracts this gateway does not support, read their
``plugins.entries.<id>.config``, and are offered capability strings by trust class.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.plugins import HOOK_AGENT_TURNS
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_ws_protocol import API_KEY, KEY, WAIT_S, config_document, connected, make_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plugins"
GREETING = "Hello, Ada! Lovely to meet you."


def broken_plugin(root: Path) -> Path:
    directory = root / "broken"
    directory.mkdir(parents=True)
    manifest = {"id": "broken", "version": "1.0.0", "entry": "plugin.py"}
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text("def register(api):\n    raise RuntimeError('boom')\n")
    return root


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    # One step only: a second completion (a second run) would find no matching step.
    script = parse_script([{"match": "greeting for this person:\nAda", "reply": GREETING}])
    async with FakeModelServer(script, api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    paths = [EXAMPLES / "hello", broken_plugin(tmp_path / "more-plugins")]
    config = make_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as gateway:
        yield gateway


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_plugins_load_and_a_failing_one_is_reported(server: GatewayServer) -> None:
    plugins = {p.id: p for p in server.plugins}
    assert set(plugins) == {"hello", "broken"}
    assert plugins["hello"].state == "loaded"
    assert plugins["hello"].code_identity is not None
    assert plugins["broken"].state == "failed"
    assert plugins["broken"].error is not None
    assert plugins["broken"].error["code"] == "plugin_load_failed"
    assert "boom" in plugins["broken"].error["message"]


async def test_hello_command_runs_once_and_is_recorded(
    server: GatewayServer, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "/hello Ada", "idempotencyKey": "run-hello-1"}
    res = await client.request("chat.send", params)
    assert res["ok"] is True, res
    assert res["payload"] == {"runId": "run-hello-1", "status": "started"}
    final = await client.wait_for_chat("run-hello-1", "final")
    assert final["payload"]["message"]["content"] == [{"type": "text", "text": GREETING}]
    assert final["payload"]["sessionKey"] == KEY
    assert len(fake.requests) == 1
    assert fake.requests[0].body["messages"][-1]["content"] == "Write a one-line greeting for this person:\nAda"
    assert "tools" not in fake.requests[0].body

    history = await client.request("chat.history", {"sessionKey": KEY})
    messages = history["payload"]["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "/hello Ada"),
        ("assistant", [{"type": "text", "text": GREETING}]),
    ]
    assert history["payload"]["sessionInfo"]["hasActiveRun"] is False

    again = await client.request("chat.send", params)
    assert again["payload"] == {"runId": "run-hello-1", "status": "ok"}
    assert len(fake.requests) == 1
    assert (await client.request("chat.history", {"sessionKey": KEY}))["payload"]["totalMessages"] == 2
    assert [e["state"] for e in client.chat_events("run-hello-1")] == ["final"]
    await client.ws.close()


async def test_unknown_command_is_an_agent_turn(server: GatewayServer, http: aiohttp.ClientSession) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "/nosuch thing\n@fake reply: plain turn", "idempotencyKey": "run-x"}
    res = await client.request("chat.send", params)
    assert res["payload"]["status"] == "started"
    final = await client.wait_for_chat("run-x", "final")
    assert final["payload"]["message"]["content"][0]["text"] == "plain turn"
    await client.ws.close()


async def test_command_errors(tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    plugin = tmp_path / "cmds" / "cmds"
    plugin.mkdir(parents=True)
    (plugin / "claw.plugin.json").write_text(json.dumps({"id": "cmds", "version": "1.0.0", "entry": "plugin.py"}))
    (plugin / "plugin.py").write_text(
        "async def ping(ctx):\n    return 'pong'\n\n"
        "async def crash(ctx):\n    raise ValueError('secret detail')\n\n"
        "def register(api):\n"
        "    api.register_command('ping', ping, description='Ping')\n"
        "    api.register_command('crash', crash, description='Crash', accepts_args=True)\n"
    )
    config = make_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin]) as server:
        client = await connected(http, server.port)
        refused = await client.request(
            "chat.send", {"sessionKey": KEY, "message": "/ping now", "idempotencyKey": "run-args"}
        )
        assert refused["ok"] is False
        assert refused["error"]["code"] == "INVALID_REQUEST"
        assert "takes no arguments" in refused["error"]["message"]

        ok = await client.request("chat.send", {"sessionKey": KEY, "message": "/ping", "idempotencyKey": "run-ping"})
        assert ok["payload"]["status"] == "started"
        final = await client.wait_for_chat("run-ping", "final")
        assert final["payload"]["message"]["content"] == [{"type": "text", "text": "pong"}]

        res = await client.request("chat.send", {"sessionKey": KEY, "message": "/crash x", "idempotencyKey": "run-c"})
        assert res["payload"]["status"] == "started"
        error = await client.wait_for_chat("run-c", "error")
        assert error["payload"]["errorKind"] == "plugin_command_failed"
        assert "ValueError" in error["payload"]["errorMessage"]
        assert "secret detail" not in error["payload"]["errorMessage"]
        again = await client.request("chat.send", {"sessionKey": KEY, "message": "/crash x", "idempotencyKey": "run-c"})
        assert again["payload"] == {"runId": "run-c", "status": "error"}
        await client.ws.close()
    assert len(fake.requests) == 0


def serve_with_plugins(config_path: Path, data_dir: Path, plugins: list[Path]) -> tuple[str, str, int]:
    """Start ``claw gateway serve --plugins …``, read its readiness line, stop it: (line, stderr, exit code)."""
    code = "import sys; from clawstack.cli.gateway import gateway; gateway(sys.argv[1:])"
    args = ["serve", "--config", str(config_path), "--data-dir", str(data_dir)]
    for path in plugins:
        args += ["--plugins", str(path)]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return line, stderr, proc.returncode


async def test_serve_plugins_option_logs_failed_plugins(tmp_path: Path, fake: FakeModelServer) -> None:
    config_path = tmp_path / "gateway.json5"
    config_path.write_text(json.dumps(config_document(fake.base_url)))
    plugins = [EXAMPLES / "hello", broken_plugin(tmp_path / "more-plugins")]
    line, stderr, code = await asyncio.to_thread(serve_with_plugins, config_path, tmp_path / "data", plugins)
    assert line.startswith("gateway listening on ws://127.0.0.1:"), (line, stderr)
    assert code == 0
    assert "plugin broken failed: [plugin_load_failed]" in stderr
    assert "plugin hello failed" not in stderr


CAPABILITY_PLUGIN = """
from clawstack.gateway.plugins import CommandCapabilityError

async def review(ctx):
    native = ctx.runtime_context.subagents
    if native is None:
        return "Native review is unavailable for this request."
    return "native review started"

async def settings(ctx):
    return "greeting=" + str(CONFIG.get("greeting")) + " tags=" + ",".join(CONFIG.get("tags", ()))

def register(api):
    global CONFIG
    CONFIG = api.plugin_config
    api.register_command("review-pr", review, description="Launch a native review", runtime_capabilities=["subagents"])
    try:
        api.register_command(
            "review-later", review, description="Schedule", runtime_capabilities=["subagents", "scheduledTurns"]
        )
    except CommandCapabilityError:
        api.register_command("review-later", review, description="Schedule (variant)", runtime_capabilities=["subagents"])
    api.register_command("settings", settings, description="Show the plugin's config")
"""


def plugin_dir(root: Path, plugin_id: str, source: str, contracts: dict[str, Any] | None = None) -> Path:
    directory = root / plugin_id
    directory.mkdir(parents=True)
    manifest: dict[str, Any] = {"id": plugin_id, "version": "1.0.0", "entry": "plugin.py"}
    if contracts is not None:
        manifest["contracts"] = contracts
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text(textwrap.dedent(source))
    return directory


async def test_command_capabilities_as_the_spec_writes_them(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    contracts = {
        "subagentProfiles": ["reviewer"],
        "commandRuntimeCapabilities": ["subagents", "scheduledTurns"],
        "sessionScheduledTurns": ["requester-command"],
    }
    plugin = plugin_dir(tmp_path / "plugins", "reviews", CAPABILITY_PLUGIN, contracts)
    document = config_document(fake.base_url)
    document["plugins"] = {"entries": {"reviews": {"config": {"greeting": "hi", "tags": ["a", "b"]}}}}
    config = parse_config(document, base_dir=tmp_path, environ={})
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin]) as server:
        record = {p.id: p for p in server.plugins}["reviews"]
        assert record.state == "loaded", record.error
        assert [w.split(":")[0] for w in record.warnings] == ["contracts.sessionScheduledTurns"]
        client = await connected(http, server.port)
        for run_id, message, answer in (
            # An owner's actual command with current authority gets native children (the spec's example).
            ("run-review", "/review-pr", "native review started"),
            ("run-later", "/review-later", "native review started"),
            ("run-settings", "/settings", "greeting=hi tags=a,b"),
        ):
            res = await client.request("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": run_id})
            assert res["ok"] is True, res
            final = await client.wait_for_chat(run_id, "final")
            assert final["payload"]["message"]["content"] == [{"type": "text", "text": answer}]
        assert record.api is not None
        later = {c.name: c for c in record.api.commands}["review-later"]
        assert later.description == "Schedule (variant)"
        await client.ws.close()
    assert len(fake.requests) == 0


async def test_capability_strings_follow_the_trust_class(tmp_path: Path, fake: FakeModelServer) -> None:
    quiet = "def register(api):\n    pass\n"
    root = tmp_path / "plugins"
    paths = [plugin_dir(root, name, quiet) for name in ("core", "official", "random")]
    document = config_document(fake.base_url)
    document["plugins"] = {"entries": {"core": {"trust": "bundled"}, "official": {"trust": "trusted"}}}
    config = parse_config(document, base_dir=tmp_path, environ={})
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        apis = {p.id: p.api for p in server.plugins}
        for plugin_id in ("core", "official", "random"):
            assert apis[plugin_id] is not None
        assert HOOK_AGENT_TURNS in apis["core"].runtime.capabilities  # type: ignore[union-attr]
        assert HOOK_AGENT_TURNS in apis["official"].runtime.capabilities  # type: ignore[union-attr]
        installed = apis["random"].runtime.capabilities  # type: ignore[union-attr]
        assert HOOK_AGENT_TURNS not in installed
        assert {"subagent.complete", "subagent.run"} <= installed
