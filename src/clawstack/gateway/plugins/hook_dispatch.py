"""``api.runtime.hooks.dispatch_hook_agent_turn``: isolated agent turns for untrusted external-content triggers.

Only bundled and trusted plugins may dispatch (an installed plugin gets ``{ok: False, reason}``). A dispatch runs
one agent turn of ``agent_id`` on a ``hook:`` session: the message is always wrapped as external content
(:func:`~clawstack.gateway.dispatch.wrap_external_content`, ``external_content_source="email"`` is the only
source), runs for one session are serialised, and every turn runs on the ``cron`` lane, the budget it shares
with scheduled work; when the HTTP hooks endpoint is enabled one slot of that budget stays reserved for it.
``deliver=True`` announces the final answer on the agent's main session; ``False`` only records it. ``thinking``
(``off``, ``minimal``, ``low``, ``medium``, ``high``) reaches the model as ``reasoning_effort`` (``off``: ``none``).
``idempotency_key`` replays: a second dispatch with the same key on the same session returns the first run's id
(a concurrent duplicate shares the run in flight) and never starts another turn.

A hook turn runs only on a ``hook:`` session, never on an agent's main, channel or subagent session, and the run
host refuses it on a session a plugin owns, so a hook turn cannot land in anyone's conversation.

The answer is a :class:`HookDispatchResult`: ``ok=True`` with the ``run_id`` on admission, ``ok=False`` with a
``reason`` (``"<code>: <text>"``) on refusal; refusals raise nothing. A retired plugin instance raises
:class:`~clawstack.gateway.plugins.api.PluginRetiredError` like every other api use, also when it was retired
while the dispatch was being admitted (the turn the host accepted then keeps its cleanup and completion).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import Final

from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.dispatch import (
    REASONING_EFFORT_BY_THINKING,
    THINKING_LEVELS,
    Requester,
    RunHost,
    RunRequest,
    TurnOptions,
    wrap_external_content,
)
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import SessionKeyError, main_key, normalize_agent_id, parse_session_key
from clawstack.gateway.plugins.api import PluginLifetime, Trust
from clawstack.gateway.plugins.complete import detached

__all__ = [
    "EXTERNAL_CONTENT_SOURCES",
    "HOOK_AGENT_TURNS",
    "THINKING_LEVELS",
    "HookDispatchResult",
    "HookDispatcher",
    "PluginHooks",
]

#: The capability string advertised when hook turns can be dispatched.
HOOK_AGENT_TURNS: Final = "hooks.dispatch_hook_agent_turn"

#: The external-content sources a hook turn may name.
EXTERNAL_CONTENT_SOURCES: Final = ("email",)

#: The longest ``timeout_seconds`` a hook turn may ask for: one hour.
MAX_HOOK_TIMEOUT_S: Final = 3600

_MAX_IDEMPOTENCY_KEY: Final = 256


@dataclass(frozen=True, slots=True)
class HookDispatchResult:
    """``{ok: True, run_id}`` on admission, ``{ok: False, reason}`` on refusal."""

    ok: bool
    run_id: str | None = None
    reason: str | None = None


def _refuse(code: str, text: str) -> HookDispatchResult:
    return HookDispatchResult(ok=False, reason=f"{code}: {text}")


def _bad_hook_key(value: object) -> str | None:
    """Why ``value`` is not an acceptable hook session key, or ``None``."""
    if not isinstance(value, str) or not value.startswith("hook:"):
        return "session_key must begin with hook:"
    for ch in value:
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf"):
            return "session_key may not contain whitespace or control characters"
    try:
        parse_session_key(value)
    except SessionKeyError as exc:
        return f"session_key is not valid: {exc.message}"
    return None


class HookDispatcher:
    """Admits hook turns for every plugin of one gateway (see the module docstring)."""

    def __init__(self, config: GatewayConfig, host: RunHost) -> None:
        self._config = config
        self._host = host

    async def dispatch(
        self,
        plugin_id: str,
        trust: Trust,
        *,
        name: object,
        agent_id: object,
        session_key: object,
        message: object,
        external_content_source: object,
        deliver: object,
        thinking: object,
        timeout_seconds: object,
        idempotency_key: object,
    ) -> HookDispatchResult:
        """Check every argument, then start (or replay) the turn; see the module docstring."""
        if trust not in ("bundled", "trusted"):
            return _refuse("not_permitted", "hook dispatch is available only to bundled and trusted plugins")
        if not isinstance(agent_id, str) or not agent_id.strip():
            return _refuse("invalid_argument", "agent_id is required")
        try:
            agent = normalize_agent_id(agent_id)
            self._config.agent(agent)
        except (SessionKeyError, KeyError):
            return _refuse("unknown_agent", "agent_id names no configured agent")
        problem = _bad_hook_key(session_key)
        if problem is not None:
            return _refuse("invalid_session_key", problem)
        assert isinstance(session_key, str)
        if not isinstance(message, str) or not message.strip():
            return _refuse("invalid_argument", "message must be a non-empty string")
        if name is not None and not isinstance(name, str):
            return _refuse("invalid_argument", "name must be a string")
        if external_content_source not in EXTERNAL_CONTENT_SOURCES:
            return _refuse("invalid_argument", 'external_content_source must be "email"')
        if not isinstance(deliver, bool):
            return _refuse("invalid_argument", "deliver must be True or False")
        if thinking is not None and thinking not in THINKING_LEVELS:
            return _refuse("invalid_argument", f"thinking must be one of {', '.join(THINKING_LEVELS)}")
        if timeout_seconds is not None and (
            isinstance(timeout_seconds, bool)
            or not isinstance(timeout_seconds, int | float)
            or not math.isfinite(timeout_seconds)
            or not 0 < timeout_seconds <= MAX_HOOK_TIMEOUT_S
        ):
            return _refuse(
                "invalid_argument", f"timeout_seconds must be a number above 0, at most {MAX_HOOK_TIMEOUT_S}"
            )
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key or len(idempotency_key) > _MAX_IDEMPOTENCY_KEY
        ):
            return _refuse("invalid_argument", f"idempotency_key must be 1 to {_MAX_IDEMPOTENCY_KEY} characters")
        source = str(external_content_source)
        request = RunRequest(
            session_key=session_key,
            agent_id=agent,
            message=wrap_external_content(message, source=source, name=name),
            lane="cron",
            options=TurnOptions(
                reasoning_effort=REASONING_EFFORT_BY_THINKING[str(thinking)] if thinking is not None else None,
                timeout_s=None if timeout_seconds is None else float(timeout_seconds),
            ),
            idempotency_key=idempotency_key,
            announce_to=Requester(main_key(agent), agent, "gateway", authenticated=False),
            deliver=deliver,
            label=name,
        )
        try:
            with detached():  # the turn outlives the invocation that dispatched it
                started = await self._host.start_run(request)
        except GatewayError as exc:
            return _refuse(exc.code, exc.message)
        return HookDispatchResult(ok=True, run_id=started.run_id)


class PluginHooks:
    """``api.runtime.hooks`` for one plugin instance."""

    def __init__(
        self, plugin_id: str, trust: Trust, lifetime: PluginLifetime, dispatcher: HookDispatcher | None
    ) -> None:
        self._plugin_id = plugin_id
        self._trust: Trust = trust
        self._lifetime = lifetime
        self._dispatcher = dispatcher

    async def dispatch_hook_agent_turn(
        self,
        *,
        agent_id: str,
        session_key: str,
        message: str,
        external_content_source: str = "email",
        name: str | None = None,
        deliver: bool = True,
        thinking: str | None = None,
        timeout_seconds: float | None = None,
        idempotency_key: str | None = None,
    ) -> HookDispatchResult:
        """Admit one hook turn (see the module docstring); never raises for a refusal."""
        self._lifetime.check()
        if self._dispatcher is None:
            return _refuse("unavailable", "this gateway dispatches no hook turns")
        result = await self._dispatcher.dispatch(
            self._plugin_id,
            self._trust,
            name=name,
            agent_id=agent_id,
            session_key=session_key,
            message=message,
            external_content_source=external_content_source,
            deliver=deliver,
            thinking=thinking,
            timeout_seconds=timeout_seconds,
            idempotency_key=idempotency_key,
        )
        self._lifetime.check()
        return result
