"""The whole config (:class:`GatewayConfig`) and its loaders, :func:`load_config` and :func:`parse_config`.

Loading happens in five steps, each reporting problems by key path and never quoting a secret: JSON5 parsing;
the ignored OpenClaw keys dropped (:mod:`~clawstack.gateway.config.openclaw`); ``${NAME}`` references resolved;
schema validation (unknown keys refused at every depth, no coercion); the checks that span keys. Then the roster
is resolved (:mod:`~clawstack.gateway.config.roster`) against the gateway's state directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationError

from clawstack.gateway.config.agents import AgentsConfig, ToolsConfig
from clawstack.gateway.config.checks import cross_checks, problems_from_pydantic
from clawstack.gateway.config.models import ModelsConfig, ModelSelection, ProviderConfig, ProviderModel, Section
from clawstack.gateway.config.paths import default_state_dir
from clawstack.gateway.config.roster import AgentEntry, Roster, build_roster
from clawstack.gateway.config.sections import (
    ChannelsConfig,
    CronConfig,
    GatewaySection,
    HooksConfig,
    Operator,
    PluginsConfig,
)
from clawstack.gateway.config.source import drop_ignored, find_inert, interpolate, parse_json5, rebuild
from clawstack.gateway.config.values import split_model_ref
from clawstack.gateway.errors import (
    ConfigProblem,
    GatewayConfigError,
    GatewayConfigSyntaxError,
    GatewayConfigUnreadableError,
)
from clawstack.gateway.keys import normalize_agent_id

__all__ = ["GatewayConfig", "load_config", "parse_config"]


class GatewayConfig(Section):
    """The whole gateway config. Build it with :func:`load_config` or :func:`parse_config`.

    The hosted agents are reached through :meth:`agent`, :attr:`agent_ids` and :attr:`default_agent_id`, which
    apply OpenClaw's roster rules; ``agents`` is the section as written.
    """

    models: ModelsConfig
    agents: AgentsConfig
    tools: ToolsConfig = ToolsConfig()
    plugins: PluginsConfig = PluginsConfig()
    hooks: HooksConfig = HooksConfig()
    cron: CronConfig = CronConfig()
    gateway: GatewaySection
    operators: tuple[Operator, ...] = ()
    channels: ChannelsConfig = ChannelsConfig()

    _ignored_keys: tuple[str, ...] = PrivateAttr(default=())
    _state_dir: Path = PrivateAttr(default=Path())
    _roster: Roster | None = PrivateAttr(default=None)

    @property
    def ignored_keys(self) -> tuple[str, ...]:
        """The ignored OpenClaw keys this file carried (dotted key paths), so the gateway can say it ignores them."""
        return self._ignored_keys

    @property
    def state_dir(self) -> Path:
        """The gateway's state directory: where workspaces nobody configured live (see :meth:`with_state_dir`)."""
        return self._state_dir

    def with_state_dir(self, state_dir: str | os.PathLike[str]) -> GatewayConfig:
        """This config with another state directory (and the workspaces that derive from it)."""
        copy = self.model_copy()
        copy._state_dir = Path(os.path.abspath(state_dir))
        copy._roster = build_roster(copy.agents, copy._state_dir)
        return copy

    @property
    def roster(self) -> Roster:
        """Every hosted agent, resolved, in document order."""
        assert self._roster is not None  # set by parse_config
        return self._roster

    @property
    def agent_ids(self) -> tuple[str, ...]:
        """The hosted agents' ids in document order (``("main",)`` when the config names none)."""
        return tuple(self.roster.agents)

    @property
    def default_agent_id(self) -> str:
        """The agent that owns ambient work and answers when no agent is named (see :mod:`.roster`)."""
        return self.roster.default_agent_id

    def agent(self, agent_id: str) -> AgentEntry:
        """The hosted agent ``agent_id`` (normalised first), resolved; ``KeyError`` if there is no such agent.

        A malformed id raises :class:`~clawstack.gateway.keys.AgentIdError`.
        """
        return self.roster.agents[normalize_agent_id(agent_id)]

    def agent_model(self, agent_id: str) -> ModelSelection:
        """The model selection ``agent_id`` runs with: its own, or ``agents.defaults.model``."""
        return self.agent(agent_id).model

    def resolve_model(self, ref: str) -> tuple[ProviderConfig, ProviderModel]:
        """The provider and model a ``provider/model`` reference names; ``KeyError`` if it names none."""
        provider_id, model_id = split_model_ref(ref)
        provider = self.models.providers[provider_id]
        for model in provider.models:
            if model.id == model_id:
                return provider, model
        raise KeyError(ref)


def load_config(
    path: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> GatewayConfig:
    """Read and validate the JSON5 config at ``path``; relative paths in it are resolved against its directory.

    ``state_dir`` defaults to :func:`~clawstack.gateway.config.paths.default_state_dir` of ``path``.
    """
    file = Path(path)
    try:
        text = file.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise GatewayConfigUnreadableError((ConfigProblem("", f"cannot read {file}: {reason}"),)) from exc
    if state_dir is None:
        state_dir = default_state_dir(file, environ)
    return parse_config(text, base_dir=file.resolve().parent, environ=environ, state_dir=state_dir)


def parse_config(
    data: str | bytes | Mapping[str, Any],
    *,
    base_dir: str | os.PathLike[str],
    environ: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> GatewayConfig:
    """Validate a config given as JSON5 text (or an already-parsed mapping) and return it.

    ``base_dir`` anchors relative paths (``workspace`` keys, ``plugins.load.paths``); ``environ`` (default:
    ``os.environ``) resolves ``${NAME}`` values and the default state directory; ``state_dir`` defaults to
    :func:`~clawstack.gateway.config.paths.default_state_dir` of ``base_dir``.
    """
    document = parse_json5(data) if isinstance(data, str | bytes) else rebuild(data, [])
    if not isinstance(document, dict):
        raise GatewayConfigSyntaxError(ConfigProblem("", "the document must be a JSON5 object"))
    problems: list[ConfigProblem] = []
    document, ignored = drop_ignored(document, problems)
    document = interpolate(document, [], os.environ if environ is None else environ, problems)
    if problems:
        raise GatewayConfigError(problems)
    base = Path(base_dir).resolve()
    try:
        config = GatewayConfig.model_validate(document, context={"base_dir": base})
    except ValidationError as exc:
        problems = problems_from_pydantic(exc.errors(include_url=False, include_input=False))
    if problems:
        # Raised outside the ``except`` block: pydantic's error is not kept as context, so no rendering of the
        # input (which may be a secret) travels with ours.
        raise GatewayConfigError(problems)
    problems = cross_checks(config)
    if problems:
        raise GatewayConfigError(problems)
    config = config.with_state_dir(default_state_dir(base, environ) if state_dir is None else state_dir)
    webhook = config.channels.webhook
    if "agent_id" not in webhook.model_fields_set:
        filled = webhook.model_copy(update={"agent_id": config.default_agent_id})
        config = config.model_copy(update={"channels": config.channels.model_copy(update={"webhook": filled})})
    config._ignored_keys = (*ignored, *find_inert(document))
    return config
