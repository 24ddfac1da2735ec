"""``api.runtime.subagent.complete`` against the real scripted fake model over TCP.

Each case loads a real plugin directory with a real :class:`PluginLoader`, calls ``complete`` through the plugin's
``api``, and checks what the fake model received (or never received) and the state of the shared ``subagent``
lane. No fixed sleeps: waits are on the fake's request log or on lane state, each bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from clawstack.gateway.agent import AgentLoop, UnknownAgentError
from clawstack.gateway.config import GatewayConfig, parse_config
from clawstack.gateway.plugins import (
    CommandContext,
    CompletionUsage,
    ModelOverrideRefusedError,
    PluginApi,
    PluginLoader,
    PluginRetiredError,
    SubagentArgumentError,
    SubagentCancelledError,
    SubagentCompleter,
    SubagentModelError,
    SubagentTimeoutError,
)
from clawstack.gateway.plugins.api import PluginLifetime
from clawstack.gateway.plugins.complete import detached, invocation_scope
from clawstack.gateway.sessions import SessionStore
from clawstack.gateway.tools import Tool, ToolRegistry
from clawstack.llm.fake import FakeModelServer

API_KEY = "sk-subagent-complete-test"
INSTRUCTIONS = "You are the research agent."
WAIT_S = 10.0
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plugins"
LONG = "@fake delay-ms: 20000"


def make_config(
    tmp_path: Path,
    base_url: str,
    *,
    max_concurrent: int = 8,
    policy: dict[str, Any] | None = None,
    fallbacks: tuple[str, ...] = (),
) -> GatewayConfig:
    models = [{"id": "primary"}, {"id": "backup"}, {"id": "third"}]
    document: dict[str, Any] = {
        "models": {"providers": {"fake": {"baseUrl": base_url, "apiKey": API_KEY, "models": models}}},
        "agents": {
            "defaults": {
                "model": {"primary": "fake/primary", "fallbacks": list(fallbacks)},
                "subagents": {"maxConcurrent": max_concurrent},
            },
            "entries": {"main": {"default": True}, "research": {"instructions": INSTRUCTIONS}},
        },
        "gateway": {"port": 0, "auth": {"mode": "token", "token": "gateway-token"}},
        "plugins": {"entries": {"demo": {"subagent": policy}}} if policy is not None else {},
    }
    return parse_config(document, base_dir=tmp_path, environ={})


class Gateway:
    """The parts of a gateway a plugin's completion touches, wired for real."""

    def __init__(self, tmp_path: Path, fake: FakeModelServer, store: SessionStore, **config: Any) -> None:
        self.config = make_config(tmp_path, fake.base_url, **config)
        schema = {"type": "object", "properties": {}}

        async def echo(arguments: dict[str, Any], invocation: object = None) -> str:
            return "echo"

        # A registered tool, so that "no tools were sent" means something.
        self.loop = AgentLoop(self.config, store, ToolRegistry([Tool("echo", "Echo.", schema, echo)]))
        self.completer = SubagentCompleter(self.config, self.loop)
        plugin = tmp_path / "plugins" / "demo"
        plugin.mkdir(parents=True)
        (plugin / "claw.plugin.json").write_text(json.dumps({"id": "demo", "version": "1.0.0", "entry": "plugin.py"}))
        (plugin / "plugin.py").write_text("def register(api):\n    pass\n")
        self.loader = PluginLoader(self.config, search_paths=[tmp_path / "plugins", EXAMPLES], completer=self.completer)
        self.loader.load()
        api = self.loader.get("demo").api
        assert api is not None
        self.api: PluginApi = api

    def lane(self) -> dict[str, int]:
        return self.completer.lanes.stats()["subagent"]


async def wait_until(predicate: Callable[[], bool], *, steps: int = 1000) -> None:
    """Yield to the loop until ``predicate`` holds; fail after ``steps`` iterations (no wall-clock sleep)."""
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SessionStore]:
    with SessionStore(tmp_path / "sessions.sqlite3") as opened:
        yield opened


