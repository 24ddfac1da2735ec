"""Reads of an attachment: a snapshot never waits on the runtime (get_task and a check_task poll answer from the
stored record and refresh it in the background, one refresh in flight per attachment, seen by the next read), a
wait gives the refresh only what is left of it (on the injected clock), stopping aborts refreshes, and the read-only
tools write nothing but observations."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.common.clock import ManualClock
from clawstack.connect.agent_session import Attachment, Directive
from clawstack.connect.agent_session.sessions import AgentSessions
from tests.unit.connect.agent_session.fakes import WAIT, Factory, FakeRuntime, marker, registry_with, run_to_end

OBSERVATION_FIELDS = frozenset(
    {"reported_state", "observation", "observed_at_ms", "last_error", "observation_token", "updated_at_ms"}
)
"""What a read may write: the observation, its error, its token and time."""
KEY = "agent:main:channel:clawconnect:k"
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def identity(attachment: Attachment) -> dict[str, Any]:
    """Everything but what a read may write."""
    return {k: v for k, v in dataclasses.asdict(attachment).items() if k not in OBSERVATION_FIELDS}


async def attached(sessions: AgentSessions, **extra: Any) -> Attachment:
    attach = Directive(action="attach", runtime="fake", session_id="s-1", state="running", **extra)
    await sessions.apply(KEY, "job_1", attach, "the task", owner="operator")
    (record,) = await sessions.lineage(KEY)
    return record


async def test_get_task_and_a_check_task_poll_answer_from_the_stored_record(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake))  # the default 60 s deadline: a read waiting on it would show
    one = await run_to_end(service, task="@fake reply: 1", context=marker())
    await service.agent_sessions.wait_for_refreshes()
    fake.behaviours["inspect"] = "gate"
    fake.sessions["s-1"] = {"state": "needs_input"}
    inspects = sum(kind == "inspect" for kind, _, _ in fake.calls)
    reads = [
        service.call("get_task", {"taskId": one["taskId"]}),
        service.call("get_task", {"taskId": one["taskId"], "detail": "full"}),
        service.call("check_task", {"jobId": one["jobId"], "mode": "poll"}),
        service.call("get_session", {"sessionId": one["sessionKey"]}),
    ]
    for read in reads:
        snap = await asyncio.wait_for(read, 5)
        assert snap["agentSession"]["state"] == "running"  # as stored
    assert sum(kind == "inspect" for kind, _, _ in fake.calls) == inspects + 1  # one refresh in flight
    fake.gate.set()
    await service.agent_sessions.wait_for_refreshes()
    seen = await service.call("get_task", {"taskId": one["taskId"]})
    assert seen["agentSession"]["state"] == "needs_input"  # the next read sees the refresh


async def test_a_wait_gives_the_refresh_only_what_is_left_of_it(tmp_path: Path) -> None:
    clock = ManualClock()
    fake = FakeRuntime(sessions={"s-1": {"state": "idle"}}, behaviour="gate")
    sessions = AgentSessions(registry_with(fake), tmp_path, clock=clock, call_timeout_ms=60_000)
    await sessions.start()
    try:
        await attached(sessions)
        waiting = asyncio.create_task(sessions.read(KEY, wait_s=5))
        await fake.called.wait()
        assert clock.sleepers == 1  # the wait's deadline, on the injected clock
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not waiting.done()
        clock.advance(0.2)
        record = await asyncio.wait_for(waiting, 5)
        assert record is not None
        assert (record.reported_state, record.observation) == ("running", None)  # the refresh did not land in time
        # A refresh that lands within the wait is answered.
        fake.gate.set()
        await sessions.wait_for_refreshes()
        fake.gate.clear()
        fake.sessions["s-1"] = {"state": "completed"}
        waiting = asyncio.create_task(sessions.read(KEY, wait_s=5))
        await asyncio.sleep(0)
        fake.gate.set()
        record = await asyncio.wait_for(waiting, 5)
        assert record is not None
        assert record.reported_state == "completed"
    finally:
        await sessions.stop()


async def test_stopping_aborts_the_refreshes_in_flight(tmp_path: Path) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "idle"}}, behaviour="hang")
    sessions = AgentSessions(registry_with(fake), tmp_path, clock=ManualClock(), call_timeout_ms=60_000)
    await sessions.start()
    await attached(sessions)
    assert await sessions.read(KEY) is not None
    await fake.called.wait()
    await asyncio.wait_for(sessions.stop(), 5)
    assert [signal.is_set() for signal in fake.signals] == [True]


async def test_read_only_tools_write_nothing_but_observations(make: Factory) -> None:
    # The runtime tries to rename the session, change its provider and metadata; then it fails.
    renaming = {"state": "completed", "sessionId": "x", "runtime": "y", "provider": "z", "metadata": {"k": "new"}}
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake), agent_session_call_timeout_ms=50)
    one = await run_to_end(
        service, task="@fake reply: 1", context=marker(metadata={"k": "v"}, remoteUrl="https://example.org/s")
    )
    key = one["sessionKey"]
    await service.agent_sessions.wait_for_refreshes()
    before = await service.agent_sessions.lineage(key)
    for reply, behaviour in ((renaming, None), (renaming, "raise"), (renaming, "hang"), (renaming, "none")):
        fake.sessions["s-1"], fake.behaviour = reply, behaviour
        calls = len(fake.calls)
        await service.call("list_tasks", {"view": "all"})
        await service.call("list_sessions", {})
        assert len(fake.calls) == calls  # the list tools never read a runtime
        for detail in ("core", "summary", "updates", "full", "prompt"):
            await service.call("get_task", {"taskId": one["taskId"], "detail": detail})
        await service.call("check_task", {"jobId": one["jobId"], "mode": "poll"})
        await service.call("check_task", {"jobId": one["jobId"], **WAIT})
        for mode in ("snapshot", "events", "tail", "tasks"):
            await service.call("get_session", {"sessionId": key, "mode": mode})
        await service.agent_sessions.wait_for_refreshes()
        after = await service.agent_sessions.lineage(key)
        assert [identity(a) for a in after] == [identity(a) for a in before]
    assert after[-1].observation is not None
    assert after[-1].observation.state == "completed"  # observations were written


@settings(max_examples=40, deadline=None)
@given(reply=JSON, behaviour=st.sampled_from([None, "raise", "none"]))
def test_no_reply_makes_a_read_write_anything_but_an_observation(reply: Any, behaviour: str | None) -> None:
    async def scenario(directory: Path) -> None:
        fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
        sessions = AgentSessions(registry_with(fake), directory, clock=ManualClock(), call_timeout_ms=1000)
        await sessions.start()
        try:
            before = await attached(sessions, metadata={"k": "v"}, host="h")
            fake.sessions["s-1"], fake.behaviour = reply, behaviour
            await sessions.read(KEY)
            await sessions.wait_for_refreshes()
            (after,) = await sessions.lineage(KEY)
            assert identity(after) == identity(before)
            assert after.observation_token > before.observation_token
        finally:
            await sessions.stop()

    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(scenario(Path(directory)))
