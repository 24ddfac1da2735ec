"""Reading a run's outcome from gateway frames: the text of a message, the answer in a transcript, whether a run
is still active. Pure functions over the JSON the gateway sends (``chat`` events and ``chat.history``), tolerant of
both our gateway and OpenClaw's (which keeps a message's run id under ``__openclaw``)."""

from __future__ import annotations

from typing import Any, Final

_ACTIVE_STATUSES: Final = frozenset({"running", "started", "queued", "in_flight", "streaming"})


def message_text(message: object) -> str:
    """The text of a message: its string content, or its ``text`` blocks joined."""
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [
        block["text"]
        for block in content
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
    ]
    return "".join(parts)


def _run_id_of(message: dict[str, Any]) -> str | None:
    run_id = message.get("runId")
    if isinstance(run_id, str):
        return run_id
    extra = message.get("__openclaw")
    if isinstance(extra, dict) and isinstance(extra.get("runId"), str):
        return str(extra["runId"])
    return None


def find_answer(history: dict[str, Any], run_id: str) -> str | None:
    """The assistant's answer to ``run_id`` in a ``chat.history`` payload, or ``None`` when there is none.

    An assistant message carrying the run id wins; otherwise the last assistant message after the run's user
    message (``idempotencyKey`` ``<run id>:user``) and before the next user message. An empty answer is ``None``.
    """
    messages = [m for m in history.get("messages") or [] if isinstance(m, dict)]
    tagged = [m for m in messages if m.get("role") == "assistant" and _run_id_of(m) == run_id]
    if tagged:
        return message_text(tagged[-1]) or None
    start = None
    for index, message in enumerate(messages):
        if message.get("role") == "user" and message.get("idempotencyKey") == f"{run_id}:user":
            start = index
    if start is None:
        return None
    answer = None
    for message in messages[start + 1 :]:
        if message.get("role") == "user":
            break
        if message.get("role") == "assistant" and _run_id_of(message) in (None, run_id):
            answer = message_text(message) or answer
    return answer


def run_active(history: dict[str, Any], run_id: str) -> bool | None:
    """Whether the gateway says ``run_id`` is still in flight: ``None`` when the payload does not say."""
    info = history.get("sessionInfo")
    if not isinstance(info, dict):
        return None
    active = info.get("activeRunIds")
    if isinstance(active, list):
        return run_id in active
    if info.get("lastRunId") == run_id and isinstance(info.get("status"), str):
        return info["status"] in _ACTIVE_STATUSES
    return None


__all__ = ["find_answer", "message_text", "run_active"]
