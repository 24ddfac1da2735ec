"""Tests for the tool hooks (clawstack.gateway.plugins.tool_hooks): rewrite, block, failure, re-validation, policy.

Plugins are real plugins loaded by a real :class:`PluginLoader`; their hooks are registered through their real
``api.register_hook`` and run by the same :func:`before_tool_call` / :func:`after_tool_call` the agent loop calls.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.gateway.plugins import (
    AfterToolCallEvent,
    BeforeToolCallEvent,
    BeforeToolCallResult,
    CommandRegistrationError,
    PluginApi,
    PluginLoader,
    PluginRetiredError,
    after_tool_call,
    before_tool_call,
)
from clawstack.gateway.plugins.tool_hooks import HOOK_FAILURE_REASON, schema_problem
from tests.unit.gateway.test_plugins import loaded, make_config, write_plugin

QUIET = "def register(api):\n    pass\n"

WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "content": {"type": "string"},
        "mode": {"enum": ["create", "overwrite"]},
        "lines": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}
ALLOWED = frozenset({"write", "read"})


def event(tool_name: str = "write", **params: Any) -> BeforeToolCallEvent:
    return BeforeToolCallEvent(
        tool_name=tool_name,
        params=params or {"path": "notes.txt", "content": "hello"},
        run_id="run-1",
        tool_call_id="call-1",
        session_key="agent:main:main",
        agent_id="main",
    )


def after_event(tool_name: str = "write", **overrides: Any) -> AfterToolCallEvent:
    fields: dict[str, Any] = {
        "tool_name": tool_name,
        "params": {"path": "notes.txt", "content": "hello"},
        "run_id": "run-1",
        "tool_call_id": "call-1",
        "session_key": "agent:main:main",
        "agent_id": "main",
        "result": "wrote 5 bytes",
        "error": None,
        "duration_ms": 12,
        **overrides,
    }
    return AfterToolCallEvent(**fields)


@pytest.fixture
def loader(tmp_path: Path) -> PluginLoader:
    for plugin_id in ("a-first", "b-second", "c-third"):
        write_plugin(tmp_path, plugin_id, QUIET)
    plugins = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    plugins.load()
    return plugins


def apis(loader: PluginLoader) -> tuple[PluginApi, PluginApi, PluginApi]:
    return loaded(loader, "a-first")[1], loaded(loader, "b-second")[1], loaded(loader, "c-third")[1]


async def decide(loader: PluginLoader, call: BeforeToolCallEvent | None = None, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"schema": WRITE_SCHEMA, "allowed_tools": ALLOWED, **kwargs}
    return await before_tool_call(loader.hooks, call or event(), **options)


# -- no hooks, policy ----------------------------------------------------------------------------------------------


async def test_without_hooks_the_call_runs_unchanged(loader: PluginLoader) -> None:
    call = event()
    decision = await decide(loader, call)
    assert not decision.blocked
    assert (decision.tool_name, decision.params, decision.rewritten_by) == ("write", call.params, ())
    assert decision.code is None


async def test_a_tool_outside_the_policy_is_refused_before_any_hook(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)
    seen: list[str] = []

    async def hook(e: BeforeToolCallEvent) -> None:
        seen.append(e.tool_name)

    first.register_hook("before_tool_call", hook)
    decision = await decide(loader, event("exec", command="ls"))
    assert decision.blocked
    assert decision.code == "tool_not_allowed"
    assert decision.reason == 'the tool "exec" is not allowed here'
    assert decision.plugin_id is None
    assert seen == []


# -- rewrites ------------------------------------------------------------------------------------------------------


async def test_rewrites_chain_in_load_order_and_merge_over_the_params(loader: PluginLoader) -> None:
    first, second, third = apis(loader)
    seen: list[tuple[str, dict[str, Any]]] = []

    async def confine(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        seen.append(("a", dict(e.params)))
        return BeforeToolCallResult(params={"path": "sandbox/" + e.params["path"]})

    def mark(e: BeforeToolCallEvent) -> BeforeToolCallResult:  # a plain function works too
        seen.append(("b", dict(e.params)))
        e.params["content"] = "mutating my copy changes nothing"
        return BeforeToolCallResult(params={"mode": "create"})

    async def observe(e: BeforeToolCallEvent) -> None:
        seen.append(("c", dict(e.params)))

    third.register_hook("before_tool_call", observe)
    first.register_hook("before_tool_call", confine)
    second.register_hook("before_tool_call", mark)
    loader.reload("c-third")  # a reloaded plugin's hooks come after the others'
    loaded(loader, "c-third")[1].register_hook("before_tool_call", observe)

    call = event()
    decision = await decide(loader, call)
    assert not decision.blocked, decision
    assert decision.params == {"path": "sandbox/notes.txt", "content": "hello", "mode": "create"}
    assert decision.rewritten_by == ("a-first", "b-second")
    assert seen == [
        ("a", {"path": "notes.txt", "content": "hello"}),
        ("b", {"path": "sandbox/notes.txt", "content": "hello"}),
        ("c", {"path": "sandbox/notes.txt", "content": "hello", "mode": "create"}),
    ]
    assert call.params == {"path": "notes.txt", "content": "hello"}  # the caller's params are untouched


async def test_a_rewrite_that_breaks_the_schema_is_refused(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)

    async def bad(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(params={"lines": ["secret-value"]})

    first.register_hook("before_tool_call", bad)
    decision = await decide(loader)
    assert decision.blocked
    assert decision.code == "tool_rewrite_invalid"
    assert decision.plugin_id == "a-first"
    assert decision.reason.startswith(
        "the arguments rewritten by the before_tool_call hook of plugin 'a-first' do not match the tool's schema:"
    )
    assert "$.lines[0] does not satisfy type" in decision.reason
    assert "secret-value" not in decision.reason  # the rule and the path, never a value


@pytest.mark.parametrize(
    ("rewrite", "rule"),
    [
        ({"extra": 1}, "additionalProperties"),
        ({"mode": "append"}, "enum"),
        ({"path": None}, "type"),
        ({"content": 5}, "type"),
    ],
)
async def test_schema_rules_apply_to_rewrites(loader: PluginLoader, rewrite: dict[str, Any], rule: str) -> None:
    first, _, _ = apis(loader)

    async def hook(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(params=rewrite)

    first.register_hook("before_tool_call", hook)
    decision = await decide(loader)
    assert (decision.blocked, decision.code) == (True, "tool_rewrite_invalid")
    assert f"does not satisfy {rule}" in decision.reason


async def test_a_rewrite_may_not_name_another_tool(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)

    async def hook(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(tool_name="exec", params={"command": "rm -rf /"})

    first.register_hook("before_tool_call", hook)
    decision = await decide(loader)
    assert (decision.blocked, decision.code, decision.plugin_id) == (True, "tool_rewrite_invalid", "a-first")
    assert "another tool" in decision.reason
    same = BeforeToolCallResult(tool_name="write", params={"mode": "create"})

    async def same_tool(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return same

    loader.reload("a-first")
    loaded(loader, "a-first")[1].register_hook("before_tool_call", same_tool)
    assert not (await decide(loader)).blocked


@pytest.mark.parametrize(
    ("params", "why"),
    [
        (["path", "x"], "not an object"),
        ("path=x", "not an object"),
        ({"path": {1, 2}}, "are not JSON"),
        ({"path": float("nan")}, "are not JSON"),
    ],
)
async def test_a_rewrite_that_is_not_a_json_object_is_refused(loader: PluginLoader, params: Any, why: str) -> None:
    first, _, _ = apis(loader)

    async def hook(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(params=params)

    first.register_hook("before_tool_call", hook)
    decision = await decide(loader)
    assert (decision.blocked, decision.code) == (True, "tool_rewrite_invalid")
    assert why in decision.reason


async def test_a_valid_rewrite_is_checked_against_the_schema_it_was_given(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)

    async def hook(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(params={"lines": [1, 2]})

    first.register_hook("before_tool_call", hook)
    decision = await decide(loader)
    assert not decision.blocked
    assert decision.params["lines"] == [1, 2]
    strict = {**WRITE_SCHEMA, "properties": {**WRITE_SCHEMA["properties"], "lines": {"type": "string"}}}
    assert (await decide(loader, schema=strict)).code == "tool_rewrite_invalid"


# -- blocks and failures -------------------------------------------------------------------------------------------


async def test_a_block_ends_the_chain(loader: PluginLoader) -> None:
    first, second, _ = apis(loader)
    later: list[str] = []

    async def rewrite(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(params={"mode": "create"})

    async def block(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(block=True, block_reason="Maintainer access required.", params={"path": "x"})

    async def never(e: BeforeToolCallEvent) -> None:
        later.append("ran")

    first.register_hook("before_tool_call", rewrite)
    second.register_hook("before_tool_call", block)
    second.register_hook("before_tool_call", never)
    decision = await decide(loader)
    assert decision.blocked
    assert (decision.code, decision.reason, decision.plugin_id) == (
        "tool_call_blocked",
        "Maintainer access required.",
        "b-second",
    )
    assert decision.rewritten_by == ("a-first",)
    assert later == []


async def test_a_block_without_a_reason_gets_the_default_one(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)

    async def block(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(block=True, block_reason="   ")

    first.register_hook("before_tool_call", block)
    assert (await decide(loader)).reason == "Tool call blocked by plugin hook"


async def test_a_hook_that_raises_refuses_the_call(loader: PluginLoader, caplog: pytest.LogCaptureFixture) -> None:
    first, second, _ = apis(loader)
    later: list[str] = []

    async def crash(e: BeforeToolCallEvent) -> None:
        raise ValueError("secret detail")

    async def never(e: BeforeToolCallEvent) -> None:
        later.append("ran")

    first.register_hook("before_tool_call", crash)
    second.register_hook("before_tool_call", never)
    with caplog.at_level(logging.WARNING, logger="clawstack.gateway.plugins.tool_hooks"):
        decision = await decide(loader)
    assert decision.blocked
    assert (decision.code, decision.reason, decision.plugin_id) == ("tool_hook_failed", HOOK_FAILURE_REASON, "a-first")
    assert "before_tool_call hook of plugin a-first raised ValueError (tool write): call refused" in caplog.text
    assert "secret detail" not in caplog.text
    assert later == []


async def test_a_hook_that_takes_too_long_refuses_the_call(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)
    cancelled = asyncio.Event()

    async def hang(e: BeforeToolCallEvent) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    first.register_hook("before_tool_call", hang)
    decision = await decide(loader, timeout_s=0.05)
    assert (decision.blocked, decision.code) == (True, "tool_hook_failed")
    assert cancelled.is_set()


@pytest.mark.parametrize("returned", [{"block": True}, "block", True, BeforeToolCallResult(block="yes")])
async def test_a_hook_that_returns_something_else_refuses_the_call(loader: PluginLoader, returned: Any) -> None:
    first, _, _ = apis(loader)

    async def odd(e: BeforeToolCallEvent) -> Any:
        return returned

    first.register_hook("before_tool_call", odd)
    decision = await decide(loader)
    assert (decision.blocked, decision.code) == (True, "tool_hook_failed")


# -- lifetime, matcher -------------------------------------------------------------------------------------------


async def test_hooks_of_a_retired_plugin_never_run(loader: PluginLoader) -> None:
    first, second, _ = apis(loader)
    ran: list[str] = []

    async def retire_the_next(e: BeforeToolCallEvent) -> None:
        ran.append("a")
        loader.reload("b-second")  # b's instance is retired while a's hook runs

    async def block(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        ran.append("b")
        return BeforeToolCallResult(block=True)

    async def observe(e: AfterToolCallEvent) -> None:
        ran.append("after-b")

    first.register_hook("before_tool_call", retire_the_next)
    second.register_hook("before_tool_call", block)
    second.register_hook("after_tool_call", observe)
    decision = await decide(loader)
    assert not decision.blocked
    assert ran == ["a"]
    await after_tool_call(loader.hooks, after_event())
    assert ran == ["a"]
    with pytest.raises(PluginRetiredError):
        second.register_hook("before_tool_call", block)


async def test_a_plugin_retired_while_its_hook_runs_fails_closed(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)

    async def retire_myself(e: BeforeToolCallEvent) -> None:
        loader.reload("a-first")

    first.register_hook("before_tool_call", retire_myself)
    decision = await decide(loader)
    assert (decision.blocked, decision.code, decision.plugin_id) == (True, "tool_hook_failed", "a-first")


async def test_a_matcher_limits_a_hook_to_its_tools(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)
    seen: list[str] = []

    async def hook(e: BeforeToolCallEvent) -> None:
        seen.append(e.tool_name)

    async def observe(e: AfterToolCallEvent) -> None:
        seen.append("after-" + e.tool_name)

    first.register_hook("before_tool_call", hook, matcher=["read"])
    first.register_hook("after_tool_call", observe, matcher=["read"])
    await decide(loader, event("write"))
    await decide(loader, event("read", path="x"), schema={"type": "object"})
    await after_tool_call(loader.hooks, after_event("write"))
    await after_tool_call(loader.hooks, after_event("read"))
    assert seen == ["read", "after-read"]


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("before_model_resolve", {}, "is not one of"),
        ("before_tool_call", {"matcher": []}, "at least one tool"),
        ("before_tool_call", {"matcher": "exec"}, "a list of tool names"),
        ("after_tool_call", {"matcher": ["group:fs"]}, "exact tool names"),
        ("after_tool_call", {"matcher": [""]}, "exact tool names"),
        ("before_dispatch", {"matcher": ["exec"]}, "only to tool hooks"),
    ],
)
def test_hook_registration_refusals(loader: PluginLoader, name: str, kwargs: dict[str, Any], message: str) -> None:
    first, _, _ = apis(loader)

    async def handler(e: Any) -> None:
        return None

    with pytest.raises(CommandRegistrationError, match=message) as caught:
        first.register_hook(name, handler, **kwargs)  # type: ignore[call-overload]
    assert caught.value.code == "plugin_command_invalid"
    assert not loader.hooks.has_tool_hooks()
    with pytest.raises(CommandRegistrationError, match="must be callable"):
        first.register_hook("after_tool_call", "not a function")  # type: ignore[call-overload]


def test_tool_hooks_do_not_count_as_dispatch_hooks(loader: PluginLoader) -> None:
    first, _, _ = apis(loader)

    async def handler(e: Any) -> None:
        return None

    first.register_hook("before_tool_call", handler)
    assert loader.hooks.has_tool_hooks()
    assert not loader.hooks.has_dispatch_hooks()


# -- after_tool_call -------------------------------------------------------------------------------------------------


async def test_observers_run_together_and_their_failures_change_nothing(
    loader: PluginLoader, caplog: pytest.LogCaptureFixture
) -> None:
    first, second, third = apis(loader)
    second_started = asyncio.Event()
    seen: list[AfterToolCallEvent] = []

    async def waits_for_the_second(e: AfterToolCallEvent) -> None:
        await second_started.wait()  # only returns if observers run at once
        seen.append(e)

    async def second_observer(e: AfterToolCallEvent) -> None:
        second_started.set()
        e.params["path"] = "changed"
        raise RuntimeError("observer secret")

    def plain(e: AfterToolCallEvent) -> None:
        seen.append(e)

    first.register_hook("after_tool_call", waits_for_the_second)
    second.register_hook("after_tool_call", second_observer)
    third.register_hook("after_tool_call", plain)
    observed = after_event(error="error: disk full", result="error: disk full", duration_ms=40)
    with caplog.at_level(logging.WARNING, logger="clawstack.gateway.plugins.tool_hooks"):
        await asyncio.wait_for(after_tool_call(loader.hooks, observed, timeout_s=5), 10)
    assert [e.params for e in seen] == [observed.params, observed.params]
    assert all((e.error, e.duration_ms, e.result) == ("error: disk full", 40, "error: disk full") for e in seen)
    assert observed.params == {"path": "notes.txt", "content": "hello"}
    assert "after_tool_call hook of plugin b-second raised RuntimeError (tool write)" in caplog.text
    assert "observer secret" not in caplog.text


async def test_a_slow_observer_is_cut_and_logged(loader: PluginLoader, caplog: pytest.LogCaptureFixture) -> None:
    first, _, _ = apis(loader)

    async def hang(e: AfterToolCallEvent) -> None:
        await asyncio.Event().wait()

    first.register_hook("after_tool_call", hang)
    with caplog.at_level(logging.WARNING, logger="clawstack.gateway.plugins.tool_hooks"):
        await after_tool_call(loader.hooks, after_event(), timeout_s=0.05)
    assert "after_tool_call hook of plugin a-first took longer than 0.05 s (tool write)" in caplog.text


# -- the schema check ------------------------------------------------------------------------------------------------


def test_schema_problem() -> None:
    assert schema_problem(WRITE_SCHEMA, {"path": "a", "content": "b"}) is None
    assert schema_problem(WRITE_SCHEMA, {"path": "a"}) == '$ does not satisfy required: ["path", "content"]'
    assert schema_problem({"type": "object", "properties": {"n": {"type": "wat"}}}, {"n": 1}) == (
        "the tool's schema is not a valid JSON schema"
    )
    unresolvable = {"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}
    assert schema_problem(unresolvable, {"n": 1}) is not None  # fails closed


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3), st.lists(st.integers(-2, 2), max_size=2)
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rewrite=st.dictionaries(st.sampled_from(["path", "content", "mode", "lines", "extra"]), _VALUES, max_size=4))
async def test_what_runs_after_a_rewrite_always_fits_the_schema(loader: PluginLoader, rewrite: dict[str, Any]) -> None:
    first, _, _ = apis(loader)

    async def hook(e: BeforeToolCallEvent) -> BeforeToolCallResult:
        return BeforeToolCallResult(params=rewrite)

    loader.hooks.remove_plugin("a-first")
    first.register_hook("before_tool_call", hook)
    decision = await decide(loader)
    merged = {"path": "notes.txt", "content": "hello", **rewrite}
    valid = jsonschema.Draft202012Validator(WRITE_SCHEMA).is_valid(merged)
    if rewrite:
        assert decision.blocked is not valid
    else:
        assert not decision.blocked
    if not decision.blocked:
        assert decision.params == merged
        assert jsonschema.Draft202012Validator(WRITE_SCHEMA).is_valid(decision.params)
    else:
        assert decision.code == "tool_rewrite_invalid"
