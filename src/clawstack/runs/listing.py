"""Listing runs, ``GET /v1/runs?installation=&state=&limit=&cursor=``: the query's rules and the page cursor.

A listing is newest first by ``accepted_at``, runs accepted in the same second in reverse order of admission (see
:class:`~clawstack.runs.ledger.Position`). It is paged by keyset, never by offset: a page's ``next_cursor`` is the
position of its last run, and the next page starts just after it, so runs admitted while a client pages through
(newer, so ahead of every cursor) never shift or repeat the runs it has not read yet.

The query takes each of ``installation`` (``[a-z0-9][a-z0-9-]{0,63}``), ``state`` (one of the run states),
``limit`` (an integer from 1 to 500; 100 by default) and ``cursor`` (a ``next_cursor``) at most once; anything else
(an unknown or repeated parameter, a bad value) is refused with ``request_invalid`` before the ledger is read.

A cursor is opaque to clients. It is the URL-safe base64 (unpadded) of the compact JSON array
``[accepted_at, seq]`` (``seq``: the ledger's admission counter); only the exact text this module issues is accepted
back, so a cursor that was edited, truncated or built by hand is refused rather than silently read as another
position.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, get_args

from clawstack.common.clock import format_timestamp, parse_timestamp
from clawstack.runs.backends.base import INSTALLATION
from clawstack.runs.errors import RunsError
from clawstack.runs.ledger import Listed, Position, RunRecord, State

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 500
STATES: Final[tuple[State, ...]] = get_args(State)
PARAMETERS: Final = ("installation", "state", "limit", "cursor")
#: The longest cursor this module issues is about 60 characters; anything much longer is not one of ours.
MAX_CURSOR_CHARS: Final = 512
MAX_SEQ: Final = 2**63 - 1
_LIMIT: Final = re.compile(r"0*([1-9][0-9]{0,2})")  # an ASCII decimal integer from 1 to 999, leading zeros allowed
_CURSOR: Final = re.compile(r"[A-Za-z0-9_-]+")
_TIMESTAMP: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A checked ``GET /v1/runs`` query: the filters, the page bound, and where the page starts."""

    installation: str | None = None
    state: State | None = None
    limit: int = DEFAULT_LIMIT
    after: Position | None = None


def parse_query(pairs: Iterable[tuple[str, str]]) -> ListQuery:
    """The query's ``(name, value)`` pairs, in the order received (repeats included), checked."""
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name not in PARAMETERS:
            raise RunsError("request_invalid", f"unknown query parameter {name[:40]!r}")
        if name in seen:
            raise RunsError("request_invalid", f"the query parameter {name} is repeated")
        seen[name] = value
    installation = seen.get("installation")
    if installation is not None and not INSTALLATION.fullmatch(installation):
        raise RunsError("request_invalid", "installation must match [a-z0-9][a-z0-9-]{0,63}")
    state: State | None = None
    if "state" in seen:
        state = next((known for known in STATES if known == seen["state"]), None)
        if state is None:
            raise RunsError("request_invalid", f"state must be one of {', '.join(STATES)}")
    limit = DEFAULT_LIMIT
    if "limit" in seen:
        match = _LIMIT.fullmatch(seen["limit"])
        if match is None or int(match.group(1)) > MAX_LIMIT:
            raise RunsError("request_invalid", f"limit must be an integer from 1 to {MAX_LIMIT}")
        limit = int(match.group(1))
    cursor = seen.get("cursor")
    after = decode_cursor(cursor) if cursor is not None else None
    return ListQuery(installation=installation, state=state, limit=limit, after=after)


def encode_cursor(position: Position) -> str:
    """The opaque ``next_cursor`` for a page that ends at ``position``."""
    text = json.dumps(list(position), separators=(",", ":"), ensure_ascii=True)
    return base64.urlsafe_b64encode(text.encode("ascii")).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> Position:
    """The position a cursor from :func:`encode_cursor` names; any other text is ``request_invalid``."""
    refused = RunsError("request_invalid", "cursor is not a next_cursor from this listing")
    if len(cursor) > MAX_CURSOR_CHARS or not _CURSOR.fullmatch(cursor):
        raise refused
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw.decode("ascii"))
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise refused from exc
    if not (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and type(value[1]) is int
        and 1 <= value[1] <= MAX_SEQ
    ):
        raise refused
    position = Position(value[0], value[1])
    if not (
        _is_timestamp(position.accepted_at)
        and encode_cursor(position) == cursor  # exactly the text we issue: no other spelling of a position
    ):
        raise refused
    return position


def _is_timestamp(text: str) -> bool:
    """``text`` is a timestamp exactly as the ledger writes ``accepted_at`` (RFC 3339 UTC, seconds, ``Z``)."""
    if not _TIMESTAMP.fullmatch(text):
        return False
    try:
        return format_timestamp(parse_timestamp(text)) == text
    except ValueError:
        return False


def split_page(listed: Sequence[Listed], limit: int) -> tuple[list[RunRecord], str | None]:
    """A page read with ``limit + 1`` rows: its first ``limit`` runs, and a ``next_cursor`` only when the extra row
    shows that more runs follow (``None`` on the last page)."""
    records = [entry.record for entry in listed[:limit]]
    if len(listed) <= limit:
        return records, None
    return records, encode_cursor(listed[limit - 1].position)


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_CURSOR_CHARS",
    "MAX_LIMIT",
    "PARAMETERS",
    "STATES",
    "ListQuery",
    "decode_cursor",
    "encode_cursor",
    "parse_query",
    "split_page",
]
