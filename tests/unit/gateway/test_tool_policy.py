"""Tool policy (allow/deny with groups, deny wins, layers only narrow) and the tool registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from clawstack.gateway import config as gateway_config
from clawstack.gateway.config import TOOL_GROUPS
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.tools import (
    Tool,
    ToolExistsError,
    ToolNameError,
    ToolNotFoundError,
    ToolPolicy,
    ToolPolicyError,
    ToolRegistry,
)

AVAILABLE = ["read", "write", "edit", "apply_patch", "exec", "process", "web_search", "echo", "message"]

Layer = tuple[Sequence[str] | None, Sequence[str]]


def _policy(layer: Layer) -> ToolPolicy:
    return ToolPolicy(layer[0], layer[1])


EFFECTIVE_CASES: list[tuple[str, list[Layer], list[str]]] = [
    ("no policy allows everything", [(None, ())], AVAILABLE),
    ("empty allow-list allows nothing", [([], ())], []),
    ("allow by name", [(["echo", "exec"], ())], ["exec", "echo"]),
    ("allow by group", [(["group:fs"], ())], ["read", "write", "edit", "apply_patch"]),
    ("deny by name", [(None, ["exec"])], [n for n in AVAILABLE if n != "exec"]),
    ("deny by group", [(None, ["group:runtime"])], [n for n in AVAILABLE if n not in ("exec", "process")]),
    ("deny wins over allow in one layer", [(["echo", "exec"], ["exec"])], ["echo"]),
    ("deny of a member wins over an allowed group", [(["group:fs"], ["write"])], ["read", "edit", "apply_patch"]),
    ("denied group wins over allowed member", [(["read", "echo"], ["group:fs"])], ["echo"]),
    ("agent narrows the global allow-list", [(["group:fs", "echo"], ()), (["echo"], ())], ["echo"]),
    ("agent cannot add a tool outside the global allow-list", [(["echo"], ()), (["echo", "exec"], ())], ["echo"]),
    ("agent allow cannot undo a global deny", [(None, ["exec"]), (["exec", "echo"], ())], ["echo"]),
    ("agent allow-all keeps the global allow-list", [(["echo"], ()), (None, ())], ["echo"]),
    (
        "agent deny narrows a global allow-all",
        [(None, ()), (None, ["group:fs"])],
        ["exec", "process", "web_search", "echo", "message"],
    ),
    (
        "three layers intersect",
        [(None, ["message"]), (["group:fs", "echo"], ()), (["read", "echo"], ["echo"])],
        ["read"],
    ),
    ("an unknown name in allow grants nothing", [(["no_such_tool", "echo"], ())], ["echo"]),
    ("an unknown name in deny changes nothing", [(None, ["no_such_tool"])], AVAILABLE),
    ("a group member that is not available is not added", [(["group:web"], ())], ["web_search"]),
    ("names are case-sensitive", [(["ECHO"], ())], []),
]


@pytest.mark.parametrize(("layers", "expected"), [c[1:] for c in EFFECTIVE_CASES], ids=[c[0] for c in EFFECTIVE_CASES])
def test_effective(layers: list[Layer], expected: list[str]) -> None:
    first, *rest = [_policy(layer) for layer in layers]
    assert first.effective(AVAILABLE, *rest) == expected


def test_effective_keeps_available_order_and_drops_duplicates() -> None:
    assert ToolPolicy().effective(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


@pytest.mark.parametrize(
    ("allow", "deny", "problem"),
    [
        (["group:nope"], (), "unknown tool group"),
        (None, ["group:"], "unknown tool group"),
        ([""], (), "non-empty strings"),
        (None, [""], "non-empty strings"),
        ("echo", (), "not one string"),
        (None, "echo", "not one string"),
        ([3], (), "non-empty strings"),
    ],
)
def test_invalid_policy_is_refused(allow: Any, deny: Any, problem: str) -> None:
    with pytest.raises(ToolPolicyError, match=problem) as info:
        ToolPolicy(allow, deny)
    assert info.value.code == "tool_policy_invalid"
    assert isinstance(info.value, GatewayError)


@pytest.mark.parametrize("group", sorted(TOOL_GROUPS))
def test_every_config_group_expands(group: str) -> None:
    assert ToolPolicy([group]).effective([*sorted(TOOL_GROUPS[group]), "other"]) == sorted(TOOL_GROUPS[group])


def test_from_config_layer() -> None:
    layer = ToolPolicy.from_config(gateway_config.ToolPolicy.model_validate({"allow": ["group:fs"], "deny": ["edit"]}))
    assert layer == ToolPolicy(["group:fs"], ["edit"])
    assert ToolPolicy.from_config(gateway_config.ToolPolicy()) == ToolPolicy()
    assert layer.permits("read")
    assert not layer.permits("edit")
    assert not layer.permits("exec")


async def _echo(arguments: dict[str, Any], invocation: object = None) -> str:
    return repr(arguments)


def _tool(name: str, owner: str | None = None) -> Tool:
    return Tool(name, f"the {name} tool", {"type": "object", "properties": {"x": {"type": "integer"}}}, _echo, owner)


def test_registry_register_get_and_openai_shape() -> None:
    registry = ToolRegistry([_tool("echo"), _tool("b-2", owner="plug")])
    assert registry.names() == ["echo", "b-2"]
    assert "echo" in registry
    assert len(registry) == 2
    assert registry.get("echo") is not None
    assert registry.get("nope") is None
    assert registry.openai_tools(["b-2", "echo"]) == [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"the {name} tool",
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            },
        }
        for name in ("b-2", "echo")
    ]
    assert registry.openai_tools([]) == []


@pytest.mark.parametrize("name", ["", "has space", "group:fs", "x" * 65, "dot.ted", "ünï"])
def test_registry_refuses_bad_names(name: str) -> None:
    with pytest.raises(ToolNameError) as info:
        ToolRegistry().register(_tool(name))
    assert info.value.code == "tool_name_invalid"


def test_registry_refuses_duplicates_and_unknown_names() -> None:
    registry = ToolRegistry([_tool("echo")])
    with pytest.raises(ToolExistsError) as exists:
        registry.register(_tool("echo", owner="other"))
    assert exists.value.code == "tool_exists"
    with pytest.raises(ToolNotFoundError) as missing:
        registry.openai_tools(["echo", "nope"])
    assert missing.value.code == "tool_not_found"


def test_registry_unregister_owner() -> None:
    registry = ToolRegistry([_tool("a", "p1"), _tool("b", "p2"), _tool("c", "p1"), _tool("d")])
    assert registry.unregister_owner("p1") == ["a", "c"]
    assert registry.names() == ["b", "d"]
    assert registry.unregister_owner("p1") == []
