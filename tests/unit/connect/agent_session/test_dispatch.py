"""Dispatch never raises: deadlines at the seam, merged cancellation, structured failure codes, unavailable
observations that carry the last reported state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clawstack.connect.agent_session import (
    AgentSessionRef,
    AgentSessionRuntimeRegistry,
    ContinueRequest,
    DetachRequest,
    Dispatcher,
    call_timeout_ms_from_env,
)
from tests.unit.connect.agent_session.fakes import FakeRuntime, registry_with

REF = AgentSessionRef("fake", "s-1")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, 60_000), ({"AGENT_SESSION_CALL_TIMEOUT_MS": "250"}, 250), ({"AGENT_SESSION_CALL_TIMEOUT_MS": "x"}, 60_000)]
    + [({"AGENT_SESSION_CALL_TIMEOUT_MS": v}, 60_000) for v in ("0", "-5", "1.5", "99999999999")],
)
def test_the_deadline_comes_from_the_environment(environ: dict[str, str], expected: int) -> None:
    assert call_timeout_ms_from_env(environ) == expected


async def test_an_answer_is_normalised() -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "completed", "finalResponse": "done", "sessionId": "renamed"}})
    result = await Dispatcher(registry_with(fake)).inspect(REF)
    assert result.ok
    assert (result.observation.state, result.observation.final_response) == ("completed", "done")
    assert fake.calls[0][1] == REF
    assert fake.signals[0].is_set() is False


async def test_a_hung_callback_times_out_at_the_seam_and_is_signalled() -> None:
    fake = FakeRuntime(behaviour="hang")
    dispatcher = Dispatcher(registry_with(fake), call_timeout_ms=60_000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for operation, request in (
        ("inspect", None),
        ("continue", ContinueRequest("p", {})),
        ("detach", DetachRequest("r", True)),
    ):
        result = await dispatcher.dispatch(operation, REF, request, timeout_ms=50, last_state="running")  # type: ignore[arg-type]
        assert result.error is not None
        assert result.error.code == f"{operation}_timeout"
        assert (result.observation.state, result.last_state) == ("unavailable", "running")
    assert loop.time() - started < 5
    assert all(signal.is_set() for signal in fake.signals)


async def test_a_callback_that_ignores_cancellation_cannot_wedge_the_caller() -> None:
    release = asyncio.Event()

    async def stubborn(ref: Any, options: Any) -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # a badly behaved host swallows the cancellation

    registry = AgentSessionRuntimeRegistry()
    registry.register("fake", provider="p", inspect=stubborn)
    result = await Dispatcher(registry).inspect(REF, timeout_ms=30)
    assert result.error is not None
    assert result.error.code == "inspect_timeout"
    release.set()


async def test_the_callers_cancellation_is_merged() -> None:
    fake = FakeRuntime(behaviour="hang")
    cancel = asyncio.Event()
    dispatcher = Dispatcher(registry_with(fake))
    call = asyncio.create_task(dispatcher.inspect(REF, cancel=cancel))
    await fake.called.wait()
    cancel.set()
    result = await asyncio.wait_for(call, 5)
    assert result.error is not None
    assert result.error.code == "inspect_failed"
    assert fake.signals[0].is_set()


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [("raise", "inspect_failed"), ("none", "session_not_found")],
)
async def test_failures_are_structured(behaviour: str, code: str) -> None:
    result = await Dispatcher(registry_with(FakeRuntime(behaviour=behaviour))).inspect(REF, last_state="idle")
    assert result.error is not None
    assert result.error.code == code
    assert result.observation.state == "unavailable"
    assert result.last_state == "idle"
    assert "secret-token" not in result.error.message
    assert result.to_json()["ok"] is False


async def test_unknown_runtime_and_unsupported_operation() -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    dispatcher = Dispatcher(registry_with(fake, full=False))
    unknown = await dispatcher.inspect(AgentSessionRef("elsewhere", "s-1"), last_state="running")
    assert unknown.error is not None
    assert (unknown.error.code, unknown.observation.state, unknown.last_state) == (
        "unknown_runtime",
        "unavailable",
        "running",
    )
    for operation in ("continue", "detach"):
        result = await dispatcher.dispatch(operation, REF)  # type: ignore[arg-type]
        assert result.error is not None
        assert result.error.code == "unsupported_operation"
    assert [kind for kind, _, _ in fake.calls] == []


@pytest.mark.parametrize("junk", [{"state": "exploded"}, {"state": 7}, "running", 12, ["x"], {}])
async def test_junk_replies_read_unknown(junk: Any) -> None:
    fake = FakeRuntime(sessions={"s-1": junk})
    result = await Dispatcher(registry_with(fake)).inspect(REF)
    assert result.ok
    assert result.observation.state == "unknown"


async def test_a_synchronous_callback_is_tolerated() -> None:
    registry = AgentSessionRuntimeRegistry()
    registry.register("fake", provider="p", inspect=lambda ref, options: {"state": "idle"})
    result = await Dispatcher(registry).inspect(REF)
    assert result.observation.state == "idle"


async def test_a_per_call_override_beats_the_default() -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}}, behaviour="gate")
    dispatcher = Dispatcher(registry_with(fake), call_timeout_ms=20)
    call = asyncio.create_task(dispatcher.inspect(REF, timeout_ms=30_000))
    await fake.called.wait()
    await asyncio.sleep(0.1)  # well past the 20 ms default
    fake.gate.set()
    result = await call
    assert result.ok


async def test_cancelling_the_caller_sets_the_signal_and_abandons_the_callback() -> None:
    # "receives an AbortSignal merging the caller's with that deadline": the caller here is the task awaiting
    # dispatch (the ClawConnect operation), cancelled long before the 60 s deadline.
    fake = FakeRuntime(behaviour="hang")
    dispatcher = Dispatcher(registry_with(fake))
    call = asyncio.create_task(dispatcher.dispatch("continue", REF, ContinueRequest("p", {})))
    await fake.called.wait()
    assert not fake.signals[0].is_set()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert fake.signals[0].is_set()


async def test_a_callback_is_cancelled_when_its_caller_is() -> None:
    ended: list[str] = []
    started = asyncio.Event()

    async def inspect(ref: Any, options: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("signalled" if options.signal.is_set() else "unsignalled")

    registry = AgentSessionRuntimeRegistry()
    registry.register("fake", provider="p", inspect=inspect)
    call = asyncio.create_task(Dispatcher(registry).inspect(REF))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(10):
        if ended:
            break
        await asyncio.sleep(0)
    assert ended == ["signalled"]


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(None, 40), (0, 40), (-5, 40), (True, 40), (25, 25), (100, 100), (10**9, 100)],
)
async def test_a_per_call_deadline_is_bounded_by_the_configured_maximum(requested: Any, expected: int) -> None:
    seen: list[int] = []

    async def inspect(ref: Any, options: Any) -> dict[str, Any]:
        seen.append(options.deadline_ms)
        return {"state": "running"}

    registry = AgentSessionRuntimeRegistry()
    registry.register("fake", provider="p", inspect=inspect)
    dispatcher = Dispatcher(registry, call_timeout_ms=40, max_call_timeout_ms=100)
    assert dispatcher.deadline_ms(requested) == expected
    assert (await dispatcher.inspect(REF, timeout_ms=requested)).ok
    assert seen == [expected]


async def test_a_per_call_deadline_past_the_maximum_still_times_out_at_the_maximum() -> None:
    fake = FakeRuntime(behaviour="hang")
    dispatcher = Dispatcher(registry_with(fake), call_timeout_ms=20, max_call_timeout_ms=50)
    result = await asyncio.wait_for(dispatcher.inspect(REF, timeout_ms=3_600_000), 5)
    assert result.error is not None
    assert result.error.code == "inspect_timeout"
    assert "50 ms" in result.error.message


@pytest.mark.parametrize(("default", "maximum"), [(0, 100), (-1, 100), (101, 100)])
def test_the_configured_deadline_must_be_within_the_maximum(default: int, maximum: int) -> None:
    with pytest.raises(ValueError, match="call_timeout_ms"):
        Dispatcher(AgentSessionRuntimeRegistry(), call_timeout_ms=default, max_call_timeout_ms=maximum)
