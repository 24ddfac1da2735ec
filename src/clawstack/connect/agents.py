"""The agents ClawConnect can run tasks on: ``agents.json``, or the ``OPENCLAW_*`` environment as a fallback.

::

    {
      "default": "main",                                  // optional; else the first agent
      "agents": [
        {"id": "main", "url": "ws://127.0.0.1:18789", "password": "…",
         "openclawAgentId": "main", "description": "The house agent"}
      ],
      "groups": {"research": ["main"]}                    // optional; names for sets of agents
    }

Each agent names a gateway (``url``, ``ws://`` or ``wss://``), the shared secret it accepts (``password``, or
``token`` for a gateway in token mode) and the gateway's agent to talk to (``openclawAgentId``, default ``main``).
Unknown keys are refused. Load errors are :class:`~clawstack.connect.errors.AgentsConfigError` with these codes:

========================== ==========================================================================
``agents_not_configured``  no ``agents.json`` at the default path and no ``OPENCLAW_URL``
``agents_file_missing``    the file named with ``--agents`` does not exist
``agents_file_unreadable`` the file cannot be read (or is larger than 1 MiB)
``agents_json_invalid``    not strict JSON (syntax, duplicate keys, …); the message says where
``agents_schema_invalid``  a key is missing, unknown or of the wrong type; the message names it
``agents_empty``           ``agents`` is an empty list
``agents_duplicate_id``    two agents share an id
``agents_default_unknown`` ``default`` names no agent
``agents_group_unknown``   a group names an agent that is not configured
========================== ==========================================================================

Without a file, ``OPENCLAW_URL`` (required), ``OPENCLAW_PASSWORD`` and ``OPENCLAW_AGENT_ID`` (default ``main``)
describe one agent with the id ``openclaw``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictStr, ValidationError, field_validator

from clawstack.common.strictjson import StrictJSONError, loads
from clawstack.connect.errors import AgentsConfigError

DEFAULT_AGENTS_PATH: Final = Path("~/.clawconnect/agents.json")
ENV_AGENT_ID: Final = "openclaw"
MAX_AGENTS_FILE_BYTES: Final = 1024 * 1024
_AGENT_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_OPENCLAW_AGENT_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


class AgentEntry(_Strict):
    """One entry of ``agents``."""

    id: Annotated[StrictStr, Field(pattern=f"^{_AGENT_ID_RE.pattern}$")]
    url: StrictStr
    password: SecretStr | None = None
    token: SecretStr | None = None
    openclawAgentId: Annotated[StrictStr, Field(pattern=f"^{_OPENCLAW_AGENT_RE.pattern}$")] = "main"
    description: StrictStr | None = None

    @field_validator("url")
    @classmethod
    def _websocket_url(cls, value: str) -> str:
        if not value.startswith(("ws://", "wss://")) or len(value) < 8:
            raise ValueError("must be a ws:// or wss:// URL")
        return value


class AgentsFile(_Strict):
    """The whole ``agents.json``."""

    default: StrictStr | None = None
    agents: list[AgentEntry]
    groups: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Agent:
    """An agent tasks can run on. ``secret`` is sent as ``auth.token`` when ``auth_kind`` is ``token``."""

    id: str
    url: str
    openclaw_agent_id: str = "main"
    description: str | None = None
    secret: str = field(default="", repr=False)
    auth_kind: str = "password"

    def public(self, *, is_default: bool) -> dict[str, Any]:
        """What a tool may show about the agent: never its secret."""
        return {
            "id": self.id,
            "openclawAgentId": self.openclaw_agent_id,
            "description": self.description,
            "default": is_default,
        }


@dataclass(frozen=True, slots=True)
class AgentRegistry:
    """The configured agents, the default one and the groups."""

    agents: tuple[Agent, ...]
    default_id: str
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = "agents.json"

    def get(self, agent_id: str | None) -> Agent:
        """The agent with ``agent_id``, or the default one for ``None``; :class:`KeyError` when unknown."""
        wanted = self.default_id if agent_id is None else agent_id
        for agent in self.agents:
            if agent.id == wanted:
                return agent
        raise KeyError(wanted)

    @property
    def default(self) -> Agent:
        return self.get(None)

    def public(self) -> list[dict[str, Any]]:
        """Every agent as :meth:`Agent.public` shows it."""
        return [agent.public(is_default=agent.id == self.default_id) for agent in self.agents]


def _schema_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = "/".join(str(part) for part in error["loc"]) or "root"
    kind = error["type"]
    if kind == "missing":
        return f"{where}: required"
    if kind == "extra_forbidden":
        return f"{where}: unknown key"
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {message}"


def parse_agents(document: object, *, source: str = "agents.json") -> AgentRegistry:
    """Validate an already-parsed ``agents.json`` document."""
    try:
        parsed = AgentsFile.model_validate(document)
    except ValidationError as exc:
        raise AgentsConfigError(f"{source}: {_schema_problem(exc)}", code="agents_schema_invalid") from None
    if not parsed.agents:
        raise AgentsConfigError(f"{source}: agents is empty; configure at least one", code="agents_empty")
    agents: list[Agent] = []
    seen: set[str] = set()
    for index, entry in enumerate(parsed.agents):
        if entry.id in seen:
            raise AgentsConfigError(f"{source}: agents/{index}/id repeats {entry.id!r}", code="agents_duplicate_id")
        seen.add(entry.id)
        if entry.token is not None:
            secret, kind = entry.token.get_secret_value(), "token"
        elif entry.password is not None:
            secret, kind = entry.password.get_secret_value(), "password"
        else:
            raise AgentsConfigError(
                f"{source}: agents/{index}: password (or token) required", code="agents_schema_invalid"
            )
        agents.append(Agent(entry.id, entry.url, entry.openclawAgentId, entry.description, secret, kind))
    default_id = parsed.default if parsed.default is not None else agents[0].id
    if default_id not in seen:
        raise AgentsConfigError(f"{source}: default names no agent: {default_id!r}", code="agents_default_unknown")
    for name, members in parsed.groups.items():
        for member in members:
            if member not in seen:
                raise AgentsConfigError(
                    f"{source}: group {name!r} names no agent: {member!r}", code="agents_group_unknown"
                )
    groups = {name: tuple(members) for name, members in parsed.groups.items()}
    return AgentRegistry(tuple(agents), default_id, groups, source)


def agents_from_env(environ: Mapping[str, str]) -> AgentRegistry | None:
    """The one agent ``OPENCLAW_URL`` / ``OPENCLAW_PASSWORD`` / ``OPENCLAW_AGENT_ID`` describe, or ``None``."""
    url = environ.get("OPENCLAW_URL", "")
    if not url:
        return None
    document = {
        "agents": [
            {
                "id": ENV_AGENT_ID,
                "url": url,
                "password": environ.get("OPENCLAW_PASSWORD", ""),
                "openclawAgentId": environ.get("OPENCLAW_AGENT_ID") or "main",
            }
        ]
    }
    return parse_agents(document, source="environment")


def load_agents(
    path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> AgentRegistry:
    """Load ``path`` (or the default ``~/.clawconnect/agents.json``), else fall back to the environment.

    A ``path`` given explicitly must exist; the default path may be absent, and then ``OPENCLAW_URL`` is needed.
    """
    env = os.environ if environ is None else environ
    explicit = path is not None
    file = Path(path) if path is not None else DEFAULT_AGENTS_PATH.expanduser()
    if not file.exists():
        if explicit:
            raise AgentsConfigError(f"{file} does not exist", code="agents_file_missing")
        from_env = agents_from_env(env)
        if from_env is None:
            raise AgentsConfigError(
                f"no agents configured: create {file} or set OPENCLAW_URL (and OPENCLAW_PASSWORD)",
                code="agents_not_configured",
            )
        return from_env
    try:
        with open(file, "rb") as handle:
            if os.fstat(handle.fileno()).st_mode & 0o077:
                _log.warning("%s holds gateway secrets and is readable by other users; chmod 600 it", file)
            data = handle.read(MAX_AGENTS_FILE_BYTES + 1)
    except OSError as exc:
        raise AgentsConfigError(f"{file} cannot be read: {exc.strerror}", code="agents_file_unreadable") from None
    if len(data) > MAX_AGENTS_FILE_BYTES:
        raise AgentsConfigError(f"{file} is larger than {MAX_AGENTS_FILE_BYTES} bytes", code="agents_file_unreadable")
    try:
        document = loads(data, max_bytes=MAX_AGENTS_FILE_BYTES)
    except StrictJSONError as exc:
        raise AgentsConfigError(f"{file}: {exc.message}", code="agents_json_invalid") from None
    return parse_agents(document, source=str(file))


__all__ = [
    "DEFAULT_AGENTS_PATH",
    "Agent",
    "AgentEntry",
    "AgentRegistry",
    "AgentsFile",
    "agents_from_env",
    "load_agents",
    "parse_agents",
]
