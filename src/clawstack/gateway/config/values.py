"""Value rules shared by the config sections: identifiers, model references, tool names, URLs, paths.

Each rule is an annotated type (``ModelRef``, ``ToolName``, ``AgentId``, …) whose validator raises ``ValueError``
with the message a user sees after the key path. Messages never quote the offending value.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, StrictInt, StrictStr, ValidationInfo

from clawstack.gateway.keys import AgentIdError, normalize_agent_id

__all__ = [
    "TOOL_GROUPS",
    "AgentId",
    "AllowedModel",
    "ChannelName",
    "ModelRef",
    "NonEmptyStr",
    "OperatorRole",
    "PluginId",
    "PositiveInt",
    "ProviderId",
    "ResolvedPath",
    "ToolName",
    "check_base_url",
    "check_hooks_path",
    "check_no_space",
    "check_sender_pattern",
    "expand_tool_names",
    "resolve_config_path",
    "split_model_ref",
]

#: Tool groups usable in ``allow``/``deny`` lists, and the tools each one stands for.
TOOL_GROUPS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "group:fs": frozenset({"read", "write", "edit", "apply_patch"}),
        "group:runtime": frozenset({"exec", "process"}),
        "group:web": frozenset({"web_search", "web_fetch"}),
        "group:sessions": frozenset(
            {
                "sessions_list",
                "sessions_history",
                "sessions_send",
                "sessions_spawn",
                "sessions_yield",
                "subagents",
                "session_status",
                "agents_wait",
            }
        ),
        "group:messaging": frozenset({"message"}),
        "group:automation": frozenset({"cron", "gateway"}),
    }
)

_PROVIDER_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_PLUGIN_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CHANNEL = re.compile(r"[a-z0-9-]{1,64}")
_HOOKS_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")
#: A channel sender id becomes a session-key segment (``agent:<id>:channel:webhook:<sender>``), so it follows that rule.
_SENDER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")


def split_model_ref(ref: str) -> tuple[str, str]:
    """Split a canonical ``provider/model`` reference at its first ``/``; raise ``ValueError`` if malformed."""
    provider, sep, model = ref.partition("/")
    if not sep or not provider or not model or any(c.isspace() for c in ref):
        raise ValueError('must be a model reference "provider/model"')
    return provider, model


def expand_tool_names(names: Iterable[str]) -> frozenset[str]:
    """The tool names a list of names and groups stands for, each group replaced by its members."""
    expanded: set[str] = set()
    for name in names:
        expanded |= TOOL_GROUPS.get(name, frozenset({name}))
    return frozenset(expanded)


def _agent_id(value: str) -> str:
    try:
        return normalize_agent_id(value)
    except AgentIdError as exc:
        raise ValueError(exc.message) from None


def _check_model_ref(value: str) -> str:
    split_model_ref(value)
    return value


def _check_allowed_model(value: str) -> str:
    if value != "*":
        try:
            split_model_ref(value)
        except ValueError:
            raise ValueError('must be a model reference "provider/model" or "*"') from None
    return value


def _check_tool_name(value: str) -> str:
    if value.startswith("group:"):
        if value not in TOOL_GROUPS:
            raise ValueError(f"unknown tool group {json.dumps(value)} (known: {', '.join(sorted(TOOL_GROUPS))})")
    elif not _TOOL_NAME.fullmatch(value):
        raise ValueError("not a valid tool name")
    return value


def check_base_url(value: str) -> str:
    """An ``http``/``https`` URL with a host and no credentials, query or fragment; a trailing ``/`` is dropped."""
    problem = "must be an http or https URL without credentials, query or fragment"
    try:
        parts = urlsplit(value)
        _ = parts.port  # a malformed port raises here
    except ValueError:
        raise ValueError(problem) from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
    ):
        raise ValueError(problem)
    return value.rstrip("/")


def check_hooks_path(value: str) -> str:
    """An absolute URL path of plain segments, without a trailing ``/``."""
    if not _HOOKS_PATH.fullmatch(value):
        raise ValueError('must be an absolute URL path such as "/hooks" (no trailing "/")')
    return value


def check_no_space(value: str) -> str:
    """Non-empty and without whitespace (model ids)."""
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be non-empty and contain no whitespace")
    return value


def check_sender_pattern(value: str) -> str:
    """``"*"`` or a channel sender id (the session-key segment rule)."""
    if value != "*" and not _SENDER_ID.fullmatch(value):
        raise ValueError(
            'must be "*" or a sender id: an ASCII letter or digit, then up to 127 ASCII letters, digits and ._@+-'
        )
    return value


def _pattern(regex: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"not a valid {what}")
        return value

    return AfterValidator(check)


def resolve_config_path(value: str, base_dir: Path | None) -> Path:
    """``value`` with ``~`` expanded, made absolute against ``base_dir`` (the config's directory), normalised."""
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return Path(os.path.normpath(path))


def _resolve_path(value: object, info: ValidationInfo) -> Path:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if not value:
        raise ValueError("must not be empty")
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    base_dir = info.context.get("base_dir") if isinstance(info.context, dict) else None
    return resolve_config_path(value, base_dir if isinstance(base_dir, Path) else None)


PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
ModelRef = Annotated[StrictStr, AfterValidator(_check_model_ref)]
AllowedModel = Annotated[StrictStr, AfterValidator(_check_allowed_model)]
ToolName = Annotated[StrictStr, AfterValidator(_check_tool_name)]
ResolvedPath = Annotated[Path, BeforeValidator(_resolve_path)]
AgentId = Annotated[StrictStr, AfterValidator(_agent_id)]
ProviderId = Annotated[StrictStr, _pattern(_PROVIDER_ID, "provider id (lower-case letters, digits, '_' and '-')")]
PluginId = Annotated[StrictStr, _pattern(_PLUGIN_ID, "plugin id (lower-case letters, digits, '.', '_' and '-')")]
ChannelName = Annotated[StrictStr, _pattern(_CHANNEL, "channel name (lower-case letters, digits and '-')")]
OperatorRole = Literal["operator.admin", "operator.read", "operator.write"]
