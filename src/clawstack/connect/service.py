"""ClawConnect's core, whatever the transport: the seven tools over the job store and the gateway clients.

:class:`ConnectService` owns the :class:`~clawstack.connect.jobs.JobStore`, one
:class:`~clawstack.connect.gateway_client.GatewayClient` per agent (started on first use) and one
:class:`~clawstack.connect.follow.RunFollower` task per running job. :meth:`ConnectService.start` opens the store
and recovers every job a previous process left running from the gateway's transcript; :meth:`ConnectService.stop`
stops following (the jobs stay ``running`` in the store, for the next start) and closes everything.

:class:`~clawstack.connect.agent_session.AgentSessionRuntimeRegistry` is injected (an empty one by default, with
which the service behaves exactly as without the seam): a ``run_task`` context's agent-session marker or directive
is stripped from the message and applied after the busy check, and ``check_task``, ``get_task`` and
``get_session`` read the conversation's current attachment (``agentSession``) when they are called.

:meth:`ConnectService.call` is what a transport calls: a tool name, its raw arguments and the
:class:`~clawstack.connect.callers.Caller` (the stdio operator, or whom the HTTP guard admitted), answered with a
JSON object or a :class:`~clawstack.connect.errors.ToolError`.

**Tenancy.** Every job, gateway session and attachment has one owner (:mod:`clawstack.connect.ownership`): a
caller runs tasks only in its own sessions, and every read (``check_task``, ``get_task``, ``list_tasks``,
``get_session``, ``list_sessions``, ``cancel_task``, MCP's ``tasks/*``) answers only from its own records, another
caller's reading exactly as an id that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit

from clawstack.common.clock import Clock, SystemClock
from clawstack.common.ids import new_id, new_uuid
from clawstack.connect.agent_session.attachments import Attachment
from clawstack.connect.agent_session.directives import Directive, parse_context
from clawstack.connect.agent_session.dispatch import call_timeout_ms_from_env
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.agent_session.sessions import RECOVERED_REASON, RESULT_SOURCE, AgentSessions
from clawstack.connect.agents import Agent, AgentRegistry
from clawstack.connect.callers import OPERATOR, Caller
from clawstack.connect.errors import ConnectError, ToolError
from clawstack.connect.follow import DEFAULT_STALL_CHECK_S, Outcome, RunFollower
from clawstack.connect.gateway_client import GatewayClient
from clawstack.connect.jobs import Job, JobStore
from clawstack.connect.ownership import (
    FULL_KEY_RE,
    SHORT_NAME_RE,
    check_owner,
    may_read,
    sender_name,
    session_name,
    short_name_key,
)
from clawstack.connect.snapshots import Observed, core, detail_snapshot, log_line, next_action, preview, task_snapshot
from clawstack.connect.tools import (
    CancelTaskArgs,
    CheckTaskArgs,
    GetSessionArgs,
    GetTaskArgs,
    ListTasksArgs,
    RunTaskArgs,
    clamp_limit,
    clamp_wait_ms,
    parse_arguments,
)

ClientFactory = Callable[[Agent], GatewayClient]
LIST_LIMIT: Final = 100
ACTIVE_WINDOW_S: Final = 30.0
CANCEL_WAIT_S: Final = 10.0
"""How long cancel_task waits for the gateway to have the run, and then for the run's abort to be seen."""
_log = logging.getLogger(__name__)


def default_client_factory(agent: Agent) -> GatewayClient:
    return GatewayClient(agent.url, secret=agent.secret, auth_kind=agent.auth_kind)


def compose_message(task: str, context: str | None, sender_name: str | None) -> str:
    """The message the agent receives: who is asking, the task, then the context."""
    parts = [f"[from {sender_name}]"] if sender_name else []
    parts.append(task)
    if context:
        parts.append(f"Context:\n{context}")
    return "\n\n".join(parts)


