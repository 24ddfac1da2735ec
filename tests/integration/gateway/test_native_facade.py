"""``ctx.subagent.native`` in a real gateway: a ``reply_dispatch`` plugin spawns, collects and lists native children
for the requester of a real chat turn, against the scripted fake model.

The test plugin claims messages ``native:{"steps": [...]}``: it runs each step (``spawn``, ``collect``, ``list``,
with ``"$N"`` in ``ids`` standing for the run id step N answered) and replies with what each answered, as JSON (an
error as its ``code``), so a test reads the facade's answers from the turn's reply.
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

from clawstack.gateway.config import parse_config
from clawstack.gateway.custody import INTERRUPTED_CHILD_ERROR
from clawstack.gateway.plugins.api import PluginRetiredError
from clawstack.gateway.plugins.native_facade import BLIND_CAPABILITY, LIST_CAPABILITY, NativeError
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_ws_protocol import API_KEY, Client, config_document, connected

KEY = "agent:main:main"
WAIT_S = 30.0

STEPS = """
async def run_steps(native, steps):
    # Each step's answer, or its error code; "$N" in ids stands for the run id step N answered.
    answers = []
    for step in steps:
        args = dict(step.get("args", {}))
        if "ids" in args:
            args["ids"] = [answers[int(i[1:])]["run_id"] if i.startswith("$") else i for i in args["ids"]]
        try:
            answers.append(await getattr(native, step["op"])(**args))
        except Exception as exc:
            answers.append({"error": getattr(exc, "code", type(exc).__name__)})
    return answers
"""
"""The plugin source that runs a test's steps against a native facade (both the hook and the command tests)."""

PLUGIN = (
    STEPS
    + """
import json

from clawstack.gateway.plugins import BeforeToolCallResult

API = None
captured = {}


async def reply(ctx):
    prefix = PREFIX + ":"
    if not ctx.message.startswith(prefix):
        return None
    command = json.loads(ctx.message[len(prefix):])
    native = ctx.subagent.native
    captured["native"] = native
    captured["api_native_is_ctx_native"] = API.runtime.subagent.native is native
    if native is None:
        return json.dumps({"native": None})
    return json.dumps(await run_steps(native, command["steps"]))


async def check_spawn(event):
    # What the tests ask of a tool hook, by a marker in the task.
    task = event.params.get("task", "")
    captured.setdefault("spawn_events", []).append(dict(event.params))
    if "HOOK-BLOCK" in task:
        return BeforeToolCallResult(block=True, block_reason="not on my watch")
    if "HOOK-REWRITE" in task:
        return BeforeToolCallResult(params={"task": "@fake reply: rewritten by the hook", "label": "hooked"})
    if "HOOK-UNBLIND" in task:
        return BeforeToolCallResult(params={"blind": False})
    if "HOOK-MODEL" in task:
        return BeforeToolCallResult(params={"model": "fake/backup"})
    if "HOOK-MODE" in task:
        return BeforeToolCallResult(params={"mode": "session"})
    return None


def register(api):
    global API
    API = api
    api.register_hook("reply_dispatch", reply)
    if PREFIX == "native":
        api.register_hook("before_tool_call", check_spawn, matcher=["sessions_spawn"])
"""
)


def write_plugin(root: Path, plugin_id: str, prefix: str) -> Path:
    directory = root / plugin_id
    directory.mkdir(parents=True)
    (directory / "claw.plugin.json").write_text(json.dumps({"id": plugin_id, "version": "1.0.0", "entry": "plugin.py"}))
    (directory / "plugin.py").write_text(f"PREFIX = {prefix!r}\n" + textwrap.dedent(PLUGIN))
    return directory


class Gateway:
    def __init__(self, server: GatewayServer, fake: FakeModelServer, client: Client) -> None:
        self.server, self.fake, self.client = server, fake, client
        self._n = 0

    async def say(self, message: str) -> str:
        """Send ``message`` as a chat turn and return the reply's text."""
        self._n += 1
        sent = await self.client.request(
            "chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": f"t{self._n}"}
        )
        assert sent["ok"], sent
        async with asyncio.timeout(WAIT_S):
            final = await self.client.wait_for_chat(sent["payload"]["runId"], "final", "error")
        return str(final["payload"]["message"]["content"][0]["text"])

    async def turn(self, message: str) -> Any:
        """Send ``message`` as a chat turn and return the plugin's reply, parsed."""
        return json.loads(await self.say(message))

    async def steps(self, *steps: dict[str, Any], prefix: str = "native") -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = await self.turn(f"{prefix}:" + json.dumps({"steps": list(steps)}))
        return answers


