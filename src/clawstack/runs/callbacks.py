"""The supervisor's callback sender: how ``start``, ``heartbeat`` and ``end`` reach the orchestrator.

The orchestrator's per-run credential is the only thing that authenticates a callback (the body is not signed), so
it travels only as ``Authorization: Bearer …`` to an origin that comes from configuration, never to a redirect
target, and never into a log line, an exception message or :attr:`CallbackResult.detail`. Bodies stay out of logs
as well: an ``end`` summary carries task output.

This module decides *how* a callback is delivered; the run lifecycle decides *when*, and records each callback's
state. A callback's fate is data, not an exception:

- 2xx: ``acked``.
- 401 or 403: ``rejected`` at once. The orchestrator's authority has ended
  (:attr:`CallbackResult.authority_ended`) and the caller tears the run down.
- 3xx: ``rejected`` at once. A redirect means the origin or path is misconfigured; it is never followed, so the
  bearer never reaches another URL.
- 408, 429, 5xx, a transport error or a timeout: retried with capped exponential backoff, then ``abandoned``.
- Any other status: ``rejected``; the orchestrator refused this callback.

``skipped`` is recorded by the lifecycle for a callback it chose not to send (no credential, or no ``end`` after a
cancel); :meth:`CallbackSender.send` never returns it. A heartbeat is tried at most twice: a missed heartbeat is
superseded by the next one. Backoff waits on the injected :class:`~clawstack.common.clock.Clock`; each attempt's
own deadline is real time, because it bounds real network I/O.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, get_args
from urllib.parse import quote, unquote

import aiohttp
import yarl

from clawstack.common.clock import Clock, SystemClock

__all__ = [
    "HEARTBEAT_MAX_ATTEMPTS",
    "SUMMARY_LIMIT_BYTES",
    "CallbackKind",
    "CallbackResult",
    "CallbackSender",
    "CallbackState",
    "CallbackTarget",
    "end_body",
    "run_body",
    "validate_origin",
    "validate_path_template",
]

logger = logging.getLogger(__name__)

CallbackKind = Literal["start", "heartbeat", "end"]
CallbackState = Literal["acked", "rejected", "abandoned", "skipped"]

SUMMARY_LIMIT_BYTES = 65536
"""The most UTF-8 bytes an ``end`` callback's ``summary`` carries."""

HEARTBEAT_MAX_ATTEMPTS = 2
"""A heartbeat is retried at most once: the next heartbeat supersedes a missed one."""

_KINDS: frozenset[str] = frozenset(get_args(CallbackKind))
_PLACEHOLDERS = frozenset({"installation", "run_id"})
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
# RFC 3986 path characters (pchar and "/") and %XX escapes: no query, no fragment, no spaces, no braces.
_PATH_LITERAL_RE = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})*")
_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOST_RE = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*")
_BEARER_RE = re.compile(r"[\x21-\x7e]+")
_DELTA_SECONDS_RE = re.compile(r"[0-9]{1,9}")
_LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_AUTHORITY_ENDED = frozenset({401, 403})
_RETRIED_STATUSES = frozenset({408, 429})
# An answer's body means nothing to the sender; it is read (so that a connection dropped mid-answer counts as a
# transport error) up to this bound and the rest discarded.
_DRAIN_LIMIT_BYTES = 65536


