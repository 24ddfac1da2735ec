"""The gateway config: one JSON5 file with OpenClaw's key names, validated strictly.

:func:`load_config` reads a file; :func:`parse_config` takes its text (or an already-parsed mapping). Both return a
frozen :class:`GatewayConfig` whose attributes are the snake_case forms of the file's camelCase keys
(``agents.defaults.subagents.maxConcurrent`` is ``config.agents.defaults.subagents.max_concurrent``), or raise a
:class:`~clawstack.gateway.errors.GatewayConfigError` naming the key path of every problem.

Processing happens in four steps, each reporting problems by key path and never quoting a secret:

1. JSON5 parsing: a syntax error gives a line and column; a key repeated in one object is an error; ``NaN`` and
   ``Infinity`` are refused; the document must be an object.
2. OpenClaw keys that clawstack does not act on (:data:`IGNORED_KEYS`) are dropped and listed in
   :attr:`GatewayConfig.ignored_keys`.
3. A string value that is exactly ``${NAME}`` (``NAME`` matching ``[A-Z_][A-Z0-9_]*``) is replaced by that
   environment variable, which must be set and non-empty; ``$${NAME}`` stands for the literal text ``${NAME}``.
4. Schema validation (unknown keys refused at every depth, no type coercion), then the checks that span keys:
   model references, secrets required by a mode, duplicate model ids, operators and channel identity links.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import json5
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

from clawstack.gateway.errors import (
    ConfigProblem,
    GatewayConfigError,
    GatewayConfigSyntaxError,
    GatewayConfigUnreadableError,
)
from clawstack.gateway.keys import AgentIdError, normalize_agent_id

__all__ = [
    "DEFAULT_PORT",
    "IGNORED_KEYS",
    "MAIN_AGENT_ID",
    "MIN_WEBHOOK_SECRET_LENGTH",
    "OPERATOR_ROLES",
    "TOOL_GROUPS",
    "AgentDefaults",
    "AgentEntry",
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
    "PluginLoad",
    "PluginSubagentPolicy",
    "PluginsConfig",
    "ProviderConfig",
    "ProviderModel",
    "SubagentDefaults",
    "ToolPolicy",
    "WebhookChannelConfig",
    "WebhookOutbound",
    "expand_tool_names",
    "load_config",
    "parse_config",
    "split_model_ref",
]

#: The agent that always exists, whether or not ``agents.entries`` names it.
MAIN_AGENT_ID = "main"

#: The WebSocket port when ``gateway.port`` is not given (OpenClaw's default).
DEFAULT_PORT = 18789

#: Tool groups usable in ``allow``/``deny`` lists, and the tools each one stands for.
TOOL_GROUPS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "group:fs": frozenset({"read", "write", "edit", "apply_patch"}),
        "group:runtime": frozenset({"exec", "process"}),
        "group:web": frozenset({"web_search", "web_fetch"}),
        "group:sessions": frozenset(
            {"sessions_list", "sessions_history", "sessions_send", "sessions_spawn", "session_status"}
        ),
        "group:messaging": frozenset({"message"}),
        "group:automation": frozenset({"cron", "gateway"}),
    }
)

#: The shortest ``channels.webhook.secret`` accepted: a much shorter HMAC key could be guessed.
MIN_WEBHOOK_SECRET_LENGTH = 16

#: The roles an operator may hold.
OPERATOR_ROLES: tuple[str, ...] = ("operator.admin", "operator.read", "operator.write")

#: OpenClaw keys an offline config carries that clawstack accepts and does not act on.
IGNORED_KEYS: tuple[str, ...] = (
    "update",
    "logging",
    "telemetry",
    "discovery",
    "gateway.tailscale",
    "models.mode",
    "models.catalogRefresh",
)

_PROVIDER_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_PLUGIN_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CHANNEL = re.compile(r"[a-z0-9-]{1,64}")
_HOOKS_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")
#: A channel sender id becomes a session-key segment (``agent:<id>:channel:webhook:<sender>``), so it follows that rule.
_SENDER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
_ENV_REF = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_$-]+")
_JSON5_POSITION = re.compile(r"^<string>:(\d+) .* at column (\d+)$", re.DOTALL)


# --------------------------------------------------------------------------------------------------------------------
# Value rules


def _agent_id(value: str) -> str:
    try:
        return normalize_agent_id(value)
    except AgentIdError as exc:
        raise ValueError(exc.message) from None


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


def _check_base_url(value: str) -> str:
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


def _check_hooks_path(value: str) -> str:
    if not _HOOKS_PATH.fullmatch(value):
        raise ValueError('must be an absolute URL path such as "/hooks" (no trailing "/")')
    return value


def _check_no_space(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be non-empty and contain no whitespace")
    return value


def _check_sender_pattern(value: str) -> str:
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


def _resolve_path(value: object, info: ValidationInfo) -> Path:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if not value:
        raise ValueError("must not be empty")
    path = Path(value).expanduser()
    base_dir = info.context.get("base_dir") if isinstance(info.context, dict) else None
    if not path.is_absolute() and isinstance(base_dir, Path):
        path = base_dir / path
    return Path(os.path.normpath(path))


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


# --------------------------------------------------------------------------------------------------------------------
# Schema


class _Section(BaseModel):
    """Base of every config section: camelCase keys, unknown keys refused, immutable, inputs never echoed."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=False,
        hide_input_in_errors=True,
    )


