"""A synthetic "Sign in with ChatGPT" identity provider and plan backend, served over TLS with a test-only CA.

One aiohttp app answers what the real vendor does, strictly enough to catch a wrong request shape:

* ``GET /oauth/authorize`` checks the client id, the loopback redirect, PKCE S256 and the Codex extras, then
  redirects (302) to the redirect URI with ``code`` and ``state`` (or a scripted ``error``).
* ``POST /oauth/token``: the form-encoded ``authorization_code`` grant (PKCE verifier checked) issues an id_token
  (an unsigned but well-formed JWT with the email and the account id), an access token and a refresh token; the
  JSON ``refresh_token`` grant rotates them. Refresh outcomes can be scripted (``invalid_grant``...).
* ``POST /backend-api/codex/responses`` checks the bearer token and the account header, records every request,
  and answers a completed Responses SSE stream, or a scripted failure.

Use it from a test module with ``from tests.integration.proxy.plan_idp import PlanIdP, plan_idp_fixture  # noqa:
F401``; the fixture, named ``plan_idp``, yields a started :class:`PlanIdP` and stops it afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import re
import secrets
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from clawstack.common.clock import Clock, SystemClock
from clawstack.proxy.plan.chatgpt import AUTH_CLAIMS, CLIENT_ID, ORIGINATOR, pkce_challenge
from clawstack.proxy.plan.store import SignIn

Outcome = Literal["ok", "limit", "unauthorized", "forbidden", "not_included", "bad_request", "server_error", "cut"]
RefreshOutcome = Literal["ok", "invalid_grant", "expired", "server_error", "malformed"]
REDIRECT = re.compile(r"http://localhost:\d{1,5}/auth/callback")


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost: ``(ca_file, cert_file, key_file)``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "clawstack plan test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_file, cert_file, key_file


def fake_jwt(claims: dict[str, Any]) -> str:
    """An unsigned but well-formed JWT (three non-empty base64url parts) carrying ``claims``."""

    def part(value: dict[str, Any] | bytes) -> str:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return ".".join([part({"alg": "none", "typ": "JWT"}), part(claims), part(secrets.token_bytes(16))])


@dataclass(frozen=True)
class BackendRequest:
    """One request the plan backend received (headers lower-cased)."""

    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class IssuedTokens:
    grant: str
    access_token: str
    refresh_token: str
    id_token: str


@dataclass
class _Script:
    authorize_error: str | None = None
    token_error: str | None = None
    refresh: list[RefreshOutcome] = field(default_factory=list)
    backend: list[Outcome] = field(default_factory=list)
    refresh_delay_s: float = 0.0
    resets_in_s: int = 120
    reply_text: str = "Hello from the plan."


class PlanIdP:
    """The synthetic vendor. :meth:`start` it, point a plan route at :attr:`issuer` / :attr:`base_url` with
    ``ca_file``, and read :attr:`requests`, :attr:`tokens_issued` and :attr:`refreshes` afterwards."""

    def __init__(
        self,
        directory: Path,
        *,
        email: str = "you@example.com",
        account_id: str = "acct-test-0001",
        plan_type: str = "plus",
        expires_in: int | None = 3600,
        clock: Clock | None = None,
    ) -> None:
        self.email, self.account_id, self.plan_type, self.expires_in = email, account_id, plan_type, expires_in
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.ca_file, self._cert, self._key = make_tls(directory)
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._script = _Script()
        self._codes: dict[str, dict[str, str]] = {}
        self._active_access: set[str] = set()
        self._refresh_tokens: dict[str, bool] = {}  # token -> still usable
        self._secrets: set[str] = set()
        self.requests: list[BackendRequest] = []
        self.tokens_issued: list[IssuedTokens] = []
        self.authorize_requests: list[dict[str, str]] = []
        self.refreshes = 0
        self.refresh_started = asyncio.Event()  # set by the first refresh grant

    @property
    def issuer(self) -> str:
        return f"https://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        return f"{self.issuer}/backend-api/codex"

    def client_ssl(self) -> ssl.SSLContext:
        """A client context trusting only the test CA (what the test's "browser" uses)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return context

    def secrets(self) -> set[str]:
        """Every token, authorization code and PKCE verifier this IdP issued or saw: none may leak anywhere."""
        return set(self._secrets)

    def script(
        self,
        *,
        authorize_error: str | None = None,
        token_error: str | None = None,
        refresh: list[RefreshOutcome] | None = None,
        backend: list[Outcome] | None = None,
        refresh_delay_s: float = 0.0,
        resets_in_s: int = 120,
        reply_text: str = "Hello from the plan.",
    ) -> None:
        """Script what comes next. ``refresh`` and ``backend`` are queues (one entry per request, then "ok")."""
        self._script = _Script(
            authorize_error,
            token_error,
            list(refresh or []),
            list(backend or []),
            refresh_delay_s,
            resets_in_s,
            reply_text,
        )

    def revoke_access_tokens(self) -> None:
        """Make every access token issued so far unusable at the backend (it answers 401)."""
        self._active_access.clear()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/oauth/authorize", self._authorize)
        app.router.add_post("/oauth/token", self._token)
        app.router.add_post("/backend-api/codex/responses", self._responses)
        server_ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ssl.load_cert_chain(self._cert, self._key)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the "browser" ---------------------------------------------------------------------------------------

    async def authorize(self, url: str) -> str:
        """GET the authorize URL over TLS as a browser would; return the callback URL it redirects to."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, ssl=self.client_ssl(), allow_redirects=False) as answer,
        ):
            if answer.status != 302:
                raise AssertionError(f"authorize answered {answer.status}: {await answer.text()}")
            return answer.headers["Location"]

    @staticmethod
    async def visit(url: str) -> tuple[int, str]:
        """GET a (plain-http loopback) callback URL; return its status and page."""
        async with aiohttp.ClientSession() as session, session.get(url) as answer:
            return answer.status, await answer.text()

    async def browse(self, url: str) -> tuple[int, str]:
        """Sign in as the browser does: authorize, then follow the redirect to the local callback."""
        return await self.visit(await self.authorize(url))

    @staticmethod
    def with_query(url: str, **changes: str | None) -> str:
        """``url`` with query parameters replaced (``None`` removes one), e.g. a forged ``state``."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        for name, value in changes.items():
            if value is None:
                query.pop(name, None)
            else:
                query[name] = value
        return urlunsplit(parts._replace(query=urlencode(query)))

    # -- minting ---------------------------------------------------------------------------------------------

    def _issue(self, grant: str) -> dict[str, Any]:
        now = self._clock.now().timestamp()
        auth = {"chatgpt_account_id": self.account_id, "chatgpt_plan_type": self.plan_type}
        exp = now + (self.expires_in if self.expires_in is not None else 3600)
        access = fake_jwt({"exp": int(exp), AUTH_CLAIMS: auth, "jti": secrets.token_hex(8)})
        refresh = "rt_" + secrets.token_urlsafe(32)
        id_token = fake_jwt({"email": self.email, "exp": int(exp), AUTH_CLAIMS: auth, "jti": secrets.token_hex(8)})
        self._active_access.add(access)
        self._refresh_tokens[refresh] = True
        self._secrets.update({access, refresh, id_token})
        self.tokens_issued.append(IssuedTokens(grant, access, refresh, id_token))
        answer: dict[str, Any] = {"id_token": id_token, "access_token": access, "refresh_token": refresh}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        return answer

    def mint_signin(self, now: datetime, *, expires_in_s: float = 3600.0, provider: str = "chatgpt") -> SignIn:
        """A sign-in as a completed login would store, with tokens this IdP honours (no browser involved)."""
        tokens = self._issue("minted")
        return SignIn(
            provider=provider,
            access_token=tokens["access_token"],
            refresh_token=tokens["refresh_token"],
            id_token=tokens["id_token"],
            account_email=self.email,
            account_id=self.account_id,
            expires_at=now + timedelta(seconds=expires_in_s),
            signed_in_at=now,
        )

    # -- handlers --------------------------------------------------------------------------------------------

    async def _authorize(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.authorize_requests.append(query)
        expected = {
            "response_type": "code",
            "client_id": CLIENT_ID,
            "code_challenge_method": "S256",
            "id_token_add_organizations": "true",
            "codex_cli_simplified_flow": "true",
            "originator": ORIGINATOR,
        }
        for name, value in expected.items():
            if query.get(name) != value:
                return web.json_response({"error": "invalid_request", "error_description": name}, status=400)
        redirect, state = query.get("redirect_uri", ""), query.get("state", "")
        scopes = set(query.get("scope", "").split())
        if not REDIRECT.fullmatch(redirect) or not state or not {"openid", "offline_access"} <= scopes:
            return web.json_response(
                {"error": "invalid_request", "error_description": "redirect/state/scope"}, status=400
            )
        if not re.fullmatch(r"[A-Za-z0-9_-]{43}", query.get("code_challenge", "")):
            return web.json_response({"error": "invalid_request", "error_description": "code_challenge"}, status=400)
        if self._script.authorize_error is not None:
            target = {"error": self._script.authorize_error, "error_description": "scripted", "state": state}
        else:
            code = "ac_" + secrets.token_urlsafe(24)
            self._secrets.add(code)
            self._codes[code] = {"challenge": query["code_challenge"], "redirect_uri": redirect}
            target = {"code": code, "state": state}
        raise web.HTTPFound(f"{redirect}?{urlencode(target)}")

    async def _token(self, request: web.Request) -> web.StreamResponse:
        if request.content_type == "application/x-www-form-urlencoded":
            form = dict(await request.post())
            fields = {name: value for name, value in form.items() if isinstance(value, str)}
            return self._code_grant(fields)
        if request.content_type == "application/json":
            return await self._refresh_grant(await request.json())
        return web.json_response({"error": "invalid_request"}, status=415)

    def _code_grant(self, form: dict[str, str]) -> web.Response:
        self._secrets.update(value for name, value in form.items() if name in ("code", "code_verifier"))
        if self._script.token_error is not None:
            return web.json_response({"error": self._script.token_error}, status=400)
        entry = self._codes.pop(form.get("code", ""), None)
        if (
            form.get("grant_type") != "authorization_code"
            or form.get("client_id") != CLIENT_ID
            or entry is None
            or form.get("redirect_uri") != entry["redirect_uri"]
            or pkce_challenge(form.get("code_verifier", "")) != entry["challenge"]
        ):
            return web.json_response({"error": "invalid_grant"}, status=400)
        return web.json_response(self._issue("authorization_code"))

    async def _refresh_grant(self, body: Any) -> web.Response:
        self.refreshes += 1
        self.refresh_started.set()
        if self._script.refresh_delay_s:
            await asyncio.sleep(self._script.refresh_delay_s)
        outcome = self._script.refresh.pop(0) if self._script.refresh else "ok"
        if outcome == "invalid_grant":
            return web.json_response({"error": "invalid_grant", "error_description": "scripted"}, status=400)
        if outcome == "expired":
            return web.json_response({"error": {"code": "refresh_token_expired", "message": "scripted"}}, status=401)
        if outcome == "server_error":
            return web.json_response({"error": "server_error"}, status=500)
        if outcome == "malformed":
            return web.Response(text="<html>not json</html>", content_type="text/html")
        if (
            not isinstance(body, dict)
            or body.get("client_id") != CLIENT_ID
            or body.get("grant_type") != "refresh_token"
        ):
            return web.json_response({"error": "invalid_request"}, status=400)
        token = body.get("refresh_token")
        if not isinstance(token, str) or token not in self._refresh_tokens:
            return web.json_response({"error": "invalid_grant"}, status=400)
        if not self._refresh_tokens[token]:
            return web.json_response({"error": {"code": "refresh_token_reused", "message": "reused"}}, status=401)
        self._refresh_tokens[token] = False  # rotation: each refresh token works once
        return web.json_response(self._issue("refresh_token"))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            body = await request.json()
        except ValueError:
            body = None
        self.requests.append(BackendRequest(headers, body))
        bearer = headers.get("authorization", "").removeprefix("Bearer ")
        if bearer not in self._active_access:
            return web.json_response({"detail": "Unauthorized"}, status=401)
        if headers.get("chatgpt-account-id") != self.account_id:
            return web.json_response({"detail": "account mismatch"}, status=403)
        problem = _shape_problem(body)
        if problem is not None:
            return web.json_response({"detail": problem}, status=400)
        outcome = self._script.backend.pop(0) if self._script.backend else "ok"
        if outcome != "ok" and outcome != "cut":
            return _failure(outcome, self._script.resets_in_s, self._clock.now())
        return await self._stream(request, body, cut=outcome == "cut")

    async def _stream(self, request: web.Request, body: dict[str, Any], *, cut: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        rid, mid, text = "resp_" + secrets.token_hex(6), "msg_" + secrets.token_hex(6), self._script.reply_text
        item = {"type": "message", "id": mid, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": {"id": rid, "status": "in_progress", "model": body.get("model")}},
            {
                "type": "response.output_text.delta",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "delta": text,
            },
        ]
        if not cut:
            events += [
                {"type": "response.output_item.done", "output_index": 0, "item": item},
                {"type": "response.completed", "response": {
                    "id": rid, "object": "response", "status": "completed", "model": body.get("model"),
                    "output": [item], "usage": {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}}},
            ]  # fmt: skip
        for event in events:
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response


def _shape_problem(body: Any) -> str | None:
    """What the real backend refuses in a request body, in its words; ``None`` when the shape is right."""
    if not isinstance(body, dict):
        return "Request body must be a JSON object"
    if body.get("stream") is not True:
        return "Stream must be set to true"
    if body.get("store") is not False:
        return "Store must be set to false"
    if not isinstance(body.get("instructions"), str):
        return "Instructions are required"
    for name in ("temperature", "top_p", "max_output_tokens"):
        if name in body:
            return f"Unsupported parameter: {name}"
    return None


def _failure(outcome: Outcome, resets_in_s: int, now: datetime) -> web.Response:
    if outcome == "limit":
        error = {"type": "usage_limit_reached", "message": "The usage limit has been reached", "plan_type": "plus",
                 "resets_in_seconds": resets_in_s, "resets_at": int(now.timestamp()) + resets_in_s}  # fmt: skip
        return web.json_response({"error": error}, status=429)
    if outcome == "not_included":
        return web.json_response({"error": {"type": "usage_not_included", "message": "not included"}}, status=403)
    status = {"unauthorized": 401, "forbidden": 403, "bad_request": 400, "server_error": 500}[outcome]
    return web.json_response({"error": {"type": "scripted", "message": outcome}}, status=status)


@pytest.fixture(name="plan_idp")
async def plan_idp_fixture(tmp_path: Path) -> AsyncIterator[PlanIdP]:
    """A started :class:`PlanIdP` (certificates under ``tmp_path/plan-idp``), stopped after the test."""
    idp = PlanIdP(tmp_path / "plan-idp")
    await idp.start()
    try:
        yield idp
    finally:
        await idp.stop()


__all__ = [
    "BackendRequest",
    "IssuedTokens",
    "Outcome",
    "PlanIdP",
    "RefreshOutcome",
    "fake_jwt",
    "make_tls",
    "plan_idp_fixture",
]
