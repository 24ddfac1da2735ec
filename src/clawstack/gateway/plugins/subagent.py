"""``api.runtime.subagent``: ``complete``, ``run``, ``wait_for_run``, ``get_session_messages``, ``delete_session``.

:class:`PluginSubagent` is one plugin instance's facade: it checks arguments and the instance's lifetime, then
calls the gateway-wide :class:`~clawstack.gateway.plugins.complete.SubagentCompleter` (``complete``) or
:class:`SubagentRunner` (the rest).

``run`` starts an agent turn on a session of the plugin's choosing (an agent key such as
``agent:main:subagent:search-helper``) on the shared ``subagent`` lane, one run per session at a time, and
returns at once with the accepted run id and the normalised session key. The session is created owned by the
plugin (``plugin:<id>``); a session that exists and belongs to anyone else is refused, so a plugin can neither
write into nor read nor delete another's conversation. Options:

* ``tools_also_allow``: exact names of tools this plugin registered (``api.register_tool``) added to the run's
  candidate tools; a core tool, another plugin's tool or an unknown name is refused. The global and the agent's
  tool policy still narrow the surface, explicit allow-lists and denies included.
* ``prompt_mode="minimal"``: the bounded subagent prompt and only this run's messages (the only mode offered;
  omit it for the full prompt). ``disable_tools=True``: the exact empty tool surface.
* ``provider``/``model``: an override, checked against ``plugins.entries.<id>.subagent`` exactly as for
  ``complete`` (refused, never downgraded). ``model`` may be canonical (``provider/model``) or, with
  ``provider`` omitted, a model id of the agent's primary provider.
* ``deliver``: announce the final answer (to the agent's main session, or with
  ``completion_delivery="current-requester"`` to the requester a ``before_dispatch`` hook captured). The
  requester-bound variant exists only on ``ctx.subagent`` of such a hook handling an authenticated request.

``wait_for_run`` returns a :class:`WaitResult`: ``ok``, ``error`` and ``timeout`` are terminal outcomes (``timeout``
means the *run* hit its deadline); ``pending`` means ``timeout_ms`` passed first, which never cancels the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from clawstack.gateway.config import GatewayConfig, split_model_ref
from clawstack.gateway.dispatch import Requester, RunHost, RunRequest, SessionOwnerError, TurnOptions
from clawstack.gateway.keys import SessionKeyError, main_key, parse_session_key
from clawstack.gateway.plugins.api import (
    PluginLifetime,
    SubagentArgumentError,
    SubagentRequesterError,
    SubagentRunNotFoundError,
    SubagentSessionBusyError,
    SubagentSessionForbiddenError,
    SubagentToolRefusedError,
    SubagentUnavailableError,
)
from clawstack.gateway.plugins.complete import DEFAULT_COMPLETE_TIMEOUT_MS, CompleteResult, SubagentCompleter
from clawstack.gateway.sessions import MAX_HISTORY_LIMIT, Message, Run, SessionStore
from clawstack.gateway.tools import ToolRegistry

__all__ = [
    "DEFAULT_WAIT_TIMEOUT_MS",
    "SUBAGENT_RUN",
    "PluginSubagent",
    "RequestSubagent",
    "SessionMessages",
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
    """The standard wait result; the optional metadata is ``None`` where it is not known."""

    status: WaitStatus
    run_id: str
    error: str | None = None
    started_at: int | None = None
    ended_at: int | None = None
    stop_reason: str | None = None
    liveness_state: Literal["queued", "running", "ended"] | None = None
    yielded: bool | None = None
    pending_error: str | None = None
    timeout_phase: Literal["run", "wait"] | None = None
    provider_started: bool | None = None
    terminal_reply: str | None = None


@dataclass(frozen=True, slots=True)
class SessionMessages:
    """``get_session_messages``' answer: the newest ``limit`` messages, oldest first, in the ``chat.history`` shape."""

    session_key: str
    messages: tuple[dict[str, Any], ...]
    total: int


def _text(message: Message) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(str(block.get("text", "")) for block in content if block.get("type") == "text")


