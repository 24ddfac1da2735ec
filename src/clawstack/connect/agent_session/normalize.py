"""The observation contract: whatever a runtime replies becomes one :class:`Observation`, enforced here once.

* Identity comes from the request, never the reply: an observation has no runtime or session id at all.
* The state vocabulary is closed; anything else (or a reply that is not a mapping) reads ``unknown``.
* ``finalResponse`` exists only in a completed-turn state (``idle``, ``completed``).
* ``terminated`` is true only in a terminal state (``idle``, ``completed``, ``dead``, ``failed``): the runtime's
  own boolean when it gave one, else derived from the state. ``idle`` and ``completed`` are both a completed turn
  and get the same liveness (``terminated``, ``alive``).
* ``lastEventAt`` is epoch milliseconds, from epoch seconds, epoch milliseconds or an ISO 8601 string with an
  offset; anything it cannot date is ``None``.
* Metadata keeps string keys with string values only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from clawstack.connect.agent_session.types import COMPLETED_TURN_STATES, STATES, TERMINAL_STATES, State

MAX_TEXT_CHARS: Final = 100_000
MAX_METADATA_ENTRIES: Final = 64
MAX_METADATA_KEY_CHARS: Final = 128
MAX_METADATA_VALUE_CHARS: Final = 4096
MS_EPOCH_THRESHOLD: Final = 100_000_000_000
"""A number at least this large is taken as epoch milliseconds (in seconds it would be the year 5138)."""
MAX_EPOCH_MS: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_ALIVE_STATES: Final = frozenset({"starting", "running", "needs_input", "needs_permission", "stale"})


@dataclass(frozen=True, slots=True)
class Observation:
    """One normalised reading of a session."""

    state: State
    alive: bool | None = None
    terminated: bool = False
    last_event_at_ms: int | None = None
    latest_response: str | None = None
    final_response: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "alive": self.alive,
            "terminated": self.terminated,
            "lastEventAt": self.last_event_at_ms,
            "latestResponse": self.latest_response,
            "finalResponse": self.final_response,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Observation:
        """Read a stored observation back, through the same normalisation as a runtime's reply."""
        return normalize_observation(data)


def normalize_state(value: object) -> State:
    """A state of the closed vocabulary; anything else is ``unknown``."""
    for state in STATES:
        if value == state and isinstance(value, str):
            return state
    return "unknown"


def epoch_ms(value: object) -> int | None:
    """Epoch milliseconds from epoch seconds, epoch milliseconds or an ISO 8601 string with an offset."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
        if not math.isfinite(number) or number <= 0:
            return None
        ms = int(number) if number >= MS_EPOCH_THRESHOLD else int(number * 1000)
        return ms if ms <= MAX_EPOCH_MS else None
    if isinstance(value, str) and 0 < len(value) <= 64:
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        if moment.tzinfo is None or "T" not in text.upper():
            return None  # a naive or date-only time cannot be dated without guessing a zone
        ms = int(moment.astimezone(UTC).timestamp() * 1000)
        return ms if 0 < ms <= MAX_EPOCH_MS else None
    return None


def clean_metadata(value: object) -> dict[str, str]:
    """String keys with string values only, within the size limits; everything else dropped."""
    if not isinstance(value, Mapping):
        return {}
    result: dict[str, str] = {}
    for key, item in value.items():
        if len(result) >= MAX_METADATA_ENTRIES:
            break
        if (
            isinstance(key, str)
            and isinstance(item, str)
            and 0 < len(key) <= MAX_METADATA_KEY_CHARS
            and len(item) <= MAX_METADATA_VALUE_CHARS
        ):
            result[key] = item
    return result


def _text(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:MAX_TEXT_CHARS]


def normalize_observation(reply: object) -> Observation:
    """The observation a runtime's reply means; see the module docstring. Never raises."""
    if not isinstance(reply, Mapping):
        return Observation("unknown")
    state = normalize_state(reply.get("state"))
    said_terminated = reply.get("terminated")
    terminated = (said_terminated if isinstance(said_terminated, bool) else True) if state in TERMINAL_STATES else False
    said_alive = reply.get("alive")
    alive: bool | None
    if terminated:
        alive = False
    elif isinstance(said_alive, bool):
        alive = said_alive
    elif state in _ALIVE_STATES or state in COMPLETED_TURN_STATES:
        alive = True  # a completed turn the runtime says is not terminated
    elif state in ("dead", "failed"):
        alive = False
    else:
        alive = None
    return Observation(
        state=state,
        alive=alive,
        terminated=terminated,
        last_event_at_ms=epoch_ms(reply.get("lastEventAt")),
        latest_response=_text(reply.get("latestResponse")),
        final_response=_text(reply.get("finalResponse")) if state in COMPLETED_TURN_STATES else None,
        metadata=clean_metadata(reply.get("metadata")),
    )


def unavailable() -> Observation:
    """The observation of a session that could not be reached from here (not evidence that it failed)."""
    return Observation("unavailable")


__all__ = ["Observation", "clean_metadata", "epoch_ms", "normalize_observation", "normalize_state", "unavailable"]
