"""``api.runtime.subagent.run`` and friends, dispatch hooks and completion delivery, in a real gateway.

A real :class:`GatewayServer` on 127.0.0.1 with a real scripted fake model over TCP loads test plugins written to a
temporary directory; the tests call the plugins' ``api`` objects directly and watch the gateway over WebSocket.
"""

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

from clawstack.gateway.agent import MINIMAL_INSTRUCTIONS_CHARS, MINIMAL_PROMPT, AgentLoop
from clawstack.gateway.authority import (
    AuthorityRevokedError,
    ChannelIdentity,
    OperatorAuthority,
    OperatorEntry,
    Revocation,
)
from clawstack.gateway.config import parse_config
from clawstack.gateway.dispatch import GATEWAY_OPERATOR, Requester
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.plugins import (
    SUBAGENT_RUN,
    ModelOverrideRefusedError,
    PluginApi,
    PluginRetiredError,
    SubagentArgumentError,
    SubagentCancelledError,
    SubagentCompleter,
    SubagentRequesterError,
    SubagentRunner,
    SubagentRunNotFoundError,
    SubagentSessionBusyError,
    SubagentSessionForbiddenError,
    SubagentToolRefusedError,
)
from clawstack.gateway.plugins.api import PluginLifetime
from clawstack.gateway.plugins.subagent import PluginSubagent, SubagentAuthorityRevokedError
from clawstack.gateway.server import GatewayServer
from clawstack.gateway.tools import Tool, ToolRegistry
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_subagent_complete import wait_until
from tests.integration.gateway.test_ws_protocol import API_KEY, KEY, WAIT_S, config_document, connected

CHILD = "agent:main:subagent:helper"
DELEGATED = "agent:main:subagent:delegated"
LONG = "@fake delay-ms: 20000"

RUNNER_PLUGIN = """
import asyncio

captured = {}

async def progress(args):
    return "noted"

async def before(ctx):
    if ctx.message.startswith("complete-in-hook:"):
        prompt = ctx.message.removeprefix("complete-in-hook:").strip()
        captured["completion"] = asyncio.create_task(ctx.subagent.complete("main", prompt))
        captured["started"].set()
        await captured["release"].wait()
        return "Started."
    if not ctx.message.startswith("delegate:"):
        return None
    run = await ctx.subagent.run(
        session_key="agent:main:subagent:delegated",
        message=ctx.message.removeprefix("delegate:").strip(),
        completion_delivery="current-requester",
    )
    captured["run"] = run
    captured["ctx"] = ctx
    return "Delegated."

async def reply(ctx):
    if ctx.message.startswith("reply-delegate:"):
        await ctx.subagent.run(
            session_key="agent:main:subagent:never",
            message="x",
            completion_delivery="current-requester",
        )
    return None

def register(api):
    api.register_tool("runner_progress", progress, description="Report progress")
    api.register_hook("before_dispatch", before)
    api.register_hook("reply_dispatch", reply)
"""

OTHER_PLUGIN = """
async def other_tool(args):
    return "other"

def register(api):
    api.register_tool("other_tool", other_tool, description="Another plugin's tool")
"""


def write_plugin(root: Path, plugin_id: str, source: str) -> Path:
    directory = root / plugin_id
    directory.mkdir(parents=True)
    manifest = {"id": plugin_id, "version": "1.0.0", "entry": "plugin.py"}
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text(textwrap.dedent(source))
    return directory


async def core_tool(args: dict[str, Any], invocation: object = None) -> str:
    return "core"


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


def gateway_config(tmp_path: Path, base_url: str, **extra: Any) -> Any:
    document = config_document(base_url)
    document["models"]["providers"]["fake"]["models"] += [{"id": "other-model"}, {"id": "third-model"}]
    document["agents"]["defaults"]["subagents"] = {"runTimeoutSeconds": 2}
    document["plugins"] = {
        "entries": {
            "runner": {
                "trust": "trusted",
                "subagent": {"allowModelOverride": True, "allowedModels": ["fake/other-model"]},
            },
            "other": {"trust": "installed"},
        }
    }
    for key, value in extra.items():
        document[key] = value
    return parse_config(document, base_dir=tmp_path, environ={})


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    root = tmp_path / "plugins"
    paths = [write_plugin(root, "runner", RUNNER_PLUGIN), write_plugin(root, "other", OTHER_PLUGIN)]
    registry = ToolRegistry([Tool("core_tool", "A core tool", {"type": "object"}, core_tool)])
    config = gateway_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths, registry=registry) as gateway:
        yield gateway


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def api_of(server: GatewayServer, plugin_id: str) -> PluginApi:
    record = {p.id: p for p in server.plugins}[plugin_id]
    assert record.state == "loaded", record.error
    assert record.api is not None
    return record.api