@pytest.fixture
async def gateway(tmp_path: Path, fake: FakeModelServer, store: SessionStore) -> AsyncIterator[Gateway]:
    gw = Gateway(tmp_path, fake, store)
    async with gw.loop:
        yield gw


async def make_gateway(tmp_path: Path, fake: FakeModelServer, store: SessionStore, **config: Any) -> Gateway:
    return Gateway(tmp_path, fake, store, **config)


async def test_complete_returns_the_answer_with_instructions_and_no_tools(
    gateway: Gateway, fake: FakeModelServer
) -> None:
    result = await gateway.api.runtime.subagent.complete(
        "research", "Summarise the notes.\n@fake reply: Short summary.", extra_system_prompt="Be concise."
    )
    assert result.text == "Short summary."
    assert result.model == "fake/primary"
    assert isinstance(result.usage, CompletionUsage)
    [request] = fake.requests
    body = request.body
    assert body["model"] == "primary"
    assert body["messages"] == [
        {"role": "system", "content": INSTRUCTIONS + "\n\nBe concise."},
        {"role": "user", "content": "Summarise the notes.\n@fake reply: Short summary."},
    ]
    assert "tools" not in body
    assert "tool_choice" not in body
    assert gateway.lane() == {"running": 0, "queued": 0, "limit": 8}


async def test_complete_without_instructions_sends_only_the_user_message(
    gateway: Gateway, fake: FakeModelServer
) -> None:
    result = await gateway.api.runtime.subagent.complete("main", "@fake reply: ok")
    assert result.text == "ok"
    assert fake.requests[0].body["messages"] == [{"role": "user", "content": "@fake reply: ok"}]


async def test_model_tool_calls_are_not_run(gateway: Gateway, fake: FakeModelServer) -> None:
    result = await gateway.api.runtime.subagent.complete("research", "@fake tool-call: echo {}")
    assert result.text == ""
    assert len(fake.requests) == 1  # no second round: nothing was executed


async def test_unknown_agent(gateway: Gateway, fake: FakeModelServer) -> None:
    with pytest.raises(UnknownAgentError):
        await gateway.api.runtime.subagent.complete("nobody", "hello")
    assert fake.requests == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"agent_id": "", "message": "x"}, "agent_id must be a non-empty string"),
        ({"agent_id": "research", "message": "  "}, "message must be a non-empty string"),
        ({"agent_id": "research", "message": "x", "timeout_ms": 0}, "timeout_ms"),
        ({"agent_id": "research", "message": "x", "timeout_ms": 1.5}, "timeout_ms"),
        ({"agent_id": "research", "message": "x", "timeout_ms": True}, "timeout_ms"),
        ({"agent_id": "research", "message": "x", "model": 3}, "model must be a string"),
        ({"agent_id": "research", "message": "x", "extra_system_prompt": 3}, "extra_system_prompt"),
        ({"agent_id": "research", "message": "x", "signal": object()}, "signal must be an asyncio.Event"),
    ],
)
async def test_bad_arguments(gateway: Gateway, fake: FakeModelServer, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SubagentArgumentError, match=message) as caught:
        await gateway.api.runtime.subagent.complete(**kwargs)
    assert caught.value.code == "subagent_invalid_argument"
    assert fake.requests == []


# --------------------------------------------------------------------------------------------------------------------
# Model policy


async def test_model_override_refused_without_policy(gateway: Gateway, fake: FakeModelServer) -> None:
    with pytest.raises(ModelOverrideRefusedError, match="allowModelOverride is not true") as caught:
        await gateway.api.runtime.subagent.complete("research", "hello", model="fake/backup")
    assert caught.value.code == "subagent_model_refused"
    assert fake.requests == []


