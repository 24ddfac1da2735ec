"""Tests for clawstack.gateway.lanes: limits, FIFO, per-session exclusivity, cancellation and the reserved slot."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.gateway.errors import GatewayError
from clawstack.gateway.lanes import LANE_NAMES, LaneError, LaneName, Lanes


async def wait_until(predicate: Callable[[], bool], *, steps: int = 200) -> None:
    """Yield to the loop until ``predicate`` holds; fail after ``steps`` iterations (no wall-clock sleep)."""
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def settle(steps: int = 20) -> None:
    """Let every ready task run for a while, so that anything that could start has started."""
    for _ in range(steps):
        await asyncio.sleep(0)


class Gate:
    """A work that logs its start, waits until released, logs its end and returns its name."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> str:
        self.log.append(f"start {self.name}")
        self.started.set()
        await self.release.wait()
        self.log.append(f"end {self.name}")
        return self.name


class Cleanup:
    """A cleanup that logs, waits until released (released by default) and logs its end."""

    def __init__(self, name: str, log: list[str], *, held: bool = False) -> None:
        self.name = name
        self.log = log
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        if not held:
            self.release.set()

    async def __call__(self) -> None:
        self.log.append(f"cleanup {self.name}")
        self.started.set()
        await self.release.wait()
        self.log.append(f"cleaned {self.name}")


def lane_stats(lanes: Lanes, lane: LaneName) -> tuple[int, int]:
    stats = lanes.stats()[lane]
    return stats["running"], stats["queued"]


# --- construction and misuse ---------------------------------------------------------------------------------


def test_stats_cover_every_lane_with_defaults() -> None:
    lanes = Lanes({"main": 4, "subagent": 8})
    assert lanes.stats() == {
        "main": {"running": 0, "queued": 0, "limit": 4},
        "subagent": {"running": 0, "queued": 0, "limit": 8},
        "hook-dispatch": {"running": 0, "queued": 0, "limit": 1},
        "cron": {"running": 0, "queued": 0, "limit": 1},
    }
    assert tuple(lanes.stats()) == LANE_NAMES


@pytest.mark.parametrize(
    ("limits", "reserve_one", "fragment"),
    [
        ({"main": 0}, set(), "lane main: the limit must be an integer of at least 1"),
        ({"main": -3}, set(), "lane main: the limit must be an integer of at least 1"),
        ({"main": True}, set(), "lane main: the limit must be an integer of at least 1"),
        ({"main": 1.5}, set(), "lane main: the limit must be an integer of at least 1"),
        ({"bogus": 2}, set(), "unknown lane 'bogus'"),
        ({"cron": 1}, {"cron"}, "lane cron: a lane with a reserved slot needs a limit of at least 2"),
        ({}, {"cron"}, "lane cron: a lane with a reserved slot needs a limit of at least 2"),
        ({"cron": 2}, {"nope"}, "unknown lane 'nope'"),
    ],
)
def test_bad_configuration_is_refused(limits: dict[str, object], reserve_one: set[str], fragment: str) -> None:
    with pytest.raises(LaneError) as info:
        Lanes(limits, reserve_one=reserve_one)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert info.value.code == "lane_invalid"
    assert isinstance(info.value, GatewayError)


async def test_unknown_lane_is_refused_before_anything_runs() -> None:
    lanes = Lanes({})
    called = False

    async def work() -> None:
        nonlocal called
        called = True

    with pytest.raises(LaneError, match="unknown lane 'fast'"):
        await lanes.run("fast", None, work)  # type: ignore[arg-type]
    assert not called


async def test_reserved_work_needs_a_reserved_lane() -> None:
    lanes = Lanes({"cron": 2})

    async def work() -> None:
        raise AssertionError("must not run")

    with pytest.raises(LaneError, match="reserved slot") as info:
        await lanes.run("cron", None, work, reserved=True)
    assert info.value.code == "lane_invalid"
    assert lanes.stats()["cron"]["running"] == 0


# --- limits and order ----------------------------------------------------------------------------------------


