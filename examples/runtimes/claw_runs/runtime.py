"""An example agent-session runtime, ``claw-runs``: a ClawConnect task follows runs of ``claw runs serve``.

The session id is a run id of the supervisor (``[A-Za-z0-9_-]``, at most 120 characters so that its continuations
fit the supervisor's 128). Loaded with ``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES=examples/runtimes/claw_runs/
runtime.py``; ClawConnect then calls:

- ``inspect``: the status of the session's current run over the supervisor's Unix socket, mapped onto the closed
  vocabulary; once the run is ``stopped`` with a result, ``completed`` with the run's answer as ``finalResponse``.
- ``continue``: a new run of the same template with the follow-up prompt as its task, named
  ``<session_id>--c<n>``; the session's current run is the last of that chain (see README.md).
- ``detach``: cancels the current run.

Configuration is the operator's alone, read once at registration: ``CLAW_RUNS_SOCKET`` (the supervisor's
``runs.sock``) and ``CLAW_RUNS_INSTALLATION``, both required; without either the module refuses to register
(``not_configured``, logged). Where the calls go is never taken from a caller: a marker's or a directive's metadata
and the session reference choose only the run, never the socket or the installation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from clawstack.common.digest import spec_digest
from clawstack.common.errors import ClawError
from clawstack.runs.client import AsyncRunsClient
from clawstack.runs.errors import RunsError

RUNTIME_ID: Final = "claw-runs"
DEFAULT_PROVIDER: Final = "claw-runs-worker"
SOCKET_ENV: Final = "CLAW_RUNS_SOCKET"
INSTALLATION_ENV: Final = "CLAW_RUNS_INSTALLATION"
PROVIDER_ENV: Final = "CLAW_RUNS_PROVIDER"
CANCEL_WAIT_S: Final = 10.0
"""How long ``detach`` waits for the cancelled run to stop before it reports what it has."""
DEFAULT_AUTHORITY: Final = timedelta(minutes=15)
"""A continuation's authority when the previous run's cannot be read from its status."""
MAX_CONTINUATIONS: Final = 999

RUN_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,120}")
INSTALLATION: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
HOME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
_TERMINAL: Final = frozenset({"stopped", "failed"})
_log = logging.getLogger(__name__)


class ClawRunsError(Exception):
    """A call could not be answered. ``code`` is stable: ``invalid_session_id``, ``prompt_required``,
    ``invalid_home``, ``run_in_progress``, ``chain_too_long``, ``aborted``, or the supervisor's own code
    (``template_unknown``, ``digest_mismatch``, ``socket_unavailable``, …); ClawConnect reports any of them as the
    operation's ``<op>_failed``. ``not_configured`` is raised at registration (or construction) only."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Ref(Protocol):
    @property
    def session_id(self) -> str: ...

    @property
    def metadata(self) -> Mapping[str, str]: ...


class _Options(Protocol):
    @property
    def signal(self) -> asyncio.Event: ...


class _ContinueRequest(Protocol):
    @property
    def prompt(self) -> str | None: ...

    @property
    def metadata(self) -> Mapping[str, str]: ...


class _DetachRequest(Protocol):
    @property
    def stop_runtime(self) -> bool: ...


class _Registry(Protocol):
    def register(
        self, id: str, /, *, provider: str, inspect: Any, continue_: Any = None, detach: Any = None
    ) -> Any: ...


_T = TypeVar("_T")


