"""``api.runtime.subagent``: ``complete``, ``run``, ``wait_for_run``, ``get_session_messages``, ``delete_session``.

:class:`PluginSubagent` is one plugin instance's facade: it checks arguments and the instance's lifetime, then
calls the gateway-wide :class:`~clawstack.gateway.plugins.complete.SubagentCompleter` (``complete``) or
:class:`SubagentRunner` (the rest).

**Custody.** ``run`` is confined to subagent session keys, ``agent:<id>:subagent:<name>``: a main, channel,
thread or hook key is refused (:class:`~clawstack.gateway.plugins.api.SubagentArgumentError`) before anything is
recorded, so a plugin can never claim a conversation a person or a channel will write to. The session is created
owned by the plugin (``plugin:<id>``); a session that exists and belongs to anyone else (created by a chat, a
channel or another plugin) is refused, and the run host refuses chat, channel, hook and cron runs on a
plugin-owned session, so neither side ever lands in the other's conversation. ``get_session_messages`` and
``delete_session`` take the same keys and see only sessions the plugin created; ``wait_for_run`` sees only runs
the plugin started, and answers a run of anyone else's session exactly as a run that does not exist.

``run`` starts an agent turn on the ``subagent`` lane, one run per session at a time, and returns at once with
the accepted run id and the normalised session key. Options:

* ``tools_also_allow``: exact names of tools this plugin registered (``api.register_tool``) added to the run's
  candidate tools; a core tool, another plugin's tool or an unknown name is refused. The global and the agent's
  tool policy still narrow the surface, explicit allow-lists and denies included.
* ``prompt_mode="minimal"``: the bounded subagent prompt and only this run's messages (the only mode offered;
  omit it for the full prompt). ``disable_tools=True``: the exact empty tool surface.
* ``provider``/``model``: an override, checked against ``plugins.entries.<id>.subagent`` and the destination
  agent's model configuration exactly as for ``complete`` (refused, never downgraded); the agent's configured
  fallbacks still follow it. ``model`` may be canonical (``provider/model``) or, with ``provider`` omitted, a
  model id of the agent's primary provider.
* ``deliver``: announce the completion (to the agent's main session, or with
  ``completion_delivery="current-requester"`` to the requester a ``before_dispatch`` hook captured). The
  requester-bound variant exists only on ``ctx.subagent`` of such a hook handling an authenticated request.
* ``assert_current``: the :class:`~clawstack.gateway.authority.AuthorityAssertion` an owner-authorized command
  captured. At admission the gateway checks that the requester still holds that operator authority; if not, the
  run is refused with :class:`SubagentAuthorityRevokedError` (``requester_authority_revoked``) and nothing is
  recorded. An admitted run stays retained under the assertion until it ends
  (:meth:`~clawstack.gateway.authority.OperatorAuthority.retain`), so revoking that authority later reaches it.

``wait_for_run`` returns a :class:`WaitResult`: ``ok``, ``error`` and ``timeout`` are terminal outcomes (``timeout``
means the *run* hit its deadline); ``pending`` means ``timeout_ms`` passed first, which never cancels the run.
``yielded`` and ``pending_error`` are never set here: these runs cannot yield (a turn ends only with its final
answer, an error, its deadline or an abort), and a run reports an error only once it has ended with it (a failed
model call that a fallback model takes over from is not an error of the run).

**Lifetime.** The plugin instance's lifetime (and, on ``ctx.subagent``, the dispatch hook invocation's) is
checked before every call and again after every await: a retirement during a call raises
:class:`~clawstack.gateway.plugins.api.PluginRetiredError` and nothing further happens (a read returns nothing, a
delete is not made, a wait ends at once). A run the host accepted keeps its cleanup and completion.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from clawstack.gateway.authority import (
    AuthorityAssertion,
    AuthorityAssertionError,
    AuthorityRevokedError,
    OperatorAuthority,
)
from clawstack.gateway.config import GatewayConfig, split_model_ref
from clawstack.gateway.dispatch import Requester, RunHost, RunRequest, SessionOwnerError, TurnOptions
from clawstack.gateway.keys import SessionKey, SessionKeyError, main_key, parse_session_key
from clawstack.gateway.plugins.api import (
    PluginLifetime,
    SubagentArgumentError,
    SubagentError,
    SubagentRequesterError,
    SubagentRunNotFoundError,
    SubagentSessionBusyError,
    SubagentSessionForbiddenError,
    SubagentToolRefusedError,
    SubagentUnavailableError,
)
from clawstack.gateway.plugins.complete import (
    DEFAULT_COMPLETE_TIMEOUT_MS,
    CompleteResult,
    SubagentCompleter,
    current_invocation,
    detached,
)
from clawstack.gateway.plugins.native_facade import NativeFacade, current_native
from clawstack.gateway.sessions import MAX_HISTORY_LIMIT, Message, Run, SessionStore, content_text
from clawstack.gateway.tools import ToolRegistry

__all__ = [
    "DEFAULT_WAIT_TIMEOUT_MS",
    "SUBAGENT_RUN",
    "PluginSubagent",
    "RequestSubagent",
    "SessionMessages",
    "SubagentAuthorityRevokedError",
    "SubagentRun",
    "SubagentRunner",
    "WaitResult",
    "WaitStatus",
    "plugin_owner",
]

#: The capability string advertised when ``run`` and friends are wired.
SUBAGENT_RUN: Final = "subagent.run"

#: ``wait_for_run``'s ``timeout_ms`` when the caller gives none.
DEFAULT_WAIT_TIMEOUT_MS: Final = 30_000

#: The longest ``wait_for_run`` wait: one day.
MAX_WAIT_TIMEOUT_MS: Final = 86_400_000

WaitStatus = Literal["ok", "error", "timeout", "pending"]

_T = TypeVar("_T")


class SubagentAuthorityRevokedError(SubagentError):
    """``run(assert_current=…)``: the requester no longer holds the operator authority the command captured."""

    code = "requester_authority_revoked"


def plugin_owner(plugin_id: str) -> str:
    """The session owner recorded for sessions ``plugin_id`` creates."""
    return f"plugin:{plugin_id}"


@dataclass(frozen=True, slots=True)
class SubagentRun:
    """What ``run`` accepted: the run id and the normalised session key it runs on."""

    run_id: str
    session_key: str


@dataclass(frozen=True, slots=True)
class WaitResult:
    """The standard wait result; the optional metadata is ``None`` where it is not known or does not apply.

    ``yielded`` and ``pending_error`` keep OpenClaw's shape (``True`` or absent) and are always ``None`` here (see
    the module docstring).
    """

    status: WaitStatus
    run_id: str
    error: str | None = None
    started_at: int | None = None
    ended_at: int | None = None
    stop_reason: str | None = None
    liveness_state: Literal["queued", "running", "ended"] | None = None
    yielded: Literal[True] | None = None
    pending_error: Literal[True] | None = None
    timeout_phase: Literal["run", "wait"] | None = None
    provider_started: bool | None = None
    terminal_reply: str | None = None


@dataclass(frozen=True, slots=True)
class SessionMessages:
    """``get_session_messages``' answer: the newest ``limit`` messages, oldest first, in the ``chat.history`` shape."""

    session_key: str
    messages: tuple[dict[str, Any], ...]
    total: int


