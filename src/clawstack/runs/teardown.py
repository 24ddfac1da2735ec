"""What ``claw down`` does to unfinished runs before it stops the pod: cancel them all.

It runs under the pod lock, so no supervisor is serving. Each unfinished run is marked cancelled, its worker is
removed, and its identity (the run's deterministic id, whether or not an identity was ever created) is revoked
through the proxy; the run then passes through ``revoked`` to ``stopped``. A run whose revocation the proxy cannot
acknowledge keeps its worker removed and waits: once ``claw down`` has stopped the proxy and verified it is gone,
those runs pass through ``revoked`` with ``revocation_proof: proxy_stopped`` instead of ``cllama_ack``, and their
secret files (identity secret, callback credential) are removed: no callback follows a cancel. If a worker cannot
be removed, the run is left unfinished for recovery and ``claw down`` reports an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from clawstack.common.clock import Clock, SystemClock, format_timestamp
from clawstack.common.errors import ClawError
from clawstack.pod.artifacts import PodPaths, read_pod_manifest
from clawstack.runs.backends.base import Backend, RunLabels
from clawstack.runs.files import RunFiles
from clawstack.runs.ledger import Ledger, RunRecord
from clawstack.runs.lifecycle import identity_id
from clawstack.runs.proxylink import ProxyLink


@dataclass(slots=True)
class Teardown:
    """The outcome of cancelling every unfinished run."""

    revoked: list[str] = field(default_factory=list)  # runs ended with cllama_ack
    awaiting_proxy_stop: list[str] = field(default_factory=list)  # revocation unacknowledged; worker removed
    stuck: list[str] = field(default_factory=list)  # a worker could not be removed: left for recovery


async def cancel_unfinished(
    paths: PodPaths,
    backend: Backend,
    *,
    proxy: ProxyLink | None = None,
    clock: Clock | None = None,
    writer_lock_fd: int | None = None,
) -> Teardown:
    """Cancel, remove and revoke every unfinished run; see the module docstring. ``writer_lock_fd`` (the pod
    lock, which the caller holds) is inherited by the backend's lifecycle subprocesses."""
    link = proxy or ProxyLink(paths)
    now = clock or SystemClock()
    pod = read_pod_manifest(paths)["pod"]
    ledger = Ledger(paths.runs)
    ledger.open()
    outcome = Teardown()
    try:
        for record in ledger.unfinished():
            name = f"{record.installation}/{record.run_id}"
            record.cancelled = True
            record.state = "revoking"
            record.run_agent_id = record.run_agent_id or identity_id(record)
            ledger.update(record)
            labels = RunLabels(pod=pod, installation=record.installation, run_id=record.run_id)
            try:
                await backend.remove(labels, writer_lock_fd=writer_lock_fd)
                if (await backend.inspect(labels)).running:
                    raise ClawError("the worker is still running", code="worker_stuck")
            except ClawError:
                outcome.stuck.append(name)
                continue
            try:
                await link.revoke(record.run_agent_id)
            except ClawError:
                record.pending = "the proxy did not acknowledge the revocation; claw down stops it"
                ledger.update(record)
                outcome.awaiting_proxy_stop.append(name)
                continue
            _finish(ledger, RunFiles(paths), record, "cllama_ack", format_timestamp(now.now()))
            outcome.revoked.append(name)
    finally:
        ledger.close()
    return outcome


def finish_after_proxy_stopped(paths: PodPaths, names: list[str], *, clock: Clock | None = None) -> None:
    """Once the proxy is verified stopped, end the runs whose revocation it never acknowledged."""
    now = format_timestamp((clock or SystemClock()).now())
    ledger = Ledger(paths.runs)
    ledger.open()
    try:
        for name in names:
            installation, run_id = name.split("/", 1)
            record = ledger.get(installation, run_id)
            if record is not None and not record.terminal:
                _finish(ledger, RunFiles(paths), record, "proxy_stopped", now)
    finally:
        ledger.close()


def _finish(ledger: Ledger, files: RunFiles, record: RunRecord, proof: str, now: str) -> None:
    """``revoked`` (recorded), the secrets gone, then ``stopped``: the same path a served run takes."""
    record.revoked = True
    record.revocation_proof = proof
    record.pending = None
    record.state = "revoked"
    ledger.update(record)
    files.remove_secrets(record)
    record.state = "stopped"
    record.ended_at = now
    ledger.update(record)


TeardownHook = Callable[[PodPaths], Teardown]

__all__ = ["Teardown", "TeardownHook", "cancel_unfinished", "finish_after_proxy_stopped"]
