"""The seam's contract, each rule in the spec's words, through ConnectService over the in-process gateway:
capabilities absent are unsupported_operation, deadlines give <op>_timeout, a failed read is not a failed session,
attaching something else is an explicit replace, the abort signal merges the caller's cancellation, and detach takes
a freshness token like every other call. A delegation never makes a task fail."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from clawstack.connect import ConnectService
from clawstack.connect.agent_session import AgentSessionRuntimeRegistry, Attachment, CallOptions
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


def signals_of(fake: FakeRuntime, kind: str) -> list[asyncio.Event]:
    return [signal for (called, _, _), signal in zip(fake.calls, fake.signals, strict=True) if called == kind]


async def current(service: ConnectService, key: str) -> Attachment:
    await service.agent_sessions.wait_for_refreshes()
    lineage = await service.agent_sessions.lineage(key)
    assert lineage[-1].status == "current"
    return lineage[-1]


async def test_continue_on_a_runtime_without_a_continue_callback_is_unsupported_operation(make: Factory) -> None:
    # "the absence of a callback is the absence of the capability, and asking for it returns a precise
    # unsupported_operation"
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake, full=False))
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    two = await run_to_end(
        service, task="@fake reply: 2", sessionKey=one["sessionKey"], context=block(op="continue", prompt="go on")
    )
    assert (two["status"], two["summary"]) == ("completed", "2")  # the task still submits
    session = two["agentSession"]
    assert session["capabilities"] == ["inspect"]
    assert (session["lastError"]["code"], session["lastError"]["operation"]) == ("unsupported_operation", "continue")
    assert (session["state"], session["lastReportedState"]) == ("running", "running")  # a read did not fail
    assert session["delegatedTurnId"] == two["jobId"]
    assert [kind for kind, _, _ in fake.calls if kind != "inspect"] == []


async def test_a_continue_that_hangs_past_its_deadline_is_continue_timeout(make: Factory) -> None:
    # "Every callback runs under a wall-clock deadline ... A host that hangs cannot wedge a task's recovery path."
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}}, behaviours={"continue": "hang"})
    service = await make(registry_with(fake), agent_session_call_timeout_ms=50)
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    two = await run_to_end(
        service, task="@fake reply: 2", sessionKey=one["sessionKey"], context=block(op="continue", prompt="go on")
    )
    assert (two["status"], two["summary"]) == ("completed", "2")
    assert (two["agentSession"]["lastError"]["code"], two["agentSession"]["state"]) == ("continue_timeout", "running")
    assert [signal.is_set() for signal in signals_of(fake, "continue")] == [True]


async def test_a_failed_continue_is_recorded_even_after_a_newer_read(make: Factory) -> None:
    # No reading supersedes a command's failure: the continue's error lands though a refresh with a newer token
    # landed while it was running.
    release = asyncio.Event()
    entered = asyncio.Event()

    async def inspect(ref: Any, options: CallOptions) -> dict[str, Any]:
        return {"state": "running"}

    async def continue_(ref: Any, request: Any, options: CallOptions) -> dict[str, Any]:
        entered.set()
        await release.wait()
        raise RuntimeError("the host's transport broke")

    registry = AgentSessionRuntimeRegistry()
    registry.register("slow", provider="p", inspect=inspect, continue_=continue_)
    service = await make(registry)
    one = await run_to_end(service, task="@fake reply: 1", context=marker(runtime="slow"))
    key = one["sessionKey"]
    turn = asyncio.create_task(
        service.call("run_task", {"task": "@fake reply: 2", "sessionKey": key, "context": block(op="continue")})
    )
    await entered.wait()
    await service.call("get_task", {"taskId": one["taskId"]})
    newer = await current(service, key)
    release.set()
    await turn
    record = await current(service, key)
    assert record.last_error is not None
    assert (record.last_error["code"], record.last_error["operation"]) == ("continue_failed", "continue")
    assert record.observation_token == newer.observation_token  # the token never goes down
    assert record.reported_state == "running"


@pytest.mark.parametrize(("behaviour", "code"), [("raise", "inspect_failed"), ("hang", "inspect_timeout")])
async def test_a_failed_read_is_stored_as_an_error_never_as_the_sessions_state(
    make: Factory, behaviour: str, code: str
) -> None:
    # "A failed read is not a failed session ... stored as an error with a branchable code ..., never as the
    # session's state"; it "reads back as a normal unavailable observation ..., carrying the last state anyone
    # reported" (so agentSession.state reads "unavailable" while lastReportedState keeps the report).
    reply = {"state": "needs_input", "latestResponse": "which one?", "lastEventAt": now_s()}
    fake = FakeRuntime(sessions={"s-1": reply})
    service = await make(registry_with(fake), agent_session_call_timeout_ms=50)
    one = await run_to_end(
        service, task="@fake empty", context=marker(state="running", remoteUrl="https://example.org/s-1")
    )
    before = await current(service, one["sessionKey"])
    assert before.reported_state == "needs_input"
    fake.behaviour = behaviour
    snap = await service.call("check_task", {"jobId": one["jobId"], **WAIT})
    session = snap["agentSession"]
    assert (session["lastError"]["code"], session["lastError"]["operation"]) == (code, "inspect")
    assert (session["state"], session["lastReportedState"]) == ("unavailable", "needs_input")
    assert session["observation"]["state"] == "needs_input"
    assert session["actionRequired"] is True  # blocked on a human stays actionable
    assert snap["summary"].startswith("Action required (needs_input)")
    after = await current(service, one["sessionKey"])
    unchanged = ("status", "reported_state", "observation", "observed_at_ms", "delegated_turn_id", "attachment_id")
    assert [getattr(after, name) for name in unchanged] == [getattr(before, name) for name in unchanged]
    fake.behaviour = None
    healed = await service.call("check_task", {"jobId": one["jobId"], **WAIT})
    assert (healed["agentSession"]["state"], healed["agentSession"]["lastError"]) == ("needs_input", None)


async def test_attaching_something_else_takes_an_explicit_replace(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    # "A conversation has zero or one current attachment. Attaching something else is an explicit replace."
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}, "s-2": {"state": "idle"}})
    service = await make(registry_with(fake))
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    key, first_id = one["sessionKey"], one["agentSession"]["attachmentId"]
    # An attach directive naming another session, and a marker naming another runtime's, are ignored.
    for context in (block(op="attach", runtime="fake", sessionId="s-2"), marker(runtime="zed", session_id="s-2")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="clawstack.connect.agent_session"):
            other = await run_to_end(service, task="@fake reply: 2", sessionKey=key, context=context)
        assert (other["status"], other["summary"]) == ("completed", "2")  # the task still submits
        session = other["agentSession"]
        assert (session["attachmentId"], session["sessionId"], session["replacesAttachmentId"]) == (
            first_id,
            "s-1",
            None,
        )
        assert session["delegatedTurnId"] == one["jobId"]  # the ignored attach rebound nothing
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "another session" in warnings[0]
        assert not any(value in warnings[0] for value in ("s-1", "s-2", "fake", "zed"))  # names no value
    lineage = await service.agent_sessions.lineage(key)
    assert [(a.session_id, a.status) for a in lineage] == [("s-1", "current")]
    # Only a replace, with its reason, mints the new record, chained by replacesAttachmentId.
    replace = block(op="replace", runtime="fake", sessionId="s-2", reason="moved to s-2")
    three = await run_to_end(service, task="@fake reply: 3", sessionKey=key, context=replace)
    assert (three["agentSession"]["sessionId"], three["agentSession"]["replacesAttachmentId"]) == ("s-2", first_id)
    lineage = await service.agent_sessions.lineage(key)
    assert [(a.session_id, a.status, a.reason) for a in lineage] == [
        ("s-1", "superseded", "moved to s-2"),
        ("s-2", "current", "moved to s-2"),
    ]


async def test_a_marker_naming_another_session_of_the_same_runtime_is_an_implicit_replace(make: Factory) -> None:
    # Reference hosts re-send the marker of the session they moved to: the old record is superseded and the new one
    # replaces it, with the state the host reported in the marker (attaching calls no runtime).
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}, "s-2": {"state": "idle"}})
    service = await make(registry_with(fake))
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    key, first_id = one["sessionKey"], one["agentSession"]["attachmentId"]
    calls = len(fake.calls)
    started = await service.call(
        "run_task", {"task": "@fake reply: 2", "sessionKey": key, "context": marker(session_id="s-2", state="starting")}
    )
    assert len(fake.calls) == calls  # the attach itself called nothing
    stored = await service.agent_sessions.stored(key)
    assert stored is not None
    assert (stored.session_id, stored.state, stored.replaces_attachment_id) == ("s-2", "starting", first_id)
    await run_to_end_of(service, started["jobId"])
    lineage = await service.agent_sessions.lineage(key)
    assert [(a.session_id, a.status) for a in lineage] == [("s-1", "superseded"), ("s-2", "current")]
    assert lineage[0].superseded_by == lineage[1].attachment_id
    assert lineage[0].reason == lineage[1].reason == "the host's marker named another session of the same runtime"


async def run_to_end_of(service: ConnectService, job_id: str) -> dict[str, Any]:
    for _ in range(20):
        snap = await service.call("check_task", {"jobId": job_id, **WAIT})
        if snap["isTerminal"]:
            return snap
    raise AssertionError("the task did not end")


async def test_cancelling_the_operation_fires_the_callbacks_abort_signal(make: Factory) -> None:
    # "receives an AbortSignal merging the caller's with that deadline"
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}}, behaviours={"continue": "hang"})
    service = await make(registry_with(fake))  # the default 60 s deadline: only the cancellation can fire
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    await service.agent_sessions.wait_for_refreshes()
    fake.called.clear()
    arguments = {"task": "@fake reply: 2", "sessionKey": one["sessionKey"], "context": block(op="continue")}
    call = asyncio.create_task(service.call("run_task", arguments))
    await fake.called.wait()
    (signal,) = signals_of(fake, "continue")
    assert not signal.is_set()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert signal.is_set()
    # The task had been submitted before the callback was reached, and ends normally.
    listed = await service.call("list_tasks", {"view": "all"})
    newest = listed["tasks"][0]
    assert newest["jobId"] != one["jobId"]
    for _ in range(20):
        snap = await service.call("check_task", {"jobId": newest["jobId"], **WAIT})
        if snap["isTerminal"]:
            break
    assert (snap["status"], snap["summary"]) == ("completed", "2")


async def test_detach_takes_a_freshness_token_like_every_other_call(make: Factory) -> None:
    # "Every read takes a monotonic observationToken before it calls out; a slow read that lands after a newer one
    # is discarded rather than rolling the record backwards."
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake))
    for stop_runtime in (True, False):
        fake.behaviours.pop("inspect", None)
        one = await run_to_end(service, task="@fake reply: 1", context=marker())
        key = one["sessionKey"]
        before = await current(service, key)
        fake.gate.clear()
        fake.behaviours["inspect"] = "gate"
        await service.call("get_task", {"taskId": one["taskId"]})  # a read in flight, started before the detach
        fake.sessions["s-1"] = {"state": "dead"}
        detach = block(op="detach", reason="done", stopRuntime=stop_runtime)
        await run_to_end(service, task="@fake reply: 2", sessionKey=key, context=detach)
        detached = (await service.agent_sessions.lineage(key))[-1]
        assert detached.status == "detached"
        assert detached.observation_token > before.observation_token
        assert detached.reported_state == ("dead" if stop_runtime else "running")
        fake.gate.set()
        await service.agent_sessions.wait_for_refreshes()
        assert (await service.agent_sessions.lineage(key))[-1] == detached  # the older read was discarded
        fake.sessions["s-1"] = {"state": "running"}
