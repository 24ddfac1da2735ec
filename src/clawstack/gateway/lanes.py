"""The gateway's work scheduler: global lanes with bounded concurrency and one active run per session.

Every piece of agent work the gateway does (a chat turn, a subagent run, a hook-dispatched turn, a cron job)
goes through :meth:`Lanes.run`, for two reasons:

* **Per-session serialisation.** Two runs of the same session would interleave their transcripts, so a session
  has at most one active run across *all* lanes. A second work for a busy session waits, in arrival order,
  until the first has finished, cleanup included.
* **Global budgets.** Each global lane (``main``, ``subagent``, ``hook-dispatch``, ``cron``) has a configured
  concurrency limit, so background work (plugins' ``subagent.complete``, cron) cannot starve interactive chat
  or overload the model provider. Slots are granted first come, first served.

A work first takes its session (if it has one), then a slot of its lane; it holds both until its ``cleanup``
has finished. Because a work only ever waits for a slot while holding its session, and slots are never
waited for by a work that holds another slot, there is no cycle and no deadlock, with one exception: a work
that itself calls :meth:`Lanes.run` for its *own* session waits forever, as it would with any
one-run-per-session rule.

Cancellation (the caller's task is cancelled, for example by ``chat.abort`` or an ``asyncio.timeout``):

* Work still queued leaves its queue at once, never runs, and gives back only what it already held (the
  session, if it was waiting for a slot).
* Work already running is cancelled, keeps its slot and its session until its ``cleanup`` coroutine has
  finished, and then the cancellation propagates to the caller. Whatever the work returns after the caller was
  cancelled is discarded: there is no output after cancellation.

**Reserved slot.** A lane named in ``reserve_one`` keeps one of its slots for work submitted with
``reserved=True`` (the gateway uses this on the ``cron`` lane for HTTP-hook work, which shares the cron budget
when HTTP hooks are enabled). Ordinary work on that lane may use at most ``limit - 1`` slots; reserved work may
use any slot, so it waits only when every slot is busy. Within each kind, slots are granted in arrival order;
a reserved work may overtake an ordinary one that is waiting for a shared slot.

Errors: misuse (an unknown lane, a limit below 1, ``reserved=True`` on a lane without a reservation) raises
:class:`LaneError` (``lane_invalid``), a :class:`~clawstack.gateway.errors.GatewayError`. Exceptions raised by
the work itself propagate unchanged.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar, get_args

from clawstack.gateway.errors import GatewayError

__all__ = ["DEFAULT_LANE_LIMIT", "LANE_NAMES", "LaneError", "LaneName", "Lanes"]

T = TypeVar("T")

LaneName = Literal["main", "subagent", "hook-dispatch", "cron"]

#: The global lanes, in a stable order.
LANE_NAMES: Final[tuple[LaneName, ...]] = get_args(LaneName)

#: The limit of a lane that ``limits`` leaves out.
DEFAULT_LANE_LIMIT: Final = 1


class LaneError(GatewayError):
    """The lanes were configured or called wrongly (unknown lane, bad limit, misplaced ``reserved``)."""

    code = "lane_invalid"


@dataclass(eq=False, slots=True)
class _Waiter:
    """One work waiting for a session or a slot; granted when ``future`` has a result."""

    lane: LaneName
    reserved: bool
    future: asyncio.Future[None]

    @property
    def waiting(self) -> bool:
        return not self.future.done()


@dataclass(slots=True)
class _Lane:
    limit: int
    reserve_one: bool
    running: int = 0
    running_ordinary: int = 0
    queue: deque[_Waiter] = field(default_factory=deque)

    def fits(self, reserved: bool) -> bool:
        if reserved:
            return self.running < self.limit
        return self.running < self.limit and self.running_ordinary < self.limit - int(self.reserve_one)


@dataclass(slots=True)
class _Phase:
    """Whether a started work is still in its body (cancellable) rather than in its cleanup (left to finish)."""

    in_work: bool = True


@dataclass(slots=True)
class _Session:
    queue: deque[_Waiter] = field(default_factory=deque)


class Lanes:
    """Schedules gateway work on global lanes, one active run per session (see the module docstring).

    ``limits`` maps a lane to its concurrency (at least 1); a lane left out gets :data:`DEFAULT_LANE_LIMIT`.
    ``reserve_one`` names lanes that keep one slot for ``reserved=True`` work; such a lane needs a limit of at
    least 2, so that ordinary work can still run.
    """

    def __init__(self, limits: Mapping[LaneName, int], *, reserve_one: Collection[LaneName] = frozenset()) -> None:
        for name in limits:
            _check_lane(name)
        for name in reserve_one:
            _check_lane(name)
        self._lanes: dict[LaneName, _Lane] = {}
        for name in LANE_NAMES:
            limit = limits.get(name, DEFAULT_LANE_LIMIT)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise LaneError(f"lane {name}: the limit must be an integer of at least 1")
            if name in reserve_one and limit < 2:
                raise LaneError(f"lane {name}: a lane with a reserved slot needs a limit of at least 2")
            self._lanes[name] = _Lane(limit=limit, reserve_one=name in reserve_one)
        # A session is present here while some work holds it; its queue holds the works waiting for it.
        self._sessions: dict[str, _Session] = {}
        # Strong references to running works, so a work outliving its caller is not garbage-collected.
        self._tasks: set[asyncio.Task[object]] = set()

    async def run(
        self,
        lane: LaneName,
        session_key: str | None,
        work: Callable[[], Awaitable[T]],
        *,
        cleanup: Callable[[], Awaitable[None]] | None = None,
        reserved: bool = False,
    ) -> T:
        """Run ``work`` on ``lane`` once its session and a slot are free, and return its result.

        ``session_key`` ``None`` means the work has no session (``subagent.complete``) and only needs a slot.
        ``cleanup``, if given, runs after ``work`` however it ended (result, exception or cancellation) while the
        slot and the session are still held; an exception from ``cleanup`` propagates (chained to the work's own
        exception, if any) unless the caller was cancelled, in which case the caller sees the cancellation.
        ``reserved=True`` may use the lane's reserved slot and is refused on a lane without one.
        """
        state = self._lanes[_check_lane(lane)]
        if reserved and not state.reserve_one:
            raise LaneError(f"lane {lane}: reserved work needs a lane configured with a reserved slot")
        if session_key is not None:
            await self._wait_for_session(session_key, lane)
        has_slot = False
        try:
            await self._wait_for_slot(state, lane, reserved)
            has_slot = True
        finally:
            if not has_slot and session_key is not None:
                # Cancelled while queued for a slot: give back the session, which is all this work held.
                self._release_session(session_key)
        phase = _Phase()
        task = asyncio.get_running_loop().create_task(self._execute(phase, work, cleanup))
        self._tasks.add(task)
        # Release in a done callback, not in ``_execute``: a task cancelled before its first step never runs
        # its body. Callbacks run in registration order, so this one runs before the caller is woken below.
        task.add_done_callback(lambda done: self._finished(done, state, session_key, reserved))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller was cancelled: cancel the work (never its cleanup) and wait until the cleanup has
            # finished and the slot is free. A second cancellation ends this wait early, but the task still
            # holds the slot and the session until its cleanup is done. Any result of the work is discarded.
            if not task.done():
                if phase.in_work:
                    task.cancel()
                await asyncio.wait((task,))
            raise

    def stats(self) -> dict[LaneName, dict[str, int]]:
        """Per lane: ``running`` (slots held), ``queued`` (works waiting for their session or a slot), ``limit``."""
        queued = {name: sum(1 for w in state.queue if w.waiting) for name, state in self._lanes.items()}
        for session in self._sessions.values():
            for waiter in session.queue:
                if waiter.waiting:
                    queued[waiter.lane] += 1
        return {
            name: {"running": state.running, "queued": queued[name], "limit": state.limit}
            for name, state in self._lanes.items()
        }

    @staticmethod
    async def _execute(
        phase: _Phase, work: Callable[[], Awaitable[T]], cleanup: Callable[[], Awaitable[None]] | None
    ) -> T:
        try:
            return await work()
        finally:
            phase.in_work = False
            if cleanup is not None:
                await cleanup()

    def _finished(self, task: asyncio.Task[object], state: _Lane, session_key: str | None, reserved: bool) -> None:
        self._tasks.discard(task)
        self._release_slot(state, reserved)
        if session_key is not None:
            self._release_session(session_key)
        if not task.cancelled():
            task.exception()  # mark retrieved: the caller may have left after a second cancellation

    async def _wait_for_session(self, session_key: str, lane: LaneName) -> None:
        session = self._sessions.get(session_key)
        if session is None:
            self._sessions[session_key] = _Session()
            return
        waiter = _Waiter(lane, False, asyncio.get_running_loop().create_future())
        session.queue.append(waiter)
        granted = False
        try:
            await waiter.future
            granted = True
        finally:
            if not granted:
                if waiter.future.done() and not waiter.future.cancelled():
                    # The session was handed over just as the cancellation landed: pass it on.
                    self._release_session(session_key)
                elif waiter in session.queue:
                    session.queue.remove(waiter)

    def _release_session(self, session_key: str) -> None:
        session = self._sessions[session_key]
        while session.queue:
            waiter = session.queue.popleft()
            if waiter.waiting:
                waiter.future.set_result(None)  # the session passes straight to the next work
                return
        del self._sessions[session_key]

    async def _wait_for_slot(self, state: _Lane, lane: LaneName, reserved: bool) -> None:
        waiter = _Waiter(lane, reserved, asyncio.get_running_loop().create_future())
        state.queue.append(waiter)
        self._grant_slots(state)
        granted = False
        try:
            await waiter.future
            granted = True
        finally:
            if not granted:
                if waiter.future.done() and not waiter.future.cancelled():
                    # Granted just as the cancellation landed: the slot was never used, give it back.
                    self._release_slot(state, reserved)
                elif waiter in state.queue:
                    state.queue.remove(waiter)

    def _release_slot(self, state: _Lane, reserved: bool) -> None:
        state.running -= 1
        if not reserved:
            state.running_ordinary -= 1
        self._grant_slots(state)

    def _grant_slots(self, state: _Lane) -> None:
        """Grant free slots to the earliest waiters that fit, dropping waiters whose caller has gone."""
        while state.running < state.limit:
            chosen: _Waiter | None = None
            for waiter in state.queue:
                if waiter.waiting and state.fits(waiter.reserved):
                    chosen = waiter
                    break
            if chosen is None:
                break
            state.queue.remove(chosen)
            state.running += 1
            if not chosen.reserved:
                state.running_ordinary += 1
            chosen.future.set_result(None)
        while state.queue and not state.queue[0].waiting:
            state.queue.popleft()


def _check_lane(name: str) -> LaneName:
    if name not in LANE_NAMES:
        raise LaneError(f"unknown lane {name!r}; lanes are {', '.join(LANE_NAMES)}")
    return name
