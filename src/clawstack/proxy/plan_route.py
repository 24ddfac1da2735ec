"""Serving a ``chatgpt/<model>`` chain entry from the operator's plan sign-in.

The request is the worker's Chat Completions body in the Responses API's shape the plan backend requires
(:func:`~clawstack.proxy.plan.chatgpt.shape_plan_request`: no temperature, top_p or output-token limit, always
streamed, never stored, no hosted tool), holding only the plan shape's allowlisted fields
(:func:`~clawstack.proxy.request_guard.check_outgoing`). The access token comes from :class:`~clawstack.proxy.plan.PlanTokens`,
which re-reads the sign-in store, so a new ``claw proxy auth login`` is used from the next request, and refreshes
it; a 401 forces one refresh and one retry. No key is ever used here.

When the route cannot serve it reports one of the five reasons of the spec's table. ``limit_reached`` rests the
route until the backend's reset time (else ``limit_rest_s``, 15 minutes by default); ``not_eligible`` and
``unsupported_request`` end the request: they never move it to another billing path. A non-streamed worker
request is answered once the plan's reply completed (``response.completed``); a reply cut before that is
``subscription_unavailable``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import aiohttp

from clawstack.common.clock import Clock
from clawstack.common.ids import new_id
from clawstack.llm.sse import SSEDecoder
from clawstack.proxy.config import PlanRoute, ProxyConfig
from clawstack.proxy.errors import RequestError
from clawstack.proxy.plan import AuthStore, PlanError, PlanTokens, plan_ssl_context
from clawstack.proxy.plan.chatgpt import (
    classify_plan_failure,
    limit_reset_s,
    plan_headers,
    responses_url,
    shape_plan_request,
)
from clawstack.proxy.request_guard import check_outgoing
from clawstack.proxy.responses_api import chat_to_responses, responses_to_chat

FATAL_REASONS: Final = frozenset({"subscription_not_eligible", "subscription_unsupported_request"})
MAX_PLAN_BODY_BYTES: Final = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PlanAnswer:
    """A plan reply that began: a streamed response, or a completed one already read (``body``)."""

    response: aiohttp.ClientResponse
    first: bytes
    body: bytes | None = None


class PlanRoutes:
    """The proxy's plan routes: the sign-in store, tokens, TLS and the rest after a spent plan."""

    def __init__(self, config: ProxyConfig, clock: Clock) -> None:
        assert config.auth_dir is not None
        self.settings: PlanRoute = config.plan_routes.get("chatgpt") or PlanRoute()
        self.ssl: ssl.SSLContext = plan_ssl_context(self.settings)
        self.store = AuthStore(Path(config.auth_dir))
        self.tokens = PlanTokens(self.store, issuer=self.settings.issuer, ssl_context=self.ssl, clock=clock)
        self._clock = clock

    async def close(self) -> None:
        await self.tokens.aclose()

    def subscriptions(self) -> list[dict[str, str]]:
        """``GET /v1/subscriptions``: each provider's state, account and rest; never a token."""
        return [self.tokens.state("chatgpt")]

    async def send(
        self, session: aiohttp.ClientSession, model: str, body: Mapping[str, Any], *, stream: bool, timeout_s: float
    ) -> PlanAnswer | str:
        """Send ``body`` (Chat Completions, its model already ``model``); the answer, or the reason it failed."""
        until = self.tokens.limited_until("chatgpt")
        if until is not None and until > self._clock.now():
            return "subscription_limit_reached"
        try:
            shaped = shape_plan_request(chat_to_responses(body))
            check_outgoing("plan", shaped)
        except PlanError as exc:
            return exc.reason
        except (ValueError, RequestError):
            return "subscription_unsupported_request"
        payload = json.dumps(shaped).encode()
        for force in (False, True):
            try:
                access, account = await self.tokens.access("chatgpt", force=force)
            except PlanError as exc:
                return exc.reason
            headers = plan_headers(access, account, new_id("sess_"))
            try:
                response = await session.post(
                    responses_url(self.settings.base_url),
                    data=payload,
                    headers=headers,
                    ssl=self.ssl,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(sock_connect=timeout_s, sock_read=timeout_s),
                )
            except (aiohttp.ClientError, OSError, TimeoutError):
                return "subscription_unavailable"
            if response.status == 401 and not force:
                response.close()
                continue  # one forced refresh, one retry
            if not 200 <= response.status < 300:
                return await self._refused(response)
            return await self._answer(response, stream=stream)
        return "subscription_signin_required"

    async def _refused(self, response: aiohttp.ClientResponse) -> str:
        try:
            error = await response.content.read(64 * 1024)
        except (aiohttp.ClientError, OSError):
            error = b""
        finally:
            response.close()
        reason = classify_plan_failure(response.status, error)
        if reason == "subscription_limit_reached":
            delay = limit_reset_s(error)
            seconds = delay if delay is not None and delay > 0 else self.settings.limit_rest_s
            await self.tokens.rest("chatgpt", self._clock.now() + timedelta(seconds=seconds))
        return reason

    async def _answer(self, response: aiohttp.ClientResponse, *, stream: bool) -> PlanAnswer | str:
        try:
            if stream:
                first = await response.content.readany()
                if not first:
                    response.close()
                    return "subscription_unavailable"
                return PlanAnswer(response, first)
            raw = await response.content.read(MAX_PLAN_BODY_BYTES + 1)
        except (aiohttp.ClientError, OSError, TimeoutError):
            response.close()
            return "subscription_unavailable"
        response.release()
        completed = _completed_response(raw)
        if completed is None:
            return _stream_failure(raw)
        try:
            chat = responses_to_chat(completed, model=str(completed.get("model") or "chatgpt"))
        except ValueError:
            return "subscription_unavailable"
        return PlanAnswer(response, b"", json.dumps(chat, ensure_ascii=False).encode())


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    try:
        for event in SSEDecoder().feed(raw):
            data = json.loads(event.data)
            if isinstance(data, dict):
                out.append(data)
    except ValueError:
        return out
    return out


def _completed_response(raw: bytes) -> dict[str, Any] | None:
    """The ``response`` of the stream's ``response.completed`` event: a reply counts only once it completed."""
    for event in _events(raw):
        if event.get("type") == "response.completed" and isinstance(event.get("response"), dict):
            return event["response"]  # type: ignore[no-any-return]
    return None


def _stream_failure(raw: bytes) -> str:
    for event in _events(raw):
        if event.get("type") in ("response.failed", "error"):
            return classify_plan_failure(200, json.dumps(event).encode())
    return "subscription_unavailable"


__all__ = ["FATAL_REASONS", "PlanAnswer", "PlanRoutes"]