@pytest.mark.parametrize(
    ("policy", "model", "message"),
    [
        ({"allowModelOverride": False, "allowedModels": ["*"]}, "fake/backup", "allowModelOverride is not true"),
        ({"allowModelOverride": True}, "fake/backup", "not in plugins.entries.demo.subagent.allowedModels"),
        ({"allowModelOverride": True, "allowedModels": ["fake/primary"]}, "fake/backup", "allowedModels"),
        ({"allowModelOverride": True, "allowedModels": ["*"]}, "backup", "canonical provider/model"),
    ],
)
async def test_model_override_outside_policy_is_refused(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore, policy: dict[str, Any], model: str, message: str
) -> None:
    gw = await make_gateway(tmp_path, fake, store, policy=policy)
    async with gw.loop:
        with pytest.raises(ModelOverrideRefusedError, match=message):
            await gw.api.runtime.subagent.complete("research", "hello", model=model)
    assert fake.requests == []


@pytest.mark.parametrize("allowed", [["fake/backup"], ["*"]])
async def test_model_override_allowed_by_policy(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore, allowed: list[str]
) -> None:
    gw = await make_gateway(tmp_path, fake, store, policy={"allowModelOverride": True, "allowedModels": allowed})
    async with gw.loop:
        result = await gw.api.runtime.subagent.complete("research", "@fake reply: from backup", model="fake/backup")
    assert (result.text, result.model) == ("from backup", "fake/backup")
    assert fake.requests[0].body["model"] == "backup"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("fake/missing", 'provider "fake" has no model "missing"'),
        ("fake/Backup", 'provider "fake" has no model "Backup"'),  # model ids are compared exactly
        ("nope/backup", 'has no provider "nope"'),
        ("fake/backup/x", 'has no model "backup/x"'),
    ],
)
async def test_an_override_must_name_exactly_a_model_configured_for_the_agent(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore, model: str, message: str
) -> None:
    # Even "*" admits only what the destination agent's model configuration holds.
    gw = await make_gateway(tmp_path, fake, store, policy={"allowModelOverride": True, "allowedModels": ["*"]})
    async with gw.loop:
        with pytest.raises(ModelOverrideRefusedError, match=message):
            await gw.api.runtime.subagent.complete("research", "hello", model=model)
    assert fake.requests == []


async def test_an_overridden_model_keeps_the_agents_fallbacks(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore
) -> None:
    gw = await make_gateway(
        tmp_path,
        fake,
        store,
        policy={"allowModelOverride": True, "allowedModels": ["fake/backup"]},
        fallbacks=("fake/third", "fake/backup"),
    )
    async with gw.loop:
        assert gw.completer.model_chain("demo", "research", "fake/backup") == ("fake/backup", "fake/third")
        assert gw.completer.model_chain("demo", "research", None) == ("fake/primary", "fake/third", "fake/backup")
        with pytest.raises(SubagentModelError):
            await gw.api.runtime.subagent.complete("research", "@fake fail: 500", model="fake/backup")
    # The override replaces the primary; the configured fallbacks follow it, without the override again.
    assert [r.body["model"] for r in fake.requests] == ["backup", "third"]


async def test_model_failure(gateway: Gateway) -> None:
    with pytest.raises(SubagentModelError) as caught:
        await gateway.api.runtime.subagent.complete("research", "@fake fail: 500")
    assert caught.value.code == "subagent_model_failed"
    assert caught.value.model_error_code != ""
    assert gateway.lane()["running"] == 0


# --------------------------------------------------------------------------------------------------------------------
# Lane, cancellation, timeout, retirement


async def test_max_concurrent_one_queues_the_second_call(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore
) -> None:
    gw = await make_gateway(tmp_path, fake, store, max_concurrent=1)
    async with gw.loop:
        complete = gw.api.runtime.subagent.complete
        release = asyncio.Event()
        first = asyncio.create_task(complete("research", f"one\n{LONG}", signal=release))
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
        second = asyncio.create_task(complete("research", "two\n@fake reply: second"))
        await wait_until(lambda: gw.lane() == {"running": 1, "queued": 1, "limit": 1})
        assert len(fake.requests) == 1  # the second waits for the slot
        release.set()
        with pytest.raises(SubagentCancelledError):
            await first
        async with asyncio.timeout(WAIT_S):
            assert (await second).text == "second"
        assert len(fake.requests) == 2


