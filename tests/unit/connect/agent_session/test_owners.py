"""Attachments belong to callers: the caller whose conversation made an attachment is its owner, every callback
receives that owner (``options.caller``), a caller's directives act only on its own attachment, and a session
another caller's conversation has attached cannot be attached. Each refusal has its positive control."""

from __future__ import annotations

import logging

import pytest

from clawstack.connect import Caller
from tests.unit.connect.agent_session.fakes import Factory, FakeRuntime, block, marker, registry_with, run_to_end

ALICE, BOB = Caller.user("Alice"), Caller.user("Bob")


async def test_every_callback_receives_the_attachments_owner(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake))
    one = await run_to_end(service, ALICE, task="@fake reply: 1", context=marker())
    await run_to_end(
        service, ALICE, task="@fake reply: 2", sessionKey=one["sessionKey"], context=block(op="continue", prompt="go")
    )
    await run_to_end(
        service,
        ALICE,
        task="@fake reply: 3",
        sessionKey=one["sessionKey"],
        context=block(op="detach", reason="done", stopRuntime=True),
    )
    await service.agent_sessions.wait_for_refreshes()
    assert {kind for kind, _, _ in fake.calls} == {"inspect", "continue", "detach"}
    assert set(fake.callers) == {"user:Alice"}
    lineage = await service.agent_sessions.lineage(one["sessionKey"])
    assert [a.owner for a in lineage] == ["user:Alice"]


async def test_a_session_another_caller_attached_cannot_be_attached(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}, "s-2": {"state": "running"}})
    service = await make(registry_with(fake))
    hers = await run_to_end(service, ALICE, task="@fake reply: 1", context=marker())
    with caplog.at_level(logging.WARNING, logger="clawstack.connect.agent_session"):
        his = await run_to_end(service, BOB, task="@fake reply: 2", context=marker())
    assert (his["status"], his["summary"], his["agentSession"]) == ("completed", "2", None)  # the task still ran
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("another caller" in w for w in warnings)
    assert not any("s-1" in w or "Alice" in w for w in warnings)
    assert await service.agent_sessions.lineage(his["sessionKey"]) == []
    # Nor by an explicit replace from a conversation of his own that has an attachment.
    own = await run_to_end(service, BOB, task="@fake reply: 3", context=marker(session_id="s-2"))
    replace = block(op="replace", runtime="fake", sessionId="s-1", reason="take it")
    taken = await run_to_end(service, BOB, task="@fake reply: 4", sessionKey=own["sessionKey"], context=replace)
    assert taken["agentSession"]["sessionId"] == "s-2"
    # Positive controls: Bob attaches a session nobody else has; Alice attaches hers in a second conversation.
    assert own["agentSession"]["sessionId"] == "s-2"
    second = await run_to_end(service, ALICE, task="@fake reply: 5", context=marker())
    assert second["agentSession"]["sessionId"] == "s-1"
    assert hers["agentSession"]["sessionId"] == "s-1"


async def test_a_callers_directives_reach_only_its_own_attachment(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake))
    hers = await run_to_end(service, ALICE, task="@fake reply: 1", context=marker())
    stop = block(op="detach", reason="mine now", stopRuntime=True, runtime="fake", sessionId="s-1")
    his = await run_to_end(service, BOB, task="@fake reply: 2", context=stop)
    assert his["status"] == "completed"
    assert "detach" not in {kind for kind, _, _ in fake.calls}
    current = await service.agent_sessions.stored(hers["sessionKey"])
    assert current is not None
    assert (current.session_id, current.status) == ("s-1", "current")
    # The owner can.
    await run_to_end(service, ALICE, task="@fake reply: 3", sessionKey=hers["sessionKey"], context=stop)
    assert [
        (kind, caller) for (kind, _, _), caller in zip(fake.calls, fake.callers, strict=True) if kind == "detach"
    ] == [("detach", "user:Alice")]


async def test_the_provider_recorded_is_the_registered_runtimes(make: Factory) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running"}})
    service = await make(registry_with(fake))
    registered = await run_to_end(service, ALICE, task="@fake reply: 1", context=marker(provider="spoofed"))
    assert registered["agentSession"]["provider"] == "fake-provider"
    unknown = await run_to_end(service, ALICE, task="@fake reply: 2", context=marker(runtime="gone", provider="x"))
    assert unknown["agentSession"]["provider"] is None
    assert unknown["agentSession"]["lastError"]["code"] == "unknown_runtime"
