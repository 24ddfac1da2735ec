"""The vendor facts of the chatgpt plan route: URLs, bodies, headers, the request shape and the failure table."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import ssl
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

import clawstack.proxy.plan
from clawstack.proxy.config import PlanRoute, parse_config
from clawstack.proxy.errors import ConfigError
from clawstack.proxy.plan import REASONS, PlanError, PlanUnsupported, plan_error, plan_ssl_context
from clawstack.proxy.plan.chatgpt import (
    BACKEND_URL,
    CLIENT_ID,
    DEFAULT_LISTEN,
    ISSUER,
    POLICY_ENDPOINT,
    REDIRECT_PATH,
    account_from_id_token,
    authorize_url,
    classify_plan_failure,
    code_exchange_form,
    jwt_expiry,
    limit_reset_s,
    new_pkce,
    new_state,
    parse_token_response,
    pkce_challenge,
    plan_headers,
    redirect_uri,
    refresh_body,
    refresh_refused,
    responses_url,
    shape_plan_request,
    token_url,
)
from tests.integration.proxy.plan_idp import make_tls


def jwt(claims: Any) -> str:
    def part(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return ".".join([part(b'{"alg":"none"}'), part(json.dumps(claims).encode()), part(b"sig")])


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.proxy.plan)
        if not name.startswith("_") and not isinstance(getattr(clawstack.proxy.plan, name), types.ModuleType)
    }
    assert sorted(clawstack.proxy.plan.__all__) == sorted(public)


def test_vendor_constants() -> None:
    assert ISSUER == "https://auth.openai.com"
    assert CLIENT_ID == "app_EMoamEEZ73f0CkXaXp7hrann"
    assert REDIRECT_PATH == "/auth/callback"
    assert DEFAULT_LISTEN == ("127.0.0.1", 1455)
    assert BACKEND_URL == "https://chatgpt.com/backend-api/codex"
    assert POLICY_ENDPOINT == "https://api.openai.com/v1"
    assert token_url(ISSUER + "/") == "https://auth.openai.com/oauth/token"
    assert responses_url(BACKEND_URL) == "https://chatgpt.com/backend-api/codex/responses"
    assert redirect_uri(1455) == "http://localhost:1455/auth/callback"


def test_authorize_url_parses_back_to_the_exact_params() -> None:
    url = authorize_url(ISSUER, redirect_uri="http://localhost:1455/auth/callback", challenge="c" * 43, state="s-1")
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path, parts.fragment) == (
        "https",
        "auth.openai.com",
        "/oauth/authorize",
        "",
    )
    query = parse_qs(parts.query, strict_parsing=True)
    assert {name: values for name, values in query.items()} == {
        "response_type": ["code"],
        "client_id": [CLIENT_ID],
        "redirect_uri": ["http://localhost:1455/auth/callback"],
        "scope": ["openid profile email offline_access"],
        "code_challenge": ["c" * 43],
        "code_challenge_method": ["S256"],
        "id_token_add_organizations": ["true"],
        "codex_cli_simplified_flow": ["true"],
        "originator": ["codex_cli_rs"],
        "state": ["s-1"],
    }


def test_pkce_challenge_is_unpadded_base64url_sha256() -> None:
    # RFC 7636 appendix B
    assert (
        pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    )
    verifier, challenge = new_pkce()
    assert 43 <= len(verifier) <= 128
    assert re.fullmatch(r"[A-Za-z0-9_-]+", verifier)
    expected = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    assert challenge == expected
    assert "=" not in challenge
    assert len(challenge) == 43
    assert new_pkce()[0] != verifier
    assert new_state() != new_state()


def test_code_exchange_form_and_refresh_body() -> None:
    form = code_exchange_form("the-code", redirect_uri="http://localhost:9/auth/callback", verifier="v" * 86)
    assert form == {
        "grant_type": "authorization_code",
        "code": "the-code",
        "redirect_uri": "http://localhost:9/auth/callback",
        "client_id": CLIENT_ID,
        "code_verifier": "v" * 86,
    }
    assert parse_qs(urlencode(form)) == {name: [value] for name, value in form.items()}
    assert refresh_body("rt-1") == {"client_id": CLIENT_ID, "grant_type": "refresh_token", "refresh_token": "rt-1"}


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"email": "a@b.c", "https://api.openai.com/auth": {"chatgpt_account_id": "acct-1"}}, ("a@b.c", "acct-1")),
        ({"https://api.openai.com/profile": {"email": "p@b.c"}}, ("p@b.c", None)),
        ({"email": "", "https://api.openai.com/auth": {"chatgpt_account_id": ""}}, (None, None)),
        ({"email": 3, "https://api.openai.com/auth": "nope"}, (None, None)),
        ([1, 2], (None, None)),
    ],
)
def test_account_from_id_token(claims: Any, expected: tuple[str | None, str | None]) -> None:
    assert account_from_id_token(jwt(claims)) == expected


@pytest.mark.parametrize(
    "token", ["", "a.b", "a..c", "a.b.c.d", "x.!!!.y", "x." + base64.urlsafe_b64encode(b"{").decode() + ".y"]
)
def test_malformed_id_tokens_name_no_account(token: str) -> None:
    assert account_from_id_token(token) == (None, None)
    assert jwt_expiry(token) is None


def test_jwt_expiry() -> None:
    assert jwt_expiry(jwt({"exp": 1_800_000_000})) == datetime.fromtimestamp(1_800_000_000, UTC)
    assert jwt_expiry(jwt({"exp": True})) is None
    assert jwt_expiry(jwt({"exp": 10**20})) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"access_token":"a","refresh_token":"r","id_token":"i","expires_in":3600}', ("a", "r", "i", 3600.0)),
        (b'{"access_token":"a"}', ("a", None, None, None)),
        (b'{"access_token":"a","expires_in":true,"refresh_token":""}', ("a", None, None, None)),
        (b'{"access_token":"a","expires_in":-5}', ("a", None, None, None)),
        (b'{"access_token":""}', None),
        (b'{"access_token":7}', None),
        (b"[]", None),
        (b"not json", None),
        (b"\xff\xfe", None),
    ],
)
def test_parse_token_response(body: bytes, expected: tuple[Any, ...] | None) -> None:
    tokens = parse_token_response(body)
    if expected is None:
        assert tokens is None
    else:
        assert tokens is not None
        assert (tokens.access_token, tokens.refresh_token, tokens.id_token, tokens.expires_in_s) == expected
        assert "a" not in repr(tokens).replace("TokenSet", "").replace("expires_in_s", "")


def test_plan_headers() -> None:
    assert plan_headers("tok", "acct-1", "sess-1") == {
        "Authorization": "Bearer tok",
        "ChatGPT-Account-ID": "acct-1",
        "OpenAI-Beta": "responses=experimental",
        "originator": "codex_cli_rs",
        "session_id": "sess-1",
        "Accept": "text/event-stream",
        "Content-Type": "application/json",
    }
    assert "ChatGPT-Account-ID" not in plan_headers("tok", None, "sess-1")


def test_shape_plan_request_drops_sampling_and_limits_and_forces_stream_and_store() -> None:
    body = {
        "model": "gpt-5.6-terra",
        "input": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "top_p": 0.9,
        "max_output_tokens": 100,
        "stream": False,
        "store": True,
        "n": 1,
        "background": False,
        "tools": [{"type": "function", "name": "f", "parameters": {}}, {"type": "custom", "name": "g"}],
        "tool_choice": {"type": "function", "name": "f"},
    }
    shaped = shape_plan_request(body)
    assert shaped == {
        "model": "gpt-5.6-terra",
        "input": [{"role": "user", "content": "hi"}],
        "stream": True,
        "store": False,
        "instructions": "",
        "tools": body["tools"],
        "tool_choice": {"type": "function", "name": "f"},
    }
    assert body["temperature"] == 0.2
    assert body["stream"] is False
    assert shape_plan_request({"instructions": "be brief"})["instructions"] == "be brief"


@pytest.mark.parametrize(
    "body",
    [
        {"tools": [{"type": "web_search"}]},
        {"tools": [{"type": "function", "name": "f"}, {"type": "mcp", "server_url": "https://x"}]},
        {"tools": [{"type": "file_search"}]},
        {"tools": [{"type": "code_interpreter"}]},
        {"tools": [{"type": "image_generation"}]},
        {"tools": [{"name": "no type"}]},
        {"tools": ["function"]},
        {"tools": {"type": "function"}},
        {"tool_choice": {"type": "web_search_preview"}},
        {"n": 2},
        {"n": 0},
        {"background": True},
    ],
)
def test_shape_plan_request_refuses_what_the_plan_cannot_serve(body: dict[str, Any]) -> None:
    with pytest.raises(PlanUnsupported) as caught:
        shape_plan_request(body)
    assert caught.value.reason == "subscription_unsupported_request"


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "model",
                "input",
                "temperature",
                "top_p",
                "max_output_tokens",
                "instructions",
                "stream",
                "store",
                "metadata",
            ]
        ),
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
    )
)
def test_shaped_bodies_always_stream_unstored_without_sampling(body: dict[str, Any]) -> None:
    shaped = shape_plan_request(body)
    assert shaped["stream"] is True
    assert shaped["store"] is False
    assert not {"temperature", "top_p", "max_output_tokens"} & set(shaped)
    assert shaped["instructions"] is not None


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (None, b"", "subscription_unavailable"),
        (500, b"", "subscription_unavailable"),
        (502, b"<html>bad gateway</html>", "subscription_unavailable"),
        (503, b'{"error":{"code":"server_is_overloaded"}}', "subscription_unavailable"),
        (504, b"", "subscription_unavailable"),
        (200, b"not json at all", "subscription_unavailable"),
        (408, b"", "subscription_unavailable"),
        (401, b'{"detail":"Unauthorized"}', "subscription_signin_required"),
        (429, b'{"error":{"type":"usage_limit_reached","resets_in_seconds":60}}', "subscription_limit_reached"),
        (429, b"", "subscription_limit_reached"),
        (
            200,
            b'{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded"}}}',
            "subscription_limit_reached",
        ),
        (
            None,
            b'{"type":"response.failed","response":{"error":{"code":"insufficient_quota"}}}',
            "subscription_limit_reached",
        ),
        (403, b'{"error":{"type":"usage_not_included"}}', "subscription_not_eligible"),
        (429, b'{"error":{"type":"usage_not_included"}}', "subscription_not_eligible"),
        (
            200,
            b'{"type":"response.failed","response":{"error":{"code":"usage_not_included"}}}',
            "subscription_not_eligible",
        ),
        (403, b"", "subscription_not_eligible"),
        (402, b"", "subscription_not_eligible"),
        (400, b'{"detail":"Unsupported parameter: temperature"}', "subscription_unsupported_request"),
        (422, b"", "subscription_unsupported_request"),
        (404, b"", "subscription_unsupported_request"),
        (413, b"", "subscription_unsupported_request"),
        (
            200,
            b'{"type":"response.failed","response":{"error":{"code":"context_length_exceeded"}}}',
            "subscription_unsupported_request",
        ),
    ],
)
def test_classify_plan_failure(status: int | None, body: bytes, reason: str) -> None:
    assert classify_plan_failure(status, body) == reason
    assert reason in REASONS


def test_limit_reset_s() -> None:
    now = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
    assert limit_reset_s(b'{"error":{"type":"usage_limit_reached","resets_in_seconds":90}}') == 90.0
    later = int((now + timedelta(seconds=300)).timestamp())
    assert limit_reset_s(json.dumps({"error": {"resets_at": later}}).encode(), now=now) == 300.0
    assert limit_reset_s(json.dumps({"error": {"resets_at": 0}}).encode(), now=now) == 0.0
    assert limit_reset_s(b'{"type":"response.failed","response":{"error":{"resets_in_seconds":5}}}') == 5.0
    for body in (
        b"",
        b"[]",
        b'{"error":{}}',
        b'{"error":{"resets_in_seconds":-1}}',
        b'{"error":{"resets_in_seconds":true}}',
    ):
        assert limit_reset_s(body, now=now) is None


@pytest.mark.parametrize(
    ("status", "body", "refused"),
    [
        (401, b"", True),
        (400, b'{"error":"invalid_grant"}', True),
        (400, b'{"error":{"code":"refresh_token_expired"}}', True),
        (400, b'{"error":{"code":"refresh_token_reused"}}', True),
        (403, b'{"code":"refresh_token_invalidated"}', True),
        (403, b'{"error":"refresh_token_invalidated"}', True),
        (400, b'{"error":"invalid_request"}', False),
        (500, b'{"error":"invalid_grant"}', False),
        (502, b"", False),
    ],
)
def test_refresh_refused(status: int, body: bytes, refused: bool) -> None:
    assert refresh_refused(status, body) is refused


def test_plan_errors_carry_their_reason() -> None:
    for reason in REASONS:
        error = plan_error(reason, "x")
        assert isinstance(error, PlanError)
        assert error.reason == reason == error.code
        assert error.envelope()["error"]["code"] == reason
    assert plan_error("subscription_unavailable", "x").retryable


def _proxy_config(**extra: Any) -> dict[str, Any]:
    return {"worker": {"port": 0}, "operator": {"port": 0}, "state_dir": "s", "revocation_dir": "r", **extra}


def test_plan_route_config_resolves_paths_and_defaults(tmp_path: Path) -> None:
    config = parse_config(
        _proxy_config(auth_dir=".claw-auth/subscriptions", plan_routes={"chatgpt": {"ca_file": "ca.pem"}}),
        base_dir=tmp_path,
        environ={},
    )
    assert config.auth_dir == str(tmp_path / ".claw-auth/subscriptions")
    route = config.plan_routes["chatgpt"]
    assert route.ca_file == str(tmp_path / "ca.pem")
    assert (route.issuer, route.base_url, route.limit_rest_s) == (ISSUER, BACKEND_URL, 900.0)
    bare = parse_config(_proxy_config(), base_dir=tmp_path, environ={})
    assert bare.auth_dir is None
    assert bare.plan_routes == {}
    assert PlanRoute(issuer="https://idp.test/").issuer == "https://idp.test"


@pytest.mark.parametrize(
    ("routes", "where"),
    [
        ({"openai": {}}, "plan_routes"),
        ({"chatgpt": {"issuer": "http://auth.openai.com"}}, "issuer"),
        ({"chatgpt": {"base_url": "https://x/?q=1"}}, "base_url"),
        ({"chatgpt": {"limit_rest_s": 0}}, "limit_rest_s"),
        ({"chatgpt": {"limit_rest_s": 86401}}, "limit_rest_s"),
        ({"chatgpt": {"api_key_env": "X"}}, "api_key_env"),
    ],
)
def test_plan_route_config_refusals(routes: dict[str, Any], where: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=where):
        parse_config(_proxy_config(plan_routes=routes), base_dir=tmp_path, environ={})


def test_plan_ssl_context(tmp_path: Path) -> None:
    system = plan_ssl_context(PlanRoute())
    assert system.verify_mode == ssl.CERT_REQUIRED
    assert system.check_hostname
    ca_file, _, _ = make_tls(tmp_path)
    only = plan_ssl_context(PlanRoute(ca_file=str(ca_file)))
    assert only.verify_mode == ssl.CERT_REQUIRED
    assert only.check_hostname
    assert [cert["subject"] for cert in only.get_ca_certs()] == [((("commonName", "clawstack plan test CA"),),)]
