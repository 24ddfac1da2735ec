"""The status object of a run, as ``GET /v1/runs/{installation}/{run_id}`` (and each entry of ``GET /v1/runs``)
returns it. It never carries the task text or a credential."""

from __future__ import annotations

from typing import Any

from clawstack.runs.ledger import RunRecord, Tombstone


def run_status(record: RunRecord) -> dict[str, Any]:
    """The spec's status fields of ``record``; ``capture_epoch`` and its time only when an epoch was observed."""
    result: dict[str, Any] | None = None
    if record.result_bytes is not None:
        result = {"bytes": record.result_bytes, "truncated": record.result_truncated}
        if record.result_outcome is not None:  # a task-home run's result says what it is and where it lives
            result |= {"outcome": record.result_outcome, "session": record.result_session}
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
        "failure_detail": record.failure_detail,
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
        "isolation": _isolation(record.isolation),
    }
    if record.served_by is not None:  # a task-home run whose proxy reported which credentials served it
        body["served_by"] = dict(record.served_by)
        body["served_by_complete"] = bool(record.served_by_complete)
        if record.last_plan_failure is not None:
            body["last_plan_failure"] = record.last_plan_failure
    if record.capture_epoch is not None:
        body["capture_epoch"] = record.capture_epoch
        body["capture_epoch_observed_at"] = record.capture_epoch_observed_at
    return body


def tombstone_status(stone: Tombstone) -> dict[str, Any]:
    """The status of a key that was cancelled before any launch was accepted (a tombstone): every field a run's
    status has, ``state`` null (no run exists), ``cancelled`` true, nothing spent or started, and ``tombstone``
    true."""
    return {
        "installation": stone.installation,
        "run_id": stone.run_id,
        "generation": stone.generation,
        "state": None,
        "cancelled": True,
        "spec_digest": None,
        "template": None,
        "template_id": None,
        "models": [],
        "run_agent_id": None,
        "revoked": False,
        "revocation_proof": None,
        "exit_code": None,
        "failure": None,
        "failure_detail": None,
        "result": None,
        "credential": "none",
        "callbacks": {"start": "skipped", "end": "skipped"},
        "deadline": None,
        "authority_expires_at": None,
        "accepted_at": None,
        "started_at": None,
        "exited_at": None,
        "ended_at": None,
        "pending": None,
        "isolation": None,
        "tombstone": True,
    }


def _isolation(recorded: dict[str, Any] | str | None) -> dict[str, Any] | None:
    if isinstance(recorded, str):  # an older ledger recorded the mechanism alone, always under the local backend
        return {"backend": "local", "mechanism": recorded, "enforced": []}
    return recorded


__all__ = ["run_status", "tombstone_status"]