class _Live:
    """The lifetimes one call depends on: the plugin instance's and, for ``ctx.subagent``, its invocation's."""

    def __init__(self, lifetimes: Sequence[PluginLifetime]) -> None:
        self._lifetimes = tuple(lifetimes)

    def check(self) -> None:
        """:class:`~clawstack.gateway.plugins.api.PluginRetiredError` once any of them has ended."""
        for lifetime in self._lifetimes:
            lifetime.check()

    async def until_retired(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Await ``work``; cancel it and raise ``PluginRetiredError`` as soon as a lifetime ends."""
        self.check()
        task = asyncio.ensure_future(work)

        def cancel() -> None:
            task.cancel()

        removers = [lifetime.on_retire(cancel) for lifetime in self._lifetimes]
        try:
            await asyncio.wait((task,))
        finally:
            for remove in removers:
                remove()
            if not task.done():
                # Best-effort shutdown step on the caller's cancellation: the work is only a wait, stop it too.
                task.cancel()
                await asyncio.wait((task,))
        self.check()
        return task.result()


class SubagentRunner:
    """The gateway side of ``subagent.run`` and friends, shared by every plugin (see the module docstring).

    ``authority`` is the gateway's live operator authority; without it no assertion can be checked, so
    ``run(assert_current=…)`` is refused.
    """

    def __init__(
        self,
        config: GatewayConfig,
        store: SessionStore,
        host: RunHost,
        tools: ToolRegistry,
        completer: SubagentCompleter,
        *,
        authority: OperatorAuthority | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._host = host
        self._tools = tools
        self._completer = completer
        self._authority = authority

    @staticmethod
    def subagent_key(session_key: object) -> SessionKey:
        """``session_key`` parsed; :class:`SubagentArgumentError` unless it is ``agent:<id>:subagent:<name>``."""
        try:
            parsed = parse_session_key(session_key)
        except SessionKeyError as exc:
            raise SubagentArgumentError(f"session_key is not valid: {exc.message}") from None
        if parsed.kind != "subagent":
            raise SubagentArgumentError(
                f"session_key must be a subagent session key agent:<agent-id>:subagent:<name>, not a {parsed.kind}"
                " session key: plugins run only in subagent sessions they create"
            )
        return parsed

    async def run(
        self,
        plugin_id: str,
        live: _Live,
        *,
        session_key: str,
        message: str,
        tools_also_allow: tuple[str, ...],
        prompt_mode: Literal["full", "minimal"],
        disable_tools: bool,
        model: str | None,
        extra_system_prompt: str | None,
        deliver: bool,
        announce_to: Requester | None,
        idempotency_key: str | None,
        assertion: AuthorityAssertion | None = None,
    ) -> SubagentRun:
        """Start one run for ``plugin_id``; arguments are already checked for type."""
        parsed = self.subagent_key(session_key)
        agent_id = parsed.agent_id
        assert agent_id is not None  # a subagent key always names its agent
        resolved = None if model is None else self._completer.model_chain(plugin_id, agent_id, model)[0]
        for name in tools_also_allow:
            self._check_own_tool(plugin_id, name)
        if announce_to is None and deliver:
            announce_to = Requester(main_key(agent_id), agent_id, "gateway", authenticated=False)
        request = RunRequest(
            session_key=str(parsed),
            agent_id=agent_id,
            message=message,
            lane="subagent",
            options=TurnOptions(
                extra_system_prompt=extra_system_prompt,
                model=resolved,
                also_allow=tools_also_allow,
                disable_tools=disable_tools,
                prompt_mode=prompt_mode,
                timeout_s=float(self._config.agents.defaults.subagents.run_timeout_seconds),
            ),
            owner=plugin_owner(plugin_id),
            idempotency_key=idempotency_key,
            announce_to=announce_to,
            deliver=deliver,
        )
        # Admission: the last checks before the host records anything, with no await between them and the call.
        authority = self._admit(assertion)
        live.check()
        try:
            with detached():  # the run outlives the invocation that started it
                started = await self._host.start_run(request)
        except SessionOwnerError:
            raise SubagentSessionForbiddenError(
                f"session {json.dumps(str(parsed))} exists and was not created by plugin {plugin_id!r}"
            ) from None
        if authority is not None and assertion is not None and started.status == "started":
            # Retained under the assertion until it ends; a revocation during the start reaches it at once.
            authority.retain(started.run_id, assertion)
            self._admit(assertion)
        live.check()
        return SubagentRun(started.run_id, started.session_key)

    def _admit(self, assertion: AuthorityAssertion | None) -> OperatorAuthority | None:
        """Check ``assertion`` (if any) against the current operator authority."""
        if assertion is None:
            return None
        authority = self._authority
        if authority is None:
            raise SubagentArgumentError("assert_current: this gateway keeps no operator authority to check it against")
        try:
            authority.check(assertion)
        except AuthorityAssertionError:
            raise SubagentArgumentError("assert_current is not an authority assertion this gateway issued") from None
        except AuthorityRevokedError as exc:
            raise SubagentAuthorityRevokedError(f"the requester's authority was revoked: {exc.message}") from None
        return authority

    def canonical_model(self, session_key: str, provider: str | None, model: str | None) -> str | None:
        """``provider``/``model`` as one ``provider/model`` reference (a bare model id: the agent's provider)."""
        if model is None:
            if provider is not None:
                raise SubagentArgumentError("provider needs a model")
            return None
        if provider is not None:
            return f"{provider}/{model}"
        if "/" in model:
            return model
        agent_id = self.subagent_key(session_key).agent_id
        assert agent_id is not None  # a subagent key always names its agent
        try:
            primary = self._config.agent_model(agent_id).chain[0]
        except KeyError:
            return model  # the unknown agent is reported when the run is started
        return f"{split_model_ref(primary)[0]}/{model}"

    def _check_own_tool(self, plugin_id: str, name: str) -> None:
        if name not in self._tools:
            raise SubagentToolRefusedError(f"tools_also_allow: no tool {json.dumps(name)} is registered")
        owner = self._tools.owner(name)
        if owner is None:
            raise SubagentToolRefusedError(f"tools_also_allow: {json.dumps(name)} is a core tool")
        if owner != plugin_id:
            raise SubagentToolRefusedError(
                f"tools_also_allow: {json.dumps(name)} is not a tool of plugin {plugin_id!r}"
            )

    async def wait_for_run(self, plugin_id: str, live: _Live, run_id: str, timeout_ms: int) -> WaitResult:
        """Wait up to ``timeout_ms`` for a run ``plugin_id`` started; see :class:`WaitResult`."""
        session = await asyncio.to_thread(self._store.run_session, run_id)
        live.check()
        if session is None or session.owner != plugin_owner(plugin_id):
            # The same answer for a run of someone else's session as for no run at all.
            raise SubagentRunNotFoundError(f"plugin {plugin_id!r} started no run {json.dumps(run_id)}")
        run = await live.until_retired(self._host.wait_run(run_id, timeout_ms / 1000))
        if run is None:  # pragma: no cover - a recorded run is never removed
            raise SubagentRunNotFoundError(f"run {json.dumps(run_id)} is gone")
        messages = await asyncio.to_thread(self._store.run_messages, run_id)
        live.check()
        return self._wait_result(run, messages)

    def _wait_result(self, run: Run, messages: Sequence[Message]) -> WaitResult:
        replies = [m for m in messages if m.role == "assistant"]
        if run.active:
            return WaitResult(
                status="pending",
                run_id=run.run_id,
                started_at=run.started_at_ms,
                liveness_state="queued" if self._host.is_queued(run.run_id) else "running",
                timeout_phase="wait",
                provider_started=True if replies else None,
            )
        last = replies[-1] if replies else None
        common: dict[str, Any] = {
            "run_id": run.run_id,
            "started_at": run.started_at_ms,
            "ended_at": run.ended_at_ms,
            "liveness_state": "ended",
            "provider_started": bool(replies),
            "terminal_reply": None if last is None else content_text(last.content),
        }
        if run.state == "ok":
            stop = "stop" if last is None or last.stop_reason is None else last.stop_reason
            return WaitResult(status="ok", stop_reason=stop, **common)
        if run.state == "timeout":
            return WaitResult(status="timeout", error=run.error, stop_reason="timeout", timeout_phase="run", **common)
        return WaitResult(status="error", error=run.error, stop_reason=run.state, **common)

    async def get_session_messages(self, plugin_id: str, live: _Live, session_key: str, limit: int) -> SessionMessages:
        """The newest ``limit`` messages of a session ``plugin_id`` created."""
        key = await self._own_session(plugin_id, live, session_key)
        page = await asyncio.to_thread(self._store.history, key, limit=limit)
        live.check()
        return SessionMessages(key, tuple(m.to_wire() for m in page.messages), page.total)

    async def delete_session(self, plugin_id: str, live: _Live, session_key: str) -> bool:
        """Delete a session ``plugin_id`` created; refused while a run is in flight on it."""
        key = await self._own_session(plugin_id, live, session_key)
        busy = await asyncio.to_thread(self._store.active_runs, key)
        live.check()
        if busy:
            raise SubagentSessionBusyError(f"session {json.dumps(key)} has a run in flight")
        deleted = await asyncio.to_thread(self._store.delete, key)
        live.check()
        return deleted

    async def _own_session(self, plugin_id: str, live: _Live, session_key: str) -> str:
        key = str(self.subagent_key(session_key))
        session = await asyncio.to_thread(self._store.get, key)
        live.check()
        if session is None or session.owner != plugin_owner(plugin_id):
            raise SubagentSessionForbiddenError(
                f"plugin {plugin_id!r} has no session {json.dumps(key)} (only sessions it created are visible)"
            )
        return key


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SubagentArgumentError(f"{name} must be a non-empty string")
    return value


def _check_optional_text(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise SubagentArgumentError(f"{name} must be a string")
    return value


def _check_ms(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SubagentArgumentError(f"{name} must be a whole number of milliseconds, at least {minimum}")
    if maximum is not None and value > maximum:
        raise SubagentArgumentError(f"{name} may be at most {maximum}")
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SubagentArgumentError(f"{name} must be True or False")
    return value


class PluginSubagent:
    """``api.runtime.subagent`` for one plugin instance (see the module docstring)."""

    def __init__(
        self,
        plugin_id: str,
        lifetime: PluginLifetime,
        completer: SubagentCompleter | None,
        runner: SubagentRunner | None = None,
    ) -> None:
        self._plugin_id = plugin_id
        self._lifetime = lifetime
        self._completer = completer
        self._runner = runner

    def bound_to(
        self,
        requester: Requester,
        scope: PluginLifetime,
        *,
        completion_delivery: bool,
        native: NativeFacade | None = None,
    ) -> RequestSubagent:
        """The request-bound runtime a dispatch hook handler gets (``ctx.subagent``); it dies with ``scope``."""
        return RequestSubagent(self, requester, scope, completion_delivery=completion_delivery, native=native)

    @property
    def native(self) -> NativeFacade | None:
        """The requester-bound native children of the eligible ``reply_dispatch`` invocation of this plugin running
        now, or ``None`` (see :mod:`clawstack.gateway.plugins.native_facade`)."""
        return current_native(self._plugin_id)

    def _live(self) -> _Live:
        return _Live((self._lifetime,))

    def _invocation(self) -> PluginLifetime | None:
        """The invocation a ``complete`` started now belongs to (see ``plugins.complete.invocation_scope``)."""
        return current_invocation(self._plugin_id)

    def _check_live(self) -> None:
        self._live().check()

    def _require_runner(self) -> SubagentRunner:
        self._check_live()
        if self._runner is None:
            raise SubagentUnavailableError("this gateway runs no subagent runs")
        return self._runner

    async def complete(
        self,
        agent_id: str,
        message: str,
        *,
        extra_system_prompt: str | None = None,
        model: str | None = None,
        timeout_ms: int = DEFAULT_COMPLETE_TIMEOUT_MS,
        signal: asyncio.Event | None = None,
    ) -> CompleteResult:
        """Tool-free isolated inference by ``agent_id``'s model on ``message``; see ``plugins.complete``.

        Raises ``ModelOverrideRefusedError``, ``SubagentCancelledError``, ``SubagentTimeoutError``,
        ``SubagentModelError``, ``PluginRetiredError``, ``SubagentArgumentError``, and the agent loop's
        ``agent_not_found`` error.
        """
        self._check_live()
        if self._completer is None:
            raise SubagentUnavailableError("this gateway runs no subagent completions")
        _check_text("agent_id", agent_id)
        _check_text("message", message)
        _check_optional_text("extra_system_prompt", extra_system_prompt)
        _check_optional_text("model", model)
        _check_ms("timeout_ms", timeout_ms, minimum=1)
        if signal is not None and not isinstance(signal, asyncio.Event):
            raise SubagentArgumentError("signal must be an asyncio.Event")
        return await self._completer.complete(
            self._plugin_id,
            self._lifetime,
            agent_id,
            message,
            extra_system_prompt=extra_system_prompt,
            model=model,
            timeout_ms=timeout_ms,
            signal=signal,
            invocation=self._invocation(),
        )

    async def run(
        self,
        *,
        session_key: str,
        message: str,
        tools_also_allow: Sequence[str] = (),
        prompt_mode: Literal["minimal"] | None = None,
        disable_tools: bool = False,
        provider: str | None = None,
        model: str | None = None,
        extra_system_prompt: str | None = None,
        deliver: bool = False,
        completion_delivery: Literal["current-requester"] | None = None,
        idempotency_key: str | None = None,
        assert_current: AuthorityAssertion | None = None,
    ) -> SubagentRun:
        """Start a background agent run on the subagent session ``session_key``; returns its run id and the key.

        ``session_key`` must be ``agent:<id>:subagent:<name>``. ``completion_delivery="current-requester"`` is
        refused (:class:`SubagentRequesterError`) except on the request-bound runtime of a ``before_dispatch`` hook
        handling an authenticated request (``ctx.subagent``). ``assert_current`` is an owner-authorized command's
        captured assertion, checked at admission (:class:`SubagentAuthorityRevokedError`).
        """
        announce_to = self._completion_target(completion_delivery)
        runner = self._require_runner()
        _check_text("session_key", session_key)
        runner.subagent_key(session_key)
        _check_text("message", message)
        if isinstance(tools_also_allow, str) or not isinstance(tools_also_allow, Sequence):
            raise SubagentArgumentError("tools_also_allow must be a list of tool names")
        names: list[str] = []
        for name in tools_also_allow:
            if not isinstance(name, str) or not name or name.startswith("group:"):
                raise SubagentArgumentError("tools_also_allow holds exact tool names (no groups)")
            if name not in names:
                names.append(name)
        if prompt_mode not in (None, "minimal"):
            raise SubagentArgumentError('prompt_mode must be "minimal" or None (the full prompt)')
        _check_bool("disable_tools", disable_tools)
        if disable_tools and names:
            raise SubagentArgumentError("disable_tools=True leaves no tools to also allow")
        _check_bool("deliver", deliver)
        _check_optional_text("extra_system_prompt", extra_system_prompt)
        _check_optional_text("idempotency_key", idempotency_key)
        _check_optional_text("provider", provider)
        _check_optional_text("model", model)
        if assert_current is not None and not isinstance(assert_current, AuthorityAssertion):
            raise SubagentArgumentError("assert_current must be the assertion a command context carries, or None")
        canonical = runner.canonical_model(session_key, provider, model)
        return await runner.run(
            self._plugin_id,
            self._live(),
            session_key=session_key,
            message=message,
            tools_also_allow=tuple(names),
            prompt_mode="minimal" if prompt_mode == "minimal" else "full",
            disable_tools=disable_tools,
            model=canonical,
            extra_system_prompt=extra_system_prompt,
            deliver=deliver or announce_to is not None,
            announce_to=announce_to,
            idempotency_key=idempotency_key,
            assertion=assert_current,
        )

    def _completion_target(self, completion_delivery: object) -> Requester | None:
        """Where ``completion_delivery`` sends the completion; this runtime has no requester to deliver to."""
        self._check_live()
        if completion_delivery is None:
            return None
        if completion_delivery != "current-requester":
            raise SubagentArgumentError('completion_delivery must be "current-requester" or None')
        raise SubagentRequesterError(
            'completion_delivery="current-requester" is available only inside a before_dispatch hook'
            " handling an authenticated request"
        )

    async def wait_for_run(self, run_id: str, *, timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS) -> WaitResult:
        """Wait up to ``timeout_ms`` (0: just look) for a run this plugin started; never cancels the run."""
        runner = self._require_runner()
        _check_text("run_id", run_id)
        _check_ms("timeout_ms", timeout_ms, minimum=0, maximum=MAX_WAIT_TIMEOUT_MS)
        return await runner.wait_for_run(self._plugin_id, self._live(), run_id, timeout_ms)

    async def get_session_messages(self, session_key: str, *, limit: int = 50) -> SessionMessages:
        """The newest ``limit`` (1 to 1000) messages of a subagent session this plugin created, oldest first."""
        runner = self._require_runner()
        _check_text("session_key", session_key)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY_LIMIT:
            raise SubagentArgumentError(f"limit must be a whole number from 1 to {MAX_HISTORY_LIMIT}")
        return await runner.get_session_messages(self._plugin_id, self._live(), session_key, limit)

    async def delete_session(self, session_key: str) -> bool:
        """Delete a subagent session this plugin created through ``run``; ``True`` once deleted."""
        runner = self._require_runner()
        _check_text("session_key", session_key)
        return await runner.delete_session(self._plugin_id, self._live(), session_key)


class RequestSubagent(PluginSubagent):
    """``ctx.subagent`` of a dispatch hook: the plugin's runtime bound to the request's requester.

    It fails closed (:class:`~clawstack.gateway.plugins.api.PluginRetiredError`) once the handler settled or the
    plugin instance was retired, and a ``complete`` started through it is cancelled when the handler settles.
    ``run(..., completion_delivery="current-requester")`` is accepted only where the gateway offered it (a
    ``before_dispatch`` hook of an authenticated request).
    """

    def __init__(
        self,
        base: PluginSubagent,
        requester: Requester,
        scope: PluginLifetime,
        *,
        completion_delivery: bool,
        native: NativeFacade | None = None,
    ) -> None:
        super().__init__(base._plugin_id, base._lifetime, base._completer, base._runner)
        self._requester = requester
        self._scope = scope
        self._completion_delivery = completion_delivery
        self._native = native

    @property
    def native(self) -> NativeFacade | None:
        """This invocation's native children (an eligible ``reply_dispatch`` handler's), else ``None``; a kept
        facade fails closed once the handler settled."""
        return self._native

    def _live(self) -> _Live:
        return _Live((self._scope, self._lifetime))

    def _invocation(self) -> PluginLifetime | None:
        return self._scope

    def _completion_target(self, completion_delivery: object) -> Requester | None:
        if completion_delivery is not None and self._completion_delivery:
            self._check_live()
            if completion_delivery != "current-requester":
                raise SubagentArgumentError('completion_delivery must be "current-requester" or None')
            return self._requester
        return super()._completion_target(completion_delivery)
