"""Strict JSON: parse untrusted bytes into Python values, or refuse with a precise, stable error.

The standard library's parser accepts things an API that digests its input must not: duplicate keys (which
value wins depends on the parser), lone surrogate escapes (``"\\ud800"`` cannot be encoded as UTF-8, so two
canonical forms disagree), integers beyond what an IEEE double holds exactly, and ``NaN``/``Infinity``. This
module wraps the C-accelerated :mod:`json` decoder with hooks that refuse each of those, plus a size limit, a
depth limit checked before decoding (so hostile nesting never reaches the recursive decoder), and an optional
*spec subset*: an object whose values are strings, integers, or arrays of strings.

Errors never quote the input's values: an error message may name a key (truncated) and a byte offset, never a
string value, because inputs carry task text and credentials.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from clawstack.common.errors import ClawError

MAX_SAFE_INTEGER: Final = 2**53 - 1
DEFAULT_MAX_BYTES: Final = 64 * 1024
DEFAULT_MAX_DEPTH: Final = 32

SpecValue = str | int | list[str]
"""A value the spec subset admits."""


class StrictJSONError(ClawError):
    """Input refused by the strict parser. ``code`` says which rule; ``offset`` is a byte offset when known."""

    code = "json_invalid"

    def __init__(self, message: str, *, code: str, offset: int | None = None) -> None:
        super().__init__(message, code=code)
        self.offset = offset


# A JSON string literal, used only by the depth pre-scan to skip brackets inside strings.
_STRING_LITERAL = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _key_for_message(key: str) -> str:
    shown = key if len(key) <= 40 else key[:40] + "…"
    return json.dumps(shown, ensure_ascii=True)


def _has_surrogate(text: str) -> bool:
    # Paired escapes decode to one astral code point, so any surrogate left in a decoded str was lone.
    return _SURROGATE.search(text) is not None


def _check_depth(data: bytes, max_depth: int) -> None:
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return  # cannot nest deeper than the number of openers
    depth = 0
    for match in _BRACKETS.finditer(_STRING_LITERAL.sub(b'""', data)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                raise StrictJSONError(f"nesting deeper than {max_depth} levels", code="json_too_deep", offset=None)
        else:
            depth -= 1


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if _has_surrogate(key):
            raise StrictJSONError("object key contains a lone surrogate escape", code="json_lone_surrogate")
        if key in result:
            raise StrictJSONError(f"duplicate object key {_key_for_message(key)}", code="json_duplicate_key")
        result[key] = value
    return result


def _parse_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:  # more digits than int() accepts: certainly out of range
        raise StrictJSONError("integer outside ±(2^53−1)", code="json_integer_range") from exc
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise StrictJSONError("integer outside ±(2^53−1)", code="json_integer_range")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise StrictJSONError("number too large for a double", code="json_non_finite")
    return value


def _parse_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON", code="json_non_finite")


_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_object_pairs,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_parse_constant,
    strict=True,
)


def _check_strings(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                raise StrictJSONError("string contains a lone surrogate escape", code="json_lone_surrogate")
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def loads(
    data: bytes,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Any:
    """Parse ``data`` as one JSON value under the strict rules, or raise :class:`StrictJSONError`.

    Codes: ``json_too_large``, ``json_invalid_utf8``, ``json_too_deep``, ``json_syntax``,
    ``json_duplicate_key``, ``json_lone_surrogate``, ``json_integer_range``, ``json_non_finite``.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError("strictjson.loads takes bytes")
    data = bytes(data)
    if len(data) > max_bytes:
        raise StrictJSONError(f"body larger than {max_bytes} bytes", code="json_too_large")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"invalid UTF-8 at byte {exc.start}", code="json_invalid_utf8", offset=exc.start) from exc
    _check_depth(data, max_depth)
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8"))
        raise StrictJSONError(f"{exc.msg} at byte {offset}", code="json_syntax", offset=offset) from exc
    except RecursionError as exc:  # defence in depth; the pre-scan bounds nesting first
        raise StrictJSONError("nesting too deep", code="json_too_deep") from exc
    _check_strings(value)
    return value


def loads_spec(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, SpecValue]:
    """Parse a spec: a JSON object whose values are strings, integers or arrays of strings.

    Everything :func:`loads` refuses is refused here too; any other type (``null``, booleans, non-integral
    numbers, nested objects, arrays holding anything but strings) fails with ``json_type_not_allowed``.
    """
    value = loads(data, max_bytes=max_bytes, max_depth=2)
    return check_spec(value)


def check_spec(value: Any) -> dict[str, SpecValue]:
    """Check an already-parsed value against the spec subset and return it typed."""
    if not isinstance(value, dict):
        raise StrictJSONError("a spec must be a JSON object", code="json_type_not_allowed")
    for key, item in value.items():
        if not isinstance(key, str) or _has_surrogate(key):
            raise StrictJSONError("spec keys must be valid strings", code="json_type_not_allowed")
        if isinstance(item, bool) or not isinstance(item, str | int | list):
            raise StrictJSONError(
                f"field {_key_for_message(key)} must be a string, an integer or an array of strings",
                code="json_type_not_allowed",
            )
        if isinstance(item, int) and not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
            raise StrictJSONError("integer outside ±(2^53−1)", code="json_integer_range")
        if isinstance(item, str) and _has_surrogate(item):
            raise StrictJSONError("string contains a lone surrogate escape", code="json_lone_surrogate")
        if isinstance(item, list):
            for element in item:
                if not isinstance(element, str):
                    raise StrictJSONError(
                        f"field {_key_for_message(key)} must hold only strings",
                        code="json_type_not_allowed",
                    )
                if _has_surrogate(element):
                    raise StrictJSONError("string contains a lone surrogate escape", code="json_lone_surrogate")
    return value


__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "SpecValue",
    "StrictJSONError",
    "check_spec",
    "loads",
    "loads_spec",
]
