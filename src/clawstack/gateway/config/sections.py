"""The sections around the agents: ``plugins``, ``hooks``, ``cron``, ``gateway``, ``operators``, ``channels``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, StrictBool, StrictInt, StrictStr

from clawstack.gateway.config.models import Section
from clawstack.gateway.config.values import (
    AgentId,
    AllowedModel,
    ChannelName,
    NonEmptyStr,
    OperatorRole,
    PluginId,
    PositiveInt,
    ResolvedPath,
    check_base_url,
    check_hooks_path,
    check_sender_pattern,
)

__all__ = [
    "DEFAULT_PORT",
    "MIN_WEBHOOK_SECRET_LENGTH",
    "OPERATOR_ROLES",
    "ChannelLink",
    "ChannelsConfig",
    "CronConfig",
    "GatewayAuth",
    "GatewaySection",
    "HooksConfig",
    "Operator",
    "PluginEntry",
    "PluginLoad",
    "PluginSubagentPolicy",
    "PluginsConfig",
    "WebhookChannelConfig",
    "WebhookOutbound",
]

#: The WebSocket port when ``gateway.port`` is not given (OpenClaw's default).
DEFAULT_PORT = 18789

#: The shortest ``channels.webhook.secret`` accepted: a much shorter HMAC key could be guessed.
MIN_WEBHOOK_SECRET_LENGTH = 16

#: The roles an operator may hold.
OPERATOR_ROLES: tuple[str, ...] = ("operator.admin", "operator.read", "operator.write")


class PluginLoad(Section):
    """``plugins.load``: extra plugin directories (relative paths are resolved against the config's directory)."""

    paths: tuple[ResolvedPath, ...] = ()


class PluginSubagentPolicy(Section):
    """``plugins.entries.<id>.subagent``: may the plugin choose a model, and which ones."""

    allow_model_override: StrictBool = False
    allowed_models: tuple[AllowedModel, ...] = ()


class PluginEntry(Section):
    """``plugins.entries.<id>``: one plugin's switch, trust class, subagent model policy and own config."""

    enabled: StrictBool = True
    trust: Literal["bundled", "trusted", "installed"] = "installed"
    subagent: PluginSubagentPolicy = PluginSubagentPolicy()
    config: dict[str, Any] = Field(default_factory=dict)


class PluginsConfig(Section):
    """``plugins``: where to load plugins from and per-plugin settings."""

    load: PluginLoad = PluginLoad()
    entries: dict[PluginId, PluginEntry] = Field(default_factory=dict)


class HooksConfig(Section):
    """``hooks``: the HTTP hook endpoint; ``token`` is required when enabled."""

    enabled: StrictBool = False
    token: SecretStr | None = None
    path: Annotated[StrictStr, AfterValidator(check_hooks_path)] = "/hooks"


class CronConfig(Section):
    """``cron``: the shared budget of scheduled and hook-dispatched turns."""

    max_concurrent: PositiveInt = 2


class GatewayAuth(Section):
    """``gateway.auth``: how WebSocket clients authenticate; the secret matching ``mode`` is required."""

    mode: Literal["token", "password"] = "token"
    token: SecretStr | None = None
    password: SecretStr | None = None

    @property
    def secret(self) -> SecretStr:
        """The secret clients must present for :attr:`mode` (validated to be present)."""
        secret = self.token if self.mode == "token" else self.password
        assert secret is not None  # parse_config refuses a config without it
        return secret


class GatewaySection(Section):
    """``gateway``: the WebSocket listener (port 0 picks a free port)."""

    mode: Literal["local"] = "local"
    port: Annotated[StrictInt, Field(ge=0, le=65535)] = DEFAULT_PORT
    bind: Literal["loopback", "lan"] = "loopback"
    auth: GatewayAuth

    @property
    def bind_host(self) -> str:
        """The address to listen on: ``127.0.0.1`` for ``loopback``, every IPv4 address for ``lan``."""
        return "127.0.0.1" if self.bind == "loopback" else "0.0.0.0"  # noqa: S104 - "lan" means exactly this


class ChannelLink(Section):
    """``operators[].links[]``: a sender identity on a channel that is this operator."""

    channel: ChannelName
    id: NonEmptyStr


class Operator(Section):
    """``operators[]``: a person with roles and the channel identities that are them."""

    name: NonEmptyStr
    roles: Annotated[tuple[OperatorRole, ...], Field(min_length=1)]
    links: tuple[ChannelLink, ...] = ()


class WebhookOutbound(Section):
    """``channels.webhook.outbound``: where the channel's replies are POSTed, and how long one attempt may take."""

    url: Annotated[StrictStr, AfterValidator(check_base_url)]
    timeout_seconds: Annotated[StrictInt, Field(ge=1, le=300)] = 10


class WebhookChannelConfig(Section):
    """``channels.webhook``: the signed local webhook channel; ``secret`` is required when enabled.

    ``agentId`` defaults to the gateway's default agent (:attr:`GatewayConfig.default_agent_id
    <clawstack.gateway.config.GatewayConfig.default_agent_id>`), filled in once the roster is known.
    """

    enabled: StrictBool = False
    secret: SecretStr | None = None
    path: Annotated[StrictStr, AfterValidator(check_hooks_path)] = "/channels/webhook"
    agent_id: AgentId = ""
    allow_from: tuple[Annotated[StrictStr, AfterValidator(check_sender_pattern)], ...] = ()
    outbound: WebhookOutbound | None = None
    max_skew_seconds: Annotated[StrictInt, Field(ge=1, le=86400)] = 300

    def allows(self, sender_id: str) -> bool:
        """Whether ``sender_id`` passes the channel's command authorization (``allowFrom``; ``"*"`` is everyone)."""
        return "*" in self.allow_from or sender_id in self.allow_from


class ChannelsConfig(Section):
    """``channels``: the built-in channel adapters (Gateway chat needs no entry)."""

    webhook: WebhookChannelConfig = WebhookChannelConfig()
