"""The webhook channel: a signed local HTTP channel adapter, inbound and outbound.

A bridge (a chat system's connector, a test, ``curl``) POSTs each message a person sends to
``channels.webhook.path``; the gateway runs it as an agent turn (or a plugin command) on the sender's session and
POSTs the answer to ``channels.webhook.outbound.url``. ``docs/gateway-webhook.md`` is the user's guide.

Signing, both directions: ``X-Claw-Timestamp: <unix seconds>`` and
``X-Claw-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>." + raw body)>`` (:func:`sign`). An inbound request
whose signature does not match, or whose timestamp is more than ``maxSkewSeconds`` away from the gateway's clock,
is refused before anything is recorded. A signed request makes its ``sender.id`` a *verified sender*.

Authority: a verified sender passes the channel's command authorization when ``allowFrom`` names it (or ``"*"``);
such a request is ``authenticated``. It carries operator authority only when it is authenticated *and* a channel
identity link (``operators[].links[] {channel: "webhook", id}``) ties the sender to an operator whose roles grant
``operator.admin`` now. Everyone else carries none (``Requester.operator is None``).

Errors (all :class:`~clawstack.gateway.errors.GatewayError`; ``status`` is the HTTP answer)::

    GatewayError
     └── WebhookError                  webhook_error
          ├── WebhookAuthError         webhook_unauthorized     401  headers missing or malformed, stale, bad HMAC
          ├── WebhookBodyTooLargeError webhook_body_too_large   413  past MAX_BODY_BYTES
          └── WebhookBodyError         webhook_body_invalid     400  not JSON, breaks the body schema, bad ids

Messages name the rule that failed; they never quote the secret, a signature or the message text.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from pydantic.alias_generators import to_camel

from clawstack.common.clock import Clock
from clawstack.gateway.authority import OperatorAuthority
from clawstack.gateway.config import GatewayConfig, WebhookChannelConfig
from clawstack.gateway.dispatch import Requester, RunRequest
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import SessionKeyError, channel_key, parse_session_key, thread_key
from clawstack.gateway.protocol import ProtocolError

__all__ = [
    "CHANNEL_NAME",
    "DEFAULT_RETRY_DELAYS_S",
    "MAX_BODY_BYTES",
    "SIGNATURE_HEADER",
    "SIGNATURE_VERSION",
    "TIMESTAMP_HEADER",
    "InboundMessage",
    "WebhookAuthError",
    "WebhookBodyError",
    "WebhookBodyTooLargeError",
    "WebhookChannel",
    "WebhookError",
    "WebhookMessage",
    "WebhookSender",
    "message_run_id",
    "parse_message",
    "sign",
    "signed_headers",
    "verify",
]

#: The channel's name in session keys, identity links and :class:`Requester.channel`.
CHANNEL_NAME: Final = "webhook"
TIMESTAMP_HEADER: Final = "X-Claw-Timestamp"
SIGNATURE_HEADER: Final = "X-Claw-Signature"
SIGNATURE_VERSION: Final = "v1"
#: The largest inbound body accepted.
MAX_BODY_BYTES: Final = 256 * 1024
#: The waits before the second, third and fourth attempt of an outbound POST (connection error or 5xx).
DEFAULT_RETRY_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 2.0)
#: How long :meth:`WebhookChannel.aclose` lets deliveries in flight finish before cancelling them.
_CLOSE_GRACE_S: Final = 2.0

_TIMESTAMP_RE: Final = re.compile(r"[0-9]{1,12}")
_SIGNATURE_RE: Final = re.compile(r"v1=([0-9a-f]{64})")
_RUN_ID_PREFIX: Final = f"{CHANNEL_NAME}:"

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------------------
# Errors


class WebhookError(GatewayError):
    """Root of the webhook channel's errors; ``status`` is the HTTP status the inbound request gets."""

    code = "webhook_error"
    status: ClassVar[int] = 400


