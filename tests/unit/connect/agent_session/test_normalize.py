"""The observation contract: closed vocabulary, final answers only in a completed turn, termination only in a
terminal state, timestamps to epoch milliseconds, string-only metadata, and no identity from the reply."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.connect.agent_session import STATES, normalize_observation
from clawstack.connect.agent_session.normalize import epoch_ms

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.parametrize("state", STATES)
def test_every_state_of_the_vocabulary_is_kept(state: str) -> None:
    assert normalize_observation({"state": state}).state == state


@pytest.mark.parametrize("junk", ["RUNNING", "done", " running", "", None, 3, ["running"], {"s": 1}, True])
def test_anything_else_reads_unknown(junk: Any) -> None:
    assert normalize_observation({"state": junk}).state == "unknown"


@pytest.mark.parametrize("reply", ["running", 42, ["state"], object()])
def test_a_reply_that_is_not_a_mapping_is_unknown(reply: Any) -> None:
    observation = normalize_observation(reply)
    assert observation.state == "unknown"
    assert observation.final_response is None


@pytest.mark.parametrize("state", STATES)
def test_a_final_answer_only_in_a_completed_turn(state: str) -> None:
    observation = normalize_observation({"state": state, "finalResponse": "answer", "latestResponse": "partial"})
    assert observation.final_response == ("answer" if state in ("idle", "completed") else None)
    assert observation.latest_response == "partial"


@pytest.mark.parametrize(
    ("state", "said", "terminated"),
    [
        ("completed", None, True),
        ("dead", None, True),
        ("failed", None, True),
        ("completed", False, False),
        ("dead", False, False),
        ("idle", None, True),
        ("idle", False, False),
        ("running", True, False),
        ("needs_input", True, False),
        ("unknown", True, False),
        ("unavailable", True, False),
        ("stale", None, False),
    ],
)
def test_termination_only_in_terminal_states(state: str, said: bool | None, terminated: bool) -> None:
    reply: dict[str, Any] = {"state": state}
    if said is not None:
        reply["terminated"] = said
    observation = normalize_observation(reply)
    assert observation.terminated is terminated
    if terminated:
        assert observation.alive is False


@pytest.mark.parametrize("said_terminated", [None, True, False, "yes"])
@pytest.mark.parametrize("said_alive", [None, True, False, 1])
def test_idle_and_completed_are_alike_for_liveness(said_terminated: object, said_alive: object) -> None:
    # "idle / completed: the turn finished ... both are treated as a completed turn."
    extra = {k: v for k, v in (("terminated", said_terminated), ("alive", said_alive)) if v is not None}
    idle = normalize_observation({"state": "idle", "finalResponse": "a", **extra})
    completed = normalize_observation({"state": "completed", "finalResponse": "a", **extra})
    assert (idle.alive, idle.terminated, idle.final_response) == (
        completed.alive,
        completed.terminated,
        completed.final_response,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1_767_225_600, 1_767_225_600_000),
        (1_767_225_600.5, 1_767_225_600_500),
        (1_767_225_600_000, 1_767_225_600_000),
        ("2026-01-01T00:00:00Z", 1_767_225_600_000),
        ("2026-01-01T01:00:00.250+01:00", 1_767_225_600_250),
        ("2026-01-01T00:00:00", None),  # no offset: cannot be dated without guessing
        ("2026-01-01", None),
        ("yesterday", None),
        ("1767225600", None),
        (True, None),
        (0, None),
        (-5, None),
        (float("nan"), None),
        (float("inf"), None),
        (10**20, None),
        (None, None),
        ([1], None),
    ],
)
def test_timestamps_become_epoch_milliseconds(value: Any, expected: int | None) -> None:
    assert epoch_ms(value) == expected
    assert normalize_observation({"state": "running", "lastEventAt": value}).last_event_at_ms == expected


def test_metadata_is_strings_only_and_identity_is_never_taken_from_the_reply() -> None:
    reply = {
        "state": "running",
        "metadata": {"ok": "yes", "n": 1, "nested": {"a": "b"}, "flag": True, "": "empty key"},
        "sessionId": "renamed",
        "runtime": "other",
    }
    observation = normalize_observation(reply)
    assert dict(observation.metadata) == {"ok": "yes"}
    assert "renamed" not in repr(observation.to_json())
    assert "other" not in repr(observation.to_json())
    assert normalize_observation({"state": "running", "metadata": ["x"]}).metadata == {}


@given(JSON)
def test_any_reply_normalises_into_the_vocabulary(reply: Any) -> None:
    observation = normalize_observation(reply)
    assert observation.state in STATES
    if observation.state not in ("idle", "completed"):
        assert observation.final_response is None
    if observation.terminated:
        assert observation.state in ("completed", "dead", "failed")
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in observation.metadata.items())
    assert observation.last_event_at_ms is None or observation.last_event_at_ms > 0