def spawn(task: str, **args: Any) -> dict[str, Any]:
    return {"op": "spawn", "args": {"task": task, **args}}


def collect(*ids: str, **args: Any) -> dict[str, Any]:
    return {"op": "collect", "args": {"ids": list(ids), **args}}


def listing(**args: Any) -> dict[str, Any]:
    return {"op": "list", "args": args}


def make_config(tmp_path: Path, base_url: str, **extra: Any) -> Any:
    document = config_document(base_url)
    document["agents"]["defaults"]["subagents"] = {"runTimeoutSeconds": 30}
    document.update(extra)
    return parse_config(document, base_dir=tmp_path, environ={})


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


async def open_gateway(tmp_path: Path, fake: FakeModelServer, **extra: Any) -> tuple[GatewayServer, Client, Any]:
    root = tmp_path / "plugins"
    paths = [write_plugin(root, "reviewer", "native"), write_plugin(root, "other", "othernative")]
    server = GatewayServer(
        make_config(tmp_path, fake.base_url, **extra), data_dir=tmp_path / "data", plugin_paths=paths
    )
    await server.start()
    http = aiohttp.ClientSession()
    client = await connected(http, server.port)
    return server, client, http


@pytest.fixture
async def gateway(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[Gateway]:
    server, client, http = await open_gateway(tmp_path, fake)
    try:
        yield Gateway(server, fake, client)
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


def child_calls(fake: FakeModelServer) -> int:
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))


def api_of(server: GatewayServer, plugin_id: str) -> Any:
    record = {p.id: p for p in server.plugins}[plugin_id]
    assert record.state == "loaded", record.error
    return record.api


async def test_spawn_collect_and_list_for_the_requester(gateway: Gateway) -> None:
    assert {BLIND_CAPABILITY, LIST_CAPABILITY} <= api_of(gateway.server, "reviewer").runtime.capabilities
    accepted, collected, listed = await gateway.steps(
        spawn("Review it.\n@fake reply: child one", request_id="review-1", label="review"),
        collect("$0", await_results=True),
        listing(),
    )
    assert set(accepted) == {"run_id", "child_session_key", "request_id", "selection"}
    assert accepted["request_id"] == "review-1"
    assert accepted["child_session_key"].startswith("agent:main:subagent:")
    assert accepted["selection"] == {"requested": {}, "resolved": {"model": "fake/fake-model"}}
    (result,) = collected["results"]
    assert collected["pending"] == []
    assert result == {
        "run_id": accepted["run_id"],
        "status": "done",
        "result": "child one",
        "result_truncated": False,
        "structured_output": None,
        "error": None,
        "selection": {"requested": {}, "resolved": {"model": "fake/fake-model"}},
    }
    assert listed == [
        {
            "run_id": accepted["run_id"],
            "child_session_key": accepted["child_session_key"],
            "request_id": "review-1",
            "label": "review",
            "status": "done",
        }
    ]
    # The host committed the turn's input before the child existed; the claim adds only the reply.
    history = await gateway.client.request("chat.history", {"sessionKey": KEY, "limit": 50})
    roles = [m["role"] for m in history["payload"]["messages"]]
    assert roles == ["user", "assistant"]


async def test_a_request_id_replays_and_never_makes_a_second_child(gateway: Gateway) -> None:
    first, again, changed, listed = await gateway.steps(
        spawn("@fake reply: once", request_id="r"),
        spawn("@fake reply: once", request_id="r"),
        spawn("@fake reply: other", request_id="r"),
        listing(),
    )
    assert again["run_id"] == first["run_id"]
    assert changed == {"error": "native_request_conflict"}
    assert [entry["run_id"] for entry in listed] == [first["run_id"]]
    (collected,) = await gateway.steps(collect(first["run_id"], await_results=True))
    assert collected["results"][0]["result"] == "once"
    assert child_calls(gateway.fake) == 1


async def test_collect_reads_waits_and_refuses_bad_calls(gateway: Gateway) -> None:
    accepted, snapshot, both, unknown, running, bogus, empty = await gateway.steps(
        spawn("@fake delay-ms: 2000\n@fake reply: slow"),
        collect("$0", timeout_seconds=0),
        collect("$0", timeout_seconds=1, await_results=True),
        collect("not-a-child", timeout_seconds=0),
        listing(status="done"),
        listing(status="bogus"),
        {"op": "collect", "args": {"ids": []}},
    )
    assert accepted["request_id"] is None
    assert snapshot == {"results": [], "pending": [accepted["run_id"]]}  # pending is not a failure
    assert both == {"error": "native_invalid_argument"}
    assert unknown == {"error": "native_not_owner"}
    assert running == []  # the status filter applies before the bound
    assert bogus == {"error": "native_invalid_argument"}
    assert empty == {"error": "native_invalid_argument"}
    (waited,) = await gateway.steps(collect(accepted["run_id"], timeout_seconds=10))
    assert waited["results"][0]["status"] == "done"
    assert waited["pending"] == []