class ModelCost(_Section):
    """``models.providers.<id>.models[].cost``: price per million tokens (informational)."""

    input: Annotated[StrictFloat, Field(ge=0)] = 0.0
    output: Annotated[StrictFloat, Field(ge=0)] = 0.0
    cache_read: Annotated[StrictFloat, Field(ge=0)] = 0.0
    cache_write: Annotated[StrictFloat, Field(ge=0)] = 0.0


class ProviderModel(_Section):
    """One model a provider serves: ``{id, name?, contextWindow?, maxTokens?, reasoning?, input?, cost?}``."""

    id: Annotated[StrictStr, AfterValidator(_check_no_space)]
    name: StrictStr | None = None
    context_window: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    reasoning: StrictBool = False
    input: Annotated[tuple[Literal["text", "image"], ...], Field(min_length=1)] = ("text",)
    cost: ModelCost = ModelCost()


class ProviderConfig(_Section):
    """``models.providers.<id>``: an OpenAI-compatible endpoint and the models it serves."""

    base_url: Annotated[StrictStr, AfterValidator(_check_base_url)]
    api_key: SecretStr | None = None
    api: Literal["openai-completions"] = "openai-completions"
    models: Annotated[tuple[ProviderModel, ...], Field(min_length=1)]


class ModelsConfig(_Section):
    """``models``: the configured providers (at least one)."""

    providers: Annotated[dict[ProviderId, ProviderConfig], Field(min_length=1)]


class ModelSelection(_Section):
    """``model``: a primary ``provider/model`` and the fallbacks tried in order after it."""

    primary: ModelRef
    fallbacks: tuple[ModelRef, ...] = ()

    @property
    def chain(self) -> tuple[str, ...]:
        """The primary followed by the fallbacks."""
        return (self.primary, *self.fallbacks)


class SubagentDefaults(_Section):
    """``agents.defaults.subagents``: limits on background (subagent) work."""

    max_concurrent: PositiveInt = 8
    max_spawn_depth: PositiveInt = 1
    max_children_per_agent: PositiveInt = 5
    run_timeout_seconds: PositiveInt = 600
    archive_after_minutes: PositiveInt = 60


class AgentDefaults(_Section):
    """``agents.defaults``: what every agent inherits."""

    model: ModelSelection
    max_concurrent: PositiveInt = 4
    timeout_seconds: PositiveInt = 600
    workspace: ResolvedPath | None = None
    subagents: SubagentDefaults = SubagentDefaults()


class ToolPolicy(_Section):
    """``tools`` / ``agents.entries.<id>.tools``: tool names and groups; ``allow`` absent means no allow-list."""

    allow: tuple[ToolName, ...] | None = None
    deny: tuple[ToolName, ...] = ()


class AgentEntry(_Section):
    """``agents.entries.<id>``: one agent; an absent ``model`` means ``agents.defaults.model``."""

    model: ModelSelection | None = None
    instructions: StrictStr | None = None
    tools: ToolPolicy = ToolPolicy()


