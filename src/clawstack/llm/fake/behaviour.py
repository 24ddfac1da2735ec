"""What the scripted fake model does for one request: a :class:`Behaviour`, from directives or a script step.

Both sources build the same value and share :func:`check_behaviour`, so a combination that is refused in a
``@fake`` line is refused in a script file too, with the same words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_DELAY_MS = 600_000
MAX_RETRY_AFTER_S = 86_400
MAX_TOOL_CALLS = 128
STRUCTURED_OUTPUT_TOOL = "structured_output"
TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")

DEFAULT_ANSWER = (
    "This is clawstack's scripted fake model, not a language model. "
    "Put a line such as '@fake reply: Hello' in the last user message to choose its answer."
)
"""The answer when neither a directive nor a script step says otherwise."""


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call the fake emits: a function ``name`` and its ``arguments`` as compact JSON object text."""

    name: str
    arguments: str

    @classmethod
    def build(cls, name: str, arguments: Any) -> FakeToolCall:
        """Validate ``name`` and serialise ``arguments`` (which must be a JSON object); raise ``ValueError``."""
        if not TOOL_NAME_PATTERN.fullmatch(name):
            raise ValueError("a tool name must be 1-64 characters from A-Z, a-z, 0-9, '_' and '-'")
        if not isinstance(arguments, dict):
            raise ValueError("tool-call arguments must be a JSON object")
        return cls(name=name, arguments=json.dumps(arguments, separators=(",", ":"), ensure_ascii=False))


@dataclass(frozen=True)
class Behaviour:
    """One answer of the fake model.

    The content comes from at most one of ``reply``, ``echo`` (the last user message without its directive
    lines) and ``empty`` (``""``); with none of them and no tool calls the fake sends :data:`DEFAULT_ANSWER`.
    ``fail_status`` replaces the answer with an OpenAI error body. ``delay_ms`` waits before answering,
    ``chunk_delay_ms`` before each streamed chunk. ``drop_after_chunks`` aborts the connection after that many
    streamed chunks (a non-streaming answer is dropped before it is sent). ``malformed`` sends a 200 whose JSON
    (or SSE event data) is broken.
    """

    reply: str | None = None
    echo: bool = False
    empty: bool = False
    tool_calls: tuple[FakeToolCall, ...] = ()
    fail_status: int | None = None
    retry_after_s: int | None = None
    delay_ms: int = 0
    chunk_delay_ms: int = 0
    drop_after_chunks: int | None = None
    malformed: bool = False


def check_behaviour(behaviour: Behaviour) -> Behaviour:
    """Return ``behaviour`` if its parts fit together; raise ``ValueError`` naming the conflict otherwise."""
    b = behaviour
    sources = [name for name, on in (("reply", b.reply is not None), ("echo", b.echo), ("empty", b.empty)) if on]
    if len(sources) > 1:
        raise ValueError(f"choose one of reply, echo and empty, not {' and '.join(sources)}")
    if b.reply == "":
        raise ValueError("reply text is empty; use 'empty' for an empty answer")
    if len(b.tool_calls) > MAX_TOOL_CALLS:
        raise ValueError(f"at most {MAX_TOOL_CALLS} tool calls")
    if b.fail_status is not None:
        if not 400 <= b.fail_status <= 599:
            raise ValueError("fail takes an HTTP status from 400 to 599")
        others = [
            name
            for name, on in (
                ("reply", b.reply is not None),
                ("echo", b.echo),
                ("empty", b.empty),
                ("tool calls", bool(b.tool_calls)),
                ("chunk delay", b.chunk_delay_ms > 0),
                ("drop", b.drop_after_chunks is not None),
                ("malformed", b.malformed),
            )
            if on
        ]
        if others:
            raise ValueError(f"fail cannot be combined with {', '.join(others)}")
    elif b.retry_after_s is not None:
        raise ValueError("retry-after only goes with fail")
    if b.malformed and (b.drop_after_chunks is not None or b.tool_calls or sources):
        raise ValueError("malformed cannot be combined with an answer, tool calls or drop")
    for name, value, limit in (
        ("delay", b.delay_ms, MAX_DELAY_MS),
        ("chunk delay", b.chunk_delay_ms, MAX_DELAY_MS),
        ("retry-after", b.retry_after_s or 0, MAX_RETRY_AFTER_S),
    ):
        if not 0 <= value <= limit:
            raise ValueError(f"{name} must be from 0 to {limit}")
    if b.drop_after_chunks is not None and b.drop_after_chunks < 0:
        raise ValueError("drop-after-chunks must not be negative")
    return behaviour
