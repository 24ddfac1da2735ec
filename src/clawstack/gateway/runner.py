"""The gateway's runs: recording, driving, announcing and aborting every run, whoever asked for it.

:class:`GatewayRuns` is the one :class:`~clawstack.gateway.dispatch.RunHost` of a gateway. Chat turns
(``chat.send``, channel messages), plugin ``subagent.run`` turns, hook-dispatched turns and HTTP hook turns all
start here: :meth:`GatewayRuns.start` records the run before it answers (a replayed idempotency key answers with the
first run, a reused key with another message is an :class:`~clawstack.gateway.dispatch.IdempotencyConflictError`),
then drives it on the request's lane, one run per session at a time. A chat run's id is its idempotency key, as
on OpenClaw; other runs get a new id.

A channel run whose text names a plugin command runs that command; otherwise the plugins' dispatch hooks may
claim it, and else the agent loop runs the turn. Every agent event and the terminal ``chat`` event (``final``,
``error`` or ``aborted``) go to ``publish(session_key, event, payload)``, which the server fans out to the
session's subscribers. A run that ends ``ok`` with ``announce_to`` set is announced on that requester's session,
and a channel run's answer goes back out on its channel.

Cancelling a run's task (:meth:`GatewayRuns.abort`) takes queued work out at once and lets running work finish its
cleanup; the run is recorded ``aborted`` and an ``aborted`` event is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from clawstack.common.clock import Clock
from clawstack.common.ids import new_uuid
from clawstack.gateway.agent import AgentEvent, AgentLoop, TurnResult, UnknownAgentError
from clawstack.gateway.authority import AuthorityAssertion, AuthorityRevokedError, OperatorAuthority, Revocation
from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.dispatch import (
    GATEWAY_OPERATOR,
    ChannelOutbox,
    IdempotencyConflictError,
    Requester,
    RunRequest,
    SessionOwnerError,
    StartedRun,
    StartStatus,
)
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import parse_session_key
from clawstack.gateway.lanes import Lanes
from clawstack.gateway.plugins import CommandContext, PluginLoader, RegisteredCommand
from clawstack.gateway.plugins.api import CommandRuntimeContext, PluginLifetime
from clawstack.gateway.plugins.complete import invocation_scope
from clawstack.gateway.plugins.hooks import DispatchTurn
from clawstack.gateway.sessions import Message, NewMessage, Run, SessionStore

__all__ = ["ActiveRun", "GatewayRuns", "Publish", "RunsClosedError"]


if TYPE_CHECKING:
    from clawstack.gateway.plugins.native_facade import NativeFacade

_log = logging.getLogger(__name__)

Publish = Callable[[str, str, Mapping[str, Any]], None]
"""``publish(session_key, event, payload)``: send an event to the session's subscribers."""


class RunsClosedError(GatewayError):
    """The gateway is stopping or stopped: no run starts."""

    code = "gateway_unavailable"
    retryable = True


@dataclass(eq=False)
class ActiveRun:
    """A run in flight: its request, task, the last ``seq`` of its events, and who waits for its end.

    ``requester`` is set for runs that came in on a channel (Gateway chat, a channel adapter): their text may be a
    plugin command, and dispatch hooks see them. Background runs (``subagent.run``, hook turns) have none.
    """

    run_id: str
    request: RunRequest
    requester: Requester | None = None
    task: asyncio.Task[None] | None = None
    seq: int = 0
    text: str = ""
    command: RegisteredCommand | None = None
    command_args: str = ""
    builtin: Callable[[], Awaitable[str]] | None = None
    started: bool = False
    entered: bool = False
    """Whether the run's task took its first step (a task cancelled before that never runs its handlers)."""
    revoked: AuthorityRevokedError | None = None
    left_queue: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def session_key(self) -> str:
        return self.request.session_key

    @property
    def agent_id(self) -> str:
        return self.request.agent_id

    @property
    def message(self) -> str:
        return self.request.message