class AgentsConfig(_Section):
    """``agents``: the defaults and the agents by normalised id; ``main`` is always present."""

    defaults: AgentDefaults
    entries: dict[AgentId, AgentEntry] = Field(default_factory=dict, validate_default=True)

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

    @field_validator("entries", mode="after")
    @classmethod
    def _main_exists(cls, value: dict[str, AgentEntry]) -> dict[str, AgentEntry]:
        if MAIN_AGENT_ID not in value:
            value = {MAIN_AGENT_ID: AgentEntry(), **value}
        return value


class PluginLoad(_Section):
    """``plugins.load``: extra plugin directories (relative paths are resolved against the config's directory)."""

    paths: tuple[ResolvedPath, ...] = ()


class PluginSubagentPolicy(_Section):
    """``plugins.entries.<id>.subagent``: may the plugin choose a model, and which ones."""

    allow_model_override: StrictBool = False
    allowed_models: tuple[AllowedModel, ...] = ()


class PluginEntry(_Section):
    """``plugins.entries.<id>``: one plugin's switch, trust class, subagent model policy and own config."""

    enabled: StrictBool = True
    trust: Literal["bundled", "trusted", "installed"] = "installed"
    subagent: PluginSubagentPolicy = PluginSubagentPolicy()
    config: dict[str, Any] = Field(default_factory=dict)


class PluginsConfig(_Section):
    """``plugins``: where to load plugins from and per-plugin settings."""

    load: PluginLoad = PluginLoad()
    entries: dict[PluginId, PluginEntry] = Field(default_factory=dict)


class HooksConfig(_Section):
    """``hooks``: the HTTP hook endpoint; ``token`` is required when enabled."""

    enabled: StrictBool = False
    token: SecretStr | None = None
    path: Annotated[StrictStr, AfterValidator(_check_hooks_path)] = "/hooks"


class CronConfig(_Section):
    """``cron``: the shared budget of scheduled and hook-dispatched turns."""

    max_concurrent: PositiveInt = 2


class GatewayAuth(_Section):
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


class GatewaySection(_Section):
    """``gateway``: the WebSocket listener (port 0 picks a free port)."""

    mode: Literal["local"] = "local"
    port: Annotated[StrictInt, Field(ge=0, le=65535)] = DEFAULT_PORT
    bind: Literal["loopback", "lan"] = "loopback"
    auth: GatewayAuth

    @property
    def bind_host(self) -> str:
        """The address to listen on: ``127.0.0.1`` for ``loopback``, every IPv4 address for ``lan``."""
        return "127.0.0.1" if self.bind == "loopback" else "0.0.0.0"  # noqa: S104 - "lan" means exactly this


class ChannelLink(_Section):
    """``operators[].links[]``: a sender identity on a channel that is this operator."""

    channel: ChannelName
    id: NonEmptyStr


class Operator(_Section):
    """``operators[]``: a person with roles and the channel identities that are them."""

    name: NonEmptyStr
    roles: Annotated[tuple[OperatorRole, ...], Field(min_length=1)]
    links: tuple[ChannelLink, ...] = ()


class WebhookOutbound(_Section):
    """``channels.webhook.outbound``: where the channel's replies are POSTed, and how long one attempt may take."""

    url: Annotated[StrictStr, AfterValidator(_check_base_url)]
    timeout_seconds: Annotated[StrictInt, Field(ge=1, le=300)] = 10


class WebhookChannelConfig(_Section):
    """``channels.webhook``: the signed local webhook channel; ``secret`` is required when enabled."""

    enabled: StrictBool = False
    secret: SecretStr | None = None
    path: Annotated[StrictStr, AfterValidator(_check_hooks_path)] = "/channels/webhook"
    agent_id: AgentId = MAIN_AGENT_ID
    allow_from: tuple[Annotated[StrictStr, AfterValidator(_check_sender_pattern)], ...] = ()
    outbound: WebhookOutbound | None = None
    max_skew_seconds: Annotated[StrictInt, Field(ge=1, le=86400)] = 300

    def allows(self, sender_id: str) -> bool:
        """Whether ``sender_id`` passes the channel's command authorization (``allowFrom``; ``"*"`` is everyone)."""
        return "*" in self.allow_from or sender_id in self.allow_from


class ChannelsConfig(_Section):
    """``channels``: the built-in channel adapters (Gateway chat needs no entry)."""

    webhook: WebhookChannelConfig = WebhookChannelConfig()


