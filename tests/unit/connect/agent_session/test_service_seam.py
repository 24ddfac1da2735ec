"""The seam inside ConnectService, over a real in-process gateway with the scripted model: standalone behaviour,
attach/refresh/replace/continue/detach through run_task's context, reads on check_task/get_task/get_session with
freshness, recovered results, blocked sessions, restarts, and a delegation that never fails a task."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from clawstack.connect import SessionBusyError, create_mcp_server, tool_definitions
from clawstack.connect.agent_session import AgentSessionRuntimeRegistry, AttachmentStore, CallOptions
from clawstack.connect.agent_session.sessions import AgentSessions
from tests.unit.connect.agent_session.fakes import (
    WAIT,
    Factory,
    FakeRuntime,
    block,
    marker,
    now_s,
    registry_with,
    run_to_end,
)


def comparable(snapshot: dict[str, Any]) -> dict[str, Any]:
    volatile = {"jobId", "taskId", "sessionKey", "createdAt", "updatedAt", "endedAt", "elapsedMs", "parentRunId"}
    return {k: v for k, v in snapshot.items() if k not in volatile and k != "logs"}


async def test_with_no_runtime_registered_nothing_changes(
    make: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def untouchable(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("attachment code reached")

    plain = await make(None, data="plain")
    seamed = await make(AgentSessionRuntimeRegistry(), data="seamed")
    for name in ("apply", "_call", "_open"):
        if hasattr(AgentSessions, name):
            monkeypatch.setattr(AgentSessions, name, untouchable)
    monkeypatch.setattr(AttachmentStore, "current", untouchable)
    server_a = create_mcp_server(plain)
    server_b = create_mcp_server(seamed, agent_session_runtimes=seamed.agent_session_runtimes)
    assert server_a is not server_b
    for arguments in ({"task": "@fake reply: same"}, {"task": "@fake empty", "context": "plain context"}):
        a = await run_to_end(plain, **arguments)
        b = await run_to_end(seamed, **arguments)
        assert comparable(a) == comparable(b)
        assert a["agentSession"] is None
        for detail in ("core", "full", "prompt"):
            ga = await plain.call("get_task", {"taskId": a["taskId"], "detail": detail})
            gb = await seamed.call("get_task", {"taskId": b["taskId"], "detail": detail})
            assert sorted(ga) == sorted(gb)
            assert gb["agentSession"] is None
        sa = await plain.call("get_session", {"sessionId": a["sessionKey"]})
        assert sa["agentSession"] is None
    assert [t.name for t in tool_definitions()] == [
        "run_task",
        "check_task",
        "get_task",
        "list_tasks",
        "get_session",
        "list_sessions",
        "cancel_task",
    ]
    assert not (tmp_path / "seamed" / "agent_sessions.sqlite3").exists()
    assert not (tmp_path / "plain" / "agent_sessions.sqlite3").exists()


async def test_a_marker_for_an_unknown_runtime_reads_unavailable_and_the_task_completes(make: Factory) -> None:
    service = await make(None)
    context = "before " + marker("nowhere", state="running", metadata={"k": "v"}) + " after"
    snap = await run_to_end(service, task="@fake reply: fine", context=context)
    assert (snap["status"], snap["summary"], snap["resultSource"]) == ("completed", "fine", "parent")
    session = snap["agentSession"]
    assert session["runtime"] == "nowhere"
    assert (session["state"], session["lastReportedState"]) == ("unavailable", "running")
    assert session["lastError"]["code"] == "unknown_runtime"
    assert session["status"] == "current"
    assert session["metadata"] == {"k": "v"}
    assert session["delegatedTurnId"] == snap["jobId"]
    prompt = await service.call("get_task", {"taskId": snap["taskId"], "detail": "prompt"})
    assert "agent-session" not in prompt["prompt"]["message"]
    assert prompt["prompt"]["context"] == "before  after"


async def test_a_malformed_directive_is_ignored_and_the_task_submits(make: Factory, tmp_path: Path) -> None:
    service = await make(registry_with(FakeRuntime()))
    context = marker(session_id="../../etc/passwd") + block(op="detach", stopRuntime=True)  # no reason
    snap = await run_to_end(service, task="@fake reply: ok", context=context)
    assert (snap["summary"], snap["agentSession"]) == ("ok", None)
    prompt = await service.call("get_task", {"taskId": snap["taskId"], "detail": "prompt"})
    assert "passwd" not in prompt["prompt"]["message"]
    assert not (tmp_path / "c" / "agent_sessions.sqlite3").exists()


async def test_an_answer_is_recovered_from_the_delegated_session_only(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "completed", "finalResponse": "from the session", "lastEventAt": 0}})
    service = await make(registry_with(fake))
    fake.sessions["s-1"]["lastEventAt"] = now_s()
    snap = await run_to_end(service, task="@fake empty", context=marker())
    assert (snap["status"], snap["summary"], snap["resultSource"], snap["terminalReason"]) == (
        "completed",
        "from the session",
        "agent-session",
        "agent_session",
    )
    assert snap["agentSession"]["runtime"] == "fake"
    listed = await service.call("list_tasks", {"view": "all"})
    assert listed["tasks"][0]["resultSource"] == "agent-session"
    # A later, unrelated task in the same conversation is not answered by the stale attachment.
    later = await run_to_end(service, task="@fake empty", sessionKey=snap["sessionKey"])
    assert (later["status"], later["summary"], later["resultSource"]) == ("completed_no_summary", None, None)
    assert later["agentSession"]["delegatedTurnId"] == snap["jobId"]
    # The gateway's own answer always wins.
    own = await run_to_end(service, task="@fake reply: mine", sessionKey=snap["sessionKey"], context=marker())
    assert (own["summary"], own["resultSource"]) == ("mine", "parent")


@pytest.mark.parametrize(
    "reply",
    [
        {"state": "running", "finalResponse": "partial", "latestResponse": "partial"},
        {"state": "completed", "finalResponse": "undated"},
        {"state": "completed", "finalResponse": "too old", "lastEventAt": 1_000_000},
        {"state": "dead", "finalResponse": "dead text", "lastEventAt": "LATER"},
    ],
)
async def test_no_answer_is_recovered_without_a_completed_dated_later_turn(
    make: Factory, reply: dict[str, Any]
) -> None:
    if reply.get("lastEventAt") == "LATER":
        reply["lastEventAt"] = now_s()
    service = await make(registry_with(FakeRuntime(sessions={"s-1": reply})))
    snap = await run_to_end(service, task="@fake empty", context=marker())
    assert (snap["status"], snap["summary"], snap["resultSource"]) == ("completed_no_summary", None, None)


@pytest.mark.parametrize("state", ["needs_input", "needs_permission"])
async def test_a_session_blocked_on_a_human_stays_actionable(make: Factory, state: str) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": state, "latestResponse": "leftover text", "lastEventAt": now_s()}})
    service = await make(registry_with(fake))
    snap = await run_to_end(service, task="@fake empty", context=marker(remoteUrl="https://example.org/s-1"))
    assert snap["summary"].startswith(f"Action required ({state})")
    assert "https://example.org/s-1" in snap["summary"]
    assert "leftover" not in snap["summary"]
    assert snap["agentSession"]["actionRequired"] is True
    assert snap["agentSession"]["state"] == state
    assert snap["status"] == "completed_no_summary"


async def test_failing_reads_never_fail_the_task(make: Factory) -> None:
    for behaviour, code in (("hang", "inspect_timeout"), ("raise", "inspect_failed"), ("none", "session_not_found")):
        fake = FakeRuntime(behaviour=behaviour)
        service = await make(registry_with(fake), data=behaviour, agent_session_call_timeout_ms=50)
        snap = await run_to_end(service, task="@fake reply: still fine", context=marker(state="running"))
        assert (snap["status"], snap["summary"]) == ("completed", "still fine")
        assert snap["agentSession"]["lastError"]["code"] == code
        assert (snap["agentSession"]["state"], snap["agentSession"]["lastReportedState"]) == ("unavailable", "running")


async def test_the_runtime_cannot_rename_the_session(make: Factory) -> None:
    reply = {"state": "running", "sessionId": "renamed", "runtime": "other", "provider": "x"}
    service = await make(registry_with(FakeRuntime(sessions={"s-1": reply})))
    snap = await run_to_end(service, task="@fake reply: x", context=marker())
    session = snap["agentSession"]
    assert (session["runtime"], session["sessionId"], session["provider"]) == ("fake", "s-1", "fake-provider")
    assert session["state"] == "running"


async def test_a_slow_read_landing_after_a_newer_one_is_discarded(make: Factory) -> None:
    # A background refresh (token t) is overtaken by an inspect directive (token t' > t): when the slow one lands,
    # it is discarded rather than rolling the record back to "running".
    gates = [asyncio.Event(), asyncio.Event()]
    answers = [{"state": "running"}, {"state": "completed", "finalResponse": "new"}]
    calls: list[int] = []
    entered = [asyncio.Event(), asyncio.Event()]

    async def inspect(ref: Any, options: CallOptions) -> dict[str, Any]:
        index = len(calls)
        calls.append(index)
        if index < 2:
            entered[index].set()
            await gates[index].wait()
            return answers[index]
        return {"state": "completed", "finalResponse": "new"}

    registry = AgentSessionRuntimeRegistry()
    service = await make(registry)
    first = await run_to_end(service, task="@fake reply: x", context=marker(runtime="gated"))
    registry.register("gated", provider="p", inspect=inspect)
    await service.call("get_task", {"taskId": first["taskId"]})  # starts the slow refresh
    await entered[0].wait()
    directive = block(op="inspect")
    newer = asyncio.create_task(
        service.call("run_task", {"task": "@fake reply: y", "sessionKey": first["sessionKey"], "context": directive})
    )
    await entered[1].wait()
    gates[1].set()
    await newer
    stored = await service.agent_sessions.lineage(first["sessionKey"])
    gates[0].set()
    await service.agent_sessions.wait_for_refreshes()
    after = await service.agent_sessions.lineage(first["sessionKey"])
    assert after[-1].reported_state == "completed"  # the slow "running" was discarded
    assert after[-1].observation_token == stored[-1].observation_token
    seen = await service.call("get_task", {"taskId": first["taskId"]})
    assert seen["agentSession"]["state"] == "completed"


async def test_refresh_replace_continue_and_detach(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}, "s-2": {"state": "idle"}})
    service = await make(registry_with(fake))
    one = await run_to_end(service, task="@fake reply: 1", context=marker(metadata={"a": "1"}))
    key = one["sessionKey"]
    first_id = one["agentSession"]["attachmentId"]
    two = await run_to_end(service, task="@fake reply: 2", sessionKey=key, context=marker(metadata={"b": "2"}))
    assert two["agentSession"]["attachmentId"] == first_id  # a refresh, not new lineage
    assert two["agentSession"]["metadata"] == {"a": "1", "b": "2"}
    assert two["agentSession"]["delegatedTurnId"] == two["jobId"]
    replace = block(op="replace", runtime="fake", sessionId="s-2", reason="moved to s-2")
    three = await run_to_end(service, task="@fake reply: 3", sessionKey=key, context=replace)
    assert three["agentSession"]["replacesAttachmentId"] == first_id
    assert three["agentSession"]["sessionId"] == "s-2"
    four = await run_to_end(
        service, task="@fake reply: 4", sessionKey=key, context=block(op="continue", prompt="go on")
    )
    assert four["agentSession"]["delegatedTurnId"] == four["jobId"]
    continued = [c for c in fake.calls if c[0] == "continue"]
    assert continued[0][1].session_id == "s-2"
    assert continued[0][2].prompt == "go on"
    five = await run_to_end(
        service, task="@fake reply: 5", sessionKey=key, context=block(op="detach", reason="done", stopRuntime=True)
    )
    assert five["agentSession"] is None
    assert [c[2].reason for c in fake.calls if c[0] == "detach"] == ["done"]
    lineage = await service.agent_sessions.lineage(key)
    assert [(a.session_id, a.status, a.reason) for a in lineage] == [
        ("s-1", "superseded", "moved to s-2"),
        ("s-2", "detached", "done"),
    ]
    session = await service.call("get_session", {"sessionId": key})
    assert session["agentSession"] is None


async def test_detach_stops_the_runtime_only_with_stop_runtime_true(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake))
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    await run_to_end(
        service,
        task="@fake reply: 2",
        sessionKey=one["sessionKey"],
        context=block(op="detach", reason="enough", stopRuntime=False),
    )
    assert [c for c in fake.calls if c[0] == "detach"] == []
    read_only = FakeRuntime(sessions={"s-1": {"state": "running"}})
    other = await make(registry_with(read_only, full=False), data="ro")
    one = await run_to_end(other, task="@fake reply: 1", context=marker())
    await run_to_end(
        other,
        task="@fake reply: 2",
        sessionKey=one["sessionKey"],
        context=block(op="detach", reason="stop it", stopRuntime=True),
    )
    lineage = await other.agent_sessions.lineage(one["sessionKey"])
    assert lineage[-1].status == "detached"
    assert lineage[-1].last_error is not None
    assert lineage[-1].last_error["code"] == "unsupported_operation"


async def test_directives_apply_only_after_the_busy_check(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}, "s-2": {"state": "running"}})
    service = await make(registry_with(fake))
    job = await service.call("run_task", {"task": "@fake delay-ms: 1500\n@fake reply: slow", "context": marker()})
    replace = block(op="replace", runtime="fake", sessionId="s-2", reason="r")
    with pytest.raises(SessionBusyError):
        await service.call("run_task", {"task": "x", "sessionKey": job["sessionKey"], "context": replace})
    lineage = await service.agent_sessions.lineage(job["sessionKey"])
    assert [(a.session_id, a.status) for a in lineage] == [("s-1", "current")]


async def test_a_restart_between_attach_and_first_read(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "idle", "finalResponse": "x", "lastEventAt": now_s()}})
    first = await make(AgentSessionRuntimeRegistry(), data="r")
    job = await first.call("run_task", {"task": "@fake reply: kept", "context": marker(state="starting")})
    attached = await first.agent_sessions.lineage(job["sessionKey"])
    token = attached[0].observation_token
    await first.stop()
    # Restarted without the runtime: the record reads back unavailable/unknown_runtime with its last state.
    bare = await make(AgentSessionRuntimeRegistry(), data="r")
    snap = await bare.call("check_task", {"jobId": job["jobId"], **WAIT})
    assert (snap["agentSession"]["state"], snap["agentSession"]["lastReportedState"]) == ("unavailable", "starting")
    assert snap["agentSession"]["lastError"]["code"] == "unknown_runtime"
    assert snap["agentSession"]["observationToken"] > token
    seen = snap["agentSession"]["observationToken"]
    await bare.stop()
    # Restarted with it: the first real read lands, with a token above every stored one.
    again = await make(registry_with(fake), data="r")
    snap = await again.call("check_task", {"jobId": job["jobId"], **WAIT})
    assert snap["agentSession"]["state"] == "idle"
    assert snap["agentSession"]["lastError"] is None
    assert snap["agentSession"]["observationToken"] > seen
    assert snap["summary"] == "kept"


async def test_the_factories_take_the_registry_and_never_share_it(make: Factory) -> None:
    mine, theirs = AgentSessionRuntimeRegistry(), AgentSessionRuntimeRegistry()
    one = await make(None, data="one")
    two = await make(None, data="two")
    create_mcp_server(one, agent_session_runtimes=mine)
    create_mcp_server(two, agent_session_runtimes=theirs)
    assert one.agent_session_runtimes is mine
    assert two.agent_session_runtimes is theirs
    create_mcp_server(one, agent_session_runtimes=mine)  # the same one again is fine
    with pytest.raises(ValueError, match="another agent-session runtime registry"):
        create_mcp_server(one, agent_session_runtimes=theirs)