async def test_limit_bounds_concurrency_and_slots_are_granted_fifo() -> None:
    lanes = Lanes({"main": 2})
    log: list[str] = []
    gates = [Gate(str(i), log) for i in range(5)]
    tasks = [asyncio.create_task(lanes.run("main", None, gate)) for gate in gates]
    await settle()
    assert log == ["start 0", "start 1"]
    assert lane_stats(lanes, "main") == (2, 3)

    gates[1].release.set()
    await gates[2].started.wait()
    await settle()
    assert log == ["start 0", "start 1", "end 1", "start 2"]
    assert lane_stats(lanes, "main") == (2, 2)

    for gate in (gates[0], gates[2]):
        gate.release.set()
    await gates[4].started.wait()
    assert log.index("start 3") < log.index("start 4")
    for gate in gates:
        gate.release.set()
    assert await asyncio.gather(*tasks) == ["0", "1", "2", "3", "4"]
    assert lane_stats(lanes, "main") == (0, 0)


async def test_lanes_are_independent() -> None:
    lanes = Lanes({"main": 1, "subagent": 1})
    log: list[str] = []
    main_gate, sub_gate = Gate("main", log), Gate("sub", log)
    tasks = [
        asyncio.create_task(lanes.run("main", None, main_gate)),
        asyncio.create_task(lanes.run("subagent", None, sub_gate)),
    ]
    await main_gate.started.wait()
    await sub_gate.started.wait()
    main_gate.release.set()
    sub_gate.release.set()
    assert await asyncio.gather(*tasks) == ["main", "sub"]


# --- one active run per session ------------------------------------------------------------------------------


async def test_a_session_has_one_active_run_across_lanes_until_cleanup_finished() -> None:
    lanes = Lanes({"main": 4, "cron": 4})
    log: list[str] = []
    first, second = Gate("first", log), Gate("second", log)
    first_cleanup = Cleanup("first", log, held=True)
    t1 = asyncio.create_task(lanes.run("main", "agent:a:main", first, cleanup=first_cleanup))
    await first.started.wait()
    t2 = asyncio.create_task(lanes.run("cron", "agent:a:main", second))
    await settle()
    assert lane_stats(lanes, "cron") == (0, 1)

    first.release.set()
    await first_cleanup.started.wait()
    await settle()
    assert "start second" not in log  # the first run is not over until its cleanup is

    first_cleanup.release.set()
    await second.started.wait()
    second.release.set()
    assert list(await asyncio.gather(t1, t2)) == ["first", "second"]
    assert log == ["start first", "end first", "cleanup first", "cleaned first", "start second", "end second"]


async def test_different_sessions_run_side_by_side() -> None:
    lanes = Lanes({"main": 2})
    log: list[str] = []
    a, b = Gate("a", log), Gate("b", log)
    tasks = [
        asyncio.create_task(lanes.run("main", "agent:a:main", a)),
        asyncio.create_task(lanes.run("main", "agent:b:main", b)),
    ]
    await a.started.wait()
    await b.started.wait()
    a.release.set()
    b.release.set()
    await asyncio.gather(*tasks)


async def test_works_of_one_session_run_in_arrival_order_across_lanes() -> None:
    lanes = Lanes({"main": 3, "subagent": 3, "cron": 3})
    log: list[str] = []
    gates = [Gate(str(i), log) for i in range(4)]
    lane_order: list[LaneName] = ["main", "cron", "subagent", "main"]
    tasks = [asyncio.create_task(lanes.run(lane, "s", gate)) for lane, gate in zip(lane_order, gates, strict=True)]
    for gate in gates:
        await gate.started.wait()
        await settle()
        assert sum(entry.startswith("start") for entry in log) == sum(entry.startswith("end") for entry in log) + 1
        gate.release.set()
    assert await asyncio.gather(*tasks) == ["0", "1", "2", "3"]
    assert [entry for entry in log if entry.startswith("start")] == ["start 0", "start 1", "start 2", "start 3"]


async def test_a_session_waiting_for_a_slot_does_not_block_other_sessions() -> None:
    """A work that holds its session while queued for a slot does not hold up other sessions' slots."""
    lanes = Lanes({"main": 1, "cron": 1})
    log: list[str] = []
    busy, queued, other = Gate("busy", log), Gate("queued", log), Gate("other", log)
    t_busy = asyncio.create_task(lanes.run("main", "x", busy))
    await busy.started.wait()
    t_queued = asyncio.create_task(lanes.run("main", "s", queued))
    t_other = asyncio.create_task(lanes.run("cron", "y", other))
    await other.started.wait()
    other.release.set()
    busy.release.set()
    await queued.started.wait()
    queued.release.set()
    assert list(await asyncio.gather(t_busy, t_queued, t_other)) == ["busy", "queued", "other"]