def validate_origin(origin: str) -> str:
    """Check a callback origin and return its canonical form (lower-case scheme and host, numeric port).

    An origin is ``http://`` or ``https://``, a host name or IP address (IPv6 in brackets) and an optional port,
    nothing else: no user information, path (not even a trailing ``/``), query or fragment. Raises
    :class:`ValueError` naming what is wrong; the message never repeats the origin, which might carry a password.
    """
    if not origin:
        raise ValueError("the callback origin is empty; expected http(s)://host[:port]")
    if not origin.isascii() or any(ch.isspace() or not ch.isprintable() for ch in origin):
        raise ValueError(
            "the callback origin must be printable ASCII without spaces (write a non-ASCII host name in its xn-- form)"
        )
    scheme, separator, rest = origin.partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in ("http", "https"):
        raise ValueError("the callback origin must start with http:// or https://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if authority != rest:
        raise ValueError(
            "the callback origin must not have a path, query or fragment (not even a trailing '/'); "
            "put the path in the callback path template"
        )
    if "@" in authority:
        raise ValueError(
            "the callback origin must not carry user information; the per-run credential is the only authentication"
        )
    host, port = _split_authority(authority)
    canonical = f"{scheme}://{host}"
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("the callback origin's port must be a number from 1 to 65535")
        canonical += f":{int(port)}"
    return canonical


def _split_authority(authority: str) -> tuple[str, str | None]:
    """Split ``host[:port]`` into a canonical host and the raw port text (``None`` when absent)."""
    if authority.startswith("["):
        literal, bracket, after = authority[1:].partition("]")
        try:
            address = ipaddress.IPv6Address(literal) if bracket else None
        except ValueError:
            address = None
        if address is None:
            raise ValueError("the callback origin's bracketed host must be an IPv6 address such as [::1]")
        host = f"[{address.compressed}]"
    else:
        host, colon, port_text = authority.partition(":")
        after = colon + port_text
        if not host:
            raise ValueError("the callback origin needs a host, as in https://orchestrator.internal")
        if not _HOST_RE.fullmatch(host):
            raise ValueError("the callback origin's host is not a valid host name or IP address")
        host = host.lower()
    if not after:
        return host, None
    if not after.startswith(":"):
        raise ValueError("the callback origin has text after its host that is not a port")
    return host, after[1:]


def validate_path_template(template: str) -> str:
    """Check a callback path template and return it unchanged.

    A template starts with ``/``, does not end with one (the supervisor appends ``/start``, ``/heartbeat`` or
    ``/end``), holds only URL path characters and ``%XX`` escapes, has no empty or dot segments, and uses no
    placeholder but ``{installation}`` and ``{run_id}``. Raises :class:`ValueError` naming what is wrong.
    """
    if not template.startswith("/"):
        raise ValueError("the callback path template must start with '/', as in /api/runs/{run_id}")
    if template.endswith("/"):
        raise ValueError(
            "the callback path template must not end with '/': the supervisor appends /start, /heartbeat and /end"
        )
    pieces = _PLACEHOLDER_RE.split(template)
    for index, piece in enumerate(pieces):
        if index % 2:
            if piece not in _PLACEHOLDERS:
                raise ValueError(
                    f"unknown placeholder {{{piece}}} in the callback path template; "
                    "only {installation} and {run_id} are allowed"
                )
        elif "{" in piece or "}" in piece:
            raise ValueError("the callback path template has an unbalanced '{' or '}'")
        elif not _PATH_LITERAL_RE.fullmatch(piece):
            raise ValueError(
                "the callback path template may hold only URL path characters "
                "(letters, digits, -._~!$&'()*+,;=:@/ and %XX escapes): no spaces, query or fragment"
            )
    _check_segments(template.split("/")[1:], "the callback path template")
    return template


def _check_segments(segments: list[str], what: str) -> None:
    for segment in segments:
        if segment == "":
            raise ValueError(f"{what} has an empty path segment ('//')")
        if unquote(segment) in (".", ".."):
            raise ValueError(f"{what} has a '.' or '..' path segment")


@dataclass(frozen=True, slots=True)
class CallbackTarget:
    """Where callbacks go: an origin and a path template, both from configuration, never from a caller.

    Both are validated (:func:`validate_origin`, :func:`validate_path_template`) on construction, and the origin
    is stored in its canonical form.
    """

    origin: str
    path_template: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "origin", validate_origin(self.origin))
        object.__setattr__(self, "path_template", validate_path_template(self.path_template))

    def url(self, kind: CallbackKind, installation: str, run_id: str) -> str:
        """``{origin}{path}/{kind}`` with ``installation`` and ``run_id`` percent-escaped as path segments.

        Every character outside ``A-Za-z0-9_.-~`` is escaped, ``/`` included, so a value can never add a segment.
        Raises :class:`ValueError` for an unknown kind, or a value that would leave an empty or dot segment.
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown callback kind {kind!r}; expected start, heartbeat or end")
        values = {"installation": installation, "run_id": run_id}
        path = _PLACEHOLDER_RE.sub(lambda match: quote(values[match.group(1)], safe=""), self.path_template)
        _check_segments(path.split("/")[1:], "the callback path for this run")
        return f"{self.origin}{path}/{kind}"


def run_body(*, installation: str, run_id: str, generation: int) -> dict[str, Any]:
    """The body of the ``start`` and ``heartbeat`` callbacks, and the first three fields of ``end``."""
    if not isinstance(installation, str) or not installation:
        raise ValueError("a callback body needs a non-empty installation")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("a callback body needs a non-empty run_id")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise ValueError("a callback body's generation is a positive integer")
    return {"installation": installation, "run_id": run_id, "generation": generation}


def end_body(
    *,
    installation: str,
    run_id: str,
    generation: int,
    outcome: Literal["succeeded", "failed"],
    reason: str,
    summary: str,
    stored_result_truncated: bool,
    result_outcome: str | None = None,
    session: str | None = None,
    served_by: Mapping[str, int] | None = None,
    served_by_complete: bool | None = None,
    last_plan_failure: str | None = None,
) -> dict[str, Any]:
    """The body of the ``end`` callback in the spec's shape: the stateless fields always, the task-home fields
    only when given (``result_outcome`` and ``session`` for a task-home run with a result; the proxy's
    ``served_by`` report for a task-home run).

    ``summary`` is cut to at most :data:`SUMMARY_LIMIT_BYTES` bytes of UTF-8 at a character boundary (a lone
    surrogate, which UTF-8 cannot carry, becomes U+FFFD first); ``summary_truncated`` is true if the stored result
    was truncated or this cut shortened it. ``reason`` is empty on success and the failure code otherwise.

    The task-home fields appear only when given: ``result_outcome`` (``answer`` or ``question``) and ``session``
    together, for a task-home run that has a result; ``served_by`` and ``served_by_complete`` together, with
    ``last_plan_failure`` when there was one, when the proxy reported them. Raises :class:`ValueError` for a
    combination the spec does not allow.
    """
    body = run_body(installation=installation, run_id=run_id, generation=generation)
    if outcome not in ("succeeded", "failed"):
        raise ValueError("an end callback's outcome is succeeded or failed")
    if outcome == "succeeded" and reason:
        raise ValueError("an end callback's reason is empty when the run succeeded")
    if outcome == "failed" and not reason:
        raise ValueError("an end callback's reason is the failure code when the run failed")
    text, cut = _cut_summary(summary)
    body.update(outcome=outcome, reason=reason, summary=text, summary_truncated=stored_result_truncated or cut)

    if (result_outcome is None) != (session is None):
        raise ValueError("result_outcome and session go together: both for a task-home run with a result, or neither")
    if result_outcome is not None:
        if result_outcome not in ("answer", "question"):
            raise ValueError("result_outcome is answer or question")
        body.update(result_outcome=result_outcome, session=session)

    if (served_by is None) != (served_by_complete is None):
        raise ValueError("served_by and served_by_complete go together: the proxy reports both, or neither")
    if last_plan_failure is not None and served_by is None:
        raise ValueError("last_plan_failure is part of the proxy's report: give it with served_by")
    if served_by is not None:
        counts = dict(served_by)
        for credential_class, count in counts.items():
            if not isinstance(credential_class, str) or isinstance(count, bool) or not isinstance(count, int):
                raise ValueError("served_by maps credential classes to counts of model calls")
            if count < 0:
                raise ValueError("served_by counts are never negative")
        body.update(served_by=counts, served_by_complete=bool(served_by_complete))
    if last_plan_failure is not None:
        body["last_plan_failure"] = last_plan_failure
    return body


def _cut_summary(summary: str) -> tuple[str, bool]:
    """``summary`` within :data:`SUMMARY_LIMIT_BYTES` of UTF-8, and whether it had to be cut."""
    try:
        data = summary.encode("utf-8")
    except UnicodeEncodeError:
        summary = _LONE_SURROGATE_RE.sub("\ufffd", summary)
        data = summary.encode("utf-8")
    if len(data) <= SUMMARY_LIMIT_BYTES:
        return summary, False
    # The text was valid UTF-8, so only the character the cut split can be incomplete; "ignore" drops just that.
    return data[:SUMMARY_LIMIT_BYTES].decode("utf-8", errors="ignore"), True


@dataclass(frozen=True, slots=True)
class CallbackResult:
    """How one callback ended: its state, the last HTTP status (``None`` if none arrived), how many requests were
    made, and a human ``detail``. ``detail`` names statuses and error types only, never the credential or body."""

    state: CallbackState
    status: int | None
    attempts: int
    detail: str

    @property
    def authority_ended(self) -> bool:
        """True when the orchestrator answered 401 or 403: its authority over the run has ended."""
        return self.state == "rejected" and self.status in _AUTHORITY_ENDED


@dataclass(frozen=True, slots=True)
class _Attempt:
    outcome: Literal["acked", "rejected", "retry"]
    status: int | None
    detail: str
    retry_after_s: float | None = None


def _new_session() -> aiohttp.ClientSession:
    """The default HTTP session: no cookie jar (an orchestrator's cookies are not echoed back), no proxy from the
    environment (callbacks go straight to the configured origin), and no session-wide timeout (each attempt has
    its own deadline)."""
    return aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),
        trust_env=False,
    )


class CallbackSender:
    """Delivers callbacks to one :class:`CallbackTarget` over one HTTP session.

    ``timeout_s`` bounds each attempt, from connecting to the end of the answer. After a retryable failure it
    waits ``backoff_initial_s``, doubling each time up to ``backoff_max_s``; with ``jitter`` each wait is drawn
    from its upper half. A ``Retry-After`` in seconds on a retried answer lengthens the wait, never beyond
    ``backoff_max_s``. After ``max_attempts`` requests (two for a heartbeat) the callback is ``abandoned``. Use as
    an async context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        target: CallbackTarget,
        *,
        clock: Clock | None = None,
        timeout_s: float = 10.0,
        max_attempts: int = 8,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        jitter: bool = True,
        session_factory: Callable[[], aiohttp.ClientSession] = _new_session,
    ) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError("timeout_s must be a positive number of seconds")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not (math.isfinite(backoff_initial_s) and backoff_initial_s >= 0):
            raise ValueError("backoff_initial_s must be zero or a positive number of seconds")
        if not (math.isfinite(backoff_max_s) and backoff_max_s >= backoff_initial_s):
            raise ValueError("backoff_max_s must be at least backoff_initial_s")
        self._target = target
        self._clock = clock if clock is not None else SystemClock()
        self._timeout_s = timeout_s
        self._max_attempts = max_attempts
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._jitter = jitter
        self._random = random.SystemRandom()
        self._session_factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"CallbackSender({self._target.origin}{self._target.path_template})"

    @property
    def target(self) -> CallbackTarget:
        """Where this sender delivers."""
        return self._target

    async def send(self, kind: CallbackKind, credential: str, body: Mapping[str, Any]) -> CallbackResult:
        """POST ``body`` as JSON to the target's URL for ``kind``, with ``credential`` as the bearer.

        The URL's ``installation`` and ``run_id`` come from ``body`` (every callback body carries them). Returns
        when the callback is acked, rejected or abandoned; cancelling the caller cancels the request or the
        backoff wait at once. A credential that cannot be a bearer token (empty, or not printable ASCII) is
        ``rejected`` without a request. Raises :class:`ValueError` for a body that is not JSON text or lacks
        ``installation`` or ``run_id``, and :class:`RuntimeError` after :meth:`close`.
        """
        if self._closed:
            raise RuntimeError("the callback sender is closed")
        url = self._target.url(kind, _body_text(body, "installation"), _body_text(body, "run_id"))
        payload = _encode(kind, body)
        if not _BEARER_RE.fullmatch(credential):
            detail = "the held credential is not a usable bearer token (empty, or not printable ASCII); nothing sent"
            logger.warning("callback %s to %s not sent: %s", kind, url, detail)
            return CallbackResult(state="rejected", status=None, attempts=0, detail=detail)
        headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
        limit = min(self._max_attempts, HEARTBEAT_MAX_ATTEMPTS) if kind == "heartbeat" else self._max_attempts
        if self._session is None:
            self._session = self._session_factory()
        session = self._session

        attempts = 0
        while True:
            attempts += 1
            attempt = await self._attempt(session, url, headers, payload)
            if attempt.outcome != "retry":
                result = CallbackResult(attempt.outcome, attempt.status, attempts, attempt.detail)
                level = logging.DEBUG if result.state == "acked" else logging.WARNING
                logger.log(level, "callback %s to %s %s: %s", kind, url, result.state, result.detail)
                return result
            if attempts >= limit:
                plural = "s" if attempts != 1 else ""
                detail = f"abandoned after {attempts} attempt{plural}; last: {attempt.detail}"
                logger.warning("callback %s to %s %s", kind, url, detail)
                return CallbackResult("abandoned", attempt.status, attempts, detail)
            delay_s = self._delay_s(attempts, attempt.retry_after_s)
            logger.info(
                "callback %s to %s attempt %d failed (%s); retrying in %.3g s",
                kind,
                url,
                attempts,
                attempt.detail,
                delay_s,
            )
            await self._clock.sleep(delay_s)

    async def _attempt(
        self, session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], payload: bytes
    ) -> _Attempt:
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                # encoded=True: the path is escaped already and goes on the wire exactly as built.
                session.post(
                    yarl.URL(url, encoded=True), data=payload, headers=headers, allow_redirects=False
                ) as answer,
            ):
                await _drain(answer)
                status = answer.status
                retry_after_s = _retry_after_s(answer.headers.get("Retry-After"))
        except TimeoutError:
            return _Attempt("retry", None, f"no complete answer within {self._timeout_s:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            # The type only: an exception's text can quote the request it failed on.
            return _Attempt("retry", None, f"transport error ({type(exc).__name__})")
        return _classify(status, retry_after_s)

    def _delay_s(self, failures: int, retry_after_s: float | None) -> float:
        """The wait after the ``failures``-th failed attempt."""
        delay_s = min(self._backoff_max_s, self._backoff_initial_s * 2.0 ** min(failures - 1, 64))
        if self._jitter:
            delay_s *= 0.5 + 0.5 * self._random.random()
        if retry_after_s is not None:
            delay_s = max(delay_s, min(retry_after_s, self._backoff_max_s))
        return delay_s

    async def close(self) -> None:
        """Close the HTTP session. Idempotent; :meth:`send` refuses afterwards."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> CallbackSender:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


def _body_text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise ValueError(f"a callback body needs a string {name!r}")
    return value


def _encode(kind: str, body: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError):
        # "from None": the encoder's error can quote the body, and an end summary carries task output.
        raise ValueError(
            f"the {kind} callback body is not JSON text (strings, finite numbers, booleans, null, lists, objects)"
        ) from None


async def _drain(answer: aiohttp.ClientResponse) -> None:
    remaining = _DRAIN_LIMIT_BYTES
    while remaining > 0:
        chunk = await answer.content.read(remaining)
        if not chunk:
            return
        remaining -= len(chunk)


def _retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` given in seconds; the HTTP-date form is ignored (plain backoff applies)."""
    if value is None or not _DELTA_SECONDS_RE.fullmatch(value.strip()):
        return None
    return float(value.strip())


def _classify(status: int, retry_after_s: float | None) -> _Attempt:
    if 200 <= status < 300:
        return _Attempt("acked", status, f"HTTP {status}")
    if 300 <= status < 400:
        return _Attempt(
            "rejected",
            status,
            f"HTTP {status}: a redirect, not followed; the callback origin or path template is misconfigured",
        )
    if status in _AUTHORITY_ENDED:
        return _Attempt("rejected", status, f"HTTP {status}: the orchestrator's authority over this run has ended")
    if status in _RETRIED_STATUSES or 500 <= status < 600:
        return _Attempt("retry", status, f"HTTP {status}", retry_after_s)
    return _Attempt("rejected", status, f"HTTP {status}: the orchestrator refused the callback")
