"""When the supervisor sends a run's callbacks: one follower task per run, so that they go out in order.

A run's follower sends ``start`` once the run left ``accepted`` with a worker that ran (see :func:`worker_ran`),
then a ``heartbeat`` every ``heartbeat_s`` while the run is ``running``, then ``end`` once the run is terminal
(never after a cancel). A run whose worker never started (a ``spawn_error``) gets no ``start``, only its ``end``. Because one task does
all three, ``start`` is always resolved before ``end``, and a heartbeat never follows the end. A follower is
started when a credential arrives (launch, credential replacement) and, after a restart, for every run that still
owes a callback, so a restarted supervisor keeps a running run's heartbeats going and delivers a ``start`` that
was never resolved before any ``end``.

A follower stops early when the credential cannot be read (the run's ``credential`` becomes ``missing``; a launch
repeated with a reissued credential starts a new follower) and when the orchestrator answered 401 or 403: its
authority has ended, the run is torn down, and nothing more is sent with that credential.

*How* one callback is delivered (retries, backoff, redirects, the bearer) is :mod:`clawstack.runs.callbacks`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from clawstack.common.clock import Clock
from clawstack.runs.callbacks import CallbackKind, CallbackSender, end_body, run_body
from clawstack.runs.ledger import RunRecord

if TYPE_CHECKING:
    from clawstack.runs.supervisor import Supervisor

log = logging.getLogger(__name__)


NEVER_STARTED: Final = frozenset({"spawn_error", "mismatch"})
"""The failures of a spawn that started no worker."""


def worker_ran(record: RunRecord) -> bool:
    """Whether the run's worker (may have) run, so that a ``start`` is owed before ``end``: the run reached
    ``running``; or a worker was asked to start and the run left ``accepted`` otherwise than by a spawn that
    started nothing (a supervisor that crashed after asking cannot know that the worker did not run)."""
    if record.started_at is not None:
        return True
    return record.spawned and record.state != "accepted" and record.failure not in NEVER_STARTED


def owes_callbacks(record: RunRecord) -> bool:
    """Whether the run still owes the orchestrator a callback."""
    if record.credential != "held" or record.authority_ended:
        return False
    if worker_ran(record) and record.callbacks.get("start") == "skipped":
        return True
    if not record.terminal:
        return True
    return not record.cancelled and record.callbacks.get("end") == "skipped"


class CallbackDelivery:
    """The followers of every run that owes callbacks; see the module docstring."""

    def __init__(self, supervisor: Supervisor, sender: CallbackSender, *, heartbeat_s: float, clock: Clock) -> None:
        self.sup = supervisor
        self.sender = sender
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self._followers: dict[tuple[str, str], asyncio.Task[None]] = {}

    def follow(self, key: tuple[str, str]) -> None:
        """Make sure the run has a follower if it owes a callback. Idempotent."""
        current = self._followers.get(key)
        if current is not None and not current.done():
            return
        if not owes_callbacks(self.sup.record(key)):
            return
        task = asyncio.create_task(self._follow(key), name=f"callbacks {key[0]}/{key[1]}")
        self._followers[key] = task
        task.add_done_callback(lambda done: self._done(key, done))

    def _done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._followers.get(key) is task:
            del self._followers[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("run %s/%s: callback delivery failed", *key, exc_info=task.exception())

    async def close(self) -> None:
        """Stop every follower (the next start resumes them from the ledger) and close the sender."""
        tasks = list(self._followers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.sender.close()

    async def _follow(self, key: tuple[str, str]) -> None:
        record = self.sup.record(key)
        while record.state == "accepted":  # until the spawn is resolved, one way or the other
            await self.sup.wait_for_change(key)
            record = self.sup.record(key)
        if worker_ran(record) and record.callbacks.get("start") == "skipped" and not await self._deliver(key, "start"):
            return
        next_beat = self.clock.monotonic() + self.heartbeat_s
        record = self.sup.record(key)
        while not record.terminal:
            if record.authority_ended:
                return
            if record.state != "running":
                await self.sup.wait_for_change(key)
            elif self.clock.monotonic() >= next_beat:
                if not await self._deliver(key, "heartbeat"):
                    return
                next_beat = self.clock.monotonic() + self.heartbeat_s
            else:
                await self._pause(key, next_beat - self.clock.monotonic())
            record = self.sup.record(key)
        if not record.cancelled and not record.authority_ended and record.callbacks.get("end") == "skipped":
            await self._deliver(key, "end")

    async def _pause(self, key: tuple[str, str], delay_s: float) -> None:
        """Until ``delay_s`` passed on the clock or the run's record changed, whichever comes first."""
        changed = asyncio.ensure_future(self.sup.change_event(key).wait())
        timer = asyncio.ensure_future(self.clock.sleep(delay_s))
        try:
            await asyncio.wait({changed, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            timer.cancel()

    async def _deliver(self, key: tuple[str, str], kind: CallbackKind) -> bool:
        """Send one callback and record its fate; ``False`` when the follower must stop."""
        record = self.sup.record(key)
        credential = self.sup.files.read_credential(record)
        if credential is None:
            self.sup.save(record, credential="missing")
            return False
        body = (
            self._end_body(record)
            if kind == "end"
            else run_body(installation=record.installation, run_id=record.run_id, generation=record.generation)
        )
        result = await self.sender.send(kind, credential, body)
        record = self.sup.record(key)
        if kind != "heartbeat":
            self.sup.save(record, callbacks={**record.callbacks, kind: result.state})
        if result.authority_ended:
            self.sup.end_authority(key)
            return False
        return True

    def _end_body(self, record: RunRecord) -> dict[str, object]:
        summary = b""
        if record.result_bytes is not None:
            summary = self.sup.files.read_result(record)
        return end_body(
            installation=record.installation,
            run_id=record.run_id,
            generation=record.generation,
            outcome="failed" if record.failure else "succeeded",
            reason=record.failure or "",
            summary=summary.decode("utf-8", "replace"),
            stored_result_truncated=record.result_truncated,
            # A task-home run with a result says what it is and which session holds it.
            result_outcome=record.result_outcome if record.result_bytes is not None else None,
            session=record.result_session if record.result_bytes is not None else None,
            served_by=record.served_by,
            served_by_complete=record.served_by_complete if record.served_by is not None else None,
            last_plan_failure=record.last_plan_failure if record.served_by is not None else None,
        )


__all__ = ["CallbackDelivery", "owes_callbacks", "worker_ran"]
