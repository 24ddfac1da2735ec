"""The proxy's core: identities, authentication, the revocation fence, chat routing, managed tools, the journal.

Transports live in :mod:`clawstack.proxy.server`; this module maps requests to results and never touches HTTP.

Revocation order (the fence): block the identity in memory (no new request, no tool dispatch), cancel its
requests in flight, record the revocation durably (append + fsync in ``CLAW_REVOCATION_DIR``), empty its tool
allowlist, seal its journal coverage, and only then answer. If the record cannot be written the identity stays
blocked in memory and the revoke fails loudly; it is never acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

import aiohttp
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

from clawstack import __version__
from clawstack.common.clock import Clock, SystemClock, format_timestamp
from clawstack.common.files import ensure_private_dir, fsync_dir
from clawstack.common.ids import new_id
from clawstack.models.efforts import effort_refusal
from clawstack.models.refs import PLAN_PREFIXES, split_model_ref
from clawstack.proxy.chat import ChatFlow, provider_object
from clawstack.proxy.config import ProxyConfig
from clawstack.proxy.errors import (
    AuthError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ProxyError,
    RequestError,
    RevocationError,
)
from clawstack.proxy.identities import (
    IDENTITY_ID,
    MAX_IDENTITY_LIFETIME,
    ChainEntry,
    Identity,
    IdentityStore,
    hash_secret,
)
from clawstack.proxy.journal import TraceJournal, read_capture_epoch
from clawstack.proxy.plan_route import PlanRoutes
from clawstack.proxy.providers import KeyHealth, Upstreams
from clawstack.proxy.request_guard import guard_chat_request
from clawstack.proxy.revocation import RevocationLedger
from clawstack.proxy.routing import Attempt, ChainRouter, Committed
from clawstack.proxy.tool_dispatch import ToolDispatcher, ToolOutcome
from clawstack.proxy.tools import ToolCatalog, ToolService, parse_descriptor, qualified_name_for

log = logging.getLogger(__name__)

SLOT: Final = re.compile(r"primary|fallback(-([2-9]|[1-9][0-9]))?")
QUALIFIED_TOOL: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,47}\.[a-z0-9][a-z0-9_-]{0,47}")
SECRET: Final = re.compile(r"[A-Za-z0-9_-]{32,256}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ProviderPreferences(_Strict):
    only: list[str] | None = Field(default=None, min_length=1)
    allow_fallbacks: Literal[False] | None = None
    require_parameters: Literal[True] | None = None
    zdr: Literal[True] | None = None
    data_collection: Literal["deny"] | None = None


class ChainEntryRequest(_Strict):
    slot: str
    ref: str = Field(min_length=3, max_length=200)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    provider_preferences: ProviderPreferences | None = None

    @field_validator("slot")
    @classmethod
    def _slot(cls, value: str) -> str:
        if not SLOT.fullmatch(value):
            raise ValueError("must be primary, fallback, fallback-2, …")
        return value


class ExpiryRequest(_Strict):
    """``POST /v1/identities/{id}/expiry``."""

    expires_at: AwareDatetime


class CreateIdentityRequest(_Strict):
    """``POST /v1/identities``."""

    id: str
    secret: str
    chain: list[ChainEntryRequest] = Field(min_length=1, max_length=16)
    tools: list[str] = Field(default_factory=list, max_length=256)
    expires_at: AwareDatetime
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not IDENTITY_ID.fullmatch(value):
            raise ValueError("must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}")
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str) -> str:
        if not SECRET.fullmatch(value):
            raise ValueError("must be 32 to 256 characters of [A-Za-z0-9_-]")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str]) -> list[str]:
        for name in value:
            if not QUALIFIED_TOOL.fullmatch(name):
                raise ValueError("tool names are service.tool")
        if len(set(value)) != len(value):
            raise ValueError("tool names repeat")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9._/-]{0,63}", key) or len(item) > 256:
                raise ValueError("label keys are [a-z0-9._/-] up to 64, values up to 256 characters")
        return value


def validation_message(exc: ValidationError) -> str:
    """The first validation problem, naming the field; never the rejected value."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return f"{where}: {first['msg']}"


def parse_credentials(authorization: str | None, api_key: str | None) -> tuple[str, str]:
    """``Bearer <id>:<secret>`` (or ``x-api-key: <id>:<secret>``), split on the first colon."""
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer":
            raise AuthError("use Authorization: Bearer <identity>:<secret>", code="malformed_credentials")
        token = value.strip()
    elif api_key is not None:
        token = api_key.strip()
    else:
        raise AuthError("missing credentials", code="missing_credentials")
    ident, sep, secret = token.partition(":")
    if not sep or not ident or not secret:
        raise AuthError("credentials must be <identity>:<secret>", code="malformed_credentials")
    return ident, secret


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    """A validated worker chat request."""

    body: dict[str, Any]
    entries: list[ChainEntry]
    stream: bool
    managed_tools: list[dict[str, Any]]


