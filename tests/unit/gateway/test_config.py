"""The gateway config: malformed input and its exact errors, defaults, ``${ENV}``, examples, secrets."""

from __future__ import annotations

import copy
import json
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import clawstack.gateway
from clawstack.gateway import errors as gateway_errors
from clawstack.gateway.config import (
    GATEWAY_HOME_ENV,
    IGNORED_KEY_REASONS,
    IGNORED_KEYS,
    TOOL_GROUPS,
    GatewayConfig,
    default_state_dir,
    expand_tool_names,
    gateway_home,
    load_config,
    parse_config,
    split_model_ref,
)
from clawstack.gateway.config.openclaw import DROPPED_KEYS
from clawstack.gateway.errors import (
    GATEWAY_ERROR_CODES,
    GatewayConfigError,
    GatewayConfigSyntaxError,
    GatewayConfigUnreadableError,
)

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT.parent / "shared" / "reference" / "openclaw-gateway-protocol.md"

BASE: dict[str, Any] = {
    "gateway": {"auth": {"mode": "token", "token": "gateway-token"}},
    "models": {
        "providers": {
            "fake": {"baseUrl": "http://127.0.0.1:18089/v1", "models": [{"id": "scripted"}, {"id": "small"}]},
        }
    },
    "agents": {"defaults": {"model": {"primary": "fake/scripted"}}},
}


