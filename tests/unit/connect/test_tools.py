"""The tool surface: names, arguments, READ ONLY descriptions, argument errors, clamping, session keys, what a
snapshot shows (and never shows), and reading outcomes from transcripts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.connect import TOOLS, ToolError, tool_definitions
from clawstack.connect.agents import Agent
from clawstack.connect.jobs import Job
from clawstack.connect.service import compose_message
from clawstack.connect.snapshots import Observed, detail_snapshot, preview, task_snapshot
from clawstack.connect.tools import clamp_limit, clamp_wait_ms, parse_arguments
from clawstack.connect.transcript import find_answer, message_text, run_active

ARGUMENTS = {
    "run_task": ({"task"}, {"task", "agent", "context", "sessionKey", "senderName"}),
    "check_task": ({"jobId"}, {"jobId", "sessionKey", "agent", "knownLogCount", "mode", "waitMs"}),
    "get_task": ({"taskId"}, {"taskId", "detail"}),
    "list_tasks": (set(), {"view"}),
    "get_session": ({"sessionId"}, {"sessionId", "mode", "limit", "after", "agent"}),
    "list_sessions": (set(), set()),
    "cancel_task": ({"jobId"}, {"jobId", "stopAgentSession"}),
}
WRITES = {"run_task", "cancel_task"}


def test_the_seven_tools_and_their_arguments() -> None:
    assert [spec.name for spec in TOOLS] == list(ARGUMENTS)
    for tool in tool_definitions():
        required, allowed = ARGUMENTS[tool.name]
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert schema.get("additionalProperties") is False
        assert set(schema["properties"]) == allowed
        assert set(schema.get("required", [])) == required
        assert tool.description is not None
        assert tool.description.startswith("READ ONLY: ") == (tool.name not in WRITES)
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (tool.name not in WRITES)


def test_enumerations_in_the_schemas() -> None:
    schemas = {tool.name: tool.input_schema["properties"] for tool in tool_definitions()}
    assert schemas["check_task"]["mode"]["enum"] == ["wait", "poll"]
    assert schemas["get_task"]["detail"]["enum"] == [
        "core",
        "summary",
        "updates",
        "artifacts",
        "diagnostics",
        "prompt",
        "full",
    ]
    assert schemas["list_tasks"]["view"]["enum"] == ["active", "all"]
    assert schemas["get_session"]["mode"]["enum"] == ["snapshot", "events", "tail", "tasks"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 45000),
        (-50, 1000),
        (math.nan, 45000),
        (1e9, 120000),
        (math.inf, 120000),
        (-math.inf, 1000),
        (5000, 5000),
        (1500.7, 1500),
    ],
)
def test_wait_ms_clamping(value: float | None, expected: int) -> None:
    assert clamp_wait_ms(value) == expected


@given(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers()))
def test_wait_ms_is_always_within_bounds(value: float | None) -> None:
    assert 1000 <= clamp_wait_ms(value) <= 120000


def test_limit_clamping() -> None:
    assert [clamp_limit(v) for v in (None, 0, -5, 10, 200, 500)] == [50, 1, 1, 10, 200, 200]


@pytest.mark.parametrize(
    ("name", "arguments", "code", "field"),
    [
        ("run_task", {}, "invalid_arguments", "task"),
        ("run_task", {"task": 1}, "invalid_arguments", "task"),
        ("run_task", {"task": "t", "x": 1}, "invalid_arguments", "x"),
        ("check_task", {"jobId": "j", "waitMs": True}, "invalid_arguments", "waitMs"),
        ("check_task", {"jobId": "j", "knownLogCount": 1.0}, "invalid_arguments", "knownLogCount"),
        ("get_task", {"taskId": "t", "detail": "nope"}, "invalid_arguments", "detail"),
        ("nope", {}, "unknown_tool", None),
    ],
)
def test_argument_errors(name: str, arguments: dict[str, object], code: str, field: str | None) -> None:
    with pytest.raises(ToolError) as info:
        parse_arguments(name, arguments)
    assert info.value.code == code
    if field is not None:
        assert info.value.data["field"].startswith(field)


def test_argument_errors_never_quote_values() -> None:
    with pytest.raises(ToolError) as info:
        parse_arguments("run_task", {"task": ["secret-task-text"]})
    assert "secret-task-text" not in str(info.value.to_result())


def test_non_object_arguments() -> None:
    with pytest.raises(ToolError):
        parse_arguments("list_tasks", ["view"])


AGENT = Agent("house", "ws://h:1", "research")


def test_the_message_carries_sender_task_and_context() -> None:
    assert compose_message("do it", None, None) == "do it"
    assert compose_message("do it", "some background", "Ada") == "[from Ada]\n\ndo it\n\nContext:\nsome background"


JOB = Job(
    job_id="job_1",
    task_id="task_1",
    run_id="run-1",
    agent="house",
    openclaw_agent_id="main",
    session_key="agent:main:channel:clawconnect:s",
    created_at_ms=1_795_000_000_000,
    updated_at_ms=1_795_000_000_500,
    prompt={"task": "SECRET-PROMPT", "context": "SECRET-CONTEXT", "senderName": None},
    message="SECRET-PROMPT\n\nContext:\nSECRET-CONTEXT",
    summary="x" * 600,
)
OBSERVED = Observed("active", {})


@pytest.mark.parametrize("detail", ["core", "summary", "updates", "artifacts", "diagnostics", "full"])
def test_the_prompt_appears_only_at_detail_prompt(detail: str) -> None:
    shown = detail_snapshot(JOB, detail, OBSERVED, [], JOB.updated_at_ms)  # type: ignore[arg-type]
    assert "SECRET" not in repr(shown)
    assert "SECRET" not in repr(task_snapshot(JOB, OBSERVED, [], 0))
    assert "SECRET" not in repr(preview(JOB, 0))
    prompt = detail_snapshot(JOB, "prompt", OBSERVED, None, 0)
    assert prompt["prompt"]["task"] == "SECRET-PROMPT"


def test_a_running_snapshot_and_a_preview() -> None:
    snap = task_snapshot(JOB, OBSERVED, [], JOB.updated_at_ms)
    assert snap["createdAt"] == "2026-11-18T11:06:40.000Z"
    assert snap["elapsedMs"] == 500
    assert (snap["continuePolling"], snap["retryAfterMs"], snap["isTerminal"]) == (True, 2000, False)
    assert snap["nextAction"] == {"tool": "check_task", "args": {"jobId": "job_1", "sessionKey": JOB.session_key}}
    assert (snap["agentSession"], snap["parentRunId"]) == (None, "run-1")
    item = preview(JOB, 0)
    assert (len(item["summary"]), item["summaryTruncated"]) == (500, True)


def test_reading_answers_from_transcripts() -> None:
    ours = {
        "messages": [
            {"role": "user", "content": "q", "idempotencyKey": "r1:user", "runId": "r1"},
            {"role": "assistant", "content": [{"type": "text", "text": "a1"}], "runId": "r1"},
            {"role": "user", "content": "q2", "idempotencyKey": "r2:user", "runId": "r2"},
        ],
        "sessionInfo": {"activeRunIds": ["r2"]},
    }
    assert find_answer(ours, "r1") == "a1"
    assert find_answer(ours, "r2") is None
    assert (run_active(ours, "r1"), run_active(ours, "r2")) == (False, True)
    openclaw = {
        "messages": [
            {"role": "user", "content": "ping", "idempotencyKey": "oc:user"},
            {"role": "assistant", "content": [{"type": "text", "text": "pong"}], "__openclaw": {"runId": "oc"}},
        ],
        "sessionInfo": {"lastRunId": "oc", "status": "done"},
    }
    assert find_answer(openclaw, "oc") == "pong"
    assert run_active(openclaw, "oc") is False
    untagged = {"messages": [{"role": "user", "idempotencyKey": "u:user"}, {"role": "assistant", "content": "plain"}]}
    assert find_answer(untagged, "u") == "plain"
    assert run_active(untagged, "u") is None
    assert message_text({"content": [{"type": "image"}, {"type": "text", "text": "t"}]}) == "t"
    assert message_text(None) == ""


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@given(
    st.sampled_from([spec.name for spec in TOOLS]),
    st.dictionaries(
        st.sampled_from(["task", "jobId", "taskId", "sessionId", "waitMs", "mode", "detail", "view", "limit", "x"]),
        JSON_VALUES,
        max_size=4,
    ),
)
def test_arguments_parse_or_are_refused_with_a_tool_error(name: str, arguments: dict[str, object]) -> None:
    try:
        parsed = parse_arguments(name, arguments)
    except ToolError as exc:
        refused: ToolError | None = exc
    else:
        refused = None
        assert set(parsed.model_dump(exclude_unset=True)) == set(arguments)
    assert refused is None or refused.code == "invalid_arguments"
