"""The seam inside ClawConnect: applying a ``run_task``'s directive and reading a conversation's attachment.

:class:`AgentSessions` owns the :class:`~clawstack.connect.agent_session.store.AttachmentStore` (opened at start
when its file exists, created on the first directive, so a deployment that never attaches anything never touches
it) and a :class:`~clawstack.connect.agent_session.dispatch.Dispatcher` over the injected registry. Nothing here
raises into a tool call: a store or runtime failure is logged and reported, and a task never fails because of it.

**One current session.** A marker or ``attach`` naming the current session refreshes it. A marker naming another
session of the same runtime is an implicit replace (the old record ``superseded``, the new one chained by
``replacesAttachmentId``), as reference hosts expect when they re-send the marker of the session they moved to;
any other attach naming another session while one is current is ignored with a warning (attaching something else
takes an explicit ``replace`` with its reason). The provider recorded is the registered runtime's, never the
marker's; right after an attach the state is the one the host reported in it (attaching calls no runtime).

**Owners.** Every attachment records the owner key of the caller whose conversation made it; a directive acts only
on its caller's own attachment, an attach naming a session that another caller's conversation has attached is
ignored (with a warning), reads answer only the owner, and every callback receives the owner as
``options.caller`` so a host can authorize it.

**Freshness.** Every call out (``inspect``, ``continue``, ``detach``) takes a monotonic ``observationToken``
first; its observation is written only if the attachment is still current, still bound to the same delegated
turn, and the token is newer than the stored one, so a slow read landing after a newer one is discarded. A failed
``continue`` or ``detach`` is recorded as ``lastError`` even after a newer read (no reading supersedes a
command's failure); a failed call never changes the reported state. Tokens resume above the highest stored one
after a restart.

**Reads.** :meth:`AgentSessions.read` answers from the stored record and refreshes it through ``inspect`` in the
background, at most one refresh in flight per attachment, so the next read sees the result; a caller that agreed
to wait may give the refresh a bounded time to land. Reads happen only when a tool call asks (``check_task``,
``get_task``, ``get_session``, ``cancel_task``), write nothing but the observation (state, observation, error,
token) and nothing pushes a managed session's state into a running job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from clawstack.common.clock import Clock
from clawstack.common.ids import new_id
from clawstack.connect.agent_session import views
from clawstack.connect.agent_session.attachments import Attachment
from clawstack.connect.agent_session.directives import Directive
from clawstack.connect.agent_session.dispatch import Dispatcher, DispatchResult
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.agent_session.store import STORE_FILE, AttachmentStore
from clawstack.connect.agent_session.types import ContinueRequest, DetachRequest, Operation
from clawstack.connect.agent_session.views import RECOVERED_REASON, RESULT_SOURCE
from clawstack.connect.errors import ConnectError
from clawstack.connect.snapshots import iso_ms

IMPLICIT_REPLACE_REASON: Final = "the host's marker named another session of the same runtime"
_log = logging.getLogger(__name__)


def _owned(attachment: Attachment, owner: str | None) -> bool:
    """Whether ``owner`` (``None``: any) may read ``attachment``; a record without an owner is its conversation's,
    whose owner the caller has checked."""
    return owner is None or attachment.owner in (None, owner)


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
        self._refreshes: dict[str, asyncio.Task[None]] = {}
        """The refresh in flight per attachment id."""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Rehydrate: open the store if a previous process left one."""
        if self.store.path.exists():
            await self._open()

    async def stop(self) -> None:
        """Abort the refreshes in flight (each callback's signal is set) and close the store."""
        refreshes = list(self._refreshes.values())
        for task in refreshes:
            task.cancel()
        if refreshes:
            await asyncio.wait(refreshes)
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

    async def apply(self, session_key: str, turn_id: str, directive: Directive, task: str, *, owner: str) -> None:
        """Apply ``directive`` for the turn ``turn_id`` (a job id) of conversation ``session_key``, owned by the
        caller whose key is ``owner``; never raises (a caller's cancellation propagates, after the callback it
        interrupted was signalled)."""
        if not await self._open():
            return
        try:
            await self._apply(session_key, turn_id, directive, task, owner)
        except ConnectError as exc:
            _log.error("agent-session %s not applied: [%s] %s", directive.action, exc.code, exc.message)

    async def _apply(self, key: str, turn_id: str, d: Directive, task: str, owner: str) -> None:
        current = await asyncio.to_thread(self.store.current, key)
        if current is not None and current.owner not in (None, owner):
            _log.warning("an agent-session %s was ignored: the conversation's attachment is another caller's", d.action)
            return
        same = current is not None and (
            d.runtime is None or (current.runtime, current.session_id) == (d.runtime, d.session_id)
        )
        implicit = d.from_marker and current is not None and not same and current.runtime == d.runtime
        if d.action == "replace" or (d.action == "attach" and (current is None or implicit)):
            await self._attach_new(key, turn_id, d, owner, implicit=implicit)
            return
        if current is None:
            _log.info("agent-session %s ignored: the conversation has no current attachment", d.action)
            return
        if d.action == "attach" and same:
            await asyncio.to_thread(self.store.update_current, key, current.attachment_id, self._refresh(d, turn_id))
            return
        if d.action == "attach":
            # Names no value (the ids are the host's); the conversation keeps its session.
            _log.warning(
                "an agent-session %s was ignored: it names another session than the conversation's current one, "
                "and attaching something else takes an explicit replace",
                "marker" if d.from_marker else "attach directive",
            )
            return
        if not same:
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

    async def _attach_new(self, key: str, turn_id: str, d: Directive, owner: str, *, implicit: bool) -> None:
        assert d.runtime is not None
        assert d.session_id is not None
        elsewhere = await asyncio.to_thread(self.store.current_elsewhere, d.runtime, d.session_id, key)
        if any(other.owner != owner for other in elsewhere):
            # Names no value: whether another caller attached that session is theirs to know.
            _log.warning(
                "an agent-session %s was ignored: the session is attached to another caller's conversation", d.action
            )
            return
        reason = IMPLICIT_REPLACE_REASON if implicit else d.reason if d.action == "replace" else None
        await asyncio.to_thread(self.store.attach, self._new(key, turn_id, d, owner, reason), supersede_reason=reason)

    def _new(self, key: str, turn_id: str, d: Directive, owner: str, reason: str | None) -> Attachment:
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
            provider=entry.provider if entry is not None else None,
            provider_session_id=d.provider_session_id,
            host=d.host,
            remote_url=d.remote_url,
            metadata=dict(d.metadata),
            reported_state=d.state,
            observation_token=self._token(),
            delegated_turn_id=turn_id,
            reason=reason,
            owner=owner,
        )

    def _refresh(self, d: Directive, turn_id: str) -> Callable[[Attachment], Attachment]:
        token, now = self._token(), self._now_ms()

        def update(a: Attachment) -> Attachment:
            return dataclasses.replace(
                a,
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
        token = self._token()  # taken before calling out, as for every call
        if d.stop_runtime:
            request = DetachRequest(d.reason or "", True)
            result = await self.dispatcher.dispatch(
                "detach", current.ref, request, last_state=current.reported_state, caller=current.owner
            )
            await self._write(current, current.delegated_turn_id, token, result)

        def update(a: Attachment) -> Attachment:
            return dataclasses.replace(
                a, reason=d.reason, observation_token=max(token, a.observation_token), updated_at_ms=self._now_ms()
            )

        await asyncio.to_thread(self.store.detach, current.session_key, current.attachment_id, update)

    # -- calls and reads ---------------------------------------------------------------------------------------

    def _observe(self, result: DispatchResult) -> Callable[[Attachment], Attachment]:
        """What a call's result writes: the observation, or the error (the reported state is kept)."""
        now = self._now_ms()

        def update(a: Attachment) -> Attachment:
            if result.error is not None:
                error = {**result.error.to_json(), "operation": result.operation, "at": iso_ms(now)}
                return dataclasses.replace(a, last_error=error, updated_at_ms=now)
            # Reaching the session answers a failed read, not another operation's failure.
            previous = a.last_error
            kept = None if previous is None or previous.get("operation") in (result.operation, "inspect") else previous
            observation = result.observation
            return dataclasses.replace(
                a,
                reported_state=observation.state,
                observation=observation,
                observed_at_ms=now,
                last_error=kept,
                updated_at_ms=now,
            )

        return update

    async def _write(
        self, attachment: Attachment, turn_id: str | None, token: int, result: DispatchResult
    ) -> Attachment | None:
        # A failed continue or detach is a command's outcome, which no newer reading supersedes.
        commanded_failure = not result.ok and result.operation != "inspect"
        return await asyncio.to_thread(
            self.store.write_if_fresh,
            attachment.session_key,
            attachment.attachment_id,
            turn_id,
            token,
            self._observe(result),
            require_newer=not commanded_failure,
        )

    async def _call(
        self, attachment: Attachment, turn_id: str | None, operation: Operation, request: Any = None
    ) -> Attachment | None:
        token = self._token()  # taken before calling out
        result = await self.dispatcher.dispatch(
            operation, attachment.ref, request, last_state=attachment.reported_state, caller=attachment.owner
        )
        return await self._write(attachment, turn_id, token, result)

    async def read(self, session_key: str, *, wait_s: float = 0.0, owner: str | None = None) -> Attachment | None:
        """The conversation's current attachment, ``None`` when there is none (a keyed lookup: nothing else happens
        for a conversation without one) or, with ``owner``, when it is another caller's.

        The stored record is answered at once and refreshed through ``inspect`` in the background (joining the
        refresh in flight for this attachment, if any); the next read sees the result. With ``wait_s`` the refresh
        gets up to that long (this service's clock) to land first. An attachment whose runtime is not registered is
        refreshed before answering: there is nothing to call, so it cannot block."""
        if not self.store.is_open:
            return None
        try:
            current = await asyncio.to_thread(self.store.current, session_key)
            if current is None or not _owned(current, owner):
                return None
            refresh = self._refresh_in_background(current)
            if current.runtime not in self.registry:
                await asyncio.wait({refresh})
            elif wait_s > 0:
                await self._wait_for_refresh(refresh, wait_s)
            else:
                return current
            return await asyncio.to_thread(self.store.current, session_key)
        except ConnectError as exc:
            _log.error("agent-session read failed: [%s] %s", exc.code, exc.message)
            return None

    async def stored(self, session_key: str, *, owner: str | None = None) -> Attachment | None:
        """The conversation's current attachment as stored (with ``owner``: only when it is that caller's); no
        runtime is called and nothing is refreshed."""
        if not self.store.is_open:
            return None
        try:
            current = await asyncio.to_thread(self.store.current, session_key)
            return current if current is not None and _owned(current, owner) else None
        except ConnectError as exc:
            _log.error("agent-session read failed: [%s] %s", exc.code, exc.message)
            return None

    def _refresh_in_background(self, current: Attachment) -> asyncio.Task[None]:
        running = self._refreshes.get(current.attachment_id)
        if running is not None:
            return running
        task = asyncio.create_task(self._refresh_now(current), name=f"agent-session refresh {current.attachment_id}")
        self._refreshes[current.attachment_id] = task
        task.add_done_callback(functools.partial(self._refresh_done, current.attachment_id))
        return task

    async def _refresh_now(self, current: Attachment) -> None:
        try:
            await self._call(current, current.delegated_turn_id, "inspect")
        except ConnectError as exc:
            _log.error("agent-session refresh not stored: [%s] %s", exc.code, exc.message)

    def _refresh_done(self, attachment_id: str, task: asyncio.Task[None]) -> None:
        if self._refreshes.get(attachment_id) is task:
            del self._refreshes[attachment_id]
        if not task.cancelled() and task.exception() is not None:
            _log.error("agent-session refresh failed unexpectedly", exc_info=task.exception())

    async def _wait_for_refresh(self, refresh: asyncio.Task[None], timeout_s: float) -> None:
        """Wait for ``refresh`` at most ``timeout_s``; never cancels it (other readers may be waiting for it)."""
        sleeper = asyncio.ensure_future(self._clock.sleep(timeout_s))
        try:
            await asyncio.wait({refresh, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()

    async def wait_for_refreshes(self) -> None:
        """Wait until no refresh is in flight (what a test does to see a background refresh land)."""
        while self._refreshes:
            await asyncio.wait(list(self._refreshes.values()))

    async def lineage(self, session_key: str) -> list[Attachment]:
        if not self.store.is_open:
            return []
        return await asyncio.to_thread(self.store.lineage, session_key)

    # -- results ---------------------------------------------------------------------------------------------

    recovered_answer = staticmethod(views.recovered_answer)
    blocked_summary = staticmethod(views.blocked_summary)

    def render(self, attachment: Attachment | None) -> dict[str, Any] | None:
        """The ``agentSession`` field of a snapshot (``None`` without an attachment)."""
        if attachment is None:
            return None
        return views.render(attachment, self.registry.capabilities(attachment.runtime))


__all__ = ["IMPLICIT_REPLACE_REASON", "RECOVERED_REASON", "RESULT_SOURCE", "AgentSessions"]
