"""The agent-session seam's vocabulary: runtime ids, the closed state vocabulary, and what a callback receives.

A runtime is reached only through three async callbacks, each addressing one session named by an
:class:`AgentSessionRef`: ``inspect(ref, options)``, ``continue_(ref, request, options)`` and
``detach(ref, request, options)``. Each returns ``None`` (the runtime has no such session) or a mapping with the
observation contract's keys (``state``, ``alive``, ``terminated``, ``lastEventAt``, ``latestResponse``,
``finalResponse``, ``metadata``); :func:`~clawstack.connect.agent_session.normalize.normalize_observation` decides
what any reply means.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

RUNTIME_ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
RUNTIME_ID_RE: Final = re.compile(RUNTIME_ID_PATTERN)

State = Literal[
    "starting",
    "running",
    "idle",
    "completed",
    "needs_input",
    "needs_permission",
    "stale",
    "dead",
    "failed",
    "unavailable",
    "unknown",
]
STATES: Final[tuple[State, ...]] = get_args(State)
COMPLETED_TURN_STATES: Final[frozenset[str]] = frozenset({"idle", "completed"})
"""The states in which a turn finished; only these carry a ``finalResponse``."""
TERMINAL_STATES: Final[frozenset[str]] = COMPLETED_TURN_STATES | {"dead", "failed"}
"""The only states in which a session may be ``terminated``; ``idle`` and ``completed`` alike, both being a
completed turn."""
BLOCKED_STATES: Final[frozenset[str]] = frozenset({"needs_input", "needs_permission"})
"""A session blocked on a human: it stays actionable."""

Operation = Literal["inspect", "continue", "detach"]
OPERATIONS: Final[tuple[Operation, ...]] = get_args(Operation)


def is_runtime_id(value: object) -> bool:
    """Whether ``value`` is a valid runtime id (``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``)."""
    return isinstance(value, str) and RUNTIME_ID_RE.fullmatch(value) is not None


@dataclass(frozen=True)
class AgentSessionRef:
    """One session in one runtime, as ClawConnect was told about it (never as the runtime renamed it)."""

    runtime: str
    session_id: str
    provider: str | None = None
    provider_session_id: str | None = None
    host: str | None = None
    remote_url: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CallOptions:
    """What every callback receives: ``signal`` merges the caller's cancellation with the seam's deadline (it is set
    when either fires); ``deadline_ms`` is the deadline the seam applies to this call; ``caller`` is the opaque
    identity of the ClawConnect caller that owns the attachment (``user:<name>``, ``public``, ``anonymous`` or
    ``operator``), for a host that authorizes per caller. ClawConnect never reads it back."""

    signal: asyncio.Event
    deadline_ms: int
    caller: str | None = None


@dataclass(frozen=True)
class ContinueRequest:
    """A follow-up turn for one session: the prompt (``None`` when the directive carried none) and metadata."""

    prompt: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DetachRequest:
    """Stop one session in its runtime; reached only through an explicit ``"stopRuntime": true``."""

    reason: str
    stop_runtime: bool


Reply = Mapping[str, Any] | None
InspectCallback = Callable[[AgentSessionRef, CallOptions], Awaitable[Reply]]
ContinueCallback = Callable[[AgentSessionRef, ContinueRequest, CallOptions], Awaitable[Reply]]
DetachCallback = Callable[[AgentSessionRef, DetachRequest, CallOptions], Awaitable[Reply]]


__all__ = [
    "BLOCKED_STATES",
    "COMPLETED_TURN_STATES",
    "OPERATIONS",
    "RUNTIME_ID_PATTERN",
    "STATES",
    "TERMINAL_STATES",
    "AgentSessionRef",
    "CallOptions",
    "ContinueCallback",
    "ContinueRequest",
    "DetachCallback",
    "DetachRequest",
    "InspectCallback",
    "Operation",
    "Reply",
    "State",
    "is_runtime_id",
]