class SubagentRunner:
    """The gateway side of ``subagent.run`` and friends, shared by every plugin (see the module docstring)."""

    def __init__(
        self,
        config: GatewayConfig,
        store: SessionStore,
        host: RunHost,
        tools: ToolRegistry,
        completer: SubagentCompleter,
    ) -> None:
        self._config = config
        self._store = store
        self._host = host
        self._tools = tools
        self._completer = completer

    async def run(
        self,
        plugin_id: str,
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
    ) -> SubagentRun:
        """Start one run for ``plugin_id``; arguments are already checked for type."""
        try:
            parsed = parse_session_key(session_key)
        except SessionKeyError as exc:
            raise SubagentArgumentError(f"session_key is not valid: {exc.message}") from None
        if parsed.agent_id is None:
            raise SubagentArgumentError("session_key must be an agent session key (agent:<id>:…)")
        agent_id = parsed.agent_id
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
        try:
            started = await self._host.start_run(request)
        except SessionOwnerError:
            raise SubagentSessionForbiddenError(
                f"session {json.dumps(str(parsed))} exists and was not created by plugin {plugin_id!r}"
            ) from None
        return SubagentRun(started.run_id, started.session_key)

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
        try:
            agent_id = parse_session_key(session_key).agent_id
        except SessionKeyError as exc:
            raise SubagentArgumentError(f"session_key is not valid: {exc.message}") from None
        if agent_id is None:
            return model  # refused as not an agent session key when the run is started
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

    async def wait_for_run(self, plugin_id: str, run_id: str, timeout_ms: int) -> WaitResult:
        """Wait up to ``timeout_ms`` for a run ``plugin_id`` started; see :class:`WaitResult`."""
        session = await asyncio.to_thread(self._store.run_session, run_id)
        if session is None or session.owner != plugin_owner(plugin_id):
            raise SubagentRunNotFoundError(f"plugin {plugin_id!r} started no run {json.dumps(run_id)}")
        run = await self._host.wait_run(run_id, timeout_ms / 1000)
        if run is None:  # pragma: no cover - a recorded run is never removed
            raise SubagentRunNotFoundError(f"run {json.dumps(run_id)} is gone")
        messages = await asyncio.to_thread(self._store.run_messages, run_id)
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
            "terminal_reply": None if last is None else _text(last),
        }
        if run.state == "ok":
            stop = "stop" if last is None or last.stop_reason is None else last.stop_reason
            return WaitResult(status="ok", stop_reason=stop, **common)
        if run.state == "timeout":
            return WaitResult(status="timeout", error=run.error, stop_reason="timeout", timeout_phase="run", **common)
        return WaitResult(status="error", error=run.error, stop_reason=run.state, **common)

    async def get_session_messages(self, plugin_id: str, session_key: str, limit: int) -> SessionMessages:
        """The newest ``limit`` messages of a session ``plugin_id`` created."""
        key = await self._own_session(plugin_id, session_key)
        page = await asyncio.to_thread(self._store.history, key, limit=limit)
        return SessionMessages(key, tuple(m.to_wire() for m in page.messages), page.total)

    async def delete_session(self, plugin_id: str, session_key: str) -> bool:
        """Delete a session ``plugin_id`` created; refused while a run is in flight on it."""
        key = await self._own_session(plugin_id, session_key)
        if await asyncio.to_thread(self._store.active_runs, key):
            raise SubagentSessionBusyError(f"session {json.dumps(key)} has a run in flight")
        return await asyncio.to_thread(self._store.delete, key)

    async def _own_session(self, plugin_id: str, session_key: str) -> str:
        try:
            key = str(parse_session_key(session_key))
        except SessionKeyError as exc:
            raise SubagentArgumentError(f"session_key is not valid: {exc.message}") from None
        session = await asyncio.to_thread(self._store.get, key)
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

    def bound_to(self, requester: Requester, scope: PluginLifetime, *, completion_delivery: bool) -> RequestSubagent:
        """The request-bound runtime a dispatch hook handler gets (``ctx.subagent``); it dies with ``scope``."""
        return RequestSubagent(self, requester, scope, completion_delivery=completion_delivery)

    def _check_live(self) -> None:
        self._lifetime.check()

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
        ``agent_not_found`` / ``model_not_found`` errors.
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
    ) -> SubagentRun:
        """Start a background agent run on ``session_key``; returns its run id and the accepted session key.

        ``completion_delivery="current-requester"`` is refused (:class:`SubagentRequesterError`) except on the
        request-bound runtime of a ``before_dispatch`` hook handling an authenticated request (``ctx.subagent``).
        """
        announce_to = self._completion_target(completion_delivery)
        runner = self._require_runner()
        _check_text("session_key", session_key)
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
        canonical = runner.canonical_model(session_key, provider, model)
        return await runner.run(
            self._plugin_id,
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
        return await runner.wait_for_run(self._plugin_id, run_id, timeout_ms)

    async def get_session_messages(self, session_key: str, *, limit: int = 50) -> SessionMessages:
        """The newest ``limit`` (1 to 1000) messages of a session this plugin created, oldest first."""
        runner = self._require_runner()
        _check_text("session_key", session_key)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY_LIMIT:
            raise SubagentArgumentError(f"limit must be a whole number from 1 to {MAX_HISTORY_LIMIT}")
        return await runner.get_session_messages(self._plugin_id, session_key, limit)

    async def delete_session(self, session_key: str) -> bool:
        """Delete a session this plugin created through ``run``; ``True`` once deleted."""
        runner = self._require_runner()
        _check_text("session_key", session_key)
        return await runner.delete_session(self._plugin_id, session_key)


class RequestSubagent(PluginSubagent):
    """``ctx.subagent`` of a dispatch hook: the plugin's runtime bound to the request's requester.

    It fails closed (:class:`~clawstack.gateway.plugins.api.PluginRetiredError`) once the handler settled or the
    plugin instance was retired. ``run(..., completion_delivery="current-requester")`` is accepted only where the
    gateway offered it (a ``before_dispatch`` hook of an authenticated request).
    """

    def __init__(
        self, base: PluginSubagent, requester: Requester, scope: PluginLifetime, *, completion_delivery: bool
    ) -> None:
        super().__init__(base._plugin_id, base._lifetime, base._completer, base._runner)
        self._requester = requester
        self._scope = scope
        self._completion_delivery = completion_delivery

    def _check_live(self) -> None:
        self._scope.check()
        super()._check_live()

    def _completion_target(self, completion_delivery: object) -> Requester | None:
        if completion_delivery is not None and self._completion_delivery:
            self._check_live()
            if completion_delivery != "current-requester":
                raise SubagentArgumentError('completion_delivery must be "current-requester" or None')
            return self._requester
        return super()._completion_target(completion_delivery)
