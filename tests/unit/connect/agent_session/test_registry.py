"""The runtime registry: ids, callbacks and capabilities are checked at registration; registries never share."""

from __future__ import annotations

from typing import Any

import pytest

import clawstack.connect.agent_session as agent_session
from clawstack.connect import ConnectError
from clawstack.connect.agent_session import (
    RUNTIME_ID_PATTERN,
    STATES,
    AgentSessionRegistrationError,
    AgentSessionRuntimeRegistry,
)
from tests.unit.connect.agent_session.fakes import FakeRuntime


async def inspect(ref: Any, options: Any) -> None:
    return None


@pytest.mark.parametrize("bad", ["", "-lead", ".lead", "_lead", "a" * 65, "a/b", "a b", "a:b", "ü", "a\n", 5, None])
def test_a_bad_runtime_id_is_refused(bad: Any) -> None:
    registry = AgentSessionRuntimeRegistry()
    with pytest.raises(AgentSessionRegistrationError) as info:
        registry.register(bad, provider="p", inspect=inspect)
    assert info.value.code == "agent_session_runtime_id_invalid"
    assert len(registry) == 0


@pytest.mark.parametrize("good", ["a", "A9", "claude-fleet", "x.y_z-1", "a" * 64])
def test_good_runtime_ids(good: str) -> None:
    registry = AgentSessionRuntimeRegistry()
    registry.register(good, provider="p", inspect=inspect)
    assert good in registry
    assert registry.ids() == (good,)


def test_duplicates_and_callbacks_are_refused() -> None:
    registry = AgentSessionRuntimeRegistry()
    registry.register("one", provider="p", inspect=inspect)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"id": "one", "provider": "p", "inspect": inspect}, "agent_session_runtime_duplicate"),
        ({"id": "two", "provider": "p", "inspect": None}, "agent_session_callback_invalid"),
        ({"id": "two", "provider": "p", "inspect": "not callable"}, "agent_session_callback_invalid"),
        ({"id": "two", "provider": "p", "inspect": inspect, "continue_": 3}, "agent_session_callback_invalid"),
        ({"id": "two", "provider": "p", "inspect": inspect, "detach": "x"}, "agent_session_callback_invalid"),
        ({"id": "two", "provider": "", "inspect": inspect}, "agent_session_provider_invalid"),
        ({"id": "two", "provider": 7, "inspect": inspect}, "agent_session_provider_invalid"),
    ]
    for kwargs, code in cases:
        runtime_id = kwargs.pop("id")
        with pytest.raises(AgentSessionRegistrationError) as info:
            registry.register(runtime_id, **kwargs)
        assert info.value.code == code, kwargs
        assert isinstance(info.value, ConnectError)
    assert registry.ids() == ("one",)


def test_capabilities_are_derived_from_the_callbacks() -> None:
    fake = FakeRuntime()
    registry = AgentSessionRuntimeRegistry()
    registry.register("read-only", provider="p", inspect=fake.inspect)
    registry.register("cont", provider="p", inspect=fake.inspect, continue_=fake.continue_)
    registry.register("full", provider="p", inspect=fake.inspect, continue_=fake.continue_, detach=fake.detach)
    assert registry.capabilities("read-only") == frozenset({"inspect"})
    assert registry.capabilities("cont") == frozenset({"inspect", "continue"})
    assert registry.capabilities("full") == frozenset({"inspect", "continue", "detach"})
    assert registry.capabilities("nobody") == frozenset()
    assert len(registry) == 3
    assert "nobody" not in registry


def test_registries_never_share_runtimes() -> None:
    first, second = AgentSessionRuntimeRegistry(), AgentSessionRuntimeRegistry()
    first.register("a", provider="p", inspect=inspect)
    assert "a" not in second
    second.register("a", provider="q", inspect=inspect)
    assert first.get("a") is not second.get("a")


def test_there_is_no_spawn_and_no_list() -> None:
    registry = AgentSessionRuntimeRegistry()
    for name in ("spawn", "start", "list", "list_sessions", "sessions", "discover"):
        assert not hasattr(registry, name)
    with pytest.raises(TypeError):
        registry.register("a", provider="p", inspect=inspect, spawn=inspect)  # type: ignore[call-arg]


def test_the_vocabulary() -> None:
    assert RUNTIME_ID_PATTERN == "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
    assert STATES == (
        "starting",
        "running",
        "idle",
        "completed",
        "needs_input",
        "needs_permission",
        "stale",
        "dead",
        "failed",
        "unavailable",
        "unknown",
    )


def test_exported_members() -> None:
    public = {
        name
        for name in dir(agent_session)
        if not name.startswith("_") and not isinstance(getattr(agent_session, name), type(agent_session))
    }
    assert sorted(agent_session.__all__) == sorted(public)
