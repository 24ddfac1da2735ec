"""Every vendor fact of the ChatGPT plan route: the OAuth constants, the request shape and the failure table.

"Sign in with ChatGPT" is the OAuth 2.0 authorization-code flow with PKCE (S256) that the open-source Codex CLI
uses, with Codex's public client id and its registered loopback redirect. The plan backend speaks the OpenAI
Responses API, streamed (SSE) only, never stored, and always with ``instructions``.

Nothing here does I/O: the functions build URLs, bodies and headers, and read what the vendor answers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

from clawstack.proxy.plan.errors import PlanReason, PlanUnsupported

ISSUER: Final = "https://auth.openai.com"
AUTHORIZE_PATH: Final = "/oauth/authorize"
TOKEN_PATH: Final = "/oauth/token"  # noqa: S105 (a path)
CLIENT_ID: Final = "app_EMoamEEZ73f0CkXaXp7hrann"
SCOPES: Final = ("openid", "profile", "email", "offline_access")
REDIRECT_PATH: Final = "/auth/callback"
REDIRECT_HOST: Final = "localhost"
DEFAULT_LISTEN: Final = ("127.0.0.1", 1455)
ORIGINATOR: Final = "codex_cli_rs"
AUTHORIZE_EXTRA: Final = {
    "id_token_add_organizations": "true",
    "codex_cli_simplified_flow": "true",
    "originator": ORIGINATOR,
}
BACKEND_URL: Final = "https://chatgpt.com/backend-api/codex"
RESPONSES_PATH: Final = "/responses"
POLICY_ENDPOINT: Final = "https://api.openai.com/v1"
AUTH_CLAIMS: Final = "https://api.openai.com/auth"
PROFILE_CLAIMS: Final = "https://api.openai.com/profile"
#: When an access token carries no expiry, refresh it once it is this old (the Codex CLI's interval).
REFRESH_INTERVAL_S: Final = 8 * 24 * 3600.0

#: Refresh-token error codes that mean the sign-in is over: the operator must sign in again.
REFRESH_REFUSED_CODES: Final = frozenset(
    {"invalid_grant", "refresh_token_expired", "refresh_token_reused", "refresh_token_invalidated"}
)
#: Tool types the plan route forwards; every other type is a provider-hosted tool.
LOCAL_TOOL_TYPES: Final = frozenset({"function", "custom"})
#: Body fields the plan backend refuses: sampling settings and output-token limits.
DROPPED_FIELDS: Final = ("temperature", "top_p", "max_output_tokens", "max_tokens", "max_completion_tokens")
_LIMIT_CODES: Final = frozenset({"usage_limit_reached", "rate_limit_exceeded", "insufficient_quota"})
_NOT_ELIGIBLE_CODES: Final = frozenset({"usage_not_included"})
_REQUEST_FAULT_CODES: Final = frozenset({"context_length_exceeded", "invalid_request_error"})


def pkce_challenge(verifier: str) -> str:
    """The S256 code challenge: base64url(sha256(verifier)) without padding."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def new_pkce() -> tuple[str, str]:
    """A fresh ``(verifier, challenge)``: 64 random bytes as unpadded base64url (86 characters)."""
    verifier = base64.urlsafe_b64encode(secrets.token_bytes(64)).rstrip(b"=").decode("ascii")
    return verifier, pkce_challenge(verifier)


def new_state() -> str:
    """A fresh OAuth ``state``: 32 random bytes, base64url."""
    return secrets.token_urlsafe(32)


def redirect_uri(port: int, *, host: str = REDIRECT_HOST) -> str:
    """The loopback redirect the browser returns to: ``http://localhost:<port>/auth/callback``."""
    return f"http://{host}:{port}{REDIRECT_PATH}"


def authorize_url(issuer: str, *, redirect_uri: str, challenge: str, state: str) -> str:
    """The URL the operator opens to sign in."""
    query = {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": redirect_uri,
        "scope": " ".join(SCOPES),
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        **AUTHORIZE_EXTRA,
        "state": state,
    }
    return f"{issuer.rstrip('/')}{AUTHORIZE_PATH}?{urlencode(query)}"


def token_url(issuer: str) -> str:
    """The issuer's token endpoint (code exchange and refresh)."""
    return f"{issuer.rstrip('/')}{TOKEN_PATH}"


def code_exchange_form(code: str, *, redirect_uri: str, verifier: str) -> dict[str, str]:
    """The form-encoded body that exchanges an authorization code for tokens."""
    return {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "client_id": CLIENT_ID,
        "code_verifier": verifier,
    }