# --- cancellation --------------------------------------------------------------------------------------------


async def test_cancelled_queued_work_leaves_at_once_and_never_runs() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []
    running, doomed, after = Gate("running", log), Gate("doomed", log), Gate("after", log)
    t_running = asyncio.create_task(lanes.run("main", None, running))
    await running.started.wait()
    t_doomed = asyncio.create_task(lanes.run("main", None, doomed, cleanup=Cleanup("doomed", log)))
    t_after = asyncio.create_task(lanes.run("main", None, after))
    await settle()
    assert lane_stats(lanes, "main") == (1, 2)

    t_doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t_doomed
    assert lane_stats(lanes, "main") == (1, 1)  # left the queue at once, the running work kept its slot

    running.release.set()
    await after.started.wait()
    after.release.set()
    assert list(await asyncio.gather(t_running, t_after)) == ["running", "after"]
    assert not doomed.started.is_set()
    assert "cleanup doomed" not in log
    assert lane_stats(lanes, "main") == (0, 0)


async def test_cancelled_work_waiting_for_its_session_frees_nothing() -> None:
    lanes = Lanes({"main": 4})
    log: list[str] = []
    holder, doomed, next_up = Gate("holder", log), Gate("doomed", log), Gate("next", log)
    t_holder = asyncio.create_task(lanes.run("main", "s", holder))
    await holder.started.wait()
    t_doomed = asyncio.create_task(lanes.run("main", "s", doomed))
    t_next = asyncio.create_task(lanes.run("main", "s", next_up))
    await settle()
    assert lane_stats(lanes, "main") == (1, 2)

    t_doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t_doomed
    await settle()
    assert lane_stats(lanes, "main") == (1, 1)
    assert "start next" not in log  # the session is still the holder's

    holder.release.set()
    await next_up.started.wait()
    next_up.release.set()
    assert list(await asyncio.gather(t_holder, t_next)) == ["holder", "next"]
    assert not doomed.started.is_set()


async def test_cancelled_work_waiting_for_a_slot_gives_its_session_back() -> None:
    lanes = Lanes({"main": 1, "cron": 1})
    log: list[str] = []
    slot_holder, doomed, same_session = Gate("slot", log), Gate("doomed", log), Gate("same", log)
    t_slot = asyncio.create_task(lanes.run("main", "other", slot_holder))
    await slot_holder.started.wait()
    t_doomed = asyncio.create_task(lanes.run("main", "s", doomed))  # takes session s, queues for main
    t_same = asyncio.create_task(lanes.run("cron", "s", same_session))  # waits for session s
    await settle()
    assert not same_session.started.is_set()

    t_doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t_doomed
    await same_session.started.wait()
    assert lane_stats(lanes, "main") == (1, 0)
    same_session.release.set()
    slot_holder.release.set()
    assert list(await asyncio.gather(t_slot, t_same)) == ["slot", "same"]
    assert not doomed.started.is_set()


async def test_cancelled_running_work_keeps_slot_and_session_until_cleanup_then_propagates() -> None:
    lanes = Lanes({"main": 1, "cron": 1})
    log: list[str] = []
    victim = Gate("victim", log)
    victim_cleanup = Cleanup("victim", log, held=True)
    same_lane, same_session = Gate("same-lane", log), Gate("same-session", log)
    t_victim = asyncio.create_task(lanes.run("main", "s", victim, cleanup=victim_cleanup))
    await victim.started.wait()
    t_lane = asyncio.create_task(lanes.run("main", "other", same_lane))
    t_session = asyncio.create_task(lanes.run("cron", "s", same_session))
    await settle()

    t_victim.cancel()
    await victim_cleanup.started.wait()
    await settle()
    assert not t_victim.done()  # the caller is told only after the cleanup
    assert lane_stats(lanes, "main") == (1, 1)
    assert not same_lane.started.is_set()
    assert not same_session.started.is_set()

    victim_cleanup.release.set()
    with pytest.raises(asyncio.CancelledError):
        await t_victim
    await same_lane.started.wait()
    await same_session.started.wait()
    same_lane.release.set()
    same_session.release.set()
    assert list(await asyncio.gather(t_lane, t_session)) == ["same-lane", "same-session"]
    assert log[:3] == ["start victim", "cleanup victim", "cleaned victim"]
    assert "end victim" not in log


