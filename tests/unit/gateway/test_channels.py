"""The webhook channel's pieces without a server: ``channels.webhook`` config, signatures, the body, authority."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.common.clock import SystemClock
from clawstack.gateway.channels import (
    MAX_BODY_BYTES,
    WebhookAuthError,
    WebhookBodyError,
    WebhookChannel,
    WebhookMessage,
    parse_message,
    sign,
    signed_headers,
    verify,
)
from clawstack.gateway.config import GatewayConfig, load_config, parse_config
from clawstack.gateway.errors import GatewayConfigError, GatewayError

SECRET = "webhook-secret-0123456789"
BASE: dict[str, Any] = {
    "gateway": {"auth": {"mode": "token", "token": "gateway-token"}},
    "models": {"providers": {"fake": {"baseUrl": "http://127.0.0.1:18089/v1", "models": [{"id": "scripted"}]}}},
    "agents": {"defaults": {"model": {"primary": "fake/scripted"}}, "entries": {"main": {"default": True}, "ops": {}}},
}


def _config(webhook: dict[str, Any] | None = None, **top: Any) -> GatewayConfig:
    doc = copy.deepcopy(BASE)
    doc.update(top)
    if webhook is not None:
        doc["channels"] = {"webhook": webhook}
    return parse_config(json.dumps(doc), base_dir=Path("/"), environ={"HOOK_SECRET": SECRET})


def _config_error(webhook: Any, **top: Any) -> str:
    doc = copy.deepcopy(BASE)
    doc.update(top)
    doc["channels"] = {"webhook": webhook}
    with pytest.raises(GatewayConfigError) as info:
        parse_config(doc, base_dir=Path("/"), environ={"SHORT": "short", "EMPTY": ""})
    return info.value.message


# --- config ---------------------------------------------------------------------------------------------------------


def test_defaults() -> None:
    webhook = _config().channels.webhook
    assert webhook.enabled is False
    assert webhook.secret is None
    assert webhook.path == "/channels/webhook"
    assert webhook.agent_id == "main"
    assert webhook.allow_from == ()
    assert webhook.outbound is None
    assert webhook.max_skew_seconds == 300


def test_a_full_section_loads_and_the_secret_comes_from_the_environment() -> None:
    webhook = _config(
        {
            "enabled": True,
            "secret": "${HOOK_SECRET}",
            "path": "/in/chat",
            "agentId": "OPS",
            "allowFrom": ["alice@example.org", "*"],
            "outbound": {"url": "http://127.0.0.1:9/out", "timeoutSeconds": 3},
            "maxSkewSeconds": 60,
        }
    ).channels.webhook
    assert webhook.secret is not None
    assert webhook.secret.get_secret_value() == SECRET
    assert SECRET not in repr(webhook)
    assert webhook.agent_id == "ops"
    assert webhook.outbound is not None
    assert (webhook.outbound.url, webhook.outbound.timeout_seconds) == ("http://127.0.0.1:9/out", 3)
    assert webhook.allows("anyone")


def test_the_example_config_carries_a_disabled_channel() -> None:
    root = Path(__file__).resolve().parents[3]
    config = load_config(root / "examples" / "gateway" / "gateway.json5", environ={"CLAW_GATEWAY_TOKEN": "t"})
    webhook = config.channels.webhook
    assert webhook.enabled is False
    assert webhook.allow_from == ("alice@example.org",)
    assert webhook.outbound is not None
    assert config.operators[0].links[0].id == "alice@example.org"


def test_allow_from_names_senders() -> None:
    webhook = _config({"allowFrom": ["alice"]}).channels.webhook
    assert webhook.allows("alice")
    assert not webhook.allows("Alice")
    assert not _config().channels.webhook.allows("alice")


CONFIG_ERRORS: list[tuple[Any, str]] = [
    ({"enabled": True}, "channels.webhook.secret: required when channels.webhook.enabled is true"),
    ({"secret": "short-secret"}, "channels.webhook.secret: must be at least 16 characters"),
    ({"enabled": True, "secret": "${SHORT}"}, "channels.webhook.secret: must be at least 16 characters"),
    ({"enabled": True, "secret": "${EMPTY}"}, "channels.webhook.secret: environment variable EMPTY is empty"),
    ({"enabled": True, "secret": "${NOPE}"}, "channels.webhook.secret: environment variable NOPE is not set"),
    ({"secret": 12345678901234567}, "channels.webhook.secret: must be a string"),
    ({"enabled": "yes"}, "channels.webhook.enabled: must be true or false"),
    ({"path": "channels"}, 'channels.webhook.path: must be an absolute URL path such as "/hooks" (no trailing "/")'),
    ({"path": "/in/"}, 'channels.webhook.path: must be an absolute URL path such as "/hooks" (no trailing "/")'),
    ({"path": "/ws"}, "channels.webhook.path: collides with the WebSocket endpoint /ws"),
    ({"agentId": "nobody"}, 'channels.webhook.agentId: unknown agent "nobody"'),
    ({"agentId": "a b"}, "channels.webhook.agentId: agent id character 1 (U+0020) is not allowed"),
    ({"allowFrom": "alice"}, "channels.webhook.allowFrom: must be a list"),
    ({"allowFrom": [""]}, 'channels.webhook.allowFrom[0]: must be "*" or a sender id'),
    ({"allowFrom": ["ok", "a b"]}, 'channels.webhook.allowFrom[1]: must be "*" or a sender id'),
    ({"allowFrom": ["x", "x"]}, 'channels.webhook.allowFrom[1]: duplicate sender id "x"'),
    ({"outbound": {}}, "channels.webhook.outbound.url: required"),
    ({"outbound": {"url": "ftp://host/x"}}, "channels.webhook.outbound.url: must be an http or https URL"),
    ({"outbound": {"url": "http://u:p@host/x"}}, "channels.webhook.outbound.url: must be an http or https URL"),
    ({"outbound": {"url": "http://h", "timeoutSeconds": 0}}, "channels.webhook.outbound.timeoutSeconds: must be at"),
    ({"outbound": {"url": "http://h", "retries": 3}}, "channels.webhook.outbound.retries: unknown key"),
    ({"maxSkewSeconds": 0}, "channels.webhook.maxSkewSeconds: must be at least 1"),
    ({"maxSkewSeconds": 1.5}, "channels.webhook.maxSkewSeconds: must be an integer"),
    ({"allow_from": []}, "channels.webhook.allow_from: unknown key"),
    ({"secrett": SECRET}, "channels.webhook.secrett: unknown key"),
    ([], "channels.webhook: must be an object"),
]


@pytest.mark.parametrize(("webhook", "message"), CONFIG_ERRORS)
def test_config_errors_name_the_key(webhook: Any, message: str) -> None:
    assert message in _config_error(webhook)


def test_unknown_channel_and_hooks_collision() -> None:
    doc = copy.deepcopy(BASE)
    doc["channels"] = {"telegram": {}}
    with pytest.raises(GatewayConfigError, match=r"channels\.telegram: unknown key"):
        parse_config(doc, base_dir=Path("/"), environ={})
    message = _config_error({"path": "/hooks/agent"}, hooks={"enabled": True, "token": "hook-token"})
    assert "channels.webhook.path: collides with the HTTP hooks endpoint" in message
    assert _config({"path": "/hooks/agent"}).channels.webhook.path == "/hooks/agent"  # hooks disabled: free


@settings(max_examples=40, deadline=None)
@given(secret=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40))
def test_the_secret_never_appears_in_errors(secret: str) -> None:
    secret = "SECRET-" + secret
    for webhook in ({"secret": secret[:15]}, {"secret": secret, "bogus": 1}, {"secret": [secret]}, {"path": secret}):
        doc = copy.deepcopy(BASE)
        doc["channels"] = {"webhook": webhook}
        with pytest.raises(GatewayConfigError) as info:
            parse_config(doc, base_dir=Path("/"), environ={})
        rendered = "".join(traceback.format_exception(info.value)) + json.dumps(info.value.to_dict())
        assert "SECRET-" not in rendered


# --- signatures -----------------------------------------------------------------------------------------------------


def test_sign_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"a":1}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1700000000, body) == f"v1={expected}"
    headers = signed_headers(SECRET, body, timestamp=1700000000)
    assert headers["X-Claw-Timestamp"] == "1700000000"
    assert headers["X-Claw-Signature"] == f"v1={expected}"
    assert headers["Content-Type"] == "application/json"


def _verify(timestamp: str | None, signature: str | None, body: bytes = b"{}", now_s: float = 1700000000) -> None:
    verify(SECRET, timestamp=timestamp, signature=signature, body=body, now_s=now_s, max_skew_s=300)


def test_verify_accepts_a_good_signature_within_the_skew() -> None:
    _verify("1700000000", sign(SECRET, 1700000000, b"{}"))
    _verify("1700000300", sign(SECRET, 1700000300, b"{}"))
    _verify("1699999700", sign(SECRET, 1699999700, b"{}"))
    _verify("1700000000", sign(SECRET, 1700000000, b"{}").upper().replace("V1=", "v1="))


GOOD = sign(SECRET, 1700000000, b"{}")
VERIFY_REFUSALS: list[tuple[str | None, str | None, bytes, str]] = [
    (None, GOOD, b"{}", "headers are required"),
    ("1700000000", None, b"{}", "headers are required"),
    ("", GOOD, b"{}", "headers are required"),
    ("-1700000000", GOOD, b"{}", "must be unix seconds"),
    ("1700000000.0", GOOD, b"{}", "must be unix seconds"),
    ("1699999699", sign(SECRET, 1699999699, b"{}"), b"{}", "more than 300 seconds"),
    ("1700000301", sign(SECRET, 1700000301, b"{}"), b"{}", "more than 300 seconds"),
    ("1700000000", GOOD.removeprefix("v1="), b"{}", "must be v1=<64 hex digits>"),
    ("1700000000", "v2=" + GOOD[3:], b"{}", "must be v1=<64 hex digits>"),
    ("1700000000", GOOD + "00", b"{}", "must be v1=<64 hex digits>"),
    ("1700000000", GOOD, b"{} ", "does not match"),  # tampered body
    ("1700000001", GOOD, b"{}", "does not match"),  # tampered timestamp
    ("1700000000", sign("another-secret-0123", 1700000000, b"{}"), b"{}", "does not match"),
]


@pytest.mark.parametrize(("timestamp", "signature", "body", "message"), VERIFY_REFUSALS)
def test_verify_refusals(timestamp: str | None, signature: str | None, body: bytes, message: str) -> None:
    with pytest.raises(WebhookAuthError, match=message) as info:
        _verify(timestamp, signature, body)
    assert info.value.code == "webhook_unauthorized"
    assert info.value.status == 401
    assert SECRET not in info.value.message


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=64), flip=st.integers(min_value=0, max_value=63))
def test_any_change_to_the_body_breaks_the_signature(body: bytes, flip: int) -> None:
    signature = sign(SECRET, 1700000000, body)
    tampered = bytearray(body + b"x")
    tampered[flip % len(tampered)] ^= 0x01
    with pytest.raises(WebhookAuthError):
        _verify("1700000000", signature, bytes(tampered))


# --- the body -------------------------------------------------------------------------------------------------------


def test_parse_message() -> None:
    message = parse_message(
        json.dumps(
            {"messageId": "m-1", "sender": {"id": "alice", "name": "Alice"}, "text": "hi", "threadId": "t1"}
        ).encode()
    )
    assert message == WebhookMessage.model_validate(
        {"messageId": "m-1", "sender": {"id": "alice", "name": "Alice"}, "text": "hi", "threadId": "t1"}
    )
    assert (message.message_id, message.sender.id, message.thread_id) == ("m-1", "alice", "t1")


GOOD_BODY = {"messageId": "m-1", "sender": {"id": "alice"}, "text": "hello"}
BODY_REFUSALS: list[tuple[bytes, str]] = [
    (b"", "not a JSON object"),
    (b"not json", "not a JSON object"),
    (b"\xff\xfe", "not a JSON object"),
    (b"[]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
    (b'{"messageId": "m", "messageId": "n", "sender": {"id": "a"}, "text": "x"}', "not a JSON object"),
    (b'{"messageId": "m", "sender": {"id": "a"}, "text": NaN}', "not a JSON object"),
    (json.dumps({**GOOD_BODY, "extra": 1}).encode(), "extra: unknown key"),
    (json.dumps({**GOOD_BODY, "sender": {"id": "a", "role": "admin"}}).encode(), "sender.role: unknown key"),
    (json.dumps({**GOOD_BODY, "message_id": "x"}).encode(), "message_id: unknown key"),
    (json.dumps({"sender": {"id": "a"}, "text": "x"}).encode(), "messageId: required"),
    (json.dumps({"messageId": "m", "text": "x"}).encode(), "sender: required"),
    (json.dumps({"messageId": "m", "sender": {"id": "a"}}).encode(), "text: required"),
    (json.dumps({**GOOD_BODY, "text": ""}).encode(), "text: must not be empty"),
    (json.dumps({**GOOD_BODY, "text": 5}).encode(), "text: must be a string"),
    (json.dumps({**GOOD_BODY, "messageId": 7}).encode(), "messageId: must be a string"),
    (json.dumps({**GOOD_BODY, "messageId": "a b"}).encode(), "messageId: must be 1 to 128 visible ASCII"),
    (json.dumps({**GOOD_BODY, "messageId": "x" * 129}).encode(), "messageId: must be 1 to 128 visible ASCII"),
    (json.dumps({**GOOD_BODY, "sender": "alice"}).encode(), "sender: must be an object"),
    (json.dumps({**GOOD_BODY, "sender": {"id": ""}}).encode(), "sender.id: must not be empty"),
    (json.dumps({**GOOD_BODY, "threadId": 3}).encode(), "threadId: must be a string"),
]


@pytest.mark.parametrize(("raw", "message"), BODY_REFUSALS)
def test_malformed_bodies(raw: bytes, message: str) -> None:
    with pytest.raises(WebhookBodyError, match=message) as info:
        parse_message(raw)
    assert info.value.status == 400
    assert info.value.__context__ is None


def test_body_errors_never_quote_the_text() -> None:
    with pytest.raises(WebhookBodyError) as info:
        parse_message(json.dumps({**GOOD_BODY, "text": ["PRIVATE-TEXT"]}).encode())
    error = info.value
    assert error.__context__ is None
    assert error.__cause__ is None
    assert "PRIVATE-TEXT" not in repr(error) + str(error) + json.dumps(error.to_dict())


@settings(max_examples=100, deadline=None)
@given(
    document=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=4),
        max_leaves=8,
    )
)
def test_nothing_malformed_is_accepted(document: Any) -> None:
    raw = json.dumps(document).encode()
    try:
        message = parse_message(raw)
    except WebhookBodyError:
        return
    # Whatever was accepted has exactly the schema's keys and types.
    assert isinstance(document, dict)
    assert set(document) <= {"messageId", "sender", "text", "threadId"}
    assert isinstance(message.text, str)
    assert message.text


# --- sessions and authority -----------------------------------------------------------------------------------------


def _channel(**webhook: Any) -> WebhookChannel:
    operators = [
        {"name": "alice", "roles": ["operator.admin"], "links": [{"channel": "webhook", "id": "alice"}]},
        {"name": "rita", "roles": ["operator.read"], "links": [{"channel": "webhook", "id": "rita"}]},
        {"name": "other", "roles": ["operator.admin"], "links": [{"channel": "telegram", "id": "bob"}]},
    ]
    config = _config({"enabled": True, "secret": SECRET, **webhook}, operators=operators)
    return WebhookChannel(config, clock=SystemClock())


def _message(sender: str, thread: str | None = None) -> WebhookMessage:
    body: dict[str, Any] = {"messageId": "m-1", "sender": {"id": sender}, "text": "/x"}
    if thread is not None:
        body["threadId"] = thread
    return WebhookMessage.model_validate(body)


def test_session_keys_and_run_ids() -> None:
    channel = _channel(agentId="ops")
    inbound = channel.accept(_message("alice"))
    assert inbound.session_key == "agent:ops:channel:webhook:alice"
    assert inbound.run_request.idempotency_key == "webhook:m-1"
    assert inbound.run_request.lane == "main"
    assert channel.accept(_message("alice", "t-9")).session_key == "agent:ops:channel:webhook:alice:thread:t-9"
    for sender, thread in (("a:b", None), ("-x", None), ("a b", None), ("é", None), ("alice", "t:1"), ("a", "#")):
        with pytest.raises(WebhookBodyError) as info:
            channel.accept(_message(sender, thread))
        assert isinstance(info.value, GatewayError)


@pytest.mark.parametrize(
    ("allow_from", "sender", "authenticated", "operator"),
    [
        (["alice", "rita", "bob"], "alice", True, "alice"),  # linked, admin, allowed
        (["*"], "alice", True, "alice"),
        ([], "alice", False, None),  # linked admin but not allowed to run commands: no authority
        (["alice", "rita"], "rita", True, None),  # linked, only operator.read
        (["*"], "bob", True, None),  # linked on another channel only
        (["*"], "carol", True, None),  # unlinked
    ],
)
def test_requester_authority(allow_from: list[str], sender: str, authenticated: bool, operator: str | None) -> None:
    requester = _channel(allowFrom=allow_from).accept(_message(sender)).requester
    assert requester.channel == "webhook"
    assert requester.sender_id == sender
    assert requester.authenticated is authenticated
    assert requester.operator == operator


def test_max_body_is_256_kib() -> None:
    assert MAX_BODY_BYTES == 256 * 1024
