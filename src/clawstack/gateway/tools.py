"""Agent tools: the allow/deny tool policy, and the registry of tools an agent turn can call.

A :class:`ToolPolicy` is one layer of ``allow``/``deny`` lists of tool names and groups (``group:fs``, see
:data:`~clawstack.gateway.config.TOOL_GROUPS`). Layers only narrow: :meth:`ToolPolicy.effective` keeps a tool only
if every layer permits it, so an agent's policy can remove tools from the global ``tools`` policy but never add
one back. Within a layer ``deny`` wins over ``allow``, and ``allow=None`` means "everything not denied". A name in
``allow`` that no registered tool has grants nothing.

A :class:`Tool` is a name, a description, a JSON schema for its arguments, an async handler and the id of the
plugin that owns it (``None`` for the gateway's own tools). The handler gets the arguments and the
:class:`ToolInvocation` (which run, session, agent and workspace the call comes from). A :class:`ToolRegistry` holds the tools by name and
renders them in the OpenAI ``tools`` request shape. A handler raises :class:`ToolError` to give the model an error
message as the tool's result.

Errors::

    GatewayError                      (clawstack.gateway.errors)
     ├── ToolPolicyError              "tool_policy_invalid": an unknown group or a malformed name in a policy
     ├── ToolRegistryError            "tool_registry_error"
     │    ├── ToolNameError           "tool_name_invalid": not 1-64 of A-Z a-z 0-9 _ -
     │    ├── ToolExistsError         "tool_exists": the name is already registered
     │    └── ToolNotFoundError       "tool_not_found"
     └── ToolError                    "tool_failed": raised by a handler; its message becomes the tool result
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from clawstack.gateway import config as gateway_config
from clawstack.gateway.config import TOOL_GROUPS, expand_tool_names
from clawstack.gateway.errors import GatewayError

__all__ = [
    "TOOL_NAME_PATTERN",
    "TOOL_PROFILES",
    "Tool",
    "ToolError",
    "ToolExistsError",
    "ToolHandler",
    "ToolInvocation",
    "ToolNameError",
    "ToolNotFoundError",
    "ToolPolicy",
    "ToolPolicyError",
    "ToolRegistry",
    "ToolRegistryError",
]

#: OpenClaw's tool profiles, as allow-lists of the tools (and groups) each one keeps; ``full`` keeps everything.
TOOL_PROFILES: Final[Mapping[str, tuple[str, ...]]] = {
    "minimal": ("session_status",),
    "coding": ("group:fs", "group:runtime", "group:web", "group:sessions", "cron", "gateway"),
    "messaging": (
        "group:messaging",
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "sessions_spawn",
        "sessions_yield",
        "subagents",
        "session_status",
        "agents_wait",
    ),
}

#: What a registered tool's name must match: the OpenAI function-name rule.
TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    """Where a tool call comes from: the run, its session (and the session's incarnation, ``session_id``, when the
    turn started), the agent, the agent's workspace, the turn's tool surface and model.

    ``workspace`` is the directory the workspace tools are confined to (``None`` when the agent has none);
    ``blind`` is set for a blind child, whose prompts and tool results show the workspace as ``<workspace>``.
    ``tools`` are the tool names the turn may call (its effective policy); ``model`` is the turn's
    ``provider/model`` chain head.
    """

    run_id: str
    session_key: str
    agent_id: str
    tool_call_id: str
    workspace: Path | None = None
    blind: bool = False
    session_id: str = ""
    tools: tuple[str, ...] = ()
    model: str = ""


#: ``async (arguments, invocation) -> result text``: what a tool runs when the model calls it.
ToolHandler = Callable[[dict[str, Any], ToolInvocation], Awaitable[str]]


class ToolPolicyError(GatewayError):
    """A policy names an unknown ``group:`` or something that is not a tool name."""

    code = "tool_policy_invalid"


class ToolRegistryError(GatewayError):
    """Base of the registry's errors."""

    code = "tool_registry_error"


class ToolNameError(ToolRegistryError):
    """A tool name does not match :data:`TOOL_NAME_PATTERN`."""

    code = "tool_name_invalid"


class ToolExistsError(ToolRegistryError):
    """A tool with this name is already registered."""

    code = "tool_exists"


class ToolNotFoundError(ToolRegistryError):
    """No tool with this name is registered."""

    code = "tool_not_found"


class ToolError(GatewayError):
    """Raised by a tool handler: the call failed, and the message (shown to the model) says why."""

    code = "tool_failed"


