"""What a task snapshot derives from an attachment record: the ``agentSession`` field, the answer a delegated turn
may recover from its session, and the actionable summary of a session blocked on a human.

All three are pure functions of a stored record; nothing here reads a runtime or writes the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from clawstack.connect.agent_session.attachments import Attachment
from clawstack.connect.agent_session.types import BLOCKED_STATES, COMPLETED_TURN_STATES
from clawstack.connect.snapshots import iso_ms

RESULT_SOURCE: Final = "agent-session"
RECOVERED_REASON: Final = "agent_session"


def recovered_answer(attachment: Attachment, *, turn_id: str, status: str, started_at_ms: int) -> str | None:
    """The answer a delegated turn's session gave, when ClawConnect may use it: the gateway's own agent gave none
    (``completed_no_summary``), the turn is the one that delegated, the session's turn completed (``idle`` or
    ``completed``), and the answer is dated after the job started."""
    observation = attachment.observation
    if (
        status != "completed_no_summary"
        or attachment.status != "current"
        or attachment.delegated_turn_id != turn_id
        or observation is None
        or observation.state not in COMPLETED_TURN_STATES
        or observation.final_response is None
        or observation.last_event_at_ms is None
        or observation.last_event_at_ms <= started_at_ms
    ):
        return None
    return observation.final_response


def action_required(attachment: Attachment) -> bool:
    """Whether the session last reported being blocked on a human; a failed read since does not hide that."""
    return attachment.reported_state in BLOCKED_STATES


def blocked_summary(attachment: Attachment) -> str | None:
    """An actionable summary for a session blocked on a human, or ``None``."""
    state = attachment.reported_state
    if state is None or not action_required(attachment):
        return None
    what = "input" if state == "needs_input" else "a permission decision"
    where = f"; open {attachment.remote_url}" if attachment.remote_url else ""
    return (
        f"Action required ({state}): the attached agent session {attachment.session_id} in runtime "
        f"{attachment.runtime} is waiting for {what}{where}."
    )


def render(attachment: Attachment, capabilities: Iterable[str]) -> dict[str, Any]:
    """The ``agentSession`` field of a snapshot; ``capabilities`` are the registered runtime's."""
    observation = attachment.observation
    return {
        "attachmentId": attachment.attachment_id,
        "status": attachment.status,
        "runtime": attachment.runtime,
        "sessionId": attachment.session_id,
        "provider": attachment.provider,
        "providerSessionId": attachment.provider_session_id,
        "host": attachment.host,
        "remoteUrl": attachment.remote_url,
        "metadata": dict(attachment.metadata),
        "state": attachment.state,
        "lastReportedState": attachment.reported_state,
        "actionRequired": action_required(attachment),
        "observation": None
        if observation is None
        else {**observation.to_json(), "observedAt": iso_ms(attachment.observed_at_ms)},
        "lastError": None if attachment.last_error is None else dict(attachment.last_error),
        "observationToken": attachment.observation_token,
        "delegatedTurnId": attachment.delegated_turn_id,
        "replacesAttachmentId": attachment.replaces_attachment_id,
        "reason": attachment.reason,
        "capabilities": sorted(capabilities),
        "attachedAt": iso_ms(attachment.created_at_ms),
        "updatedAt": iso_ms(attachment.updated_at_ms),
    }


__all__ = ["RECOVERED_REASON", "RESULT_SOURCE", "action_required", "blocked_summary", "recovered_answer", "render"]
