"""The operator client of the proxy, for the supervisor and for ``claw proxy`` commands.

It speaks the operator API over a peer-checked Unix socket (:class:`clawstack.common.uds.AsyncUnixClient`) or
loopback TCP, always with the operator token. Errors from the proxy come back as :class:`ProxyError` with the
proxy's own ``code`` and HTTP ``status``; a proxy that cannot be reached is ``proxy_unreachable`` (retryable).

:meth:`ProxyOperatorClient.self_test` is the revocation self-test the supervisor runs before it serves and before
each worker starts: create a throw-away identity, revoke it, prove that the worker API refuses it, and prove that
the revocation record is on disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from clawstack.common.clock import Clock, SystemClock, format_timestamp
from clawstack.common.errors import ClawError
from clawstack.common.ids import new_id, new_secret
from clawstack.common.uds import AsyncUnixClient
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.identities import ChainEntry

SELF_TEST_REF = "openai/revocation-self-test"


@dataclass(frozen=True, slots=True)
class SelfTestReport:
    """What the revocation self-test proved."""

    identity_id: str
    revoked: bool
    refused_code: str | None
    durable: bool
    duration_ms: float

    @property
    def passed(self) -> bool:
        return self.revoked and self.refused_code == "identity_revoked" and self.durable


def _error_from(status: int, body: bytes) -> ProxyError:
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "proxy_error", f"the proxy answered HTTP {status}"
    return ProxyError(message, code=code, status=status, retryable=status >= 500)


class ProxyOperatorClient:
    """Async client of the operator API. Give ``unix_socket`` or ``base_url`` (``http://127.0.0.1:PORT``)."""

    def __init__(
        self,
        *,
        token: str,
        unix_socket: str | None = None,
        base_url: str | None = None,
        server_uid: int | None = None,
        timeout_s: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if (unix_socket is None) == (base_url is None):
            raise ValueError("give exactly one of unix_socket and base_url")
        self._token = token
        self._timeout_s = timeout_s
        self._clock = clock or SystemClock()
        self._uds = AsyncUnixClient(unix_socket, server_uid=server_uid) if unix_socket is not None else None
        self._base_url = base_url.rstrip("/") if base_url is not None else None
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        where = self._base_url if self._base_url is not None else f"unix:{self._uds.path if self._uds else ''}"
        return f"ProxyOperatorClient({where})"

    async def close(self) -> None:
        if self._uds is not None:
            await self._uds.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> ProxyOperatorClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self._token}"}
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            if self._uds is not None:
                response = await self._uds.request(method, path, body=data, headers=headers, timeout_s=self._timeout_s)
                status, payload = response.status, response.body
            else:
                if self._session is None:
                    self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
                async with self._session.request(
                    method, f"{self._base_url}{path}", data=data, headers=headers, allow_redirects=False
                ) as resp:
                    status, payload = resp.status, await resp.read()
        except ProxyError:
            raise
        except (ClawError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ProxyError(
                "the proxy's operator API cannot be reached", code="proxy_unreachable", status=503, retryable=True
            ) from exc
        if status >= 400:
            raise _error_from(status, payload)
        try:
            return status, json.loads(payload)
        except ValueError as exc:
            raise ProxyError("the proxy answered with a malformed body", code="proxy_bad_response") from exc

    async def create_identity(
        self,
        *,
        identity_id: str,
        secret: str,
        chain: Sequence[ChainEntry],
        tools: Sequence[str],
        expires_at: datetime,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create (or idempotently re-create) an identity; returns its description."""
        _, body = await self._call(
            "POST",
            "/v1/identities",
            {
                "id": identity_id,
                "secret": secret,
                "chain": [entry.to_dict() for entry in chain],
                "tools": list(tools),
                "expires_at": format_timestamp(expires_at),
                "labels": dict(labels or {}),
            },
        )
        return body  # type: ignore[no-any-return]

    async def set_expiry(self, identity_id: str, expires_at: datetime) -> dict[str, Any]:
        """Move a live identity's expiry; returns its description once the change is on the proxy's disk."""
        _, body = await self._call(
            "POST", f"/v1/identities/{identity_id}/expiry", {"expires_at": format_timestamp(expires_at)}
        )
        return body  # type: ignore[no-any-return]

    async def get_identity(self, identity_id: str) -> dict[str, Any]:
        _, body = await self._call("GET", f"/v1/identities/{identity_id}")
        return body  # type: ignore[no-any-return]

    async def revoke(self, identity_id: str) -> dict[str, Any]:
        """Revoke durably. Returns only after the proxy recorded it (a terminal 200)."""
        _, body = await self._call("POST", f"/v1/identities/{identity_id}/revoke")
        return body  # type: ignore[no-any-return]

    async def durable_revocation(self, identity_id: str) -> dict[str, Any]:
        _, body = await self._call("GET", f"/v1/revocations/{identity_id}")
        return body  # type: ignore[no-any-return]

    async def subscriptions(self) -> dict[str, Any]:
        """``GET /v1/subscriptions``: the plan sign-ins' state (``subscriptions_unsupported`` without plan routes)."""
        _, body = await self._call("GET", "/v1/subscriptions")
        return body  # type: ignore[no-any-return]

    async def health(self) -> dict[str, Any]:
        _, body = await self._call("GET", "/v1/health")
        return body  # type: ignore[no-any-return]

    async def self_test(
        self, *, worker_base_url: str | None = None, worker_unix_socket: str | None = None
    ) -> SelfTestReport:
        """The revocation self-test against the worker API at ``worker_base_url`` (``http://…/v1``) or on
        ``worker_unix_socket``. Raises ``ProxyError(code="revocation_self_test_failed")`` unless it passes."""
        if (worker_base_url is None) == (worker_unix_socket is None):
            raise ValueError("give exactly one of worker_base_url and worker_unix_socket")
        started = self._clock.monotonic()
        identity_id, secret = new_id("selftest-"), new_secret()
        await self.create_identity(
            identity_id=identity_id,
            secret=secret,
            chain=[ChainEntry(slot="primary", ref=SELF_TEST_REF)],
            tools=[],
            expires_at=self._clock.now() + timedelta(minutes=5),
            labels={"purpose": "revocation-self-test"},
        )
        revoked = (await self.revoke(identity_id)).get("revoked") is True
        refused = await _worker_refusal(
            worker_base_url or "http://proxy/v1", worker_unix_socket, f"{identity_id}:{secret}", self._timeout_s
        )
        durable = (await self.durable_revocation(identity_id)).get("durable") is True
        report = SelfTestReport(identity_id, revoked, refused, durable, (self._clock.monotonic() - started) * 1000)
        if not report.passed:
            raise ProxyError(
                f"revocation self-test failed (revoked={revoked}, refusal={refused}, durable={durable})",
                code="revocation_self_test_failed",
                status=503,
                retryable=True,
            )
        return report


async def _worker_refusal(
    worker_base_url: str, worker_unix_socket: str | None, credential: str, timeout_s: float
) -> str | None:
    """Call the worker API with a credential; return the refusal code, or ``None`` if it was served."""
    connector = aiohttp.UnixConnector(path=worker_unix_socket) if worker_unix_socket else None
    try:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(
                worker_base_url.rstrip("/") + "/models", headers={"Authorization": f"Bearer {credential}"}
            ) as resp,
        ):
            if resp.status < 400:
                return None
            body = await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ProxyError(
            "the proxy's worker API cannot be reached", code="proxy_unreachable", status=503, retryable=True
        ) from exc
    return _error_from(resp.status, body).code


__all__ = ["SELF_TEST_REF", "ProxyOperatorClient", "SelfTestReport"]
