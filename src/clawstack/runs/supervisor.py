"""The supervisor's core: admission against the ledger, status and long-polls, cancellation, credentials, results,
and one :class:`~clawstack.runs.lifecycle.RunDriver` per unfinished run. Transports live in
:mod:`clawstack.runs.server`; this module maps requests to results.

Start-up order (the spec's): take the pod lock for the process's life, run the proxy's revocation self-test, refuse
to serve while workers of this pod exist that the ledger does not know, reconcile every unfinished run (its driver
resumes wherever the ledger says it was), then accept connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from clawstack import __version__
from clawstack.common.clock import Clock, SystemClock, format_timestamp
from clawstack.common.errors import ClawError
from clawstack.common.files import ensure_private_dir, read_private, write_private
from clawstack.pod.artifacts import PodPaths, existing_operator_token, list_templates, load_template
from clawstack.pod.errors import PodError
from clawstack.pod.lock import PodLock
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.identities import ChainEntry
from clawstack.runs.admission import (
    Launch,
    check_grant,
    check_key,
    parse_body,
    parse_generation,
    parse_launch,
    parse_time,
)
from clawstack.runs.backends.base import Backend, RunLabels
from clawstack.runs.callbacks import CallbackSender, CallbackTarget, end_body, run_body
from clawstack.runs.errors import RunsError
from clawstack.runs.ledger import ORDER, Ledger, RunRecord
from clawstack.runs.lifecycle import RunDriver
from clawstack.runs.listing import parse_query, split_page

log = logging.getLogger(__name__)

PROTOCOL: Final = 1
MAX_WAIT_S: Final = 60.0
WAIT_STATES: Final = ("running", "revoked", "stopped", "failed")


class StartupError(RunsError):
    """The supervisor refuses to serve (self-test failed, orphaned workers, unsafe socket directory)."""


class ProxyLink:
    """The supervisor's connection to the pod's proxy, over its operator and worker Unix sockets."""

    def __init__(self, paths: PodPaths) -> None:
        self.paths = paths

    def _client(self) -> ProxyOperatorClient:
        token = existing_operator_token(self.paths)
        if token is None:
            raise RunsError("internal_error", "the pod's proxy configuration is missing; run claw up")
        return ProxyOperatorClient(token=token, unix_socket=str(self.paths.operator_socket))

    async def self_test(self) -> None:
        async with self._client() as client:
            await client.self_test(worker_unix_socket=str(self.paths.worker_socket))

    async def create_identity(
        self,
        *,
        identity_id: str,
        secret: str,
        chain: list[ChainEntry],
        tools: list[str],
        expires_at: datetime,
        labels: Mapping[str, str],
    ) -> None:
        async with self._client() as client:
            await client.create_identity(
                identity_id=identity_id, secret=secret, chain=chain, tools=tools, expires_at=expires_at, labels=labels
            )

    async def revoke(self, identity_id: str) -> None:
        async with self._client() as client:
            result = await client.revoke(identity_id)
        if result.get("revoked") is not True or result.get("tools") != []:
            raise RunsError("internal_error", "the proxy did not acknowledge the revocation")

    async def capture_epoch(self) -> int | None:
        async with self._client() as client:
            epoch = (await client.health()).get("capture_epoch")
        return epoch if isinstance(epoch, int) else None


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
    ) -> None:
        self.paths = PodPaths(pod_dir.resolve())
        self.backend = backend
        self.clock: Clock = clock or SystemClock()
        self.callback_origin = callback_origin
        self.callback_path = callback_path
        self.heartbeat_s = heartbeat_s
        self.proxy = proxy or ProxyLink(self.paths)
        self.ledger = Ledger(self.paths.runs)
        self.lock = PodLock(self.paths.lock, holder="claw runs serve")
        self.pod_name = self.paths.pod.name
        self._drivers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._driver_objects: dict[tuple[str, str], RunDriver] = {}
        self._changed: dict[tuple[str, str], asyncio.Event] = {}
        self._admission = asyncio.Lock()
        self._admitted: dict[str, dict[str, Any]] = {}
        self._verified: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._callback_tasks: set[asyncio.Task[None]] = set()
        self._heartbeats: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.callbacks = (
            CallbackSender(CallbackTarget(callback_origin, callback_path), clock=self.clock)
            if callback_origin is not None
            else None
        )

    @property
    def worker_socket(self) -> Path:
        return self.paths.worker_socket

    # ---------------------------------------------------------------------------------------------- lifecycle

    async def start(self, *, remove_orphans: bool = False) -> None:
        self.lock.acquire(inheritable=True)
        try:
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
                await self.backend.remove(orphan)
            for record in self.ledger.unfinished():
                self._drive(record.key)
            if self.callbacks is not None:
                for record in self.ledger.ended_with_end_callback_owed():
                    self._background(self._end_callbacks(record.key))
        except BaseException:
            # Best-effort release of what start-up took, then the original error.
            self.ledger.close()
            self.lock.release()
            raise

    async def orphans(self) -> list[RunLabels]:
        workers = await self.backend.list_workers()
        return [w for w in workers if self.ledger.get(w.installation, w.run_id) is None]

    async def stop(self) -> None:
        """Stop every driver (runs resume from the ledger at the next start) and release the lock. Idempotent."""
        tasks = list(self._drivers.values()) + list(self._callback_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._drivers.clear()
        if self.callbacks is not None:
            await self.callbacks.close()
        self.ledger.close()
        self.lock.release()

    def _drive(self, key: tuple[str, str]) -> None:
        if key in self._drivers and not self._drivers[key].done():
            self._driver_objects[key].wake.set()
            return
        driver = RunDriver(self, key)
        self._driver_objects[key] = driver
        task = asyncio.create_task(driver.run(), name=f"run {key[0]}/{key[1]}")
        self._drivers[key] = task
        task.add_done_callback(lambda t: self._driver_done(key, t))

    def _driver_done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
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
        copy can never undo a concurrent change such as a cancel."""
        latest = self.ledger.get(*record.key) or record
        for name, value in changes.items():
            setattr(latest, name, value)
        self.ledger.update(latest)
        for name in RunRecord.__dataclass_fields__:
            setattr(record, name, getattr(latest, name))
        event = self._changed.pop(record.key, None)
        if event is not None:
            event.set()

    def _admitted_path(self, template_id: str) -> Path:
        return self.paths.runs / "admitted" / f"{template_id.removeprefix('sha256:')}.json"

    def template_for(self, record: RunRecord) -> dict[str, Any]:
        """The template the run was admitted with (kept by its id, whatever was compiled since)."""
        cached = self._admitted.get(record.template_id)
        if cached is None:
            cached = json.loads(read_private(self._admitted_path(record.template_id), max_bytes=4 * 1024 * 1024))
            self._admitted[record.template_id] = cached
        return cached

    def _current_template(self, name: str) -> dict[str, Any]:
        """The compiled template ``name``, verified; re-verified only when its files change."""
        files = (self.paths.templates / f"{name}.json", self.paths.contexts / f"{name}.json")
        try:
            stamp = tuple((f.stat().st_mtime_ns, f.stat().st_size, f.stat().st_ino) for f in files)
        except OSError:
            stamp = None
        cached = self._verified.get(name)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        template = load_template(self.paths, name)
        if stamp is not None:
            self._verified[name] = (stamp, template)
        return template

    def store_result(self, record: RunRecord, text: bytes) -> None:
        path = self.paths.runs / "results" / record.installation / f"{record.run_id}.txt"
        ensure_private_dir(path.parent)
        write_private(path, text)

    # ---------------------------------------------------------------------------------------------- callbacks

    def _credential(self, record: RunRecord) -> str | None:
        path = self.paths.runs / "secrets" / record.installation / f"{record.run_id}.credential"
        try:
            return read_private(path, max_bytes=8192).decode()
        except (OSError, ClawError, UnicodeDecodeError):
            return None

    def _background(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._callback_tasks.add(task)
        task.add_done_callback(self._callback_tasks.discard)

    def notify_started(self, record: RunRecord) -> None:
        """A worker was started: send ``start``, then heartbeats while the run is running."""
        if self.callbacks is None or record.credential != "held" or record.callbacks.get("start") != "skipped":
            return
        self._background(self._start_callbacks(record.key))

    async def _start_callbacks(self, key: tuple[str, str]) -> None:
        await self._deliver(key, "start")
        self._heartbeats[key] = asyncio.current_task()  # type: ignore[assignment]
        try:
            while True:
                await self.clock.sleep(self.heartbeat_s)
                record = self.record(key)
                if record.state != "running":
                    return
                await self._deliver(key, "heartbeat")
        finally:
            self._heartbeats.pop(key, None)

    async def _deliver(self, key: tuple[str, str], kind: str) -> None:
        assert self.callbacks is not None
        record = self.record(key)
        credential = self._credential(record)
        if credential is None:
            self.save(record, credential="missing")
            return
        if kind == "end":
            failure = record.failure
            summary = b""
            if record.result_bytes is not None:
                summary = read_private(
                    self.paths.runs / "results" / record.installation / f"{record.run_id}.txt",
                    max_bytes=64 * 1024 * 1024,
                )
            body = end_body(
                installation=record.installation,
                run_id=record.run_id,
                generation=record.generation,
                outcome="failed" if failure else "succeeded",
                reason=failure or "",
                summary=summary.decode("utf-8", "replace"),
                stored_result_truncated=record.result_truncated,
            )
        else:
            body = run_body(installation=record.installation, run_id=record.run_id, generation=record.generation)
        result = await self.callbacks.send(kind, credential, body)  # type: ignore[arg-type]
        record = self.record(key)
        if kind in ("start", "end"):
            self.save(record, callbacks={**record.callbacks, kind: result.state})
        if result.authority_ended and not record.terminal:
            # A 401 or 403 means the orchestrator's authority has ended: tear the run down.
            self.save(
                record,
                failure=record.failure or "authority_expired",
                state="revoking" if record.state in ("accepted", "running") else record.state,
            )
            self._drive(key)

    def notify_ended(self, record: RunRecord) -> None:
        """The run is terminal: send ``end`` (never after a cancel), after ``start`` for a worker that ran."""
        if self.callbacks is None or record.credential == "none" or record.cancelled:
            return
        self._background(self._end_callbacks(record.key))

    async def _end_callbacks(self, key: tuple[str, str]) -> None:
        heartbeat = self._heartbeats.get(key)
        if heartbeat is not None:
            heartbeat.cancel()
        record = self.record(key)
        if record.spawned and record.callbacks.get("start") == "skipped":
            await self._deliver(key, "start")
        await self._deliver(key, "end")

    # --------------------------------------------------------------------------------------------------- API

    def status(self, record: RunRecord) -> dict[str, Any]:
        result = None
        if record.result_bytes is not None:
            result = {"bytes": record.result_bytes, "truncated": record.result_truncated}
        body: dict[str, Any] = {
            "installation": record.installation,
            "run_id": record.run_id,
            "generation": record.generation,
            "state": record.state,
            "cancelled": record.cancelled,
            "spec_digest": record.spec_digest,
            "template": record.template,
            "template_id": record.template_id,
            "models": record.models,
            "run_agent_id": record.run_agent_id,
            "revoked": record.revoked,
            "revocation_proof": record.revocation_proof,
            "exit_code": record.exit_code,
            "failure": record.failure,
            "result": result,
            "credential": record.credential,
            "callbacks": dict(record.callbacks),
            "deadline": record.deadline,
            "authority_expires_at": record.authority_expires_at,
            "accepted_at": record.accepted_at,
            "started_at": record.started_at,
            "exited_at": record.exited_at,
            "ended_at": record.ended_at,
            "pending": record.pending,
            "isolation": record.isolation,
        }
        if record.capture_epoch is not None:
            body["capture_epoch"] = record.capture_epoch
            body["capture_epoch_observed_at"] = record.capture_epoch_observed_at
        return body

    async def launch(self, raw: bytes) -> Answer:
        launch = parse_launch(raw)
        async with self._admission:  # one admission at a time: concurrent identical launches make one run
            return self._admit(launch)

    def _admit(self, launch: Launch) -> Answer:
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
                self._store_credential(existing, launch.credential)
                changes["credential"] = "held"
            self.save(existing, **changes)
            return Answer(200, self.status(existing))
        try:
            template = self._current_template(launch.spec["template"])
        except PodError as exc:
            raise RunsError(
                "template_unknown", f"the template {launch.spec['template'][:64]!r} is not compiled for this pod"
            ) from exc
        now = self.clock.now()
        tools, runtime = check_grant(launch, template, now)
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
        )
        admitted = self._admitted_path(template["id"])
        if template["id"] not in self._admitted:  # the run keeps the template it was admitted with, by its id
            ensure_private_dir(admitted.parent)
            if not admitted.exists():
                write_private(admitted, json.dumps(template).encode())
            self._admitted[template["id"]] = template
        if launch.credential is not None:
            self._store_credential(record, launch.credential)
            record.credential = "held"
        self.ledger.insert(record)
        self._drive(key)
        return Answer(202, self.status(record))

    def _store_credential(self, record: RunRecord, credential: str) -> None:
        path = self.paths.runs / "secrets" / record.installation / f"{record.run_id}.credential"
        ensure_private_dir(path.parent)
        write_private(path, credential.encode())

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
                    event = self._changed.setdefault(record.key, asyncio.Event())
                    await event.wait()
                    record = self.record(record.key)
        except TimeoutError:
            record = self.record(record.key)
        return record

    async def cancel(
        self, installation: str, run_id: str, raw: bytes, wait: str | None, timeout_s: float | None
    ) -> Answer:
        check_key(installation, run_id)
        generation = parse_generation(parse_body(raw, {"generation": (int, True)}))
        async with self._admission:
            record = self.ledger.get(installation, run_id)
            if record is None:
                stone = self.ledger.tombstone(installation, run_id, generation, format_timestamp(self.clock.now()))
                return Answer(
                    200,
                    {
                        "installation": installation,
                        "run_id": run_id,
                        "generation": stone.generation,
                        "state": None,
                        "cancelled": True,
                        "tombstone": True,
                    },
                )
            if generation < record.generation:
                raise RunsError("stale_generation", "the generation is below the one already recorded")
            if not record.cancelled and not record.terminal:
                self.save(record, cancelled=True, generation=generation)
                self._drive(record.key)
        if wait is not None:
            record = await self.wait_for(record, wait, timeout_s)
        return Answer(200, self.status(record))

    def credential(self, installation: str, run_id: str, raw: bytes) -> Answer:
        check_key(installation, run_id)
        body = parse_body(
            raw, {"generation": (int, True), "credential": (str, True), "authority_expires_at": (str, False)}
        )
        generation = parse_generation(body)
        if self.callback_origin is None:
            raise RunsError("callbacks_disabled", "a credential was sent but no callback origin is configured")
        record = self.record((installation, run_id))
        if generation < record.generation:
            raise RunsError("stale_generation", "the generation is below the one already recorded")
        changes: dict[str, Any] = {"credential": "held", "generation": generation}
        if "authority_expires_at" in body:
            expires = parse_time(body["authority_expires_at"], "authority_expires_at")
            template = self.template_for(record)
            accepted = self.clock.now()
            if (expires - accepted).total_seconds() > template["limits"]["max_authority_seconds"]:
                raise RunsError("grant_exceeded", "authority_expires_at is beyond the template's max-authority")
            changes["authority_expires_at"] = format_timestamp(expires)
        self._store_credential(record, body["credential"])  # persisted before the answer
        self.save(record, **changes)
        return Answer(200, self.status(record))

    def result(self, installation: str, run_id: str) -> Answer:
        check_key(installation, run_id)
        record = self.record((installation, run_id))
        if record.result_bytes is None:
            raise RunsError("result_unavailable", "the run has no result")
        path = self.paths.runs / "results" / installation / f"{run_id}.txt"
        data = read_private(path, max_bytes=64 * 1024 * 1024)
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
                "isolation": self.backend.isolation,
            },
        )

    def subscriptions(self) -> Answer:
        raise RunsError("subscriptions_unsupported", "this pod's proxy has no plan routes")

    def list_runs(self, query: Iterable[tuple[str, str]]) -> Answer:
        """``GET /v1/runs``: one page of runs, newest first, each the status a single read returns (never the task);
        the query's filters and bound are applied by the ledger (see :mod:`clawstack.runs.listing`)."""
        wanted = parse_query(query)
        records = self.ledger.page(
            installation=wanted.installation, state=wanted.state, after=wanted.after, limit=wanted.limit + 1
        )
        page, cursor = split_page(records, wanted.limit)
        return Answer(200, {"runs": [self.status(record) for record in page], "next_cursor": cursor})


__all__ = ["Answer", "ProxyLink", "StartupError", "Supervisor"]
