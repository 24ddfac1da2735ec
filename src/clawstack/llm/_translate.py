"""The boundary between aiohttp and :mod:`clawstack.llm`: aiohttp errors and HTTP error answers become
errors from :mod:`clawstack.llm.errors`, and deadline scopes become :class:`LLMTimeoutError`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

from clawstack.llm.errors import (
    LLMAuthenticationError,
    LLMBadRequestError,
    LLMHTTPError,
    LLMPermissionDeniedError,
    LLMProtocolError,
    LLMRateLimitError,
    LLMServerError,
    LLMTimeoutError,
    LLMTransportError,
    TimeoutKind,
)

_STATUS_CLASSES: Mapping[int, type[LLMHTTPError]] = {
    401: LLMAuthenticationError,
    403: LLMPermissionDeniedError,
    429: LLMRateLimitError,
}


@contextmanager
def map_aiohttp_errors(endpoint: str) -> Iterator[None]:
    """Re-raise aiohttp's errors as :class:`LLMTransportError` or :class:`LLMProtocolError`."""
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise LLMTransportError(
            f"cannot connect to the model endpoint {endpoint}: {exc.os_error.strerror or type(exc.os_error).__name__}",
            code="llm_connect_failed",
        ) from exc
    except aiohttp.ClientResponseError as exc:
        raise LLMProtocolError(f"the model endpoint {endpoint} sent a malformed HTTP response") from exc
    except aiohttp.ClientError as exc:
        raise LLMTransportError(
            f"the connection to the model endpoint {endpoint} failed: {type(exc).__name__}"
        ) from exc
    except TimeoutError:
        # A deadline scope around this block decides what its own timeout means.
        raise
    except OSError as exc:
        raise LLMTransportError(
            f"the connection to the model endpoint {endpoint} failed: {type(exc).__name__}"
        ) from exc


@asynccontextmanager
async def deadline_scope(
    endpoint: str, when: float | None, kind: TimeoutKind, limit_s: float | None
) -> AsyncIterator[None]:
    """Run the body under an absolute loop-time deadline (``None``: none); past it, raise
    :class:`LLMTimeoutError` of ``kind``. ``limit_s`` is the relative limit the deadline came from."""
    scope = asyncio.timeout_at(when)
    try:
        async with scope:
            yield
    except TimeoutError as exc:
        if not scope.expired():
            raise
        limit = limit_s or 0.0
        what = "no answer began" if kind == "first_byte" else "the call did not finish"
        raise LLMTimeoutError(
            f"{what} within {limit:g} s at the model endpoint {endpoint}", kind=kind, timeout_s=limit
        ) from exc


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``Retry-After`` as seconds or an HTTP date; else ``None``."""
    lowered = {key.lower(): value for key, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis)
        except ValueError:
            value = -1.0
        if 0 <= value < float("inf"):
            return value / 1000
    header = lowered.get("retry-after")
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        try:
            when = parsedate_to_datetime(header)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    return seconds if 0 <= seconds < float("inf") else None


def http_error(
    status: int, headers: Mapping[str, str], body: bytes, endpoint: str, now: datetime | None = None
) -> LLMHTTPError:
    """The error for an HTTP error answer, with the OpenAI error body's type and code when there is one."""
    error_type = error_code = server_message = None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        fields = parsed["error"]
        error_type = fields["type"] if isinstance(fields.get("type"), str) else None
        error_code = fields["code"] if isinstance(fields.get("code"), str) else None
        server_message = fields["message"] if isinstance(fields.get("message"), str) else None
    if status >= 500:
        cls: type[LLMHTTPError] = LLMServerError
    else:
        cls = _STATUS_CLASSES.get(status, LLMBadRequestError)
    return cls(
        f"the model endpoint {endpoint} answered HTTP {status} (type={error_type}, code={error_code})",
        status=status,
        error_type=error_type,
        error_code=error_code,
        retry_after_s=parse_retry_after(headers, now),
        server_message=server_message,
        retryable=True if status == 408 else None,
    )
