"""The agents a gateway hosts, resolved: each one's model, tools, workspace and spawn allow-list.

:func:`build_roster` turns the validated ``agents`` section into one :class:`AgentEntry` per agent, in document
order, by OpenClaw's rules:

* **The roster.** ``agents.entries`` or ``agents.list``; when neither names an agent, the gateway hosts one
  agent, ``main`` (:data:`MAIN_AGENT_ID`). Otherwise only the configured agents exist (a session key naming
  another agent is refused).
* **The default agent** (:attr:`Roster.default_agent_id`, the owner of ambient work): the one
  ``agents.defaults.systemAgent.agentId`` names; else the one marked ``default: true``; else the first one
  listed (the only one, unless the fleet is ``ownership: "explicit"``).
* **Workspaces** (:func:`~clawstack.gateway.config.paths.agent_workspace`): the agent marked ``default: true``
  or the only agent owns ``agents.defaults.workspace``; in an explicit fleet nobody does, and every agent without
  its own ``workspace`` gets a directory named after it.
* **Models.** An agent's own ``model`` replaces the default selection whole: ``"provider/model"`` and
  ``{primary}`` have no fallbacks unless the agent lists them.
* **Spawn allow-list** (:class:`AgentSubagents`): ``subagents.allowAgents`` of the agent, else of
  ``agents.defaults.subagents``, else the agent itself only; ``"*"`` allows every configured agent.
* **Bootstrap limits.** ``bootstrapMaxChars`` and ``bootstrapTotalMaxChars`` of the agent, else of the defaults.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from clawstack.gateway.config.agents import (
    AgentDefaults,
    AgentEntryConfig,
    AgentIdentity,
    AgentsConfig,
    ToolPolicy,
)
from clawstack.gateway.config.models import ModelSelection
from clawstack.gateway.config.paths import agent_workspace
from clawstack.gateway.keys import normalize_agent_id

__all__ = [
    "MAIN_AGENT_ID",
    "AgentEntry",
    "AgentSubagents",
    "Roster",
    "build_roster",
]

#: The agent a gateway hosts when the config names none (OpenClaw's implicit agent).
MAIN_AGENT_ID = "main"


@dataclass(frozen=True, slots=True)
class AgentSubagents:
    """Which agents an agent may spawn children as (``sessions_spawn`` with an ``agentId``).

    ``allow_agents`` is the effective list as configured (normalised ids, or ``"*"``); :meth:`allows` answers for
    one target, counting only configured agents.
    """

    requester_id: str
    allow_agents: tuple[str, ...]
    configured: frozenset[str]

    def allows(self, agent_id: str) -> bool:
        """Whether a child of the requester may run as ``agent_id`` (normalised first; unknown ids never).

        A malformed id raises :class:`~clawstack.gateway.keys.AgentIdError`.
        """
        target = normalize_agent_id(agent_id)
        if target not in self.configured:
            return False
        return "*" in self.allow_agents or target in self.allow_agents


@dataclass(frozen=True, slots=True)
class AgentEntry:
    """One hosted agent with every setting resolved (see the module docstring for the rules).

    ``name``, ``description`` and ``identity`` are display-only; ``instructions`` is clawstack's own system-prompt
    text for the agent (the workspace's bootstrap files come on top of it). ``workspace`` is absolute and may not
    exist yet (:func:`clawstack.gateway.bootstrap.prepare_workspace` creates it).
    """

    id: str
    is_default: bool
    name: str | None
    description: str | None
    identity: AgentIdentity | None
    model: ModelSelection
    tools: ToolPolicy
    instructions: str | None
    workspace: Path
    subagents: AgentSubagents
    bootstrap_max_chars: int
    bootstrap_total_max_chars: int
    skip_bootstrap: bool
    skip_optional_bootstrap_files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Roster:
    """The hosted agents by id (document order) and the default agent's id."""

    agents: Mapping[str, AgentEntry]
    default_agent_id: str

    def __iter__(self) -> Iterator[AgentEntry]:
        return iter(self.agents.values())


def _default_agent_id(agents: AgentsConfig, ids: list[str], marked: list[str]) -> str:
    if agents.defaults.system_agent is not None:
        return agents.defaults.system_agent.agent_id
    return marked[0] if marked else ids[0]


def build_roster(agents: AgentsConfig, state_dir: Path) -> Roster:
    """Resolve every agent of a validated ``agents`` section; ``state_dir`` hosts workspaces nobody configured.

    The section must have passed the cross-checks (one roster form, known ids, at most one marked default).
    """
    configured = agents.roster()
    if not configured:
        configured = ((MAIN_AGENT_ID, AgentEntryConfig(), ("agents",)),)
    ids = [agent_id for agent_id, _, _ in configured]
    marked = [agent_id for agent_id, entry, _ in configured if entry.default] if agents.ownership is None else []
    default_id = _default_agent_id(agents, ids, marked)
    root_owner = marked[0] if marked else ids[0] if len(ids) == 1 else None
    defaults = agents.defaults
    known = frozenset(ids)
    resolved: dict[str, AgentEntry] = {}
    for agent_id, entry, _ in configured:
        resolved[agent_id] = _resolve(agent_id, entry, defaults, known, state_dir, agent_id == default_id, root_owner)
    return Roster(resolved, default_id)


def _resolve(
    agent_id: str,
    entry: AgentEntryConfig,
    defaults: AgentDefaults,
    known: frozenset[str],
    state_dir: Path,
    is_default: bool,
    root_owner: str | None,
) -> AgentEntry:
    allow = entry.subagents.allow_agents
    if allow is None:
        allow = defaults.subagents.allow_agents
    workspace = agent_workspace(
        agent_id, own=entry.workspace, root=defaults.workspace, owns_root=agent_id == root_owner, state_dir=state_dir
    )
    return AgentEntry(
        id=agent_id,
        is_default=is_default,
        name=entry.name,
        description=entry.description,
        identity=entry.identity,
        model=entry.model if entry.model is not None else defaults.model,
        tools=entry.tools,
        instructions=entry.instructions,
        workspace=workspace,
        subagents=AgentSubagents(agent_id, (agent_id,) if allow is None else allow, known),
        bootstrap_max_chars=entry.bootstrap_max_chars or defaults.bootstrap_max_chars,
        bootstrap_total_max_chars=entry.bootstrap_total_max_chars or defaults.bootstrap_total_max_chars,
        skip_bootstrap=defaults.skip_bootstrap,
        skip_optional_bootstrap_files=defaults.skip_optional_bootstrap_files,
    )
