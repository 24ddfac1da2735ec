"""Dispatching a managed tool call: the model's arguments go to the tool service, its answer comes back.

When the model calls a managed tool, the proxy POSTs the call's arguments (a JSON object) to the tool's endpoint
with the service's bearer, which only the proxy holds, and feeds the answer back to the model. Everything that can
go wrong on the way is an answer the model can read, not an exception: a tool service that is down, slow,
refuses the proxy's bearer, fails or answers garbage yields a :class:`ToolOutcome` with ``ok=False``, a stable
``error_code`` and a short JSON ``content`` such as::

    {"error":"tool_timeout","message":"the ticket-api.get_ticket tool did not answer within 30 s"}

so the conversation can go on and the dispatch can be recorded. Only cancellation propagates.

What never leaves this module: the bearer (redacted from anything a service sends back, absent from every log
record and ``repr``), the arguments and results in any log record (they carry task content), and more than
200 characters of a service's error body, cleaned of control characters. Redirects are never followed, so a
bearer cannot be replayed to another address, and cookies are never kept, so one service cannot plant state
that reaches another.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, Self

import aiohttp

from clawstack import __version__
from clawstack.common import strictjson
from clawstack.common.strictjson import StrictJSONError
from clawstack.proxy.tools import ToolCatalog, ToolService, ToolSpec

log = logging.getLogger(__name__)

ToolErrorCode = Literal[
    "tool_arguments_invalid",
    "tool_unavailable",
    "tool_timeout",
    "tool_unauthorized",
    "tool_failed",
    "tool_bad_response",
    "tool_not_allowed",
]

MAX_ARGUMENT_BYTES: Final = 1024 * 1024
MAX_DETAIL_CHARS: Final = 200
_ERROR_BODY_READ_BYTES: Final = 4096
_RESULT_MAX_DEPTH: Final = 64
_REDACTED: Final = "[redacted]"


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """How one dispatch ended: what to feed back to the model (``content``) and what to record.

    ``ok`` is true for a 2xx answer whose body was accepted; ``content`` is then the body text. Otherwise
    ``error_code`` says why and ``content`` is a short JSON object ``{"error", "message", ...}`` for the model.
    ``http_status`` is the service's status when it answered at all; ``duration_ms`` spans the whole dispatch.
    """

    qualified: str
    ok: bool
    content: str
    http_status: int | None
    error_code: ToolErrorCode | None
    duration_ms: float

    @classmethod
    def refused(cls, qualified: str) -> ToolOutcome:
        """The outcome of a call the proxy refuses without dispatching it: a tool outside the allowlist.

        ``qualified`` may be a name the model invented; it is shown cut to 100 characters.
        """
        shown = qualified if len(qualified) <= 100 else qualified[:100] + "…"
        return cls(
            qualified=qualified,
            ok=False,
            content=_error_content("tool_not_allowed", f"the {shown} tool is not available to this run"),
            http_status=None,
            error_code="tool_not_allowed",
            duration_ms=0.0,
        )


class _Failure(Exception):
    """Internal: a dispatch failed; carries what its outcome needs."""

    def __init__(self, code: ToolErrorCode, message: str, *, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.code: ToolErrorCode = code
        self.message = message
        self.status = status
        self.detail = detail


class ToolDispatcher:
    """Sends managed tool calls to their services over one aiohttp session.

    ``timeout_s`` bounds each dispatch from sending the request to the last byte of the answer;
    ``max_result_bytes`` bounds an accepted answer. Use it as an async context manager, or call :meth:`start`
    and :meth:`close`. The caller decides whether a call is allowed; :meth:`dispatch` only carries it out.
    """

    def __init__(self, catalog: ToolCatalog, *, timeout_s: float = 30.0, max_result_bytes: int = 65536) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive (seconds)")
        if max_result_bytes < 1:
            raise ValueError("max_result_bytes must be positive")
        self._catalog = catalog
        self._timeout_s = timeout_s
        self._max_result_bytes = max_result_bytes
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the session. Raises ``RuntimeError`` if it is already open."""
        if self._session is not None:
            raise RuntimeError("this ToolDispatcher is already started")
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),  # each dispatch has its own deadline scope
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # tool calls go straight to the configured service, never via an env proxy
            headers={"User-Agent": f"clawstack-proxy/{__version__}"},
        )

    async def close(self) -> None:
        """Close the session and its connections. Idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def dispatch(self, spec: ToolSpec, arguments: str) -> ToolOutcome:
        """Call ``spec`` with ``arguments`` (the model's JSON text, which must hold an object).

        Never raises for anything the model or the service did: every failure is a :class:`ToolOutcome` with
        ``ok=False``. Raises ``RuntimeError`` before :meth:`start`, ``ValueError`` for a spec that is not in this
        dispatcher's catalog, and lets cancellation propagate.
        """
        session = self._session
        if session is None:
            raise RuntimeError("start the ToolDispatcher before dispatching (`async with ToolDispatcher(...)`)")
        service = self._catalog.service(spec.service)
        if service is None or self._catalog.get(spec.qualified) != spec:
            raise ValueError(f"the tool {spec.qualified} is not in this dispatcher's catalog")
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            body = _check_arguments(spec, arguments)
            status, content = await self._call(session, service, spec, body)
        except _Failure as failure:
            duration_ms = (loop.time() - started) * 1000.0
            log.debug("tool %s: %s (HTTP %s) in %.1f ms", spec.qualified, failure.code, failure.status, duration_ms)
            extra: dict[str, object] = {}
            if failure.status is not None:
                extra["status"] = failure.status
            if failure.detail:
                extra["detail"] = failure.detail
            return ToolOutcome(
                qualified=spec.qualified,
                ok=False,
                content=_error_content(failure.code, failure.message, **extra),
                http_status=failure.status,
                error_code=failure.code,
                duration_ms=duration_ms,
            )
        duration_ms = (loop.time() - started) * 1000.0
        log.debug("tool %s: ok (HTTP %d) in %.1f ms", spec.qualified, status, duration_ms)
        return ToolOutcome(
            qualified=spec.qualified,
            ok=True,
            content=content,
            http_status=status,
            error_code=None,
            duration_ms=duration_ms,
        )

    async def _call(
        self, session: aiohttp.ClientSession, service: ToolService, spec: ToolSpec, body: bytes
    ) -> tuple[int, str]:
        """POST ``body`` and return the accepted answer, or raise :class:`_Failure`."""
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/*;q=0.9"}
        if service.bearer is not None:
            headers["Authorization"] = f"Bearer {service.bearer}"
        name = spec.qualified
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                session.post(service.base_url + spec.path, data=body, headers=headers, allow_redirects=False) as resp,
            ):
                return await self._answer(service, spec, resp)
        except TimeoutError as exc:
            log.info("tool %s did not answer within %g s", name, self._timeout_s)
            raise _Failure("tool_timeout", f"the {name} tool did not answer within {self._timeout_s:g} s") from exc
        except aiohttp.ClientConnectorError as exc:
            reason = exc.os_error.strerror or type(exc.os_error).__name__
            log.warning("tool service %s cannot be reached for %s: %s", spec.service, name, reason)
            raise _Failure(
                "tool_unavailable", f"the {name} tool could not be reached; it did not get the call"
            ) from exc
        except aiohttp.ClientResponseError as exc:  # aiohttp could not parse the answer as HTTP
            log.warning("tool service %s sent a malformed HTTP answer for %s", spec.service, name)
            raise _Failure("tool_bad_response", f"the {name} tool sent a malformed HTTP answer") from exc
        except (aiohttp.ClientError, OSError) as exc:  # after TimeoutError, itself an OSError
            log.warning("the connection to tool service %s broke during %s: %s", spec.service, name, type(exc).__name__)
            raise _Failure(
                "tool_unavailable",
                f"the connection to the {name} tool broke before it answered; the call may have taken effect",
            ) from exc

    async def _answer(self, service: ToolService, spec: ToolSpec, resp: aiohttp.ClientResponse) -> tuple[int, str]:
        name = spec.qualified
        status = resp.status
        if 200 <= status < 300:
            data = await _read_at_most(resp, self._max_result_bytes)
            if data is None:
                resp.close()  # the rest of an oversized body must not reach the connection pool
                raise _Failure(
                    "tool_bad_response",
                    f"the {name} tool answered with more than {self._max_result_bytes} bytes",
                    status=status,
                )
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise _Failure(
                    "tool_bad_response", f"the {name} tool answered with bytes that are not UTF-8 text", status=status
                ) from None
            if resp.content_type == "application/json" or resp.content_type.endswith("+json"):
                try:
                    strictjson.loads(data, max_bytes=self._max_result_bytes, max_depth=_RESULT_MAX_DEPTH)
                except StrictJSONError as exc:
                    raise _Failure(
                        "tool_bad_response",
                        f"the {name} tool declared a JSON answer but sent invalid JSON ({exc.code})",
                        status=status,
                    ) from None
            return status, _redact(text, service.bearer)
        if status in (401, 403):
            resp.close()
            _warn_unauthorized(service, spec, status)
            raise _Failure(
                "tool_unauthorized",
                f"the {name} tool refused the proxy's credentials (HTTP {status}); "
                "this needs an operator, a retry will not help",
                status=status,
            )
        detail = _sanitize(await _read_prefix(resp), service.bearer)
        resp.close()
        log.info("tool %s failed with HTTP %d", name, status)
        if 300 <= status < 400:
            message = f"the {name} tool answered with a redirect (HTTP {status}), which the proxy does not follow"
        else:
            message = f"the {name} tool failed with HTTP {status}"
        raise _Failure("tool_failed", message, status=status, detail=detail)


def _check_arguments(spec: ToolSpec, arguments: str) -> bytes:
    """The arguments as the bytes to send, once they are known to be one strict JSON object."""
    where = f"the arguments for the {spec.qualified} tool"
    try:
        data = arguments.encode("utf-8")
        value = strictjson.loads(data, max_bytes=MAX_ARGUMENT_BYTES)
    except UnicodeEncodeError:
        raise _Failure("tool_arguments_invalid", f"{where} are not valid Unicode text") from None
    except StrictJSONError as exc:
        raise _Failure("tool_arguments_invalid", f"{where} are not valid JSON: {exc.message}") from None
    if not isinstance(value, dict):
        raise _Failure("tool_arguments_invalid", f"{where} must be a JSON object, not {_json_kind(value)}")
    return data


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or ``None`` as soon as it is known to exceed ``limit`` bytes."""
    if resp.content_length is not None and resp.content_length > limit:
        return None
    buffer = bytearray()
    async for piece in resp.content.iter_any():
        buffer += piece
        if len(buffer) > limit:
            return None
    return bytes(buffer)


async def _read_prefix(resp: aiohttp.ClientResponse) -> bytes:
    """Up to a few KiB of an error body; whatever arrived if the connection breaks (the status says enough)."""
    buffer = bytearray()
    try:
        while len(buffer) < _ERROR_BODY_READ_BYTES:
            piece = await resp.content.read(_ERROR_BODY_READ_BYTES - len(buffer))
            if not piece:
                break
            buffer += piece
    except aiohttp.ClientError:
        pass  # a partial error body only loses detail; the status already says what happened
    return bytes(buffer)


def _redact(text: str, bearer: str | None) -> str:
    """Remove literal occurrences of the bearer: a service that echoes it must not hand it to the model."""
    return text.replace(bearer, _REDACTED) if bearer else text


def _sanitize(data: bytes, bearer: str | None) -> str:
    """At most :data:`MAX_DETAIL_CHARS` printable characters of an error body, bearer redacted."""
    text = _redact(data.decode("utf-8", "replace"), bearer)
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


def _warn_unauthorized(service: ToolService, spec: ToolSpec, status: int) -> None:
    env = service.descriptor.auth_env
    if env is None:
        log.warning(
            "tool service %s refused %s with HTTP %d, but its descriptor declares no auth",
            spec.service,
            spec.qualified,
            status,
        )
    else:
        log.warning(
            "tool service %s refused the proxy's bearer for %s with HTTP %d; check the value configured for %s",
            spec.service,
            spec.qualified,
            status,
            env,
        )


def _error_content(code: ToolErrorCode, message: str, **extra: object) -> str:
    return json.dumps({"error": code, "message": message, **extra}, ensure_ascii=False)


__all__ = ["MAX_ARGUMENT_BYTES", "MAX_DETAIL_CHARS", "ToolDispatcher", "ToolErrorCode", "ToolOutcome"]
