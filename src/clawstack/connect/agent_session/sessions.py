"""The seam inside ClawConnect: applying a ``run_task``'s directive and reading a conversation's attachment.

:class:`AgentSessions` owns the :class:`~clawstack.connect.agent_session.store.AttachmentStore` (opened at start
when its file exists, created on the first directive, so a deployment that never attaches anything never touches
it) and a :class:`~clawstack.connect.agent_session.dispatch.Dispatcher` over the injected registry. Nothing here
raises into a tool call: a store or runtime failure is logged and reported, and a task never fails because of it.

**Freshness.** Every call out takes a monotonic ``observationToken`` first; its result is written only if the
attachment is still current, still bound to the same delegated turn, and the token is newer than the stored one,
so a slow read landing after a newer one is discarded. Tokens resume above the highest stored one after a restart.
Reads happen only when a tool call asks (``check_task``, ``get_task``, ``get_session``); nothing pushes a managed
session's state into a running job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from clawstack.common.clock import Clock
from clawstack.common.ids import new_id
from clawstack.connect.agent_session.attachments import Attachment
from clawstack.connect.agent_session.directives import Directive
from clawstack.connect.agent_session.dispatch import Dispatcher, DispatchResult
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.agent_session.store import STORE_FILE, AttachmentStore
from clawstack.connect.agent_session.types import BLOCKED_STATES, COMPLETED_TURN_STATES, ContinueRequest, DetachRequest
from clawstack.connect.errors import ConnectError
from clawstack.connect.snapshots import iso_ms

RESULT_SOURCE: Final = "agent-session"
RECOVERED_REASON: Final = "agent_session"
_log = logging.getLogger(__name__)


class AgentSessions:
    """See the module docstring; ``store_dir`` is the job store's directory."""

    def __init__(
        self, registry: AgentSessionRuntimeRegistry, store_dir: Path, *, clock: Clock, call_timeout_ms: int
    ) -> None:
        self.registry = registry
        self.store = AttachmentStore(store_dir / STORE_FILE)
        self.dispatcher = Dispatcher(registry, call_timeout_ms=call_timeout_ms)
        self._clock = clock
        self._tokens: itertools.count[int] | None = None
        self._lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Rehydrate: open the store if a previous process left one."""
        if self.store.path.exists():
            await self._open()

    async def stop(self) -> None:
        await asyncio.to_thread(self.store.close)

    async def _open(self) -> bool:
        async with self._lock:
            if self.store.is_open:
                return True
            try:
                await asyncio.to_thread(self.store.open)
                highest = await asyncio.to_thread(self.store.max_token)
            except ConnectError as exc:
                _log.error("agent-session attachments are unavailable: [%s] %s", exc.code, exc.message)
                return False
            self._tokens = itertools.count(highest + 1)
            return True

    def _token(self) -> int:
        assert self._tokens is not None
        return next(self._tokens)

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)

    # -- directives --------------------------------------------------------------------------------------------

    async def apply(self, session_key: str, turn_id: str, directive: Directive, task: str) -> None:
        """Apply ``directive`` for the turn ``turn_id`` (a job id) of conversation ``session_key``; never raises."""
        if not await self._open():
            return
        try:
            await self._apply(session_key, turn_id, directive, task)
        except ConnectError as exc:
            _log.error("agent-session %s not applied: [%s] %s", directive.action, exc.code, exc.message)

    async def _apply(self, key: str, turn_id: str, d: Directive, task: str) -> None:
        current = await asyncio.to_thread(self.store.current, key)
        if d.action in ("attach", "replace"):
            same = current is not None and (current.runtime, current.session_id) == (d.runtime, d.session_id)
            if d.action == "attach" and current is not None and same:
                await asyncio.to_thread(
                    self.store.update_current, key, current.attachment_id, self._refresh(d, turn_id)
                )
            else:
                reason = d.reason or "another session was attached"
                await asyncio.to_thread(self.store.attach, self._new(key, turn_id, d), supersede_reason=reason)
            return
        if current is None or (
            d.runtime is not None and (current.runtime, current.session_id) != (d.runtime, d.session_id)
        ):
            _log.info("agent-session %s ignored: it names no current attachment of the conversation", d.action)
            return
        if d.action == "inspect":
            await self._call(current, current.delegated_turn_id, "inspect")
        elif d.action == "continue":
            rebound = await asyncio.to_thread(
                self.store.update_current,
                key,
                current.attachment_id,
                lambda a: dataclasses.replace(a, delegated_turn_id=turn_id, updated_at_ms=self._now_ms()),
            )
            if rebound is not None:
                request = ContinueRequest(d.prompt if d.prompt is not None else task, dict(d.metadata))
                await self._call(rebound, turn_id, "continue", request)
        else:
            await self._detach(current, d)

    def _new(self, key: str, turn_id: str, d: Directive) -> Attachment:
        assert d.runtime is not None
        assert d.session_id is not None
        entry = self.registry.get(d.runtime)
        now = self._now_ms()
        return Attachment(
            attachment_id=new_id("att_"),
            session_key=key,
            runtime=d.runtime,
            session_id=d.session_id,
            created_at_ms=now,
            updated_at_ms=now,
            provider=d.provider or (entry.provider if entry is not None else None),
            provider_session_id=d.provider_session_id,
            host=d.host,
            remote_url=d.remote_url,
            metadata=dict(d.metadata),
            reported_state=d.state,
            observation_token=self._token(),
            delegated_turn_id=turn_id,
            reason=d.reason if d.action == "replace" else None,
        )

    def _refresh(self, d: Directive, turn_id: str) -> Callable[[Attachment], Attachment]:
        token, now = self._token(), self._now_ms()

        def update(a: Attachment) -> Attachment:
            return dataclasses.replace(
                a,
                provider=d.provider or a.provider,
                provider_session_id=d.provider_session_id or a.provider_session_id,
                host=d.host or a.host,
                remote_url=d.remote_url or a.remote_url,
                metadata={**a.metadata, **d.metadata},
                reported_state=d.state or a.reported_state,
                last_error=None if d.state else a.last_error,
                delegated_turn_id=turn_id,
                observation_token=max(token, a.observation_token),
                updated_at_ms=now,
            )

        return update

    async def _detach(self, current: Attachment, d: Directive) -> None:
        result: DispatchResult | None = None
        if d.stop_runtime:
            self._token()
            request = DetachRequest(d.reason or "", True)
            result = await self.dispatcher.dispatch("detach", current.ref, request, last_state=current.reported_state)
        observe = self._observe(result) if result is not None else None

        def update(a: Attachment) -> Attachment:
            a = observe(a) if observe is not None else a
            return dataclasses.replace(a, reason=d.reason, updated_at_ms=self._now_ms())

        await asyncio.to_thread(self.store.detach, current.session_key, current.attachment_id, update)

    # -- reads -------------------------------------------------------------------------------------------------

    def _observe(self, result: DispatchResult) -> Callable[[Attachment], Attachment]:
        now = self._now_ms()

        def update(a: Attachment) -> Attachment:
            if result.error is not None:
                error = {**result.error.to_json(), "operation": result.operation, "at": iso_ms(now)}
                return dataclasses.replace(a, last_error=error, updated_at_ms=now)
            observation = result.observation
            return dataclasses.replace(
                a,
                reported_state=observation.state,
                observation=observation,
                observed_at_ms=now,
                last_error=None,
                updated_at_ms=now,
            )

        return update

    async def _call(
        self, attachment: Attachment, turn_id: str | None, operation: Any, request: Any = None
    ) -> Attachment | None:
        token = self._token()  # taken before calling out
        result = await self.dispatcher.dispatch(
            operation, attachment.ref, request, last_state=attachment.reported_state
        )
        return await asyncio.to_thread(
            self.store.write_if_fresh,
            attachment.session_key,
            attachment.attachment_id,
            turn_id,
            token,
            self._observe(result),
        )

    async def read(self, session_key: str) -> Attachment | None:
        """Inspect the conversation's current attachment (freshness-guarded) and return it as stored afterwards;
        ``None`` when there is none. A keyed lookup: nothing happens for a conversation without one."""
        if not self.store.is_open:
            return None
        try:
            current = await asyncio.to_thread(self.store.current, session_key)
            if current is None:
                return None
            await self._call(current, current.delegated_turn_id, "inspect")
            return await asyncio.to_thread(self.store.current, session_key)
        except ConnectError as exc:
            _log.error("agent-session read failed: [%s] %s", exc.code, exc.message)
            return None

    async def lineage(self, session_key: str) -> list[Attachment]:
        if not self.store.is_open:
            return []
        return await asyncio.to_thread(self.store.lineage, session_key)

    # -- results -----------------------------------------------------------------------------------------------

    @staticmethod
    def recovered_answer(attachment: Attachment, *, turn_id: str, status: str, started_at_ms: int) -> str | None:
        """The answer a delegated turn's session gave, when ClawConnect may use it: the gateway's own agent gave
        none (``completed_no_summary``), the turn is the one that delegated, the session's turn completed, and the
        answer is dated after the job started."""
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

    @staticmethod
    def blocked_summary(attachment: Attachment) -> str | None:
        """An actionable summary for a session blocked on a human, or ``None``."""
        state = attachment.state
        if state not in BLOCKED_STATES:
            return None
        what = "input" if state == "needs_input" else "a permission decision"
        where = f"; open {attachment.remote_url}" if attachment.remote_url else ""
        return (
            f"Action required ({state}): the attached agent session {attachment.session_id} in runtime "
            f"{attachment.runtime} is waiting for {what}{where}."
        )

    def render(self, attachment: Attachment | None) -> dict[str, Any] | None:
        """The ``agentSession`` field of a snapshot."""
        if attachment is None:
            return None
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
            "actionRequired": attachment.state in BLOCKED_STATES,
            "observation": None
            if observation is None
            else {**observation.to_json(), "observedAt": iso_ms(attachment.observed_at_ms)},
            "lastError": None if attachment.last_error is None else dict(attachment.last_error),
            "observationToken": attachment.observation_token,
            "delegatedTurnId": attachment.delegated_turn_id,
            "replacesAttachmentId": attachment.replaces_attachment_id,
            "reason": attachment.reason,
            "capabilities": sorted(self.registry.capabilities(attachment.runtime)),
            "attachedAt": iso_ms(attachment.created_at_ms),
            "updatedAt": iso_ms(attachment.updated_at_ms),
        }


__all__ = ["RECOVERED_REASON", "RESULT_SOURCE", "AgentSessions"]
