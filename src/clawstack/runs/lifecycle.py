"""One driver per run: the spec's state machine, with every step recorded before the next one begins.

::

    accepted ─► running ─► revoking ─► revoked ─► stopped | failed
        └─────cancel───────► revoking (no worker ever created)

A step is idempotent, so a driver restarted after a crash (the supervisor's reconcile) simply runs the state it
finds: ``accepted`` checks the run's pins (its template id against the compiled one, the local runner's digest
against the installed code), creates the identity (same id and secret as before) and asks the backend to spawn,
which starts nothing if the run already has a worker; ``running`` watches the worker; ``revoking`` removes the
worker and revokes the identity until the proxy acknowledges. A run is never terminal while a worker carries its
labels or before its identity's revocation is acknowledged: every run's deterministic identity id is revoked,
even when no identity was ever created for it, so ``revocation_proof: cllama_ack`` always stands for a real 200.

A step that meets a retryable error (the proxy away, a spawn that timed out) says so in ``pending`` and is tried
again with backoff; a permanent refusal before the worker starts ends the run ``failed`` with ``spawn_error`` at
once, the refusal's code in ``failure_detail``. Revocation is never given up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from clawstack.common.clock import format_timestamp, parse_timestamp
from clawstack.common.errors import ClawError
from clawstack.pod.errors import PodError
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.identities import ChainEntry
from clawstack.runs.backends.base import ContentMount, RunLabels, TaskHome, WorkerSpec
from clawstack.runs.ledger import RunRecord
from clawstack.worker.contract import WorkerConfig, extract_answer
from clawstack.worker.home_contract import read_home_exit

if TYPE_CHECKING:
    from clawstack.runs.supervisor import Supervisor

log = logging.getLogger(__name__)

RETRY_INITIAL_S: Final = 0.5
RETRY_MAX_S: Final = 30.0
LOST_EXIT: Final = 255
"""The exit a worker is read as when none was observed (it vanished): never a success."""
METER_SILENCE_S: Final = 30.0
"""How long a task-home run's meter may go without a new measure (the first one counted from the worker's start)
before the run ends ``home_meter_unavailable``; the supervisor's ``meter_silence_s``."""


def identity_id(record: RunRecord) -> str:
    digest = hashlib.sha256(f"{record.installation}/{record.run_id}/{record.accepted_at}".encode()).hexdigest()
    return f"run-{digest[:32]}"