def refresh_body(refresh_token: str) -> dict[str, str]:
    """The JSON body of a refresh-token grant, as the current Codex CLI sends it (no ``scope``)."""
    return {"client_id": CLIENT_ID, "grant_type": "refresh_token", "refresh_token": refresh_token}


@dataclass(frozen=True, slots=True)
class TokenSet:
    """What the token endpoint answered. Token values are left out of ``repr``."""

    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    id_token: str | None = field(repr=False)
    expires_in_s: float | None


def parse_token_response(body: bytes) -> TokenSet | None:
    """Read a token-endpoint answer; ``None`` when it is not a JSON object with a non-empty ``access_token``."""
    data = _json_object(body)
    if data is None:
        return None
    access = data.get("access_token")
    if not isinstance(access, str) or not access:
        return None

    def text(name: str) -> str | None:
        value = data.get(name)
        return value if isinstance(value, str) and value else None

    expires = data.get("expires_in")
    expires_in_s: float | None = None
    if isinstance(expires, int | float) and not isinstance(expires, bool) and 0 < expires < 10**9:
        expires_in_s = float(expires)
    return TokenSet(access, text("refresh_token"), text("id_token"), expires_in_s)


def jwt_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT, decoded WITHOUT verifying its signature; ``{}`` when it is not a JWT.

    Only tokens the issuer just handed us over TLS (or that we stored from it) are read this way, to learn the
    account they name and when they expire; nothing is authorised on the strength of these claims.
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return {}
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        payload = json.loads(raw)
    except (binascii.Error, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def account_from_id_token(id_token: str) -> tuple[str | None, str | None]:
    """``(email, chatgpt_account_id)`` from an id_token's claims (decoded without verification, see
    :func:`jwt_claims`); either is ``None`` when absent."""
    claims = jwt_claims(id_token)
    email = claims.get("email")
    if not isinstance(email, str):
        profile = claims.get(PROFILE_CLAIMS)
        email = profile.get("email") if isinstance(profile, dict) else None
    auth = claims.get(AUTH_CLAIMS)
    account = auth.get("chatgpt_account_id") if isinstance(auth, dict) else None
    return (
        email if isinstance(email, str) and email else None,
        account if isinstance(account, str) and account else None,
    )


def jwt_expiry(token: str) -> datetime | None:
    """A JWT's ``exp`` claim as UTC time (decoded without verification); ``None`` when absent or not a JWT."""
    exp = jwt_claims(token).get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    try:
        return datetime.fromtimestamp(exp, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def responses_url(base_url: str) -> str:
    """The plan backend's Responses endpoint under ``base_url``."""
    return f"{base_url.rstrip('/')}{RESPONSES_PATH}"


def plan_headers(access_token: str, account_id: str | None, session_id: str) -> dict[str, str]:
    """The headers of one plan-backend request; no account header when the sign-in names no account."""
    headers = {
        "Authorization": f"Bearer {access_token}",
        "OpenAI-Beta": "responses=experimental",
        "originator": ORIGINATOR,
        "session_id": session_id,
        "Accept": "text/event-stream",
        "Content-Type": "application/json",
    }
    if account_id:
        headers["ChatGPT-Account-ID"] = account_id
    return headers


def shape_plan_request(responses_body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses API body shaped for the plan backend (a new top-level dict; nested values are shared).

    Drops sampling settings and output-token limits, sets ``stream: true`` and ``store: false``, and sets
    ``instructions`` to ``""`` when absent. Raises :class:`PlanUnsupported` for a provider-hosted tool (a tool
    type other than function/custom, or such a ``tool_choice`` type other than ``allowed_tools``), for ``n``
    other than 1, and for ``background: true``.
    """
    n = responses_body.get("n")
    if n is not None and n != 1:
        raise PlanUnsupported("the plan route returns one completion per request (n must be 1)")
    if responses_body.get("background") is True:
        raise PlanUnsupported("the plan route does not run background responses")
    tools = responses_body.get("tools") or []
    if not isinstance(tools, list):
        raise PlanUnsupported("tools must be a list")
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind not in LOCAL_TOOL_TYPES:
            raise PlanUnsupported(f"the plan route does not forward provider-hosted tools (type {safe_code(kind)})")
    choice = responses_body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") not in (*LOCAL_TOOL_TYPES, "allowed_tools"):
        raise PlanUnsupported(
            f"the plan route does not forward provider-hosted tools (type {safe_code(choice.get('type'))})"
        )
    shaped = {key: value for key, value in responses_body.items() if key not in DROPPED_FIELDS}
    shaped.pop("n", None)
    shaped.pop("background", None)
    shaped["stream"] = True
    shaped["store"] = False
    if shaped.get("instructions") is None:
        shaped["instructions"] = ""
    return shaped


def safe_code(value: object) -> str:
    """A vendor- or caller-supplied code, fit for a message: short and of code characters only."""
    text = value if isinstance(value, str) else ""
    cleaned = "".join(ch for ch in text[:64] if ch.isalnum() or ch in "_-.")
    return cleaned or "unknown"


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _error_object(body: bytes) -> dict[str, Any]:
    """The ``error`` object of an error body or of a ``response.failed`` event's data; ``{}`` when none."""
    data = _json_object(body)
    if data is None:
        return {}
    response = data.get("response")
    if isinstance(response, dict) and isinstance(response.get("error"), dict):
        error: Any = response["error"]
    else:
        error = data.get("error")
    if isinstance(error, str):
        return {"code": error}
    if isinstance(error, dict):
        return error
    return {"code": data["code"]} if isinstance(data.get("code"), str) else {}


def error_codes(body: bytes) -> frozenset[str]:
    """The ``type`` and ``code`` strings of a vendor error body (OAuth's ``{"error": "<code>"}`` too)."""
    error = _error_object(body)
    return frozenset(safe_code(value) for key in ("type", "code") if isinstance(value := error.get(key), str))


def refresh_refused(status: int, body: bytes) -> bool:
    """True when a refresh answer means the sign-in is over (401, or a refused-grant code), not a passing fault."""
    return status == 401 or (400 <= status < 500 and bool(error_codes(body) & REFRESH_REFUSED_CODES))


def classify_plan_failure(status: int | None, body: bytes) -> PlanReason:
    """The plan-failure reason for a backend answer that did not serve the request.

    ``status`` is ``None`` for a transport fault (connection, TLS, timeout, a stream cut short); a
    ``response.failed`` event's data may be passed with the stream's status (200). A 401 maps to sign-in
    required, so classify one only after the single forced refresh has been tried.
    """
    codes = error_codes(body)
    if codes & _NOT_ELIGIBLE_CODES:
        return "subscription_not_eligible"
    if codes & _LIMIT_CODES or status == 429:
        return "subscription_limit_reached"
    if status == 401:
        return "subscription_signin_required"
    if status in (402, 403):
        return "subscription_not_eligible"
    if status in (400, 404, 413, 415, 422) or ((status is None or status < 400) and codes & _REQUEST_FAULT_CODES):
        return "subscription_unsupported_request"
    return "subscription_unavailable"


def limit_reset_s(body: bytes, *, now: datetime | None = None) -> float | None:
    """Seconds until a spent plan resets, from ``resets_in_seconds`` or ``resets_at`` (Unix seconds, read against
    ``now``, default the system clock); ``None`` when the answer says neither."""
    error = _error_object(body)
    relative = error.get("resets_in_seconds")
    if isinstance(relative, int | float) and not isinstance(relative, bool) and relative >= 0:
        return float(relative)
    absolute = error.get("resets_at")
    if isinstance(absolute, int | float) and not isinstance(absolute, bool):
        current = (now or datetime.now(UTC)).timestamp()
        return max(0.0, float(absolute) - current)
    return None


__all__ = [
    "AUTHORIZE_EXTRA",
    "AUTHORIZE_PATH",
    "AUTH_CLAIMS",
    "BACKEND_URL",
    "CLIENT_ID",
    "DEFAULT_LISTEN",
    "DROPPED_FIELDS",
    "ISSUER",
    "LOCAL_TOOL_TYPES",
    "ORIGINATOR",
    "POLICY_ENDPOINT",
    "REDIRECT_HOST",
    "REDIRECT_PATH",
    "REFRESH_INTERVAL_S",
    "REFRESH_REFUSED_CODES",
    "RESPONSES_PATH",
    "SCOPES",
    "TOKEN_PATH",
    "TokenSet",
    "account_from_id_token",
    "authorize_url",
    "classify_plan_failure",
    "code_exchange_form",
    "error_codes",
    "jwt_claims",
    "jwt_expiry",
    "limit_reset_s",
    "new_pkce",
    "new_state",
    "parse_token_response",
    "pkce_challenge",
    "plan_headers",
    "redirect_uri",
    "refresh_body",
    "refresh_refused",
    "responses_url",
    "safe_code",
    "shape_plan_request",
    "token_url",
]