def _check_policy_names(names: Iterable[str], what: str) -> tuple[str, ...]:
    checked: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise ToolPolicyError(f"{what}: tool names must be non-empty strings")
        if name.startswith("group:") and name not in TOOL_GROUPS:
            raise ToolPolicyError(
                f"{what}: unknown tool group {json.dumps(name)} (known: {', '.join(sorted(TOOL_GROUPS))})"
            )
        checked.append(name)
    return tuple(checked)


@dataclass(frozen=True, slots=True, init=False)
class ToolPolicy:
    """One layer of tool policy: ``allow`` (``None``: no allow-list) and ``deny``, as names and ``group:`` names."""

    allow: tuple[str, ...] | None
    deny: tuple[str, ...]
    _allowed: frozenset[str] | None = field(repr=False, compare=False)
    _denied: frozenset[str] = field(repr=False, compare=False)

    def __init__(self, allow: Sequence[str] | None = None, deny: Sequence[str] = ()) -> None:
        if isinstance(allow, str) or isinstance(deny, str):
            raise ToolPolicyError("allow and deny are sequences of names, not one string")
        allow_names = None if allow is None else _check_policy_names(allow, "allow")
        deny_names = _check_policy_names(deny, "deny")
        object.__setattr__(self, "allow", allow_names)
        object.__setattr__(self, "deny", deny_names)
        object.__setattr__(self, "_allowed", None if allow_names is None else expand_tool_names(allow_names))
        object.__setattr__(self, "_denied", expand_tool_names(deny_names))

    @classmethod
    def from_config(cls, policy: gateway_config.ToolPolicy) -> ToolPolicy:
        """The allow/deny layer a config ``tools`` section (global or an agent's) describes."""
        return cls(policy.allow, policy.deny)

    @classmethod
    def layers_from_config(cls, policy: gateway_config.ToolPolicy) -> list[ToolPolicy]:
        """Every layer a config ``tools`` section describes: its ``profile`` (unless ``full`` or absent), then its
        allow/deny lists."""
        layers = [cls.from_config(policy)]
        if policy.profile is not None and policy.profile != "full":
            layers.insert(0, cls(TOOL_PROFILES[policy.profile]))
        return layers

    def permits(self, name: str) -> bool:
        """Whether this layer alone lets ``name`` through: not denied, and allowed (or no allow-list)."""
        if name in self._denied:
            return False
        return self._allowed is None or name in self._allowed

    def effective(self, available: Iterable[str], *narrower: ToolPolicy) -> list[str]:
        """The ``available`` tools that this layer and every ``narrower`` layer permit, in ``available`` order."""
        layers = (self, *narrower)
        result: list[str] = []
        seen: set[str] = set()
        for name in available:
            if name not in seen and all(layer.permits(name) for layer in layers):
                result.append(name)
            seen.add(name)
        return result


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model can call: ``parameters`` is the JSON schema of its arguments object."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler = field(repr=False, compare=False)
    owner: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {name, description, parameters}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


class ToolRegistry:
    """The tools a gateway offers, by name. An object passed to whoever needs it; nothing global."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add ``tool``; its name must be valid and not already registered."""
        if not isinstance(tool.name, str) or not TOOL_NAME_PATTERN.fullmatch(tool.name):
            raise ToolNameError("a tool name is 1 to 64 of the characters A-Z a-z 0-9 _ -")
        if tool.name in self._tools:
            raise ToolExistsError(f"a tool named {json.dumps(tool.name)} is already registered")
        self._tools[tool.name] = tool

    def unregister_owner(self, owner: str) -> list[str]:
        """Remove every tool ``owner`` registered (a plugin being unloaded); return their names."""
        names = [name for name, tool in self._tools.items() if tool.owner == owner]
        for name in names:
            del self._tools[name]
        return names

    def unregister(self, name: str) -> None:
        """Remove the tool called ``name`` if there is one."""
        self._tools.pop(name, None)

    def owner(self, name: str) -> str | None:
        """The plugin that registered ``name`` (``None`` for the gateway's own tools); :class:`ToolNotFoundError`."""
        tool = self._tools.get(name)
        if tool is None:
            raise ToolNotFoundError(f"no tool named {json.dumps(name)} is registered")
        return tool.owner

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._tools)

    def openai_tools(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list for ``names``, in that order; an unregistered name raises."""
        entries: list[dict[str, Any]] = []
        for name in names:
            tool = self._tools.get(name)
            if tool is None:
                raise ToolNotFoundError(f"no tool named {json.dumps(name)} is registered")
            entries.append(tool.to_openai())
        return entries

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools
