"""In-test runtimes for the agent-session seam: each one addresses sessions in an in-memory table and can be told
to hang, raise, answer ``None``, answer junk, rename the session, or wait for the test before answering; and the
helpers the service-level tests share (markers, directive blocks, running a task to its end)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clawstack.connect.agent_session import (
    AgentSessionRef,
    AgentSessionRuntimeRegistry,
    CallOptions,
    ContinueRequest,
    DetachRequest,
)

if TYPE_CHECKING:
    from clawstack.connect import Caller, ConnectService

WAIT = {"waitMs": 10000}
Factory = Callable[..., Awaitable["ConnectService"]]


@dataclass
class FakeRuntime:
    """``sessions`` maps a session id to the reply ``inspect`` gives; ``behaviour`` overrides it for every call
    (``behaviours`` for one call kind): ``"hang"`` (until cancelled, ignoring the signal), ``"raise"``, ``"none"``,
    ``"gate"`` (wait for ``gate``)."""

    sessions: dict[str, Any] = field(default_factory=dict)
    behaviour: str | None = None
    behaviours: dict[str, str] = field(default_factory=dict)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[tuple[str, AgentSessionRef, Any]] = field(default_factory=list)
    signals: list[asyncio.Event] = field(default_factory=list)
    callers: list[str | None] = field(default_factory=list)
    called: asyncio.Event = field(default_factory=asyncio.Event)

    async def _answer(
        self, kind: str, ref: AgentSessionRef, extra: Any, options: CallOptions
    ) -> Mapping[str, Any] | None:
        self.calls.append((kind, ref, extra))
        self.signals.append(options.signal)
        self.callers.append(options.caller)
        self.called.set()
        behaviour = self.behaviours.get(kind, self.behaviour)
        if behaviour == "hang":
            await asyncio.Event().wait()
        if behaviour == "raise":
            raise RuntimeError("secret-token-should-not-leak")
        if behaviour == "none":
            return None
        if behaviour == "gate":
            await self.gate.wait()
        reply = self.sessions.get(ref.session_id)
        return dict(reply) if isinstance(reply, dict) else reply

    async def inspect(self, ref: AgentSessionRef, options: CallOptions) -> Mapping[str, Any] | None:
        return await self._answer("inspect", ref, None, options)

    async def continue_(
        self, ref: AgentSessionRef, request: ContinueRequest, options: CallOptions
    ) -> Mapping[str, Any] | None:
        return await self._answer("continue", ref, request, options)

    async def detach(
        self, ref: AgentSessionRef, request: DetachRequest, options: CallOptions
    ) -> Mapping[str, Any] | None:
        return await self._answer("detach", ref, request, options)

    def register(self, registry: AgentSessionRuntimeRegistry, runtime_id: str = "fake", *, full: bool = True) -> None:
        if full:
            registry.register(
                runtime_id, provider="fake-provider", inspect=self.inspect, continue_=self.continue_, detach=self.detach
            )
        else:
            registry.register(runtime_id, provider="fake-provider", inspect=self.inspect)


def registry_with(runtime: FakeRuntime, runtime_id: str = "fake", *, full: bool = True) -> AgentSessionRuntimeRegistry:
    registry = AgentSessionRuntimeRegistry()
    runtime.register(registry, runtime_id, full=full)
    return registry


def marker(runtime: str = "fake", session_id: str = "s-1", **extra: Any) -> str:
    return "<agent-session>" + json.dumps({"runtime": runtime, "sessionId": session_id, **extra}) + "</agent-session>"


def block(**body: Any) -> str:
    return "[[clawconnect:agent-session]]" + json.dumps(body) + "[[/clawconnect:agent-session]]"


def now_s() -> float:
    return time.time() + 1


async def run_to_end(service: ConnectService, caller: Caller | None = None, **arguments: Any) -> dict[str, Any]:
    as_caller = {} if caller is None else {"caller": caller}
    job = await service.call("run_task", arguments, **as_caller)
    for _ in range(20):
        snap = await service.call("check_task", {"jobId": job["jobId"], **WAIT}, **as_caller)
        if snap["isTerminal"]:
            return snap
    raise AssertionError("the task did not end")
