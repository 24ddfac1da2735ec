"""``@fake`` directives: lines in the last user message that choose what the scripted fake model does.

A directive is a line that starts (after optional spaces) with ``@fake``, then a name and, for most names, a
colon and a value::

    @fake reply: It is sunny in Paris.
    @fake tool-call: get_weather {"city": "Paris"}
    @fake delay-ms: 200

Every other line is ordinary message text. The names, their values and how they combine are documented in
``docs/fake-llm.md``; anything unknown or malformed raises :class:`FakeDirectiveError` with the line number.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from clawstack.llm.errors import FakeDirectiveError
from clawstack.llm.fake.behaviour import (
    STRUCTURED_OUTPUT_TOOL,
    Behaviour,
    FakeToolCall,
    check_behaviour,
)

PREFIX = "@fake"
_INTEGER = re.compile(r"[0-9]{1,9}")

FLAG_DIRECTIVES = frozenset({"echo", "empty", "malformed"})
_INTEGER_FIELDS = {
    "fail": "fail_status",
    "retry-after-s": "retry_after_s",
    "delay-ms": "delay_ms",
    "chunk-delay-ms": "chunk_delay_ms",
    "drop-after-chunks": "drop_after_chunks",
}
VALUE_DIRECTIVES = frozenset({"reply", "tool-call", "structured-output", *_INTEGER_FIELDS})
REPEATABLE_DIRECTIVES = frozenset({"reply", "tool-call"})
DIRECTIVE_NAMES = FLAG_DIRECTIVES | VALUE_DIRECTIVES


def is_directive_line(line: str) -> bool:
    """Whether ``line`` is a directive line (``@fake`` then a space or the end of the line)."""
    stripped = line.lstrip()
    return stripped.startswith(PREFIX) and (len(stripped) == len(PREFIX) or stripped[len(PREFIX)].isspace())


def strip_directives(text: str) -> str:
    """``text`` without its directive lines, trimmed: what ``echo`` sends back."""
    return "\n".join(line for line in text.splitlines() if not is_directive_line(line)).strip()


def _integer(value: str) -> int:
    if not _INTEGER.fullmatch(value):
        raise ValueError("expects a whole number such as 200")
    return int(value)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expects a JSON object ({exc.msg} at column {exc.colno})") from exc
    except RecursionError as exc:
        raise ValueError("expects a JSON object (nested too deeply)") from exc
    if not isinstance(value, dict):
        raise ValueError("expects a JSON object")
    return value


def _tool_call(value: str) -> FakeToolCall:
    name, _, arguments = value.partition(" ")
    return FakeToolCall.build(name, _json_object(arguments.strip() or "{}"))


def parse_directives(text: str) -> Behaviour | None:
    """Read the directives in ``text``; ``None`` if it has none. Raise :class:`FakeDirectiveError`."""
    fields: dict[str, Any] = {}
    replies: list[str] = []
    calls: list[FakeToolCall] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not is_directive_line(line):
            continue
        rest = line.lstrip()[len(PREFIX) :].strip()
        name, colon, value = rest.partition(":")
        name, value = name.strip(), value.strip()
        try:
            if not name or " " in name:
                raise ValueError("expected '@fake NAME' or '@fake NAME: VALUE'")
            if name not in DIRECTIVE_NAMES:
                raise ValueError(f"unknown directive {name!r}; known: {', '.join(sorted(DIRECTIVE_NAMES))}")
            if name in seen and name not in REPEATABLE_DIRECTIVES:
                raise ValueError(f"{name!r} is given twice")
            seen.add(name)
            if name in FLAG_DIRECTIVES:
                if colon:
                    raise ValueError(f"{name!r} takes no value")
                fields[name] = True
                continue
            if not value:
                raise ValueError(f"{name!r} needs a value after ':'")
            _apply(name, value, fields, replies, calls)
        except ValueError as exc:
            raise FakeDirectiveError(f"@fake directive on line {number}: {exc}") from exc
    if not seen:
        return None
    behaviour = Behaviour(reply="\n".join(replies) if replies else None, tool_calls=tuple(calls), **fields)
    try:
        return check_behaviour(behaviour)
    except ValueError as exc:
        raise FakeDirectiveError(f"@fake directives: {exc}") from exc


def _apply(name: str, value: str, fields: dict[str, Any], replies: list[str], calls: list[FakeToolCall]) -> None:
    if name == "reply":
        replies.append(value)
    elif name == "tool-call":
        calls.append(_tool_call(value))
    elif name == "structured-output":
        calls.append(FakeToolCall.build(STRUCTURED_OUTPUT_TOOL, _json_object(value)))
    else:
        fields[_INTEGER_FIELDS[name]] = _integer(value)


def for_turn(behaviour: Behaviour, tool_results: int) -> Behaviour:
    """Apply the directive turn rule: tool calls first, the text answer once the tool results are in.

    While no tool result follows the last user message, a behaviour with tool calls answers with the tool calls
    alone. After it, the tool calls are not repeated: the answer is the ``reply``/``echo``/``empty`` text, or a
    short fixed note on how many tool results arrived.
    """
    if not behaviour.tool_calls:
        return behaviour
    if tool_results == 0:
        return replace(behaviour, reply=None, echo=False, empty=False)
    if behaviour.reply is None and not behaviour.echo and not behaviour.empty:
        plural = "" if tool_results == 1 else "s"
        return replace(
            behaviour, tool_calls=(), reply=f"The scripted fake model received {tool_results} tool result{plural}."
        )
    return replace(behaviour, tool_calls=())
