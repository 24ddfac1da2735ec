"""Following one gateway run to its end: submit it, read its events, reconcile with the transcript.

A :class:`RunFollower` drives one job. It sends ``chat.send`` (retried with the same idempotency key after a
transport loss), then reads the run's ``chat`` and ``agent`` events. When the socket comes back after a loss, when
the run has been quiet for ``stall_check_s``, or when ClawConnect restarted, it **reconciles**: the answer in the
gateway's transcript (``chat.history``) ends the job; a run the gateway says is still active is waited for; a run
that is neither is asked about by sending ``chat.send`` again with the same key, which the gateway answers with the
run's end (``ok``, ``error``, ``timeout``, ``aborted``, ``interrupted``) and never with a second run. A failed read
is never recorded as the failure of the task: the job stays ``running`` and is reconciled again later.

The outcome is an :class:`Outcome`: the job's terminal ``status`` and the ``terminalReason`` saying how it ended:

=================== ======================== ==============================================================
``terminalReason``  ``status``               meaning
=================== ======================== ==============================================================
``final``           ``completed``            the run's ``final`` event carried the answer
``transcript``      ``completed``            the answer was read from the gateway's transcript
``empty_reply``     ``completed_no_summary`` the run ended well without any answer text
``run_error``       ``error``                the run failed (the gateway's error is in ``errorInfo``)
``run_timeout``     ``error``                the run timed out on the gateway
``interrupted``     ``error``                the gateway stopped while the run was in flight
``send_refused``    ``error``                the gateway refused ``chat.send``
``aborted``         ``cancelled``            the run was aborted on the gateway
=================== ======================== ==============================================================
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from clawstack.connect.errors import GatewayError, GatewayRequestError
from clawstack.connect.gateway_client import GatewayClient, RunWatch
from clawstack.connect.jobs import Job, JobStatus
from clawstack.connect.transcript import find_answer, message_text, run_active

DEFAULT_STALL_CHECK_S: Final = 30.0
HISTORY_LIMIT: Final = 200
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended."""

    status: JobStatus
    terminal_reason: str
    summary: str | None = None
    error: str | None = None
    error_info: dict[str, Any] | None = None

    @property
    def result_source(self) -> str | None:
        return "parent" if self.status == "completed" else None


def _completed(text: str | None, reason: str) -> Outcome:
    if text:
        return Outcome("completed", reason, summary=text)
    return Outcome("completed_no_summary", "empty_reply")


def _failed(reason: str, code: str, message: str, detail: object = None) -> Outcome:
    info: dict[str, Any] = {"code": code, "message": message}
    if detail is not None:
        info["detail"] = detail
    status: JobStatus = "cancelled" if reason == "aborted" else "error"
    return Outcome(status, reason, error=message, error_info=info)


Logger = Callable[[str, str], Awaitable[None]]
"""``log(kind, message)``: add a line to the job's log."""