async def test_no_output_after_cancellation() -> None:
    lanes = Lanes({"main": 1})
    started = asyncio.Event()
    finished = asyncio.Event()

    async def stubborn() -> str:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):  # a work that ignores the cancellation
            await asyncio.Event().wait()
        finished.set()
        return "late output"

    task = asyncio.create_task(lanes.run("main", None, stubborn))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()
    assert lane_stats(lanes, "main") == (0, 0)


async def test_cancelling_during_cleanup_lets_the_cleanup_finish() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []
    work, after = Gate("work", log), Gate("after", log)
    work_cleanup = Cleanup("work", log, held=True)
    task = asyncio.create_task(lanes.run("main", "s", work, cleanup=work_cleanup))
    t_after = asyncio.create_task(lanes.run("main", "s", after))
    await work.started.wait()
    work.release.set()
    await work_cleanup.started.wait()
    task.cancel()  # the work is over: its cleanup is not interrupted
    await settle()
    assert not task.done()
    assert lane_stats(lanes, "main") == (1, 1)
    work_cleanup.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task  # the result of the finished work is discarded all the same
    await after.started.wait()
    after.release.set()
    assert await t_after == "after"
    assert log == ["start work", "end work", "cleanup work", "cleaned work", "start after", "end after"]


async def test_a_second_cancellation_does_not_cut_the_cleanup_short() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []
    victim, after = Gate("victim", log), Gate("after", log)
    victim_cleanup = Cleanup("victim", log, held=True)
    t_victim = asyncio.create_task(lanes.run("main", None, victim, cleanup=victim_cleanup))
    await victim.started.wait()
    t_after = asyncio.create_task(lanes.run("main", None, after))
    t_victim.cancel()
    await victim_cleanup.started.wait()
    t_victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t_victim
    await settle()
    assert lane_stats(lanes, "main") == (1, 1)  # the cleanup still holds the slot
    assert not after.started.is_set()

    victim_cleanup.release.set()
    await after.started.wait()
    after.release.set()
    assert await t_after == "after"
    assert log == ["start victim", "cleanup victim", "cleaned victim", "start after", "end after"]


async def test_cancelled_just_after_being_granted_a_slot_gives_it_back() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []
    loop = asyncio.get_running_loop()
    doomed, after = Gate("doomed", log), Gate("after", log)
    doomed_task: asyncio.Task[str] | None = None

    async def first() -> str:
        victim_task = doomed_task
        assert victim_task is not None
        # Cancel the next work after it has been granted the slot but before it resumes.
        loop.call_soon(lambda: loop.call_soon(victim_task.cancel))
        return "first"

    release_first = asyncio.Event()

    async def gated_first() -> str:
        await release_first.wait()
        return await first()

    t_first = asyncio.create_task(lanes.run("main", None, gated_first))
    await settle()
    doomed_task = asyncio.create_task(lanes.run("main", None, doomed))
    t_after = asyncio.create_task(lanes.run("main", None, after))
    await settle()
    release_first.set()
    assert await t_first == "first"
    with pytest.raises(asyncio.CancelledError):
        await doomed_task
    await after.started.wait()
    after.release.set()
    assert await t_after == "after"
    assert not doomed.started.is_set()
    assert lane_stats(lanes, "main") == (0, 0)


async def test_cancelled_just_after_being_handed_the_session_passes_it_on() -> None:
    lanes = Lanes({"main": 3})
    log: list[str] = []
    loop = asyncio.get_running_loop()
    doomed, after = Gate("doomed", log), Gate("after", log)
    doomed_task: asyncio.Task[str] | None = None
    release_first = asyncio.Event()

    async def first() -> str:
        await release_first.wait()
        victim_task = doomed_task
        assert victim_task is not None
        # Cancel the next work after it has been handed the session but before it resumes.
        loop.call_soon(lambda: loop.call_soon(victim_task.cancel))
        return "first"

    t_first = asyncio.create_task(lanes.run("main", "s", first))
    await settle()
    doomed_task = asyncio.create_task(lanes.run("main", "s", doomed))
    t_after = asyncio.create_task(lanes.run("main", "s", after))
    await settle()
    release_first.set()
    assert await t_first == "first"
    with pytest.raises(asyncio.CancelledError):
        await doomed_task
    await after.started.wait()
    after.release.set()
    assert await t_after == "after"
    assert not doomed.started.is_set()
    assert lane_stats(lanes, "main") == (0, 0)


