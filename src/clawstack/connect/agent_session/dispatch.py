"""Dispatch of exactly one operation to exactly one already-known session; it never raises.

Every callback runs under a wall-clock deadline applied here (``AGENT_SESSION_CALL_TIMEOUT_MS``, 60 s by default,
overridable per call with ``timeout_ms``, never past ``max_call_timeout_ms``), with a
:class:`~clawstack.connect.agent_session.types.CallOptions` ``signal`` merging the caller's with that deadline: it is
set when the deadline passes, when the caller's ``cancel`` event fires, or when the caller's own task is cancelled
(the ClawConnect operation that triggered the call was). A callback still running then is abandoned (cancelled,
never awaited again), so a hung host cannot wedge a task. Failures come back as a :class:`DispatchResult` whose
``error`` carries a branchable code:

========================= ==========================================================
``unknown_runtime``       no runtime with that id is registered in this build
``unsupported_operation`` the runtime registered no callback for the operation
``session_not_found``     the callback returned ``None``: the runtime has no such session
``<op>_timeout``          the deadline passed (``inspect_timeout``, ``continue_timeout``, ``detach_timeout``)
``<op>_failed``           the callback raised, or the caller cancelled the call
========================= ==========================================================

and an ``unavailable`` observation that carries ``last_state``, the last state anyone reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from clawstack.connect.agent_session.normalize import Observation, normalize_observation, unavailable
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.agent_session.types import (
    AgentSessionRef,
    CallOptions,
    ContinueRequest,
    DetachRequest,
    Operation,
    State,
)

TIMEOUT_ENV: Final = "AGENT_SESSION_CALL_TIMEOUT_MS"
DEFAULT_CALL_TIMEOUT_MS: Final = 60_000
MAX_CALL_TIMEOUT_MS: Final = 3_600_000
_log = logging.getLogger(__name__)


def call_timeout_ms_from_env(environ: Mapping[str, str]) -> int:
    """``AGENT_SESSION_CALL_TIMEOUT_MS`` as a positive integer (at most an hour), else the 60 s default."""
    raw = environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CALL_TIMEOUT_MS
    if raw.isdigit() and 0 < int(raw) <= MAX_CALL_TIMEOUT_MS:
        return int(raw)
    _log.warning(
        "%s must be an integer from 1 to %d; using %d", TIMEOUT_ENV, MAX_CALL_TIMEOUT_MS, DEFAULT_CALL_TIMEOUT_MS
    )
    return DEFAULT_CALL_TIMEOUT_MS


@dataclass(frozen=True, slots=True)
class DispatchError:
    """Why a call produced no observation: a stable ``code`` and a message that never quotes the runtime."""

    code: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """The outcome of one call: an observation, or an ``unavailable`` one with an ``error``.

    ``last_state`` is the last state anyone reported for the session (carried through a failure)."""

    operation: Operation
    observation: Observation
    error: DispatchError | None = None
    last_state: State | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "ok": self.ok,
            "observation": self.observation.to_json(),
            "error": None if self.error is None else self.error.to_json(),
            "lastState": self.last_state,
        }


class Dispatcher:
    """Runs one callback for one session under the seam's deadline; see the module docstring."""

    def __init__(
        self,
        registry: AgentSessionRuntimeRegistry,
        *,
        call_timeout_ms: int = DEFAULT_CALL_TIMEOUT_MS,
        max_call_timeout_ms: int = MAX_CALL_TIMEOUT_MS,
    ):
        if not 0 < call_timeout_ms <= max_call_timeout_ms:
            raise ValueError("call_timeout_ms must be positive and at most max_call_timeout_ms")
        self.registry = registry
        self.call_timeout_ms = call_timeout_ms
        self.max_call_timeout_ms = max_call_timeout_ms

    def deadline_ms(self, timeout_ms: int | None) -> int:
        """The deadline of one call: ``timeout_ms`` (a positive integer, capped at ``max_call_timeout_ms``), else
        the configured one."""
        if isinstance(timeout_ms, int) and not isinstance(timeout_ms, bool) and timeout_ms > 0:
            return min(timeout_ms, self.max_call_timeout_ms)
        return self.call_timeout_ms

    async def inspect(self, ref: AgentSessionRef, **kwargs: Any) -> DispatchResult:
        return await self.dispatch("inspect", ref, **kwargs)

    async def dispatch(
        self,
        operation: Operation,
        ref: AgentSessionRef,
        request: ContinueRequest | DetachRequest | None = None,
        *,
        timeout_ms: int | None = None,
        cancel: asyncio.Event | None = None,
        last_state: State | None = None,
        caller: str | None = None,
    ) -> DispatchResult:
        """Call ``operation`` on the session ``ref`` names, for the attachment's owner ``caller`` (handed to the
        callback as ``options.caller``); never raises (see the module docstring)."""

        def failed(code: str, message: str) -> DispatchResult:
            return DispatchResult(operation, unavailable(), DispatchError(code, message), last_state)

        entry = self.registry.get(ref.runtime)
        if entry is None:
            return failed("unknown_runtime", "no runtime with this id is registered here")
        callback: Any = {"inspect": entry.inspect, "continue": entry.continue_, "detach": entry.detach}[operation]
        if callback is None:
            return failed("unsupported_operation", f"the runtime registered no {operation} callback")
        deadline_ms = self.deadline_ms(timeout_ms)
        signal = asyncio.Event()
        options = CallOptions(signal=signal, deadline_ms=deadline_ms, caller=caller)
        if operation == "inspect":
            call = _invoke(callback, ref, options)
        elif operation == "continue":
            call = _invoke(callback, ref, request or ContinueRequest(None, {}), options)
        else:
            call = _invoke(callback, ref, request or DetachRequest("", False), options)
        task = asyncio.ensure_future(call)
        waiters: set[asyncio.Future[Any]] = {task}
        cancelled = None
        if cancel is not None:
            cancelled = asyncio.ensure_future(cancel.wait())
            waiters.add(cancelled)
        try:
            await asyncio.wait(waiters, timeout=deadline_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cancelled is not None:
                cancelled.cancel()
            if not task.done():
                # The deadline passed, the caller's event fired, or the caller's own task is being cancelled (then
                # its CancelledError goes on propagating): in every case the callback is told, then abandoned.
                signal.set()
                _abandon(task)
        if not task.done():
            if cancel is not None and cancel.is_set():
                return failed(f"{operation}_failed", f"the {operation} call was cancelled by its caller")
            return failed(f"{operation}_timeout", f"the runtime did not answer {operation} within {deadline_ms} ms")
        if task.cancelled():
            return failed(f"{operation}_failed", f"the runtime's {operation} callback was cancelled")
        exc = task.exception()
        if exc is not None:
            _log.warning("runtime %s: %s raised %s", ref.runtime, operation, type(exc).__name__)
            return failed(f"{operation}_failed", f"the runtime's {operation} callback raised {type(exc).__name__}")
        reply = task.result()
        if reply is None:
            return failed("session_not_found", "the runtime has no such session")
        try:
            observation = normalize_observation(reply)
        except Exception:
            # A reply object whose own methods raise said nothing recognisable.
            observation = normalize_observation(None)
        return DispatchResult(operation, observation, None, last_state)


async def _invoke(callback: Any, *args: Any) -> Any:
    result = callback(*args)
    if inspect.isawaitable(result):
        return await result
    return result


def _abandon(task: asyncio.Future[Any]) -> None:
    """Cancel a callback past its deadline and stop caring how it ends (its outcome is retrieved, not raised)."""
    task.cancel()

    def retrieve(done: asyncio.Future[Any]) -> None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            done.exception()

    task.add_done_callback(retrieve)


def default_call_timeout_ms() -> int:
    """The deadline from this process's environment."""
    return call_timeout_ms_from_env(os.environ)


__all__ = [
    "DEFAULT_CALL_TIMEOUT_MS",
    "MAX_CALL_TIMEOUT_MS",
    "TIMEOUT_ENV",
    "DispatchError",
    "DispatchResult",
    "Dispatcher",
    "call_timeout_ms_from_env",
    "default_call_timeout_ms",
]
