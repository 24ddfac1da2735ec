"""Access tokens for plan routes: read from the sign-in store, refreshed before they expire, one refresh at a time.

:meth:`PlanTokens.access` answers ``(access_token, account_id)``. It re-reads the store file whenever its version
(device, inode, mtime, size) changed, so a new ``claw proxy auth login`` serves from the next request and a
``logout`` stops the route, without a restart. A refresh happens when the token expires within
``refresh_margin_s`` (or, for a token without expiry, once it is :data:`REFRESH_INTERVAL_S` old), or when the route
forces one after a 401; a failed refresh of a still-valid token is retried after :data:`REFRESH_RETRY_S`.
Concurrent callers share one refresh, and a refresh runs to completion even when its callers are cancelled,
because the issuer rotates the refresh token and the new one must reach the store.

A refresh the issuer refuses (401, or ``invalid_grant`` and the ``refresh_token_*`` codes) marks the record
``needs_signin`` and raises :class:`PlanSigninRequired`; transport faults, 5xx and malformed answers raise
:class:`PlanUnavailable`. A refresh never overwrites a record that a new sign-in replaced meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

import aiohttp

from clawstack.common.clock import Clock, SystemClock, format_timestamp
from clawstack.proxy.plan.chatgpt import (
    ISSUER,
    ORIGINATOR,
    REFRESH_INTERVAL_S,
    account_from_id_token,
    error_codes,
    jwt_expiry,
    parse_token_response,
    refresh_body,
    refresh_refused,
    token_url,
)
from clawstack.proxy.plan.errors import PlanError, PlanSigninRequired, PlanStoreError, PlanUnavailable
from clawstack.proxy.plan.store import AuthStore, SignIn, Stamp, signin_state

log = logging.getLogger("clawstack.proxy.plan")
MAX_TOKEN_ANSWER_BYTES: Final = 256 * 1024
#: After a failed refresh of a token that is still valid, wait this long before the next unforced attempt.
REFRESH_RETRY_S: Final = 30.0


async def read_capped(answer: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of ``answer``, stopping once it exceeds ``limit`` bytes (the result is then longer than
    ``limit``, which callers treat as malformed)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in answer.content.iter_chunked(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)


def signin_command(provider: str) -> str:
    """The command an operator runs to sign ``provider`` in."""
    return f"claw proxy auth login {provider}"


def expiry_of(tokens_expires_in_s: float | None, access_token: str, now: datetime) -> datetime | None:
    """When an access token expires: ``expires_in`` from the answer, else the token's own ``exp`` claim."""
    if tokens_expires_in_s is not None:
        return now + timedelta(seconds=tokens_expires_in_s)
    return jwt_expiry(access_token)


