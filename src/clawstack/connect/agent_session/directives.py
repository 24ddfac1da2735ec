"""Markers and directives in ``run_task``'s ``context``, parsed out and stripped before the agent sees them.

* ``<agent-session>{json}</agent-session>`` — a **marker**: always means attach ("this session exists").
* ``[[clawconnect:agent-session]]{json}[[/clawconnect:agent-session]]`` — a **directive block**: its ``op``
  key (the reference ClawConnect's) is one of ``attach``, ``continue``, ``replace``, ``detach``, ``inspect``. Any
  other key, ``action`` included, makes the directive malformed.

Every marker and block is stripped from the text (an unclosed opening delimiter strips to the end of the text, a
lone closing one is removed), whatever it holds. Only the first block counts, and a block wins over any marker;
without a block, the first marker counts. The JSON is a strict object of the fields below; anything else makes the
directive **malformed**, and a malformed directive is ignored (the task still submits). Fields:

``runtime`` (``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``), ``sessionId`` (``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``, matched
against the whole value), ``provider``, ``providerSessionId``, ``host`` (non-empty strings without control
characters, at most 256), ``remoteUrl`` (an ``http``/``https`` URL), ``state`` (the closed vocabulary),
``reason`` (required by ``replace`` and ``detach``), ``prompt`` (``continue`` only). ``attach`` and ``replace``
need ``runtime`` and ``sessionId``; ``continue``, ``detach`` and ``inspect`` address the current attachment, and
when they name ``runtime``/``sessionId`` those must both be given.

Two fields are never a reason to call a directive malformed:

* ``metadata`` becomes strings only. Each string value is kept; a finite number or a boolean is kept as the text
  JavaScript's ``String()`` gives it (``1`` and ``1.0`` → ``"1"``, ``1.5`` → ``"1.5"``, ``1e21`` → ``"1e+21"``,
  ``true`` → ``"true"``); an object, an array, ``null`` or a number too large for a double is dropped. An entry
  whose key is empty or longer than 128 characters, or whose value is longer than 4096, is dropped, and entries
  past the 64th kept one are dropped. A ``metadata`` that is not a JSON object is dropped whole.
* ``stopRuntime`` stops the session in its runtime only on a ``detach`` and only as the JSON literal ``true``; any
  other value (``false``, ``"true"``, ``1``, ``null``) or none is a detach that leaves the runtime alone. On any other
  operation, and on a marker, it is ignored.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from clawstack.connect.agent_session.normalize import clean_metadata
from clawstack.connect.agent_session.types import STATES, State, is_runtime_id

Action = Literal["attach", "continue", "replace", "detach", "inspect"]
ACTIONS: Final[tuple[Action, ...]] = ("attach", "continue", "replace", "detach", "inspect")
ACTION_KEY: Final = "op"
"""The key naming a block's transition, as the reference ClawConnect's hosts send it."""
MARKER_OPEN: Final = "<agent-session>"
MARKER_CLOSE: Final = "</agent-session>"
BLOCK_OPEN: Final = "[[clawconnect:agent-session]]"
BLOCK_CLOSE: Final = "[[/clawconnect:agent-session]]"
MAX_FIELD_CHARS: Final = 256
MAX_URL_CHARS: Final = 2048
MAX_REASON_CHARS: Final = 1000
MAX_PROMPT_CHARS: Final = 200_000
SESSION_ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_SESSION_ID_RE: Final = re.compile(SESSION_ID_PATTERN)

_MARKER_RE: Final = re.compile(re.escape(MARKER_OPEN) + r"(.*?)" + re.escape(MARKER_CLOSE), re.S)
_BLOCK_RE: Final = re.compile(re.escape(BLOCK_OPEN) + r"(.*?)" + re.escape(BLOCK_CLOSE), re.S)
_FIELDS: Final = frozenset(
    {ACTION_KEY, "runtime", "sessionId", "provider", "providerSessionId", "host", "remoteUrl", "state", "metadata"}
    | {"reason", "stopRuntime", "prompt"}
)


@dataclass(frozen=True, slots=True)
class Directive:
    """One valid directive (a marker is an ``attach`` with ``from_marker``)."""

    action: Action
    runtime: str | None = None
    session_id: str | None = None
    provider: str | None = None
    provider_session_id: str | None = None
    host: str | None = None
    remote_url: str | None = None
    state: State | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    reason: str | None = None
    stop_runtime: bool = False
    prompt: str | None = None
    from_marker: bool = False


@dataclass(frozen=True, slots=True)
class ParsedContext:
    """The context with every marker and block stripped (``None`` when nothing is left), the directive that
    counts (``None`` when there is none or it is malformed) and, for a malformed one, why."""

    text: str | None
    directive: Directive | None = None
    problem: str | None = None
    found: bool = False


class MalformedDirective(ValueError):
    """Why a directive is ignored; the message names a field, never a value."""


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in text)


def _plain(data: Mapping[str, Any], key: str, limit: int = MAX_FIELD_CHARS) -> str | None:
    value = data.get(key)
    if value is None and key not in data:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or _has_control(value):
        raise MalformedDirective(f"{key}: must be a non-empty string without control characters")
    return value


def is_session_segment(value: object) -> bool:
    """Whether ``value`` is a valid ``sessionId``: the whole of it matches ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``
    (so it is always a plain path segment, never ``.`` or ``..``)."""
    return isinstance(value, str) and _SESSION_ID_RE.fullmatch(value) is not None


def js_number_text(value: float) -> str | None:
    """The text JavaScript's ``String()`` gives the double ``value`` (``1.0`` → ``"1"``, ``1e21`` → ``"1e+21"``,
    ``1e-7`` → ``"1e-7"``, ``-0.0`` → ``"0"``); ``None`` for a value that is not finite."""
    if not math.isfinite(value):
        return None
    if value == 0:
        return "0"
    # repr() gives the shortest digits that round-trip, as ECMAScript's Number::toString requires; the value is
    # 0.<digits> × 10^point.
    _, coefficient, exponent = Decimal(repr(abs(value))).as_tuple()
    point = len(coefficient) + int(exponent)
    digits = "".join(map(str, coefficient)).rstrip("0")
    sign = "-" if value < 0 else ""
    if len(digits) <= point <= 21:
        return sign + digits + "0" * (point - len(digits))
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    power = f"e{'+' if point > 0 else '-'}{abs(point - 1)}"
    return sign + digits[0] + ("." + digits[1:] if len(digits) > 1 else "") + power


def _metadata_text(value: object) -> str | None:
    """A metadata value as a string: strings as they are, finite numbers and booleans as JavaScript prints them."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            value = float(value)  # as JavaScript reads a JSON number: a double
        except OverflowError:
            return None
    if isinstance(value, float):
        return js_number_text(value)
    return None