class GatewayConfig(_Section):
    """The whole gateway config. Build it with :func:`load_config` or :func:`parse_config`."""

    models: ModelsConfig
    agents: AgentsConfig
    tools: ToolPolicy = ToolPolicy()
    plugins: PluginsConfig = PluginsConfig()
    hooks: HooksConfig = HooksConfig()
    cron: CronConfig = CronConfig()
    gateway: GatewaySection
    operators: tuple[Operator, ...] = ()
    channels: ChannelsConfig = ChannelsConfig()

    _ignored_keys: tuple[str, ...] = PrivateAttr(default=())

    @property
    def ignored_keys(self) -> tuple[str, ...]:
        """The :data:`IGNORED_KEYS` this file carried (dotted paths), so the gateway can say it ignores them."""
        return self._ignored_keys

    def agent(self, agent_id: str) -> AgentEntry:
        """The entry for ``agent_id`` (normalised first); ``KeyError`` if there is no such agent.

        A malformed id raises :class:`~clawstack.gateway.keys.AgentIdError`.
        """
        return self.agents.entries[normalize_agent_id(agent_id)]

    def agent_model(self, agent_id: str) -> ModelSelection:
        """The model selection ``agent_id`` runs with: its own, or ``agents.defaults.model``."""
        return self.agent(agent_id).model or self.agents.defaults.model

    def resolve_model(self, ref: str) -> tuple[ProviderConfig, ProviderModel]:
        """The provider and model a ``provider/model`` reference names; ``KeyError`` if it names none."""
        provider_id, model_id = split_model_ref(ref)
        provider = self.models.providers[provider_id]
        for model in provider.models:
            if model.id == model_id:
                return provider, model
        raise KeyError(ref)


# --------------------------------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate the JSON5 config at ``path``; relative paths in it are resolved against its directory."""
    file = Path(path)
    try:
        text = file.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise GatewayConfigUnreadableError((ConfigProblem("", f"cannot read {file}: {reason}"),)) from exc
    return parse_config(text, base_dir=file.resolve().parent, environ=environ)