async def test_unsupported_and_refused_spawns_create_nothing(gateway: Gateway) -> None:
    answers = await gateway.steps(
        spawn("x", profile="reviewer"),  # this plugin declared no profile
        spawn("x", output_schema={"type": 42}),  # not a JSON schema
        spawn("x", fast_mode=True),  # this gateway has no fast mode
        spawn("x", blind=True, context="fork"),
        spawn(""),
        spawn("x", context="elsewhere"),
        listing(),
        spawn("x", fast_mode="on"),
        spawn("x", session_key="agent:main:other"),  # a plugin cannot choose the parent
        spawn("x", requester="mallory", scopes=["operator.admin"]),
    )
    assert answers[:6] == [
        {"error": "native_invalid_argument"},
        {"error": "native_invalid_argument"},
        {"error": "native_unsupported"},
        {"error": "native_spawn_refused"},
        {"error": "native_invalid_argument"},
        {"error": "native_invalid_argument"},
    ]
    assert answers[6] == []
    assert answers[7:] == [{"error": "native_invalid_argument"}] * 3
    assert child_calls(gateway.fake) == 0


async def test_a_blind_child_is_accepted_and_collected(gateway: Gateway) -> None:
    accepted, collected = await gateway.steps(
        spawn("@fake reply: blind answer", blind=True, context="isolated"), collect("$0", await_results=True)
    )
    assert accepted["selection"]["requested"] == {"context": "isolated", "blind": True}
    assert collected["results"][0]["result"] == "blind answer"
    (request,) = [r for r in gateway.fake.requests if r.path.endswith("/chat/completions")]
    prompt = json.dumps(request.body["messages"])
    assert KEY not in prompt
    assert accepted["child_session_key"] not in prompt


async def test_another_plugin_and_a_reset_parent_cannot_read_the_children(gateway: Gateway) -> None:
    accepted, _ = await gateway.steps(spawn("@fake reply: mine"), collect("$0", await_results=True))
    foreign = await gateway.steps(collect(accepted["run_id"], timeout_seconds=0), listing(), prefix="othernative")
    assert foreign == [{"error": "native_not_owner"}, []]
    reset = await gateway.client.request("sessions.reset", {"key": KEY})
    assert reset["ok"], reset
    after = await gateway.steps(collect(accepted["run_id"], timeout_seconds=0), listing())
    assert after == [{"error": "native_not_owner"}, []]


async def test_the_facade_exists_only_while_its_handler_runs(gateway: Gateway) -> None:
    await gateway.steps(listing())
    module = next(m for m in sys.modules.values() if getattr(m, "PREFIX", None) == "native" and hasattr(m, "captured"))
    assert module.captured["api_native_is_ctx_native"] is True
    assert api_of(gateway.server, "reviewer").runtime.subagent.native is None  # outside any invocation
    with pytest.raises(PluginRetiredError):
        await module.captured["native"].spawn(task="too late")
    assert child_calls(gateway.fake) == 0


async def test_a_denied_collector_tool_leaves_no_way_to_spawn(tmp_path: Path, fake: FakeModelServer) -> None:
    server, client, http = await open_gateway(tmp_path, fake, tools={"deny": ["agents_wait"]})
    try:
        answers = await Gateway(server, fake, client).steps(spawn("@fake reply: x"), listing())
        assert answers == [{"error": "native_tool_denied"}, {"error": "native_tool_denied"}]
        assert child_calls(fake) == 0
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


async def test_tool_hooks_see_a_native_spawn_and_may_block_or_rewrite_it(gateway: Gateway) -> None:
    blocked, rewritten, replayed, collected, unblind, mode, listed = await gateway.steps(
        spawn("HOOK-BLOCK"),
        spawn("HOOK-REWRITE", request_id="hooked"),
        spawn("HOOK-REWRITE", request_id="hooked"),  # the replay identity is the spawn's own arguments
        collect("$1", await_results=True),
        spawn("HOOK-UNBLIND", blind=True, context="isolated"),
        spawn("HOOK-MODE"),
        listing(),
    )
    assert blocked == {"error": "native_spawn_refused"}
    assert rewritten["request_id"] == "hooked"
    assert replayed["run_id"] == rewritten["run_id"]
    assert collected["results"][0]["result"] == "rewritten by the hook"
    assert unblind == {"error": "native_rewrite_refused"}
    assert mode == {"error": "native_rewrite_refused"}
    assert [(entry["run_id"], entry.get("label")) for entry in listed] == [(rewritten["run_id"], "hooked")]
    module = next(m for m in sys.modules.values() if getattr(m, "PREFIX", None) == "native" and hasattr(m, "captured"))
    first = module.captured["spawn_events"][0]
    assert first == {"task": "HOOK-BLOCK", "runtime": "subagent", "mode": "run"}
    assert module.captured["spawn_events"][1]["requestId"] == "hooked"
    assert child_calls(gateway.fake) == 1


