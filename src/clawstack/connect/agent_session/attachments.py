"""The attachment record: ClawConnect's one normalised record of a managed session a conversation is attached to.

A conversation (a gateway session key) has at most one ``current`` attachment. Re-attaching the current session
refreshes it; any other attach, and every replace, mints a new record chained by ``replacesAttachmentId`` and
marks the old one ``superseded`` with its reason; detach marks it ``detached``. Records are never deleted.

The record keeps the last state a runtime (or the host's marker) *reported* apart from the last call's error: a
failed call sets ``last_error`` and never changes ``reported_state`` or ``observation``. Read back after a failed
read (``inspect``), a record shows ``state: "unavailable"`` (could not be reached from here, not evidence that the
session failed) and carries the reported state as ``lastReportedState``; a failed ``continue`` or ``detach`` leaves
``state`` alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from clawstack.connect.agent_session.normalize import Observation, clean_metadata, normalize_state
from clawstack.connect.agent_session.types import AgentSessionRef, State, is_runtime_id

AttachmentStatus = Literal["current", "superseded", "detached"]
ATTACHMENT_STATUSES: Final[tuple[AttachmentStatus, ...]] = ("current", "superseded", "detached")


@dataclass(frozen=True, slots=True)
class Attachment:
    """One attachment record; times are epoch milliseconds."""

    attachment_id: str
    session_key: str
    runtime: str
    session_id: str
    created_at_ms: int
    updated_at_ms: int
    status: AttachmentStatus = "current"
    provider: str | None = None
    provider_session_id: str | None = None
    host: str | None = None
    remote_url: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    reported_state: State | None = None
    observation: Observation | None = None
    observed_at_ms: int | None = None
    last_error: Mapping[str, Any] | None = None
    observation_token: int = 0
    delegated_turn_id: str | None = None
    replaces_attachment_id: str | None = None
    superseded_by: str | None = None
    reason: str | None = None
    owner: str | None = None
    """The owner key of the caller whose conversation made the attachment (``None`` on a record written before
    attachments had owners: it belongs to its conversation's owner)."""

    @property
    def ref(self) -> AgentSessionRef:
        """The session as ClawConnect was told about it: identity always comes from here."""
        return AgentSessionRef(
            runtime=self.runtime,
            session_id=self.session_id,
            provider=self.provider,
            provider_session_id=self.provider_session_id,
            host=self.host,
            remote_url=self.remote_url,
            metadata=dict(self.metadata),
        )

    @property
    def read_failed(self) -> bool:
        """Whether the last read (``inspect``) of the session failed; a failed ``continue`` or ``detach`` is not one."""
        return self.last_error is not None and self.last_error.get("operation") == "inspect"

    @property
    def state(self) -> State:
        """The state as read now: ``unavailable`` after a failed read, else the last reported (or ``unknown``)."""
        if self.read_failed:
            return "unavailable"
        return self.reported_state or "unknown"

    def to_record(self) -> dict[str, Any]:
        """The stored JSON form."""
        return {
            "attachmentId": self.attachment_id,
            "sessionKey": self.session_key,
            "runtime": self.runtime,
            "sessionId": self.session_id,
            "createdAtMs": self.created_at_ms,
            "updatedAtMs": self.updated_at_ms,
            "status": self.status,
            "provider": self.provider,
            "providerSessionId": self.provider_session_id,
            "host": self.host,
            "remoteUrl": self.remote_url,
            "metadata": dict(self.metadata),
            "reportedState": self.reported_state,
            "observation": None if self.observation is None else self.observation.to_json(),
            "observedAtMs": self.observed_at_ms,
            "lastError": None if self.last_error is None else dict(self.last_error),
            "observationToken": self.observation_token,
            "delegatedTurnId": self.delegated_turn_id,
            "replacesAttachmentId": self.replaces_attachment_id,
            "supersededBy": self.superseded_by,
            "reason": self.reason,
            "owner": self.owner,
        }


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(key)
    return value


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(key)
    return value


def from_record(data: object) -> Attachment:
    """An :class:`Attachment` from its stored JSON form; :class:`ValueError` for a record that is not one."""
    if not isinstance(data, dict):
        raise ValueError("record")
    runtime, session_id, key = data.get("runtime"), data.get("sessionId"), data.get("sessionKey")
    attachment_id = data.get("attachmentId")
    if not is_runtime_id(runtime) or not isinstance(session_id, str) or not session_id:
        raise ValueError("identity")
    if not isinstance(key, str) or not key or not isinstance(attachment_id, str) or not attachment_id:
        raise ValueError("keys")
    status = data.get("status")
    if status not in ATTACHMENT_STATUSES:
        raise ValueError("status")
    reported = data.get("reportedState")
    observation = data.get("observation")
    error = data.get("lastError")
    observed_at = data.get("observedAtMs")
    return Attachment(
        attachment_id=attachment_id,
        session_key=key,
        runtime=str(runtime),
        session_id=session_id,
        created_at_ms=_int(data, "createdAtMs"),
        updated_at_ms=_int(data, "updatedAtMs"),
        status=status,
        provider=_opt_str(data, "provider"),
        provider_session_id=_opt_str(data, "providerSessionId"),
        host=_opt_str(data, "host"),
        remote_url=_opt_str(data, "remoteUrl"),
        metadata=clean_metadata(data.get("metadata")),
        reported_state=None if reported is None else normalize_state(reported),
        observation=Observation.from_json(observation) if isinstance(observation, dict) else None,
        observed_at_ms=observed_at if isinstance(observed_at, int) and not isinstance(observed_at, bool) else None,
        last_error=dict(error) if isinstance(error, dict) else None,
        observation_token=_int(data, "observationToken"),
        delegated_turn_id=_opt_str(data, "delegatedTurnId"),
        replaces_attachment_id=_opt_str(data, "replacesAttachmentId"),
        superseded_by=_opt_str(data, "supersededBy"),
        reason=_opt_str(data, "reason"),
        owner=_opt_str(data, "owner"),
    )


__all__ = ["ATTACHMENT_STATUSES", "Attachment", "AttachmentStatus", "from_record"]