def parse_config(
    data: str | bytes | Mapping[str, Any],
    *,
    base_dir: str | os.PathLike[str],
    environ: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Validate a config given as JSON5 text (or an already-parsed mapping) and return it.

    ``base_dir`` anchors relative paths (``agents.defaults.workspace``, ``plugins.load.paths``); ``environ``
    (default: ``os.environ``) resolves ``${NAME}`` values.
    """
    document = _parse_json5(data) if isinstance(data, str | bytes) else _rebuild(data, [])
    if not isinstance(document, dict):
        raise GatewayConfigSyntaxError(ConfigProblem("", "the document must be a JSON5 object"))
    document, ignored = _drop_ignored(document)
    problems: list[ConfigProblem] = []
    document = _interpolate(document, [], os.environ if environ is None else environ, problems)
    if problems:
        raise GatewayConfigError(problems)
    try:
        config = GatewayConfig.model_validate(document, context={"base_dir": Path(base_dir).resolve()})
    except ValidationError as exc:
        problems = _problems_from_pydantic(exc.errors(include_url=False, include_input=False))
    if problems:
        # Raised outside the ``except`` block: pydantic's error is not kept as context, so no rendering of the
        # input (which may be a secret) travels with ours.
        raise GatewayConfigError(problems)
    problems = _cross_checks(config)
    if problems:
        raise GatewayConfigError(problems)
    config._ignored_keys = tuple(ignored)
    return config


class _Pairs(list[tuple[str, Any]]):
    """An object's members in document order, kept as pairs so duplicate keys can be reported with their path."""


def _parse_json5(data: str | bytes) -> Any:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GatewayConfigUnreadableError(
                (ConfigProblem("", f"file is not valid UTF-8 (byte {exc.start})"),)
            ) from None
    # Raised outside the ``except`` block so that the parser's error, which quotes the offending text, is not
    # kept as the context of ours; only its position is used.
    try:
        raw = json5.loads(data, object_pairs_hook=_Pairs)
    except ValueError as exc:
        error = _syntax_error(str(exc), empty=not data.strip())
    else:
        return _rebuild(raw, [])
    raise error


def _syntax_error(parser_message: str, *, empty: bool) -> GatewayConfigSyntaxError:
    match = _JSON5_POSITION.match(parser_message)
    if empty or match is None:
        return GatewayConfigSyntaxError(
            ConfigProblem("", "JSON5 syntax error" + (" (empty document)" if empty else ""))
        )
    line, column = int(match.group(1)), int(match.group(2))
    return GatewayConfigSyntaxError(
        ConfigProblem("", f"JSON5 syntax error at line {line}, column {column}"), line=line, column=column
    )


def _rebuild(value: Any, path: list[str | int]) -> Any:
    """Plain dicts and lists from parsed JSON5, refusing duplicate keys and non-finite numbers."""
    if isinstance(value, _Pairs | Mapping):
        pairs = list(value) if isinstance(value, _Pairs) else list(value.items())
        result: dict[str, Any] = {}
        for key, item in pairs:
            if key in result:
                raise GatewayConfigSyntaxError(ConfigProblem(_format_path(path), f"duplicate key {json.dumps(key)}"))
            result[key] = _rebuild(item, [*path, key])
        return result
    if isinstance(value, list | tuple):
        return [_rebuild(item, [*path, i]) for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise GatewayConfigSyntaxError(ConfigProblem(_format_path(path), "NaN and Infinity are not accepted"))
    return value


def _drop_ignored(document: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    ignored: list[str] = []
    document = dict(document)
    for dotted in IGNORED_KEYS:
        parent_key, _, child_key = dotted.rpartition(".")
        if not parent_key:
            if dotted in document:
                del document[dotted]
                ignored.append(dotted)
            continue
        parent = document.get(parent_key)
        if isinstance(parent, dict) and child_key in parent:
            document[parent_key] = {k: v for k, v in parent.items() if k != child_key}
            ignored.append(dotted)
    return document, ignored


def _interpolate(value: Any, path: list[str | int], environ: Mapping[str, str], problems: list[ConfigProblem]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, [*path, k], environ, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, [*path, i], environ, problems) for i, v in enumerate(value)]
    if isinstance(value, str):
        if value.startswith("$${") and _ENV_REF.fullmatch(value[1:]):
            return value[1:]
        match = _ENV_REF.fullmatch(value)
        if match:
            name = match.group(1)
            resolved = environ.get(name)
            if resolved is None or resolved == "":
                state = "is not set" if resolved is None else "is empty"
                problems.append(ConfigProblem(_format_path(path), f"environment variable {name} {state}"))
                return value
            return resolved
    return value


def _format_path(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


_TYPE_MESSAGES: Mapping[str, str] = {
    "extra_forbidden": "unknown key",
    "missing": "required",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "string_too_short": "must not be empty",
}


def _number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _problems_from_pydantic(errors: list[Any]) -> list[ConfigProblem]:
    # A list whose items failed is also reported as too short (the failed items do not count); the item errors say
    # what is wrong, so that echo is dropped.
    failed_locs = [tuple(err["loc"]) for err in errors]
    return [
        _problem_from_pydantic(err)
        for err in errors
        if not (
            err["type"] == "too_short"
            and any(len(loc) > len(err["loc"]) and loc[: len(err["loc"])] == tuple(err["loc"]) for loc in failed_locs)
        )
    ]


def _problem_from_pydantic(err: Mapping[str, Any]) -> ConfigProblem:
    loc = [part for part in err["loc"] if part != "[key]"]
    kind: str = err["type"]
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    if kind in _TYPE_MESSAGES:
        message = _TYPE_MESSAGES[kind]
    elif kind == "greater_than_equal":
        message = f"must be at least {_number(ctx['ge'])}"
    elif kind == "less_than_equal":
        message = f"must be at most {_number(ctx['le'])}"
    elif kind == "too_short":
        message = f"must have at least {ctx['min_length']} {'entry' if ctx['min_length'] == 1 else 'entries'}"
    elif kind == "literal_error":
        message = f"must be {str(ctx['expected']).replace(chr(39), chr(34))}"
    elif kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
    else:
        message = "is not valid"
    return ConfigProblem(_format_path(loc), message)


# --------------------------------------------------------------------------------------------------------------------
# Checks that span keys


def _cross_checks(config: GatewayConfig) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []

    def add(path: list[str | int], message: str) -> None:
        problems.append(ConfigProblem(_format_path(path), message))

    for provider_id, provider in config.models.providers.items():
        seen_models: set[str] = set()
        for i, model in enumerate(provider.models):
            if model.id in seen_models:
                add(
                    ["models", "providers", provider_id, "models", i, "id"],
                    f"duplicate model id {json.dumps(model.id)}",
                )
            seen_models.add(model.id)

    def check_ref(path: list[str | int], ref: str) -> None:
        provider_id, model_id = split_model_ref(ref)
        provider = config.models.providers.get(provider_id)
        if provider is None:
            add(path, f"unknown provider {json.dumps(provider_id)}")
        elif all(model.id != model_id for model in provider.models):
            add(path, f"provider {json.dumps(provider_id)} has no model {json.dumps(model_id)}")

    def check_selection(path: list[str | int], selection: ModelSelection) -> None:
        check_ref([*path, "primary"], selection.primary)
        for i, ref in enumerate(selection.fallbacks):
            check_ref([*path, "fallbacks", i], ref)

    check_selection(["agents", "defaults", "model"], config.agents.defaults.model)
    for agent_id, entry in config.agents.entries.items():
        if entry.model is not None:
            check_selection(["agents", "entries", agent_id, "model"], entry.model)
    for plugin_id, plugin in config.plugins.entries.items():
        for i, ref in enumerate(plugin.subagent.allowed_models):
            if ref != "*":
                check_ref(["plugins", "entries", plugin_id, "subagent", "allowedModels", i], ref)

    if config.hooks.enabled and config.hooks.token is None:
        add(["hooks", "token"], "required when hooks.enabled is true")
    if config.hooks.enabled and config.cron.max_concurrent < 2:
        add(
            ["cron", "maxConcurrent"], "must be at least 2 when hooks.enabled is true (one slot is kept for HTTP hooks)"
        )
    auth = config.gateway.auth
    other = "password" if auth.mode == "token" else "token"
    if getattr(auth, auth.mode) is None:
        add(["gateway", "auth", auth.mode], f"required when gateway.auth.mode is {json.dumps(auth.mode)}")
    if getattr(auth, other) is not None:
        add(["gateway", "auth", other], f"only used when gateway.auth.mode is {json.dumps(other)}")

    names: set[str] = set()
    links: dict[tuple[str, str], str] = {}
    for i, operator in enumerate(config.operators):
        if operator.name in names:
            add(["operators", i, "name"], f"duplicate operator name {json.dumps(operator.name)}")
        names.add(operator.name)
        if len(set(operator.roles)) != len(operator.roles):
            add(["operators", i, "roles"], "duplicate role")
        for j, link in enumerate(operator.links):
            key = (link.channel, link.id)
            if key in links:
                add(
                    ["operators", i, "links", j],
                    f"channel identity link {link.channel}:{json.dumps(link.id)} already belongs to operator"
                    f" {json.dumps(links[key])}",
                )
            else:
                links[key] = operator.name
    problems += _channel_checks(config)
    return problems


def _channel_checks(config: GatewayConfig) -> list[ConfigProblem]:
    webhook = config.channels.webhook
    path = ["channels", "webhook"]
    problems: list[ConfigProblem] = []

    def add(key: list[str | int], message: str) -> None:
        problems.append(ConfigProblem(_format_path([*path, *key]), message))

    if webhook.secret is None:
        if webhook.enabled:
            add(["secret"], "required when channels.webhook.enabled is true")
    elif len(webhook.secret.get_secret_value()) < MIN_WEBHOOK_SECRET_LENGTH:
        add(["secret"], f"must be at least {MIN_WEBHOOK_SECRET_LENGTH} characters")
    if webhook.agent_id not in config.agents.entries:
        add(["agentId"], f"unknown agent {json.dumps(webhook.agent_id)}")
    if webhook.path == "/ws":
        add(["path"], "collides with the WebSocket endpoint /ws")
    elif config.hooks.enabled and webhook.path == f"{config.hooks.path}/agent":
        add(["path"], "collides with the HTTP hooks endpoint (hooks.path + /agent)")
    seen: set[str] = set()
    for i, sender in enumerate(webhook.allow_from):
        if sender in seen:
            add(["allowFrom", i], f"duplicate sender id {json.dumps(sender)}")
        seen.add(sender)
    return problems
