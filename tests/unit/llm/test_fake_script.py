"""Script files: valid steps, a table of malformed scripts, files on disk, and consumption in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.llm import FakeScriptError
from clawstack.llm.fake import Behaviour, FakeScript, FakeToolCall, ScriptStep, load_script, parse_script
from clawstack.llm.fake.script import ScriptPlayer


def test_every_step_key() -> None:
    script = parse_script(
        [
            {"match": "weather", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
            {"reply": "Sunny.", "delay_ms": 5, "chunk_delay_ms": 6, "drop_after_chunks": 3},
            {"structured_output": {"answer": 42}, "reply": "and text"},
            {"echo": True},
            {"empty": True},
            {"fail": 429, "retry_after_s": 2},
            {"malformed": True},
            {"tool_calls": [{"name": "no_args"}]},
        ]
    )
    assert script.steps == (
        ScriptStep(Behaviour(tool_calls=(FakeToolCall("get_weather", '{"city":"Paris"}'),)), match="weather"),
        ScriptStep(Behaviour(reply="Sunny.", delay_ms=5, chunk_delay_ms=6, drop_after_chunks=3)),
        ScriptStep(Behaviour(reply="and text", tool_calls=(FakeToolCall("structured_output", '{"answer":42}'),))),
        ScriptStep(Behaviour(echo=True)),
        ScriptStep(Behaviour(empty=True)),
        ScriptStep(Behaviour(fail_status=429, retry_after_s=2)),
        ScriptStep(Behaviour(malformed=True)),
        ScriptStep(Behaviour(tool_calls=(FakeToolCall("no_args", "{}"),))),
    )


def test_json_text_and_bytes_parse_the_same() -> None:
    steps = [{"reply": "a"}, {"echo": True}]
    assert parse_script(json.dumps(steps)) == parse_script(json.dumps(steps).encode()) == parse_script(steps)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("", "not valid JSON"),
        ("[{", "not valid JSON"),
        ('{"reply": "x"}', "must be a JSON array"),
        ("[]", "has no steps"),
        ('["reply"]', "script step 1: a step must be a JSON object"),
        ('[{"reply": "a"}, {"replly": "b"}]', "script step 2: replly: Extra inputs are not permitted"),
        ('[{"reply": 5}]', "script step 1: reply: Input should be a valid string"),
        ('[{"echo": "yes"}]', "script step 1: echo: Input should be a valid boolean"),
        ('[{"fail": "429"}]', "script step 1: fail: Input should be a valid integer"),
        ('[{"fail": true}]', "script step 1: fail: Input should be a valid integer"),
        ('[{"delay_ms": 1.5}]', "script step 1: delay_ms: Input should be a valid integer"),
        ('[{"match": ""}]', "script step 1: match: String should have at least 1 character"),
        ('[{"tool_calls": [{"arguments": {}}]}]', "script step 1: tool_calls.0.name: Field required"),
        ('[{"tool_calls": [{"name": "f", "arguments": [1]}]}]', "tool_calls.0.arguments: Input should be a valid"),
        ('[{"tool_calls": [{"name": "f", "args": {}}]}]', "tool_calls.0.args: Extra inputs are not permitted"),
        ('[{"tool_calls": [{"name": "a b"}]}]', "script step 1: a tool name must be"),
        ('[{"structured_output": "x"}]', "structured_output: Input should be a valid dictionary"),
        ('[{"reply": "a", "echo": true}]', "script step 1: choose one of reply, echo and empty"),
        ('[{"reply": ""}]', "reply text is empty"),
        ('[{"fail": 302}]', "from 400 to 599"),
        ('[{"fail": 500, "reply": "x"}]', "fail cannot be combined with reply"),
        ('[{"retry_after_s": 3}]', "retry-after only goes with fail"),
        ('[{"delay_ms": -1}]', "delay must be from 0 to 600000"),
        ('[{"drop_after_chunks": -1}]', "drop-after-chunks must not be negative"),
        ('[{"malformed": true, "echo": true}]', "malformed cannot be combined"),
    ],
)
def test_malformed_scripts_are_refused_with_a_clear_error(source: str, message: str) -> None:
    with pytest.raises(FakeScriptError) as caught:
        parse_script(source)
    assert message in caught.value.message
    assert caught.value.code == "fake_script_invalid"


def test_load_script_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text('[{"reply": "from a file"}]')
    assert load_script(path) == FakeScript(steps=(ScriptStep(Behaviour(reply="from a file")),))


def test_load_script_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[{"nope": 1}]')
    with pytest.raises(FakeScriptError, match=r"bad\.json: script step 1: nope"):
        load_script(path)
    with pytest.raises(FakeScriptError, match=r"cannot read the script file .*missing\.json"):
        load_script(tmp_path / "missing.json")


def test_player_consumes_in_order_and_honours_match() -> None:
    player = ScriptPlayer(
        parse_script([{"reply": "first"}, {"match": "weather", "reply": "sunny"}, {"reply": "third"}])
    )
    assert player.remaining == 3
    assert player.take("hello") == Behaviour(reply="first")
    assert player.take("hello again") == Behaviour(reply="third")
    assert player.take("hello once more") is None
    assert player.take("what is the weather?") == Behaviour(reply="sunny")
    assert player.remaining == 0
    assert player.take("weather") is None


def test_a_step_given_back_is_the_next_one_taken() -> None:
    player = ScriptPlayer(parse_script([{"reply": "same"}, {"reply": "same"}, {"reply": "last"}]))
    first = player.take("x")
    second = player.take("x")
    assert first == second == Behaviour(reply="same")
    player.give_back(first)
    assert player.remaining == 2
    assert player.take("x") is first  # the very step given back, not an equal one
    player.give_back(Behaviour(reply="same"))  # equal but not a step's own object: ignored
    assert player.remaining == 1
    assert player.take("x") == Behaviour(reply="last")
    assert player.take("x") is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=3),
    max_leaves=12,
)
_keys = st.sampled_from(["reply", "echo", "fail", "tool_calls", "match", "delay_ms", "malformed", "x"])


@given(st.lists(st.dictionaries(_keys, _json, max_size=3) | _json, max_size=4))
def test_arbitrary_json_parses_or_fails_cleanly(steps: list[Any]) -> None:
    try:
        script = parse_script(steps)
    except FakeScriptError:
        return
    assert all(isinstance(step.behaviour, Behaviour) for step in script.steps)


def test_match_user_looks_at_every_user_message_and_combines_with_match() -> None:
    player = ScriptPlayer(
        parse_script(
            [
                {"match_user": "PARENT", "reply": "parent"},
                {"match": "context", "match_user": "CHILD", "reply": "child"},
            ]
        )
    )
    # A gateway that appends a context message after the user's: the last user message is the context.
    assert player.take("context", ("CHILD task", "context")) == Behaviour(reply="child")
    assert player.take("context", ("no marker", "context")) is None
    assert player.take("context", ("PARENT question", "context")) == Behaviour(reply="parent")
    assert player.remaining == 0


def test_extended_steps_come_after_the_unused_ones() -> None:
    player = ScriptPlayer(parse_script([{"reply": "a"}, {"reply": "b"}]))
    assert player.take("x") == Behaviour(reply="a")
    player.extend(parse_script([{"reply": "c"}]))
    assert [player.take("x"), player.take("x"), player.take("x")] == [Behaviour(reply="b"), Behaviour(reply="c"), None]