def _set(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at ``dotted`` (``a.b.0.c``; ``value`` ``...`` deletes the key)."""
    doc = copy.deepcopy(doc)
    *parents, last = dotted.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is ...:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


STATE = Path("/srv/claw-state")


def _parse(doc: dict[str, Any] | str, environ: dict[str, str] | None = None, base_dir: Path = ROOT) -> GatewayConfig:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return parse_config(text, base_dir=base_dir, environ={} if environ is None else environ, state_dir=STATE)


def _error(doc: dict[str, Any] | str, environ: dict[str, str] | None = None) -> GatewayConfigError:
    with pytest.raises(GatewayConfigError) as info:
        _parse(doc, environ)
    return info.value


# --- malformed configs and their exact errors -----------------------------------------------------------------------

MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-top-level", _set(BASE, "nonsense", 1), "nonsense: unknown key"),
    (
        "unknown-depth-4",
        _set(BASE, "agents.defaults.subagents.maxConcurrnt", 2),
        "agents.defaults.subagents.maxConcurrnt: unknown key",
    ),
    (
        "unknown-in-list-item",
        _set(BASE, "models.providers.fake.models.0.contextWindw", 1),
        "models.providers.fake.models[0].contextWindw: unknown key",
    ),
    (
        "unknown-in-plugin-subagent",
        _set(BASE, "plugins.entries.p1.subagent.allowModels", []),
        "plugins.entries.p1.subagent.allowModels: unknown key",
    ),
    ("snake-case-key", _set(BASE, "agents.defaults.max_concurrent", 2), "agents.defaults.max_concurrent: unknown key"),
    (
        "unknown-under-ignored-parent",
        _set(BASE, "gateway.tailscal", {"mode": "off"}),
        "gateway.tailscal: unknown key",
    ),
    (
        "subagents-zero",
        _set(BASE, "agents.defaults.subagents.maxConcurrent", 0),
        "agents.defaults.subagents.maxConcurrent: must be at least 1",
    ),
    (
        "int-as-string",
        _set(BASE, "agents.defaults.subagents.maxConcurrent", "8"),
        "agents.defaults.subagents.maxConcurrent: must be an integer",
    ),
    (
        "int-as-bool",
        _set(BASE, "agents.defaults.maxConcurrent", True),
        "agents.defaults.maxConcurrent: must be an integer",
    ),
    (
        "int-as-float",
        _set(BASE, "agents.defaults.timeoutSeconds", 1.5),
        "agents.defaults.timeoutSeconds: must be an integer",
    ),
    ("port-too-high", _set(BASE, "gateway.port", 70000), "gateway.port: must be at most 65535"),
    ("port-negative", _set(BASE, "gateway.port", -1), "gateway.port: must be at least 0"),
    ("bind-unknown", _set(BASE, "gateway.bind", "public"), 'gateway.bind: must be "loopback" or "lan"'),
    ("gateway-mode", _set(BASE, "gateway.mode", "remote"), 'gateway.mode: must be "local"'),
    ("auth-mode", _set(BASE, "gateway.auth.mode", "none"), 'gateway.auth.mode: must be "token" or "password"'),
    (
        "api-unknown",
        _set(BASE, "models.providers.fake.api", "anthropic-messages"),
        'models.providers.fake.api: must be "openai-completions"',
    ),
    (
        "base-url-scheme",
        _set(BASE, "models.providers.fake.baseUrl", "ftp://127.0.0.1/v1"),
        "models.providers.fake.baseUrl: must be an http or https URL without credentials, query or fragment",
    ),
    (
        "base-url-credentials",
        _set(BASE, "models.providers.fake.baseUrl", "http://user:pw@127.0.0.1/v1"),
        "models.providers.fake.baseUrl: must be an http or https URL without credentials, query or fragment",
    ),
    (
        "base-url-bad-port",
        _set(BASE, "models.providers.fake.baseUrl", "http://127.0.0.1:99999/v1"),
        "models.providers.fake.baseUrl: must be an http or https URL without credentials, query or fragment",
    ),
    ("api-key-type", _set(BASE, "models.providers.fake.apiKey", 42), "models.providers.fake.apiKey: must be a string"),
    ("models-type", _set(BASE, "models", []), "models: must be an object"),
    ("providers-empty", _set(BASE, "models.providers", {}), "models.providers: must have at least 1 entry"),
    (
        "provider-models-empty",
        _set(BASE, "models.providers.fake.models", []),
        "models.providers.fake.models: must have at least 1 entry",
    ),
    (
        "provider-id",
        _set(BASE, "models.providers.Fake", BASE["models"]["providers"]["fake"]),
        "models.providers.Fake: not a valid provider id (lower-case letters, digits, '_' and '-')",
    ),
    (
        "model-id-duplicate",
        _set(BASE, "models.providers.fake.models.1.id", "scripted"),
        'models.providers.fake.models[1].id: duplicate model id "scripted"',
    ),
    (
        "model-input",
        _set(BASE, "models.providers.fake.models.0.input", ["audio"]),
        'models.providers.fake.models[0].input[0]: must be "text" or "image"',
    ),
    (
        "model-cost-negative",
        _set(BASE, "models.providers.fake.models.0.cost", {"input": -1}),
        "models.providers.fake.models[0].cost.input: must be at least 0",
    ),
    ("gateway-missing", _set(BASE, "gateway", ...), "gateway: required"),
    ("defaults-model-missing", _set(BASE, "agents.defaults.model", ...), "agents.defaults.model: required"),
    (
        "ref-shape",
        _set(BASE, "agents.defaults.model.primary", "scripted"),
        'agents.defaults.model.primary: must be a model reference "provider/model"',
    ),
    (
        "ref-unknown-provider",
        _set(BASE, "agents.defaults.model.primary", "openai/gpt"),
        'agents.defaults.model.primary: unknown provider "openai"',
    ),
    (
        "ref-unknown-model",
        _set(BASE, "agents.defaults.model.fallbacks", ["fake/small", "fake/missing"]),
        'agents.defaults.model.fallbacks[1]: provider "fake" has no model "missing"',
    ),
    (
        "agent-ref",
        _set(BASE, "agents.entries.Helper", {"model": {"primary": "fake/nope"}}),
        'agents.entries.helper.model.primary: provider "fake" has no model "nope"',
    ),
    (
        "agent-id",
        _set(BASE, "agents.entries.bad id", {}),
        """agents.entries["bad id"]: agent id character 3 (U+0020) is not allowed: use letters, digits, '_' and '-'""",
    ),
    (
        "agent-id-collision",
        _set(_set(BASE, "agents.entries.Main", {}), "agents.entries.main", {}),
        'agents.entries: agent ids "Main" and "main" both normalise to "main"',
    ),
    (
        "tool-group-unknown",
        _set(BASE, "tools.allow", ["read", "group:bogus"]),
        'tools.allow[1]: unknown tool group "group:bogus" (known: group:automation, group:fs, group:messaging,'
        " group:runtime, group:sessions, group:web)",
    ),
    (
        "agent-tool-group-unknown",
        _set(BASE, "agents.entries.main", {"tools": {"deny": ["group:memory"]}}),
        'agents.entries.main.tools.deny[0]: unknown tool group "group:memory" (known: group:automation, group:fs,'
        " group:messaging, group:runtime, group:sessions, group:web)",
    ),
    ("tool-name", _set(BASE, "tools.deny", ["rm -rf"]), "tools.deny[0]: not a valid tool name"),
    ("tools-type", _set(BASE, "tools.allow", "read"), "tools.allow: must be a list"),
    (
        "allowed-model-unknown",
        _set(BASE, "plugins.entries.p1.subagent.allowedModels", ["*", "fake/missing"]),
        'plugins.entries.p1.subagent.allowedModels[1]: provider "fake" has no model "missing"',
    ),
    (
        "allowed-model-shape",
        _set(BASE, "plugins.entries.p1.subagent.allowedModels", ["scripted"]),
        'plugins.entries.p1.subagent.allowedModels[0]: must be a model reference "provider/model" or "*"',
    ),
    (
        "plugin-trust",
        _set(BASE, "plugins.entries.p1.trust", "root"),
        'plugins.entries.p1.trust: must be "bundled", "trusted" or "installed"',
    ),
    (
        "plugin-enabled",
        _set(BASE, "plugins.entries.p1.enabled", "yes"),
        "plugins.entries.p1.enabled: must be true or false",
    ),
    (
        "plugin-id",
        _set(BASE, "plugins.entries.My Plugin", {}),
        """plugins.entries["My Plugin"]: not a valid plugin id (lower-case letters, digits, '.', '_' and '-')""",
    ),
    ("plugin-load-paths", _set(BASE, "plugins.load.paths", [""]), "plugins.load.paths[0]: must not be empty"),
    (
        "auth-token-missing",
        _set(BASE, "gateway.auth", {"mode": "token"}),
        'gateway.auth.token: required when gateway.auth.mode is "token"',
    ),
    (
        "auth-password-missing",
        _set(BASE, "gateway.auth", {"mode": "password", "token": "gateway-token"}),
        'gateway.auth.password: required when gateway.auth.mode is "password"; gateway.auth.token: only used when'
        ' gateway.auth.mode is "token"',
    ),
    ("auth-missing", _set(BASE, "gateway.auth", ...), "gateway.auth: required"),
    ("hooks-token-missing", _set(BASE, "hooks.enabled", True), "hooks.token: required when hooks.enabled is true"),
    (
        "hooks-path",
        _set(BASE, "hooks.path", "hooks/"),
        'hooks.path: must be an absolute URL path such as "/hooks" (no trailing "/")',
    ),
    ("cron-zero", _set(BASE, "cron.maxConcurrent", 0), "cron.maxConcurrent: must be at least 1"),
    (
        "cron-no-reserved-slot",
        _set(_set(_set(BASE, "hooks.enabled", True), "hooks.token", "hook-token"), "cron.maxConcurrent", 1),
        "cron.maxConcurrent: must be at least 2 when hooks.enabled is true (one slot is kept for HTTP hooks)",
    ),
    ("operators-type", _set(BASE, "operators", {"name": "a"}), "operators: must be a list"),
    (
        "operator-role",
        _set(BASE, "operators", [{"name": "a", "roles": ["admin"]}]),
        'operators[0].roles[0]: must be "operator.admin", "operator.read" or "operator.write"',
    ),
    (
        "operator-no-roles",
        _set(BASE, "operators", [{"name": "a", "roles": []}]),
        "operators[0].roles: must have at least 1 entry",
    ),
    (
        "operator-duplicate-name",
        _set(BASE, "operators", [{"name": "a", "roles": ["operator.read"]}, {"name": "a", "roles": ["operator.read"]}]),
        'operators[1].name: duplicate operator name "a"',
    ),
    (
        "operator-duplicate-role",
        _set(BASE, "operators", [{"name": "a", "roles": ["operator.read", "operator.read"]}]),
        "operators[0].roles: duplicate role",
    ),
    (
        "link-channel",
        _set(
            BASE,
            "operators",
            [{"name": "a", "roles": ["operator.read"], "links": [{"channel": "Web Hook", "id": "a"}]}],
        ),
        "operators[0].links[0].channel: not a valid channel name (lower-case letters, digits and '-')",
    ),
    (
        "link-duplicate",
        _set(
            BASE,
            "operators",
            [
                {"name": "alice", "roles": ["operator.admin"], "links": [{"channel": "webhook", "id": "u1"}]},
                {"name": "bob", "roles": ["operator.read"], "links": [{"channel": "webhook", "id": "u1"}]},
            ],
        ),
        'operators[1].links[0]: channel identity link webhook:"u1" already belongs to operator "alice"',
    ),
    (
        "agents-both-forms",
        _set(_set(BASE, "agents.entries.a", {}), "agents.list", [{"id": "b"}]),
        "agents.list: give the agents as agents.entries or as agents.list, not both",
    ),
    ("list-item-id-missing", _set(BASE, "agents.list", [{"name": "x"}]), "agents.list[0].id: required"),
    (
        "list-id-duplicate",
        _set(BASE, "agents.list", [{"id": "a", "default": True}, {"id": "A"}]),
        'agents.list[1].id: duplicate agent id "a" (also agents.list[0])',
    ),
    (
        "list-id-invalid",
        _set(BASE, "agents.list", [{"id": "_x"}]),
        "agents.list[0].id: an agent id must start with a letter or digit, not U+005F",
    ),
    (
        "two-defaults",
        _set(BASE, "agents.entries", {"a": {"default": True}, "b": {"default": True}}),
        "agents.entries.b.default: only one agent may be marked default (also agents.entries.a)",
    ),
    (
        "explicit-and-default",
        _set(_set(BASE, "agents.ownership", "explicit"), "agents.entries", {"a": {"default": True}, "b": {}}),
        'agents.entries.a.default: cannot be combined with agents.ownership "explicit"',
    ),
    (
        "fleet-without-owner",
        _set(BASE, "agents.list", [{"id": "a"}, {"id": "b"}]),
        'agents.ownership: several agents need agents.ownership "explicit" or one agent marked default: true',
    ),
    ("ownership-value", _set(BASE, "agents.ownership", "legacy"), 'agents.ownership: must be "explicit"'),
    ("default-type", _set(BASE, "agents.entries.a", {"default": 1}), "agents.entries.a.default: must be true or false"),
    (
        "system-agent-unknown",
        _set(BASE, "agents.defaults.systemAgent", {"agentId": "nobody"}),
        'agents.defaults.systemAgent.agentId: unknown agent "nobody"',
    ),
    (
        "allow-agents-unknown",
        _set(BASE, "agents.entries.a.subagents", {"allowAgents": ["a", "b"]}),
        'agents.entries.a.subagents.allowAgents[1]: unknown agent "b"',
    ),
    (
        "default-allow-agents-unknown",
        _set(BASE, "agents.defaults.subagents.allowAgents", ["main", "ghost"]),
        'agents.defaults.subagents.allowAgents[1]: unknown agent "ghost"',
    ),
    (
        "allow-agents-bad-id",
        _set(BASE, "agents.entries.a.subagents", {"allowAgents": ["no way"]}),
        'agents.entries.a.subagents.allowAgents[0]: must be "*" or an agent id: agent id character 2 (U+0020) is not'
        " allowed: use letters, digits, '_' and '-'",
    ),
    (
        "agent-model-string",
        _set(BASE, "agents.entries.a.model", "fake/nope"),
        'agents.entries.a.model.primary: provider "fake" has no model "nope"',
    ),
    (
        "agent-model-string-shape",
        _set(BASE, "agents.list", [{"id": "a", "model": "scripted"}]),
        'agents.list[0].model.primary: must be a model reference "provider/model"',
    ),
    ("defaults-model-type", _set(BASE, "agents.defaults.model", 3), "agents.defaults.model: must be an object"),
    (
        "bootstrap-max-zero",
        _set(BASE, "agents.entries.a.bootstrapMaxChars", 0),
        "agents.entries.a.bootstrapMaxChars: must be at least 1",
    ),
    (
        "skip-optional-name",
        _set(BASE, "agents.defaults.skipOptionalBootstrapFiles", ["AGENTS.md"]),
        'agents.defaults.skipOptionalBootstrapFiles[0]: must be "SOUL.md", "USER.md", "IDENTITY.md" or "HEARTBEAT.md"',
    ),
    (
        "identity-unknown",
        _set(BASE, "agents.entries.a.identity", {"nickname": "x"}),
        "agents.entries.a.identity.nickname: unknown key",
    ),
    (
        "unsupported-agent-sandbox",
        _set(BASE, "agents.entries.a.sandbox", {"mode": "off"}),
        "agents.entries.a.sandbox: not supported by claw gateway",
    ),
    (
        "unsupported-list-cwd",
        _set(BASE, "agents.list", [{"id": "a", "cwd": "/srv"}]),
        "agents.list[0].cwd: not supported by claw gateway",
    ),
    (
        "unsupported-defaults-heartbeat",
        _set(BASE, "agents.defaults.heartbeat", {"every": "30m"}),
        "agents.defaults.heartbeat: not supported by claw gateway",
    ),
    (
        "unsupported-defaults-subagents-model",
        _set(BASE, "agents.defaults.subagents.requireAgentId", True),
        "agents.defaults.subagents.requireAgentId: not supported by claw gateway",
    ),
    (
        "unsupported-entry-subagents-model",
        _set(BASE, "agents.entries.a.subagents", {"model": "fake/small"}),
        "agents.entries.a.subagents.model: not supported by claw gateway",
    ),
    ("unsupported-top-level", _set(BASE, "skills", {}), "skills: not supported by claw gateway"),
    ("unsupported-logging-audit", _set(BASE, "logging", {"audit": {}}), "logging.audit: not supported by claw gateway"),
    (
        "unsupported-logging-redaction",
        _set(BASE, "logging", {"level": "info", "redactPatterns": ["sk-.*"]}),
        "logging.redactPatterns: not supported by claw gateway",
    ),
    ("typo-is-unknown", _set(BASE, "agents.entries.a.sandbx", {}), "agents.entries.a.sandbx: unknown key"),
    (
        "webhook-agent-unknown",
        _set(BASE, "channels.webhook.agentId", "ops"),
        'channels.webhook.agentId: unknown agent "ops"',
    ),
    (
        "several-problems",
        _set(_set(BASE, "gateway.port", "x"), "cron.extra", 1),
        "cron.extra: unknown key; gateway.port: must be an integer",
    ),
]


@pytest.mark.parametrize(("doc", "message"), [(d, m) for _, d, m in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_malformed_config_gets_its_exact_error(doc: dict[str, Any], message: str) -> None:
    error = _error(doc)
    assert error.message == f"gateway config: {message}"
    assert str(error) == error.message
    assert error.code == "gateway_config_invalid"
    assert "; ".join(str(p) for p in error.problems) == message


SYNTAX: list[tuple[str, str, str, int | None]] = [
    ("garbage-token", "{\n  gateway: {\n    port: 1 2,\n  },\n}", "JSON5 syntax error at line 3, column 13", 3),
    ("unterminated-string", '{\n  models: {apiKey: "sk-live-abc\n}', "JSON5 syntax error at line 2, column 32", 2),
    ("unclosed-object", "{\n  agents: {\n", "JSON5 syntax error at line 3, column 1", 3),
    ("empty", "  \n", "JSON5 syntax error (empty document)", None),
    ("top-level-list", "[1, 2]", "the document must be a JSON5 object", None),
    ("top-level-string", '"gateway"', "the document must be a JSON5 object", None),
    ("duplicate-key-top", "{gateway: {}, gateway: {}}", 'duplicate key "gateway"', None),
    (
        "duplicate-key-nested",
        '{gateway: {auth: {token: "a", token: "b"}}}',
        'gateway.auth: duplicate key "token"',
        None,
    ),
    ("duplicate-key-quoted", '{models: {providers: {"x": {}, x: {}}}}', 'models.providers: duplicate key "x"', None),
    ("nan", "{gateway: {port: NaN}}", "gateway.port: NaN and Infinity are not accepted", None),
    ("infinity", "{cron: {maxConcurrent: -Infinity}}", "cron.maxConcurrent: NaN and Infinity are not accepted", None),
    ("lone-surrogate", '{gateway: {mode: "x\\ud800"}}', "gateway.mode: a lone UTF-16 surrogate is not text", None),
    ("lone-surrogate-key", '{gateway: {"\\udc00": 1}}', "gateway: a lone UTF-16 surrogate is not text", None),
]


@pytest.mark.parametrize(
    ("text", "message", "line"), [(t, m, ln) for _, t, m, ln in SYNTAX], ids=[i for i, *_ in SYNTAX]
)
def test_syntax_error_gets_position_only(text: str, message: str, line: int | None) -> None:
    with pytest.raises(GatewayConfigSyntaxError) as info:
        _parse(text)
    assert info.value.message == f"gateway config: {message}"
    assert info.value.code == "gateway_config_syntax"
    assert info.value.line == line
    assert "sk-live" not in info.value.message


def test_syntax_error_does_not_chain_the_parsers_quoting_error() -> None:
    with pytest.raises(GatewayConfigSyntaxError) as info:
        _parse('{apiKey: "hunter2-secret\n}')
    assert info.value.__cause__ is None
    assert info.value.__context__ is None


def test_invalid_utf8_is_unreadable() -> None:
    with pytest.raises(GatewayConfigUnreadableError) as info:
        parse_config(b'{gateway: "\xff"}', base_dir=ROOT, environ={})
    assert info.value.message == "gateway config: file is not valid UTF-8 (byte 11)"
    assert info.value.code == "gateway_config_unreadable"


def test_missing_file_is_unreadable(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json5"
    with pytest.raises(GatewayConfigUnreadableError) as info:
        load_config(missing, environ={})
    assert info.value.message == f"gateway config: cannot read {missing}: No such file or directory"


# --- ${ENV} ---------------------------------------------------------------------------------------------------------


def test_env_references_resolve_whole_string_values() -> None:
    doc = _set(BASE, "models.providers.fake.apiKey", "${FAKE_KEY}")
    doc = _set(doc, "gateway.auth.token", "${GW_TOKEN}")
    doc = _set(doc, "hooks", {"enabled": True, "token": "${HOOK_TOKEN}"})
    doc = _set(doc, "models.providers.fake.baseUrl", "${FAKE_URL}")
    doc = _set(doc, "agents.entries.main", {"instructions": "$${NOT_RESOLVED}"})
    env = {"FAKE_KEY": "k1", "GW_TOKEN": "t1", "HOOK_TOKEN": "h1", "FAKE_URL": "http://127.0.0.1:9/v1/"}
    config = _parse(doc, env)
    provider = config.models.providers["fake"]
    assert provider.api_key is not None
    assert provider.api_key.get_secret_value() == "k1"
    assert provider.base_url == "http://127.0.0.1:9/v1"
    assert config.gateway.auth.secret.get_secret_value() == "t1"
    assert config.hooks.token is not None
    assert config.hooks.token.get_secret_value() == "h1"
    assert config.agent("main").instructions == "${NOT_RESOLVED}"


def test_env_reference_only_as_whole_value() -> None:
    doc = _set(BASE, "agents.entries.main", {"instructions": "token is ${GW_TOKEN} here"})
    config = _parse(doc, {"GW_TOKEN": "t1"})
    assert config.agent("main").instructions == "token is ${GW_TOKEN} here"


def test_missing_and_empty_env_variables_are_named() -> None:
    doc = _set(BASE, "models.providers.fake.apiKey", "${FAKE_KEY}")
    doc = _set(doc, "gateway.auth.token", "${GW_TOKEN}")
    error = _error(doc, {"GW_TOKEN": ""})
    assert error.message == (
        "gateway config: gateway.auth.token: environment variable GW_TOKEN is empty; "
        "models.providers.fake.apiKey: environment variable FAKE_KEY is not set"
    )


def test_env_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAW_TEST_GW_TOKEN", "from-process")
    text = json.dumps(_set(BASE, "gateway.auth.token", "${CLAW_TEST_GW_TOKEN}"))
    config = parse_config(text, base_dir=ROOT)
    assert config.gateway.auth.secret.get_secret_value() == "from-process"


# --- defaults and shape ---------------------------------------------------------------------------------------------


def test_defaults_are_filled_in() -> None:
    config = _parse(BASE)
    defaults = config.agents.defaults
    assert (defaults.max_concurrent, defaults.timeout_seconds, defaults.workspace) == (4, 600, None)
    sub = defaults.subagents
    assert (sub.max_concurrent, sub.max_spawn_depth, sub.max_children_per_agent) == (8, 1, 5)
    assert (sub.run_timeout_seconds, sub.archive_after_minutes) == (600, 60)
    assert defaults.model.fallbacks == ()
    assert (defaults.bootstrap_max_chars, defaults.bootstrap_total_max_chars) == (20_000, 60_000)
    assert (defaults.skip_bootstrap, defaults.skip_optional_bootstrap_files, defaults.system_agent) == (False, (), None)
    assert (config.agents.entries, config.agents.list_, config.agents.ownership) == (None, None, None)
    assert (config.agent_ids, config.default_agent_id) == (("main",), "main")
    assert config.agent_model("main") == defaults.model
    main = config.agent("main")
    assert (main.is_default, main.workspace, main.subagents.allow_agents) == (True, STATE / "workspace", ("main",))
    assert config.channels.webhook.agent_id == "main"
    assert config.tools.allow is None
    assert config.tools.deny == ()
    assert config.plugins.load.paths == ()
    assert config.plugins.entries == {}
    assert (config.hooks.enabled, config.hooks.token, config.hooks.path) == (False, None, "/hooks")
    assert config.cron.max_concurrent == 2
    assert (config.gateway.mode, config.gateway.port, config.gateway.bind) == ("local", 18789, "loopback")
    assert config.gateway.bind_host == "127.0.0.1"
    assert config.operators == ()
    provider = config.models.providers["fake"]
    assert (provider.api, provider.api_key) == ("openai-completions", None)
    model = provider.models[0]
    assert (model.reasoning, model.input, model.context_window, model.max_tokens) == (False, ("text",), None, None)
    assert config.ignored_keys == ()


def test_plugin_entry_defaults() -> None:
    config = _parse(_set(BASE, "plugins.entries.p1", {}))
    entry = config.plugins.entries["p1"]
    assert (entry.enabled, entry.trust, entry.config) == (True, "installed", {})
    assert (entry.subagent.allow_model_override, entry.subagent.allowed_models) == (False, ())


def test_agent_ids_are_normalised() -> None:
    config = _parse(_set(BASE, "agents.entries", {"Main": {"default": True}, "Researcher": {"instructions": "r"}}))
    assert config.agent_ids == ("main", "researcher")
    assert config.agent("RESEARCHER").instructions == "r"
    with pytest.raises(KeyError):
        config.agent("nobody")


def test_relative_paths_resolve_against_base_dir(tmp_path: Path) -> None:
    doc = _set(BASE, "agents.defaults.workspace", "work/../ws")
    doc = _set(doc, "plugins.load.paths", ["plugins", "/abs/plugins"])
    config = _parse(doc, base_dir=tmp_path)
    assert config.agents.defaults.workspace == tmp_path / "ws"
    assert config.plugins.load.paths == (tmp_path / "plugins", Path("/abs/plugins"))


def test_resolve_model() -> None:
    config = _parse(BASE)
    provider, model = config.resolve_model("fake/small")
    assert (provider.base_url, model.id) == ("http://127.0.0.1:18089/v1", "small")
    with pytest.raises(KeyError):
        config.resolve_model("fake/none")
    assert split_model_ref("openrouter/vendor/model") == ("openrouter", "vendor/model")


def test_config_is_frozen_and_secrets_hidden() -> None:
    config = _parse(_set(BASE, "models.providers.fake.apiKey", "sk-very-secret"))
    with pytest.raises(ValidationError):
        config.cron.max_concurrent = 3
    assert "sk-very-secret" not in repr(config)
    assert "gateway-token" not in repr(config)
    assert "sk-very-secret" not in config.model_dump_json()


def test_tool_groups_expand() -> None:
    assert expand_tool_names(["group:fs", "exec"]) == {"read", "write", "edit", "apply_patch", "exec"}
    assert set(TOOL_GROUPS) == {
        "group:fs",
        "group:runtime",
        "group:web",
        "group:sessions",
        "group:messaging",
        "group:automation",
    }


def test_ignored_openclaw_keys_are_accepted_and_listed() -> None:
    doc = _set(BASE, "update", {"checkOnStart": False})
    doc = _set(doc, "logging", {"file": "/tmp/x.log", "anything": [1, 2]})
    doc = _set(doc, "gateway.tailscale", {"mode": "off"})
    doc = _set(doc, "models.catalogRefresh", {"enabled": False})
    assert _parse(doc).ignored_keys == ("update", "logging", "gateway.tailscale", "models.catalogRefresh")


def test_a_mapping_is_accepted_as_input() -> None:
    config = parse_config(copy.deepcopy(BASE), base_dir=ROOT, environ={})
    assert config.gateway.auth.mode == "token"


# --- examples -------------------------------------------------------------------------------------------------------


def test_example_file_loads() -> None:
    example = ROOT / "examples" / "gateway"
    config = load_config(example / "gateway.json5", environ={"CLAW_GATEWAY_TOKEN": "t"}, state_dir=STATE)
    assert config.models.providers["fake"].base_url == "http://127.0.0.1:18089/v1"
    assert (config.agent_ids, config.default_agent_id) == (("main", "researcher"), "main")
    main, researcher = config.agent("main"), config.agent("researcher")
    assert (main.workspace, researcher.workspace) == (example / "workspace", example / "workspace-researcher")
    assert (main.model.chain, researcher.model.chain) == (
        ("fake/scripted", "fake/scripted-small"),
        ("fake/scripted-small",),
    )
    assert main.subagents.allows("researcher")
    assert not researcher.subagents.allows("main")
    assert researcher.identity is not None
    assert researcher.identity.name == "Ada"
    assert config.agents.defaults.workspace == example / "workspace"
    assert config.plugins.load.paths == (ROOT / "examples" / "plugins",)
    assert config.operators[0].links[0].channel == "webhook"


def _reference_offline_config() -> str:
    """The offline config from the reference doc, its backquoted pieces joined into one object, placeholders filled."""
    text = REFERENCE.read_text()
    section = text[text.index("A config that works offline:") : text.index("- Start:")]
    pieces = [re.sub(r"\s+", " ", piece) for piece in re.findall(r"`([^`]*)`", section)]
    document = "{" + ", ".join(pieces) + "}"
    fills = [
        (' (or mode "password")', ""),
        ("port: P,", "port: 18789,"),
        ('"…"', '"filled-in"'),
        ("PORT", "18089"),
        ("{id, name,", '{id: "scripted", name: "Scripted",'),
        ("contextWindow, maxTokens}", "contextWindow: 128000, maxTokens: 8192}"),
        ("fake/<id>", "fake/scripted"),
    ]
    for placeholder, value in fills:
        assert placeholder in document, placeholder
        document = document.replace(placeholder, value)
    return document


@pytest.mark.skipif(not REFERENCE.exists(), reason="the shared reference doc is not next to this checkout")
def test_reference_offline_config_loads_unchanged(tmp_path: Path) -> None:
    config = parse_config(_reference_offline_config(), base_dir=tmp_path, environ={}, state_dir=tmp_path / "state")
    model = "models.providers.fake.models[0]"
    assert config.ignored_keys == (
        "update",
        "logging",
        "telemetry",
        "discovery",
        "gateway.tailscale",
        "models.mode",
        "models.catalogRefresh",
        f"{model}.reasoning",
        f"{model}.input",
        f"{model}.cost",
    )
    assert config.gateway.auth.secret.get_secret_value() == "filled-in"
    assert config.agents.defaults.workspace == tmp_path / "filled-in"
    assert config.models.providers["fake"].models[0].cost.cache_write == 0


# --- the roster: OpenClaw's agents --------------------------------------------------------------------------------

FLEET: list[dict[str, Any]] = [
    {"id": "alpha", "default": True, "name": "Alpha", "subagents": {"allowAgents": ["beta"]}},
    {"id": "beta", "model": "fake/small", "workspace": "ws-beta", "identity": {"name": "B", "emoji": "🦀"}},
    {"id": "gamma", "model": {"primary": "fake/small", "fallbacks": ["fake/scripted"]}, "bootstrapMaxChars": 500},
]


def _keyed(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {item["id"]: {k: v for k, v in item.items() if k != "id"} for item in items}


@pytest.mark.parametrize("form", ["list", "entries"])
def test_a_fleet_resolves_the_same_in_both_forms(form: str, tmp_path: Path) -> None:
    roster = FLEET if form == "list" else _keyed(FLEET)
    doc = _set(_set(BASE, f"agents.{form}", roster), "agents.defaults.workspace", "ws")
    doc = _set(doc, "agents.defaults.model.fallbacks", ["fake/small"])
    config = _parse(doc, base_dir=tmp_path)
    assert (config.agent_ids, config.default_agent_id) == (("alpha", "beta", "gamma"), "alpha")
    alpha, beta, gamma = (config.agent(i) for i in config.agent_ids)
    # The marked agent owns agents.defaults.workspace; the others without their own get a directory under it.
    assert (alpha.workspace, beta.workspace, gamma.workspace) == (
        tmp_path / "ws",
        tmp_path / "ws-beta",
        tmp_path / "ws" / "gamma",
    )
    # An agent's own model replaces the default selection whole: a string or {primary} has no fallbacks.
    assert alpha.model.chain == ("fake/scripted", "fake/small")
    assert beta.model.chain == ("fake/small",)
    assert gamma.model.chain == ("fake/small", "fake/scripted")
    assert config.agent_model("beta") == beta.model
    assert (alpha.is_default, beta.is_default, alpha.name, beta.name) == (True, False, "Alpha", None)
    assert beta.identity is not None
    assert (beta.identity.name, beta.identity.emoji) == ("B", "🦀")
    assert (alpha.bootstrap_max_chars, gamma.bootstrap_max_chars, gamma.bootstrap_total_max_chars) == (
        20_000,
        500,
        60_000,
    )
    with pytest.raises(KeyError):
        config.agent("main")  # only the configured agents exist
    assert config.channels.webhook.agent_id == "alpha"


def test_spawn_allow_lists() -> None:
    doc = _set(BASE, "agents.list", [dict(item) for item in FLEET])
    doc["agents"]["list"][2]["subagents"] = {"allowAgents": ["*"]}
    config = _parse(doc)
    alpha, beta, gamma = (config.agent(i).subagents for i in config.agent_ids)
    assert alpha.allow_agents == ("beta",)
    assert (alpha.allows("beta"), alpha.allows("BETA"), alpha.allows("alpha")) == (True, True, False)
    assert (beta.allow_agents, beta.allows("beta"), beta.allows("alpha")) == (("beta",), True, False)  # itself only
    assert gamma.allow_agents == ("*",)
    assert all(gamma.allows(agent) for agent in ("alpha", "beta", "gamma"))
    assert not gamma.allows("main")  # "*" means every configured agent, nothing else
    with_default = _parse(_set(doc, "agents.defaults.subagents.allowAgents", ["*"]))
    assert with_default.agent("beta").subagents.allow_agents == ("*",)  # the default list when the agent has none
    assert with_default.agent("alpha").subagents.allow_agents == ("beta",)  # the agent's own list wins


def test_default_agent_and_workspaces_without_a_configured_root() -> None:
    sole = _parse(_set(BASE, "agents.entries", {"ops": {}}))
    assert (sole.agent_ids, sole.default_agent_id, sole.agent("ops").workspace) == (
        ("ops",),
        "ops",
        STATE / "workspace",
    )
    marked = _parse(_set(BASE, "agents.entries", {"a": {}, "b": {"default": True}}))
    assert marked.default_agent_id == "b"
    assert (marked.agent("a").workspace, marked.agent("b").workspace) == (STATE / "workspace-a", STATE / "workspace")
    fleet = _set(_set(BASE, "agents.ownership", "explicit"), "agents.entries", {"a": {}, "b": {}})
    explicit = _parse(fleet)
    # An explicit fleet: the first agent answers when none is named; nobody owns the shared root.
    assert explicit.default_agent_id == "a"
    assert (explicit.agent("a").workspace, explicit.agent("b").workspace) == (
        STATE / "workspace-a",
        STATE / "workspace-b",
    )
    system = _parse(_set(fleet, "agents.defaults.systemAgent", {"agentId": "B"}))
    assert system.default_agent_id == "b"
    assert not system.agent("a").is_default
    assert system.agent("b").is_default
    empty = _parse(_set(BASE, "agents.list", []))
    assert empty.agent_ids == ("main",)


def test_workspaces_follow_the_state_directory(tmp_path: Path) -> None:
    config = _parse(_set(BASE, "agents.entries", {"a": {"default": True}, "b": {"workspace": "~/ws-b"}}))
    moved = config.with_state_dir(tmp_path)
    assert (moved.state_dir, moved.agent("a").workspace) == (tmp_path, tmp_path / "workspace")
    assert moved.agent("b").workspace == config.agent("b").workspace == Path("~/ws-b").expanduser()
    assert config.agent("a").workspace == STATE / "workspace"  # the original is unchanged


def test_the_state_directory_defaults_per_config_file(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path / "home")}
    home = tmp_path / "home" / ".local" / "state" / "clawstack" / "gateway"
    assert gateway_home(environ) == home
    first, second = default_state_dir(tmp_path / "a.json5", environ), default_state_dir(tmp_path / "b.json5", environ)
    assert first != second
    assert (first.parent, second.parent) == (home, home)
    assert first.name.startswith("a-")
    assert len(first.name) == len("a-") + 16
    assert default_state_dir(tmp_path / "x" / ".." / "a.json5", environ) == first  # one file, one directory
    assert default_state_dir(tmp_path / "copy" / "a.json5", environ) != first
    assert default_state_dir(tmp_path / "my config!.json5", environ).name.startswith("my-config-")
    xdg = {**environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    assert gateway_home(xdg) == tmp_path / "xdg" / "clawstack" / "gateway"
    assert gateway_home({**xdg, "XDG_STATE_HOME": "relative"}) == home  # XDG requires an absolute path
    chosen = {**xdg, GATEWAY_HOME_ENV: str(tmp_path / "claw")}
    assert default_state_dir(tmp_path / "a.json5", chosen).parent == tmp_path / "claw"
    path = tmp_path / "gateway.json5"
    path.write_text(json.dumps(BASE))
    assert load_config(path, environ=chosen).state_dir == default_state_dir(path, chosen)


def test_ignored_keys_are_named_with_reasons() -> None:
    assert set(IGNORED_KEY_REASONS) == set(IGNORED_KEYS)
    assert all(IGNORED_KEY_REASONS[key] for key in IGNORED_KEYS)
    doc = _set(BASE, "meta", {"lastTouchedVersion": "2026.9.6"})
    doc = _set(doc, "models.providers.fake.models.1.cost", {"input": 1.5})
    doc = _set(doc, "models.providers.fake.models.0.reasoning", True)
    assert _parse(doc).ignored_keys == (
        "meta",
        "models.providers.fake.models[0].reasoning",
        "models.providers.fake.models[1].cost",
    )
    # Inert keys are still validated.
    assert (
        _error(_set(BASE, "models.providers.fake.models.0.cost", {"input": -1}))
        .problems[0]
        .path.endswith(".cost.input")
    )
    assert set(DROPPED_KEYS) <= set(IGNORED_KEYS)


def test_the_docs_table_of_ignored_keys_is_the_code() -> None:
    text = (ROOT / "docs" / "gateway-config.md").read_text()
    section = text[text.index("### Accepted and ignored") : text.index("### Not supported")]
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", section, re.MULTILINE)
    documented = {key.replace("<id>", "*"): reason.replace("`", "") for key, reason in rows}
    assert documented == {key: reason.replace("`", "") for key, reason in IGNORED_KEY_REASONS.items()}


_AGENT_IDS = st.lists(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,8}", fullmatch=True), min_size=1, max_size=5, unique=True)


@settings(max_examples=40, deadline=None)
@given(ids=_AGENT_IDS, marked=st.integers(min_value=0, max_value=4), upper=st.booleans())
def test_list_and_entries_forms_always_agree(ids: list[str], marked: int, upper: bool) -> None:
    items = [
        {"id": i.upper() if upper else i, **({"default": True} if n == marked % len(ids) else {})}
        for n, i in enumerate(ids)
    ]
    by_list = _parse(_set(BASE, "agents.list", items))
    by_entries = _parse(_set(BASE, "agents.entries", _keyed(items)))
    assert by_list.agent_ids == by_entries.agent_ids == tuple(ids)
    assert by_list.default_agent_id == by_entries.default_agent_id == ids[marked % len(ids)]
    for agent_id in ids:
        assert by_list.agent(agent_id) == by_entries.agent(agent_id)
    workspaces = [by_list.agent(i).workspace for i in ids]
    assert len(set(workspaces)) == len(ids)  # no two agents share a derived workspace


# --- secrets never appear in errors ---------------------------------------------------------------------------------

_SECRET = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40).map(
    lambda s: "SECRET-" + s
)

_SECRET_FIELDS = ["models.providers.fake.apiKey", "gateway.auth.token", "hooks.token"]


def _all_text(error: BaseException) -> str:
    parts = ["".join(traceback.format_exception(error)), repr(error)]
    if isinstance(error, GatewayConfigError):
        parts += [repr(p) for p in error.problems] + [json.dumps(error.to_dict())]
    return "\n".join(parts)


def _breakages(secret: str, field: str) -> list[tuple[str | dict[str, Any], dict[str, str]]]:
    placed = _set(BASE, field, secret)
    text = json.dumps(placed)
    return [
        (_set(placed, "gateway.port", "x"), {}),  # another key is wrong
        (_set(placed, "nonsense", 1), {}),  # an unknown key
        (_set(placed, "agents.defaults.model.primary", "fake/none"), {}),  # a bad reference
        (_set(BASE, field, [secret]), {}),  # the secret under the wrong type
        (_set(BASE, field, {"value": secret}), {}),
        (_set(BASE, "gateway.port", secret), {}),  # the secret pasted into the wrong key
        (_set(BASE, "gateway.auth.mode", secret), {}),
        (_set(BASE, "gateway.auth", {"mode": "password", "token": secret}), {}),  # the unused secret
        (text[: text.index("SECRET-") + 10], {}),  # a syntax error right after the secret begins
        (text.replace(json.dumps(secret), json.dumps(secret)[:-1]), {}),  # unterminated secret
        (text.replace(json.dumps(secret), json.dumps(secret) + " x"), {}),
        (text.replace("{", "{x: NaN, ", 1), {}),
        (_set(_set(BASE, field, "${THE_SECRET}"), "gateway.bind", "x"), {"THE_SECRET": secret}),
        (_set(_set(BASE, field, "${THE_SECRET}"), "gateway.port", "${MISSING}"), {"THE_SECRET": secret}),
    ]


@settings(max_examples=60, deadline=None)
@given(secret=_SECRET, field=st.sampled_from(_SECRET_FIELDS))
def test_secrets_never_appear_in_errors(secret: str, field: str) -> None:
    for doc, environ in _breakages(secret, field):
        with pytest.raises(GatewayConfigError) as info:
            _parse(doc, environ)
        rendered = _all_text(info.value)
        assert secret not in rendered
        assert "SECRET-" not in rendered


# --- the package surface --------------------------------------------------------------------------------------------


def test_the_package_exports_the_config_api() -> None:
    for name in (
        "ConfigProblem",
        "GatewayConfig",
        "GatewayConfigError",
        "GatewayConfigSyntaxError",
        "GatewayConfigUnreadableError",
        "GatewayError",
        "load_config",
        "parse_config",
    ):
        assert name in clawstack.gateway.__all__


def test_error_tree_and_codes() -> None:
    assert issubclass(GatewayConfigSyntaxError, GatewayConfigError)
    assert issubclass(GatewayConfigError, gateway_errors.GatewayError)
    assert set(GATEWAY_ERROR_CODES) == {
        "gateway_error",
        "gateway_config_invalid",
        "gateway_config_syntax",
        "gateway_config_unreadable",
    }
