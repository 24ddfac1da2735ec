"""Script files for the scripted fake model: a JSON list of steps, one per answer, consumed in order.

::

    [
      {"match": "weather", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
      {"reply": "It is sunny in Paris."},
      {"fail": 429, "retry_after_s": 2}
    ]

Each request takes the first step not yet used whose ``match`` (if it has one) is a substring of the last user
message and whose ``match_user`` (if it has one) is a substring of some user message; that step is then used up, unless the client goes away before its answer begins (during its delay):
then it is given back, for the client's retry. The keys of a step are documented in ``docs/fake-llm.md``; unknown keys,
wrong types and conflicting keys raise :class:`FakeScriptError` naming the step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawstack.llm.errors import FakeScriptError
from clawstack.llm.fake.behaviour import STRUCTURED_OUTPUT_TOOL, Behaviour, FakeToolCall, check_behaviour

MAX_SCRIPT_BYTES = 16 * 1024 * 1024


class _ToolCallModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class _StepModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    match: str | None = Field(default=None, min_length=1)
    match_user: str | None = Field(default=None, min_length=1)
    reply: str | None = None
    echo: bool = False
    empty: bool = False
    tool_calls: list[_ToolCallModel] = Field(default_factory=list)
    structured_output: dict[str, Any] | None = None
    fail: int | None = None
    retry_after_s: int | None = None
    delay_ms: int = 0
    chunk_delay_ms: int = 0
    drop_after_chunks: int | None = None
    malformed: bool = False


@dataclass(frozen=True)
class ScriptStep:
    """One step: the behaviour, the substring the last user message must contain and the one some user message
    must contain (``None``: any)."""

    behaviour: Behaviour
    match: str | None = None
    match_user: str | None = None


@dataclass(frozen=True)
class FakeScript:
    """A parsed script: its steps in order. Immutable; a :class:`ScriptPlayer` tracks which are used."""

    steps: tuple[ScriptStep, ...]


def _step(index: int, raw: Any) -> ScriptStep:
    where = f"script step {index + 1}"
    if not isinstance(raw, dict):
        raise FakeScriptError(f"{where}: a step must be a JSON object")
    try:
        model = _StepModel.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "step"
        raise FakeScriptError(f"{where}: {location}: {first['msg']}") from exc
    try:
        calls = [FakeToolCall.build(call.name, call.arguments) for call in model.tool_calls]
        if model.structured_output is not None:
            calls.append(FakeToolCall.build(STRUCTURED_OUTPUT_TOOL, model.structured_output))
        behaviour = check_behaviour(
            Behaviour(
                reply=model.reply,
                echo=model.echo,
                empty=model.empty,
                tool_calls=tuple(calls),
                fail_status=model.fail,
                retry_after_s=model.retry_after_s,
                delay_ms=model.delay_ms,
                chunk_delay_ms=model.chunk_delay_ms,
                drop_after_chunks=model.drop_after_chunks,
                malformed=model.malformed,
            )
        )
    except ValueError as exc:
        raise FakeScriptError(f"{where}: {exc}") from exc
    return ScriptStep(behaviour=behaviour, match=model.match, match_user=model.match_user)


def parse_script(source: str | bytes | Sequence[Any]) -> FakeScript:
    """Parse a script from JSON text, or from an already-decoded list of step objects."""
    if isinstance(source, str | bytes):
        try:
            steps = json.loads(source)
        except (ValueError, RecursionError) as exc:
            raise FakeScriptError(f"the script is not valid JSON: {exc}") from exc
    else:
        steps = source
    if not isinstance(steps, list | tuple):
        raise FakeScriptError("the script must be a JSON array of step objects")
    if not steps:
        raise FakeScriptError("the script has no steps")
    return FakeScript(steps=tuple(_step(index, raw) for index, raw in enumerate(steps)))


def load_script(path: str | os.PathLike[str]) -> FakeScript:
    """Read and parse a script file."""
    file = Path(path)
    try:
        with file.open("rb") as stream:
            data = stream.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise FakeScriptError(f"cannot read the script file {file}: {exc.strerror}") from exc
    if len(data) > MAX_SCRIPT_BYTES:
        raise FakeScriptError(f"the script file {file} is larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        return parse_script(data)
    except FakeScriptError as exc:
        raise FakeScriptError(f"{file}: {exc.message}") from exc


class ScriptPlayer:
    """Hands out a script's steps: each request gets the first unused step that matches it."""

    def __init__(self, script: FakeScript) -> None:
        self._steps = list(script.steps)
        self._used = [False] * len(self._steps)

    def extend(self, script: FakeScript) -> None:
        """Append ``script``'s steps, unused, after the ones there are."""
        self._steps.extend(script.steps)
        self._used.extend([False] * len(script.steps))

    @property
    def remaining(self) -> int:
        """How many steps are not used yet."""
        return self._used.count(False)

    def take(self, last_user_text: str, user_texts: Sequence[str] = ()) -> Behaviour | None:
        """Use up and return the next step matching ``last_user_text`` (and, for ``match_user``, one of
        ``user_texts``, every user message of the request); ``None`` if no step is left for it."""
        for index, step in enumerate(self._steps):
            if self._used[index]:
                continue
            if step.match is not None and step.match not in last_user_text:
                continue
            if step.match_user is None or any(step.match_user in text for text in user_texts):
                self._used[index] = True
                return step.behaviour
        return None

    def give_back(self, behaviour: Behaviour) -> None:
        """Make the step :meth:`take` returned as ``behaviour`` (that very object) unused again.

        For an answer that never began: a client that retries the request gets the step it was meant to get.
        Anything else (a directive's behaviour, a step not used) is ignored.
        """
        for index, step in enumerate(self._steps):
            if self._used[index] and step.behaviour is behaviour:
                self._used[index] = False
                return