async def test_cancelling_a_queued_call_removes_it_at_once(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore
) -> None:
    gw = await make_gateway(tmp_path, fake, store, max_concurrent=1)
    async with gw.loop:
        complete = gw.api.runtime.subagent.complete
        release = asyncio.Event()
        first = asyncio.create_task(complete("research", f"one\n{LONG}", signal=release))
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)

        queued = asyncio.create_task(complete("research", "cancelled by the caller"))
        await wait_until(lambda: gw.lane()["queued"] == 1)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert gw.lane() == {"running": 1, "queued": 0, "limit": 1}  # gone as soon as the caller sees it

        signal = asyncio.Event()
        by_signal = asyncio.create_task(complete("research", "cancelled by its signal", signal=signal))
        await wait_until(lambda: gw.lane()["queued"] == 1)
        signal.set()
        with pytest.raises(SubagentCancelledError) as caught:
            await by_signal
        assert caught.value.code == "subagent_cancelled"
        assert gw.lane() == {"running": 1, "queued": 0, "limit": 1}

        release.set()
        with pytest.raises(SubagentCancelledError):
            await first
        assert gw.lane() == {"running": 0, "queued": 0, "limit": 1}
        assert [r.body["messages"][-1]["content"] for r in fake.requests] == [f"one\n{LONG}"]