class RunFollower:
    """Follows one job's gateway run; :meth:`follow` returns its :class:`Outcome`.

    ``on_submitted`` is awaited once the gateway has accepted the run; ``on_activity`` on every event.
    """

    def __init__(
        self,
        job: Job,
        client: GatewayClient,
        *,
        log: Logger,
        on_submitted: Callable[[], Awaitable[None]],
        on_activity: Callable[[], None],
        stall_check_s: float = DEFAULT_STALL_CHECK_S,
    ) -> None:
        self.job = job
        self.client = client
        self._log = log
        self._on_submitted = on_submitted
        self._on_activity = on_activity
        self._stall_check_s = stall_check_s
        self._submitted = job.submitted

    async def follow(self, *, recovering: bool = False) -> Outcome:
        watch = self.client.watch(self.job.run_id, self.job.session_key)
        try:
            if recovering and self._submitted:
                outcome = await self._reconcile()
            else:
                outcome = await self._submit()
            while outcome is None:
                outcome = await self._next(watch)
            return outcome
        finally:
            self.client.unwatch(watch)

    async def _next(self, watch: RunWatch) -> Outcome | None:
        event = await watch.next(self._stall_check_s)
        if event is None:
            return await self._reconcile() if self.client.connected else None
        self._on_activity()
        if event.kind == "chat":
            return await self._on_chat(event.payload)
        if event.kind == "agent":
            await self._on_agent(event.payload)
        elif event.kind == "disconnected":
            await self._log("connection", "the connection to the gateway was lost; reconnecting")
        elif event.kind == "reconnected":
            await self._log("connection", "reconnected to the gateway; checking the run")
            return await self._reconcile()
        return None

    # -- submission and reconciliation -----------------------------------------------------------------------

    async def _submit(self) -> Outcome | None:
        try:
            answer = await self.client.chat_send(self.job.session_key, self.job.message, self.job.run_id)
        except GatewayRequestError as exc:
            return _failed("send_refused", exc.code, exc.message or "the gateway refused chat.send", exc.details)
        return await self._on_send_answer(answer)

    async def _on_send_answer(self, answer: dict[str, Any]) -> Outcome | None:
        status = answer.get("status")
        if status in ("started", "in_flight"):
            if not self._submitted:
                self._submitted = True
                await self._on_submitted()
                await self._log("gateway", f"the gateway accepted the run ({status})")
            return None
        if status == "ok":
            return _completed(await self._transcript_answer(), "transcript")
        if status == "aborted":
            return _failed("aborted", "run_aborted", "the run was aborted on the gateway")
        if status == "interrupted":
            return _failed("interrupted", "run_interrupted", "the gateway stopped while the run was in flight")
        if status == "timeout":
            return _failed("run_timeout", "run_timeout", "the run timed out on the gateway")
        if status == "error":
            return _failed("run_error", "run_error", "the run failed on the gateway")
        _log.warning("chat.send answered an unknown status; waiting for events")
        return None

    async def _transcript_answer(self) -> str | None:
        try:
            history = await self.client.chat_history(self.job.session_key, limit=HISTORY_LIMIT)
        except GatewayError:
            return None
        return find_answer(history, self.job.run_id)

    async def _reconcile(self) -> Outcome | None:
        """See the module docstring; ``None`` means keep waiting."""
        try:
            history = await self.client.chat_history(self.job.session_key, limit=HISTORY_LIMIT)
        except GatewayError as exc:
            _log.info("reconcile of run %s postponed: %s", self.job.run_id, exc.code)
            return None
        answer = find_answer(history, self.job.run_id)
        if answer is not None:
            return _completed(answer, "transcript")
        if run_active(history, self.job.run_id):
            return None
        params = {"sessionKey": self.job.session_key, "message": self.job.message, "idempotencyKey": self.job.run_id}
        try:
            reply = await self.client.request("chat.send", params)
        except GatewayRequestError as exc:
            return _failed("send_refused", exc.code, exc.message or "the gateway refused chat.send", exc.details)
        except GatewayError as exc:
            _log.info("reconcile of run %s postponed: %s", self.job.run_id, exc.code)
            return None
        return await self._on_send_answer(reply)

    # -- events ----------------------------------------------------------------------------------------------

    async def _on_chat(self, payload: dict[str, Any]) -> Outcome | None:
        state = payload.get("state")
        if state == "final":
            text = message_text(payload.get("message"))
            if text:
                return Outcome("completed", "final", summary=text)
            return _completed(await self._transcript_answer(), "transcript")
        if state == "error":
            kind = str(payload.get("errorKind") or "error")
            message = str(payload.get("errorMessage") or "the run failed on the gateway")
            reason = "run_timeout" if kind == "timeout" else "run_error"
            return _failed(reason, kind, message, payload.get("errorDetail"))
        if state == "aborted":
            return _failed("aborted", "run_aborted", "the run was aborted on the gateway")
        return None

    async def _on_agent(self, payload: dict[str, Any]) -> None:
        stream = payload.get("stream")
        raw = payload.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        phase = data.get("phase")
        if stream == "lifecycle" and phase == "start":
            await self._log("agent", "the agent started the run")
        elif stream == "lifecycle" and phase == "model":
            await self._log("agent", f"model call (round {data.get('round', '?')})")
        elif stream == "tool" and phase == "start":
            await self._log("tool", f"tool {str(data.get('name', '?'))[:64]} started")
        elif stream == "tool" and phase == "result":
            verb = "failed" if data.get("isError") else "finished"
            await self._log("tool", f"tool {str(data.get('name', '?'))[:64]} {verb}")


__all__ = ["DEFAULT_STALL_CHECK_S", "Outcome", "RunFollower"]
