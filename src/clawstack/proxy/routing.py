"""Chain routing: try each entry of an identity's model chain in order until one serves.

An entry *cannot serve* (and the chain moves on) on a transport error, a 5xx, a first-byte timeout, a dead key
(401/402/403, or 429 with an exhausted quota), a rate limit (429, after which the key rests for ``Retry-After``,
capped), a key that is resting or dead already, a missing credential, or a plan route without a sign-in. A 400 (or
413/422) is the request's fault: it is returned at once, without trying another entry. The router commits to the
first entry whose answer begins: for a stream, once its first bytes arrived; after that nothing is retried,
because bytes may already be on their way to the worker.

When every entry failed, the error names the last failure class: ``504 upstream_timeout`` after a first-byte
timeout, ``429 upstream_rate_limited`` after a rate limit, ``502`` otherwise.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp

from clawstack import __version__
from clawstack.common.clock import Clock
from clawstack.proxy.config import Routing
from clawstack.proxy.errors import ProxyError, RequestError, UpstreamError
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.plan_route import FATAL_REASONS, PlanRoutes
from clawstack.proxy.providers import KeyHealth, Route, Upstreams
from clawstack.proxy.responses_api import ResponsesStreamTranslator
from clawstack.proxy.shapes import Shapes, chat_body, translator

log = logging.getLogger(__name__)

MAX_UPSTREAM_BODY_BYTES: Final = 32 * 1024 * 1024
MAX_ERROR_BODY_BYTES: Final = 64 * 1024
_SAFE_CODE: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_REQUEST_FAULT: Final = frozenset({400, 413, 422})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of one chain entry, as the trace journal and the identity's history see it."""

    slot: str
    ref: str
    upstream: str
    credential_class: str
    status: int | None
    failure: str | None
    started_at: datetime
    duration_ms: float
    first_byte_ms: float | None
    request_sha256: str | None


@dataclass(slots=True)
class Committed:
    """The upstream answer the router committed to: a 2xx whose first bytes (or whole body) arrived, always in
    Chat Completions form (a Responses answer is translated as it is read)."""

    entry: ChainEntry
    route: Route
    response: aiohttp.ClientResponse
    first: bytes
    started: float
    first_byte_ms: float
    request_sha256: str
    translator: ResponsesStreamTranslator | None = None

    async def next_chunk(self) -> bytes:
        """The next streamed bytes in Chat Completions form; ``b""`` at the end."""
        while True:
            raw = await self.response.content.readany()
            if self.translator is None or not raw:
                return raw
            try:
                out = self.translator.feed(raw)
            except ValueError as exc:
                raise aiohttp.ClientPayloadError("the upstream's event stream is malformed") from exc
            if out:
                return out