@dataclass
class _Slot:
    """What :class:`PlanTokens` knows of one provider."""

    signin: SignIn | None = None
    stamp: Stamp | None = None
    loaded: bool = False
    inflight: asyncio.Future[SignIn] | None = None
    last_refresh_mono: float | None = None
    failed_refresh_mono: float | None = None
    limited_until: datetime | None = None
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class PlanTokens:
    """The plan routes' access tokens, refreshed from ``issuer`` over TLS (``ssl_context``, default verification).

    Pass ``session`` to share an :class:`aiohttp.ClientSession`; otherwise one is created on first use and
    closed by :meth:`aclose`.
    """

    def __init__(
        self,
        store: AuthStore,
        *,
        issuer: str = ISSUER,
        ssl_context: ssl.SSLContext | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Clock | None = None,
        refresh_margin_s: float = 300.0,
        force_dedupe_s: float = 5.0,
        timeout_s: float = 30.0,
    ) -> None:
        self._store = store
        self._issuer = issuer
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._session = session
        self._own_session = session is None
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._margin = timedelta(seconds=refresh_margin_s)
        self._force_dedupe_s = force_dedupe_s
        self._timeout_s = timeout_s
        self._slots: dict[str, _Slot] = {}

    @property
    def store(self) -> AuthStore:
        return self._store

    async def aclose(self) -> None:
        """Wait for refreshes in flight, then close the session this object created. Idempotent."""
        pending = [slot.inflight for slot in self._slots.values() if slot.inflight is not None]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _slot(self, provider: str) -> _Slot:
        self._store.path(provider)  # refuses an unknown provider
        return self._slots.setdefault(provider, _Slot())

    def _sync(self, provider: str, slot: _Slot) -> None:
        """Re-read the store file when its version changed since the last read."""
        try:
            if slot.loaded and self._store.stamp(provider) == slot.stamp:
                return
            slot.signin, slot.stamp = self._store.load_versioned(provider)
        except (PlanStoreError, OSError) as exc:
            detail = exc.message if isinstance(exc, PlanStoreError) else (exc.strerror or type(exc).__name__)
            raise PlanUnavailable(f"the {provider} sign-in store is unusable: {detail}") from exc
        slot.loaded = True

    def _current(self, provider: str, slot: _Slot) -> SignIn:
        self._sync(provider, slot)
        signin = slot.signin
        if signin is None:
            raise PlanSigninRequired(f"nobody is signed in to {provider}; sign in with: {signin_command(provider)}")
        if signin.needs_signin:
            raise PlanSigninRequired(f"the {provider} sign-in expired; sign in again with: {signin_command(provider)}")
        return signin

    def _due(self, signin: SignIn, now: datetime) -> bool:
        if signin.expires_at is not None:
            return signin.expires_at - self._margin <= now
        last = signin.refreshed_at or signin.signed_in_at
        return last + timedelta(seconds=REFRESH_INTERVAL_S) <= now

    async def access(self, provider: str, *, force: bool = False) -> tuple[str, str | None]:
        """``(access_token, account_id)`` for ``provider``, refreshing first when due or when ``force``.

        A forced refresh within ``force_dedupe_s`` of the last completed one reuses its result, so a burst of
        401s costs one refresh. A due-but-unexpired token is still returned when the issuer is unreachable.
        """
        slot = self._slot(provider)
        signin = self._current(provider, slot)
        now = self._clock.now()
        if force:
            recent = (
                slot.last_refresh_mono is not None
                and self._clock.monotonic() - slot.last_refresh_mono < self._force_dedupe_s
            )
            if slot.inflight is not None or not recent:
                signin = await self._shared_refresh(provider, slot)
        elif self._due(signin, now) and not self._retry_later(slot, signin, now):
            try:
                signin = await self._shared_refresh(provider, slot)
            except PlanUnavailable:
                slot.failed_refresh_mono = self._clock.monotonic()
                if signin.expires_at is None or signin.expires_at <= self._clock.now():
                    raise
                log.warning("%s token refresh failed; using the current token until it expires", provider)
        return signin.access_token, signin.account_id

    def _retry_later(self, slot: _Slot, signin: SignIn, now: datetime) -> bool:
        """Whether a still-valid token's refresh failed too recently to try again yet."""
        if slot.failed_refresh_mono is None or signin.expires_at is None or signin.expires_at <= now:
            return False
        return self._clock.monotonic() - slot.failed_refresh_mono < REFRESH_RETRY_S

    async def _shared_refresh(self, provider: str, slot: _Slot) -> SignIn:
        if slot.inflight is None:
            future = asyncio.ensure_future(self._refresh(provider, slot))
            slot.inflight = future

            def finished(done: asyncio.Future[SignIn]) -> None:
                if slot.inflight is done:
                    slot.inflight = None
                if not done.cancelled():
                    done.exception()  # retrieved here so that a refresh nobody awaits any more logs nothing

            future.add_done_callback(finished)
        return await asyncio.shield(slot.inflight)

    async def _post_refresh(self, refresh_token: str) -> tuple[int, bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with (
            asyncio.timeout(self._timeout_s),
            self._session.post(
                token_url(self._issuer),
                json=refresh_body(refresh_token),
                headers={"originator": ORIGINATOR},
                ssl=self._ssl,
                allow_redirects=False,
            ) as answer,
        ):
            return answer.status, await read_capped(answer, MAX_TOKEN_ANSWER_BYTES)

    async def _refresh(self, provider: str, slot: _Slot) -> SignIn:
        base, base_stamp = slot.signin, slot.stamp
        if base is None:
            raise PlanSigninRequired(f"nobody is signed in to {provider}; sign in with: {signin_command(provider)}")
        if not base.refresh_token:
            raise PlanSigninRequired(
                f"the {provider} sign-in cannot be refreshed; sign in again with: {signin_command(provider)}"
            )
        try:
            status, body = await self._post_refresh(base.refresh_token)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PlanUnavailable(f"cannot reach the {provider} issuer to refresh ({type(exc).__name__})") from exc
        if refresh_refused(status, body):
            codes = sorted(error_codes(body)) or [str(status)]
            log.warning("the %s issuer refused a token refresh (%s): sign-in required", provider, ", ".join(codes))
            if not await self._write(provider, slot, base_stamp, base.with_changes(needs_signin=True)):
                return self._replacement(provider, slot)
            raise PlanSigninRequired(
                f"the {provider} sign-in expired (the issuer refused to refresh it); "
                f"sign in again with: {signin_command(provider)}"
            )
        tokens = parse_token_response(body) if status == 200 and len(body) <= MAX_TOKEN_ANSWER_BYTES else None
        if tokens is None:
            what = "a malformed answer" if status == 200 else f"status {status}"
            raise PlanUnavailable(f"the {provider} issuer answered a token refresh with {what}")
        now = self._clock.now()
        email, account = base.account_email, base.account_id
        if tokens.id_token is not None:
            new_email, new_account = account_from_id_token(tokens.id_token)
            email, account = new_email or email, new_account or account
        refreshed = base.with_changes(
            access_token=tokens.access_token,
            refresh_token=tokens.refresh_token or base.refresh_token,
            id_token=tokens.id_token or base.id_token,
            account_email=email,
            account_id=account,
            expires_at=expiry_of(tokens.expires_in_s, tokens.access_token, now),
            refreshed_at=now,
            needs_signin=False,
        )
        written = await self._write(provider, slot, base_stamp, refreshed)
        slot.last_refresh_mono = self._clock.monotonic()
        slot.failed_refresh_mono = None
        if written:
            log.info("refreshed the %s sign-in", provider)
            return refreshed
        return self._replacement(provider, slot)

    def _replacement(self, provider: str, slot: _Slot) -> SignIn:
        """The record a new sign-in wrote while a refresh was under way."""
        current = slot.signin
        if current is None or current.needs_signin:
            raise PlanSigninRequired(f"nobody is signed in to {provider}; sign in with: {signin_command(provider)}")
        return current

    async def _write(self, provider: str, slot: _Slot, base_stamp: Stamp | None, signin: SignIn) -> bool:
        """Save ``signin`` unless the file changed since ``base_stamp`` (then reload it instead); True when saved."""
        async with slot.write_lock:
            try:
                if self._store.stamp(provider) != base_stamp:
                    log.info("the %s sign-in changed during a refresh; using the new one", provider)
                    slot.loaded = False
                    self._sync(provider, slot)
                    return False
                slot.stamp = await asyncio.to_thread(self._store.save, signin)
            except (PlanStoreError, OSError) as exc:
                detail = exc.message if isinstance(exc, PlanStoreError) else (exc.strerror or type(exc).__name__)
                raise PlanUnavailable(f"cannot record the {provider} sign-in: {detail}") from exc
            slot.signin = signin
            slot.loaded = True
            return True

    async def rest(self, provider: str, until: datetime) -> None:
        """Rest ``provider`` until ``until`` (a spent usage limit), recorded in the sign-in file when there is one."""
        slot = self._slot(provider)
        slot.limited_until = until
        with contextlib.suppress(PlanError):
            self._sync(provider, slot)
            if slot.signin is not None:
                await self._write(provider, slot, slot.stamp, slot.signin.with_changes(limited_until=until))

    def limited_until(self, provider: str) -> datetime | None:
        """The end of ``provider``'s usage-limit rest, or ``None`` when it is not resting."""
        slot = self._slot(provider)
        with contextlib.suppress(PlanError):
            self._sync(provider, slot)
        stored = slot.signin.limited_until if slot.signin is not None else None
        candidates = [when for when in (stored, slot.limited_until) if when is not None]
        until = max(candidates) if candidates else None
        return until if until is not None and until > self._clock.now() else None

    def state(self, provider: str) -> dict[str, str]:
        """The sign-in state of ``provider`` as ``GET /v1/subscriptions`` reports it (never a token).

        Raises :class:`PlanUnavailable` when the store is unusable.
        """
        slot = self._slot(provider)
        self._sync(provider, slot)
        report = signin_state(provider, slot.signin, self._clock.now())
        until = self.limited_until(provider)
        if until is not None:
            report["limited_until"] = format_timestamp(until)
        return report


__all__ = ["REFRESH_RETRY_S", "PlanTokens", "expiry_of", "read_capped", "signin_command"]