async def _until_aborted(awaitable: Awaitable[_T], signal: asyncio.Event) -> _T:
    """``awaitable``'s result, or :class:`ClawRunsError` ``aborted`` as soon as ``signal`` is set."""
    work = asyncio.ensure_future(awaitable)
    aborted = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait((work, aborted), return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
    if not work.done():
        work.cancel()
        # Best-effort: let the cancelled request close its connection before we report.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        raise ClawRunsError("aborted", "the call was aborted by its caller or deadline")
    return work.result()


def continuation_id(session_id: str, n: int) -> str:
    """The run id of the session's ``n``-th continuation (``0``: the session's own run)."""
    return session_id if n == 0 else f"{session_id}--c{n}"


def _epoch_ms(value: object) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def observe(status: Mapping[str, Any], answer: str | None, *, continuations: int) -> dict[str, Any]:
    """The observation for one run's status (``answer``: its result text, read only for a finished run).

    ``accepted`` is starting; ``running``, ``revoking`` and ``revoked`` are running (the supervisor has not yet
    vouched for the end); ``stopped`` with a result is completed; a cancelled run, or one that started and then
    failed, is dead; a run that failed before its worker existed is failed.
    """
    run_state = status.get("state")
    cancelled = status.get("cancelled") is True
    failure = status.get("failure")
    metadata = {
        "runId": str(status.get("run_id", "")),
        "installation": str(status.get("installation", "")),
        "runState": str(run_state),
        "generation": str(status.get("generation", "")),
        "template": str(status.get("template", "")),
        "templateId": str(status.get("template_id", "")),
        "continuations": str(continuations),
        "cancelled": "true" if cancelled else "false",
    }
    if isinstance(failure, str):
        metadata["failure"] = failure
    if isinstance(status.get("pending"), str):
        metadata["pending"] = status["pending"]
    result = status.get("result")
    if isinstance(result, Mapping):
        metadata["resultTruncated"] = "true" if result.get("truncated") is True else "false"
    observation: dict[str, Any] = {"metadata": metadata}
    for field in ("ended_at", "exited_at", "started_at", "accepted_at"):
        at = _epoch_ms(status.get(field))
        if at is not None:
            observation["lastEventAt"] = at
            break
    if run_state == "accepted":
        observation.update(state="starting", alive=True, terminated=False)
    elif run_state in ("running", "revoking", "revoked"):
        observation.update(state="running", alive=True, terminated=False)
    elif run_state == "stopped" and not cancelled and failure is None and answer is not None:
        observation.update(state="completed", alive=False, terminated=True, finalResponse=answer, latestResponse=answer)
    elif run_state == "stopped":
        observation.update(state="dead", alive=False, terminated=True)
    elif run_state == "failed":
        never_started = failure == "spawn_error" or status.get("started_at") is None
        observation.update(state="failed" if never_started and not cancelled else "dead", alive=False, terminated=True)
    else:
        observation.update(state="unknown")
    return observation


@dataclass(frozen=True)
class _Target:
    socket: Path
    installation: str
    session_id: str


class ClawRunsRuntime:
    """The callbacks of one ``claw-runs`` runtime, bound to one supervisor socket and one installation, both the
    operator's: nothing a caller sends can point it elsewhere."""

    def __init__(
        self,
        *,
        socket: Path,
        installation: str,
        client_factory: Callable[[Path], AsyncRunsClient] = AsyncRunsClient,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not socket.is_absolute():
            raise ClawRunsError("not_configured", "the supervisor's socket path must be absolute")
        if not INSTALLATION.fullmatch(installation):
            raise ClawRunsError("not_configured", "an installation is [a-z0-9][a-z0-9-]{0,63}")
        self.socket = socket
        self.installation = installation
        self._client_factory = client_factory
        self._now = now

    def _target(self, ref: _Ref) -> _Target:
        session_id = ref.session_id
        if not isinstance(session_id, str) or not RUN_ID.fullmatch(session_id):
            raise ClawRunsError("invalid_session_id", "a claw-runs session id is a run id: 1 to 120 of A-Z a-z 0-9 _ -")
        return _Target(self.socket, self.installation, session_id)

    async def _current(
        self, client: AsyncRunsClient, target: _Target, hint: object
    ) -> tuple[int, dict[str, Any]] | None:
        """The session's current run: the last of its chain, found by probing from ``hint`` (a continuation count a
        previous observation reported) forward, or from the session's own run when the hint does not hold."""
        start = int(hint) if isinstance(hint, str) and hint.isdigit() and 0 < int(hint) <= MAX_CONTINUATIONS else 0
        found = await self._status(client, target, start)
        if found is None and start:
            start, found = 0, await self._status(client, target, 0)
        if found is None:
            return None
        n = start
        while n < MAX_CONTINUATIONS:
            following = await self._status(client, target, n + 1)
            if following is None:
                break
            n, found = n + 1, following
        return n, found

    @staticmethod
    async def _status(client: AsyncRunsClient, target: _Target, n: int) -> dict[str, Any] | None:
        try:
            return await client.status(target.installation, continuation_id(target.session_id, n))
        except RunsError as exc:
            if exc.code == "not_found":
                return None
            raise

    async def _observation(
        self, client: AsyncRunsClient, target: _Target, n: int, status: dict[str, Any]
    ) -> dict[str, Any]:
        answer = None
        if status.get("state") == "stopped" and status.get("result") is not None and not status.get("cancelled"):
            answer, _ = await client.result(target.installation, status["run_id"])
        return observe(status, answer, continuations=n)

    async def _call(
        self, ref: _Ref, options: _Options, body: Callable[[AsyncRunsClient, _Target], Awaitable[_T]]
    ) -> _T:
        target = self._target(ref)

        async def run() -> _T:
            try:
                async with self._client_factory(target.socket) as client:
                    return await body(client, target)
            except ClawError as exc:  # the supervisor's refusals and the socket's faults, by their codes
                raise ClawRunsError(exc.code, exc.message) from exc

        return await _until_aborted(run(), options.signal)

    async def inspect(self, ref: _Ref, options: _Options) -> dict[str, Any] | None:
        async def body(client: AsyncRunsClient, target: _Target) -> dict[str, Any] | None:
            current = await self._current(client, target, ref.metadata.get("continuations"))
            return None if current is None else await self._observation(client, target, *current)

        return await self._call(ref, options, body)

    async def continue_(self, ref: _Ref, request: _ContinueRequest, options: _Options) -> dict[str, Any] | None:
        prompt = request.prompt
        if not isinstance(prompt, str) or not prompt.strip():
            raise ClawRunsError("prompt_required", "continue needs a prompt: it becomes the new run's task")
        home = request.metadata.get("home") or ref.metadata.get("home")
        if home is not None and not HOME.fullmatch(home):
            raise ClawRunsError("invalid_home", "metadata.home is a task-home id: [A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")

        async def body(client: AsyncRunsClient, target: _Target) -> dict[str, Any] | None:
            current = await self._current(client, target, ref.metadata.get("continuations"))
            if current is None:
                return None
            n, status = current
            spec: dict[str, Any] = {"template": status["template"], "task": prompt}
            if home is not None:
                spec["home"] = home
            if status.get("state") not in _TERMINAL:
                if n > 0 and status.get("spec_digest") == spec_digest(spec):
                    return observe(status, None, continuations=n)  # a retry of the continue that launched it
                raise ClawRunsError("run_in_progress", f"run {status.get('run_id')} has not ended; continue after it")
            if n + 1 > MAX_CONTINUATIONS:
                raise ClawRunsError("chain_too_long", f"a session has at most {MAX_CONTINUATIONS} continuations")
            launched = await client.launch(
                target.installation,
                continuation_id(target.session_id, n + 1),
                spec,
                authority_expires_at=self._now() + _authority(status),
            )
            return observe(launched, None, continuations=n + 1)

        return await self._call(ref, options, body)

    async def detach(self, ref: _Ref, request: _DetachRequest, options: _Options) -> dict[str, Any] | None:
        async def body(client: AsyncRunsClient, target: _Target) -> dict[str, Any] | None:
            current = await self._current(client, target, ref.metadata.get("continuations"))
            if current is None:
                return None
            n, status = current
            if request.stop_runtime is True and status.get("state") not in _TERMINAL:
                status = await client.cancel(
                    target.installation,
                    status["run_id"],
                    generation=int(status["generation"]),
                    wait="stopped",
                    timeout_s=CANCEL_WAIT_S,
                )
            return await self._observation(client, target, n, status)

        return await self._call(ref, options, body)


def _authority(status: Mapping[str, Any]) -> timedelta:
    """The previous run's authority window (accepted to expiry), so a continuation gets what its task had."""
    accepted, expires = _epoch_ms(status.get("accepted_at")), _epoch_ms(status.get("authority_expires_at"))
    if accepted is None or expires is None or expires <= accepted:
        return DEFAULT_AUTHORITY
    return timedelta(milliseconds=expires - accepted)


def _not_configured(problem: str) -> ClawRunsError:
    _log.error("%s is not registered: %s", RUNTIME_ID, problem)
    return ClawRunsError("not_configured", problem)


def register_agent_session_runtimes(registry: _Registry, environ: Mapping[str, str] | None = None) -> None:
    """Register ``claw-runs`` with ``inspect``, ``continue`` and ``detach``; refuses (``not_configured``, logged)
    unless the operator set both ``CLAW_RUNS_SOCKET`` and ``CLAW_RUNS_INSTALLATION``."""
    env = os.environ if environ is None else environ
    socket = env.get(SOCKET_ENV, "").strip()
    if not socket or not os.path.isabs(socket):
        raise _not_configured(f"{SOCKET_ENV} must name the supervisor's socket (an absolute path)")
    installation = env.get(INSTALLATION_ENV, "").strip()
    if not INSTALLATION.fullmatch(installation):
        raise _not_configured(f"{INSTALLATION_ENV} must name the installation ([a-z0-9][a-z0-9-]{{0,63}})")
    runtime = ClawRunsRuntime(socket=Path(socket), installation=installation)
    registry.register(
        RUNTIME_ID,
        provider=env.get(PROVIDER_ENV, "").strip() or DEFAULT_PROVIDER,
        inspect=runtime.inspect,
        continue_=runtime.continue_,
        detach=runtime.detach,
    )


__all__ = [
    "RUNTIME_ID",
    "ClawRunsError",
    "ClawRunsRuntime",
    "continuation_id",
    "observe",
    "register_agent_session_runtimes",
]