def _retry_after_s(value: str | None, now: datetime) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _upstream_code(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and _SAFE_CODE.fullmatch(value):
            return value
    return None


class ChainRouter:
    """Sends one request through a chain; see the module docstring for the rules."""

    def __init__(
        self,
        upstreams: Upstreams,
        health: KeyHealth,
        session: aiohttp.ClientSession,
        clock: Clock,
        routing: Routing,
        shapes: Shapes | None = None,
        plans: PlanRoutes | None = None,
    ) -> None:
        self.shapes = shapes or Shapes()
        self.plans = plans
        self._upstreams = upstreams
        self._health = health
        self._session = session
        self._clock = clock
        self._routing = routing

    async def send(
        self,
        entries: Sequence[ChainEntry],
        build: Callable[[ChainEntry, Route], Mapping[str, Any]],
        *,
        stream: bool,
        on_attempt: Callable[[Attempt], None],
    ) -> Committed:
        """Return the first entry's answer that begins; raise :class:`UpstreamError` when none can serve."""
        last = "no_route"
        for entry in entries:
            route = self._upstreams.resolve(entry.ref)
            started_at, started = self._clock.now(), self._clock.monotonic()
            failure: _Failure | None = None
            digest: str | None = None
            if route is None:
                failure = _Failure("no_route", None)
            elif route.plan and self.plans is None:
                failure = _Failure("subscription_signin_required", None)  # this proxy holds no plan sign-in
            elif route.plan:
                outcome = await self._serve_plan(entry, route, build(entry, route), stream, started)
                if isinstance(outcome, Committed):
                    return outcome
                failure = outcome
            elif route.api_key is None and not route.keyless:
                failure = _Failure("no_credential", None)
            elif (blocked := self._health.blocked(route.key_id)) is not None:
                failure = _Failure(blocked, None)
            else:
                outcome, digest = await self._serve(entry, route, build(entry, route), stream, on_attempt, started)
                if isinstance(outcome, Committed):
                    return outcome
                failure = outcome
            on_attempt(
                Attempt(
                    slot=entry.slot,
                    ref=entry.ref,
                    upstream=route.prefix if route else "-",
                    credential_class=route.credential_class if route else "-",
                    status=failure.status,
                    failure=failure.failure,
                    started_at=started_at,
                    duration_ms=(self._clock.monotonic() - started) * 1000,
                    first_byte_ms=None,
                    request_sha256=digest,
                )
            )
            if failure.fatal is not None:
                raise failure.fatal
            last = failure.failure
        raise _exhausted(last)

    async def _serve(
        self,
        entry: ChainEntry,
        route: Route,
        body: Mapping[str, Any],
        stream: bool,
        on_attempt: Callable[[Attempt], None],
        started: float,
    ) -> tuple[Committed | _Failure, str | None]:
        """Send ``body`` in the shape learned for the route; a rejection that teaches a shape is retried in the
        new shape, each kind once (the rejected try is an attempt of its own)."""
        while True:
            try:
                path, shaped = self.shapes.shape(route, body)
            except ValueError as exc:  # the worker's body has no equivalent in the Responses API
                refusal = UpstreamError(str(exc), code="invalid_request", status=400, retryable=False)
                return _Failure("bad_request", None, refusal), None
            except RequestError as exc:  # a field outside the shape's allowlist: never sent
                return _Failure("bad_request", None, exc), None
            payload = json.dumps(shaped, ensure_ascii=False, allow_nan=False).encode()
            digest = "sha256:" + hashlib.sha256(payload).hexdigest()
            translate = translator(route, self.shapes)
            started_at, tried = self._clock.now(), self._clock.monotonic()
            outcome = await self._try(route, path, payload, stream=stream, translate=translate)
            if isinstance(outcome, tuple):
                response, first, first_byte_ms = outcome
                return Committed(entry, route, response, first, started, first_byte_ms, digest, translate), digest
            if (
                outcome.rejection is None
                or self.shapes.learn(route, outcome.status or 0, outcome.rejection, shaped) is None
            ):
                return outcome, digest
            log.info(
                "upstream %s/%s refused the request's shape; retrying in the shape it accepts",
                route.prefix,
                route.model,
            )
            on_attempt(
                Attempt(
                    slot=entry.slot,
                    ref=entry.ref,
                    upstream=route.prefix,
                    credential_class=route.credential_class,
                    status=outcome.status,
                    failure="shape_rejected",
                    started_at=started_at,
                    duration_ms=(self._clock.monotonic() - tried) * 1000,
                    first_byte_ms=None,
                    request_sha256=digest,
                )
            )

    async def _serve_plan(
        self, entry: ChainEntry, route: Route, body: Mapping[str, Any], stream: bool, started: float
    ) -> Committed | _Failure:
        """One try of a plan route (see :mod:`clawstack.proxy.plan_route`); never with a key."""
        assert self.plans is not None
        answer = await self.plans.send(
            self._session, route.model, body, stream=stream, timeout_s=self._routing.first_byte_timeout_s
        )
        if isinstance(answer, str):
            fatal = None
            if answer in FATAL_REASONS:  # never moved to another billing path
                status = 400 if answer == "subscription_unsupported_request" else 403
                fatal = UpstreamError(
                    f"the plan route cannot serve this request ({answer})", code=answer, status=status
                )
            return _Failure(answer, None, fatal)
        first_byte_ms = (self._clock.monotonic() - started) * 1000
        if answer.body is not None:
            return Committed(entry, route, answer.response, answer.body, started, first_byte_ms, "-")
        translate = ResponsesStreamTranslator(model=route.model)
        first = translate.feed(answer.first)
        try:
            while not first and translate.failure is None:
                raw = await answer.response.content.readany()
                if not raw:
                    break
                first = translate.feed(raw)
        except (aiohttp.ClientError, OSError, ValueError):
            first = b""
        if not first:
            answer.response.close()
            return _Failure("subscription_unavailable", answer.response.status)
        return Committed(entry, route, answer.response, first, started, first_byte_ms, "-", translate)

    async def _try(
        self, route: Route, path: str, payload: bytes, *, stream: bool, translate: ResponsesStreamTranslator | None
    ) -> tuple[aiohttp.ClientResponse, bytes, float] | _Failure:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": f"clawstack-proxy/{__version__}",
        }
        if route.api_key is not None:
            headers["Authorization"] = f"Bearer {route.api_key}"
        started = self._clock.monotonic()
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(self._routing.first_byte_timeout_s):
                response = await self._session.post(
                    route.base_url + path, data=payload, headers=headers, allow_redirects=False
                )
                if 200 <= response.status < 300 and stream:
                    first = await response.content.readany()
                    while first and translate is not None:
                        out = translate.feed(first)
                        if out or translate.failure is not None:
                            first = out
                            break
                        first = await response.content.readany()
                    if not first:
                        raise aiohttp.ClientPayloadError("empty stream")
            first_byte_ms = (self._clock.monotonic() - started) * 1000
            if not 200 <= response.status < 300:
                return await self._classify(route, response)
            if not stream:
                first = await response.content.read(MAX_UPSTREAM_BODY_BYTES + 1)
                if len(first) > MAX_UPSTREAM_BODY_BYTES:
                    response.close()
                    return _Failure("response_too_large", response.status)
                first = chat_body(route, self.shapes, first)
            return response, first, first_byte_ms
        except ValueError:  # a Responses answer that is not a completed reply
            if response is not None:
                response.close()
            return _Failure("upstream_bad_response", response.status if response is not None else None)
        except TimeoutError:
            if response is not None:
                response.close()
            return _Failure("first_byte_timeout", None)
        except (aiohttp.ClientError, OSError):
            if response is not None:
                response.close()
            return _Failure("transport", None)

    async def _classify(self, route: Route, response: aiohttp.ClientResponse) -> _Failure:
        status = response.status
        try:
            body = await response.content.read(MAX_ERROR_BODY_BYTES)
        except (aiohttp.ClientError, OSError):
            body = b""
        finally:
            response.close()
        code = _upstream_code(body)
        if status in _REQUEST_FAULT:
            detail = f", code {code}" if code else ""
            return _Failure(
                "bad_request",
                status,
                UpstreamError(
                    f"the upstream refused the request (HTTP {status}{detail})",
                    code="upstream_bad_request",
                    status=400,
                    retryable=False,
                ),
                rejection=body,
            )
        if status in (401, 402, 403) or (status == 429 and code == "insufficient_quota"):
            log.warning("upstream key %s refused with HTTP %d; resting it as dead", route.key_id, status)
            self._health.mark_dead(route.key_id)
            return _Failure("key_dead", status)
        if status == 429:
            self._health.rest(route.key_id, _retry_after_s(response.headers.get("Retry-After"), self._clock.now()))
            return _Failure("rate_limited", status)
        if status >= 500:
            return _Failure("server_error", status)
        return _Failure("upstream_status", status)


@dataclass(frozen=True, slots=True)
class _Failure:
    failure: str
    status: int | None
    fatal: ProxyError | None = None
    rejection: bytes | None = None  # a request fault's body, which may teach a shape


def _exhausted(last: str) -> UpstreamError:
    message = f"no model in the chain could serve the request (last failure: {last})"
    if last == "first_byte_timeout":
        return UpstreamError(message, code="upstream_timeout", status=504)
    if last == "rate_limited":
        return UpstreamError(message, code="upstream_rate_limited", status=429)
    if last.startswith("subscription_"):
        return UpstreamError(message, code=last, status=502)
    return UpstreamError(message, code="upstream_unavailable", status=502)


__all__ = ["Attempt", "ChainRouter", "Committed"]