def tool_names(body: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


async def test_run_wait_and_read_messages(server: GatewayServer, fake: FakeModelServer) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    assert SUBAGENT_RUN in api_of(server, "runner").runtime.capabilities
    accepted = await subagent.run(session_key="agent:Main:subagent:helper", message="@fake reply: child answer")
    assert accepted.session_key == CHILD
    result = await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)
    assert result.status == "ok"
    assert result.run_id == accepted.run_id
    assert result.terminal_reply == "child answer"
    assert result.stop_reason == "stop"
    assert result.provider_started is True
    assert result.liveness_state == "ended"
    assert result.started_at is not None
    assert result.ended_at is not None
    assert result.ended_at >= result.started_at
    assert result.timeout_phase is None
    assert (result.yielded, result.pending_error) == (None, None)

    page = await subagent.get_session_messages(CHILD, limit=10)
    assert page.total == 2
    assert [m["role"] for m in page.messages] == ["user", "assistant"]
    assert page.messages[1]["content"] == [{"type": "text", "text": "child answer"}]
    # Plugin tools never reach a run that did not ask for them; core tools do.
    surface = tool_names(fake.requests[-1].body)
    assert "core_tool" in surface
    assert "runner_progress" not in surface


async def test_wait_pending_does_not_cancel_and_a_run_timeout_is_terminal(
    server: GatewayServer, fake: FakeModelServer
) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    slow = await subagent.run(session_key=CHILD, message="@fake delay-ms: 700\n@fake reply: late")
    pending = await subagent.wait_for_run(slow.run_id, timeout_ms=50)
    assert pending.status == "pending"
    assert pending.timeout_phase == "wait"
    assert pending.liveness_state in ("queued", "running")
    assert (pending.yielded, pending.pending_error, pending.error) == (None, None, None)
    done = await subagent.wait_for_run(slow.run_id, timeout_ms=10_000)
    assert (done.status, done.terminal_reply) == ("ok", "late")

    hung = await subagent.run(session_key=CHILD, message="@fake delay-ms: 5000\n@fake reply: never")
    timed_out = await subagent.wait_for_run(hung.run_id, timeout_ms=10_000)
    assert timed_out.status == "timeout"
    assert timed_out.timeout_phase == "run"
    assert timed_out.liveness_state == "ended"
    assert timed_out.error is not None
    assert (timed_out.yielded, timed_out.pending_error) == (None, None)


async def test_a_failing_model_ends_in_error(server: GatewayServer) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    accepted = await subagent.run(session_key=CHILD, message="@fake fail: 500")
    result = await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)
    assert result.status == "error"
    assert result.stop_reason == "error"
    assert result.error
    assert result.provider_started is False
    assert (result.yielded, result.pending_error) == (None, None)


