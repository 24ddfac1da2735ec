"""The spec digest: ``"sha256:" + hex(sha256(JCS(value)))`` with RFC 8785 canonical JSON.

JCS sorts object keys by their UTF-16 code units, writes no whitespace, escapes only ``"``, ``\\`` and control
characters, and writes every other character literally (U+2028 and U+2029 included). Canonicalisation is done
by the ``rfc8785`` package; its errors are translated to :class:`DigestError` here.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import rfc8785

from clawstack.common.errors import ClawError

DIGEST_PREFIX: Final = "sha256:"


class DigestError(ClawError):
    """A value that has no canonical form (lone surrogate, integer out of range, NaN, unsupported type)."""

    code = "digest_unrepresentable"


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value``."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        raise DigestError(f"value has no canonical JSON form: {type(exc).__name__}") from exc


def sha256_digest(data: bytes) -> str:
    """``"sha256:" + hex`` of raw bytes."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def spec_digest(value: Any) -> str:
    """``"sha256:" + hex(sha256(JCS(value)))``."""
    return sha256_digest(canonical_json(value))


__all__ = ["DIGEST_PREFIX", "DigestError", "canonical_json", "sha256_digest", "spec_digest"]
