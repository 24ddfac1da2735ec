"""What the tools show of a job: the task snapshot at each ``detail`` level, list previews, log lines.

The prompt (``task``, ``context``, ``senderName`` and the message sent) appears only at ``detail: "prompt"``.
``agentSession`` is the conversation's current agent-session attachment (``None`` without one; list previews always
carry ``None``); ``resultSource`` is ``"parent"`` for an answer from the gateway's own agent and
``"agent-session"`` for one recovered from the attached session.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from clawstack.connect.jobs import Job, LogEntry

Detail = Literal["core", "summary", "updates", "artifacts", "diagnostics", "prompt", "full"]
PREVIEW_CHARS: Final = 500
POLL_RETRY_AFTER_MS: Final = 2000


def iso_ms(value_ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds, or ``None``."""
    if value_ms is None:
        return None
    moment = datetime.fromtimestamp(value_ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def next_action(job: Job) -> dict[str, Any] | None:
    """The call that follows a running job; ``None`` once it is terminal."""
    if job.terminal:
        return None
    return {"tool": "check_task", "args": {"jobId": job.job_id, "sessionKey": job.session_key}}


def log_line(entry: LogEntry) -> dict[str, Any]:
    return {"index": entry.index, "at": iso_ms(entry.at_ms), "kind": entry.kind, "message": entry.message}


@dataclass(frozen=True, slots=True)
class Observed:
    """What the service knows about a job beyond its record: how its gateway connection is doing."""

    liveness: str
    gateway: dict[str, Any]


def core(job: Job, now_ms: int, agent_session: dict[str, Any] | None = None) -> dict[str, Any]:
    end = job.ended_at_ms if job.ended_at_ms is not None else now_ms
    return {
        "jobId": job.job_id,
        "taskId": job.task_id,
        "sessionKey": job.session_key,
        "agent": job.agent,
        "status": job.status,
        "createdAt": iso_ms(job.created_at_ms),
        "updatedAt": iso_ms(job.updated_at_ms),
        "endedAt": iso_ms(job.ended_at_ms),
        "elapsedMs": max(0, end - job.created_at_ms),
        "terminalReason": job.terminal_reason,
        "resultSource": job.result_source,
        "parentRunId": job.run_id,
        "agentSession": agent_session,
        "isTerminal": job.terminal,
        "isError": job.status == "error",
    }


def summary_fields(job: Job, observed: Observed) -> dict[str, Any]:
    return {
        "summary": job.summary,
        "error": job.error,
        "errorInfo": job.error_info,
        "liveness": "ended" if job.terminal else observed.liveness,
        "continuePolling": not job.terminal,
        "retryAfterMs": None if job.terminal else POLL_RETRY_AFTER_MS,
        "nextAction": next_action(job),
        "logCursor": job.log_count,
    }


def task_snapshot(
    job: Job, observed: Observed, logs: list[LogEntry], now_ms: int, *, agent_session: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``check_task`` answer: core and summary fields plus the given log lines."""
    return {
        **core(job, now_ms, agent_session),
        **summary_fields(job, observed),
        "logs": [log_line(entry) for entry in logs],
    }


def detail_snapshot(
    job: Job,
    detail: Detail,
    observed: Observed,
    logs: list[LogEntry] | None,
    now_ms: int,
    *,
    agent_session: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``get_task`` answer at ``detail`` (``logs`` are needed for ``updates`` and ``full``)."""
    result = core(job, now_ms, agent_session)
    result["detail"] = detail
    if detail == "core":
        return result
    if detail == "prompt":
        result["prompt"] = {**job.prompt, "message": job.message}
        return result
    result.update(summary_fields(job, observed))
    if detail in ("updates", "full"):
        result["logs"] = [log_line(entry) for entry in logs or []]
    if detail in ("artifacts", "full"):
        # The gateway protocol's chat messages carry text only; the answer is the summary.
        result["artifacts"] = []
    if detail in ("diagnostics", "full"):
        result["diagnostics"] = {
            "runId": job.run_id,
            "openclawAgentId": job.openclaw_agent_id,
            "submitted": job.submitted,
            "recoveries": job.recoveries,
            "logCount": job.log_count,
            "caller": job.caller,
            "gateway": observed.gateway,
        }
    return result


def preview(job: Job, now_ms: int) -> dict[str, Any]:
    """A job in a list: core fields with the first 500 characters of its summary."""
    text = job.summary or ""
    return {
        **core(job, now_ms),
        "summary": text[:PREVIEW_CHARS] if job.summary is not None else None,
        "summaryTruncated": len(text) > PREVIEW_CHARS,
        "error": job.error,
    }


__all__ = [
    "PREVIEW_CHARS",
    "Detail",
    "Observed",
    "detail_snapshot",
    "iso_ms",
    "log_line",
    "next_action",
    "preview",
    "task_snapshot",
]