class ConnectService:
    """See the module docstring. ``client_factory`` makes a gateway client for an agent (tests shorten its
    timeouts); ``stall_check_s`` is how long a quiet run waits before it is reconciled; ``agent_session_runtimes``
    is the agent-session runtime registry (default: a new, empty one) and ``agent_session_call_timeout_ms`` the
    seam's deadline (default: ``AGENT_SESSION_CALL_TIMEOUT_MS``, else 60 s)."""

    def __init__(
        self,
        agents: AgentRegistry,
        store: JobStore,
        *,
        clock: Clock | None = None,
        client_factory: ClientFactory = default_client_factory,
        stall_check_s: float = DEFAULT_STALL_CHECK_S,
        agent_session_runtimes: AgentSessionRuntimeRegistry | None = None,
        agent_session_call_timeout_ms: int | None = None,
    ) -> None:
        self.agents = agents
        self.store = store
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._runtimes_injected = agent_session_runtimes is not None
        timeout_ms = agent_session_call_timeout_ms or call_timeout_ms_from_env(os.environ)
        self.agent_sessions = AgentSessions(
            agent_session_runtimes if agent_session_runtimes is not None else AgentSessionRuntimeRegistry(),
            store.path.parent,
            clock=self._clock,
            call_timeout_ms=timeout_ms,
        )
        self._client_factory = client_factory
        self._stall_check_s = stall_check_s
        self._clients: dict[str, GatewayClient] = {}
        self._live: dict[str, Job] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._done: dict[str, asyncio.Event] = {}
        self._activity: dict[str, float] = {}
        self._end_listeners: list[Callable[[Job], None]] = []
        self._stopping = False
        self.recovered_job_ids: tuple[str, ...] = ()
        """The running jobs :meth:`start` found and resumed following."""

    @property
    def agent_session_runtimes(self) -> AgentSessionRuntimeRegistry:
        """The injected agent-session runtime registry."""
        return self.agent_sessions.registry

    def use_agent_session_runtimes(self, registry: AgentSessionRuntimeRegistry) -> None:
        """Inject ``registry`` (what the server factories do); refused when another one was injected already."""
        if registry is self.agent_sessions.registry:
            return
        if self._runtimes_injected:
            raise ValueError("this service already has another agent-session runtime registry")
        self._runtimes_injected = True
        self.agent_sessions.registry = registry
        self.agent_sessions.dispatcher.registry = registry

    def add_end_listener(self, listener: Callable[[Job], None]) -> None:
        """Call ``listener`` with each job, as stored, once it has ended (it must not block: schedule any I/O)."""
        self._end_listeners.append(listener)

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store (moving a corrupt one aside) and resume following the jobs left running."""
        await asyncio.to_thread(self.store.open)
        if self.store.moved_aside is not None:
            _log.error(
                "the job store was corrupt; it was moved aside to %s and a new one started", self.store.moved_aside
            )
        if self.store.problem is not None:
            _log.error("%s", self.store.problem)
            return
        await self.agent_sessions.start()
        running = await asyncio.to_thread(self.store.running)
        self.recovered_job_ids = tuple(job.job_id for job in running)
        for job in running:
            job = dataclasses.replace(job, recoveries=job.recoveries + 1)
            self._live[job.job_id] = job
            await self._log(job.job_id, "recovery", "claw connect restarted; recovering the run from the gateway")
            self._follow(job.job_id, recovering=True)

    async def stop(self) -> None:
        """Stop following runs (they stay ``running`` for the next start), close clients and the store."""
        if self._stopping:
            return
        self._stopping = True
        tasks = list(self._followers.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for client in self._clients.values():
            await client.aclose()
        await self.agent_sessions.stop()
        await asyncio.to_thread(self.store.close)

    def health(self) -> dict[str, Any]:
        """The service's state for ``/health``: never a secret."""
        store = "refusing" if self.store.problem else "moved_aside" if self.store.moved_aside else "ok"
        return {
            "status": "ok" if store != "refusing" else "degraded",
            "jobStore": store,
            "agents": len(self.agents.agents),
        }

    # -- dispatch ----------------------------------------------------------------------------------------------

    async def call(self, name: str, arguments: object, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        """Run one tool; :class:`ToolError` for a refusal, :class:`ConnectError` codes for store failures."""
        args = parse_arguments(name, arguments)
        try:
            if isinstance(args, RunTaskArgs):
                return await self.run_task(args, caller=caller)
            if isinstance(args, CheckTaskArgs):
                return await self.check_task(args, caller=caller)
            if isinstance(args, CancelTaskArgs):
                return await self.cancel_task(args, caller=caller)
            if isinstance(args, GetTaskArgs):
                return await self.get_task(args, caller=caller)
            if isinstance(args, ListTasksArgs):
                return await self.list_tasks(args, caller=caller)
            if isinstance(args, GetSessionArgs):
                return await self.get_session(args, caller=caller)
            return await self.list_sessions(caller=caller)
        except ToolError:
            raise
        except ConnectError as exc:
            raise ToolError(exc.message, code=exc.code, retryable=exc.retryable) from exc

    # -- tools -------------------------------------------------------------------------------------------------

    async def run_task(self, args: RunTaskArgs, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        agent, session_key = await self._session_for_run(args, caller)
        parsed = parse_context(args.context)
        if parsed.problem is not None:
            _log.warning("an agent-session directive was ignored: %s", parsed.problem)
        now = self._now_ms()
        sender = sender_name(caller, args.senderName)
        job = Job(
            job_id=new_id("job_"),
            task_id=new_id("task_"),
            run_id=new_uuid(),
            agent=agent.id,
            openclaw_agent_id=agent.openclaw_agent_id,
            session_key=session_key,
            created_at_ms=now,
            updated_at_ms=now,
            prompt={"task": args.task, "context": parsed.text, "senderName": sender},
            message=compose_message(args.task, parsed.text, sender),
            caller=caller.key,
        )
        await asyncio.to_thread(self.store.create, job)  # refused when another caller took the session meanwhile
        self._live[job.job_id] = job
        self._follow(job.job_id, recovering=False)
        if parsed.directive is not None:
            # Only now: the busy check has passed and the job is on disk and submitting, whatever the callback does.
            await self.agent_sessions.apply(job.session_key, job.job_id, parsed.directive, args.task, owner=caller.key)
        return {
            "jobId": job.job_id,
            "taskId": job.task_id,
            "sessionKey": job.session_key,
            "status": "running",
            "agent": agent.id,
            "nextAction": next_action(job),
        }

    async def check_task(self, args: CheckTaskArgs, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        job = await self._job(args.jobId, "jobId", caller)
        if args.sessionKey is not None and not self._names(args.sessionKey, job, caller):
            raise ToolError(
                "sessionKey: the job belongs to another session", code="session_mismatch", field="sessionKey"
            )
        if args.agent is not None and args.agent != job.agent:
            raise ToolError("agent: the job belongs to another agent", code="agent_mismatch", field="agent")
        wait_s = clamp_wait_ms(args.waitMs) / 1000 if args.mode == "wait" else 0.0
        started = self._clock.monotonic()
        if args.mode == "wait" and not job.terminal:
            await self._wait_for_end(job.job_id, wait_s)
            job = await self._job(job.job_id, "jobId", caller)
        # A poll answers from the stored attachment; a wait lets its refresh land within what is left of waitMs.
        left_s = max(0.0, wait_s - (self._clock.monotonic() - started))
        attachment = await self._attachment(job.session_key, caller, wait_s=left_s)
        job = await self._recover(job, attachment)
        known = max(0, args.knownLogCount or 0)
        logs = await asyncio.to_thread(self.store.logs, job.job_id, since_index=known)
        view, agent_session = self._with_attachment(job, attachment)
        return task_snapshot(view, self._observe(job), logs, self._now_ms(), agent_session=agent_session)

    async def cancel_task(self, args: CancelTaskArgs, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        """Abort the job's gateway run (``chat.abort``) and answer once the job ended ``cancelled``.

        The run is aborted only once the gateway has accepted it (so a ``chat.send`` still on its way cannot start
        it after the abort); until then the call is refused as retryable (``gateway_unavailable``). Cancelling a
        cancelled job answers its snapshot again; a job that ended otherwise is refused (``task_terminal``).
        """
        job = await self._job(args.jobId, "jobId", caller)
        if job.terminal and job.status != "cancelled":
            raise ToolError(
                f"jobId: the task already ended ({job.status}); a finished task cannot be cancelled",
                code="task_terminal",
                field="jobId",
            )
        if not job.terminal:
            deadline = self._clock.monotonic() + CANCEL_WAIT_S
            while not (job.submitted or job.terminal) and self._clock.monotonic() < deadline:
                await self._clock.sleep(0.05)
                job = await self._job(job.job_id, "jobId", caller)
            if not (job.submitted or job.terminal):
                raise ToolError(
                    "the gateway has not accepted the task's run yet, so it cannot be aborted; try again",
                    code="gateway_unavailable",
                    retryable=True,
                )
        if not job.terminal:
            client = await self._client(self.agents.get(job.agent))
            try:
                await client.request("chat.abort", {"sessionKey": job.session_key, "runId": job.run_id})
            except ConnectError as exc:
                raise ToolError(f"the gateway could not abort the run: {exc.message}", code=exc.code) from exc
            await self._wait_for_end(job.job_id, CANCEL_WAIT_S)
            job = await self._job(job.job_id, "jobId", caller)
        if args.stopAgentSession:
            stop = Directive(action="detach", reason="the task was cancelled", stop_runtime=True)
            if await self._attachment(job.session_key, caller, stored=True) is not None:
                task = job.prompt.get("task") or ""
                await self.agent_sessions.apply(job.session_key, job.job_id, stop, task, owner=caller.key)
        attachment = await self._attachment(job.session_key, caller)
        logs = await asyncio.to_thread(self.store.logs, job.job_id)
        view, agent_session = self._with_attachment(job, attachment)
        return task_snapshot(view, self._observe(job), logs, self._now_ms(), agent_session=agent_session)

    async def get_task(self, args: GetTaskArgs, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        job = await self._job(args.taskId, "taskId", caller)
        attachment = await self._attachment(job.session_key, caller)
        job = await self._recover(job, attachment)
        logs = None
        if args.detail in ("updates", "full"):
            logs = await asyncio.to_thread(self.store.logs, job.job_id)
        view, agent_session = self._with_attachment(job, attachment)
        return detail_snapshot(view, args.detail, self._observe(job), logs, self._now_ms(), agent_session=agent_session)

    async def list_tasks(self, args: ListTasksArgs, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        jobs, total = await asyncio.to_thread(
            self.store.recent, active_only=args.view == "active", limit=LIST_LIMIT, scope=caller.key
        )
        now = self._now_ms()
        tasks = [preview(self._live.get(job.job_id, job), now) for job in jobs]
        return {"view": args.view, "tasks": tasks, "total": total, "truncated": total > len(tasks)}

    async def page_tasks(
        self, *, limit: int, after: tuple[int, str] | None = None, caller: Caller = OPERATOR
    ) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
        """A page of the caller's tasks for MCP's ``tasks/list``: the core snapshots of up to ``limit`` jobs, newest
        first, from just past ``after`` (see :meth:`JobStore.page`), and the position after which the next page
        starts (``None`` on the last page). A running job shows its conversation's attachment as stored: no
        runtime is read."""
        try:
            jobs = await asyncio.to_thread(self.store.page, limit=limit + 1, after=after, scope=caller.key)
        except ConnectError as exc:
            raise ToolError(exc.message, code=exc.code, retryable=exc.retryable) from exc
        more = (jobs[limit - 1].created_at_ms, jobs[limit - 1].job_id) if len(jobs) > limit else None
        now = self._now_ms()
        page = []
        for stored in jobs[:limit]:
            job = self._live.get(stored.job_id, stored)
            attachment = None if job.terminal else await self._attachment(job.session_key, caller, stored=True)
            page.append(core(job, now, self.agent_sessions.render(attachment)))
        return page, more

    async def get_session(self, args: GetSessionArgs, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        key = self._session_to_read(args.sessionId, args.agent, caller)
        owner = None if key is None else await asyncio.to_thread(self.store.session_owner, key)
        jobs = []
        if key is not None and may_read(owner, caller):
            jobs = await asyncio.to_thread(self.store.for_session, key, caller.key)
        if args.agent is not None:
            jobs = [job for job in jobs if job.agent == args.agent]
        result: dict[str, Any] = {"sessionId": args.sessionId, "found": bool(jobs), "mode": args.mode}
        now = self._now_ms()
        result["agent"] = jobs[-1].agent if jobs else args.agent
        result["tasks"] = (
            [] if args.mode in ("events", "tail") else [preview(self._live.get(j.job_id, j), now) for j in jobs]
        )
        events: list[dict[str, Any]] = []
        next_after = args.after
        if jobs and args.mode != "tasks":
            limit = clamp_limit(args.limit)
            after = (args.after if args.after is not None else 0) if args.mode == "events" else None
            entries = await asyncio.to_thread(
                self.store.session_logs, jobs[-1].session_key, after=after, limit=limit, scope=caller.key
            )
            events = [{"cursor": entry.seq, "jobId": entry.job_id, **log_line(entry)} for entry in entries]
            if entries:
                next_after = entries[-1].seq
        result["events"] = events
        result["nextAfter"] = next_after
        attachment = await self._attachment(jobs[-1].session_key, caller) if jobs else None
        result["agentSession"] = self.agent_sessions.render(attachment)
        return result

    async def list_sessions(self, *, caller: Caller = OPERATOR) -> dict[str, Any]:
        rows = await asyncio.to_thread(self.store.sessions, limit=LIST_LIMIT, scope=caller.key)
        now = self._now_ms()
        sessions = []
        for key, count, job in rows:
            last = preview(self._live.get(job.job_id, job), now)
            sessions.append(
                {
                    "sessionId": key,
                    "sessionKey": key,
                    "agent": job.agent,
                    "taskCount": count,
                    "updatedAt": last["updatedAt"],
                    "lastJob": {k: last[k] for k in ("jobId", "taskId", "status", "terminalReason", "createdAt")},
                    "summary": last["summary"],
                    "summaryTruncated": last["summaryTruncated"],
                }
            )
        return {"sessions": sessions, "agents": self.agents.public(), "defaultAgent": self.agents.default_id}

    # -- ownership ---------------------------------------------------------------------------------------------

    async def _session_for_run(self, args: RunTaskArgs, caller: Caller) -> tuple[Agent, str]:
        """The agent and gateway session ``run_task`` runs in, refused (``session_not_found``) before anything
        reaches the gateway when the session is not the caller's (see :mod:`clawstack.connect.ownership`)."""
        agent = self._agent(args.agent)
        name = session_name(agent, caller, args.sessionKey)
        owner = None if name.kind == "new" else await asyncio.to_thread(self.store.session_owner, name.key)
        check_owner(name, owner, caller)
        if owner is not None and owner.agent != agent.id:
            if args.agent is not None:
                raise ToolError("agent: the session belongs to another agent", code="agent_mismatch", field="agent")
            agent = self._agent(owner.agent)
        return agent, name.key

    def _session_to_read(self, given: str, agent_id: str | None, caller: Caller) -> str | None:
        """The key a ``get_session`` names (a full key, or the caller's short name), ``None`` for none."""
        if FULL_KEY_RE.fullmatch(given):
            return given
        if not SHORT_NAME_RE.fullmatch(given):
            return None
        try:
            return short_name_key(self.agents.get(agent_id), caller, given)
        except KeyError:
            return None

    def _names(self, given: str, job: Job, caller: Caller) -> bool:
        """Whether ``given`` (a key, or the caller's short name) names ``job``'s session."""
        if given == job.session_key:
            return True
        try:
            agent = self.agents.get(job.agent)
        except KeyError:
            return False
        return SHORT_NAME_RE.fullmatch(given) is not None and short_name_key(agent, caller, given) == job.session_key

    async def _attachment(
        self, session_key: str, caller: Caller, *, wait_s: float = 0.0, stored: bool = False
    ) -> Attachment | None:
        """The current attachment of a conversation ``caller`` owns (``None`` for another caller's): as stored, or
        read (refreshed in the background, with up to ``wait_s`` for the refresh)."""
        owner = await asyncio.to_thread(self.store.session_owner, session_key)
        if not may_read(owner, caller):
            return None
        if stored:
            return await self.agent_sessions.stored(session_key, owner=caller.key)
        return await self.agent_sessions.read(session_key, wait_s=wait_s, owner=caller.key)

    # -- agent sessions ----------------------------------------------------------------------------------------

    async def _recover(self, job: Job, attachment: Attachment | None) -> Job:
        """Store the answer of the session a turn delegated to, when the gateway's own agent gave none."""
        if attachment is None or not job.terminal:
            return job
        answer = self.agent_sessions.recovered_answer(
            attachment, turn_id=job.job_id, status=job.status, started_at_ms=job.created_at_ms
        )
        if answer is None:
            return job
        recovered = dataclasses.replace(
            job, status="completed", summary=answer, result_source=RESULT_SOURCE, terminal_reason=RECOVERED_REASON
        )
        message = f"the answer was recovered from the attached agent session (runtime {attachment.runtime})"
        return await asyncio.to_thread(self.store.append_log, recovered, "agent-session", message, self._now_ms())

    def _with_attachment(self, job: Job, attachment: Attachment | None) -> tuple[Job, dict[str, Any] | None]:
        """The job as shown (a session blocked on a human stays actionable in the summary) and ``agentSession``."""
        if attachment is None:
            return job, None
        if job.summary is None and attachment.delegated_turn_id == job.job_id:
            blocked = self.agent_sessions.blocked_summary(attachment)
            if blocked is not None:
                job = dataclasses.replace(job, summary=blocked)
        return job, self.agent_sessions.render(attachment)

    # -- following ---------------------------------------------------------------------------------------------

    def _follow(self, job_id: str, *, recovering: bool) -> None:
        self._done.setdefault(job_id, asyncio.Event())
        task = asyncio.create_task(self._run_follower(job_id, recovering), name=f"follow {job_id}")
        self._followers[job_id] = task
        task.add_done_callback(lambda _: self._followers.pop(job_id, None))

    async def _run_follower(self, job_id: str, recovering: bool) -> None:
        job = self._live[job_id]
        try:
            agent = self.agents.get(job.agent)
        except KeyError:
            _log.error("job %s names agent %s, which is no longer configured; not followed", job_id, job.agent)
            return
        client = await self._client(agent)

        async def submitted() -> None:
            await self._save(dataclasses.replace(self._live[job_id], submitted=True))

        async def log(kind: str, message: str) -> None:
            await self._log(job_id, kind, message)

        def activity() -> None:
            self._activity[job_id] = self._clock.monotonic()

        follower = RunFollower(
            job, client, log=log, on_submitted=submitted, on_activity=activity, stall_check_s=self._stall_check_s
        )
        try:
            outcome = await follower.follow(recovering=recovering)
            await self._finish(job_id, outcome)
        except ConnectError as exc:
            _log.error("following job %s stopped: [%s] %s", job_id, exc.code, exc.message)
        except Exception:
            # The job stays running in the store and is recovered at the next start; say why it is not followed.
            _log.exception("following job %s stopped unexpectedly", job_id)

    async def _finish(self, job_id: str, outcome: Outcome) -> None:
        now = self._now_ms()
        job = dataclasses.replace(
            self._live[job_id],
            status=outcome.status,
            terminal_reason=outcome.terminal_reason,
            result_source=outcome.result_source,
            summary=outcome.summary,
            error=outcome.error,
            error_info=outcome.error_info,
            ended_at_ms=now,
        )
        stored = await asyncio.to_thread(
            self.store.append_log, job, "end", f"the task ended {outcome.status} ({outcome.terminal_reason})", now
        )
        self._live.pop(job_id, None)
        self._activity.pop(job_id, None)
        done = self._done.pop(job_id, None)
        if done is not None:
            done.set()
        _log.info("job %s ended %s (%s)", stored.job_id, stored.status, stored.terminal_reason)
        for listener in self._end_listeners:
            try:
                listener(stored)
            except Exception:
                # A listener's failure must not stop the others, nor the follower that finished the job.
                _log.exception("an end listener failed for job %s", job_id)

    async def _wait_for_end(self, job_id: str, timeout_s: float) -> None:
        done = self._done.get(job_id)
        if done is None:
            await self._clock.sleep(timeout_s)
            return
        waiter = asyncio.create_task(done.wait())
        sleeper = asyncio.create_task(self._clock.sleep(timeout_s))
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, sleeper):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(waiter, sleeper, return_exceptions=True)

    # -- helpers -----------------------------------------------------------------------------------------------

    async def _client(self, agent: Agent) -> GatewayClient:
        client = self._clients.get(agent.id)
        if client is None:
            client = self._clients[agent.id] = self._client_factory(agent)
            await client.start()
        return client

    def _agent(self, agent_id: str | None) -> Agent:
        try:
            return self.agents.get(agent_id)
        except KeyError:
            raise ToolError(
                f"agent: no agent {agent_id!r}; list_sessions shows the configured agents",
                code="agent_not_found",
                field="agent",
            ) from None

    async def _job(self, ident: str, field: str, caller: Caller) -> Job:
        """The job ``ident`` names; another caller's job is refused exactly as an unknown id is."""
        job = self._live.get(ident)
        if job is None:
            lookup = self.store.get_by_task if ident.startswith("task_") else self.store.get
            job = await asyncio.to_thread(lookup, ident)
        if job is not None and job.caller != caller.key:
            job = None
        if job is None:
            code = "task_not_found" if field == "taskId" else "job_not_found"
            raise ToolError(f"{field}: no task has this id", code=code, field=field)
        return self._live.get(job.job_id, job)

    async def _save(self, job: Job) -> None:
        self._live[job.job_id] = await asyncio.to_thread(self.store.update, job)

    async def _log(self, job_id: str, kind: str, message: str) -> None:
        job = self._live[job_id]
        self._live[job_id] = await asyncio.to_thread(self.store.append_log, job, kind, message, self._now_ms())

    def _observe(self, job: Job) -> Observed:
        client = self._clients.get(job.agent)
        gateway: dict[str, Any] = {}
        if client is not None:
            parts = urlsplit(client.url)
            gateway = {
                "endpoint": f"{parts.scheme}://{parts.hostname}:{parts.port}"
                if parts.port
                else f"{parts.scheme}://{parts.hostname}",
                "liveness": client.liveness,
                "lastError": None if client.last_error is None else client.last_error.code,
                "connects": client.connects,
            }
        if job.terminal:
            return Observed("ended", gateway)
        if client is None or job.job_id not in self._followers:
            return Observed("recovering" if self.store.problem is None else "stalled", gateway)
        if client.liveness != "connected":
            return Observed(client.liveness, gateway)
        last = self._activity.get(job.job_id)
        quiet = last is None or self._clock.monotonic() - last > ACTIVE_WINDOW_S
        return Observed("waiting" if quiet else "active", gateway)

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)


__all__ = ["ClientFactory", "ConnectService", "compose_message", "default_client_factory"]