def _metadata(data: Mapping[str, Any]) -> dict[str, str]:
    value = data.get("metadata")
    if not isinstance(value, Mapping):
        return {}
    return clean_metadata({key: _metadata_text(item) for key, item in value.items()})


def validate(data: object, *, from_marker: bool) -> Directive:
    """A :class:`Directive` from a decoded JSON value, or :class:`MalformedDirective`."""
    if not isinstance(data, dict):
        raise MalformedDirective("the directive must be a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise MalformedDirective(f"{unknown[0][:64]}: is not a directive field")
    if from_marker:
        if data.get(ACTION_KEY, "attach") != "attach":
            raise MalformedDirective(f"{ACTION_KEY}: a marker always means attach")
        action: Action = "attach"
    else:
        raw = data.get(ACTION_KEY)
        if raw not in ACTIONS:
            raise MalformedDirective(f"{ACTION_KEY}: must be one of {', '.join(ACTIONS)}")
        action = raw
    runtime = data.get("runtime")
    session_id = data.get("sessionId")
    names_session = "runtime" in data or "sessionId" in data
    if action in ("attach", "replace") or names_session:
        if not is_runtime_id(runtime):
            raise MalformedDirective("runtime: must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}")
        if not is_session_segment(session_id):
            raise MalformedDirective(f"sessionId: must match {SESSION_ID_PATTERN}")
    state = data.get("state")
    if state is not None and state not in STATES:
        raise MalformedDirective("state: must be a state of the vocabulary")
    remote_url = _plain(data, "remoteUrl", MAX_URL_CHARS)
    if remote_url is not None:
        parts = urlsplit(remote_url)
        if parts.scheme not in ("http", "https") or not parts.netloc or " " in remote_url:
            raise MalformedDirective("remoteUrl: must be an http or https URL")
    reason = _plain(data, "reason", MAX_REASON_CHARS)
    if action in ("replace", "detach") and reason is None:
        raise MalformedDirective(f"reason: {action} needs a reason")
    prompt = data.get("prompt")
    if "prompt" in data and (action != "continue" or not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS):
        raise MalformedDirective("prompt: only continue takes it, as a string")
    return Directive(
        action=action,
        runtime=runtime if isinstance(runtime, str) else None,
        session_id=session_id if isinstance(session_id, str) else None,
        provider=_plain(data, "provider"),
        provider_session_id=_plain(data, "providerSessionId"),
        host=_plain(data, "host"),
        remote_url=remote_url,
        state=state,
        metadata=_metadata(data),
        reason=reason,
        stop_runtime=action == "detach" and data.get("stopRuntime") is True,
        prompt=prompt if isinstance(prompt, str) else None,
        from_marker=from_marker,
    )


def _decode(body: str, *, from_marker: bool) -> Directive:
    def refuse_constant(name: str) -> Any:
        raise MalformedDirective("the directive is not strict JSON")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in items:
            if key in result:
                raise MalformedDirective("the directive repeats a key")
            result[key] = value
        return result

    try:
        data = json.loads(body, object_pairs_hook=pairs, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, MalformedDirective):
            raise
        raise MalformedDirective("the directive is not valid JSON") from None
    return validate(data, from_marker=from_marker)


def _strip(text: str) -> str:
    text = _BLOCK_RE.sub("", text)
    text = _MARKER_RE.sub("", text)
    for opener in (BLOCK_OPEN, MARKER_OPEN):
        at = text.find(opener)
        if at >= 0:
            text = text[:at]
    for closer in (BLOCK_CLOSE, MARKER_CLOSE):
        text = text.replace(closer, "")
    return text


def mentions_agent_session(context: str | None) -> bool:
    """Whether ``context`` holds any marker or block delimiter (a cheap test before parsing)."""
    if not context:
        return False
    return any(token in context for token in (MARKER_OPEN, MARKER_CLOSE, BLOCK_OPEN, BLOCK_CLOSE))


def parse_context(context: str | None) -> ParsedContext:
    """Strip every marker and block from ``context`` and decide which directive counts; never raises."""
    if context is None or not mentions_agent_session(context):
        return ParsedContext(context)
    block = _BLOCK_RE.search(context)
    marker = _MARKER_RE.search(context)
    stripped = _strip(context).strip()
    text = stripped or None
    chosen = block if block is not None else marker
    if chosen is None:
        return ParsedContext(text, None, "an agent-session delimiter is not closed", True)
    try:
        directive = _decode(chosen.group(1), from_marker=chosen is marker)
    except MalformedDirective as exc:
        return ParsedContext(text, None, str(exc), True)
    return ParsedContext(text, directive, None, True)


__all__ = [
    "ACTIONS",
    "ACTION_KEY",
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "MARKER_CLOSE",
    "MARKER_OPEN",
    "SESSION_ID_PATTERN",
    "Action",
    "Directive",
    "MalformedDirective",
    "ParsedContext",
    "is_session_segment",
    "js_number_text",
    "mentions_agent_session",
    "parse_context",
    "validate",
]
