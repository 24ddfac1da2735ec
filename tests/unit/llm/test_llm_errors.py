"""The llm error tree: stable codes as data, retryability, HTTP answers mapped to errors, Retry-After."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from clawstack.common.errors import ClawError
from clawstack.llm import (
    LLM_ERROR_CODES,
    FakeDirectiveError,
    FakeModelError,
    FakeScriptError,
    LLMAuthenticationError,
    LLMBadRequestError,
    LLMError,
    LLMHTTPError,
    LLMPermissionDeniedError,
    LLMProtocolError,
    LLMRateLimitError,
    LLMServerError,
    LLMStreamError,
    LLMTimeoutError,
    LLMTransportError,
)
from clawstack.llm._translate import http_error, parse_retry_after

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ENDPOINT = "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("cls", "code", "retryable"),
    [
        (LLMError, "llm_error", False),
        (LLMHTTPError, "llm_http_error", False),
        (LLMBadRequestError, "llm_bad_request", False),
        (LLMAuthenticationError, "llm_unauthorized", False),
        (LLMPermissionDeniedError, "llm_forbidden", False),
        (LLMRateLimitError, "llm_rate_limited", True),
        (LLMServerError, "llm_server_error", True),
        (LLMStreamError, "llm_stream_error", False),
        (LLMTransportError, "llm_transport_error", True),
        (LLMTimeoutError, "llm_deadline_exceeded", True),
        (LLMProtocolError, "llm_protocol_error", False),
        (FakeModelError, "fake_model_error", False),
        (FakeDirectiveError, "fake_directive_invalid", False),
        (FakeScriptError, "fake_script_invalid", False),
    ],
)
def test_each_class_has_a_stable_code(cls: type[LLMError], code: str, retryable: bool) -> None:
    assert issubclass(cls, LLMError)
    assert issubclass(cls, ClawError)
    assert cls.code == code
    assert cls.retryable is retryable
    assert code in LLM_ERROR_CODES


def test_the_tree_has_the_documented_shape() -> None:
    for cls in (LLMBadRequestError, LLMAuthenticationError, LLMPermissionDeniedError, LLMRateLimitError):
        assert issubclass(cls, LLMHTTPError)
    assert issubclass(LLMServerError, LLMHTTPError)
    assert issubclass(FakeDirectiveError, FakeModelError)
    assert issubclass(FakeScriptError, FakeModelError)
    for cls in (LLMTransportError, LLMTimeoutError, LLMProtocolError, LLMStreamError):
        assert not issubclass(cls, LLMHTTPError)


def test_instance_codes_are_listed() -> None:
    assert LLMTimeoutError("x", kind="first_byte", timeout_s=1.0).code == "llm_first_byte_timeout"
    assert LLMTimeoutError("x", kind="deadline", timeout_s=1.0).code == "llm_deadline_exceeded"
    assert "llm_connect_failed" in LLM_ERROR_CODES
    assert "llm_stream_incomplete" in LLM_ERROR_CODES


def test_to_dict_serialises_code_and_message() -> None:
    error = LLMRateLimitError("slow down", status=429, retry_after_s=2.0)
    assert error.to_dict() == {"code": "llm_rate_limited", "message": "slow down"}


def _body(error_type: str | None, code: str | None, message: str = "Secret prompt text was bad") -> bytes:
    return json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}}).encode()


@pytest.mark.parametrize(
    ("status", "cls", "retryable"),
    [
        (400, LLMBadRequestError, False),
        (401, LLMAuthenticationError, False),
        (403, LLMPermissionDeniedError, False),
        (404, LLMBadRequestError, False),
        (408, LLMBadRequestError, True),
        (422, LLMBadRequestError, False),
        (429, LLMRateLimitError, True),
        (500, LLMServerError, True),
        (502, LLMServerError, True),
        (503, LLMServerError, True),
    ],
)
def test_http_error_maps_status_to_class(status: int, cls: type[LLMHTTPError], retryable: bool) -> None:
    error = http_error(status, {}, _body("some_type", "some_code"), ENDPOINT, NOW)
    assert type(error) is cls
    assert error.status == status
    assert error.retryable is retryable
    assert (error.error_type, error.error_code) == ("some_type", "some_code")
    assert error.server_message == "Secret prompt text was bad"
    assert "Secret prompt" not in str(error)
    assert str(status) in str(error)


@pytest.mark.parametrize(
    "body",
    [b"", b"<html>Bad gateway</html>", b"[]", b'{"error": "flat string"}', b'{"error": {"type": 5}}', b"\xff"],
)
def test_http_error_tolerates_bodies_that_are_not_openai_errors(body: bytes) -> None:
    error = http_error(502, {}, body, ENDPOINT, NOW)
    assert isinstance(error, LLMServerError)
    assert error.error_type is None
    assert error.error_code is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "inf"}, None),
        ({"Retry-After": "Fri, 02 Jan 2026 03:04:35 GMT"}, 30.0),
        ({"Retry-After": "Fri, 02 Jan 2026 03:00:00 GMT"}, 0.0),
        ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
        ({"retry-after-ms": "bogus", "Retry-After": "9"}, 9.0),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, NOW) == expected


def test_http_error_carries_retry_after() -> None:
    error = http_error(429, {"Retry-After": "3"}, _body("rate_limit_error", "rate_limit_exceeded"), ENDPOINT, NOW)
    assert isinstance(error, LLMRateLimitError)
    assert error.retry_after_s == 3.0
