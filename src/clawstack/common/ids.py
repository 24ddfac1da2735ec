"""Identifiers and secrets: random, URL-safe, and compared in constant time."""

from __future__ import annotations

import base64
import hmac
import secrets
import uuid


def new_id(prefix: str = "") -> str:
    """A random identifier with 128 bits of entropy: ``prefix`` + 26 lowercase base32 characters."""
    body = secrets.token_bytes(16)
    return prefix + base64.b32encode(body).decode("ascii").rstrip("=").lower()


def new_uuid() -> str:
    """A random UUID4 as its canonical string."""
    return str(uuid.uuid4())


def new_secret(nbytes: int = 32) -> str:
    """A URL-safe secret with ``nbytes`` bytes of entropy."""
    if nbytes < 16:
        raise ValueError("a secret needs at least 16 bytes of entropy")
    return secrets.token_urlsafe(nbytes)


def secrets_equal(a: str | bytes, b: str | bytes) -> bool:
    """Compare two secrets in constant time (with respect to their contents)."""
    ab = a.encode("utf-8", "surrogatepass") if isinstance(a, str) else a
    bb = b.encode("utf-8", "surrogatepass") if isinstance(b, str) else b
    return hmac.compare_digest(ab, bb)


__all__ = ["new_id", "new_secret", "new_uuid", "secrets_equal"]
