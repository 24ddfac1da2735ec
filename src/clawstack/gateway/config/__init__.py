"""The gateway config: one JSON5 file with OpenClaw's key names, validated strictly.

:func:`load_config` reads a file; :func:`parse_config` takes its text (or an already-parsed mapping). Both return a
frozen :class:`GatewayConfig` whose attributes are the snake_case forms of the file's camelCase keys
(``agents.defaults.subagents.maxConcurrent`` is ``config.agents.defaults.subagents.max_concurrent``), or raise a
:class:`~clawstack.gateway.errors.GatewayConfigError` naming the key path of every problem. The hosted agents,
resolved by OpenClaw's rules, are :meth:`GatewayConfig.agent` (an :class:`AgentEntry`), :attr:`GatewayConfig.agent_ids`
and :attr:`GatewayConfig.default_agent_id`.

The modules, in the order a file goes through them:

* :mod:`.source`: JSON5 parsing, ``${NAME}`` references, the ignored OpenClaw keys dropped, key paths;
* :mod:`.values`, :mod:`.models`, :mod:`.agents`, :mod:`.sections`: the schema, section by section;
* :mod:`.checks`: pydantic's problems translated, and the rules that span keys;
* :mod:`.roster` and :mod:`.paths`: the hosted agents resolved (default agent, models, workspaces, spawn
  allow-lists) and the per-gateway state directory;
* :mod:`.openclaw`: which OpenClaw keys are ignored, and which are refused as not supported;
* :mod:`.document`: :class:`GatewayConfig` and the loaders.
"""

from clawstack.gateway.config.agents import (
    DEFAULT_BOOTSTRAP_MAX_CHARS,
    DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS,
    OPTIONAL_BOOTSTRAP_FILES,
    AgentDefaults,
    AgentEntryConfig,
    AgentIdentity,
    AgentListItem,
    AgentsConfig,
    AgentSubagentsConfig,
    SessionToolsConfig,
    SubagentDefaults,
    SwarmConfig,
    SystemAgent,
    ToolPolicy,
    ToolProfile,
    ToolsConfig,
)
from clawstack.gateway.config.checks import problems_from_pydantic
from clawstack.gateway.config.document import GatewayConfig, load_config, parse_config
from clawstack.gateway.config.models import (
    ModelCost,
    ModelsConfig,
    ModelSelection,
    ProviderConfig,
    ProviderModel,
)
from clawstack.gateway.config.openclaw import IGNORED_KEY_REASONS, IGNORED_KEYS, UNSUPPORTED_MESSAGE
from clawstack.gateway.config.paths import GATEWAY_HOME_ENV, default_state_dir, gateway_home
from clawstack.gateway.config.roster import MAIN_AGENT_ID, AgentEntry, AgentSubagents, Roster
from clawstack.gateway.config.sections import (
    DEFAULT_PORT,
    MIN_WEBHOOK_SECRET_LENGTH,
    OPERATOR_ROLES,
    ChannelLink,
    ChannelsConfig,
    CronConfig,
    GatewayAuth,
    GatewaySection,
    HooksConfig,
    Operator,
    PluginEntry,
    PluginLoad,
    PluginsConfig,
    PluginSubagentPolicy,
    WebhookChannelConfig,
    WebhookOutbound,
)
from clawstack.gateway.config.values import TOOL_GROUPS, PluginId, expand_tool_names, split_model_ref

#: The old private name of :func:`problems_from_pydantic`, which the plugin loader uses for manifest errors.
_problems_from_pydantic = problems_from_pydantic

__all__ = [
    "DEFAULT_BOOTSTRAP_MAX_CHARS",
    "DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS",
    "DEFAULT_PORT",
    "GATEWAY_HOME_ENV",
    "IGNORED_KEYS",
    "IGNORED_KEY_REASONS",
    "MAIN_AGENT_ID",
    "MIN_WEBHOOK_SECRET_LENGTH",
    "OPERATOR_ROLES",
    "OPTIONAL_BOOTSTRAP_FILES",
    "TOOL_GROUPS",
    "UNSUPPORTED_MESSAGE",
    "AgentDefaults",
    "AgentEntry",
    "AgentEntryConfig",
    "AgentIdentity",
    "AgentListItem",
    "AgentSubagents",
    "AgentSubagentsConfig",
    "AgentsConfig",
    "ChannelLink",
    "ChannelsConfig",
    "CronConfig",
    "GatewayAuth",
    "GatewayConfig",
    "GatewaySection",
    "HooksConfig",
    "ModelCost",
    "ModelSelection",
    "ModelsConfig",
    "Operator",
    "PluginEntry",
    "PluginId",
    "PluginLoad",
    "PluginSubagentPolicy",
    "PluginsConfig",
    "ProviderConfig",
    "ProviderModel",
    "Roster",
    "SessionToolsConfig",
    "SubagentDefaults",
    "SwarmConfig",
    "SystemAgent",
    "ToolPolicy",
    "ToolProfile",
    "ToolsConfig",
    "WebhookChannelConfig",
    "WebhookOutbound",
    "default_state_dir",
    "expand_tool_names",
    "gateway_home",
    "load_config",
    "parse_config",
    "problems_from_pydantic",
    "split_model_ref",
]