async def test_tools_also_allow_only_adds_the_plugins_own_tools(server: GatewayServer, fake: FakeModelServer) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    accepted = await subagent.run(
        session_key=CHILD, message="@fake reply: ok", tools_also_allow=["runner_progress", "runner_progress"]
    )
    assert (await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
    surface = tool_names(fake.requests[-1].body)
    assert "core_tool" in surface
    assert surface.count("runner_progress") == 1
    count = len(fake.requests)
    for name, reason in (("core_tool", "core tool"), ("other_tool", "other"), ("nosuch", "no tool")):
        with pytest.raises(SubagentToolRefusedError, match=reason):
            await subagent.run(session_key=CHILD, message="x", tools_also_allow=[name])
    for bad in ("runner_progress", ["group:fs"], [3]):
        with pytest.raises(SubagentArgumentError):
            await subagent.run(session_key=CHILD, message="x", tools_also_allow=bad)  # type: ignore[arg-type]
    with pytest.raises(SubagentArgumentError):
        await subagent.run(session_key=CHILD, message="x", tools_also_allow=["runner_progress"], disable_tools=True)
    assert len(fake.requests) == count  # refused runs call no model


async def test_operator_deny_still_applies_to_also_allowed_tools(tmp_path: Path, fake: FakeModelServer) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    config = gateway_config(tmp_path, fake.base_url, tools={"deny": ["runner_progress"]})
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        subagent = api_of(server, "runner").runtime.subagent
        accepted = await subagent.run(
            session_key=CHILD, message="@fake reply: ok", tools_also_allow=["runner_progress"]
        )
        assert (await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
        assert "runner_progress" not in tool_names(fake.requests[-1].body)


async def test_prompt_modes_and_disable_tools(server: GatewayServer, fake: FakeModelServer) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    first = await subagent.run(session_key=CHILD, message="@fake reply: first")
    await subagent.wait_for_run(first.run_id, timeout_ms=10_000)

    full = await subagent.run(session_key=CHILD, message="@fake reply: second")
    await subagent.wait_for_run(full.run_id, timeout_ms=10_000)
    messages = fake.requests[-1].body["messages"]
    # The full prompt: the workspace's bootstrap file for subagent runs (the seeded AGENTS.md), then the transcript.
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "AGENTS.md" in messages[0]["content"]

    minimal = await subagent.run(
        session_key=CHILD, message="@fake reply: third", prompt_mode="minimal", disable_tools=True
    )
    await subagent.wait_for_run(minimal.run_id, timeout_ms=10_000)
    body = fake.requests[-1].body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"].startswith(MINIMAL_PROMPT)
    assert "tools" not in body
    with pytest.raises(SubagentArgumentError):
        await subagent.run(session_key=CHILD, message="x", prompt_mode="full")  # type: ignore[arg-type]


async def test_model_override_policy(server: GatewayServer, fake: FakeModelServer) -> None:
    runner = api_of(server, "runner").runtime.subagent
    accepted = await runner.run(session_key=CHILD, message="@fake reply: ok", provider="fake", model="other-model")
    assert (await runner.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
    assert fake.requests[-1].body["model"] == "other-model"
    bare = await runner.run(session_key=CHILD, message="@fake reply: ok", model="other-model")
    assert (await runner.wait_for_run(bare.run_id, timeout_ms=10_000)).status == "ok"
    count = len(fake.requests)
    with pytest.raises(ModelOverrideRefusedError):
        await runner.run(session_key=CHILD, message="x", model="fake/fake-model")
    with pytest.raises(SubagentArgumentError):
        await runner.run(session_key=CHILD, message="x", provider="fake")
    other = api_of(server, "other").runtime.subagent
    with pytest.raises(ModelOverrideRefusedError):
        await other.run(session_key="agent:main:subagent:o", message="x", model="fake/other-model")
    assert len(fake.requests) == count


async def test_sessions_belong_to_the_plugin_that_created_them(
    server: GatewayServer, http: aiohttp.ClientSession
) -> None:
    runner = api_of(server, "runner").runtime.subagent
    other = api_of(server, "other").runtime.subagent
    client = await connected(http, server.port)
    res = await client.request("chat.send", {"sessionKey": KEY, "message": "@fake reply: hi", "idempotencyKey": "c1"})
    assert res["ok"] is True
    await client.wait_for_chat("c1", "final")

    # The main session is not a subagent key at all (see test_session_custody.py for every path).
    with pytest.raises(SubagentArgumentError):
        await runner.run(session_key=KEY, message="take over")
    with pytest.raises(SubagentArgumentError):
        await runner.get_session_messages(KEY)
    with pytest.raises(SubagentArgumentError):
        await runner.delete_session(KEY)

    accepted = await runner.run(session_key=CHILD, message="@fake reply: mine")
    with pytest.raises(SubagentRunNotFoundError):
        await other.wait_for_run(accepted.run_id, timeout_ms=0)
    with pytest.raises(SubagentRunNotFoundError):
        await runner.wait_for_run("no-such-run", timeout_ms=0)
    with pytest.raises(SubagentSessionForbiddenError):
        await other.run(session_key=CHILD, message="hijack")
    await runner.wait_for_run(accepted.run_id, timeout_ms=10_000)

    slow = await runner.run(session_key=CHILD, message="@fake delay-ms: 400\n@fake reply: slow")
    with pytest.raises(SubagentSessionBusyError):
        await runner.delete_session(CHILD)
    await runner.wait_for_run(slow.run_id, timeout_ms=10_000)
    assert await runner.delete_session(CHILD) is True
    with pytest.raises(SubagentSessionForbiddenError):
        await runner.get_session_messages(CHILD)
    # The run records outlive the deleted session.
    assert (await runner.wait_for_run(slow.run_id, timeout_ms=0)).status == "ok"
    listed = await client.request("sessions.list", {})
    assert CHILD not in [s["key"] for s in listed["payload"]["sessions"]]
    await client.ws.close()


async def test_argument_checks(server: GatewayServer) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    cases: list[dict[str, Any]] = [
        {"session_key": "", "message": "x"},
        {"session_key": "hook:mail", "message": "x"},
        {"session_key": "agent:main:bogus", "message": "x"},
        {"session_key": "agent:main:main", "message": "x"},
        {"session_key": "agent:main:channel:webhook:alice", "message": "x"},
        {"session_key": f"{CHILD}:thread:1", "message": "x"},
        {"session_key": CHILD, "message": "x", "assert_current": "captured"},
        {"session_key": CHILD, "message": ""},
        {"session_key": CHILD, "message": "x", "deliver": "yes"},
        {"session_key": CHILD, "message": "x", "disable_tools": 1},
    ]
    for kwargs in cases:
        with pytest.raises(SubagentArgumentError):
            await subagent.run(**kwargs)
    with pytest.raises(GatewayError) as unknown:
        await subagent.run(session_key="agent:nosuch:subagent:x", message="x")
    assert unknown.value.code == "agent_not_found"
    with pytest.raises(SubagentArgumentError):
        await subagent.wait_for_run("r", timeout_ms=-1)
    with pytest.raises(SubagentArgumentError):
        await subagent.get_session_messages(CHILD, limit=0)
    with pytest.raises(SubagentRequesterError):
        await subagent.run(session_key=CHILD, message="x", completion_delivery="current-requester")


async def test_before_dispatch_delegates_with_completion_delivery_to_the_requester(
    server: GatewayServer, http: aiohttp.ClientSession
) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "delegate: @fake reply: the child's result", "idempotencyKey": "d1"}
    res = await client.request("chat.send", params)
    assert res["payload"] == {"runId": "d1", "status": "started"}
    final = await client.wait_for_chat("d1", "final")
    assert final["payload"]["message"]["content"][0]["text"] == "Delegated."

    module = next(m for name, m in list(sys.modules.items()) if name.startswith("clawstack_plugin_runner_"))
    run = module.captured["run"]
    announce = await client.wait_for_chat(f"{run.run_id}:announce", "final")
    text = announce["payload"]["message"]["content"][0]["text"]
    assert text.endswith("the child's result")
    assert announce["payload"]["sessionKey"] == KEY

    history = await client.request("chat.history", {"sessionKey": KEY})
    texts = [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in history["payload"]["messages"]
    ]
    assert texts[0] == params["message"]
    assert texts[1] == "Delegated."
    assert texts[2].endswith("the child's result")

    # The request-bound runtime dies with its handler.
    with pytest.raises(PluginRetiredError):
        await module.captured["ctx"].subagent.run(session_key=CHILD, message="late")
    await client.ws.close()


async def test_reply_dispatch_cannot_deliver_to_the_requester(
    server: GatewayServer, http: aiohttp.ClientSession, fake: FakeModelServer
) -> None:
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": "reply-delegate:\n@fake reply: agent answer", "idempotencyKey": "r1"}
    await client.request("chat.send", params)
    # The hook's refused call raised; the hook is passed over and the agent answers.
    final = await client.wait_for_chat("r1", "final")
    assert final["payload"]["message"]["content"][0]["text"] == "agent answer"
    assert len(fake.requests) == 1
    await client.ws.close()


async def test_runs_in_flight_at_a_stop_end_aborted_and_are_readable_after_a_restart(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    config = gateway_config(tmp_path, fake.base_url)
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as first:
        accepted = await api_of(first, "runner").runtime.subagent.run(
            session_key=CHILD, message="@fake delay-ms: 5000\n@fake reply: never"
        )
        await asyncio.sleep(0.2)
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as second:
        result = await api_of(second, "runner").runtime.subagent.wait_for_run(accepted.run_id, timeout_ms=0)
        assert result.status == "error"
        assert result.stop_reason == "aborted"
        assert result.liveness_state == "ended"


async def test_an_operator_aborts_queued_and_running_subagent_runs(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    config = gateway_config(
        tmp_path,
        fake.base_url,
        agents={"defaults": {"model": {"primary": "fake/fake-model"}, "subagents": {"maxConcurrent": 1}}},
    )
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        subagent = api_of(server, "runner").runtime.subagent
        running = await subagent.run(session_key=CHILD, message="@fake delay-ms: 5000\n@fake reply: slow")
        queued = await subagent.run(session_key="agent:main:subagent:second", message="@fake reply: queued")
        await asyncio.sleep(0.2)
        assert (await subagent.wait_for_run(queued.run_id, timeout_ms=0)).liveness_state == "queued"
        client = await connected(http, server.port)
        res = await client.request("chat.abort", {"sessionKey": "agent:main:subagent:second"})
        assert res["payload"]["runIds"] == [queued.run_id]
        aborted = await subagent.wait_for_run(queued.run_id, timeout_ms=0)
        assert (aborted.status, aborted.stop_reason, aborted.provider_started) == ("error", "aborted", False)
        res = await client.request("chat.abort", {"sessionKey": CHILD, "runId": running.run_id})
        assert res["payload"]["aborted"] is True
        stopped = await subagent.wait_for_run(running.run_id, timeout_ms=0)
        assert (stopped.status, stopped.stop_reason) == ("error", "aborted")
        assert len(fake.requests) == 1  # the queued run never reached the model
        await client.ws.close()


async def test_the_minimal_prompt_keeps_the_agents_instructions_bounded(tmp_path: Path, fake: FakeModelServer) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    long_instructions = "Be careful. " * 1000
    config = gateway_config(
        tmp_path,
        fake.base_url,
        agents={
            "defaults": {"model": {"primary": "fake/fake-model"}},
            "entries": {"main": {"instructions": long_instructions}},
        },
    )
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        subagent = api_of(server, "runner").runtime.subagent
        minimal = await subagent.run(session_key=CHILD, message="@fake reply: ok", prompt_mode="minimal")
        await subagent.wait_for_run(minimal.run_id, timeout_ms=10_000)
        system = fake.requests[-1].body["messages"][0]["content"]
        assert system.startswith(MINIMAL_PROMPT)
        assert long_instructions[:MINIMAL_INSTRUCTIONS_CHARS] + "\n[instructions truncated]" in system
        assert len(system) < len(MINIMAL_PROMPT) + MINIMAL_INSTRUCTIONS_CHARS + 100
        full = await subagent.run(session_key=CHILD, message="@fake reply: ok")
        await subagent.wait_for_run(full.run_id, timeout_ms=10_000)
        # The full prompt: all the instructions, then the workspace's AGENTS.md.
        assert fake.requests[-1].body["messages"][0]["content"].startswith(long_instructions.rstrip())


# --------------------------------------------------------------------------------------------------------------------
# Models: the destination agent's configuration decides, and an override keeps the agent's fallbacks


async def test_an_override_must_name_a_configured_model_exactly_and_keeps_the_agents_fallbacks(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    config = gateway_config(
        tmp_path,
        fake.base_url,
        agents={
            "defaults": {"model": {"primary": "fake/fake-model", "fallbacks": ["fake/third-model", "fake/other-model"]}}
        },
        plugins={"entries": {"runner": {"subagent": {"allowModelOverride": True, "allowedModels": ["*"]}}}},
    )
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        subagent = api_of(server, "runner").runtime.subagent
        for model in ("fake/Other-Model", "fake/other-model ", "fake/missing", "nope/other-model", "other"):
            with pytest.raises(ModelOverrideRefusedError):
                await subagent.run(session_key=CHILD, message="x", model=model)
        assert fake.requests == []
        # Every model fails: the chain is the override, then the agent's fallbacks without the override again.
        failed = await subagent.run(session_key=CHILD, message="@fake fail: 500", model="fake/other-model")
        assert (await subagent.wait_for_run(failed.run_id, timeout_ms=10_000)).status == "error"
        assert [r.body["model"] for r in fake.requests] == ["other-model", "third-model"]


async def test_a_model_failure_a_fallback_takes_over_is_not_a_pending_error(tmp_path: Path) -> None:
    script = parse_script([{"fail": 500}, {"delay_ms": 600, "reply": "recovered"}])
    async with FakeModelServer(script, api_key=API_KEY) as fake:
        paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
        config = gateway_config(
            tmp_path,
            fake.base_url,
            agents={"defaults": {"model": {"primary": "fake/fake-model", "fallbacks": ["fake/third-model"]}}},
        )
        async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
            subagent = api_of(server, "runner").runtime.subagent
            accepted = await subagent.run(session_key=CHILD, message="work")
            async with asyncio.timeout(WAIT_S):
                await fake.wait_for_requests(2)  # the primary failed; the fallback is answering
            pending = await subagent.wait_for_run(accepted.run_id, timeout_ms=0)
            assert pending.status == "pending"
            assert (pending.pending_error, pending.error, pending.yielded) == (None, None, None)
            done = await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)
            assert (done.status, done.terminal_reply, done.pending_error, done.error) == ("ok", "recovered", None, None)
            assert [r.body["model"] for r in fake.requests] == ["fake-model", "third-model"]


# --------------------------------------------------------------------------------------------------------------------
# Completion delivery of children that failed or timed out


async def test_current_requester_delivery_announces_failed_and_timed_out_children(
    server: GatewayServer, http: aiohttp.ClientSession
) -> None:
    client = await connected(http, server.port)
    module = next(m for name, m in list(sys.modules.items()) if name.startswith("clawstack_plugin_runner_"))
    subagent = api_of(server, "runner").runtime.subagent
    cases = [
        ("f1", "delegate: @fake fail: 500", "failed"),
        ("t1", f"delegate: {LONG}\n@fake reply: never", "timed out"),
    ]
    for run_id, text, outcome in cases:
        await client.request("chat.send", {"sessionKey": KEY, "message": text, "idempotencyKey": run_id})
        assert (await client.wait_for_chat(run_id, "final"))["payload"]["message"]["content"][0]["text"] == "Delegated."
        child = module.captured["run"]
        result = await subagent.wait_for_run(child.run_id, timeout_ms=10_000)
        assert result.status == ("error" if outcome == "failed" else "timeout")
        assert result.error
        announce = await client.wait_for_chat(f"{child.run_id}:announce", "final")
        assert announce["payload"]["sessionKey"] == KEY
        expected = f"[{DELEGATED}] {outcome}: {result.error}"
        assert announce["payload"]["message"]["content"][0]["text"] == expected
        texts = [m.content[0]["text"] for m in server.store.history(KEY).messages if m.role == "assistant"]
        assert texts[-1] == expected
    await client.ws.close()


# --------------------------------------------------------------------------------------------------------------------
# A completion started inside a dispatch hook ends with the hook invocation


def runner_module() -> Any:
    return next(m for name, m in list(sys.modules.items()) if name.startswith("clawstack_plugin_runner_"))


async def test_a_running_completion_started_in_a_hook_is_cancelled_when_the_hook_ends(
    server: GatewayServer, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    module = runner_module()
    module.captured["release"] = release = asyncio.Event()
    module.captured["started"] = asyncio.Event()
    client = await connected(http, server.port)
    params = {"sessionKey": KEY, "message": f"complete-in-hook: {LONG}", "idempotencyKey": "h1"}
    await client.request("chat.send", params)
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    assert server.lanes.stats()["subagent"]["running"] == 1
    release.set()
    assert (await client.wait_for_chat("h1", "final"))["payload"]["message"]["content"][0]["text"] == "Started."
    with pytest.raises(SubagentCancelledError, match="invocation"):
        await module.captured["completion"]
    # The slot was held until the work's cleanup had finished; no late output was returned.
    assert server.lanes.stats()["subagent"]["running"] == 0
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_client_disconnects(1)
    await client.ws.close()


async def test_a_queued_completion_started_in_a_hook_leaves_the_queue_when_the_hook_ends(
    tmp_path: Path, fake: FakeModelServer, http: aiohttp.ClientSession
) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    config = gateway_config(
        tmp_path,
        fake.base_url,
        agents={"defaults": {"model": {"primary": "fake/fake-model"}, "subagents": {"maxConcurrent": 1}}},
    )
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        subagent = api_of(server, "runner").runtime.subagent
        hold = asyncio.Event()
        blocker = asyncio.create_task(subagent.complete("main", LONG, signal=hold))
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
        module = runner_module()
        module.captured["release"] = release = asyncio.Event()
        module.captured["started"] = started = asyncio.Event()
        client = await connected(http, server.port)
        params = {"sessionKey": KEY, "message": "complete-in-hook: @fake reply: never sent", "idempotencyKey": "h2"}
        await client.request("chat.send", params)
        async with asyncio.timeout(WAIT_S):
            await started.wait()
        await wait_until(lambda: server.lanes.stats()["subagent"]["queued"] == 1)
        release.set()
        await client.wait_for_chat("h2", "final")
        with pytest.raises(SubagentCancelledError):
            await module.captured["completion"]
        assert server.lanes.stats()["subagent"] == {"running": 1, "queued": 0, "limit": 1}
        hold.set()
        with pytest.raises(SubagentCancelledError):
            await blocker
        assert len(fake.requests) == 1  # the hook's completion never reached the model
        await client.ws.close()


# --------------------------------------------------------------------------------------------------------------------
# The plugin's lifetime is rechecked after every await


def retire_during(monkeypatch: pytest.MonkeyPatch, server: GatewayServer, method: str) -> None:
    """Reload (retire) the runner plugin while the store's ``method`` runs on its worker thread, once."""
    loop = asyncio.get_running_loop()
    store = server.store
    original = getattr(store, method)
    fired: list[bool] = []

    def during(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(True)
            assert server._plugins is not None
            loop.call_soon_threadsafe(server._plugins.reload, "runner")
        return original(*args, **kwargs)

    monkeypatch.setattr(store, method, during)


async def test_a_retirement_during_a_wait_ends_it_at_once_and_the_run_goes_on(
    server: GatewayServer, fake: FakeModelServer
) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    slow = await subagent.run(session_key=CHILD, message="@fake delay-ms: 1500\n@fake reply: done")
    waiting = asyncio.create_task(subagent.wait_for_run(slow.run_id, timeout_ms=60_000))
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    assert server._plugins is not None
    server._plugins.reload("runner")
    async with asyncio.timeout(1.0):
        with pytest.raises(PluginRetiredError):
            await waiting
    renewed = api_of(server, "runner").runtime.subagent
    assert (await renewed.wait_for_run(slow.run_id, timeout_ms=10_000)).status == "ok"


async def test_a_retirement_during_a_read_returns_nothing(
    server: GatewayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    accepted = await subagent.run(session_key=CHILD, message="@fake reply: hidden")
    await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)
    retire_during(monkeypatch, server, "history")
    with pytest.raises(PluginRetiredError):
        await subagent.get_session_messages(CHILD)


async def test_a_retirement_during_a_delete_deletes_nothing(
    server: GatewayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    accepted = await subagent.run(session_key=CHILD, message="@fake reply: kept")
    await subagent.wait_for_run(accepted.run_id, timeout_ms=10_000)
    retire_during(monkeypatch, server, "active_runs")
    with pytest.raises(PluginRetiredError):
        await subagent.delete_session(CHILD)
    assert server.store.get(CHILD) is not None
    assert (await api_of(server, "runner").runtime.subagent.get_session_messages(CHILD)).total == 2


async def test_a_retirement_while_a_run_is_admitted_is_reported_and_a_retired_api_starts_nothing(
    server: GatewayServer, fake: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    subagent = api_of(server, "runner").runtime.subagent
    retire_during(monkeypatch, server, "get_or_create")
    with pytest.raises(PluginRetiredError):
        await subagent.run(session_key=CHILD, message="@fake reply: x")
    with pytest.raises(PluginRetiredError):
        await subagent.run(session_key="agent:main:subagent:never", message="@fake reply: y")
    assert server.store.get("agent:main:subagent:never") is None


# --------------------------------------------------------------------------------------------------------------------
# assert_current: an owner-authorized command's captured authority, applied at admission

ALICE = Requester(
    "agent:main:channel:webhook:alice", "main", "webhook", True, sender_id="alice", operator="alice-admin"
)


def alice_authority() -> OperatorAuthority:
    return OperatorAuthority(
        [OperatorEntry("alice-admin", frozenset({"operator.admin"}), frozenset({ChannelIdentity("webhook", "alice")}))],
        allow_from={"webhook": ["alice"]},
    )


def authorised_runtime(server: GatewayServer, config: Any, authority: OperatorAuthority | None) -> PluginSubagent:
    """The runner plugin's ``api.runtime.subagent`` over this server's store and runs, with ``authority`` wired."""
    completer = SubagentCompleter(config, AgentLoop(config, server.store, ToolRegistry()), lanes=server.lanes)
    runner = SubagentRunner(config, server.store, server.runs, ToolRegistry(), completer, authority=authority)
    return PluginSubagent("runner", PluginLifetime("runner"), completer, runner)


async def test_assert_current_admits_while_the_authority_holds_and_refuses_once_revoked(
    tmp_path: Path, server: GatewayServer, fake: FakeModelServer
) -> None:
    authority = alice_authority()
    runtime = authorised_runtime(server, gateway_config(tmp_path, fake.base_url), authority)
    assertion = authority.capture(ALICE)
    assert assertion is not None
    accepted = await runtime.run(
        session_key=CHILD, message="@fake reply: on alice's authority", assert_current=assertion
    )
    assert authority.retained(accepted.run_id) is assertion
    assert (await runtime.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"

    authority.set_roles("alice-admin", ["operator.write"])  # demoted
    requests = len(fake.requests)
    later = "agent:main:subagent:after-demotion"
    with pytest.raises(SubagentAuthorityRevokedError, match=r"no longer holds operator\.admin") as caught:
        await runtime.run(session_key=later, message="@fake reply: refused", assert_current=assertion)
    assert caught.value.code == "requester_authority_revoked"
    assert server.store.get(later) is None  # nothing was recorded
    assert len(fake.requests) == requests
    # Restoring the role does not revive the old assertion: a fresh command is needed.
    authority.set_roles("alice-admin", ["operator.admin"])
    with pytest.raises(SubagentAuthorityRevokedError):
        await runtime.run(session_key=later, message="@fake reply: refused", assert_current=assertion)
    assert server.store.get(later) is None


async def test_assert_current_of_the_gateway_operator_survives_operator_changes(
    tmp_path: Path, server: GatewayServer, fake: FakeModelServer
) -> None:
    authority = alice_authority()
    runtime = authorised_runtime(server, gateway_config(tmp_path, fake.base_url), authority)
    owner = Requester(KEY, "main", "gateway", True, operator=GATEWAY_OPERATOR, scopes=("operator.write",))
    assertion = authority.capture(owner)
    assert assertion is not None
    authority.update([])
    accepted = await runtime.run(session_key=CHILD, message="@fake reply: owner", assert_current=assertion)
    assert (await runtime.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"


async def test_assert_current_refuses_what_this_gateway_did_not_issue(
    tmp_path: Path, server: GatewayServer, fake: FakeModelServer
) -> None:
    authority = alice_authority()
    runtime = authorised_runtime(server, gateway_config(tmp_path, fake.base_url), authority)
    foreign = alice_authority().capture(ALICE)
    assert foreign is not None
    with pytest.raises(SubagentArgumentError, match="not an authority assertion this gateway issued"):
        await runtime.run(session_key=CHILD, message="x", assert_current=foreign)
    unwired = authorised_runtime(server, gateway_config(tmp_path, fake.base_url), None)
    with pytest.raises(SubagentArgumentError, match="keeps no operator authority"):
        await unwired.run(session_key=CHILD, message="x", assert_current=foreign)
    assert server.store.get(CHILD) is None
    assert fake.requests == []


async def test_revoking_the_authority_reaches_a_queued_run_retained_under_it(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    paths = [write_plugin(tmp_path / "plugins", "runner", RUNNER_PLUGIN)]
    config = gateway_config(
        tmp_path,
        fake.base_url,
        agents={"defaults": {"model": {"primary": "fake/fake-model"}, "subagents": {"maxConcurrent": 1}}},
    )
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as server:
        authority = alice_authority()
        runtime = authorised_runtime(server, config, authority)
        assertion = authority.capture(ALICE)
        assert assertion is not None
        blocker = await runtime.run(session_key="agent:main:subagent:blocker", message=f"{LONG}\n@fake reply: b")
        queued = await runtime.run(session_key=CHILD, message="@fake reply: q", assert_current=assertion)
        assert (await runtime.wait_for_run(queued.run_id, timeout_ms=0)).liveness_state == "queued"
        heard: list[tuple[Revocation, ...]] = []
        authority.subscribe(heard.append)
        authority.unlink("alice-admin", ChannelIdentity("webhook", "alice"))
        assert [[r.work_id for r in batch] for batch in heard] == [[queued.run_id]]
        with pytest.raises(AuthorityRevokedError, match="no longer linked"):
            authority.check_retained(queued.run_id)
        authority.check_retained(blocker.run_id)  # not retained under anyone's authority
