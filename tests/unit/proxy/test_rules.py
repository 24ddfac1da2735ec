"""Pure rules of the proxy: credentials, model references, key health, OpenRouter preferences, config."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.common.clock import ManualClock
from clawstack.models.policy import DEFAULT_POLICY, PERMISSIVE, parse_policy
from clawstack.models.refs import split_model_ref as split_ref
from clawstack.proxy.chat import provider_object
from clawstack.proxy.config import load_config, parse_config
from clawstack.proxy.errors import AuthError, ConfigError, RequestError
from clawstack.proxy.providers import KeyHealth, Upstreams
from clawstack.proxy.routing import _retry_after_s
from clawstack.proxy.service import parse_credentials


@pytest.mark.parametrize(
    ("authorization", "api_key", "expected"),
    [
        ("Bearer a:b", None, ("a", "b")),
        ("bearer a:b:c", None, ("a", "b:c")),  # the split is on the first colon
        ("Bearer  a:b ", None, ("a", "b")),
        (None, "a:b", ("a", "b")),
    ],
)
def test_credentials_accepted(authorization: str | None, api_key: str | None, expected: tuple[str, str]) -> None:
    assert parse_credentials(authorization, api_key) == expected


@pytest.mark.parametrize(
    ("authorization", "api_key", "code"),
    [
        (None, None, "missing_credentials"),
        ("Basic YTpi", None, "malformed_credentials"),
        ("Bearer", None, "malformed_credentials"),
        ("Bearer :s", None, "malformed_credentials"),
        ("Bearer a:", None, "malformed_credentials"),
        ("Bearer ab", None, "malformed_credentials"),
        (None, "", "malformed_credentials"),
        ("Token a:b", "a:b", "malformed_credentials"),  # Authorization wins when both are present
    ],
)
def test_credentials_refused(authorization: str | None, api_key: str | None, code: str) -> None:
    with pytest.raises(AuthError) as info:
        parse_credentials(authorization, api_key)
    assert info.value.code == code
    assert info.value.status == 401


FIXED_MESSAGES = {
    "missing credentials",
    "use Authorization: Bearer <identity>:<secret>",
    "credentials must be <identity>:<secret>",
}


@given(st.text(max_size=40))
def test_credentials_parse_or_fail_with_a_fixed_message(token: str) -> None:
    outcome: tuple[str, str] | str
    try:
        outcome = parse_credentials(f"Bearer {token}", None)
    except AuthError as exc:
        outcome = exc.message
    if isinstance(outcome, tuple):
        ident, secret = outcome
        assert ident
        assert secret
        assert ":" not in ident
        assert f"{ident}:{secret}" == token.strip()
    else:
        assert outcome in FIXED_MESSAGES  # never an echo of what was sent


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("openai/gpt-6", ("openai", "gpt-6")),
        ("vercel/openai/gpt-4.1-nano", ("vercel", "openai/gpt-4.1-nano")),
        ("openrouter/google/gemini-3.8-flash", ("openrouter", "google/gemini-3.8-flash")),
        ("vercel/only-one", None),
        ("openai/", None),
        ("/model", None),
        ("noslash", None),
        ("openai//x", None),
    ],
)
def test_split_ref(ref: str, expected: tuple[str, str] | None) -> None:
    assert split_ref(ref) == expected


def _config(**extra: Any) -> Any:
    return parse_config(
        {"worker": {"port": 0}, "operator": {"port": 0}, "state_dir": "s", "revocation_dir": "r", **extra},
        base_dir=Path("/srv/pod"),
        environ={},
    )


def test_upstream_resolution_uses_configured_credentials_only() -> None:
    config = _config(env={"OPENAI_API_KEY": "sk-1"}, upstreams={"local": {"base_url": "http://127.0.0.1:9/v1"}})
    upstreams = Upstreams(config, environ={"ANTHROPIC_API_KEY": "sk-2"})
    openai = upstreams.resolve("openai/gpt")
    assert openai is not None
    assert openai.api_key == "sk-1"
    assert openai.base_url == "https://api.openai.com/v1"
    anthropic = upstreams.resolve("anthropic/claude")
    assert anthropic is not None
    assert anthropic.api_key == "sk-2"
    assert upstreams.resolve("xai/grok") is not None
    assert upstreams.resolve("xai/grok").api_key is None
    local = upstreams.resolve("local/llama")
    assert local is not None
    assert local.base_url == "http://127.0.0.1:9/v1"
    assert local.api_key is None
    plan = upstreams.resolve("chatgpt/gpt-plan")
    assert plan is not None
    assert plan.plan
    assert plan.credential_class == "subscription"
    assert upstreams.resolve("nowhere/x") is None


def test_key_health_dead_and_resting() -> None:
    clock = ManualClock()
    health = KeyHealth(clock, dead_recheck_s=600, retry_after_cap_s=60)
    health.mark_dead("k1")
    health.rest("k2", 3600)  # capped at 60
    health.rest("k3", None)  # no Retry-After: rest for the cap
    assert health.snapshot() == {"k1": "key_dead", "k2": "rate_limited", "k3": "rate_limited"}
    clock.advance(60)
    assert health.blocked("k2") is None
    assert health.blocked("k3") is None
    assert health.blocked("k1") == "key_dead"
    clock.advance(540)
    assert health.snapshot() == {}


def test_retry_after_parsing() -> None:
    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    assert _retry_after_s("7", now) == 7.0
    assert _retry_after_s("Sun, 29 Nov 2026 12:00:30 GMT", now) == 30.0
    assert _retry_after_s("Sun, 29 Nov 2026 11:00:00 GMT", now) == 0.0
    assert _retry_after_s("soon", now) is None
    assert _retry_after_s(None, now) is None


def test_provider_object_narrows_and_sets_what_the_policy_asks_for() -> None:
    slot = {"only": ["a/x", "b/y"], "allow_fallbacks": False}
    assert provider_object(slot, None, DEFAULT_POLICY) == {**slot, "zdr": True, "data_collection": "deny"}
    assert provider_object(slot, None, PERMISSIVE) == slot
    training_allowed = parse_policy({"training": "allowed"})
    assert provider_object(slot, None, training_allowed) == {**slot, "zdr": True}
    assert provider_object(slot, {"only": ["a/x"], "require_parameters": True}, DEFAULT_POLICY)["only"] == ["a/x"]
    assert provider_object(None, {"only": ["any/thing"]}, DEFAULT_POLICY)["only"] == ["any/thing"]
    for weakening in (
        {"zdr": False},
        {"data_collection": "allow"},
        {"allow_fallbacks": True},
        {"require_parameters": False},
        {"only": ["c/z"]},
        {"only": []},
        {"only": [1]},
        {"order": ["a/x"]},
        "deny",
        ["zdr"],
    ):
        with pytest.raises(RequestError) as info:
            provider_object(slot, weakening, DEFAULT_POLICY)
        assert info.value.code == "data_policy_violation"


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"worker": {}}, "worker"),
        ({"surprise": 1}, "surprise"),
        ({"env": {"bad-name": "x"}}, "env"),
        ({"upstreams": {"BAD": {"base_url": "http://x"}}}, "upstreams"),
        ({"upstreams": {"ok": {"base_url": "ftp://x"}}}, "base_url"),
        ({"routing": {"max_tool_rounds": 0}}, "max_tool_rounds"),
        ({"tools": {"svc": {"base_url": "http://x"}}}, "descriptor"),
    ],
)
def test_config_errors_name_the_key(data: dict[str, Any], fragment: str) -> None:
    base = {"worker": {"port": 0}, "operator": {"port": 0}, "state_dir": "s", "revocation_dir": "r"}
    with pytest.raises(ConfigError) as info:
        parse_config({**base, **data}, base_dir=Path("/srv"), environ={})
    assert fragment in info.value.message


def test_config_paths_are_relative_to_the_file_and_revocation_dir_from_env(tmp_path: Path) -> None:
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"worker": {"port": 0}, "operator": {"unix_socket": "op.sock"}, "state_dir": "s"}))
    config = load_config(path, environ={"CLAW_REVOCATION_DIR": "/var/lib/rev"})
    assert config.state_dir == str(tmp_path / "s")
    assert config.operator.unix_socket == str(tmp_path / "op.sock")
    assert config.revocation_dir == "/var/lib/rev"
    with pytest.raises(ConfigError, match="revocation_dir"):
        load_config(path, environ={})


def test_yaml_errors_do_not_quote_the_file(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yml"
    path.write_text("env:\n  OPENAI_API_KEY: sk-live-secret\n  : [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "sk-live-secret" not in info.value.message
    assert "line" in info.value.message
