"""The gateway's built-in chat commands: ``/stop``, ``/reset``, ``/new``, ``/status``, ``/help``, ``/model``.

A chat message ``/name [args]`` whose name is reserved (:data:`RESERVED_COMMANDS`) never reaches the model:

* ``/stop`` aborts the session's runs in flight (agent turns and plugin command calls alike); the ``chat.send``
  answer is ``{"ok": true, "aborted": bool, "runIds": [...]}`` and no run is started (as on OpenClaw).
* ``/reset`` and ``/new`` abort the session's runs in flight and start a new incarnation of the session (a new
  ``session_id``, an empty transcript; the native children of the old incarnation stay in custody, and answer
  ``not_owner`` to the new one). The answer, ``✅ Session reset.`` or ``✅ New session started.``, is the first
  exchange of the new transcript.
* ``/status``, ``/help`` and ``/model`` answer with text and record the exchange in the transcript. ``/model``
  only shows the session's model and the configured ones: choosing another (``/model <ref>``) is not supported.
* ``/think``, ``/verbose``, ``/whoami`` and ``/commands`` are reserved names this gateway does not implement: they
  answer so, and never reach the model.

The answers of the last three kinds run as a chat run (a ``chat`` ``final`` event with the text), outside the
session's lane, so ``/status`` answers while a long turn is running.

**Scopes.** A Gateway client (``chat.send``) needs the operator scope :data:`COMMAND_SCOPES` names for a built-in
command, and :data:`PLUGIN_COMMAND_SCOPES` the one for a plugin command, by its ``require_auth``; an agent turn
needs what ``chat.send`` itself needs (:data:`~clawstack.gateway.protocol.METHOD_SCOPES`). Changing a session's
incarnation is admin work, as the ``sessions.reset`` method is; so is a ``require_auth`` plugin command, which runs
with the sender's operator authority and may start background work under it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.protocol import OperatorScope
from clawstack.gateway.sessions import SessionStore

__all__ = [
    "BUILTIN_COMMANDS",
    "COMMAND_SCOPES",
    "PLUGIN_COMMAND_SCOPES",
    "RESERVED_COMMANDS",
    "BuiltinCommands",
    "split_command",
]

#: The operator scope a Gateway client needs to send each reserved command, by name (its keys are the names).
COMMAND_SCOPES: Final[Mapping[str, OperatorScope]] = {
    "stop": "operator.write",  # as chat.abort
    "reset": "operator.admin",  # a new incarnation, as sessions.reset
    "new": "operator.admin",
    "status": "operator.write",
    "help": "operator.write",
    "model": "operator.write",  # with or without arguments it only answers: it never changes the session's model
    "think": "operator.write",  # the last four only answer that they are not supported
    "verbose": "operator.write",
    "whoami": "operator.write",
    "commands": "operator.write",
}

#: The operator scope a Gateway client needs to run a plugin command, by the command's ``require_auth``.
PLUGIN_COMMAND_SCOPES: Final[Mapping[bool, OperatorScope]] = {True: "operator.admin", False: "operator.write"}

BUILTIN_COMMANDS: Final = ("stop", "reset", "new", "status", "help", "model")
RESERVED_COMMANDS: Final = tuple(COMMAND_SCOPES)

HELP_TEXT: Final = (
    "ℹ️ Help\n\nSession\n  /new  |  /reset  |  /stop\n\nStatus\n  /status  |  /model\n\n"
    "Plugin commands: /<name> [args] for each command a loaded plugin registered."
)

#: What a text command runs to answer: ``async () -> text``.
Answer = Callable[[], Awaitable[str]]


#: ``/name [args]``: the name runs to the first whitespace (and holds no ``/``); the rest, trimmed, is the args.
_COMMAND: Final = re.compile(r"/(?P<name>[^\s/]+)(?:\s+(?P<args>.*))?", re.DOTALL)


def split_command(message: str) -> tuple[str, str] | None:
    """``(name, args)`` when ``message`` is ``/name [args]`` (the name as written), else ``None``.

    The one parser of chat commands: built-ins (whose names are matched lower-cased) and plugin commands alike.
    """
    match = _COMMAND.fullmatch(message.strip())
    if match is None:
        return None
    return match["name"], (match["args"] or "").strip()


class BuiltinCommands:
    """Answers of the text built-ins for one gateway."""

    def __init__(self, config: GatewayConfig, store: SessionStore, *, active_runs: Callable[[str], list[str]]) -> None:
        self._config = config
        self._store = store
        self._active_runs = active_runs

    def answer(self, name: str, args: str, session_key: str, agent_id: str, *, run_id: str | None = None) -> Answer:
        """The coroutine factory answering ``/name args`` on the session (not ``/stop``, ``/reset``, ``/new``);
        ``run_id`` is the answering run's own id, which ``/status`` does not count as a run in flight."""

        async def run() -> str:
            if name == "help":
                return HELP_TEXT
            if name == "status":
                return await self._status(session_key, agent_id, run_id)
            if name == "model":
                return self._model(agent_id, args)
            return f"⚠️ /{name} is not supported by this gateway."

        return run

    async def _status(self, session_key: str, agent_id: str, run_id: str | None) -> str:
        session = await asyncio.to_thread(self._store.get, session_key)
        model = self._config.agent_model(agent_id).chain[0]
        lines = [f"🧠 Model: {model}", f"🧵 Session: {session_key}"]
        if session is not None:
            lines.append(f"🆔 Session id: {session.session_id}")
        others = [other for other in self._active_runs(session_key) if other != run_id]
        lines.append(f"🏃 Runs in flight: {len(others)}")
        return "\n".join(lines)

    def _model(self, agent_id: str, args: str) -> str:
        if args:
            return "⚠️ Choosing a model with /model is not supported by this gateway; /model shows the current one."
        chain = self._config.agent_model(agent_id).chain
        configured = [
            f"{provider_id}/{model.id}"
            for provider_id, provider in self._config.models.providers.items()
            for model in provider.models
        ]
        lines = [f"Current: {chain[0]}"]
        if len(chain) > 1:
            lines.append(f"Fallbacks: {', '.join(chain[1:])}")
        lines.append(f"Configured: {', '.join(configured)}")
        return "\n".join(lines)
