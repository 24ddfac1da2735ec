"""The supervisor's core: admission against the ledger, status and long-polls, cancellation, credentials, results,
and one :class:`~clawstack.runs.lifecycle.RunDriver` per unfinished run. Transports live in
:mod:`clawstack.runs.server`; this module maps requests to results.

Start-up order (the spec's): take the pod lock for the process's life, run the proxy's revocation self-test, refuse
to serve while workers of this pod exist that the ledger does not know, reconcile every unfinished run (its driver
resumes wherever the ledger says it was, and its callbacks resume too), then accept connections.

Every answer is built from a record that is already on disk. A state only moves forward (:meth:`Supervisor.save`
ignores a change to an earlier state), so a cancel answered as ``revoking`` is never undone by a driver step that
was in flight when it came.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from clawstack import __version__
from clawstack.common.clock import Clock, SystemClock, format_timestamp
from clawstack.pod.artifacts import PodPaths, list_templates, load_template, read_pod_manifest
from clawstack.pod.errors import PodError
from clawstack.pod.lock import PodLock
from clawstack.proxy.errors import ProxyError
from clawstack.runs.admission import (
    Launch,
    check_authority,
    check_grant,
    check_key,
    check_supported,
    parse_body,
    parse_generation,
    parse_launch,
    parse_time,
)
from clawstack.runs.backends.base import Backend, RunLabels
from clawstack.runs.callbacks import CallbackSender, CallbackTarget
from clawstack.runs.delivery import CallbackDelivery, owes_callbacks
from clawstack.runs.errors import RunsError
from clawstack.runs.files import RunFiles
from clawstack.runs.homes import HOME_OWNER_UID, Homes
from clawstack.runs.ledger import ORDER, Ledger, RunRecord
from clawstack.runs.lifecycle import METER_SILENCE_S, RunDriver
from clawstack.runs.listing import parse_query, split_page
from clawstack.runs.proxylink import IDENTITY_GRACE, ProxyLink, identity_expiry
from clawstack.runs.status import run_status, tombstone_status
from clawstack.runs.subnets import BASE_ENV as SUBNET_BASE_ENV
from clawstack.runs.subnets import allocate, parse_base

log = logging.getLogger(__name__)

PROTOCOL: Final = 1
MAX_WAIT_S: Final = 60.0
WAIT_STATES: Final = ("running", "revoked", "stopped", "failed")


class StartupError(RunsError):
    """The supervisor refuses to serve (self-test failed, orphaned workers, unsafe socket directory)."""


def check_task_homes_runnable(backend: str, euid: int, templates: Sequence[Mapping[str, Any]]) -> None:
    """Refuse to serve compose task homes without root: each run's network guard and the hand-over of its home and
    its meter's output directory to uid 65534 need root, and without them no task-home run could work."""
    homes = sorted(str(t.get("name")) for t in templates if t.get("profile") == "task_home")
    if backend == "compose" and euid != 0 and homes:
        raise StartupError(
            "internal_error",
            f"the pod's task-home templates ({', '.join(homes[:5])}) need a supervisor running as root under the "
            "compose backend (each run's network guard, and its home and meter handed to uid 65534); start "
            "claw runs serve as root, or remove the task-home templates",
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """A core result: HTTP status, JSON body (or raw bytes), extra headers."""

    status: int
    body: Any
    headers: Mapping[str, str] | None = None


class Supervisor:
    """Everything ``claw runs serve`` does, independent of the socket it is served on."""

    def __init__(
        self,
        pod_dir: Path,
        backend: Backend,
        *,
        clock: Clock | None = None,
        callback_origin: str | None = None,
        callback_path: str = "/runs/{installation}/{run_id}",
        heartbeat_s: float = 60.0,
        proxy: ProxyLink | None = None,
        identity_grace: timedelta = IDENTITY_GRACE,
        meter_silence_s: float = METER_SILENCE_S,
    ) -> None:
        self.paths = PodPaths(pod_dir.resolve())
        self.backend = backend
        self.clock: Clock = clock or SystemClock()
        self.callback_origin = callback_origin
        self.proxy = proxy or ProxyLink(self.paths)
        self.identity_grace = identity_grace
        self.meter_silence_s = meter_silence_s  # a task-home run's meter silent this long ends the run
        self.ledger = Ledger(self.paths.runs)
        self.files = RunFiles(self.paths)
        self.homes = Homes(self.paths.homes, owner_uid=HOME_OWNER_UID if os.geteuid() == 0 else None)
        self.lock = PodLock(self.paths.lock, holder="claw runs serve")
        self.pod_name = ""  # the pod's declared name (x-claw.pod), read from the compiled pod at start
        self._drivers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._driver_objects: dict[tuple[str, str], RunDriver] = {}
        self._changed: dict[tuple[str, str], asyncio.Event] = {}
        self._identity_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.admission_lock = asyncio.Lock()
        self._verified: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.delivery = (
            CallbackDelivery(
                self,
                CallbackSender(CallbackTarget(callback_origin, callback_path), clock=self.clock),
                heartbeat_s=heartbeat_s,
                clock=self.clock,
            )
            if callback_origin is not None
            else None
        )

    @property
    def worker_socket(self) -> Path:
        return self.paths.worker_socket

    # ---------------------------------------------------------------------------------------------- lifecycle

    async def start(self, *, remove_orphans: bool = False) -> None:
        # Inheritable: a lifecycle subprocess in flight (a spawn) keeps writer authority if this process is killed.
        self.lock.acquire(inheritable=True)
        try:
            try:
                self.pod_name = read_pod_manifest(self.paths)["pod"]
            except PodError as exc:
                raise StartupError("internal_error", exc.message) from exc
            check_task_homes_runnable(self.backend.name, os.geteuid(), list_templates(self.paths)["templates"])
            self.ledger.open()
            try:
                await self.proxy.self_test()
            except Exception as exc:  # any failure refuses to serve; the message says which
                raise StartupError("internal_error", f"the proxy's revocation self-test failed: {exc}") from exc
            orphans = await self.orphans()
            if orphans and not remove_orphans:
                names = ", ".join(f"{o.installation}/{o.run_id}" for o in orphans[:5])
                raise StartupError(
                    "internal_error",
                    f"workers exist that the ledger does not know: {names}; "
                    "see claw runs doctor, or start with --remove-orphans",
                )
            for orphan in orphans:
                await self.backend.remove(orphan, writer_lock_fd=self.lock.fd)
            unfinished = self.ledger.unfinished()
            for record in unfinished:
                self.drive(record.key)
            if self.delivery is not None:
                for record in [*unfinished, *self.ledger.ended_with_credential_held()]:
                    if owes_callbacks(record):
                        self.delivery.follow(record.key)
        except BaseException:
            # Best-effort release of what start-up took, then the original error.
            self.backend.close()
            self.ledger.close()
            self.lock.release()
            raise

    async def orphans(self) -> list[RunLabels]:
        workers = await self.backend.list_workers()
        return [w for w in workers if self.ledger.get(w.installation, w.run_id) is None]

    async def stop(self) -> None:
        """Stop every driver and callback follower (both resume from the ledger at the next start) and release
        the lock. Idempotent."""
        tasks = list(self._drivers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._drivers.clear()
        if self.delivery is not None:
            await self.delivery.close()
        self.backend.close()
        self.ledger.close()
        self.lock.release()

    def drive(self, key: tuple[str, str]) -> None:
        """Make sure the run has a driver, and wake it if it waits."""
        if key in self._drivers and not self._drivers[key].done():
            self._driver_objects[key].wake.set()
            return
        driver = RunDriver(self, key)
        self._driver_objects[key] = driver
        task = asyncio.create_task(driver.run(), name=f"run {key[0]}/{key[1]}")
        self._drivers[key] = task
        task.add_done_callback(lambda t: self._driver_done(key, t))

    def _driver_done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._drivers.get(key) is task:  # forget a finished run's driver (a new one is made if ever needed)
            del self._drivers[key]
            self._driver_objects.pop(key, None)
            lock = self._identity_locks.get(key)
            if lock is not None and not lock.locked():
                del self._identity_locks[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("run %s/%s: driver failed", *key, exc_info=task.exception())

    # ------------------------------------------------------------------------------------------------ records

    def record(self, key: tuple[str, str]) -> RunRecord:
        record = self.ledger.get(*key)
        if record is None:
            raise RunsError("not_found", "the run was never accepted")
        return record

    def save(self, record: RunRecord, **changes: Any) -> None:
        """Apply ``changes`` to the run's latest record and persist it; ``record`` is brought up to date too.

        Reading the latest record here (one synchronous step on the event loop) means a driver holding an older
        copy can never undo a concurrent change such as a cancel, and a ``state`` earlier than the recorded one
        (or any change of a terminal state) is ignored: states only move forward."""
        latest = self.ledger.get(*record.key) or record
        state = changes.get("state")
        if state is not None and (latest.terminal or ORDER[state] < ORDER[latest.state]):
            del changes["state"]
        for name, value in changes.items():
            setattr(latest, name, value)
        self.ledger.update(latest)
        for name in RunRecord.__dataclass_fields__:
            setattr(record, name, getattr(latest, name))
        event = self._changed.pop(record.key, None)
        if event is not None:
            event.set()

    def change_event(self, key: tuple[str, str]) -> asyncio.Event:
        """An event set at the run's next saved change (take it before looking at the record, then wait)."""
        return self._changed.setdefault(key, asyncio.Event())

    async def wait_for_change(self, key: tuple[str, str]) -> None:
        await self.change_event(key).wait()

    def identity_lock(self, key: tuple[str, str]) -> asyncio.Lock:
        """Held while the run's identity is created or its expiry moved, so the two never cross."""
        return self._identity_locks.setdefault(key, asyncio.Lock())

    def identity_expiry(self, authority_expires_at: datetime) -> datetime:
        """When the proxy itself ends a run's identity (see :func:`~clawstack.runs.proxylink.identity_expiry`)."""
        return identity_expiry(authority_expires_at, self.clock.now(), self.identity_grace)

    def template_for(self, record: RunRecord) -> dict[str, Any]:
        """The template the run was admitted with (kept by its id, whatever was compiled since)."""
        return self.files.template(record.template_id)

    def current_template(self, name: str) -> dict[str, Any]:
        """The compiled template ``name``, verified (a PodError otherwise); re-verified only when its files change."""
        files = (self.paths.templates / f"{name}.json", self.paths.contexts / f"{name}.json")
        try:
            stamp = tuple((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino) for st in map(os.stat, files))
        except OSError:
            stamp = None
        cached = self._verified.get(name)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        template = load_template(self.paths, name)
        if stamp is not None:
            self._verified[name] = (stamp, template)
        return template

    def end_authority(self, key: tuple[str, str]) -> None:
        """The orchestrator answered a callback 401 or 403: its authority has ended, so tear the run down."""
        record = self.record(key)
        if record.terminal:
            self.save(record, authority_ended=True)
            return
        self.save(record, authority_ended=True, failure=record.failure or "authority_expired", state="revoking")
        self.drive(key)

    def _follow_callbacks(self, record: RunRecord) -> None:
        if self.delivery is not None:
            self.delivery.follow(record.key)

    # --------------------------------------------------------------------------------------------------- API

    def status(self, record: RunRecord) -> dict[str, Any]:
        return run_status(record)

    async def launch(self, raw: bytes) -> Answer:
        launch = parse_launch(raw)
        async with self.admission_lock:  # one admission at a time: concurrent identical launches make one run
            answer, record = self._admit(launch)
        self._follow_callbacks(record)
        return answer

    def _admit(self, launch: Launch) -> tuple[Answer, RunRecord]:
        key = (launch.installation, launch.run_id)
        if self.ledger.tombstoned(*key) is not None:
            raise RunsError("cancelled", "the run was cancelled; a new attempt needs a new run_id")
        if launch.credential is not None and self.callback_origin is None:
            raise RunsError("callbacks_disabled", "a credential was sent but no callback origin is configured")
        existing = self.ledger.get(*key)
        if existing is not None:
            if existing.spec_digest != launch.spec_digest:
                raise RunsError("digest_mismatch", "the run exists with a different spec digest")
            if launch.generation < existing.generation:
                raise RunsError("stale_generation", "the generation is below the one already recorded")
            if existing.cancelled:
                raise RunsError("cancelled", "the run was cancelled; a new attempt needs a new run_id")
            changes: dict[str, Any] = {"generation": launch.generation}
            if launch.credential is not None:
                self.files.store_credential(existing, launch.credential)
                changes["credential"] = "held"
            self.save(existing, **changes)
            return Answer(200, self.status(existing)), existing
        try:
            template = self.current_template(launch.spec["template"])
        except PodError as exc:
            raise RunsError(
                "template_unknown", f"the template {launch.spec['template'][:64]!r} is not compiled for this pod"
            ) from exc
        check_supported(template, self.backend.name)
        now = self.clock.now()
        tools, runtime = check_grant(launch, template, now)
        home = launch.spec.get("home")
        if home is not None and self.ledger.home_holder(launch.installation, home) is not None:
            raise RunsError("home_busy", "another run of this installation holds the home; retry once it has ended")
        subnet = None
        if home is not None and self.backend.name == "compose":  # its own network needs an address block
            taken = {r.subnet for r in self.ledger.unfinished() if r.subnet is not None}
            subnet = allocate(parse_base(os.environ.get(SUBNET_BASE_ENV)), taken)
        record = RunRecord(
            installation=launch.installation,
            run_id=launch.run_id,
            generation=launch.generation,
            spec_digest=launch.spec_digest,
            spec=launch.spec,
            template=template["name"],
            template_id=template["id"],
            models=[{k: v for k, v in m.items() if k != "needs_signin"} for m in template["models"]],
            tools=tools,
            authority_expires_at=format_timestamp(launch.authority_expires_at),
            accepted_at=format_timestamp(now),
            max_runtime_seconds=runtime,
            home=home,
            subnet=subnet,
        )
        self.files.keep_template(template)
        if launch.credential is not None:
            self.files.store_credential(record, launch.credential)
            record.credential = "held"
        self.ledger.insert(record)
        self.drive(key)
        return Answer(202, self.status(record)), record

    async def get(self, installation: str, run_id: str, wait: str | None, timeout_s: float | None) -> Answer:
        check_key(installation, run_id)
        record = self.record((installation, run_id))
        if wait is not None:
            record = await self.wait_for(record, wait, timeout_s)
        return Answer(200, self.status(record))

    async def wait_for(self, record: RunRecord, wait: str, timeout_s: float | None) -> RunRecord:
        if wait not in WAIT_STATES:
            raise RunsError("request_invalid", f"wait must be one of {', '.join(WAIT_STATES)}")
        limit = MAX_WAIT_S if timeout_s is None else timeout_s
        if not 0 <= limit <= MAX_WAIT_S:
            raise RunsError("request_invalid", f"timeout must be between 0s and {MAX_WAIT_S:g}s")

        def reached(current: RunRecord) -> bool:
            return current.terminal or ORDER[current.state] >= ORDER[wait]

        try:
            async with asyncio.timeout(limit):
                while not reached(record):
                    await self.wait_for_change(record.key)
                    record = self.record(record.key)
        except TimeoutError:
            record = self.record(record.key)
        return record

    async def cancel(
        self, installation: str, run_id: str, raw: bytes, wait: str | None, timeout_s: float | None
    ) -> Answer:
        """Cancel durably: an ``accepted`` or ``running`` run is ``revoking`` on disk before this answers."""
        check_key(installation, run_id)
        generation = parse_generation(parse_body(raw, {"generation": (int, True)}))
        async with self.admission_lock:
            record = self.ledger.get(installation, run_id)
            if record is None:
                stone = self.ledger.tombstone(installation, run_id, generation, format_timestamp(self.clock.now()))
                return Answer(200, tombstone_status(stone))
            if generation < record.generation:
                raise RunsError("stale_generation", "the generation is below the one already recorded")
            if not record.cancelled and not record.terminal:
                self.save(record, cancelled=True, generation=generation, state="revoking")
                self.drive(record.key)
        if wait is not None:
            record = await self.wait_for(record, wait, timeout_s)
        return Answer(200, self.status(record))

    async def credential(self, installation: str, run_id: str, raw: bytes) -> Answer:
        """Replace the held credential and optionally move the run's authority; both are on disk (the authority
        at the proxy too, as the identity's expiry) before this answers."""
        check_key(installation, run_id)
        body = parse_body(
            raw, {"generation": (int, True), "credential": (str, True), "authority_expires_at": (str, False)}
        )
        generation = parse_generation(body)
        if self.callback_origin is None:
            raise RunsError("callbacks_disabled", "a credential was sent but no callback origin is configured")
        key = (installation, run_id)
        async with self.identity_lock(key):
            record = self.record(key)
            if generation < record.generation:
                raise RunsError("stale_generation", "the generation is below the one already recorded")
            changes: dict[str, Any] = {"credential": "held", "generation": generation}
            if "authority_expires_at" in body:
                expires = parse_time(body["authority_expires_at"], "authority_expires_at")
                check_authority(expires, self.clock.now(), self.template_for(record)["limits"]["max_authority_seconds"])
                await self._move_identity_expiry(record, self.identity_expiry(expires))
                changes["authority_expires_at"] = format_timestamp(expires)
            self.files.store_credential(record, body["credential"])
            self.save(record, **changes)
        self.drive(key)  # the driver re-reads the authority it watches
        self._follow_callbacks(record)
        return Answer(200, self.status(record))

    async def _move_identity_expiry(self, record: RunRecord, expires_at: datetime) -> None:
        if record.run_agent_id is None or record.state not in ("accepted", "running"):
            return  # no identity yet (it is created from the ledger's authority), or it is being revoked
        try:
            await self.proxy.set_expiry(record.run_agent_id, expires_at)
        except ProxyError as exc:
            if exc.code in ("identity_unknown", "identity_revoked"):
                return  # not created yet (a crash came between), or already fenced: the run is ending
            if exc.retryable:
                raise RunsError("proxy_unavailable", "the proxy cannot be reached; retry the call") from exc
            raise RunsError("internal_error", f"the proxy refused the new authority ({exc.code})") from exc

    def result(self, installation: str, run_id: str) -> Answer:
        check_key(installation, run_id)
        record = self.record((installation, run_id))
        if record.result_bytes is None:
            raise RunsError("result_unavailable", "the run has no result")
        data = self.files.read_result(record)
        return Answer(200, data, {"X-Claw-Result-Truncated": "true" if record.result_truncated else "false"})

    def templates(self) -> Answer:
        return Answer(200, list_templates(self.paths))

    def identity(self) -> Answer:
        return Answer(
            200, {"protocol": PROTOCOL, "pod": self.pod_name, "supervisor_uid": os.geteuid(), "version": __version__}
        )

    async def health(self) -> Answer:
        try:
            epoch = await self.proxy.capture_epoch()
        except Exception:  # an unreachable proxy reports no epoch; health itself still answers
            epoch = None
        return Answer(
            200,
            {
                "protocol": PROTOCOL,
                "pod": self.pod_name,
                "supervisor_uid": os.geteuid(),
                "status": "ok",
                "capture_epoch": epoch,
                "isolation": self.backend.isolation_report,
            },
        )

    async def subscriptions(self) -> Answer:
        """``GET /v1/subscriptions``: the pod's plan sign-ins as the proxy reports them; never a token."""
        try:
            body = await self.proxy.subscriptions()
        except ProxyError as exc:
            if exc.code == "subscriptions_unsupported":
                raise RunsError("subscriptions_unsupported", "this pod's proxy has no plan routes") from exc
            raise RunsError("proxy_unavailable", "the proxy could not be asked for its plan sign-ins") from exc
        return Answer(200, body)

    def list_runs(self, query: Iterable[tuple[str, str]]) -> Answer:
        """``GET /v1/runs``: one page of runs, newest first, each the status a single read returns (never the task);
        the query's filters and bound are applied by the ledger (see :mod:`clawstack.runs.listing`)."""
        wanted = parse_query(query)
        records = self.ledger.page(
            installation=wanted.installation, state=wanted.state, after=wanted.after, limit=wanted.limit + 1
        )
        page, cursor = split_page(records, wanted.limit)
        return Answer(200, {"runs": [self.status(record) for record in page], "next_cursor": cursor})


__all__ = ["Answer", "StartupError", "Supervisor", "check_task_homes_runnable"]