async def test_a_revoked_requester_authority_ends_the_facade(gateway: Gateway) -> None:
    from clawstack.gateway.authority import ChannelIdentity, OperatorAuthority, OperatorEntry
    from clawstack.gateway.dispatch import Requester
    from clawstack.gateway.plugins.api import PluginLifetime
    from clawstack.gateway.plugins.native_facade import NativeHost

    server = gateway.server
    alice = Requester("agent:main:channel:webhook:alice", "main", "webhook", True, sender_id="alice", operator="ops")
    authority = OperatorAuthority(
        [OperatorEntry("ops", frozenset({"operator.admin"}), frozenset({ChannelIdentity("webhook", "alice")}))],
        allow_from={"webhook": ["alice"]},
    )
    host = NativeHost(
        server._natives,
        server._children,
        server.store,
        server._agent,
        server._config,
        authority,
    )
    await asyncio.to_thread(server.store.get_or_create, alice.session_key, agent_id="main")

    async def recorded() -> None:
        return None

    facade = host.facade(
        "reviewer", (PluginLifetime("reviewer"),), alice, parent_run_id="turn-a", record_input=recorded
    )
    assert facade is not None
    accepted = await facade.spawn(task="@fake delay-ms: 3000\n@fake reply: late")
    assert authority.retained(accepted["run_id"]) is not None  # the child works under alice's authority
    authority.set_roles("ops", ["operator.write"])  # demoted
    for call in (facade.list(), facade.spawn(task="@fake reply: refused"), facade.collect(ids=[accepted["run_id"]])):
        with pytest.raises(NativeError) as caught:
            await call
        assert caught.value.code == "native_authority_revoked"
    unauthenticated = Requester(alice.session_key, "main", "webhook", False, sender_id="mallory")
    assert (
        host.facade(
            "reviewer", (PluginLifetime("reviewer"),), unauthenticated, parent_run_id="t", record_input=recorded
        )
        is None
    )


async def test_selection_receipts_report_the_childs_own_controls(gateway: Gateway) -> None:
    accepted, collected = await gateway.steps(
        spawn("@fake reply: thought", thinking="high"), collect("$0", await_results=True)
    )
    resolved = {"model": "fake/fake-model", "thinking": "high"}
    assert accepted["selection"] == {"requested": {"thinking": "high"}, "resolved": resolved}
    assert collected["results"][0]["selection"] == {"requested": {}, "resolved": resolved}
    (request,) = [r for r in gateway.fake.requests if r.path.endswith("/chat/completions")]
    assert request.body.get("reasoning_effort") == "high"  # the control the child actually ran with


async def test_a_config_change_during_a_list_is_a_policy_change(gateway: Gateway) -> None:
    from clawstack.gateway.authority import OperatorAuthority, OperatorEntry
    from clawstack.gateway.dispatch import Requester
    from clawstack.gateway.plugins.api import PluginLifetime
    from clawstack.gateway.plugins.native_facade import NativeHost, NativePolicyChangedError

    server = gateway.server
    authority = OperatorAuthority([OperatorEntry("ops", frozenset({"operator.admin"}), frozenset())])
    changes = {"during_read": True}

    class ChangingStore:
        """The gateway's custody store, with a config change landing while a list reads it."""

        def __getattr__(self, name: str) -> Any:
            return getattr(server._children, name)

        def plugin_children(self, *args: Any, **kwargs: Any) -> Any:
            if changes["during_read"]:
                authority.set_roles("ops", ["operator.admin", "operator.read"])  # another operator's change
            return server._children.plugin_children(*args, **kwargs)  # type: ignore[union-attr]

    host = NativeHost(server._natives, ChangingStore(), server.store, server._agent, server._config, authority)  # type: ignore[arg-type]
    requester = Requester(KEY, "main", "gateway", True, operator="ops")
    await asyncio.to_thread(server.store.get_or_create, KEY, agent_id="main")

    async def recorded() -> None:
        return None

    facade = host.facade("reviewer", (PluginLifetime("reviewer"),), requester, parent_run_id="t", record_input=recorded)
    assert facade is not None
    with pytest.raises(NativePolicyChangedError) as caught:
        await facade.list()
    assert caught.value.code == "native_policy_changed"
    changes["during_read"] = False
    assert await facade.list() == []  # the invocation is still active: a retry reads


