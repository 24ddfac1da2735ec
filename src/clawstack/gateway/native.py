"""Native children: one-shot background runs spawned for a requester turn, held in custody until collected.

:class:`NativeChildren` is what the model-facing ``sessions_spawn``, ``agents_wait`` and ``subagents`` tools (and,
later, the plugin-facing native facade) stand on. :meth:`NativeChildren.spawn` checks the spawn policy, records the
child in custody (:mod:`clawstack.gateway.custody`) *before* its run exists, creates the child session
``agent:<agent>:subagent:<uuid>`` (owned by :data:`NATIVE_OWNER`, so no chat, channel, hook or plugin run can land in
it) and starts its run on the ``subagent`` lane. A watcher per child records the completion when the run ends;
children are always collected (collector completion: the result returns to the requester through
:meth:`NativeChildren.wait`), never announced.

Policy (``agents.defaults.subagents``): a requester at depth ``maxSpawnDepth`` or deeper cannot spawn (a user
session is depth 0, its children depth 1, ...); a requester session with ``maxChildrenPerAgent`` children queued or
running cannot spawn more; ``maxConcurrent`` children run at once (the lane), the rest queue; a child's session is
archived ``archiveAfterMinutes`` after it ended (at once with ``cleanup: "delete"``), its custody record and
completion kept. The target agent must be the requester's own or listed in its ``subagents.allowAgents``.

Ownership: a child belongs to the exact parent incarnation that spawned it, the parent's ``session_id`` at that
moment. A reset parent (``/reset``, ``/new``, ``sessions.reset``) is a new incarnation: the old children answer
``not_owner`` to it.

Blind children (``blind``): the child's session is marked blind (its later turns, and children it spawns, stay
blind), its prompts carry no session keys, and ``context: "fork"`` is refused for it.

Errors::

    GatewayError                      (clawstack.gateway.errors)
     └── SpawnRefusedError            spawn_refused: ``status`` ``forbidden`` (policy) or ``error`` (arguments);
                                      the session tools turn it into a tool result, never an exception
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from clawstack.common.clock import Clock
from clawstack.common.ids import new_uuid
from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.custody import NATIVE_OWNER, ChildRecord, ChildStore, Completion, PluginOwner
from clawstack.gateway.dispatch import REASONING_EFFORT_BY_THINKING, THINKING_LEVELS, RunRequest, TurnOptions
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import normalize_agent_id
from clawstack.gateway.sessions import NewMessage, Run, SessionStore, content_text
from clawstack.gateway.tools import ToolPolicy

if TYPE_CHECKING:
    from clawstack.gateway.runner import GatewayRuns

__all__ = [
    "MAX_WAIT_IDS",
    "MAX_WAIT_S",
    "NATIVE_OWNER",
    "NO_TIMEOUT_S",
    "PREVIEW_CHARS",
    "NativeChildren",
    "Parent",
    "SpawnRefusedError",
    "SpawnRequest",
]

_log = logging.getLogger("clawstack.gateway.native")

#: ``agents_wait`` takes at most this many ids, and waits at most this long.
MAX_WAIT_IDS: Final = 1000
MAX_WAIT_S: Final = 300.0
DEFAULT_WAIT_S: Final = 30.0
#: The lifecycle preview of a child's answer (listings); the complete answer comes from collection.
PREVIEW_CHARS: Final = 4096
#: What "no timeout" (``runTimeoutSeconds: 0``) means for a child run: thirty days.
NO_TIMEOUT_S: Final = 30 * 24 * 3600.0
_TASK_NAME: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_RESERVED_TASK_NAMES: Final = frozenset({"last", "all"})
_COMPLETIONS: Final[Mapping[str, Completion]] = {
    "ok": "done",
    "error": "failed",
    "timeout": "timeout",
    "aborted": "killed",
    "interrupted": "failed",
}


class SpawnRefusedError(GatewayError):
    """A spawn the policy refuses (``status`` ``forbidden``) or whose arguments are wrong (``error``)."""

    code = "spawn_refused"

    def __init__(self, message: str, *, status: Literal["forbidden", "error"] = "error") -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Parent:
    """The requester turn: its session and incarnation, agent, run, tool surface, model and blindness."""

    session_key: str
    session_id: str
    agent_id: str
    run_id: str
    tools: tuple[str, ...]
    model: str
    blind: bool = False


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """What a spawn asks for (the ``sessions_spawn`` arguments that apply to a native child)."""

    task: str
    label: str | None = None
    task_name: str | None = None
    agent_id: str | None = None
    model: str | None = None
    thinking: str | None = None
    run_timeout_s: int | None = None
    context: Literal["isolated", "fork"] | None = None
    cleanup: Literal["keep", "delete"] = "keep"
    blind: bool = False
    instructions: str | None = None  # a plugin profile's instructions, added to the child's system prompt
    tools_deny: tuple[str, ...] = ()  # a plugin profile's denies: they only narrow the inherited surface
    profile_record: Mapping[str, str] | None = None  # ``subagentProfile``, recorded on the child session


class NativeChildren:
    """Spawns, watches, collects, lists and kills native children (see the module docstring)."""

    def __init__(
        self, config: GatewayConfig, store: SessionStore, children: ChildStore, runs: GatewayRuns, *, clock: Clock
    ) -> None:
        self._config = config
        self._store = store
        self._children = children
        self._runs = runs
        self._clock = clock
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Condition()
        self._archiver: asyncio.Task[None] | None = None
        self.interrupted: tuple[str, ...] = ()
        """The children a previous process left in flight, recorded ``interrupted`` by :meth:`start`."""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Record children left in flight as interrupted; start archiving ended children's sessions."""
        self.interrupted = tuple(await asyncio.to_thread(self._children.recover, self._now_ms()))
        await self.archive_due()
        if self._config.agents.defaults.subagents.archive_after_minutes > 0:
            self._archiver = asyncio.create_task(self._archive_loop())

    async def close(self) -> None:
        """Stop watching (before the runs are aborted, so a stopping gateway leaves children for :meth:`start` to
        record as interrupted, not killed). Idempotent."""
        tasks = list(self._watchers.values())
        if self._archiver is not None:
            tasks.append(self._archiver)
            self._archiver = None
        self._watchers.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)

    # -- spawn -------------------------------------------------------------------------------------------------

    async def depth_of(self, session_key: str) -> int:
        """The spawn depth of a session: 0 for one that is no native child."""
        record = await asyncio.to_thread(self._children.by_child_key, session_key)
        return 0 if record is None else record.depth

    async def blind_session(self, session_key: str) -> bool:
        """Whether the session is a blind child's."""
        record = await asyncio.to_thread(self._children.by_child_key, session_key)
        return record is not None and record.blind

    async def spawn(
        self, parent: Parent, request: SpawnRequest, *, plugin: PluginOwner | None = None
    ) -> dict[str, Any]:
        """Spawn a child for ``parent``; the accepted receipt (OpenClaw's ``sessions_spawn`` result shape).

        ``plugin`` (a plugin's native facade) is recorded as the child's owner together with its custody record.
        :class:`SpawnRefusedError` when the policy or the arguments refuse it; nothing is recorded then.
        """
        limits = self._config.agents.defaults.subagents
        task = request.task.strip()
        if not task:
            raise SpawnRefusedError("sessions_spawn needs a non-empty task")
        if request.task_name is not None and (
            not _TASK_NAME.fullmatch(request.task_name) or request.task_name in _RESERVED_TASK_NAMES
        ):
            raise SpawnRefusedError('taskName must match [a-z][a-z0-9_-]{0,63} and may not be "last" or "all"')
        if request.label is not None and len(request.label) > 256:
            raise SpawnRefusedError("label is at most 256 characters")
        if request.thinking is not None and request.thinking not in THINKING_LEVELS:
            raise SpawnRefusedError(f"thinking must be one of {', '.join(THINKING_LEVELS)}")
        if request.run_timeout_s is not None and request.run_timeout_s < 0:
            raise SpawnRefusedError("runTimeoutSeconds must be a non-negative integer")
        target = self._target_agent(parent, request.agent_id)
        blind = request.blind or parent.blind
        context = request.context or "isolated"
        if blind and context == "fork":
            raise SpawnRefusedError(
                'a blind child needs context "isolated": a fork carries the requester\'s conversation'
            )
        if context == "fork" and target != parent.agent_id:
            raise SpawnRefusedError("a forked child must run as the requester's own agent")
        depth = await self.depth_of(parent.session_key)
        if depth >= limits.max_spawn_depth:
            raise SpawnRefusedError(
                f"sessions_spawn is not allowed at this depth (current depth: {depth}, max: {limits.max_spawn_depth})",
                status="forbidden",
            )
        active = await asyncio.to_thread(self._children.active_count, parent.session_key)
        if active >= limits.max_children_per_agent:
            raise SpawnRefusedError(
                f"this session already has {active} active children (max: {limits.max_children_per_agent})",
                status="forbidden",
            )
        model, warning = self._child_model(parent, target, request.model)
        if warning is not None and plugin is not None:
            # The plugin facade checks its model policy first; a model it let through must run as asked or not at all.
            raise SpawnRefusedError(f"model {json.dumps(request.model)} is not configured", status="forbidden")
        if request.run_timeout_s is None:
            timeout_s = float(limits.run_timeout_seconds)
        else:
            timeout_s = float(request.run_timeout_s) if request.run_timeout_s > 0 else NO_TIMEOUT_S

        run_id = new_uuid()
        child_key = f"agent:{target}:subagent:{new_uuid()}"
        record = ChildRecord(
            run_id=run_id,
            child_key=child_key,
            agent_id=target,
            parent_key=parent.session_key,
            parent_session_id=parent.session_id,
            parent_run_id=parent.run_id,
            depth=depth + 1,
            label=request.label,
            task_name=request.task_name,
            context=context,
            blind=blind,
            cleanup=request.cleanup,
            model=model,
            created_at_ms=self._now_ms(),
        )
        await asyncio.to_thread(functools.partial(self._children.add, record, plugin=plugin))
        try:
            await asyncio.to_thread(
                self._store.get_or_create,
                child_key,
                agent_id=target,
                owner=NATIVE_OWNER,
                label=request.label,
                metadata={
                    "spawnedBy": parent.session_key,
                    "spawnDepth": depth + 1,
                    "blind": blind,
                    **({} if request.profile_record is None else {"subagentProfile": dict(request.profile_record)}),
                },
            )
            if context == "fork":
                await asyncio.to_thread(self._fork, parent.session_key, child_key)
            message = _task_message(task, depth + 1, limits.max_spawn_depth)
            await self._runs.start(
                RunRequest(
                    session_key=child_key,
                    agent_id=target,
                    message=message,
                    lane="subagent",
                    owner=NATIVE_OWNER,
                    deliver=False,
                    label=request.label,
                    run_id=run_id,
                    options=TurnOptions(
                        extra_system_prompt=_child_prompt(
                            None if blind else _session_context(parent.session_key, child_key), request.instructions
                        ),
                        model=model,
                        reasoning_effort=None
                        if request.thinking is None
                        else REASONING_EFFORT_BY_THINKING[request.thinking],
                        timeout_s=timeout_s,
                        tools_allow=tuple(ToolPolicy(deny=request.tools_deny).effective(parent.tools))
                        if request.tools_deny
                        else parent.tools,
                    ),
                )
            )
        except Exception as exc:
            message = exc.message if isinstance(exc, GatewayError) else "the child could not be started"
            if not isinstance(exc, GatewayError):
                _log.exception("native child %s could not be started", run_id)
            await self._record(run_id, "failed", result="", error=message, usage=None)
            raise SpawnRefusedError(f"the child could not be started: {message}") from exc
        self._watchers[run_id] = asyncio.create_task(self._watch(run_id))
        provider = model.split("/", 1)[0]
        receipt: dict[str, Any] = {
            "status": "accepted",
            "childSessionKey": child_key,
            "sessionKey": child_key,
            "runId": run_id,
            "mode": "run",
            "expectsCompletionMessage": False,
            "context": context,
            "note": (
                "Collector run: no completion notification is sent. Collect this run's result with agents_wait, "
                "using its run id."
            ),
            "resolvedModel": model,
            "resolvedProvider": provider,
            "modelApplied": warning is None,
        }
        if blind:
            receipt["blind"] = True
        if warning is not None:
            receipt["warning"] = warning
        return receipt

    def _target_agent(self, parent: Parent, requested: str | None) -> str:
        if requested is None or not requested.strip():
            return parent.agent_id
        try:
            target = normalize_agent_id(requested)
            self._config.agent(target)
        except (GatewayError, KeyError):
            raise SpawnRefusedError(f"no agent {json.dumps(requested)} is configured") from None
        if target == parent.agent_id:
            return target
        if not self._config.agent(parent.agent_id).subagents.allows(target):
            raise SpawnRefusedError(
                f"agent {json.dumps(target)} is not in subagents.allowAgents of {json.dumps(parent.agent_id)}",
                status="forbidden",
            )
        return target

    def _child_model(self, parent: Parent, target: str, requested: str | None) -> tuple[str, str | None]:
        """The child's model, and a warning when a requested one was skipped (a model-facing ``sessions_spawn`` runs
        on the default then; a plugin's spawn is refused instead)."""
        default = (
            parent.model if target == parent.agent_id and parent.model else self._config.agent_model(target).primary
        )
        if requested is None or not requested.strip():
            return default, None
        try:
            self._config.resolve_model(requested.strip())
        except (KeyError, ValueError):
            return default, f"model {json.dumps(requested)} is not configured; the child runs on {default}"
        return requested.strip(), None

    def _fork(self, parent_key: str, child_key: str) -> None:
        """Copy the requester's current transcript into the child session (before the child's task)."""
        offset = 0
        pages = []
        while True:
            page = self._store.history(parent_key, limit=1000, offset=offset)
            pages.append(page.messages)
            if not page.has_more:
                break
            offset += 1000
        for messages in reversed(pages):
            for message in messages:
                self._store.append(child_key, NewMessage(message.role, message.content))

    # -- watching ----------------------------------------------------------------------------------------------

    async def _watch(self, run_id: str) -> None:
        """Follow the child's run to its end and record its completion."""
        try:
            if await self._runs.wait_for_start(run_id):
                await asyncio.to_thread(self._children.mark_running, run_id)
            while True:
                run = await self._runs.wait_run(run_id, 3600.0)
                if run is None:
                    await self._record(
                        run_id, "failed", result="", error="the child's run was not recorded", usage=None
                    )
                    return
                if not run.active:
                    break
            await self._finish(run)
        finally:
            self._watchers.pop(run_id, None)

    async def _finish(self, run: Run) -> None:
        messages = await asyncio.to_thread(self._store.run_messages, run.run_id)
        text, usage = "", {"inputTokens": 0, "outputTokens": 0}
        for message in messages:
            if message.role != "assistant":
                continue
            text = content_text(message.content) or text
            if message.usage:
                usage["inputTokens"] += int(message.usage.get("input", 0))
                usage["outputTokens"] += int(message.usage.get("output", 0))
        completion = _COMPLETIONS.get(run.state, "failed")
        error = None if completion == "done" else (run.error or run.state)
        await self._record(run.run_id, completion, result=text, error=error, usage=usage)

    async def _record(
        self, run_id: str, completion: Completion, *, result: str, error: str | None, usage: dict[str, int] | None
    ) -> None:
        record = await asyncio.to_thread(
            self._children.complete,
            run_id,
            completion,
            result=result,
            error=error,
            usage=usage,
            ended_at_ms=self._now_ms(),
        )
        async with self._changed:
            self._changed.notify_all()
        if record is not None and record.cleanup == "delete":
            await self.archive_due()

    # -- collection --------------------------------------------------------------------------------------------

    async def wait(self, parent: Parent, ids: Sequence[str], timeout_s: float | None) -> dict[str, Any]:
        """``agents_wait``: return once a requested child has a completion, none is pending, or the wait ends.

        ``{"completed": [...], "pending": [ids], "errors"?: [{runId, error: not_found|not_owner}]}``; with only
        errors, ``"success": false`` too.
        """
        wanted = list(dict.fromkeys(run_id.strip() for run_id in ids if run_id.strip()))
        if not wanted:
            raise SpawnRefusedError("agents_wait requires at least one non-empty run id")
        if len(wanted) > MAX_WAIT_IDS:
            raise SpawnRefusedError(f"agents_wait supports at most {MAX_WAIT_IDS} ids")
        wait_s = DEFAULT_WAIT_S if timeout_s is None else min(max(0.0, timeout_s), MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        while True:
            async with self._changed:
                state = await asyncio.to_thread(self._read_wait_state, parent, wanted)
                remaining = deadline - time.monotonic()
                if state["completed"] or not state["pending"] or remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._changed.wait()
        if not state["completed"] and not state["pending"] and state.get("errors"):
            state["success"] = False
        return state

    def _read_wait_state(self, parent: Parent, ids: list[str]) -> dict[str, Any]:
        completed: list[tuple[int, int, dict[str, Any]]] = []
        pending: list[str] = []
        errors: list[dict[str, str]] = []
        for index, run_id in enumerate(ids):
            record = self._children.get(run_id)
            if record is None:
                errors.append({"runId": run_id, "error": "not_found"})
            elif not _owns(parent, record):
                errors.append({"runId": run_id, "error": "not_owner"})
            elif record.completion is None:
                pending.append(run_id)
            else:
                completed.append((record.ended_at_ms or 0, index, completion_entry(record)))
        completed.sort(key=lambda item: (item[0], item[1]))
        state: dict[str, Any] = {"completed": [entry for _, _, entry in completed], "pending": pending}
        if errors:
            state["errors"] = errors
        return state

    # -- listing and control -----------------------------------------------------------------------------------

    async def children_of(self, parent: Parent, *, limit: int = 200) -> list[ChildRecord]:
        """The children of the parent's current incarnation, newest first."""
        records = await asyncio.to_thread(self._children.for_parent, parent.session_key, limit=limit)
        return [record for record in records if _owns(parent, record)]

    async def owned(self, parent: Parent, run_id_or_key: str) -> ChildRecord | None:
        """The parent's child with that run id or session key (``None`` if there is none it owns)."""
        record = await asyncio.to_thread(self._children.get, run_id_or_key)
        if record is None:
            record = await asyncio.to_thread(self._children.by_child_key, run_id_or_key)
        return record if record is not None and _owns(parent, record) else None

    async def child(self, session_key: str) -> ChildRecord | None:
        """The custody record of the native child whose session is ``session_key``, if it is one."""
        return await asyncio.to_thread(self._children.by_child_key, session_key)

    async def kill(self, record: ChildRecord) -> bool:
        """Abort the child's run if it is in flight; ``True`` if it was."""
        if not record.active:
            return False
        aborted = await self._runs.abort(record.child_key, record.run_id)
        return bool(aborted)

    # -- archiving ---------------------------------------------------------------------------------------------

    async def archive_due(self) -> int:
        """Archive the sessions of children ended ``archiveAfterMinutes`` ago (or asking for ``cleanup: delete``);
        their custody records and completions stay. Returns how many were archived."""
        minutes = self._config.agents.defaults.subagents.archive_after_minutes
        now = self._now_ms()
        # archiveAfterMinutes 0 keeps ended children's sessions (only cleanup "delete" archives them).
        ended_before = now - minutes * 60_000 if minutes > 0 else 0
        due = await asyncio.to_thread(self._children.due_for_archive, ended_before_ms=ended_before)
        for record in due:
            await asyncio.to_thread(self._store.delete, record.child_key)
            await asyncio.to_thread(self._children.mark_archived, record.run_id, now)
        return len(due)

    async def _archive_loop(self) -> None:
        interval = min(60.0, self._config.agents.defaults.subagents.archive_after_minutes * 30.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.archive_due()
            except GatewayError as exc:
                _log.warning("archiving ended children failed: %s", exc.message)


def _owns(parent: Parent, record: ChildRecord) -> bool:
    return record.parent_key == parent.session_key and record.parent_session_id == parent.session_id


def completion_entry(record: ChildRecord) -> dict[str, Any]:
    """A child's completion in ``agents_wait``'s shape."""
    entry: dict[str, Any] = {"runId": record.run_id, "status": record.completion, "result": record.result or ""}
    if record.result_truncated:
        entry["resultTruncated"] = True
    if record.error is not None and record.completion != "done":
        entry["error"] = record.error
    entry["sessionKey"] = record.child_key
    if record.label:
        entry["label"] = record.label
    if record.usage is not None:
        entry["usage"] = record.usage
    return entry


def _task_message(task: str, depth: int, max_depth: int) -> str:
    return (
        f"[Subagent Context] You are running as a subagent (depth {depth}/{max_depth}). Complete the current "
        "[Subagent Task]; inherited conversation is background context, not your assignment.\n\n"
        f"[Subagent Task]\n\n{task}\n\nBegin. Execute the assigned task to completion."
    )


def _child_prompt(context: str | None, instructions: str | None) -> str | None:
    parts = [part for part in (context, instructions) if part]
    return "\n\n".join(parts) if parts else None


def _session_context(parent_key: str, child_key: str) -> str:
    return f"Subagent session context: requester session {parent_key}; this child's session {child_key}."
