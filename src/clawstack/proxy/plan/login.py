"""``claw proxy auth login``: the browser sign-in (OAuth authorization code with PKCE) on a loopback listener.

The flow binds ``listen``, prints the authorize URL, and waits for the browser to come back to
``http://<redirect_host>:<port>/auth/callback`` (``port`` is the port actually bound, so ``--listen
0.0.0.0:1455`` in a container still sends the browser to ``localhost:1455`` on the host). A callback whose
``state`` is missing or wrong is answered 400 and refused as forged, and the flow keeps waiting for the genuine
one. A genuine callback with ``error=`` ends the flow with that error. A genuine ``code`` is exchanged (with the
PKCE verifier) over TLS, the account is read from the id_token, and the record is saved before the browser is
told it may close the tab.

Neither the code, the state, the verifier nor any token is logged or shown; the listener keeps no access log.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import logging
import ssl
from collections.abc import Callable
from typing import Final

import aiohttp
from aiohttp import web

from clawstack.common.clock import Clock, SystemClock
from clawstack.proxy.plan.chatgpt import (
    DEFAULT_LISTEN,
    ISSUER,
    ORIGINATOR,
    REDIRECT_HOST,
    REDIRECT_PATH,
    account_from_id_token,
    authorize_url,
    code_exchange_form,
    error_codes,
    new_pkce,
    new_state,
    parse_token_response,
    redirect_uri,
    safe_code,
    token_url,
)
from clawstack.proxy.plan.errors import PlanLoginError, PlanStoreError
from clawstack.proxy.plan.store import AuthStore, SignIn
from clawstack.proxy.plan.tokens import MAX_TOKEN_ANSWER_BYTES, expiry_of, read_capped

log = logging.getLogger("clawstack.proxy.plan")
DEFAULT_TIMEOUT_S: Final = 600.0
_PAGE_HEADERS: Final = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
_FORGED_PAGE: Final = (
    "This sign-in callback does not belong to the sign-in that is waiting (its state does not match). "
    "Open the URL the sign-in command printed."
)


class _Callback:
    """The one sign-in the listener waits for."""

    def __init__(
        self,
        store: AuthStore,
        *,
        provider: str,
        issuer: str,
        ssl_context: ssl.SSLContext | None,
        clock: Clock,
        timeout_s: float,
    ) -> None:
        self.store = store
        self.provider = provider
        self.issuer = issuer
        self.ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.clock = clock
        self.timeout_s = timeout_s
        self.verifier, self.challenge = new_pkce()
        self.state = new_state()
        self.redirect = ""
        self.forged = 0
        self.claimed = False
        self.outcome: asyncio.Future[SignIn] = asyncio.get_running_loop().create_future()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        given = request.query.get("state", "")
        if not given or not hmac.compare_digest(given.encode(), self.state.encode()):
            self.forged += 1
            log.warning(
                "refused a %s sign-in callback with a %s state (%d refused so far)",
                self.provider,
                "wrong" if given else "missing",
                self.forged,
            )
            return _page(400, _FORGED_PAGE)
        if self.claimed:
            return _page(409, "This sign-in is already complete. You can close this tab.")
        self.claimed = True
        error = request.query.get("error")
        if error:
            code = safe_code(error)
            return await self._finish(
                request, PlanLoginError(f"the {self.provider} sign-in was refused: {code}", code="signin_denied")
            )
        code = request.query.get("code", "")
        if not code:
            failure = PlanLoginError(f"the {self.provider} sign-in callback carried no authorization code")
            return await self._finish(request, failure)
        try:
            signin = await self._exchange(code)
            await asyncio.to_thread(self.store.save, signin)
        except (PlanLoginError, PlanStoreError) as exc:
            return await self._finish(request, exc)
        return await self._finish(request, signin)

    async def _finish(
        self, request: web.Request, result: SignIn | PlanLoginError | PlanStoreError
    ) -> web.StreamResponse:
        if isinstance(result, SignIn):
            who = f" as {result.account_email}" if result.account_email else ""
            response = _page(200, f"Signed in to {self.provider}{who}. You can close this tab.")
        else:
            response = _page(400 if result.code == "signin_denied" else 502, f"Sign-in failed: {result.message}")
        # The answer reaches the browser before the flow ends and the listener stops.
        await response.prepare(request)
        await response.write_eof()
        if not self.outcome.done():
            if isinstance(result, SignIn):
                self.outcome.set_result(result)
            else:
                self.outcome.set_exception(result)
        return response

    async def _exchange(self, code: str) -> SignIn:
        form = code_exchange_form(code, redirect_uri=self.redirect, verifier=self.verifier)
        try:
            async with (
                asyncio.timeout(min(60.0, self.timeout_s)),
                aiohttp.ClientSession() as session,
                session.post(
                    token_url(self.issuer),
                    data=form,
                    headers={"originator": ORIGINATOR},
                    ssl=self.ssl,
                    allow_redirects=False,
                ) as answer,
            ):
                status, body = answer.status, await read_capped(answer, MAX_TOKEN_ANSWER_BYTES)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PlanLoginError(f"cannot reach the {self.provider} issuer ({type(exc).__name__})") from exc
        if status != 200:
            codes = ", ".join(sorted(error_codes(body))) or "no error code"
            raise PlanLoginError(
                f"the {self.provider} issuer refused the authorization code (status {status}: {codes})"
            )
        tokens = parse_token_response(body) if len(body) <= MAX_TOKEN_ANSWER_BYTES else None
        if tokens is None or tokens.id_token is None or tokens.refresh_token is None:
            raise PlanLoginError(f"the {self.provider} issuer's token answer is malformed or incomplete")
        email, account = account_from_id_token(tokens.id_token)
        now = self.clock.now()
        return SignIn(
            provider=self.provider,
            access_token=tokens.access_token,
            refresh_token=tokens.refresh_token,
            id_token=tokens.id_token,
            account_email=email,
            account_id=account,
            expires_at=expiry_of(tokens.expires_in_s, tokens.access_token, now),
            signed_in_at=now,
        )


def _page(status: int, text: str) -> web.Response:
    body = f"<!doctype html><title>clawstack sign-in</title><p>{html.escape(text)}</p>\n"
    return web.Response(status=status, text=body, content_type="text/html", headers=_PAGE_HEADERS)


async def login(
    store: AuthStore,
    *,
    provider: str = "chatgpt",
    issuer: str = ISSUER,
    listen: tuple[str, int] = DEFAULT_LISTEN,
    redirect_host: str = REDIRECT_HOST,
    ssl_context: ssl.SSLContext | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    print_url: Callable[[str], None] = print,
    clock: Clock | None = None,
) -> SignIn:
    """Run one browser sign-in for ``provider`` and save it in ``store``; return the saved sign-in.

    Raises :class:`PlanLoginError` (``signin_listen_failed``, ``signin_denied``, ``signin_failed``,
    ``signin_timeout`` after ``timeout_s``) or :class:`PlanStoreError` when the record cannot be saved.
    """
    store.path(provider)  # refuses an unknown provider before anything listens
    flow = _Callback(
        store,
        provider=provider,
        issuer=issuer,
        ssl_context=ssl_context,
        clock=clock if clock is not None else SystemClock(),
        timeout_s=timeout_s,
    )
    app = web.Application()
    app.router.add_get(REDIRECT_PATH, flow.handle)
    runner = web.AppRunner(app, access_log=None)  # an access log would record the code and the state
    await runner.setup()
    try:
        host, port = listen
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise PlanLoginError(
                f"cannot listen on {host}:{port} for the sign-in callback: {exc.strerror}", code="signin_listen_failed"
            ) from exc
        bound = runner.addresses[0][1]
        flow.redirect = redirect_uri(bound, host=redirect_host)
        print_url(authorize_url(issuer, redirect_uri=flow.redirect, challenge=flow.challenge, state=flow.state))
        try:
            async with asyncio.timeout(timeout_s):
                return await flow.outcome
        except TimeoutError as exc:
            raise PlanLoginError(
                f"no {provider} sign-in arrived within {timeout_s:g} s", code="signin_timeout"
            ) from exc
    finally:
        await runner.cleanup()


__all__ = ["DEFAULT_TIMEOUT_S", "login"]