async def test_fast_mode_auto_and_off_are_the_host_default(gateway: Gateway) -> None:
    auto, off = await gateway.steps(spawn("@fake reply: a", fast_mode="auto"), spawn("@fake reply: b", fast_mode=False))
    assert auto["selection"]["requested"] == {"fast_mode": "auto"}
    assert off["selection"]["requested"] == {"fast_mode": False}


async def test_a_blind_childs_prompt_differs_only_in_what_blind_hides(tmp_path: Path, fake: FakeModelServer) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text(f"Work in {workspace}/src only.\n")
    agents = {"defaults": {"model": {"primary": "fake/fake-model"}, "subagents": {"runTimeoutSeconds": 30}}}
    agents["list"] = [{"id": "main", "default": True, "workspace": str(workspace)}]  # type: ignore[assignment]
    server, client, http = await open_gateway(tmp_path, fake, agents=agents)
    try:
        gateway = Gateway(server, fake, client)
        plain, blind, _ = await gateway.steps(
            spawn("@fake reply: seen", context="isolated"),
            spawn("@fake reply: seen", context="isolated", blind=True),
            {"op": "collect", "args": {"ids": ["$0", "$1"], "await_results": True}},
        )
        requests = [r for r in fake.requests if r.path.endswith("/chat/completions")]
        assert len(requests) == 2
        by_prompt = {json.dumps(r.body["messages"]): r.body for r in requests}
        (blind_body,) = [b for p, b in by_prompt.items() if plain["child_session_key"] not in p and KEY not in p]
        (plain_body,) = [b for b in by_prompt.values() if b is not blind_body]
        plain_system, blind_system = plain_body["messages"][0]["content"], blind_body["messages"][0]["content"]
        assert str(workspace) in plain_system  # the file heading and the file's own text
        # Exactly what blind hides: the workspace path (as <workspace>, headings and contents) and both session keys.
        session_line = (
            f"Subagent session context: requester session {KEY}; this child's session {plain['child_session_key']}."
        )
        assert session_line in plain_system
        assert blind["child_session_key"] not in json.dumps(blind_body)
        expected = plain_system.replace(str(workspace), "<workspace>").replace("\n\n" + session_line, "")
        assert blind_system == expected
        assert blind_body["messages"][1:] == plain_body["messages"][1:]  # the task message is the same
        assert {k: v for k, v in blind_body.items() if k != "messages"} == {
            k: v for k, v in plain_body.items() if k != "messages"
        }  # the same model, tools and controls
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


async def test_a_restarted_gateway_lists_and_collects_what_the_plugin_accepted(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    server, client, http = await open_gateway(tmp_path, fake)
    try:
        done, _, slow = await Gateway(server, fake, client).steps(
            spawn("@fake reply: kept", request_id="kept"),
            collect("$0", await_results=True),
            spawn("@fake delay-ms: 20000\n@fake reply: never", request_id="slow"),
        )
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()  # the slow child is still running
    server, client, http = await open_gateway_again(tmp_path, fake)
    try:
        again = Gateway(server, fake, client)
        again._n = 100  # new idempotency keys for the new turns
        listed, collected = await again.steps(listing(), collect(done["run_id"], slow["run_id"], timeout_seconds=0))
        # The child the stop interrupted is failed, with the reason, as after any restart.
        assert [(e["request_id"], e["status"]) for e in listed] == [("slow", "failed"), ("kept", "done")]
        results = {r["run_id"]: r for r in collected["results"]}
        assert results[done["run_id"]]["result"] == "kept"
        assert results[slow["run_id"]]["status"] == "failed"
        assert results[slow["run_id"]]["error"] == INTERRUPTED_CHILD_ERROR
        assert collected["pending"] == []
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


async def open_gateway_again(tmp_path: Path, fake: FakeModelServer) -> tuple[GatewayServer, Client, Any]:
    """A new gateway on the same data directory and plugins (the plugin directories already exist)."""
    root = tmp_path / "plugins"
    server = GatewayServer(
        make_config(tmp_path, fake.base_url),
        data_dir=tmp_path / "data",
        plugin_paths=[root / "reviewer", root / "other"],
    )
    await server.start()
    http = aiohttp.ClientSession()
    return server, await connected(http, server.port), http