class RunDriver:
    """Moves one run to a terminal state. Created by the supervisor; one per run at a time."""

    def __init__(self, supervisor: Supervisor, key: tuple[str, str]) -> None:
        self.sup = supervisor
        self.key = key
        self.wake = asyncio.Event()
        self._meter: tuple[int | None, datetime] | None = None  # the meter's last seq seen, and since when

    async def run(self) -> None:
        retry = RETRY_INITIAL_S
        while True:
            record = self.sup.record(self.key)
            if record.terminal:
                return
            try:
                progressed = await self._step(record)
            except ClawError as exc:
                if isinstance(exc, ProxyError) and not exc.retryable and self._refused(exc):
                    continue
                # A dependency is unavailable: say so and retry; never lose the run.
                self.sup.save(record, pending=f"{exc.code}: retrying")
                log.warning("run %s/%s: %s (%s); retrying", *self.key, exc.code, type(exc).__name__)
                progressed = False
                await self._sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            if progressed:
                retry = RETRY_INITIAL_S

    def _refused(self, exc: ProxyError) -> bool:
        """The proxy refused the run's identity for good (a 4xx): end the run instead of retrying for ever."""
        record = self.sup.record(self.key)
        if record.state != "accepted":
            return True  # the run moved on meanwhile (a cancel): its next step is revocation
        log.error("run %s/%s: refused before its worker started: %s", *self.key, exc.code)
        self.sup.save(record, state="revoking", failure="spawn_error", failure_detail=exc.code, pending=None)
        return True

    async def _sleep(self, delay_s: float) -> None:
        self.wake.clear()
        try:
            async with asyncio.timeout(delay_s):
                await self.wake.wait()
        except TimeoutError:
            pass

    async def _step(self, record: RunRecord) -> bool:
        if record.state == "accepted":
            return await self._start(record)
        if record.state == "running":
            return await self._watch(record)
        if record.state == "revoking":
            return await self._revoke(record)
        if record.state == "revoked":
            return self._finish(record)
        return False

    # ----------------------------------------------------------------------------------------------- accepted

    async def _start(self, record: RunRecord) -> bool:
        if record.cancelled:
            self.sup.save(record, state="revoking")
            return True
        now = self.sup.clock.now()
        if now >= parse_timestamp(record.authority_expires_at):
            self.sup.save(record, state="revoking", failure="authority_expired")
            return True
        template = self.sup.template_for(record)
        mismatch = await self._pin_mismatch(record, template)
        if mismatch is not None:
            log.error("run %s/%s: its pins no longer hold (%s); the run ends as mismatch", *self.key, mismatch)
            self.sup.save(record, state="revoking", failure="mismatch", failure_detail=mismatch)
            return True
        proxy = self.sup.proxy
        await proxy.self_test()
        secret = self.sup.files.identity_secret(record)
        ident = identity_id(record)
        async with self.sup.identity_lock(self.key):  # a concurrent authority change waits, or is seen here
            record = self.sup.record(self.key)
            if record.run_agent_id is None:
                self.sup.save(record, run_agent_id=ident)
            wanted = self.sup.identity_expiry(parse_timestamp(record.authority_expires_at))
            described = await proxy.create_identity(
                identity_id=ident,
                secret=secret,
                chain=[ChainEntry.from_dict(m) for m in record.models],
                tools=record.tools,
                expires_at=wanted,
                labels={"pod": self.sup.pod_name, "installation": record.installation, "run_id": record.run_id},
            )
            if described.get("expires_at") != format_timestamp(wanted):  # the authority moved since it was created
                await proxy.set_expiry(ident, wanted)
        if record.capture_epoch_observed_at is None and not record.spawned:  # observed once, never rewritten
            epoch = await proxy.capture_epoch()
            observed: str | None = format_timestamp(self.sup.clock.now()) if epoch is not None else None
        else:
            epoch, observed = record.capture_epoch, record.capture_epoch_observed_at
        endpoint = self.sup.backend.model_endpoint
        config = WorkerConfig(
            credential=f"{ident}:{secret}",
            model=record.models[0]["slot"],
            contract=template["contract"]["text"],
            model_base_url=endpoint.get("model_base_url"),
            model_unix_socket=endpoint.get("model_unix_socket"),
            request_timeout_s=float(record.max_runtime_seconds),
        )
        if self.sup.record(self.key).cancelled:  # a cancel came while the identity was made: start nothing
            return True
        self.sup.save(record, spawned=True, capture_epoch=epoch, capture_epoch_observed_at=observed)
        try:
            await self.sup.backend.spawn(
                WorkerSpec(
                    labels=self._labels(record),
                    task=record.spec["task"],
                    config=config.to_json().encode(),
                    proxy_socket=self.sup.worker_socket,
                    memory_bytes=template["limits"]["memory_bytes"],
                    pids=template["limits"]["pids"],
                    max_runtime_s=record.max_runtime_seconds,
                    max_output_bytes=template["limits"]["max_result_bytes"] + 4096,
                    image_id=(template.get("runner") or {}).get("image_id"),
                    home=self._task_home(record, template),
                    writer_lock_fd=self.sup.lock.fd,
                )
            )
        except ClawError as exc:
            if exc.retryable:
                raise  # spawning is idempotent: the driver tries again
            log.error("run %s/%s: the worker could not start: %s", *self.key, exc.code)
            failure = "mismatch" if exc.code == "image_mismatch" else "spawn_error"
            self.sup.save(record, state="revoking", failure=failure, failure_detail=exc.code)
            return True
        started = self.sup.clock.now()
        self.sup.save(
            record,
            state="running",  # ignored if a cancel made the run revoking meanwhile: states only move forward
            started_at=format_timestamp(started),
            deadline=format_timestamp(started + timedelta(seconds=record.max_runtime_seconds)),
            isolation=self.sup.backend.isolation_report
            if record.home is None
            else self.sup.backend.home_isolation_report,
            pending=None,
        )
        return True

    def _task_home(self, record: RunRecord, template: dict[str, Any]) -> TaskHome | None:
        """A task-home run's home (created empty the first time), its mount, meter limit and content mounts."""
        if record.home is None:
            return None
        settings = template["home"]
        return TaskHome(
            path=self.sup.homes.ensure(record.installation, record.home),
            mount=settings["mount"],
            max_bytes=int(settings["max_bytes"]),
            content=tuple(
                ContentMount(
                    pod=self.sup.paths.pod,
                    source=c["source"],
                    target=c["target"],
                    # A template compiled without pins matches no file: its spawn is refused, content_changed.
                    device=int(c.get("device", -1)),
                    inode=int(c.get("inode", -1)),
                )
                for c in template.get("content", [])
            ),
            subnet=record.subnet,
            helper_image_id=(template.get("runner") or {}).get("helper_image_id"),
        )

    async def _pin_mismatch(self, record: RunRecord, template: dict[str, Any]) -> str | None:
        """Why the run may not start under its pins (a code for ``failure_detail``), or ``None``: "A run accepted
        under one chain is refused at spawn if the template was recompiled with another"; the same holds for the
        local runner's code. ``template_recompiled``, ``template_unknown``/``template_invalid`` (no longer
        compiled, or no longer verifying), or the backend's own reason (:meth:`Backend.pin_mismatch`: the local
        runner's code changed, the compose image is gone)."""
        try:
            current = self.sup.current_template(record.template)
        except PodError as exc:
            if exc.code not in ("template_unknown", "template_invalid"):
                raise
            return exc.code
        if current["id"] != record.template_id:
            return "template_recompiled"
        return await self.sup.backend.pin_mismatch(template)

    def _labels(self, record: RunRecord) -> RunLabels:
        return RunLabels(pod=self.sup.pod_name, installation=record.installation, run_id=record.run_id)

    # ------------------------------------------------------------------------------------------------ running

    async def _watch(self, record: RunRecord) -> bool:
        state = await self.sup.backend.inspect(self._labels(record))
        now = self.sup.clock.now()
        if record.cancelled:
            self.sup.save(record, state="revoking")
            return True
        if state.home_meter in ("home_full", "home_meter_unavailable"):
            # The watchdog ends the run through the normal revocation and teardown, whatever the worker does.
            self.sup.save(record, state="revoking", failure=state.home_meter)
            return True
        if state.home_meter is not None and self._meter_silent(record, state.home_meter_seq, now):
            self.sup.save(record, state="revoking", failure="home_meter_unavailable")
            return True
        if state.exit_code is not None or (not state.running and state.exists):
            self._record_exit(record, state.exit_code, state.stdout, state.stdout_truncated, state.timed_out)
            return True
        if not state.exists:
            self.sup.save(record, state="revoking", failure="mismatch")  # the worker vanished without a trace
            return True
        if record.deadline is not None and now >= parse_timestamp(record.deadline):
            self.sup.save(record, state="revoking", failure="timeout")
            return True
        if now >= parse_timestamp(record.authority_expires_at):
            self.sup.save(record, state="revoking", failure="authority_expired")
            return True
        await self._sleep(self.sup.backend.watch_interval_s)
        return False

    def _meter_silent(self, record: RunRecord, seq: int | None, now: datetime) -> bool:
        """Whether the run's meter has gone the supervisor's ``meter_silence_s`` without a new measure: counted
        from the last new one this driver saw or, before its first, from the worker's start (a restarted
        supervisor counts a meter that already reported from its own first look)."""
        seen = self._meter
        if seen is None or seen[0] != seq:
            since = now
            if seen is None and seq is None and record.started_at is not None:
                since = min(now, parse_timestamp(record.started_at))
            seen = self._meter = (seq, since)
        return now - seen[1] >= timedelta(seconds=self.sup.meter_silence_s)

    def _record_exit(
        self, record: RunRecord, exit_code: int | None, stdout: bytes, truncated: bool, timed_out: bool
    ) -> None:
        template = self.sup.template_for(record)
        max_bytes = template["limits"]["max_result_bytes"]
        failure: str | None = None
        answer = extract_answer(stdout, max_bytes)
        fields: dict[str, Any] = {"exit_code": exit_code, "exited_at": format_timestamp(self.sup.clock.now())}
        home_result = None
        if timed_out:
            failure = "timeout"
        elif record.home is not None:
            failure, runner_code, home_result = read_home_exit(LOST_EXIT if exit_code is None else exit_code, stdout)
            if runner_code is not None:
                fields["exit_observed"] = {"runner_code": runner_code}
            if home_result is None:
                answer = None  # only a proven turn has a result
        elif exit_code != 0:
            failure = "exit_nonzero"
        elif answer is None:
            failure = "result_missing"
        if answer is not None:
            text, cut = answer
            self.sup.files.store_result(record, text)
            fields.update(result_bytes=len(text), result_truncated=cut or truncated)
            if home_result is not None:
                fields.update(result_outcome=home_result.outcome, result_session=home_result.session)
        self.sup.save(record, state="revoking", failure=failure, **fields)

    # ----------------------------------------------------------------------------------------------- revoking

    async def _revoke(self, record: RunRecord) -> bool:
        labels = self._labels(record)
        await self.sup.backend.remove(labels, writer_lock_fd=self.sup.lock.fd)
        remaining = await self.sup.backend.inspect(labels)
        if remaining.running:
            self.sup.save(record, pending="the worker is still being removed")
            await self._sleep(self.sup.backend.watch_interval_s)
            return False
        ident = record.run_agent_id or identity_id(record)
        if record.run_agent_id is None:
            self.sup.save(record, run_agent_id=ident)  # the id is fenced even though no identity was created
        if record.home is not None:
            await self._usage_before_revocation(record, ident)
        await self.sup.proxy.revoke(ident)
        usage = await self.sup.proxy.usage(ident) if record.home is not None else None
        if usage is not None:  # a task-home run reports which credential classes served it
            # A proxy restarted since the worker was gone lost nothing: the counts it persisted are the ones one
            # process saw whole before, so they stay complete.
            counted = record.served_by_complete is True and (record.served_by, record.last_plan_failure) == (
                usage.served_by,
                usage.last_plan_failure,
            )
            self.sup.save(
                record,
                served_by=usage.served_by,
                served_by_complete=usage.complete or counted,
                last_plan_failure=usage.last_plan_failure,
            )
        self.sup.save(record, state="revoked", revoked=True, revocation_proof="cllama_ack", pending=None)
        self.sup.files.forget_identity_secret(record)
        return True

    async def _usage_before_revocation(self, record: RunRecord, ident: str) -> None:
        """Keep the proxy's counts as they stand once the worker is gone, when one process counted the whole run:
        no call can come any more, so a proxy restarted during the revocation cannot make them less than whole."""
        try:
            usage = await self.sup.proxy.usage(ident)
        except ClawError:
            return  # the count after the revocation still decides
        if usage is not None and usage.complete:
            self.sup.save(
                record,
                served_by=usage.served_by,
                served_by_complete=True,
                last_plan_failure=usage.last_plan_failure,
            )

    def _finish(self, record: RunRecord) -> bool:
        succeeded = record.failure is None and (record.cancelled or record.result_bytes is not None)
        state = "stopped" if succeeded or record.cancelled else "failed"
        self.sup.save(record, state=state, ended_at=format_timestamp(self.sup.clock.now()))
        return True


__all__ = ["METER_SILENCE_S", "RunDriver", "identity_id"]