async def test_cancelled_right_after_admission_still_cleans_up() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []
    work = Gate("work", log)
    task = asyncio.create_task(lanes.run("main", "s", work, cleanup=Cleanup("work", log)))
    await asyncio.sleep(0)  # the caller got its slot and created the work's task, which has not run yet
    assert lane_stats(lanes, "main") == (1, 0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["start work", "cleanup work", "cleaned work"]
    assert lane_stats(lanes, "main") == (0, 0)
    assert await lanes.run("main", "s", _value("again")) == "again"


async def test_a_timeout_scope_cancels_running_work_after_its_cleanup() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []
    work = Gate("work", log)
    scopes: list[asyncio.Timeout] = []

    async def call() -> str:
        async with asyncio.timeout(None) as scope:
            scopes.append(scope)
            return await lanes.run("main", "s", work, cleanup=Cleanup("work", log))

    task = asyncio.create_task(call())
    await work.started.wait()
    scopes[0].reschedule(asyncio.get_running_loop().time())  # the deadline passes now, no wall-clock wait
    with pytest.raises(TimeoutError):
        await task
    assert log == ["start work", "cleanup work", "cleaned work"]
    assert lane_stats(lanes, "main") == (0, 0)


# --- failures and cleanup ------------------------------------------------------------------------------------


async def test_a_failing_work_releases_its_slot_and_session_and_reraises() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []

    async def boom() -> str:
        raise ValueError("work failed")

    with pytest.raises(ValueError, match="work failed"):
        await lanes.run("main", "s", boom, cleanup=Cleanup("boom", log))
    assert log == ["cleanup boom", "cleaned boom"]
    assert lane_stats(lanes, "main") == (0, 0)
    assert await lanes.run("main", "s", _value(7)) == 7


async def test_cleanup_runs_before_the_result_is_returned() -> None:
    lanes = Lanes({"main": 1})
    log: list[str] = []

    async def work() -> str:
        log.append("work")
        return "done"

    assert await lanes.run("main", "s", work, cleanup=Cleanup("c", log)) == "done"
    assert log == ["work", "cleanup c", "cleaned c"]


async def test_a_failing_cleanup_propagates_and_still_releases() -> None:
    lanes = Lanes({"main": 1})

    async def cleanup() -> None:
        raise RuntimeError("cleanup failed")

    with pytest.raises(RuntimeError, match="cleanup failed"):
        await lanes.run("main", "s", _value(1), cleanup=cleanup)
    assert lane_stats(lanes, "main") == (0, 0)
    assert await lanes.run("main", "s", _value(2)) == 2


# --- the reserved slot ---------------------------------------------------------------------------------------


async def test_ordinary_work_leaves_the_reserved_slot_free() -> None:
    lanes = Lanes({"cron": 3}, reserve_one={"cron"})
    log: list[str] = []
    jobs = [Gate(f"job{i}", log) for i in range(3)]
    hook = Gate("hook", log)
    job_tasks = [asyncio.create_task(lanes.run("cron", None, job)) for job in jobs]
    await settle()
    assert log == ["start job0", "start job1"]  # at most limit - 1 ordinary works
    assert lane_stats(lanes, "cron") == (2, 1)

    hook_task = asyncio.create_task(lanes.run("cron", None, hook, reserved=True))
    await hook.started.wait()  # overtakes the queued ordinary job through the reserved slot
    assert lane_stats(lanes, "cron") == (3, 1)

    hook.release.set()
    assert await hook_task == "hook"
    await settle()
    assert not jobs[2].started.is_set()  # the freed slot is the reserved one again

    jobs[0].release.set()
    await jobs[2].started.wait()
    for job in jobs:
        job.release.set()
    assert await asyncio.gather(*job_tasks) == ["job0", "job1", "job2"]


async def test_reserved_work_may_use_every_slot() -> None:
    lanes = Lanes({"cron": 2}, reserve_one={"cron"})
    log: list[str] = []
    hooks = [Gate(f"hook{i}", log) for i in range(3)]
    job = Gate("job", log)
    tasks = [asyncio.create_task(lanes.run("cron", None, hook, reserved=True)) for hook in hooks]
    job_task = asyncio.create_task(lanes.run("cron", None, job))
    await hooks[0].started.wait()
    await hooks[1].started.wait()
    await settle()
    assert lane_stats(lanes, "cron") == (2, 2)
    assert not hooks[2].started.is_set()

    hooks[0].release.set()
    await hooks[2].started.wait()  # reserved works keep arrival order among themselves
    assert not job.started.is_set()
    hooks[1].release.set()
    await job.started.wait()
    for gate in [*hooks, job]:
        gate.release.set()
    assert await asyncio.gather(*tasks, job_task) == ["hook0", "hook1", "hook2", "job"]


# --- randomized stress ---------------------------------------------------------------------------------------


def _value(value: object) -> Callable[[], Awaitable[object]]:
    async def work() -> object:
        return value

    return work


LIMITS: dict[LaneName, int] = {"main": 2, "subagent": 3, "hook-dispatch": 1, "cron": 2}


async def _stress(seed: int, n_works: int) -> None:
    rng = random.Random(seed)
    lanes = Lanes(LIMITS, reserve_one={"cron"})
    running: dict[LaneName, int] = dict.fromkeys(LANE_NAMES, 0)
    ordinary_cron = 0
    active_sessions: set[str] = set()
    started: set[int] = set()
    violations: list[str] = []

    def make(
        index: int, lane: LaneName, session: str | None, reserved: bool, fail: bool, hold: int
    ) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
        async def work() -> int:
            nonlocal ordinary_cron
            started.add(index)
            running[lane] += 1
            if running[lane] > LIMITS[lane]:
                violations.append(f"{lane} over its limit")
            if lane == "cron" and not reserved:
                ordinary_cron += 1
                if ordinary_cron > LIMITS["cron"] - 1:
                    violations.append("ordinary cron work used the reserved slot")
            if session is not None:
                if session in active_sessions:
                    violations.append(f"two runs of {session}")
                active_sessions.add(session)
            for _ in range(hold):
                await asyncio.sleep(0)
            if fail:
                raise ValueError(index)
            return index

        async def cleanup() -> None:
            nonlocal ordinary_cron
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            running[lane] -= 1
            if lane == "cron" and not reserved:
                ordinary_cron -= 1
            if session is not None:
                active_sessions.discard(session)

        return work, cleanup

    tasks: list[asyncio.Task[int]] = []
    for index in range(n_works):
        lane = rng.choice(LANE_NAMES)
        session = rng.choice([None, "a", "b", "c", "d"])
        reserved = lane == "cron" and rng.random() < 0.4
        work, cleanup = make(index, lane, session, reserved, rng.random() < 0.15, rng.randrange(6))
        tasks.append(asyncio.create_task(lanes.run(lane, session, work, cleanup=cleanup, reserved=reserved)))
        if rng.random() < 0.3:
            await asyncio.sleep(0)
    doomed = rng.sample(range(n_works), k=n_works // 4)
    for index in doomed:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        tasks[index].cancel()
        if rng.random() < 0.2:
            await asyncio.sleep(0)
            tasks[index].cancel()  # a second cancellation may leave before the cleanup ends, not the slot
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await wait_until(lambda: all(stats["running"] == 0 for stats in lanes.stats().values()))

    assert violations == []
    for index, result in enumerate(results):
        if isinstance(result, asyncio.CancelledError):
            continue  # cancelled while queued (never started) or while running (cleanup ran)
        assert index in started
        assert result == index or (isinstance(result, ValueError) and result.args == (index,))
    assert all(stats["running"] == 0 and stats["queued"] == 0 for stats in lanes.stats().values())
    assert running == dict.fromkeys(LANE_NAMES, 0)
    assert active_sessions == set()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), n_works=st.integers(min_value=1, max_value=80))
def test_limits_and_session_exclusivity_hold_under_random_load(seed: int, n_works: int) -> None:
    asyncio.run(_stress(seed, n_works))
