"""@fake directives: every directive, their combinations, the turn rule, and a table of malformed lines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.llm import FakeDirectiveError
from clawstack.llm.fake import STRUCTURED_OUTPUT_TOOL, Behaviour, FakeToolCall, parse_directives, strip_directives
from clawstack.llm.fake.directives import for_turn, is_directive_line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@fake reply: Hello there", Behaviour(reply="Hello there")),
        ("intro\n  @fake reply: one\n@fake reply: two", Behaviour(reply="one\ntwo")),
        ("@fake echo", Behaviour(echo=True)),
        ("@fake empty", Behaviour(empty=True)),
        ("@fake malformed", Behaviour(malformed=True)),
        ("@fake tool-call: lookup", Behaviour(tool_calls=(FakeToolCall("lookup", "{}"),))),
        (
            '@fake tool-call: get_weather {"city": "Paris", "days": [1, 2]}',
            Behaviour(tool_calls=(FakeToolCall("get_weather", '{"city":"Paris","days":[1,2]}'),)),
        ),
        (
            '@fake structured-output: {"answer": 42}\n@fake tool-call: b {}',
            Behaviour(tool_calls=(FakeToolCall(STRUCTURED_OUTPUT_TOOL, '{"answer":42}'), FakeToolCall("b", "{}"))),
        ),
        ("@fake fail: 429", Behaviour(fail_status=429)),
        (
            "@fake fail: 503\n@fake retry-after-s: 9\n@fake delay-ms: 10",
            Behaviour(fail_status=503, retry_after_s=9, delay_ms=10),
        ),
        (
            "@fake reply: slow\n@fake delay-ms: 5\n@fake chunk-delay-ms: 7\n@fake drop-after-chunks: 2",
            Behaviour(reply="slow", delay_ms=5, chunk_delay_ms=7, drop_after_chunks=2),
        ),
        ("@fake drop-after-chunks: 0", Behaviour(drop_after_chunks=0)),
    ],
)
def test_valid_directives(text: str, expected: Behaviour) -> None:
    assert parse_directives(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain text",
        "email me @fake.example.com",
        "@faker reply: no",
        "text with @fake reply: in the middle",
        "@fake-reply: x",
    ],
)
def test_text_without_directives(text: str) -> None:
    assert parse_directives(text) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("@fake", "line 1: expected '@fake NAME'"),
        ("@fake   ", "line 1: expected '@fake NAME'"),
        ("hi\n@fake replly: x", "line 2: unknown directive 'replly'"),
        ("@fake reply now: x", "expected '@fake NAME' or '@fake NAME: VALUE'"),
        ("@fake reply", "'reply' needs a value"),
        ("@fake reply:   ", "'reply' needs a value"),
        ("@fake echo: please", "'echo' takes no value"),
        ("@fake empty: yes", "'empty' takes no value"),
        ("@fake echo\n@fake echo", "'echo' is given twice"),
        ("@fake fail: 429\n@fake fail: 500", "'fail' is given twice"),
        ("@fake fail: soon", "expects a whole number"),
        ("@fake fail: -1", "expects a whole number"),
        ("@fake fail: 4.5", "expects a whole number"),
        ("@fake fail: 200", "from 400 to 599"),
        ("@fake fail: 600", "from 400 to 599"),
        ("@fake delay-ms: 600001", "delay must be from 0 to 600000"),
        ("@fake delay-ms: 1e3", "expects a whole number"),
        ("@fake chunk-delay-ms: 9999999999", "expects a whole number"),
        ("@fake retry-after-s: 3", "retry-after only goes with fail"),
        ("@fake tool-call: bad.name {}", "tool name"),
        ("@fake tool-call: f [1, 2]", "expects a JSON object"),
        ("@fake tool-call: f {oops}", "expects a JSON object (Expecting property name"),
        ("@fake structured-output: [1]", "expects a JSON object"),
        ("@fake structured-output: {", "expects a JSON object"),
        ("@fake structured-output: {}\n@fake structured-output: {}", "is given twice"),
        ("@fake reply: a\n@fake echo", "choose one of reply, echo and empty, not reply and echo"),
        ("@fake echo\n@fake empty", "not echo and empty"),
        ("@fake fail: 500\n@fake reply: x", "fail cannot be combined with reply"),
        ("@fake fail: 500\n@fake tool-call: f", "fail cannot be combined with tool calls"),
        ("@fake fail: 500\n@fake drop-after-chunks: 1", "fail cannot be combined with drop"),
        ("@fake fail: 500\n@fake chunk-delay-ms: 1", "fail cannot be combined with chunk delay"),
        ("@fake malformed\n@fake reply: x", "malformed cannot be combined"),
        ("@fake malformed\n@fake drop-after-chunks: 1", "malformed cannot be combined"),
    ],
)
def test_malformed_directives_are_refused_with_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(FakeDirectiveError) as caught:
        parse_directives(text)
    assert message in caught.value.message
    assert caught.value.code == "fake_directive_invalid"


def test_is_directive_line() -> None:
    assert is_directive_line("@fake echo")
    assert is_directive_line("   @fake\techo")
    assert is_directive_line("@fake")
    assert not is_directive_line("@fakeecho")
    assert not is_directive_line("say @fake echo")


def test_strip_directives_keeps_only_the_message_text() -> None:
    assert strip_directives("  Hello\n@fake echo\nworld  \n @fake delay-ms: 5") == "Hello\nworld"


def test_turn_rule_tool_calls_first_then_the_reply() -> None:
    directed = Behaviour(reply="Sunny.", tool_calls=(FakeToolCall("weather", "{}"),), delay_ms=3)
    first = for_turn(directed, tool_results=0)
    assert first == Behaviour(tool_calls=(FakeToolCall("weather", "{}"),), delay_ms=3)
    after = for_turn(directed, tool_results=1)
    assert after == Behaviour(reply="Sunny.", delay_ms=3)


def test_turn_rule_without_a_reply_summarises_the_tool_results() -> None:
    directed = Behaviour(tool_calls=(FakeToolCall("a", "{}"), FakeToolCall("b", "{}")))
    assert for_turn(directed, 2).reply == "The scripted fake model received 2 tool results."
    assert for_turn(directed, 1).reply == "The scripted fake model received 1 tool result."


def test_turn_rule_leaves_answers_without_tool_calls_alone() -> None:
    assert for_turn(Behaviour(echo=True), 3) == Behaviour(echo=True)


@given(st.text(max_size=300))
def test_arbitrary_text_parses_or_fails_cleanly(text: str) -> None:
    try:
        result = parse_directives(text)
    except FakeDirectiveError:
        return
    assert result is None or isinstance(result, Behaviour)


@given(st.lists(st.text(st.characters(blacklist_characters="@"), max_size=40), max_size=8))
def test_text_without_at_signs_has_no_directives(lines: list[str]) -> None:
    assert parse_directives("\n".join(lines)) is None