class ProxyService:
    """Everything the proxy knows and does, independent of transports."""

    def __init__(
        self, config: ProxyConfig, *, clock: Clock | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._environ = environ
        self.boot_id = new_id("boot_")
        self.upstreams = Upstreams(config, environ=environ)
        self.policy = config.policy
        assert config.revocation_dir is not None  # parse_config guarantees it
        self.ledger = RevocationLedger(
            Path(config.revocation_dir), max_bytes=config.revocation_max_bytes, clock=self.clock
        )
        self.store = IdentityStore(Path(config.state_dir) / "identities")
        self.journal = (
            TraceJournal(
                Path(config.journal.directory), capture_content=config.journal.capture_content, clock=self.clock
            )
            if config.journal is not None
            else None
        )
        self.catalog = ToolCatalog(self._tool_services())
        self.dispatcher = ToolDispatcher(self.catalog, timeout_s=config.routing.tool_timeout_s)
        self.health_state = KeyHealth(
            self.clock,
            dead_recheck_s=config.routing.dead_key_recheck_s,
            retry_after_cap_s=config.routing.retry_after_cap_s,
        )
        self.operator_token = config.resolve_env(config.operator_token_env, environ)
        if not self.operator_token or len(self.operator_token) < 32:
            raise ConfigError(
                f"proxy config: the operator token ({config.operator_token_env}) must be set, 32 characters or more"
            )
        self._session: aiohttp.ClientSession | None = None
        self._flow: ChatFlow | None = None
        self.plans: PlanRoutes | None = None
        self._revoke_lock = asyncio.Lock()
        self._blocked: set[str] = set()  # revocations begun: refused at once, even before they are durable
        self._audit_path = Path(config.state_dir) / "audit.jsonl"

    def _tool_services(self) -> list[ToolService]:
        services = []
        for name, item in self.config.tools.items():
            if item.descriptor_file is not None:
                try:
                    raw: bytes | dict[str, Any] = Path(item.descriptor_file).read_bytes()
                except OSError as exc:
                    raise ConfigError(f"proxy config: tools.{name}: descriptor file unreadable") from exc
            else:
                raw = item.descriptor or {}
            descriptor = parse_descriptor(name, raw)
            bearer = None
            if descriptor.auth_env is not None:
                bearer = self.config.resolve_env(descriptor.auth_env, self._environ)
                if bearer is None:
                    raise ConfigError(f"proxy config: tools.{name}: {descriptor.auth_env} is not set")
            try:
                services.append(ToolService(descriptor=descriptor, base_url=item.base_url, bearer=bearer))
            except ValueError as exc:
                raise ConfigError(f"proxy config: tools.{name}: {exc}") from exc
        return services

    # ---------------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        ensure_private_dir(Path(self.config.state_dir))
        self.ledger.open()
        self.store.open()
        now = self.clock.now()
        for identity in self.store:
            if identity.revoked_at is None and not self.ledger.is_revoked(identity.id) and now < identity.expires_at:
                self.ledger.reserve(identity.id, expires_at=identity.expires_at)
        if self.journal is not None:
            self.journal.start()
        await self.dispatcher.start()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None), connector=aiohttp.TCPConnector(limit=0), trust_env=False
        )
        if self.config.auth_dir is not None:
            self.plans = PlanRoutes(self.config, self.clock)
        router = ChainRouter(
            self.upstreams, self.health_state, self._session, self.clock, self.config.routing, plans=self.plans
        )
        self._flow = ChatFlow(router, self.catalog, self.config.routing, self, self.policy)

    async def close(self) -> None:
        """Persist usage and release everything. Idempotent."""
        for identity in self.store:
            if identity.served_by:
                try:
                    self.store.save_usage(identity)
                except ProxyError:
                    log.exception("could not persist usage of identity %s", identity.id)
        if self.plans is not None:
            await self.plans.close()
            self.plans = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.dispatcher.close()
        if self.journal is not None:
            self.journal.close()
        self.store.close()
        self.ledger.close()

    @property
    def flow(self) -> ChatFlow:
        if self._flow is None:
            raise RuntimeError("the proxy service is not started")
        return self._flow

    # -------------------------------------------------------------------------------------------- worker side

    def authenticate(self, authorization: str | None, api_key: str | None) -> Identity:
        ident, secret = parse_credentials(authorization, api_key)
        identity = self.store.get(ident)
        if identity is None:
            hash_secret(secret)  # the same work as a known id, so timing does not tell ids apart
            raise ForbiddenError("identity refused", code="identity_unknown")
        if not identity.secret_matches(secret):
            raise ForbiddenError("identity refused", code="identity_refused")
        if self.is_revoked(identity):
            raise ForbiddenError("identity revoked", code="identity_revoked")
        if self.clock.now() >= identity.expires_at:
            raise ForbiddenError("identity expired", code="identity_expired")
        return identity

    def is_revoked(self, identity: Identity) -> bool:
        return identity.revoked_at is not None or identity.id in self._blocked or self.ledger.is_revoked(identity.id)

    def prepare(self, identity: Identity, body: Any) -> WorkerRequest:
        """Validate a worker chat body against the identity; choose where its chain starts. The body is rebuilt
        from the allowlist first (:func:`~clawstack.proxy.request_guard.guard_chat_request`), so nothing outside
        it reaches any route."""
        guarded = guard_chat_request(body, self.policy)
        model = guarded["model"]
        stream = guarded.get("stream") is True
        start = next((i for i, e in enumerate(identity.chain) if model in (e.slot, e.ref)), None)
        if start is None:
            raise NotFoundError("the model is not in this identity's chain", code="model_not_found")
        for tool in guarded.get("tools") or []:
            name = (tool.get("function") or {}).get("name")
            if isinstance(name, str) and self.catalog.is_managed_name(name):
                raise RequestError("a worker tool may not take a managed tool's name", code="tool_name_reserved")
        entries = list(identity.chain[start:])
        for entry in entries:
            self.check_policy(entry.ref, where=entry.slot)
            refusal = effort_refusal(entry.ref, entry.reasoning_effort)
            if refusal is not None:
                raise RequestError(f"{entry.slot}: {refusal}", code="reasoning_effort_unsupported")
        if guarded.get("provider") is not None:
            for entry in entries:
                if entry.ref.startswith("openrouter/"):
                    provider_object(entry.provider_preferences, guarded["provider"], self.policy)
        return WorkerRequest(guarded, entries, stream, self.catalog.openai_tools(identity.tools))

    def check_policy(self, ref: str, *, where: str) -> None:
        """Refuse (``data_policy_violation``) a chain entry whose provider at its endpoint lacks evidence for
        what the data policy requires; see :mod:`clawstack.models.policy`."""
        route = self.upstreams.resolve(ref)
        if route is None:
            return  # an unknown route cannot serve; the router says so
        lacking = self.policy.missing(route.prefix, route.policy_endpoint)
        if lacking:
            raise RequestError(
                f"{where} {ref}: provider {route.prefix} at {route.policy_endpoint} lacks {', '.join(lacking)} "
                "under this proxy's data policy",
                code="data_policy_violation",
            )

    def models(self, identity: Identity) -> dict[str, Any]:
        created = int(identity.created_at.timestamp())
        return {
            "object": "list",
            "data": [{"id": e.ref, "object": "model", "created": created, "owned_by": e.slot} for e in identity.chain],
        }

    # ---------------------------------------------------------------------------------------- Recorder protocol

    def attempt(self, identity: Identity, attempt: Attempt, response_sha256: str | None) -> None:
        if attempt.failure is not None and attempt.ref.split("/", 1)[0] in PLAN_PREFIXES:
            identity.last_plan_failure = attempt.failure
        self._journal(
            identity,
            {
                "type": "upstream_request",
                "slot": attempt.slot,
                "ref": attempt.ref,
                "upstream": attempt.upstream,
                "credential_class": attempt.credential_class,
                "status": attempt.status,
                "outcome": attempt.failure or "ok",
                "started_at": format_timestamp(attempt.started_at),
                "duration_ms": round(attempt.duration_ms, 3),
                "first_byte_ms": None if attempt.first_byte_ms is None else round(attempt.first_byte_ms, 3),
                "request_sha256": attempt.request_sha256,
                "response_sha256": response_sha256,
            },
        )

    def served(self, identity: Identity, committed: Committed, response_sha256: str, ok: bool) -> None:
        if ok:
            cls = committed.route.credential_class
            identity.served_by[cls] = identity.served_by.get(cls, 0) + 1
        self.attempt(
            identity,
            Attempt(
                slot=committed.entry.slot,
                ref=committed.entry.ref,
                upstream=committed.route.prefix,
                credential_class=committed.route.credential_class,
                status=committed.response.status,
                failure=None if ok else "stream_broken",
                started_at=self.clock.now(),
                duration_ms=(self.clock.monotonic() - committed.started) * 1000,
                first_byte_ms=committed.first_byte_ms,
                request_sha256=committed.request_sha256,
            ),
            response_sha256,
        )

    async def dispatch(self, identity: Identity, function_name: str, arguments: str) -> ToolOutcome:
        spec = self.catalog.by_function_name(function_name)
        qualified = spec.qualified if spec is not None else (qualified_name_for(function_name) or function_name)
        refusal = None
        if self.is_revoked(identity):
            refusal = "identity_revoked"
        elif spec is None or spec.qualified not in identity.tools:
            refusal = "tool_not_allowed"
        if refusal is not None or spec is None:
            await self._audit({"event": "tool_refused", "identity": identity.id, "tool": qualified, "reason": refusal})
            self._journal(identity, {"type": "tool_dispatch", "tool": qualified, "outcome": refusal})
            return ToolOutcome.refused(qualified)
        await self._audit({"event": "tool_admitted", "identity": identity.id, "tool": qualified})
        outcome = await self.dispatcher.dispatch(spec, arguments)
        self._journal(
            identity,
            {
                "type": "tool_dispatch",
                "tool": qualified,
                "outcome": "ok" if outcome.ok else outcome.error_code,
                "http_status": outcome.http_status,
                "duration_ms": round(outcome.duration_ms, 3),
            },
        )
        return outcome

    def _journal(self, identity: Identity, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.append(record, identity_id=identity.id)

    async def _audit(self, record: dict[str, Any]) -> None:
        """Append an audit line and fsync it before the dispatch it admits can happen."""
        line = json.dumps({"at": format_timestamp(self.clock.now()), **record}).encode() + b"\n"
        await asyncio.to_thread(_append_durably, self._audit_path, line)

    # ------------------------------------------------------------------------------------------ operator side

    def _expiry(self, requested: datetime) -> datetime:
        now = self.clock.now()
        expires_at = requested.replace(microsecond=0)
        if expires_at <= now:
            raise RequestError("expires_at is in the past", code="expiry_invalid")
        if expires_at - now > MAX_IDENTITY_LIFETIME:
            raise RequestError("expires_at is more than 7 days away", code="expiry_invalid")
        return expires_at

    async def create_identity(self, request: CreateIdentityRequest) -> tuple[Identity, bool]:
        now = self.clock.now()
        expires_at = self._expiry(request.expires_at)
        chain = []
        for position, item in enumerate(request.chain):
            expected = "primary" if position == 0 else "fallback" if position == 1 else f"fallback-{position}"
            if item.slot != expected:
                raise RequestError(f"chain[{position}] must be slot {expected}", code="chain_invalid")
            parts = split_model_ref(item.ref)
            if parts is None or not self.upstreams.known_prefix(parts[0]):
                raise RequestError(
                    f"chain[{position}]: unknown provider or malformed model reference", code="model_ref_unknown"
                )
            prefs = item.provider_preferences
            if prefs is not None and parts[0] != "openrouter":
                raise RequestError(
                    f"chain[{position}]: provider preferences need an openrouter/ model", code="chain_invalid"
                )
            chain.append(
                ChainEntry(
                    slot=item.slot,
                    ref=item.ref,
                    reasoning_effort=item.reasoning_effort,
                    provider_preferences=prefs.model_dump(exclude_none=True) if prefs is not None else None,
                )
            )
        unknown = self.catalog.unknown(request.tools)
        if unknown:
            raise RequestError(f"unknown managed tools: {', '.join(sorted(unknown))}", code="tool_unknown")
        if self.ledger.is_revoked(request.id):
            raise ForbiddenError("this identity id was revoked; ids are never reused", code="identity_revoked")
        identity = Identity(
            id=request.id,
            secret_sha256=hash_secret(request.secret),
            chain=tuple(chain),
            tools=tuple(request.tools),
            expires_at=expires_at,
            labels=dict(request.labels),
            created_at=now.replace(microsecond=0),
            boot_id=self.boot_id,
        )
        existing = self.store.get(identity.id)
        if existing is None:
            self.ledger.reserve(identity.id, expires_at=identity.expires_at)
        try:
            stored, created = await asyncio.to_thread(self.store.create, identity)
        except ProxyError:
            if existing is None:
                self.ledger.release(identity.id)
            raise
        return stored, created

    def describe(self, identity: Identity) -> dict[str, Any]:
        now = self.clock.now()
        state = "revoked" if self.is_revoked(identity) else identity.state(now)
        return {
            "id": identity.id,
            "state": state,
            "chain": [entry.to_dict() for entry in identity.chain],
            "tools": [] if state == "revoked" else list(identity.tools),
            "expires_at": format_timestamp(identity.expires_at),
            "created_at": format_timestamp(identity.created_at),
            "revoked_at": format_timestamp(identity.revoked_at) if identity.revoked_at else None,
            "labels": identity.labels,
            "served_by": dict(identity.served_by),
            "served_by_complete": identity.boot_id == self.boot_id,
            "last_plan_failure": identity.last_plan_failure,
        }

    async def set_expiry(self, identity_id: str, request: ExpiryRequest) -> Identity:
        """Move a live identity's expiry (the run's authority was extended or shortened), durably. Idempotent."""
        identity = self.get_identity(identity_id)
        if self.is_revoked(identity):
            raise ConflictError("the identity was revoked; its expiry cannot change", code="identity_revoked")
        if identity.state(self.clock.now()) == "expired":
            raise ConflictError("the identity has expired; its expiry cannot change", code="identity_expired")
        expires_at = self._expiry(request.expires_at)
        if expires_at != identity.expires_at:
            await asyncio.to_thread(self.store.save_expiry, identity, expires_at)
        return identity

    def get_identity(self, identity_id: str) -> Identity:
        identity = self.store.get(identity_id)
        if identity is None:
            raise NotFoundError("no such identity", code="identity_unknown")
        return identity

    async def revoke(self, identity_id: str) -> dict[str, Any]:
        """The durable fence. Idempotent; an unknown id is recorded too, so it can never be created."""
        if not IDENTITY_ID.fullmatch(identity_id):
            raise RequestError("malformed identity id", code="invalid_request")
        identity = self.store.get(identity_id)
        self._blocked.add(identity_id)
        if identity is not None:
            for task in list(identity.inflight):
                task.cancel()
        async with self._revoke_lock:
            # An unknown id is recorded with the longest lifetime an identity can have, so that its record is
            # compactable once no identity created before it could still be alive.
            expires_at = identity.expires_at if identity is not None else self.clock.now() + MAX_IDENTITY_LIFETIME
            try:
                record, newly = await asyncio.to_thread(self.ledger.record, identity_id, expires_at=expires_at)
            except RevocationError:
                log.error("revocation of %s could not be recorded; the identity stays blocked", identity_id)
                raise
        seal = None
        if identity is not None:
            identity.revoked_at = identity.revoked_at or record.revoked_at
            identity.tools = ()
            try:
                await asyncio.to_thread(self.store.save_revoked, identity)
            except ProxyError:
                log.exception("identity %s is revoked in the ledger but its row could not be updated", identity_id)
            if self.journal is not None:
                seal = self.journal.seal(identity_id)
        return {
            "id": identity_id,
            "revoked": True,
            "revoked_at": format_timestamp(record.revoked_at),
            "newly_revoked": newly,
            "known": identity is not None,
            "tools": [],
            "seal": None if seal is None else {"epoch": seal.epoch, "records": seal.records, "digest": seal.digest},
        }

    def durable_revocation(self, identity_id: str) -> dict[str, Any]:
        """Re-read the revocation file from disk: the self-test's proof that a record is durable."""
        if not IDENTITY_ID.fullmatch(identity_id):
            raise RequestError("malformed identity id", code="invalid_request")
        record = self.ledger.read_durable(identity_id)
        return {
            "id": identity_id,
            "durable": record is not None,
            "revoked_at": format_timestamp(record.revoked_at) if record is not None else None,
        }

    def subscriptions(self) -> dict[str, Any]:
        """``GET /v1/subscriptions``: the plan sign-ins' state; never a token."""
        if self.config.auth_dir is None or self.plans is None:
            raise ProxyError(
                "this proxy has no plan routes (no auth_dir)", code="subscriptions_unsupported", status=501
            )
        return {"subscriptions": self.plans.subscriptions()}

    def health(self) -> dict[str, Any]:
        epoch = read_capture_epoch(Path(self.config.journal.directory)) if self.config.journal else None
        return {
            "status": "ok",
            "version": __version__,
            "capture_epoch": epoch,
            "capabilities": {
                "revocation": True,
                "journal": self.journal is not None,
                "managed_tools": len(self.catalog) > 0,
                "plan_routes": self.config.auth_dir is not None,
            },
            "revocations": {
                "records": self.ledger.record_count,
                "bytes": self.ledger.used_bytes,
                "max_bytes": self.ledger.max_bytes,
            },
            "keys": self.health_state.snapshot(),
        }


def _append_durably(path: Path, line: bytes) -> None:
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


__all__ = [
    "CreateIdentityRequest",
    "ProxyService",
    "WorkerRequest",
    "parse_credentials",
    "validation_message",
]
