"""The ``agents`` section as the file writes it: ``defaults``, the roster, and who owns ambient work.

The roster is OpenClaw's, in either of its two forms (never both in one file):

* ``agents.entries.<id>: {...}``, OpenClaw's current keyed form;
* ``agents.list: [{id, ...}, ...]``, its earlier list form (OpenClaw 2026.9.6 still loads it and moves it to
  ``entries``; here it is read as it stands).

An entry's fields are :class:`AgentEntryConfig`'s. With more than one agent, OpenClaw needs to know who owns
ambient work: either ``agents.ownership: "explicit"`` or exactly one entry marked ``default: true``
(:mod:`clawstack.gateway.config.roster` turns this into the default agent and the workspaces). Each rule here is
checked per key; the rules that span keys are in :mod:`clawstack.gateway.config.checks`.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr, field_validator

from clawstack.gateway.config.models import ModelSelectionInput, Section
from clawstack.gateway.config.values import AgentId, PositiveInt, ResolvedPath, ToolName
from clawstack.gateway.keys import AgentIdError, normalize_agent_id

__all__ = [
    "DEFAULT_BOOTSTRAP_MAX_CHARS",
    "DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS",
    "OPTIONAL_BOOTSTRAP_FILES",
    "AgentDefaults",
    "AgentEntryConfig",
    "AgentIdentity",
    "AgentListItem",
    "AgentSubagentsConfig",
    "AgentsConfig",
    "ExecToolConfig",
    "SubagentDefaults",
    "SystemAgent",
    "ToolPolicy",
]

#: ``bootstrapMaxChars`` when neither the agent nor ``agents.defaults`` sets it (OpenClaw's default).
DEFAULT_BOOTSTRAP_MAX_CHARS = 20_000
#: ``bootstrapTotalMaxChars`` when neither the agent nor ``agents.defaults`` sets it (OpenClaw's default).
DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS = 60_000
#: The seeded workspace files ``skipOptionalBootstrapFiles`` may name (``HEARTBEAT.md`` is accepted, as by
#: OpenClaw, and seeds nothing either way).
OPTIONAL_BOOTSTRAP_FILES: tuple[str, ...] = ("SOUL.md", "USER.md", "IDENTITY.md", "HEARTBEAT.md")


def _allow_agent(value: str) -> str:
    if value == "*":
        return value
    try:
        return normalize_agent_id(value)
    except AgentIdError as exc:
        raise ValueError(f'must be "*" or an agent id: {exc.message}') from None


AllowAgent = Annotated[StrictStr, AfterValidator(_allow_agent)]


ToolProfile = Literal["minimal", "coding", "messaging", "full"]


class ToolPolicy(Section):
    """``tools`` / ``agents.entries.<id>.tools``: tool names and groups; ``allow`` absent means no allow-list.

    ``profile`` (OpenClaw's) is one more narrowing layer: the tools its profile names
    (:data:`~clawstack.gateway.tools.TOOL_PROFILES`); ``full``, or no profile, filters nothing.
    """

    profile: ToolProfile | None = None
    allow: tuple[ToolName, ...] | None = None
    deny: tuple[ToolName, ...] = ()


class SwarmConfig(Section):
    """``tools.swarm``: collector children (``sessions_spawn`` collected with ``agents_wait``)."""

    enabled: StrictBool = True


class SessionToolsConfig(Section):
    """``tools.sessions``: which sessions the session tools can see from a turn."""

    visibility: Literal["self", "tree", "agent", "all"] = "tree"


class ExecToolConfig(Section):
    """``tools.exec``: the bounds of the gateway's ``exec`` sandbox, on the whole sandbox (every process it
    starts). ``sandboxUid`` is the uid (and gid) the sandbox runs as when the gateway runs as root; never root."""

    pids_limit: PositiveInt = 256
    memory_limit_mb: PositiveInt = 1024
    sandbox_uid: Annotated[StrictInt, Field(ge=1, le=2**32 - 2)] = 65534


class ToolsConfig(ToolPolicy):
    """The top-level ``tools``: the global policy layer, and the settings of the gateway's own tools.

    ``toolSearch`` is accepted only as ``false``: this gateway always sends tool schemas directly.
    """

    tool_search: Literal[False] = False
    swarm: SwarmConfig = SwarmConfig()
    sessions: SessionToolsConfig = SessionToolsConfig()
    exec: ExecToolConfig = ExecToolConfig()


class SubagentDefaults(Section):
    """``agents.defaults.subagents``: limits on background (subagent) work and the default spawn allow-list."""

    max_concurrent: PositiveInt = 8
    max_spawn_depth: PositiveInt = 1
    max_children_per_agent: PositiveInt = 5
    run_timeout_seconds: PositiveInt = 600
    archive_after_minutes: PositiveInt = 60
    allow_agents: tuple[AllowAgent, ...] | None = None


class SystemAgent(Section):
    """``agents.defaults.systemAgent``: the agent that owns ambient work (the default agent)."""

    agent_id: AgentId


class AgentDefaults(Section):
    """``agents.defaults``: what every agent inherits."""

    model: ModelSelectionInput
    max_concurrent: PositiveInt = 4
    timeout_seconds: PositiveInt = 600
    workspace: ResolvedPath | None = None
    subagents: SubagentDefaults = SubagentDefaults()
    system_agent: SystemAgent | None = None
    bootstrap_max_chars: PositiveInt = DEFAULT_BOOTSTRAP_MAX_CHARS
    bootstrap_total_max_chars: PositiveInt = DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS
    skip_bootstrap: StrictBool = False
    skip_optional_bootstrap_files: tuple[Literal["SOUL.md", "USER.md", "IDENTITY.md", "HEARTBEAT.md"], ...] = ()


class AgentSubagentsConfig(Section):
    """``agents.entries.<id>.subagents``: which agents this one may spawn (replaces the default list)."""

    allow_agents: tuple[AllowAgent, ...] | None = None


class AgentIdentity(Section):
    """``agents.entries.<id>.identity``: how the agent presents itself (display only)."""

    name: StrictStr | None = None
    theme: StrictStr | None = None
    emoji: StrictStr | None = None
    avatar: StrictStr | None = None


class AgentEntryConfig(Section):
    """One agent as the file writes it; an absent ``model`` means ``agents.defaults.model``.

    ``default`` is OpenClaw's ownership marker; ``name``, ``description`` and ``identity`` are for display;
    ``instructions`` is clawstack's own key (OpenClaw has no such key: its agents read ``AGENTS.md``).
    """

    default: StrictBool | None = None
    name: StrictStr | None = None
    description: StrictStr | None = None
    identity: AgentIdentity | None = None
    workspace: ResolvedPath | None = None
    model: ModelSelectionInput | None = None
    tools: ToolPolicy = ToolPolicy()
    subagents: AgentSubagentsConfig = AgentSubagentsConfig()
    bootstrap_max_chars: PositiveInt | None = None
    bootstrap_total_max_chars: PositiveInt | None = None
    instructions: StrictStr | None = None


class AgentListItem(AgentEntryConfig):
    """``agents.list[]``: an entry with its ``id``."""

    id: AgentId


class AgentsConfig(Section):
    """``agents``: the defaults, the roster (``entries`` or ``list``), and ``ownership``."""

    ownership: Literal["explicit"] | None = None
    defaults: AgentDefaults
    entries: dict[AgentId, AgentEntryConfig] | None = None
    list_: tuple[AgentListItem, ...] | None = Field(default=None, alias="list")

    @field_validator("entries", mode="before")
    @classmethod
    def _no_colliding_ids(cls, value: object) -> object:
        if isinstance(value, dict):
            seen: dict[str, str] = {}
            for key in value:
                if isinstance(key, str):
                    try:
                        lowered = normalize_agent_id(key)
                    except AgentIdError:
                        continue  # reported against the key itself
                    if lowered in seen:
                        raise ValueError(
                            f"agent ids {json.dumps(seen[lowered])} and {json.dumps(key)} both normalise to"
                            f" {json.dumps(lowered)}"
                        )
                    seen[lowered] = key
        return value

    def roster(self) -> tuple[tuple[str, AgentEntryConfig, tuple[str | int, ...]], ...]:
        """Every configured agent in document order: ``(id, entry, key path of the entry)``."""
        if self.list_ is not None:
            return tuple((item.id, item, ("agents", "list", i)) for i, item in enumerate(self.list_))
        return tuple(
            (agent_id, entry, ("agents", "entries", agent_id)) for agent_id, entry in (self.entries or {}).items()
        )