async def test_cancelling_running_work_keeps_the_slot_until_cleanup(gateway: Gateway, fake: FakeModelServer) -> None:
    task = asyncio.create_task(gateway.api.runtime.subagent.complete("research", LONG))
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    assert gateway.lane()["running"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gateway.lane()["running"] == 0  # released only once the work's cleanup had finished
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_client_disconnects(1)


async def test_signal_already_set_never_queues(gateway: Gateway, fake: FakeModelServer) -> None:
    signal = asyncio.Event()
    signal.set()
    with pytest.raises(SubagentCancelledError):
        await gateway.api.runtime.subagent.complete("research", "hello", signal=signal)
    assert fake.requests == []


async def test_timeout(gateway: Gateway, fake: FakeModelServer) -> None:
    with pytest.raises(SubagentTimeoutError) as caught:
        await gateway.api.runtime.subagent.complete("research", LONG, timeout_ms=200)
    assert caught.value.code == "subagent_timeout"
    assert caught.value.retryable
    assert gateway.lane()["running"] == 0
    assert len(fake.requests) == 1


async def test_timeout_counts_queueing(tmp_path: Path, fake: FakeModelServer, store: SessionStore) -> None:
    gw = await make_gateway(tmp_path, fake, store, max_concurrent=1)
    async with gw.loop:
        complete = gw.api.runtime.subagent.complete
        release = asyncio.Event()
        first = asyncio.create_task(complete("research", LONG, signal=release))
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
        with pytest.raises(SubagentTimeoutError):
            await complete("research", "never sent", timeout_ms=100)
        assert gw.lane()["queued"] == 0
        release.set()
        with pytest.raises(SubagentCancelledError):
            await first
        assert len(fake.requests) == 1


async def test_reload_rejects_in_flight_completions(gateway: Gateway, fake: FakeModelServer) -> None:
    task = asyncio.create_task(gateway.api.runtime.subagent.complete("research", LONG))
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_requests(1)
    gateway.loader.reload("demo")
    with pytest.raises(PluginRetiredError):
        await task
    assert gateway.lane()["running"] == 0
    with pytest.raises(PluginRetiredError):
        await gateway.api.runtime.subagent.complete("research", "hello")
    new_api = gateway.loader.get("demo").api
    assert new_api is not None
    assert (await new_api.runtime.subagent.complete("research", "@fake reply: new")).text == "new"


async def test_completions_of_several_plugins_share_one_lane(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore
) -> None:
    gw = await make_gateway(tmp_path, fake, store, max_concurrent=1)
    async with gw.loop:
        hello_api = gw.loader.get("hello").api
        assert hello_api is not None
        release = asyncio.Event()
        first = asyncio.create_task(gw.api.runtime.subagent.complete("research", LONG, signal=release))
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
        other = asyncio.create_task(hello_api.runtime.subagent.complete("research", "@fake reply: other"))
        await wait_until(lambda: gw.lane()["queued"] == 1)
        release.set()
        with pytest.raises(SubagentCancelledError):
            await first
        async with asyncio.timeout(WAIT_S):
            assert (await other).text == "other"


async def test_example_plugin_command_calls_complete(gateway: Gateway, fake: FakeModelServer) -> None:
    command = gateway.loader.commands.get("hello")
    assert command is not None
    context = CommandContext(plugin_id="hello", name="hello", args="Ada\n@fake reply: Hello, Ada!", authenticated=True)
    assert await command.handler(context) == "Hello, Ada!"
    body = fake.requests[0].body
    assert body["messages"][0] == {"role": "system", "content": "Answer with the greeting only."}
    assert body["messages"][1]["content"].startswith("Write a one-line greeting for this person:\nAda")


# --------------------------------------------------------------------------------------------------------------------
# Invocations: a completion started inside one is cancelled when it ends


async def test_a_running_completion_ends_with_the_invocation_that_started_it(
    gateway: Gateway, fake: FakeModelServer
) -> None:
    complete = gateway.api.runtime.subagent.complete

    async def tool_call() -> tuple[asyncio.Task[Any], asyncio.Task[Any]]:
        with invocation_scope(PluginLifetime("demo")):
            awaited = asyncio.create_task(complete("research", f"awaited\n{LONG}"))
            spawned = asyncio.create_task(complete("research", f"spawned\n{LONG}"))
            async with asyncio.timeout(WAIT_S):
                await fake.wait_for_requests(2)
            assert gateway.lane()["running"] == 2
        return awaited, spawned

    for task in await tool_call():
        with pytest.raises(SubagentCancelledError, match="invocation"):
            await task
    assert gateway.lane() == {"running": 0, "queued": 0, "limit": 8}  # each held its slot until its cleanup
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_client_disconnects(2)


async def test_a_queued_completion_leaves_the_queue_when_its_invocation_ends(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore
) -> None:
    gw = await make_gateway(tmp_path, fake, store, max_concurrent=1)
    async with gw.loop:
        complete = gw.api.runtime.subagent.complete
        hold = asyncio.Event()
        blocker = asyncio.create_task(complete("research", LONG, signal=hold))
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(1)
        scope = PluginLifetime("demo")
        with invocation_scope(scope):
            queued = asyncio.create_task(complete("research", "never sent"))
            await wait_until(lambda: gw.lane()["queued"] == 1)
        assert scope.retired
        with pytest.raises(SubagentCancelledError):
            await queued
        assert gw.lane() == {"running": 1, "queued": 0, "limit": 1}
        hold.set()
        with pytest.raises(SubagentCancelledError):
            await blocker
        assert len(fake.requests) == 1


async def test_a_completion_started_after_its_invocation_ended_is_refused_unqueued(
    gateway: Gateway, fake: FakeModelServer
) -> None:
    release = asyncio.Event()

    async def later() -> Any:
        await release.wait()
        return await gateway.api.runtime.subagent.complete("research", "@fake reply: too late")

    with invocation_scope(PluginLifetime("demo")):
        retained = asyncio.create_task(later())
    release.set()
    with pytest.raises(SubagentCancelledError, match="has ended"):
        await retained
    assert fake.requests == []


async def test_only_the_invoked_plugins_completions_belong_to_the_invocation(
    gateway: Gateway, fake: FakeModelServer
) -> None:
    hello = gateway.loader.get("hello").api
    assert hello is not None
    scope = PluginLifetime("demo")
    with invocation_scope(scope):
        other_plugin = asyncio.create_task(hello.runtime.subagent.complete("research", "@fake reply: hello's"))
        with detached():
            outliving = asyncio.create_task(gateway.api.runtime.subagent.complete("research", "@fake reply: detached"))
    assert scope.retired
    async with asyncio.timeout(WAIT_S):
        assert (await other_plugin).text == "hello's"
        assert (await outliving).text == "detached"