class WebhookAuthError(WebhookError):
    """The request is not signed with the channel's secret, or its timestamp is outside the allowed skew."""

    code = "webhook_unauthorized"
    status = 401


class WebhookBodyTooLargeError(WebhookError):
    """The body is larger than :data:`MAX_BODY_BYTES`."""

    code = "webhook_body_too_large"
    status = 413


class WebhookBodyError(WebhookError):
    """The body is not a JSON object of the message schema, or an id breaks the session-key segment grammar."""

    code = "webhook_body_invalid"


# --------------------------------------------------------------------------------------------------------------------
# Signatures


def sign(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>``, the ``X-Claw-Signature`` value."""
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    digest = hmac.new(key, f"{timestamp}.".encode("ascii") + body, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={digest}"


def signed_headers(secret: str | bytes, body: bytes, *, timestamp: int) -> dict[str, str]:
    """The headers of a signed request carrying ``body`` (JSON) at ``timestamp`` (unix seconds)."""
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }


def verify(
    secret: str | bytes,
    *,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    now_s: float,
    max_skew_s: float,
) -> None:
    """Check a request's ``X-Claw-Timestamp`` and ``X-Claw-Signature``; raise :class:`WebhookAuthError` if wrong.

    The signature is compared in constant time; the timestamp must be within ``max_skew_s`` of ``now_s`` either way.
    """
    if not timestamp or not signature:
        raise WebhookAuthError(f"the {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} headers are required")
    if _TIMESTAMP_RE.fullmatch(timestamp) is None:
        raise WebhookAuthError(f"{TIMESTAMP_HEADER} must be unix seconds (digits only)")
    if abs(now_s - int(timestamp)) > max_skew_s:
        raise WebhookAuthError(f"{TIMESTAMP_HEADER} is more than {max_skew_s:g} seconds from the gateway's clock")
    offered = _SIGNATURE_RE.fullmatch(signature.strip().lower())
    if offered is None:
        raise WebhookAuthError(f"{SIGNATURE_HEADER} must be {SIGNATURE_VERSION}=<64 hex digits>")
    expected = sign(secret, timestamp, body).removeprefix(f"{SIGNATURE_VERSION}=")
    if not hmac.compare_digest(offered.group(1).encode("ascii"), expected.encode("ascii")):
        raise WebhookAuthError(f"{SIGNATURE_HEADER} does not match the body")


# --------------------------------------------------------------------------------------------------------------------
# The inbound body


class _Body(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, alias_generator=to_camel, hide_input_in_errors=True
    )


class WebhookSender(_Body):
    """``sender``: the verified sender's id on the bridge's side (a session-key segment) and a display name."""

    id: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    name: Annotated[StrictStr, Field(max_length=128)] | None = None


class WebhookMessage(_Body):
    """An inbound message: ``{messageId, sender: {id, name?}, text, threadId?}``; unknown keys are refused."""

    message_id: Annotated[StrictStr, Field(pattern=r"^[\x21-\x7e]{1,128}$")]
    sender: WebhookSender
    text: Annotated[StrictStr, Field(min_length=1)]
    thread_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError("duplicate key")
        result[key] = value
    return result


def _refuse_constant(_name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def parse_message(raw: bytes) -> WebhookMessage:
    """Parse an inbound body; raise :class:`WebhookBodyError` naming the key at fault (never quoting values)."""
    # Raised outside the ``except`` blocks, so that neither the JSON parser's nor pydantic's error, which may quote
    # the text, travels along as context.
    problem: str | None = None
    try:
        document = json.loads(raw, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError):
        problem = "the body is not a JSON object (UTF-8, no duplicate keys)"
    if problem is None:
        if not isinstance(document, dict):
            problem = "the body is not a JSON object (UTF-8, no duplicate keys)"
        else:
            try:
                return WebhookMessage.model_validate(document)
            except ValidationError as exc:
                problem = _describe_validation(exc)
    raise WebhookBodyError(problem)


def _describe_validation(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "the body"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key"
    if kind == "missing":
        return f"{where}: required"
    if kind == "string_type":
        return f"{where}: must be a string"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where}: must be an object"
    if kind == "string_too_short":
        return f"{where}: must not be empty"
    if kind == "string_too_long":
        return f"{where}: is too long"
    if kind == "string_pattern_mismatch":
        return f"{where}: must be 1 to 128 visible ASCII characters"
    return f"{where}: is not valid"


def message_run_id(message_id: str) -> str:
    """The run id (and idempotency key) of the run a message starts: ``webhook:<messageId>``."""
    return _RUN_ID_PREFIX + message_id


# --------------------------------------------------------------------------------------------------------------------
# The adapter


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A verified, parsed inbound message with its session, its requester and the run it asks for."""

    message: WebhookMessage
    session_key: str
    requester: Requester
    run_request: RunRequest

    @property
    def text(self) -> str:
        return self.message.text


class WebhookChannel:
    """The webhook channel adapter: verifies inbound messages and POSTs replies (a ``ChannelOutbox``).

    ``config`` is the gateway's config (``channels.webhook`` and the operators' identity links are read at each
    message, so authority is the current one); ``clock`` gives the time signatures are checked and made at, and
    the waits between outbound attempts (``retry_delays_s``, default :data:`DEFAULT_RETRY_DELAYS_S`).
    Outbound POSTs run as tasks the adapter owns: a slow receiver never holds a run; :meth:`aclose` lets them
    finish for a short grace period, then cancels them.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Clock,
        retry_delays_s: Sequence[float] | None = None,
        authority: OperatorAuthority | None = None,
    ) -> None:
        self._config = config
        self._authority = authority if authority is not None else OperatorAuthority.from_config(config)
        self._clock = clock
        self._retry_delays_s = tuple(DEFAULT_RETRY_DELAYS_S if retry_delays_s is None else retry_delays_s)
        self._session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def settings(self) -> WebhookChannelConfig:
        """``channels.webhook``."""
        return self._config.channels.webhook

    # -- inbound -------------------------------------------------------------------------------------------------

    async def receive(self, request: web.Request) -> InboundMessage:
        """Read, verify and parse one inbound request; raise a :class:`WebhookError` (with its status) if refused."""
        settings = self.settings
        secret = settings.secret
        if secret is None:  # parse_config requires it when the channel is enabled
            raise WebhookAuthError("the webhook channel has no secret")
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise WebhookBodyTooLargeError(f"the body is larger than {MAX_BODY_BYTES} bytes")
        raw = await request.content.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise WebhookBodyTooLargeError(f"the body is larger than {MAX_BODY_BYTES} bytes")
        verify(
            secret.get_secret_value(),
            timestamp=request.headers.get(TIMESTAMP_HEADER),
            signature=request.headers.get(SIGNATURE_HEADER),
            body=raw,
            now_s=self._clock.now().timestamp(),
            max_skew_s=settings.max_skew_seconds,
        )
        return self.accept(parse_message(raw))

    def accept(self, message: WebhookMessage) -> InboundMessage:
        """The session, requester and run of a verified message; :class:`WebhookBodyError` for ids off the grammar."""
        agent_id = self.settings.agent_id
        try:
            key = channel_key(agent_id, CHANNEL_NAME, message.sender.id)
            if message.thread_id is not None:
                key = thread_key(key, message.thread_id)
        except SessionKeyError as exc:
            raise WebhookBodyError(exc.message) from None
        sender = message.sender.id
        # Who may use the channel and who carries operator authority are read from the live authority, at each
        # message: a demotion or an unlinked identity takes effect on the next one.
        authorized = self._authority.allows(CHANNEL_NAME, sender)
        requester = Requester(
            key,
            agent_id,
            CHANNEL_NAME,
            authenticated=authorized,
            sender_id=sender,
            operator=self._authority.operator_for(CHANNEL_NAME, sender) if authorized else None,
        )
        request = RunRequest(key, agent_id, message.text, "main", idempotency_key=message_run_id(message.message_id))
        return InboundMessage(message, key, requester, request)

    def refuse(self, inbound: InboundMessage, refusal: ProtocolError) -> dict[str, Any]:
        """Tell the sender why its command did not run (on the channel); the HTTP answer's body."""
        details = refusal.details or {}
        code = str(details.get("code", "command_refused")).lower()
        self._schedule(self._reply_body(inbound.requester, refusal.message, in_reply_to=inbound.message.message_id))
        return {"ok": False, "error": {"code": code, "message": refusal.message}}

    # -- outbound ------------------------------------------------------------------------------------------------

    async def deliver(self, to: Requester, text: str, *, run_id: str | None = None) -> None:
        """Send ``text`` to the requester's sender (``ChannelOutbox``); returns once the POST is scheduled.

        A run started by a message (run id ``webhook:<messageId>``) answers ``inReplyTo`` that message.
        """
        in_reply_to = None
        if run_id is not None and run_id.startswith(_RUN_ID_PREFIX):
            in_reply_to = run_id.removeprefix(_RUN_ID_PREFIX)
        self._schedule(self._reply_body(to, text, in_reply_to=in_reply_to, run_id=run_id))

    async def wait_for_idle(self) -> None:
        """Wait until every outbound POST scheduled so far has finished (delivered or given up)."""
        while self._pending:
            await asyncio.wait(set(self._pending))

    async def aclose(self) -> None:
        """Let outbound POSTs in flight finish for a short grace period, cancel the rest, close the client."""
        self._closed = True
        if self._pending:
            _done, late = await asyncio.wait(set(self._pending), timeout=_CLOSE_GRACE_S)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
                _log.warning("webhook channel: %d reply(ies) still being delivered were dropped at stop", len(late))
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _reply_body(
        self, to: Requester, text: str, *, in_reply_to: str | None, run_id: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"recipient": to.sender_id, "text": text}
        if in_reply_to is not None:
            body["inReplyTo"] = in_reply_to
        thread_id = parse_session_key(to.session_key).thread_id
        if thread_id is not None:
            body["threadId"] = thread_id
        if run_id is not None:
            body["runId"] = run_id
        return body

    def _schedule(self, body: dict[str, Any]) -> None:
        outbound = self.settings.outbound
        if outbound is None or body["recipient"] is None:
            return  # no outbound route: the reply is only in the session's transcript
        if self._closed:
            _log.warning("webhook channel: a reply after stop was not sent")
            return
        task = asyncio.create_task(self._post(outbound.url, outbound.timeout_seconds, body))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, url: str, timeout_s: float, body: Mapping[str, Any]) -> None:
        """POST ``body`` signed, retrying connection errors and 5xx answers; failures are logged, never raised."""
        secret = self.settings.secret
        assert secret is not None  # the channel is enabled only with a secret
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        what = body.get("runId") or body.get("inReplyTo") or "notice"
        attempts = len(self._retry_delays_s) + 1
        for attempt in range(1, attempts + 1):
            headers = signed_headers(secret.get_secret_value(), raw, timestamp=int(self._clock.now().timestamp()))
            try:
                async with asyncio.timeout(timeout_s):
                    async with self._session.post(url, data=raw, headers=headers, allow_redirects=False) as response:
                        status = response.status
                        await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                reason = f"{type(exc).__name__}"
                retry = True
            else:
                if 200 <= status < 300:
                    return
                reason = f"HTTP {status}"
                retry = status >= 500
            if not retry or attempt == attempts:
                _log.warning("webhook reply %s not delivered after %d attempt(s): %s", what, attempt, reason)
                return
            _log.info("webhook reply %s: attempt %d failed (%s), retrying", what, attempt, reason)
            await self._clock.sleep(self._retry_delays_s[attempt - 1])