class GatewayRuns:
    """Every run of one gateway (see the module docstring); ``plugins`` is set once the plugins are loaded."""

    def __init__(
        self,
        config: GatewayConfig,
        store: SessionStore,
        agent: AgentLoop,
        lanes: Lanes,
        *,
        clock: Clock,
        publish: Publish,
        channels: Mapping[str, ChannelOutbox],
        authority: OperatorAuthority | None = None,
    ) -> None:
        self._config = config
        self._authority = authority
        self._unsubscribe = None if authority is None else authority.subscribe(self._on_revoked)
        self._store = store
        self._agent = agent
        self._lanes = lanes
        self._clock = clock
        self._publish = publish
        self._channels = channels
        self._active: dict[str, ActiveRun] = {}
        self._closed = False
        self.plugins: PluginLoader | None = None

    def _on_revoked(self, revocations: Sequence[Revocation]) -> None:
        """Work retained under a requester's authority lost it: a run still queued fails at once, visibly; a
        running one refuses at its next admission check."""
        for revocation in revocations:
            run = self._active.get(revocation.work_id)
            if run is not None and not run.started and run.task is not None:
                run.revoked = revocation.error
                if run.entered:
                    run.task.cancel()
                # else: the task's first step sees ``revoked`` and fails the run before it queues.

    def active_run_ids(self, session_key: str) -> list[str]:
        """The ids of the session's runs in flight (queued or running)."""
        return [run.run_id for run in self._active.values() if run.session_key == session_key]

    async def known_run(self, session_key: str, idempotency_key: str) -> bool:
        """Whether a run with this idempotency key is in flight on the session or recorded for it."""
        if self._in_flight(session_key, idempotency_key, idempotency_key) is not None:
            return True
        found = await asyncio.to_thread(self._store.find_by_idempotency_key, session_key, idempotency_key)
        return found is not None

    def busy_sessions(self) -> set[str]:
        """The session keys with a run in flight."""
        return {run.session_key for run in self._active.values()}

    async def abort(self, session_key: str, run_id: str | None = None) -> list[str]:
        """Cancel the session's runs in flight (or only ``run_id``); return once each is recorded ``aborted``."""
        runs = [
            run
            for run in self._active.values()
            if run.session_key == session_key and (run_id is None or run.run_id == run_id)
        ]
        await self._cancel(runs)
        return [run.run_id for run in runs]

    async def close(self) -> None:
        """Refuse new runs, then abort every run in flight."""
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        await self._cancel(list(self._active.values()))

    @staticmethod
    async def _cancel(runs: list[ActiveRun]) -> None:
        if not all(run.entered for run in runs):
            # A task cancelled before its first step never records its end: let those take it first.
            await asyncio.sleep(0)
        tasks = [run.task for run in runs if run.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)

    async def start_run(self, request: RunRequest) -> StartedRun:
        """Record and start a background run (:class:`~clawstack.gateway.dispatch.RunHost`)."""
        parse_session_key(request.session_key)  # SessionKeyError before anything is recorded
        try:
            self._config.agent(request.agent_id)
        except KeyError:
            raise UnknownAgentError(f"no agent {request.agent_id!r} is configured") from None
        return await self.start(request)

    async def start(
        self,
        request: RunRequest,
        *,
        requester: Requester | None = None,
        command: RegisteredCommand | None = None,
        command_args: str = "",
        builtin: Callable[[], Awaitable[str]] | None = None,
    ) -> StartedRun:
        """Record the run and start its task; a replayed idempotency key answers with the first run instead.

        A chat run's id is its idempotency key (as on OpenClaw); other runs get a new id (or the request's
        ``run_id``). ``command`` runs a plugin command instead of an agent turn; ``builtin`` answers with the text
        it returns (a built-in chat command), outside the session's lane.
        """
        if self._closed:
            raise RunsClosedError("the gateway is not running")
        key = str(parse_session_key(request.session_key))
        request = replace(request, session_key=key)
        idem = request.idempotency_key
        if request.run_id is not None:
            run_id = request.run_id
        else:
            run_id = idem if requester is not None and idem is not None else new_uuid()
        in_flight = self._in_flight(key, idem, run_id)
        if in_flight is not None:
            _check_same_request(in_flight.message, request.message)
            return StartedRun(in_flight.run_id, key, "in_flight")
        store = self._store
        if idem is not None:
            existing = await asyncio.to_thread(store.find_by_idempotency_key, key, idem)
            in_flight = self._in_flight(key, idem, run_id)
            if in_flight is not None:
                _check_same_request(in_flight.message, request.message)
                return StartedRun(in_flight.run_id, key, "in_flight")
            if existing is not None:
                first = await asyncio.to_thread(store.find_message, key, f"{existing.run_id}:user")
                if first is not None:
                    _check_same_request(first.content, request.message)
                return StartedRun(existing.run_id, key, _finished_status(existing))
        # Claim the id before the next await, so a concurrent duplicate sees it in flight.
        run = ActiveRun(run_id, request, requester, command=command, command_args=command_args, builtin=builtin)
        self._active[run_id] = run
        created = False
        try:
            session = await asyncio.to_thread(store.get_or_create, key, agent_id=request.agent_id, owner=request.owner)
            # Both ways: a plugin never runs in a session it did not create, and chat, channel, hook and cron
            # runs never land in a plugin-owned one.
            if session.owner != request.owner:
                raise SessionOwnerError("the session belongs to someone else")
            recorded, created = await asyncio.to_thread(store.start_run, run_id, key, idempotency_key=idem)
        finally:
            if not created:
                del self._active[run_id]
                run.done.set()
        if not created:
            return StartedRun(recorded.run_id, key, _finished_status(recorded))
        run.task = asyncio.create_task(self._drive(run))
        return StartedRun(run_id, key, "started")

    def _in_flight(self, session_key: str, idempotency_key: str | None, run_id: str) -> ActiveRun | None:
        run = self._active.get(run_id)
        if run is not None and run.session_key == session_key:
            return run
        if idempotency_key is None:
            return None
        for run in self._active.values():
            if run.session_key == session_key and run.request.idempotency_key == idempotency_key:
                return run
        return None

    async def wait_run(self, run_id: str, timeout_s: float) -> Run | None:
        """Wait up to ``timeout_s`` for the run to end and return its record (:class:`RunHost`)."""
        run = self._active.get(run_id)
        if run is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await run.done.wait()
        return await asyncio.to_thread(self._store.get_run, run_id)

    async def wait_for_start(self, run_id: str) -> bool:
        """Wait until the run in flight leaves its queue (its turn starts) or ends; whether it started.
        ``False`` at once for a run that is not in flight."""
        run = self._active.get(run_id)
        if run is None:
            return False
        left = asyncio.ensure_future(run.left_queue.wait())
        ended = asyncio.ensure_future(run.done.wait())
        try:
            await asyncio.wait({left, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            ended.cancel()
        return run.started

    def is_queued(self, run_id: str) -> bool:
        """Whether the run is in flight and still waiting for its session or a lane slot (:class:`RunHost`)."""
        run = self._active.get(run_id)
        return run is not None and not run.started

    async def _drive(self, run: ActiveRun) -> None:
        """Run the run's turn on its lane; once it has ended, drop it from the runs in flight and wake waiters."""
        run.entered = True
        try:
            await self._drive_turn(run)
        finally:
            self._active.pop(run.run_id, None)
            if self._authority is not None:
                self._authority.release(run.run_id)
            run.done.set()

    async def _drive_turn(self, run: ActiveRun) -> None:
        """Run one turn on the run's lane and send its terminal ``chat`` event."""
        agent, lanes = self._agent, self._lanes
        request = run.request
        options = request.options

        async def on_event(event: AgentEvent) -> None:
            self._on_agent_event(run, event)

        async def turn() -> TurnResult:
            if self._authority is not None:
                # Admission: work retained under a requester's authority runs only while that authority holds.
                self._authority.check_retained(run.run_id)
            run.started = True
            run.left_queue.set()
            if run.builtin is not None:
                await asyncio.to_thread(self._store.mark_running, run.run_id)
                await self._append_user(run)
                return await self._record_reply(run, await run.builtin())
            if run.command is not None:
                return await self._run_command(run, run.command)
            if run.requester is not None and self.plugins is not None and self.plugins.hooks.has_dispatch_hooks():
                claimed = await self._dispatch_hooks(run, run.requester)
                if claimed is not None:
                    return claimed
            return await agent.run_turn(
                run_id=run.run_id,
                session_key=run.session_key,
                agent_id=run.agent_id,
                message=run.message,
                extra_system_prompt=options.extra_system_prompt,
                model=options.model,
                tools_allow=options.tools_allow,
                also_allow=options.also_allow,
                disable_tools=options.disable_tools,
                prompt_mode=options.prompt_mode,
                reasoning_effort=options.reasoning_effort,
                timeout_s=options.timeout_s,
                on_event=on_event,
            )

        early = run.revoked
        if early is not None:  # revoked before this task took its first step
            await self._fail_revoked(run, early)
            return
        try:
            if run.builtin is not None:
                result = await turn()
            else:
                result = await lanes.run(request.lane, run.session_key, turn, reserved=request.reserved)
        except asyncio.CancelledError:
            # Best-effort shutdown step: a run cancelled while queued never reached the agent loop, which records
            # the cancellation of a started run itself; record it too, and tell subscribers.
            if run.revoked is not None:
                await self._fail_revoked(run, run.revoked)
            else:
                await asyncio.to_thread(self._record_aborted, run.run_id)
                self._active.pop(run.run_id, None)
                self._broadcast_chat(run, {"state": "aborted", "stopReason": "aborted"})
            raise
        except Exception as exc:
            if isinstance(exc, GatewayError):
                kind, message = exc.code, exc.message
            else:
                _log.exception("chat run %s failed", run.run_id)
                kind, message = "internal_error", "internal error"
            await asyncio.to_thread(self._record_failed, run.run_id, message)
            self._active.pop(run.run_id, None)
            self._broadcast_chat(
                run,
                {
                    "state": "error",
                    "errorMessage": message,
                    "errorKind": kind,
                    "errorDetail": {"code": kind, "message": message},
                },
            )
            await self._reply_on_channel(run, f"Sorry, that failed: {message}")
            if request.announce_to is not None and request.deliver:
                await self._announce(request.announce_to, run, f"failed: {message}")
            return
        self._active.pop(run.run_id, None)
        if result.status == "ok":
            last = await asyncio.to_thread(self._last_assistant, run)
            stop_reason = "stop" if last is None or last.stop_reason is None else last.stop_reason
            timestamp = self._now_ms() if last is None else last.timestamp_ms
            self._broadcast_chat(
                run, {"state": "final", "stopReason": stop_reason, "message": _assistant(result.text, timestamp)}
            )
            if request.announce_to is not None and request.deliver:
                await self._announce(request.announce_to, run, result.text)
            await self._reply_on_channel(run, result.text)
        else:
            error = result.error
            self._broadcast_chat(
                run,
                {
                    "state": "error",
                    "errorMessage": "" if error is None else error.message,
                    "errorKind": "timeout" if result.status == "timeout" else "error",
                    "errorDetail": None if error is None else error.to_dict(),
                },
            )
            what = "took too long" if result.status == "timeout" else "failed"
            await self._reply_on_channel(run, f"Sorry, the answer {what}: {'' if error is None else error.message}")
            if request.announce_to is not None and request.deliver:
                # As OpenClaw's announce: a failed or timed-out child is delivered too, with its reason.
                reason = "unknown error" if error is None or not error.message else error.message
                outcome = "timed out" if result.status == "timeout" else "failed"
                await self._announce(request.announce_to, run, f"{outcome}: {reason}")

    async def _fail_revoked(self, run: ActiveRun, revoked: AuthorityRevokedError) -> None:
        """Queued work whose requester lost their authority fails, visibly, instead of being aborted."""
        await asyncio.to_thread(self._record_failed, run.run_id, revoked.message)
        # Only once recorded: a waiter that finds the run gone from the runs in flight reads its end.
        self._active.pop(run.run_id, None)
        self._broadcast_chat(
            run,
            {
                "state": "error",
                "errorMessage": revoked.message,
                "errorKind": revoked.code,
                "errorDetail": revoked.to_dict(),
            },
        )
        request = run.request
        if request.announce_to is not None and request.deliver:
            await self._announce(request.announce_to, run, f"failed: {revoked.message}")

    async def _run_command(self, run: ActiveRun, command: RegisteredCommand) -> TurnResult:
        """Run a plugin command as the chat run: record the user message, the reply and the run's end.

        A handler error is recorded as the run's ``error`` and re-raised, which :meth:`_drive` sends as an ``error``
        chat event; cancellation propagates (the caller records ``aborted``).
        """
        store = self._store
        await asyncio.to_thread(store.mark_running, run.run_id)
        await self._append_user(run)
        requester = run.requester
        assertion = None
        if command.require_auth and requester is not None and requester.authenticated and self._authority is not None:
            assertion = self._authority.capture(requester)
        scope = PluginLifetime(command.plugin_id)
        context = CommandContext(
            command.plugin_id,
            command.name,
            run.command_args,
            authenticated=True if requester is None else requester.authenticated,
            channel="gateway" if requester is None else requester.channel,
            sender_id=None if requester is None else requester.sender_id,
            operator=GATEWAY_OPERATOR if requester is None else requester.operator,
            runtime_context=CommandRuntimeContext(subagents=self._command_natives(run, command, scope, assertion)),
            assertion=assertion,
        )
        try:
            # A completion the handler starts belongs to this invocation and ends with it (and so does its facade).
            with invocation_scope(scope):
                reply = await command.handler(context)
        except Exception as exc:
            if isinstance(exc, GatewayError):
                message = f"command /{command.name} failed: [{exc.code}] {exc.message}"
            else:
                _log.warning("command /%s of plugin %s raised %s", command.name, command.plugin_id, type(exc).__name__)
                message = f"command /{command.name} failed: {type(exc).__name__}"
            await asyncio.to_thread(self._record_failed, run.run_id, message)
            raise GatewayError(message, code="plugin_command_failed") from exc
        return await self._record_reply(run, str(reply))

    def _command_natives(
        self,
        run: ActiveRun,
        command: RegisteredCommand,
        scope: PluginLifetime,
        assertion: AuthorityAssertion | None,
    ) -> NativeFacade | None:
        """The command's native children, when it asked for them and this invocation is eligible: a
        ``require_auth`` command, an authorized requester with current operator authority (``assertion``), a tool
        policy with ``sessions_spawn`` and ``agents_wait``. Its input, the command text, is already recorded."""
        host = None if self.plugins is None else self.plugins.hooks.native_host
        requester = run.requester
        if (
            host is None
            or "subagents" not in command.runtime_capabilities
            or not command.require_auth
            or requester is None
            or not requester.authenticated
            or assertion is None
            or not host.allows_spawning(requester.agent_id)
        ):
            return None
        lifetimes = (scope,) if command.lifetime is None else (scope, command.lifetime)
        return host.facade(
            command.plugin_id,
            lifetimes,
            requester,
            parent_run_id=run.run_id,
            record_input=lambda: self._adopt_turn(run),
        )

    async def _dispatch_hooks(self, run: ActiveRun, requester: Requester) -> TurnResult | None:
        """Offer the message to the plugins' dispatch hooks; a claim is recorded as the run's reply."""
        assert self.plugins is not None
        claimed = await self.plugins.hooks.dispatch(
            requester, run.message, turn=DispatchTurn(run.run_id, lambda: self._adopt_turn(run))
        )
        if claimed is None:
            return None
        await asyncio.to_thread(self._store.mark_running, run.run_id)
        await self._append_user(run)
        return await self._record_reply(run, claimed[1])

    async def _adopt_turn(self, run: ActiveRun) -> None:
        """The recorder a dispatch hook's native spawn commits the turn's input through: the run is running and its
        user message is in the transcript (both idempotent: a claim records them again as a no-op)."""
        await asyncio.to_thread(self._store.mark_running, run.run_id)
        await self._append_user(run)

    async def _append_user(self, run: ActiveRun) -> None:
        user = NewMessage("user", run.message, run_id=run.run_id, idempotency_key=f"{run.run_id}:user")
        await asyncio.to_thread(self._store.append, run.session_key, user)

    async def _record_reply(self, run: ActiveRun, text: str) -> TurnResult:
        """Record ``text`` as the run's one assistant message and the run as ``ok``."""
        store = self._store
        content = [{"type": "text", "text": text}]
        assistant = NewMessage(
            "assistant", content, run_id=run.run_id, idempotency_key=f"{run.run_id}:assistant:1", stop_reason="stop"
        )
        await asyncio.to_thread(store.append, run.session_key, assistant)
        await asyncio.to_thread(store.finish_run, run.run_id, "ok")
        return TurnResult("ok", text, None)

    async def _announce(self, to: Requester, run: ActiveRun, text: str) -> None:
        """Deliver a background run's final answer on the requester's session (the announce path).

        The answer is appended to the requester session's transcript (once per run: its idempotency key is
        ``<run_id>:announce``) and sent as a ``chat`` ``final`` event with run id ``<run_id>:announce`` to the
        session's subscribers; a channel requester also gets it on its channel.
        """
        store = self._store
        label = run.request.label or run.session_key
        body = f"[{label}] {text}" if text else f"[{label}] (no answer)"
        message = NewMessage(
            "assistant",
            [{"type": "text", "text": body}],
            run_id=f"{run.run_id}:announce",
            idempotency_key=f"{run.run_id}:announce",
            stop_reason="stop",
        )
        try:
            await asyncio.to_thread(store.get_or_create, to.session_key, agent_id=to.agent_id)
            stored = await asyncio.to_thread(store.append, to.session_key, message)
        except GatewayError as exc:
            _log.warning("announcing run %s on %s failed: [%s] %s", run.run_id, to.session_key, exc.code, exc.message)
            return
        announce = ActiveRun(f"{run.run_id}:announce", RunRequest(to.session_key, to.agent_id, "", "main"))
        self._broadcast_chat(
            announce, {"state": "final", "stopReason": "stop", "message": _assistant(body, stored.timestamp_ms)}
        )
        channel = self._channels.get(to.channel)
        if channel is not None:
            await channel.deliver(to, body, run_id=announce.run_id)

    async def _reply_on_channel(self, run: ActiveRun, text: str) -> None:
        """Send a channel run's final answer back on the channel it came in on (Gateway chat has its events)."""
        requester = run.requester
        channel = None if requester is None else self._channels.get(requester.channel)
        if channel is not None and requester is not None:
            await channel.deliver(requester, text, run_id=run.run_id)

    def _record_aborted(self, run_id: str) -> None:
        store = self._store
        current = store.get_run(run_id)
        if current is not None and current.active:
            store.finish_run(run_id, "aborted", "the run was cancelled")

    def _record_failed(self, run_id: str, message: str) -> None:
        store = self._store
        current = store.get_run(run_id)
        if current is not None and current.active:
            store.finish_run(run_id, "error", message)

    def _last_assistant(self, run: ActiveRun) -> Message | None:
        page = self._store.history(run.session_key, limit=1)
        for message in page.messages:
            if message.role == "assistant" and message.run_id == run.run_id:
                return message
        return None

    def _on_agent_event(self, run: ActiveRun, event: AgentEvent) -> None:
        run.seq = event.seq
        payload = {
            "runId": event.run_id,
            "sessionKey": event.session_key,
            "agentId": event.agent_id,
            "stream": event.stream,
            "data": dict(event.data),
            "seq": event.seq,
            "ts": self._now_ms(),
        }
        if event.seq == 1:
            # A run's first event: the session's chat metadata (active run, last activity) has changed.
            self._publish(run.session_key, "chat.metadata.changed", {})
        if event.stream == "run_status":
            # As on OpenClaw, the chat view of a run status comes just before the agent event.
            self._broadcast_chat(run, {"state": "status", "phase": str(event.data.get("phase", ""))})
        self._publish(run.session_key, "agent", payload)
        if event.stream == "assistant":
            text = str(event.data.get("text", ""))
            run.text = text
            self._broadcast_chat(
                run,
                {
                    "state": "delta",
                    "deltaText": str(event.data.get("delta", "")),
                    "message": _assistant(text, self._now_ms()),
                },
            )

    def _broadcast_chat(self, run: ActiveRun, fields: Mapping[str, Any]) -> None:
        payload = {
            "runId": run.run_id,
            "sessionKey": run.session_key,
            "agentId": run.agent_id,
            "seq": run.seq,
            **fields,
        }
        self._publish(run.session_key, "chat", payload)


def _assistant(text: str, timestamp_ms: int) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "timestamp": timestamp_ms}


def _check_same_request(first: object, again: str) -> None:
    """A replayed idempotency key must carry the message it first came with."""
    if first != again:
        raise IdempotencyConflictError("this idempotency key already started a run with a different message")


def _finished_status(run: Run) -> StartStatus:
    """The ``status`` a retried ``chat.send`` gets for a run no longer in flight: its terminal state."""
    state = run.state
    if state == "accepted" or state == "running":
        return "in_flight"
    return state
