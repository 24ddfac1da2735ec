"""Per-run identities and their store.

An identity is what one worker holds: an id and a secret (the worker sends ``<id>:<secret>``), the model chain of
its template in routing order, the managed tools it may call, an expiry and the supervisor's opaque labels. The
proxy keeps only a SHA-256 of the secret. Identities live in SQLite (WAL, ``synchronous=FULL``) and in memory;
revocation is *not* decided here but by the revocation ledger, which survives whatever happens to this store.

Identity ids are never reused: a row is kept after revocation or expiry, so an id the ledger compacted away can
never come back to life.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

from clawstack.common.clock import format_timestamp, parse_timestamp
from clawstack.common.files import ensure_private_dir
from clawstack.common.ids import secrets_equal
from clawstack.common.sqlite import DatabaseError, create_private_file
from clawstack.proxy.errors import ConflictError, ProxyError

IDENTITY_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]
MAX_IDENTITY_LIFETIME: Final = timedelta(days=7)
"""The furthest an identity's expiry may be from the time it is created or moved."""


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One slot of a model chain: ``primary``, ``fallback``, ``fallback-2``…, with its per-slot options."""

    slot: str
    ref: str
    reasoning_effort: ReasoningEffort | None = None
    provider_preferences: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"slot": self.slot, "ref": self.ref}
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        if self.provider_preferences is not None:
            out["provider_preferences"] = dict(self.provider_preferences)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChainEntry:
        prefs = data.get("provider_preferences")
        return cls(
            slot=data["slot"],
            ref=data["ref"],
            reasoning_effort=data.get("reasoning_effort"),
            provider_preferences=dict(prefs) if prefs is not None else None,
        )


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(slots=True, eq=False)
class Identity:
    """A per-run identity. Mutable fields change only through the proxy service."""

    id: str
    secret_sha256: str
    chain: tuple[ChainEntry, ...]
    tools: tuple[str, ...]
    expires_at: datetime
    labels: dict[str, str]
    created_at: datetime
    boot_id: str
    revoked_at: datetime | None = None
    served_by: dict[str, int] = field(default_factory=dict)
    last_plan_failure: str | None = None
    inflight: set[asyncio.Task[Any]] = field(default_factory=set)

    def secret_matches(self, secret: str) -> bool:
        return secrets_equal(hash_secret(secret), self.secret_sha256)

    def same_grant(self, other: Identity) -> bool:
        """Whether a repeated create describes this identity (for idempotent creation).

        The expiry is not part of the grant: it moves with the run's authority (``set_expiry``), and a repeated
        create answers with the stored one, which the caller compares with what it wants."""
        return (
            secrets_equal(self.secret_sha256, other.secret_sha256)
            and self.chain == other.chain
            and self.tools == other.tools
            and self.labels == other.labels
        )

    def state(self, now: datetime) -> Literal["active", "revoked", "expired"]:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if now >= self.expires_at else "active"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS identities (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    chain TEXT NOT NULL,
    tools TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    revoked_at TEXT,
    served_by TEXT NOT NULL DEFAULT '{}',
    last_plan_failure TEXT
)
"""


class IdentityStore:
    """SQLite-backed identities with an in-memory index. One writer: the proxy process."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._db: sqlite3.Connection | None = None
        self._cache: dict[str, Identity] = {}

    def open(self) -> None:
        ensure_private_dir(self._directory)
        path = self._directory / "identities.sqlite3"
        try:
            create_private_file(path)  # 0600 from the start, and so its -wal and -shm
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(_SCHEMA)
            rows = db.execute("SELECT * FROM identities").fetchall()
        except (sqlite3.Error, DatabaseError) as exc:
            raise ProxyError("the identity store cannot be opened", code="identity_store_unavailable") from exc
        self._db = db
        self._cache = {row[0]: _from_row(row) for row in rows}

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def get(self, identity_id: str) -> Identity | None:
        return self._cache.get(identity_id)

    def __iter__(self) -> Iterator[Identity]:
        return iter(list(self._cache.values()))

    def __len__(self) -> int:
        return len(self._cache)

    def create(self, identity: Identity) -> tuple[Identity, bool]:
        """Insert ``identity`` durably; return ``(stored, created)``.

        A repeat with the same grant returns the stored identity and ``False``; anything else under a used id
        is a :class:`ConflictError`.
        """
        existing = self._cache.get(identity.id)
        if existing is not None:
            if existing.same_grant(identity):
                return existing, False
            raise ConflictError("an identity with this id exists with another grant", code="identity_conflict")
        self._write(
            "INSERT INTO identities VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                identity.id,
                identity.secret_sha256,
                json.dumps([entry.to_dict() for entry in identity.chain]),
                json.dumps(list(identity.tools)),
                format_timestamp(identity.expires_at),
                json.dumps(identity.labels),
                format_timestamp(identity.created_at),
                identity.boot_id,
                None,
                "{}",
                None,
            ),
        )
        self._cache[identity.id] = identity
        return identity, True

    def save_revoked(self, identity: Identity) -> None:
        """Persist the revoked state (emptied allowlist) and usage of ``identity``."""
        revoked = format_timestamp(identity.revoked_at) if identity.revoked_at is not None else None
        self._write(
            "UPDATE identities SET revoked_at=?, tools=?, served_by=?, last_plan_failure=? WHERE id=?",
            (
                revoked,
                json.dumps(list(identity.tools)),
                json.dumps(identity.served_by),
                identity.last_plan_failure,
                identity.id,
            ),
        )

    def save_expiry(self, identity: Identity, expires_at: datetime) -> None:
        """Persist a new expiry, then apply it to ``identity``."""
        self._write("UPDATE identities SET expires_at=? WHERE id=?", (format_timestamp(expires_at), identity.id))
        identity.expires_at = expires_at

    def save_usage(self, identity: Identity) -> None:
        """Persist ``served_by`` and ``last_plan_failure`` (at shutdown and revocation)."""
        self._write(
            "UPDATE identities SET served_by=?, last_plan_failure=? WHERE id=?",
            (json.dumps(identity.served_by), identity.last_plan_failure, identity.id),
        )

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        if self._db is None:
            raise ProxyError("the identity store is closed", code="identity_store_unavailable")
        try:
            self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise ProxyError("the identity store cannot be written", code="identity_store_unavailable") from exc


def _from_row(row: tuple[Any, ...]) -> Identity:
    (ident, secret, chain, tools, expires, labels, created, boot, revoked, served_by, plan_failure) = row
    return Identity(
        id=ident,
        secret_sha256=secret,
        chain=tuple(ChainEntry.from_dict(item) for item in json.loads(chain)),
        tools=tuple(json.loads(tools)),
        expires_at=parse_timestamp(expires),
        labels=json.loads(labels),
        created_at=parse_timestamp(created),
        boot_id=boot,
        revoked_at=parse_timestamp(revoked) if revoked else None,
        served_by=json.loads(served_by),
        last_plan_failure=plan_failure,
    )


__all__ = [
    "IDENTITY_ID",
    "MAX_IDENTITY_LIFETIME",
    "ChainEntry",
    "Identity",
    "IdentityStore",
    "ReasoningEffort",
    "hash_secret",
]
