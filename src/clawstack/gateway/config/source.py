"""From file text to a plain document: JSON5 parsing, ignored OpenClaw keys, ``${NAME}`` references, key paths.

* :func:`parse_json5` refuses a syntax error (reporting only its line and column, since the parser's message quotes
  the text around it), a key repeated in one object, ``NaN`` and ``Infinity``.
* :func:`drop_ignored` removes the keys of :data:`~clawstack.gateway.config.openclaw.DROPPED_KEYS` and says which
  were present; :func:`find_inert` lists the present keys matching
  :data:`~clawstack.gateway.config.openclaw.INERT_KEYS`.
* :func:`interpolate` replaces a string value that is exactly ``${NAME}`` by that environment variable (which
  must be set and non-empty); ``$${NAME}`` stands for the literal text ``${NAME}``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import json5

from clawstack.gateway.config.openclaw import DROPPED_KEYS, INERT_KEYS, REFUSED_UNDER_DROPPED, UNSUPPORTED_MESSAGE
from clawstack.gateway.errors import ConfigProblem, GatewayConfigSyntaxError, GatewayConfigUnreadableError

__all__ = ["drop_ignored", "find_inert", "format_path", "interpolate", "parse_json5", "rebuild"]

_ENV_REF = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_$-]+")
_JSON5_POSITION = re.compile(r"^<string>:(\d+) .* at column (\d+)$", re.DOTALL)


def format_path(path: Iterable[str | int]) -> str:
    """A key path as messages print it: ``agents.entries.main``, ``models[0]``, ``plugins.entries["a b"]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


class _Pairs(list[tuple[str, Any]]):
    """An object's members in document order, kept as pairs so duplicate keys can be reported with their path."""


def parse_json5(data: str | bytes) -> Any:
    """Parse JSON5 text (UTF-8 bytes or a string) into plain dicts and lists."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GatewayConfigUnreadableError(
                (ConfigProblem("", f"file is not valid UTF-8 (byte {exc.start})"),)
            ) from None
    # Raised outside the ``except`` block so that the parser's error, which quotes the offending text, is not
    # kept as the context of ours; only its position is used.
    try:
        raw = json5.loads(data, object_pairs_hook=_Pairs)
    except ValueError as exc:
        error = _syntax_error(str(exc), empty=not data.strip())
    else:
        return rebuild(raw, [])
    raise error


def _syntax_error(parser_message: str, *, empty: bool) -> GatewayConfigSyntaxError:
    match = _JSON5_POSITION.match(parser_message)
    if empty or match is None:
        return GatewayConfigSyntaxError(
            ConfigProblem("", "JSON5 syntax error" + (" (empty document)" if empty else ""))
        )
    line, column = int(match.group(1)), int(match.group(2))
    return GatewayConfigSyntaxError(
        ConfigProblem("", f"JSON5 syntax error at line {line}, column {column}"), line=line, column=column
    )


def rebuild(value: Any, path: list[str | int]) -> Any:
    """Plain dicts and lists from parsed JSON5 (or a mapping), refusing duplicate keys and non-finite numbers."""
    if isinstance(value, _Pairs | Mapping):
        pairs = list(value) if isinstance(value, _Pairs) else list(value.items())
        result: dict[str, Any] = {}
        for raw_key, item in pairs:
            key = _join_surrogates(raw_key, path) if isinstance(raw_key, str) else raw_key
            if key in result:
                raise GatewayConfigSyntaxError(ConfigProblem(format_path(path), f"duplicate key {json.dumps(key)}"))
            result[key] = rebuild(item, [*path, key])
        return result
    if isinstance(value, list | tuple):
        return [rebuild(item, [*path, i]) for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise GatewayConfigSyntaxError(ConfigProblem(format_path(path), "NaN and Infinity are not accepted"))
    if isinstance(value, str):
        return _join_surrogates(value, path)
    return value


def _join_surrogates(text: str, path: list[str | int]) -> str:
    """``text`` with each escaped UTF-16 surrogate pair (``\\ud83e\\udd80``) made one character; a lone one is refused."""
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise GatewayConfigSyntaxError(
            ConfigProblem(format_path(path), "a lone UTF-16 surrogate is not text")
        ) from None


def drop_ignored(document: dict[str, Any], problems: list[ConfigProblem]) -> tuple[dict[str, Any], list[str]]:
    """``document`` without the dropped keys, and those that were present (in :data:`DROPPED_KEYS` order).

    A key of :data:`REFUSED_UNDER_DROPPED` under a dropped key is reported as not supported instead.
    """
    ignored: list[str] = []
    document = dict(document)
    for dotted in DROPPED_KEYS:
        parent_key, _, child_key = dotted.rpartition(".")
        holder = document if not parent_key else document.get(parent_key)
        if not isinstance(holder, dict) or child_key not in holder:
            continue
        value = holder[child_key]
        for refused in REFUSED_UNDER_DROPPED.get(dotted, ()):
            if isinstance(value, dict) and refused in value:
                problems.append(ConfigProblem(f"{dotted}.{refused}", UNSUPPORTED_MESSAGE))
        if parent_key:
            document[parent_key] = {k: v for k, v in holder.items() if k != child_key}
        else:
            del document[child_key]
        ignored.append(dotted)
    return document, ignored


def _split_pattern(pattern: str) -> list[str]:
    parts: list[str] = []
    for piece in pattern.split("."):
        if piece.endswith("[]"):
            parts += [piece[:-2], "[]"]
        else:
            parts.append(piece)
    return parts


def _walk(node: Any, parts: list[str], path: list[str | int], found: list[list[str | int]]) -> None:
    if not parts:
        found.append(path)
        return
    head, rest = parts[0], parts[1:]
    if head == "[]":
        if isinstance(node, list):
            for i, item in enumerate(node):
                _walk(item, rest, [*path, i], found)
    elif isinstance(node, dict):
        for key, item in node.items():
            if head in ("*", key):
                _walk(item, rest, [*path, key], found)


def find_inert(document: Mapping[str, Any]) -> list[str]:
    """The key paths present in ``document`` that match :data:`INERT_KEYS`, pattern by pattern."""
    paths: list[str] = []
    for pattern in INERT_KEYS:
        found: list[list[str | int]] = []
        _walk(document, _split_pattern(pattern), [], found)
        paths += [format_path(p) for p in found]
    return paths


def interpolate(value: Any, path: list[str | int], environ: Mapping[str, str], problems: list[ConfigProblem]) -> Any:
    """``value`` with every whole-string ``${NAME}`` replaced; an unset or empty variable is a problem."""
    if isinstance(value, dict):
        return {k: interpolate(v, [*path, k], environ, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, [*path, i], environ, problems) for i, v in enumerate(value)]
    if isinstance(value, str):
        if value.startswith("$${") and _ENV_REF.fullmatch(value[1:]):
            return value[1:]
        match = _ENV_REF.fullmatch(value)
        if match:
            name = match.group(1)
            resolved = environ.get(name)
            if resolved is None or resolved == "":
                state = "is not set" if resolved is None else "is empty"
                problems.append(ConfigProblem(format_path(path), f"environment variable {name} {state}"))
                return value
            return resolved
    return value
