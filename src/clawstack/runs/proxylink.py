"""The supervisor's connection to the pod's proxy, over its operator and worker Unix sockets.

Every call goes through the operator API with the pod's operator token. Errors stay the proxy's own
(:class:`~clawstack.proxy.errors.ProxyError` with its ``code``, ``status`` and ``retryable``), so the run driver
can tell a proxy that is away (retry) from one that refuses for good (end the run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from clawstack.models.refs import CREDENTIAL_CLASSES, PLAN_REASONS
from clawstack.pod.artifacts import PodPaths, existing_operator_token
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.identities import MAX_IDENTITY_LIFETIME, ChainEntry

IDENTITY_GRACE: Final = timedelta(minutes=5)
"""How long a run's identity outlives its authority: the supervisor revokes it at the authority, and the proxy's
own expiry is only the backstop for a supervisor that is not there to do so."""


def identity_expiry(authority_expires_at: datetime, now: datetime, grace: timedelta = IDENTITY_GRACE) -> datetime:
    """The proxy-side expiry of a run's identity: its authority plus ``grace``, never past the proxy's lifetime
    bound (an authority is at most the template's max-authority, at most 7 days, away, so it stays covered)."""
    return min(authority_expires_at + grace, now + MAX_IDENTITY_LIFETIME).replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class Usage:
    """Which credential classes served a run's completed model calls, as the proxy reported it."""

    served_by: dict[str, int]
    complete: bool
    last_plan_failure: str | None


def read_usage(description: Mapping[str, Any]) -> Usage | None:
    """The usage in an identity description; ``None`` when the proxy reported none. A malformed report keeps its
    well-formed counts and is marked incomplete; so is a count from a proxy that restarted during the run."""
    if "served_by" not in description:
        return None
    raw, complete = description.get("served_by"), description.get("served_by_complete") is True
    counts: dict[str, int] = {}
    if isinstance(raw, Mapping):
        for cls, count in raw.items():
            if cls in CREDENTIAL_CLASSES and isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                counts[cls] = count
            else:
                complete = False
    else:
        complete = False
    failure = description.get("last_plan_failure")
    if failure is not None and failure not in PLAN_REASONS:
        failure, complete = None, False
    return Usage(counts, complete, failure)


class ProxyLink:
    """The operator calls the supervisor makes, each on a fresh connection."""

    def __init__(self, paths: PodPaths) -> None:
        self.paths = paths

    def _client(self) -> ProxyOperatorClient:
        token = existing_operator_token(self.paths)
        if token is None:
            raise ProxyError(
                "the pod's proxy configuration is missing; run claw up", code="proxy_unconfigured", retryable=True
            )
        return ProxyOperatorClient(token=token, unix_socket=str(self.paths.operator_socket))

    async def self_test(self) -> None:
        async with self._client() as client:
            await client.self_test(worker_unix_socket=str(self.paths.worker_socket))

    async def create_identity(
        self,
        *,
        identity_id: str,
        secret: str,
        chain: list[ChainEntry],
        tools: list[str],
        expires_at: datetime,
        labels: Mapping[str, str],
    ) -> dict[str, Any]:
        """Create the identity, or find it with the same grant; returns its description (``expires_at`` is the
        stored one, which a moved authority may since have changed)."""
        async with self._client() as client:
            return await client.create_identity(
                identity_id=identity_id, secret=secret, chain=chain, tools=tools, expires_at=expires_at, labels=labels
            )

    async def set_expiry(self, identity_id: str, expires_at: datetime) -> None:
        """Move the identity's expiry; returns once the proxy has it on disk."""
        async with self._client() as client:
            await client.set_expiry(identity_id, expires_at)

    async def revoke(self, identity_id: str) -> None:
        """Revoke through the durable fence; returns only on the proxy's terminal 200 with an emptied allowlist
        (an id the proxy never saw is recorded too, so it can never be created)."""
        async with self._client() as client:
            result = await client.revoke(identity_id)
        if result.get("revoked") is not True or result.get("tools") != []:
            raise ProxyError("the proxy did not acknowledge the revocation", code="revocation_unacknowledged")

    async def usage(self, identity_id: str) -> Usage | None:
        """What the proxy counted for the identity; ``None`` when it reports nothing or never saw the id."""
        async with self._client() as client:
            try:
                description = await client.get_identity(identity_id)
            except ProxyError as exc:
                if exc.code == "identity_unknown":
                    return None
                raise
        return read_usage(description)

    async def subscriptions(self) -> dict[str, Any]:
        """The proxy's ``GET /v1/subscriptions`` (raises ``subscriptions_unsupported`` without plan routes)."""
        async with self._client() as client:
            body = await client.subscriptions()
        states = body.get("subscriptions") if isinstance(body, dict) else None
        if not isinstance(states, list):
            raise ProxyError("the proxy's subscriptions answer is malformed", code="proxy_bad_answer")
        keep = ("provider", "state", "account", "limited_until")  # never anything else, so never a token
        return {"subscriptions": [{k: s[k] for k in keep if isinstance(s, dict) and k in s} for s in states]}

    async def capture_epoch(self) -> int | None:
        async with self._client() as client:
            epoch = (await client.health()).get("capture_epoch")
        return epoch if isinstance(epoch, int) else None


__all__ = ["IDENTITY_GRACE", "ProxyLink", "Usage", "identity_expiry", "read_usage"]
