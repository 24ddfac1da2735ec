"""Every problem a config can have: pydantic's per-key ones (:func:`problems_from_pydantic`), translated into key
paths and messages that never quote the input, and the rules that span keys (:func:`cross_checks`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from clawstack.gateway.config.models import ModelsConfig, ModelSelection
from clawstack.gateway.config.openclaw import UNSUPPORTED_MESSAGE, unsupported
from clawstack.gateway.config.roster import MAIN_AGENT_ID
from clawstack.gateway.config.sections import MIN_WEBHOOK_SECRET_LENGTH
from clawstack.gateway.config.source import format_path
from clawstack.gateway.config.values import split_model_ref
from clawstack.gateway.errors import ConfigProblem

if TYPE_CHECKING:
    from clawstack.gateway.config.document import GatewayConfig

__all__ = ["cross_checks", "problems_from_pydantic"]

KeyPath = list[str | int]

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


def problems_from_pydantic(errors: list[Any]) -> list[ConfigProblem]:
    """One problem per error of ``ValidationError.errors(include_url=False, include_input=False)``."""
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
    if kind == "extra_forbidden" and unsupported(tuple(loc)):
        message = UNSUPPORTED_MESSAGE
    elif kind in _TYPE_MESSAGES:
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
    return ConfigProblem(format_path(loc), message)


class _Problems(list[ConfigProblem]):
    def add(self, path: KeyPath | tuple[str | int, ...], message: str) -> None:
        self.append(ConfigProblem(format_path(path), message))


def cross_checks(config: GatewayConfig) -> list[ConfigProblem]:
    """The problems no single key shows, in a fixed order: models, agents, plugins, hooks, auth, operators, channels."""
    problems = _Problems()
    _model_checks(config.models, problems)

    def check_ref(path: KeyPath, ref: str) -> None:
        provider_id, model_id = split_model_ref(ref)
        provider = config.models.providers.get(provider_id)
        if provider is None:
            problems.add(path, f"unknown provider {json.dumps(provider_id)}")
        elif all(model.id != model_id for model in provider.models):
            problems.add(path, f"provider {json.dumps(provider_id)} has no model {json.dumps(model_id)}")

    def check_selection(path: KeyPath, selection: ModelSelection) -> None:
        check_ref([*path, "primary"], selection.primary)
        for i, ref in enumerate(selection.fallbacks):
            check_ref([*path, "fallbacks", i], ref)

    check_selection(["agents", "defaults", "model"], config.agents.defaults.model)
    for _, entry, path in config.agents.roster():
        if entry.model is not None:
            check_selection([*path, "model"], entry.model)
    _agent_checks(config, problems)
    for plugin_id, plugin in config.plugins.entries.items():
        for i, ref in enumerate(plugin.subagent.allowed_models):
            if ref != "*":
                check_ref(["plugins", "entries", plugin_id, "subagent", "allowedModels", i], ref)

    if config.hooks.enabled and config.hooks.token is None:
        problems.add(["hooks", "token"], "required when hooks.enabled is true")
    if config.hooks.enabled and config.cron.max_concurrent < 2:
        problems.add(
            ["cron", "maxConcurrent"], "must be at least 2 when hooks.enabled is true (one slot is kept for HTTP hooks)"
        )
    auth = config.gateway.auth
    other = "password" if auth.mode == "token" else "token"
    if getattr(auth, auth.mode) is None:
        problems.add(["gateway", "auth", auth.mode], f"required when gateway.auth.mode is {json.dumps(auth.mode)}")
    if getattr(auth, other) is not None:
        problems.add(["gateway", "auth", other], f"only used when gateway.auth.mode is {json.dumps(other)}")
    _operator_checks(config, problems)
    _channel_checks(config, problems)
    return problems


def _model_checks(models: ModelsConfig, problems: _Problems) -> None:
    for provider_id, provider in models.providers.items():
        seen: set[str] = set()
        for i, model in enumerate(provider.models):
            if model.id in seen:
                problems.add(
                    ["models", "providers", provider_id, "models", i, "id"],
                    f"duplicate model id {json.dumps(model.id)}",
                )
            seen.add(model.id)


def _agent_checks(config: GatewayConfig, problems: _Problems) -> None:
    agents = config.agents
    if agents.entries is not None and agents.list_ is not None:
        problems.add(["agents", "list"], "give the agents as agents.entries or as agents.list, not both")
        return
    roster = agents.roster()
    first_path: dict[str, tuple[str | int, ...]] = {}
    for agent_id, _, path in roster:
        if agent_id in first_path:
            problems.add(
                [*path, "id"], f"duplicate agent id {json.dumps(agent_id)} (also {format_path(first_path[agent_id])})"
            )
        else:
            first_path[agent_id] = path
    marked = [path for _, entry, path in roster if entry.default]
    if agents.ownership == "explicit":
        for path in marked:
            problems.add([*path, "default"], 'cannot be combined with agents.ownership "explicit"')
    else:
        for path in marked[1:]:
            problems.add([*path, "default"], f"only one agent may be marked default (also {format_path(marked[0])})")
        if len(roster) > 1 and not marked:
            problems.add(
                ["agents", "ownership"],
                'several agents need agents.ownership "explicit" or one agent marked default: true',
            )
    known = set(first_path) or {MAIN_AGENT_ID}

    def check_agent(path: KeyPath, agent_id: str) -> None:
        if agent_id != "*" and agent_id not in known:
            problems.add(path, f"unknown agent {json.dumps(agent_id)}")

    defaults = agents.defaults
    if defaults.system_agent is not None:
        check_agent(["agents", "defaults", "systemAgent", "agentId"], defaults.system_agent.agent_id)
    for i, agent_id in enumerate(defaults.subagents.allow_agents or ()):
        check_agent(["agents", "defaults", "subagents", "allowAgents", i], agent_id)
    for _, entry, path in roster:
        for i, agent_id in enumerate(entry.subagents.allow_agents or ()):
            check_agent([*path, "subagents", "allowAgents", i], agent_id)


def _operator_checks(config: GatewayConfig, problems: _Problems) -> None:
    names: set[str] = set()
    links: dict[tuple[str, str], str] = {}
    for i, operator in enumerate(config.operators):
        if operator.name in names:
            problems.add(["operators", i, "name"], f"duplicate operator name {json.dumps(operator.name)}")
        names.add(operator.name)
        if len(set(operator.roles)) != len(operator.roles):
            problems.add(["operators", i, "roles"], "duplicate role")
        for j, link in enumerate(operator.links):
            key = (link.channel, link.id)
            if key in links:
                problems.add(
                    ["operators", i, "links", j],
                    f"channel identity link {link.channel}:{json.dumps(link.id)} already belongs to operator"
                    f" {json.dumps(links[key])}",
                )
            else:
                links[key] = operator.name


def _channel_checks(config: GatewayConfig, problems: _Problems) -> None:
    webhook = config.channels.webhook
    path: KeyPath = ["channels", "webhook"]
    if webhook.secret is None:
        if webhook.enabled:
            problems.add([*path, "secret"], "required when channels.webhook.enabled is true")
    elif len(webhook.secret.get_secret_value()) < MIN_WEBHOOK_SECRET_LENGTH:
        problems.add([*path, "secret"], f"must be at least {MIN_WEBHOOK_SECRET_LENGTH} characters")
    configured = {agent_id for agent_id, _, _ in config.agents.roster()} or {MAIN_AGENT_ID}
    if "agent_id" in webhook.model_fields_set and webhook.agent_id not in configured:
        problems.add([*path, "agentId"], f"unknown agent {json.dumps(webhook.agent_id)}")
    if webhook.path == "/ws":
        problems.add([*path, "path"], "collides with the WebSocket endpoint /ws")
    elif config.hooks.enabled and webhook.path == f"{config.hooks.path}/agent":
        problems.add([*path, "path"], "collides with the HTTP hooks endpoint (hooks.path + /agent)")
    seen: set[str] = set()
    for i, sender in enumerate(webhook.allow_from):
        if sender in seen:
            problems.add([*path, "allowFrom", i], f"duplicate sender id {json.dumps(sender)}")
        seen.add(sender)
