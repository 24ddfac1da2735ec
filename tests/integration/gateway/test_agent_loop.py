"""The agent loop against a real scripted fake model over TCP and a real SQLite session store.

Each case reads the transcript and the run record back through the store, and checks what the model was sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from clawstack.gateway.agent import (
    MAX_TOOL_ROUNDS,
    AgentEvent,
    AgentLoop,
    TurnResult,
    UnknownAgentError,
    UnknownModelError,
)
from clawstack.gateway.config import GatewayConfig, parse_config
from clawstack.gateway.sessions import Message, RunStateError, SessionStore
from clawstack.gateway.tools import Tool, ToolError, ToolRegistry
from clawstack.llm.fake import FakeModelServer, parse_script

KEY = "agent:main:main"
API_KEY = "sk-agent-loop-test"
INSTRUCTIONS = "You are the test agent."
WAIT_S = 10.0


@dataclass
class Recorder:
    """The agent events of a run and the tool calls that actually ran."""

    events: list[AgentEvent] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)

    def stream(self, name: str) -> list[dict[str, Any]]:
        return [dict(e.data) for e in self.events if e.stream == name]

    def phases(self) -> list[str]:
        return [str(e.data["phase"]) for e in self.events if e.stream == "lifecycle"]


def make_config(tmp_path: Path, base_url: str, **overrides: Any) -> GatewayConfig:
    document: dict[str, Any] = {
        "models": {
            "providers": {
                "fake": {"baseUrl": base_url, "apiKey": API_KEY, "models": [{"id": "primary"}, {"id": "backup"}]}
            }
        },
        "agents": {
            "defaults": {"model": {"primary": "fake/primary", "fallbacks": overrides.pop("fallbacks", [])}},
            "entries": {"main": {"instructions": INSTRUCTIONS, "tools": overrides.pop("agent_tools", {})}},
        },
        "tools": overrides.pop("tools", {}),
        "gateway": {"port": 0, "auth": {"mode": "token", "token": "gateway-token"}},
    }
    assert not overrides
    return parse_config(document, base_dir=tmp_path, environ={})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    with SessionStore(tmp_path / "state" / "sessions.sqlite3") as opened:
        yield opened


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def registry(recorder: Recorder) -> ToolRegistry:
    async def echo(arguments: dict[str, Any], invocation: object = None) -> str:
        recorder.calls.append(("echo", arguments))
        return "echoed " + json.dumps(arguments, sort_keys=True)

    async def refuse(arguments: dict[str, Any], invocation: object = None) -> str:
        recorder.calls.append(("refuse", arguments))
        raise ToolError("the file is locked")

    async def crash(arguments: dict[str, Any], invocation: object = None) -> str:
        recorder.calls.append(("crash", arguments))
        raise RuntimeError("secret internal detail")

    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    return ToolRegistry(
        [
            Tool("echo", "Echo the arguments.", schema, echo),
            Tool("refuse", "Always refuses.", schema, refuse),
            Tool("crash", "Always crashes.", schema, crash),
            Tool("exec", "Runs a command.", schema, echo),
        ]
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def loop(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore, registry: ToolRegistry
) -> AsyncIterator[AgentLoop]:
    async with AgentLoop(make_config(tmp_path, fake.base_url), store, registry) as agent_loop:
        yield agent_loop


def transcript(store: SessionStore, key: str = KEY) -> list[Message]:
    return store.history(key).messages


def run_state(store: SessionStore, run_id: str) -> tuple[str, str | None]:
    run = store.get_run(run_id)
    assert run is not None
    return run.state, run.error


async def test_plain_answer(loop: AgentLoop, store: SessionStore, fake: FakeModelServer, recorder: Recorder) -> None:
    result = await loop.run_turn(
        run_id="run-1",
        session_key=KEY,
        agent_id="main",
        message="Hello there\n@fake reply: Hi, how can I help?",
        extra_system_prompt="Answer in English.",
        on_event=recorder.on_event,
    )

    assert result == TurnResult("ok", "Hi, how can I help?")
    assert run_state(store, "run-1") == ("ok", None)
    user, assistant = transcript(store)
    assert (user.role, user.content, user.idempotency_key, user.run_id) == (
        "user",
        "Hello there\n@fake reply: Hi, how can I help?",
        "run-1:user",
        "run-1",
    )
    assert assistant.role == "assistant"
    assert assistant.content == [{"type": "text", "text": "Hi, how can I help?"}]
    assert (assistant.provider, assistant.model, assistant.stop_reason, assistant.run_id) == (
        "fake",
        "primary",
        "stop",
        "run-1",
    )
    assert assistant.usage == {"input": 17, "output": 5, "totalTokens": 22}

    (request,) = fake.requests
    assert request.body["model"] == "primary"
    assert request.body["stream"] is True
    assert request.body["messages"] == [
        {"role": "system", "content": INSTRUCTIONS + "\n\nAnswer in English."},
        {"role": "user", "content": "Hello there\n@fake reply: Hi, how can I help?"},
    ]
    # All four tools are effective for this agent, so all are offered.
    assert [t["function"]["name"] for t in request.body["tools"]] == ["echo", "refuse", "crash", "exec"]

    assert recorder.phases() == ["start", "model", "finishing", "end"]
    assert recorder.stream("lifecycle")[1] == {"phase": "model", "provider": "fake", "model": "primary", "round": 1}
    assert recorder.stream("lifecycle")[-1] == {
        "phase": "end",
        "status": "ok",
        "terminalReply": {"disposition": "visible", "text": "Hi, how can I help?"},
    }
    deltas = recorder.stream("assistant")
    assert "".join(d["delta"] for d in deltas) == "Hi, how can I help?"
    assert deltas[-1]["text"] == "Hi, how can I help?"
    assert len(deltas) == 5  # the fake streams one word per chunk
    assert [e.seq for e in recorder.events] == list(range(1, len(recorder.events) + 1))
    assert {(e.run_id, e.session_key, e.agent_id) for e in recorder.events} == {("run-1", KEY, "main")}


async def test_second_turn_sends_the_whole_transcript(
    loop: AgentLoop, store: SessionStore, fake: FakeModelServer
) -> None:
    await loop.run_turn(run_id="r1", session_key=KEY, agent_id="main", message="@fake reply: first")
    result = await loop.run_turn(run_id="r2", session_key=KEY, agent_id="main", message="@fake reply: second")

    assert result.text == "second"
    assert [m.content for m in transcript(store)] == [
        "@fake reply: first",
        [{"type": "text", "text": "first"}],
        "@fake reply: second",
        [{"type": "text", "text": "second"}],
    ]
    assert fake.requests[1].body["messages"][1:] == [
        {"role": "user", "content": "@fake reply: first"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "@fake reply: second"},
    ]


async def test_tool_round(loop: AgentLoop, store: SessionStore, fake: FakeModelServer, recorder: Recorder) -> None:
    result = await loop.run_turn(
        run_id="run-t",
        session_key=KEY,
        agent_id="main",
        message='Use the tool.\n@fake tool-call: echo {"x":1}\n@fake reply: The tool said hello.',
        on_event=recorder.on_event,
    )

    assert result == TurnResult("ok", "The tool said hello.")
    assert recorder.calls == [("echo", {"x": 1})]
    assert run_state(store, "run-t") == ("ok", None)
    user, call, tool, answer = transcript(store)
    assert user.role == "user"
    assert call.role == "assistant"
    assert call.content == [{"type": "toolCall", "id": "call_fake_1_0", "name": "echo", "arguments": {"x": 1}}]
    assert (call.stop_reason, call.model, call.idempotency_key) == ("toolUse", "primary", "run-t:assistant:1")
    assert tool.role == "tool"
    assert tool.content == [
        {"type": "text", "text": 'echoed {"x": 1}', "toolCallId": "call_fake_1_0", "toolName": "echo", "isError": False}
    ]
    assert tool.run_id == "run-t"
    assert answer.content == [{"type": "text", "text": "The tool said hello."}]
    assert answer.stop_reason == "stop"

    assert len(fake.requests) == 2
    assert fake.requests[1].body["messages"][2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_fake_1_0", "type": "function", "function": {"name": "echo", "arguments": '{"x":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_fake_1_0", "content": 'echoed {"x": 1}'},
    ]
    assert recorder.stream("tool") == [
        {"phase": "start", "name": "echo", "toolCallId": "call_fake_1_0", "args": {"x": 1}},
        {
            "phase": "result",
            "name": "echo",
            "toolCallId": "call_fake_1_0",
            "isError": False,
            "result": 'echoed {"x": 1}',
        },
    ]
    assert recorder.phases() == ["start", "model", "model", "finishing", "end"]


@pytest.mark.parametrize(
    ("config_overrides", "run_options", "offered"),
    [
        ({"tools": {"deny": ["echo"]}}, {}, ["refuse", "crash", "exec"]),
        ({"tools": {"allow": ["exec"]}}, {}, ["exec"]),
        ({"agent_tools": {"deny": ["echo"]}}, {}, ["refuse", "crash", "exec"]),
        ({"agent_tools": {"allow": ["exec"]}}, {}, ["exec"]),
        # The agent's allow-list cannot bring back what the global policy denies.
        ({"tools": {"deny": ["echo"]}, "agent_tools": {"allow": ["echo", "exec"]}}, {}, ["exec"]),
        ({}, {"tools_allow": ["exec"]}, ["exec"]),
        ({"agent_tools": {"allow": ["exec"]}}, {"tools_allow": ["echo", "exec"]}, ["exec"]),
        ({"tools": {"deny": ["group:runtime"]}}, {"tools_allow": ["crash", "exec"]}, ["crash"]),
        ({}, {"disable_tools": True}, []),
    ],
    ids=[
        "global-deny",
        "global-allow",
        "agent-deny",
        "agent-allow",
        "agent-cannot-widen",
        "run-allow",
        "run-cannot-widen",
        "group-deny-wins",
        "disabled",
    ],
)
async def test_denied_tool_never_runs(
    tmp_path: Path,
    fake: FakeModelServer,
    store: SessionStore,
    registry: ToolRegistry,
    recorder: Recorder,
    config_overrides: dict[str, Any],
    run_options: dict[str, Any],
    offered: list[str],
) -> None:
    config = make_config(tmp_path, fake.base_url, **config_overrides)
    async with AgentLoop(config, store, registry) as agent_loop:
        result = await agent_loop.run_turn(
            run_id="run-d",
            session_key=KEY,
            agent_id="main",
            message='@fake tool-call: echo {"x":1}\n@fake reply: I could not use it.',
            on_event=recorder.on_event,
            **run_options,
        )

    assert result == TurnResult("ok", "I could not use it.")
    assert recorder.calls == []
    assert [t["function"]["name"] for t in fake.requests[0].body.get("tools", [])] == offered
    _, _, tool, _ = transcript(store)
    assert tool.content == [
        {
            "type": "text",
            "text": 'error: the tool "echo" is not available',
            "toolCallId": "call_fake_1_0",
            "toolName": "echo",
            "isError": True,
        }
    ]


async def test_tool_errors_and_unknown_tools_become_error_results(
    loop: AgentLoop, store: SessionStore, recorder: Recorder
) -> None:
    message = "\n".join(
        [
            "@fake tool-call: refuse",
            "@fake tool-call: crash",
            "@fake tool-call: no_such_tool",
            "@fake reply: done",
        ]
    )
    result = await loop.run_turn(run_id="run-e", session_key=KEY, agent_id="main", message=message)

    assert result.status == "ok"
    assert recorder.calls == [("refuse", {}), ("crash", {})]
    results = [m.content[0] for m in transcript(store) if m.role == "tool" and isinstance(m.content, list)]
    assert [(r["toolName"], r["text"], r["isError"]) for r in results] == [
        ("refuse", "error: the file is locked", True),
        ("crash", "error: the tool failed (RuntimeError)", True),
        ("no_such_tool", 'error: the tool "no_such_tool" is not available', True),
    ]


async def test_model_failure_falls_back_in_order(
    tmp_path: Path, store: SessionStore, registry: ToolRegistry, recorder: Recorder
) -> None:
    # The fallback must answer where the primary fails, so the fake is told per request by a script rather than
    # by a directive in the (shared) user message.
    async with FakeModelServer(
        parse_script([{"fail": 500}, {"reply": "The backup answers."}]), api_key=API_KEY
    ) as fake:
        config = make_config(tmp_path, fake.base_url, fallbacks=["fake/backup"])
        async with AgentLoop(config, store, registry) as agent_loop:
            result = await agent_loop.run_turn(
                run_id="run-f", session_key=KEY, agent_id="main", message="Hello", on_event=recorder.on_event
            )
        assert [r.body["model"] for r in fake.requests] == ["primary", "backup"]

    assert result == TurnResult("ok", "The backup answers.")
    assert run_state(store, "run-f") == ("ok", None)
    _, answer = transcript(store)
    assert (answer.provider, answer.model) == ("fake", "backup")
    models = [e for e in recorder.stream("lifecycle") if e["phase"] == "model"]
    assert [m["model"] for m in models] == ["primary", "backup"]


async def test_turn_stays_on_the_fallback_that_answered(
    tmp_path: Path, store: SessionStore, registry: ToolRegistry
) -> None:
    script = [{"fail": 503}, {"tool_calls": [{"name": "echo", "arguments": {"x": 2}}]}, {"reply": "done"}]
    async with FakeModelServer(parse_script(script), api_key=API_KEY) as fake:
        config = make_config(tmp_path, fake.base_url, fallbacks=["fake/backup"])
        async with AgentLoop(config, store, registry) as agent_loop:
            result = await agent_loop.run_turn(run_id="run-s", session_key=KEY, agent_id="main", message="Go")
        assert [r.body["model"] for r in fake.requests] == ["primary", "backup", "backup"]
    assert result == TurnResult("ok", "done")


async def test_every_model_failing_ends_in_error(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore, registry: ToolRegistry, recorder: Recorder
) -> None:
    config = make_config(tmp_path, fake.base_url, fallbacks=["fake/backup"])
    async with AgentLoop(config, store, registry) as agent_loop:
        result = await agent_loop.run_turn(
            run_id="run-x", session_key=KEY, agent_id="main", message="@fake fail: 500", on_event=recorder.on_event
        )

    assert result.status == "error"
    assert result.error is not None
    assert result.error.code == "llm_server_error"
    assert API_KEY not in result.error.message
    assert [r.body["model"] for r in fake.requests] == ["primary", "backup"]
    assert run_state(store, "run-x") == ("error", result.error.message)
    assert [m.role for m in transcript(store)] == ["user"]
    end = recorder.stream("lifecycle")[-1]
    assert end["phase"] == "end"
    assert end["status"] == "error"
    assert end["error"]["code"] == "llm_server_error"


async def test_model_override_replaces_the_chain(loop: AgentLoop, store: SessionStore, fake: FakeModelServer) -> None:
    result = await loop.run_turn(
        run_id="run-o", session_key=KEY, agent_id="main", message="@fake reply: hi", model="fake/backup"
    )
    assert result.status == "ok"
    assert [r.body["model"] for r in fake.requests] == ["backup"]


async def test_a_model_looping_on_tool_calls_hits_the_round_limit(
    tmp_path: Path, store: SessionStore, registry: ToolRegistry, recorder: Recorder
) -> None:
    steps = [{"tool_calls": [{"name": "echo", "arguments": {"x": i}}]} for i in range(MAX_TOOL_ROUNDS + 2)]
    async with FakeModelServer(parse_script(steps), api_key=API_KEY) as fake:
        async with AgentLoop(make_config(tmp_path, fake.base_url), store, registry) as agent_loop:
            result = await agent_loop.run_turn(run_id="run-l", session_key=KEY, agent_id="main", message="Loop")
        assert len(fake.requests) == MAX_TOOL_ROUNDS
        assert fake.script_steps_remaining == 2

    assert result.status == "error"
    assert result.error is not None
    assert result.error.code == "tool_rounds_exceeded"
    assert run_state(store, "run-l") == ("error", result.error.message)
    # The tools of the last round are not run: no model call could read their results.
    assert recorder.calls == [("echo", {"x": i}) for i in range(MAX_TOOL_ROUNDS - 1)]
    roles = [m.role for m in store.history(KEY, limit=1000).messages]
    assert roles == ["user"] + ["assistant", "tool"] * (MAX_TOOL_ROUNDS - 1) + ["assistant"]


async def test_timeout(loop: AgentLoop, store: SessionStore, fake: FakeModelServer, recorder: Recorder) -> None:
    started = asyncio.get_running_loop().time()
    result = await loop.run_turn(
        run_id="run-slow",
        session_key=KEY,
        agent_id="main",
        message="@fake delay-ms: 20000\n@fake reply: too late",
        timeout_s=0.3,
        on_event=recorder.on_event,
    )
    assert asyncio.get_running_loop().time() - started < 10

    assert result.status == "timeout"
    assert result.error is not None
    assert result.error.code == "run_timeout"
    assert run_state(store, "run-slow") == ("timeout", result.error.message)
    assert [m.role for m in transcript(store)] == ["user"]
    assert recorder.stream("lifecycle")[-1]["status"] == "timeout"
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_client_disconnects(1)


async def test_cancellation_mid_stream(loop: AgentLoop, store: SessionStore, fake: FakeModelServer) -> None:
    first_delta = asyncio.Event()
    events: list[AgentEvent] = []

    async def on_event(event: AgentEvent) -> None:
        events.append(event)
        if event.stream == "assistant":
            first_delta.set()

    task = asyncio.create_task(
        loop.run_turn(
            run_id="run-c",
            session_key=KEY,
            agent_id="main",
            message="@fake chunk-delay-ms: 100\n@fake reply: one two three four five six seven eight",
            on_event=on_event,
        )
    )
    async with asyncio.timeout(WAIT_S):
        await first_delta.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert run_state(store, "run-c") == ("aborted", "the run was cancelled")
    assert [m.role for m in transcript(store)] == ["user"]
    assert all(e.stream != "lifecycle" or e.data["phase"] != "end" for e in events)
    async with asyncio.timeout(WAIT_S):
        await fake.wait_for_client_disconnects(1)

    # The session goes on: the next turn sees the aborted turn's user message and nothing of its answer.
    result = await loop.run_turn(run_id="run-c2", session_key=KEY, agent_id="main", message="@fake reply: again")
    assert result.status == "ok"
    assert fake.requests[-1].body["messages"][1:] == [
        {"role": "user", "content": "@fake chunk-delay-ms: 100\n@fake reply: one two three four five six seven eight"},
        {"role": "user", "content": "@fake reply: again"},
    ]


async def test_cancellation_during_a_tool_call(
    tmp_path: Path, fake: FakeModelServer, store: SessionStore, registry: ToolRegistry
) -> None:
    entered = asyncio.Event()

    async def hang(arguments: dict[str, Any], invocation: object = None) -> str:
        entered.set()
        await asyncio.Event().wait()
        return "never"

    registry.register(Tool("hang", "Never returns.", {"type": "object"}, hang))
    async with AgentLoop(make_config(tmp_path, fake.base_url), store, registry) as agent_loop:
        task = asyncio.create_task(
            agent_loop.run_turn(
                run_id="run-h", session_key=KEY, agent_id="main", message="@fake tool-call: hang\n@fake reply: x"
            )
        )
        async with asyncio.timeout(WAIT_S):
            await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert run_state(store, "run-h") == ("aborted", "the run was cancelled")
        assert [m.role for m in transcript(store)] == ["user", "assistant"]

        # The call left without a result is not sent again, so the next request stays well formed.
        result = await agent_loop.run_turn(run_id="run-h2", session_key=KEY, agent_id="main", message="@fake reply: ok")
    assert result == TurnResult("ok", "ok")
    sent = fake.requests[-1].body["messages"]
    assert all("tool_calls" not in m and m["role"] != "tool" for m in sent)
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]


async def test_a_run_is_recorded_once(loop: AgentLoop, store: SessionStore, fake: FakeModelServer) -> None:
    store.get_or_create(KEY, agent_id="main")
    store.start_run("run-a", KEY, idempotency_key="run-a")
    result = await loop.run_turn(run_id="run-a", session_key=KEY, agent_id="main", message="@fake reply: hi")
    assert result.status == "ok"
    assert run_state(store, "run-a") == ("ok", None)

    with pytest.raises(RunStateError):
        await loop.run_turn(run_id="run-a", session_key=KEY, agent_id="main", message="@fake reply: again")
    assert len(fake.requests) == 1
    assert len(transcript(store)) == 2


async def test_unknown_agent_and_model_are_refused_before_anything_is_recorded(
    loop: AgentLoop, store: SessionStore, fake: FakeModelServer
) -> None:
    with pytest.raises(UnknownAgentError) as agent_error:
        await loop.run_turn(run_id="r", session_key="agent:ghost:main", agent_id="ghost", message="hi")
    assert agent_error.value.code == "agent_not_found"
    with pytest.raises(UnknownModelError) as model_error:
        await loop.run_turn(run_id="r", session_key=KEY, agent_id="main", message="hi", model="fake/nope")
    assert model_error.value.code == "model_not_found"
    with pytest.raises(ValueError, match="timeout_s"):
        await loop.run_turn(run_id="r", session_key=KEY, agent_id="main", message="hi", timeout_s=0)
    assert store.get_run("r") is None
    assert store.get(KEY) is None
    assert fake.requests == []


async def test_a_failing_event_handler_is_recorded_as_an_error(loop: AgentLoop, store: SessionStore) -> None:
    async def broken(event: AgentEvent) -> None:
        if event.stream == "assistant":
            raise RuntimeError("subscriber bug")

    with pytest.raises(RuntimeError, match="subscriber bug"):
        await loop.run_turn(
            run_id="run-b", session_key=KEY, agent_id="main", message="@fake reply: hi there", on_event=broken
        )
    assert run_state(store, "run-b") == ("error", "internal error")
    assert [m.role for m in transcript(store)] == ["user"]


async def test_a_models_max_tokens_is_sent_as_its_output_cap(tmp_path: Path, store: SessionStore) -> None:
    async with FakeModelServer(api_key=API_KEY) as fake:
        document = {
            "models": {
                "providers": {
                    "fake": {
                        "baseUrl": fake.base_url,
                        "apiKey": API_KEY,
                        "models": [{"id": "primary", "maxTokens": 321}, {"id": "backup"}],
                    }
                }
            },
            "agents": {"defaults": {"model": {"primary": "fake/primary", "fallbacks": ["fake/backup"]}}},
            "gateway": {"port": 0, "auth": {"mode": "token", "token": "gateway-token"}},
        }
        config = parse_config(document, base_dir=tmp_path, environ={})
        async with AgentLoop(config, store, ToolRegistry()) as loop:
            result = await loop.run_turn(run_id="cap-1", session_key=KEY, agent_id="main", message="@fake reply: ok")
            assert result.status == "ok"
            assert fake.requests[-1].body["max_completion_tokens"] == 321
            result = await loop.run_turn(
                run_id="cap-2", session_key=KEY, agent_id="main", message="@fake reply: ok", model="fake/backup"
            )
            assert "max_completion_tokens" not in fake.requests[-1].body
