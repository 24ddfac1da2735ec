"""Compose variable interpolation for pod files and their ``.env``.

A pod file is Compose YAML, and people write it the way they write Compose files: ``${VAR:-default}`` for
settings, ``${TOKEN:?set TOKEN in .env}`` for credentials. So the grammar and its edge cases are Compose's own
(compose-go ``template``), not a look-alike; a pod that interpolates here interpolates the same way under
``docker compose``:

- ``$$`` is a literal ``$``; ``$NAME`` and ``${NAME}`` substitute, where a name is ``[_A-Za-z][_A-Za-z0-9]*``;
  a ``$`` followed by anything else (``$1``, ``$ ``, a final ``$``) is kept as written.
- ``${NAME:-x}`` / ``${NAME-x}`` default when unset or empty / unset; ``${NAME:?msg}`` / ``${NAME?msg}`` fail
  when unset or empty / unset; ``${NAME:+x}`` / ``${NAME+x}`` replace when set and non-empty / set.
- An operator's argument is itself interpolated (``${A:-${B:-x}}``), and, as in Compose, it is interpolated
  even when the operator does not use it, so its errors are errors either way.
- An unset variable used without an operator becomes the empty string and is reported as an
  :class:`UnsetVariable` (Compose prints a warning).
- Mapping keys are never interpolated, and a substituted value is never interpolated again.
- Anything else after ``${`` (``${}``, ``${1A}``, ``${A B}``, an unterminated ``${``) is an error, and so is
  nesting more than 32 levels deep (Compose has no limit; a pod file has no use for one that deep).

Values may be credentials, so no message ever contains one: errors name variables and quote the pod file's
own template text (cut to 80 characters); the text of a ``${VAR:?message}`` is shown as written, never with
its own references substituted. ``.env`` text is never quoted at all, since the file exists to hold values.

``.env`` syntax (quoting, comments, ``export``) is python-dotenv's; its values are interpolated as Compose
does: unquoted and double-quoted values are, single-quoted values are not, and a reference resolves from
the process environment first, then from keys defined earlier in the file. A bare ``KEY`` line takes its
value from the environment, so in the file alone it is unset.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dotenv.parser import parse_stream

from clawstack.pod.errors import InterpolationError, PodFileError

MAX_DOTENV_BYTES: Final = 1024 * 1024
"""A ``.env`` larger than this is refused rather than parsed."""

_SHOWN_CHARS: Final = 80
_MAX_NESTING: Final = 32  # deeper ``${A:-${B:-...}}`` is refused rather than recursed into

_NAME = re.compile(r"[_A-Za-z][_A-Za-z0-9]*")
_OPERATORS: Final = (":-", ":?", ":+", "-", "?", "+")  # two-character operators first
_DOTENV_KEY = re.compile(r"[A-Za-z0-9_.]+")
# How python-dotenv's parser reaches a binding's value; group ``quote`` is the value's opening quote, if any.
_DOTENV_VALUE_START = re.compile(r"\s*(?:export[^\S\r\n]+)?(?:'[^']+'|[^=#\s]+)[^\S\r\n]*=[^\S\r\n]*(?P<quote>['\"])?")


@dataclass(frozen=True)
class UnsetVariable:
    """A variable used without a default that is not set: it was replaced by the empty string.

    ``where`` names the place that used it (``claw-pod.yml: services.worker.image`` or ``.env: line 3``).
    """

    name: str
    where: str

    def __str__(self) -> str:
        return f'{self.where}: the "{self.name}" variable is not set; defaulting to a blank string'


# -- the template grammar -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Variable:
    name: str


@dataclass(frozen=True)
class _Operation:
    name: str
    operator: str
    argument: tuple[_Part, ...]
    raw_argument: str


_Part = _Text | _Variable | _Operation


class _InvalidFormat(Exception):
    """The template does not follow the grammar."""


class _MissingRequired(Exception):
    """``${NAME:?message}`` or ``${NAME?message}`` met a missing value."""

    def __init__(self, name: str, raw_message: str) -> None:
        super().__init__(name)
        self.name = name
        self.raw_message = raw_message


def _parse(text: str, nesting: int = 0) -> tuple[_Part, ...]:
    if nesting > _MAX_NESTING:
        raise _InvalidFormat
    parts: list[_Part] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            parts.append(_Text("".join(literal)))
            literal.clear()

    i, end = 0, len(text)
    while i < end:
        dollar = text.find("$", i)
        if dollar < 0:
            literal.append(text[i:])
            break
        literal.append(text[i:dollar])
        i = dollar + 1
        if text.startswith("$", i):
            literal.append("$")
            i += 1
        elif text.startswith("{", i):
            flush()
            part, i = _parse_braced(text, i + 1, nesting)
            parts.append(part)
        elif name := _NAME.match(text, i):
            flush()
            parts.append(_Variable(name.group()))
            i = name.end()
        else:
            literal.append("$")  # not a variable: Compose keeps the ``$`` as written
    flush()
    return tuple(parts)


def _parse_braced(text: str, start: int, nesting: int) -> tuple[_Part, int]:
    """Parse ``NAME}`` or ``NAME<operator><argument>}`` from ``start``; return the part and the index after it."""
    name = _NAME.match(text, start)
    if name is None:
        raise _InvalidFormat
    i = name.end()
    if text.startswith("}", i):
        return _Variable(name.group()), i + 1
    operator = next((op for op in _OPERATORS if text.startswith(op, i)), None)
    if operator is None:
        raise _InvalidFormat
    argument_start = i + len(operator)
    close = _closing_brace(text, argument_start)
    raw = text[argument_start:close]
    return _Operation(name.group(), operator, _parse(raw, nesting + 1), raw), close + 1


def _closing_brace(text: str, start: int) -> int:
    """The ``}`` that closes an operator's argument starting at ``start``.

    Braces nest (``${A:-{"k": 1}}`` has the default ``{"k": 1}``). As in Compose, an argument never spans a
    line, and when its braces do not balance on that line the last ``}`` on the line closes it.
    """
    line_end = text.find("\n", start)
    if line_end < 0:
        line_end = len(text)
    depth = 1
    for j in range(start, line_end):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    last = text.rfind("}", start, line_end)
    if last < 0:
        raise _InvalidFormat
    return last


def _names(parts: Iterable[_Part], into: set[str]) -> None:
    for part in parts:
        if isinstance(part, _Variable):
            into.add(part.name)
        elif isinstance(part, _Operation):
            into.add(part.name)
            _names(part.argument, into)


_Lookup = Callable[[str], str | None]


def _evaluate(parts: Iterable[_Part], lookup: _Lookup, unset: Callable[[str], None]) -> str:
    out: list[str] = []
    for part in parts:
        if isinstance(part, _Text):
            out.append(part.text)
        elif isinstance(part, _Variable):
            value = lookup(part.name)
            if value is None:
                unset(part.name)
            out.append(value or "")
        else:
            out.append(_apply(part, lookup, unset))
    return "".join(out)


def _apply(operation: _Operation, lookup: _Lookup, unset: Callable[[str], None]) -> str:
    argument = _evaluate(operation.argument, lookup, unset)  # eagerly, as Compose does
    value = lookup(operation.name)
    operator = operation.operator
    if operator == ":-":
        return value if value else argument
    if operator == "-":
        return argument if value is None else value
    if operator == ":+":
        return argument if value else ""
    if operator == "+":
        return "" if value is None else argument
    if value is None or (operator == ":?" and not value):
        raise _MissingRequired(operation.name, operation.raw_argument)
    return value


def _substitute(template: str, lookup: _Lookup, unset: Callable[[str], None]) -> str:
    if "$" not in template:
        return template
    return _evaluate(_parse(template), lookup, unset)


# -- messages ---------------------------------------------------------------------------------------------------


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _missing_message(missing: _MissingRequired) -> str:
    message = f"required variable {missing.name} is missing a value"
    return f"{message}: {_cut(missing.raw_message)}" if missing.raw_message else message


_ESCAPE_HINT: Final = "you may need to escape any $ with another $"


# -- documents --------------------------------------------------------------------------------------------------


def _walk(value: Any, path: str, visit: Callable[[str, str], Any]) -> Any:
    if isinstance(value, str):
        return visit(value, path)
    if isinstance(value, dict):
        return {key: _walk(item, f"{path}.{key}" if path else str(key), visit) for key, item in value.items()}
    if isinstance(value, list):
        return [_walk(item, f"{path}[{index}]", visit) for index, item in enumerate(value)]
    return value


def _where(source: str, path: str) -> str:
    return f"{source}: {path}" if path else source


def _invalid_format(template: str, where: str) -> InterpolationError:
    shown = json.dumps(_cut(template), ensure_ascii=False)
    return InterpolationError(f"invalid interpolation format {shown}; {_ESCAPE_HINT}", where=where)


def interpolate(
    document: Any,
    env: Mapping[str, str],
    *,
    source: str = "claw-pod.yml",
    warnings: list[UnsetVariable] | None = None,
) -> Any:
    """Return a copy of ``document`` (parsed YAML) with every string value interpolated from ``env``.

    Dicts and lists are copied and walked; their keys and any non-string scalar are kept as they are.
    Each use of an unset variable without an operator is appended to ``warnings`` when a list is given.

    Raises:
        InterpolationError: a template is malformed (code ``interpolation_invalid``) or a ``${VAR:?message}``
            lacks its value (code ``interpolation_required``). ``where`` is ``"<source>: <path>"``, such as
            ``claw-pod.yml: services.worker.x-claw.models.primary``.
    """

    def visit(template: str, path: str) -> str:
        def unset(name: str) -> None:
            if warnings is not None:
                warnings.append(UnsetVariable(name, _where(source, path)))

        try:
            return _substitute(template, env.get, unset)
        except _InvalidFormat:
            raise _invalid_format(template, _where(source, path)) from None
        except _MissingRequired as missing:
            raise InterpolationError(
                _missing_message(missing), where=_where(source, path), code="interpolation_required"
            ) from None

    return _walk(document, "", visit)


def referenced_variables(document: Any, *, source: str = "claw-pod.yml") -> set[str]:
    """The names of every variable that the string values of ``document`` reference, used or not.

    Names inside operator arguments count (``${A:-$B}`` references ``A`` and ``B``); ``$$NAME`` does not.

    Raises:
        InterpolationError: a template is malformed, as :func:`interpolate` would report it.
    """
    names: set[str] = set()

    def visit(template: str, path: str) -> None:
        if "$" not in template:
            return
        try:
            _names(_parse(template), names)
        except _InvalidFormat:
            raise _invalid_format(template, _where(source, path)) from None

    _walk(document, "", visit)
    return names


# -- .env -------------------------------------------------------------------------------------------------------


def read_dotenv(
    path: Path,
    *,
    environ: Mapping[str, str] | None = None,
    warnings: list[UnsetVariable] | None = None,
) -> dict[str, str]:
    """Read a pod's ``.env``: its keys and their interpolated values, in file order. A missing file is ``{}``.

    References in values resolve from ``environ`` (the process environment when ``None``) first, then from
    keys defined earlier in the file. A bare ``KEY`` line is left out (it only names a variable to take from
    the environment, which :func:`build_environment` does). Keys that start with a digit are ignored, as
    Compose ignores them. Unset variables used without a default are appended to ``warnings`` when given.

    Raises:
        PodFileError: the file cannot be read (code ``dotenv_unreadable``) or parsed (``dotenv_invalid``);
            the message names the line, never its text.
        InterpolationError: a value's template is malformed or a required variable is missing; ``where``
            names the line.
    """
    environment: Mapping[str, str] = os.environ if environ is None else environ
    name = path.name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise PodFileError(
            f"the file cannot be read ({exc.strerror or type(exc).__name__})", where=name, code="dotenv_unreadable"
        ) from None
    if len(data) > MAX_DOTENV_BYTES:
        raise PodFileError(
            f"the file is larger than {MAX_DOTENV_BYTES} bytes (1 MiB)", where=name, code="dotenv_invalid"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PodFileError("not valid UTF-8", where=f"{name}: line {line}", code="dotenv_invalid") from None

    values: dict[str, str] = {}

    def lookup(variable: str) -> str | None:
        found = environment.get(variable)
        return found if found is not None else values.get(variable)

    for binding in parse_stream(io.StringIO(text)):
        raw = binding.original.string
        line = binding.original.line + raw[: len(raw) - len(raw.lstrip())].count("\n")
        where = f"{name}: line {line}"
        if binding.error:
            raise PodFileError(
                "cannot be parsed; check its quoting and its KEY=value form", where=where, code="dotenv_invalid"
            )
        key = binding.key
        if key is None:
            continue  # a comment or blank lines
        if not _DOTENV_KEY.fullmatch(key):
            raise PodFileError(
                "a variable name may contain only letters, digits, '_' and '.'", where=where, code="dotenv_invalid"
            )
        if key[0].isdigit() or binding.value is None:
            continue
        start = _DOTENV_VALUE_START.match(raw)
        if start is not None and start.group("quote") == "'":
            values[key] = binding.value
            continue

        def unset(variable: str, where: str = where) -> None:
            if warnings is not None:
                warnings.append(UnsetVariable(variable, where))

        try:
            values[key] = _substitute(binding.value, lookup, unset)
        except _InvalidFormat:
            raise InterpolationError(f"{key}: invalid interpolation format; {_ESCAPE_HINT}", where=where) from None
        except _MissingRequired as missing:
            raise InterpolationError(
                f"{key}: {_missing_message(missing)}", where=where, code="interpolation_required"
            ) from None
    return values


def build_environment(dotenv: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a pod file is interpolated from: ``.env`` values, overridden by the process environment."""
    return {**dotenv, **environ}


__all__ = [
    "MAX_DOTENV_BYTES",
    "UnsetVariable",
    "build_environment",
    "interpolate",
    "read_dotenv",
    "referenced_variables",
]
