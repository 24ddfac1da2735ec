"""Errors raised by :mod:`clawstack.llm`: the client and the scripted fake model.

::

    ClawError                                  (clawstack.common.errors)
     └── LLMError                              llm_error
          ├── LLMHTTPError                     llm_http_error          status, error_type, error_code,
          │    │                                                      retry_after_s, server_message
          │    ├── LLMBadRequestError          llm_bad_request         400, 404, 409, 413, 422, ...
          │    ├── LLMAuthenticationError      llm_unauthorized        401
          │    ├── LLMPermissionDeniedError    llm_forbidden           403
          │    ├── LLMRateLimitError           llm_rate_limited        429  (retryable)
          │    └── LLMServerError              llm_server_error        5xx  (retryable)
          ├── LLMStreamError                   llm_stream_error        an error event inside a 200 stream
          ├── LLMTransportError                llm_connect_failed      (retryable)
          │                                    llm_transport_error     connection lost, reset, dropped stream
          ├── LLMTimeoutError                  llm_deadline_exceeded   (retryable) the per-call deadline
          │                                    llm_first_byte_timeout  no answer within first_byte_timeout_s
          ├── LLMProtocolError                 llm_protocol_error      malformed body or SSE stream, redirect
          │                                    llm_stream_incomplete   the stream ended without ``[DONE]``
          └── FakeModelError                   fake_model_error        the scripted fake's own input
               ├── FakeDirectiveError          fake_directive_invalid  a malformed ``@fake`` directive
               └── FakeScriptError             fake_script_invalid     a malformed script file

Every code is data (:data:`LLM_ERROR_CODES`), so callers branch on ``exc.code`` and APIs serialise
``exc.to_dict()``. Messages name the endpoint, the status and the error type; they never contain an API key or
message content. What the endpoint said in its error body is kept apart in ``server_message``, which callers may
show where that is safe.
"""

from __future__ import annotations

from typing import Literal

from clawstack.common.errors import ClawError


class LLMError(ClawError):
    """Root of the :mod:`clawstack.llm` error tree."""

    code = "llm_error"


class LLMHTTPError(LLMError):
    """The endpoint answered with an HTTP error status (4xx or 5xx).

    ``error_type`` and ``error_code`` come from the OpenAI error body ``{"error": {"type", "code", ...}}`` when
    the endpoint sent one. ``retry_after_s`` is the endpoint's ``Retry-After`` (or ``retry-after-ms``) hint.
    """

    code = "llm_http_error"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        error_type: str | None = None,
        error_code: str | None = None,
        retry_after_s: float | None = None,
        server_message: str | None = None,
        code: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, code=code, retryable=retryable)
        self.status = status
        self.error_type = error_type
        self.error_code = error_code
        self.retry_after_s = retry_after_s
        self.server_message = server_message


class LLMBadRequestError(LLMHTTPError):
    """The endpoint refused the request as invalid (400 and other 4xx without a class of their own)."""

    code = "llm_bad_request"


class LLMAuthenticationError(LLMHTTPError):
    """401: the API key is missing or wrong."""

    code = "llm_unauthorized"


class LLMPermissionDeniedError(LLMHTTPError):
    """403: the key is valid but not allowed to do this."""

    code = "llm_forbidden"


class LLMRateLimitError(LLMHTTPError):
    """429: too many requests; ``retry_after_s`` says when to try again, if the endpoint said."""

    code = "llm_rate_limited"
    retryable = True


class LLMServerError(LLMHTTPError):
    """5xx: the endpoint failed or is overloaded."""

    code = "llm_server_error"
    retryable = True


class LLMStreamError(LLMError):
    """The endpoint started a stream with status 200, then sent an ``{"error": ...}`` event in it."""

    code = "llm_stream_error"

    def __init__(
        self,
        message: str,
        *,
        error_type: str | None = None,
        error_code: str | None = None,
        server_message: str | None = None,
    ) -> None:
        super().__init__(message, retryable=error_type == "server_error")
        self.error_type = error_type
        self.error_code = error_code
        self.server_message = server_message


class LLMTransportError(LLMError):
    """The connection could not be made (``llm_connect_failed``) or broke (``llm_transport_error``)."""

    code = "llm_transport_error"
    retryable = True


TimeoutKind = Literal["deadline", "first_byte"]


class LLMTimeoutError(LLMError):
    """A deadline passed: the per-call ``timeout_s`` or the ``first_byte_timeout_s``."""

    code = "llm_deadline_exceeded"
    retryable = True

    def __init__(self, message: str, *, kind: TimeoutKind, timeout_s: float) -> None:
        super().__init__(message, code="llm_first_byte_timeout" if kind == "first_byte" else None)
        self.kind: TimeoutKind = kind
        self.timeout_s = timeout_s


class LLMProtocolError(LLMError):
    """The endpoint's answer was not a well-formed OpenAI response or SSE stream."""

    code = "llm_protocol_error"


class FakeModelError(LLMError):
    """Bad input to the scripted fake model (its directives or its script file)."""

    code = "fake_model_error"


class FakeDirectiveError(FakeModelError):
    """A ``@fake`` directive line is unknown, malformed, repeated or conflicts with another."""

    code = "fake_directive_invalid"


class FakeScriptError(FakeModelError):
    """A script file is unreadable, not JSON, or a step in it is malformed."""

    code = "fake_script_invalid"


LLM_ERROR_CODES: frozenset[str] = frozenset(
    {
        "llm_error",
        "llm_http_error",
        "llm_bad_request",
        "llm_unauthorized",
        "llm_forbidden",
        "llm_rate_limited",
        "llm_server_error",
        "llm_stream_error",
        "llm_connect_failed",
        "llm_transport_error",
        "llm_deadline_exceeded",
        "llm_first_byte_timeout",
        "llm_protocol_error",
        "llm_stream_incomplete",
        "fake_model_error",
        "fake_directive_invalid",
        "fake_script_invalid",
    }
)
"""Every ``code`` an error from :mod:`clawstack.llm` can carry."""
