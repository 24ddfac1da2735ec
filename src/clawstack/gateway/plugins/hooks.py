"""Dispatch hooks: ``before_dispatch`` and ``reply_dispatch`` handlers plugins register with ``api.register_hook``.

When a message arrives on a channel (Gateway chat, a channel adapter) and is not a plugin command, the gateway
offers it to every ``before_dispatch`` handler, then to every ``reply_dispatch`` handler, in registration order,
before the agent sees it. A handler returns ``None`` to pass, or the reply text to claim the message: the reply is
recorded as the answer and the agent turn does not run. A handler that raises is logged and passed over.

A handler receives a :class:`DispatchContext`: the message, the session and the requester, and ``ctx.subagent``,
a request-bound ``api.runtime.subagent`` whose ``run(..., completion_delivery="current-requester")`` delivers the
child's completion to the requester captured here. That delivery is offered only to ``before_dispatch`` handlers
of an authenticated request; plugins never provide the requester or its route. The context lives only while its
handler runs: afterwards every use of ``ctx.subagent`` raises
:class:`~clawstack.gateway.plugins.api.PluginRetiredError` (retained references fail closed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clawstack.gateway.dispatch import Requester
from clawstack.gateway.plugins.api import HOOK_NAMES, HookName, PluginLifetime

if TYPE_CHECKING:
    from clawstack.gateway.plugins.subagent import PluginSubagent, RequestSubagent

__all__ = ["HOOK_NAMES", "DispatchContext", "DispatchHandler", "HookName", "HookRegistry", "RegisteredHook"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DispatchContext:
    """What a dispatch hook handler receives (see the module docstring)."""

    hook: HookName
    plugin_id: str
    session_key: str
    agent_id: str
    message: str
    channel: str
    authenticated: bool
    sender_id: str | None
    operator: str | None
    subagent: RequestSubagent


DispatchHandler = Callable[[DispatchContext], Awaitable[str | None]]
"""A dispatch hook handler: ``None`` passes, a string claims the message with that reply."""


@dataclass(frozen=True, slots=True)
class RegisteredHook:
    """One handler a plugin registered, with the plugin's subagent runtime for request-bound calls."""

    plugin_id: str
    name: HookName
    handler: DispatchHandler
    subagent: PluginSubagent


class HookRegistry:
    """The dispatch hooks of every loaded plugin, per hook name in registration order."""

    def __init__(self) -> None:
        self._hooks: list[RegisteredHook] = []

    def add(self, hook: RegisteredHook) -> None:
        """Add ``hook`` after the ones already registered."""
        self._hooks.append(hook)

    def remove_plugin(self, plugin_id: str) -> None:
        """Drop every hook ``plugin_id`` registered."""
        self._hooks = [h for h in self._hooks if h.plugin_id != plugin_id]

    def handlers(self, name: HookName) -> tuple[RegisteredHook, ...]:
        """The handlers for ``name``, in registration order."""
        return tuple(h for h in self._hooks if h.name == name)

    def has_dispatch_hooks(self) -> bool:
        """Whether any plugin registered a dispatch hook."""
        return bool(self._hooks)

    async def dispatch(self, requester: Requester, message: str) -> tuple[RegisteredHook, str] | None:
        """Offer ``message`` to every handler in turn; the first claim wins: ``(hook, reply)``, else ``None``."""
        for name in HOOK_NAMES:
            for hook in self.handlers(name):
                scope = PluginLifetime(hook.plugin_id)
                ctx = DispatchContext(
                    hook=name,
                    plugin_id=hook.plugin_id,
                    session_key=requester.session_key,
                    agent_id=requester.agent_id,
                    message=message,
                    channel=requester.channel,
                    authenticated=requester.authenticated,
                    sender_id=requester.sender_id,
                    operator=requester.operator,
                    subagent=hook.subagent.bound_to(
                        requester,
                        scope,
                        completion_delivery=name == "before_dispatch" and requester.authenticated,
                    ),
                )
                try:
                    reply = await hook.handler(ctx)
                except Exception as exc:
                    _log.warning("%s hook of plugin %s raised %s", name, hook.plugin_id, type(exc).__name__)
                    continue
                finally:
                    scope.retire()
                if reply is not None:
                    return hook, str(reply)
        return None
