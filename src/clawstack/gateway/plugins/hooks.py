"""The hook registry, and dispatch hooks: ``before_dispatch`` and ``reply_dispatch`` handlers.

:class:`HookRegistry` holds every hook plugins register with ``api.register_hook``: the dispatch hooks below and
the tool hooks (``before_tool_call``, ``after_tool_call``) that :mod:`clawstack.gateway.plugins.tool_hooks` runs.
Handlers run in registration order, which is plugin load order (a reloaded plugin's handlers come after the
others'); a handler of a retired plugin instance never runs.

When a message arrives on a channel (Gateway chat, a channel adapter) and is not a plugin command, the gateway
offers it to every ``before_dispatch`` handler, then to every ``reply_dispatch`` handler, in registration order,
before the agent sees it. A handler returns ``None`` to pass, or the reply text to claim the message: the reply is
recorded as the answer and the agent turn does not run. A handler that raises is logged and passed over.

A ``reply_dispatch`` handler of an eligible request (an authenticated requester with current operator authority,
on the run host's dispatch path, which hands in its user-turn recorder) also gets ``ctx.subagent.native``, the
requester-bound native children (:mod:`clawstack.gateway.plugins.native_facade`); it is ``None`` otherwise.

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
from clawstack.gateway.plugins.api import DISPATCH_HOOK_NAMES, DispatchHookName, PluginLifetime, ToolHookName
from clawstack.gateway.plugins.complete import invocation_scope

if TYPE_CHECKING:
    from clawstack.gateway.plugins.native_facade import NativeHost, RecordInput
    from clawstack.gateway.plugins.subagent import PluginSubagent, RequestSubagent
    from clawstack.gateway.plugins.tool_hooks import RegisteredToolHook

__all__ = ["DispatchContext", "DispatchHandler", "DispatchTurn", "HookRegistry", "RegisteredHook"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DispatchContext:
    """What a dispatch hook handler receives (see the module docstring)."""

    hook: DispatchHookName
    plugin_id: str
    session_key: str
    agent_id: str
    message: str
    channel: str
    authenticated: bool
    sender_id: str | None
    operator: str | None
    subagent: RequestSubagent


@dataclass(frozen=True, slots=True)
class DispatchTurn:
    """The run host's turn a message is dispatched in: its run (the parent turn of native children) and the
    recorder that commits the message to the requester's transcript."""

    run_id: str
    record_input: RecordInput


DispatchHandler = Callable[[DispatchContext], Awaitable[str | None]]
"""A dispatch hook handler: ``None`` passes, a string claims the message with that reply."""


@dataclass(frozen=True, slots=True)
class RegisteredHook:
    """One dispatch handler a plugin registered, with the plugin's subagent runtime for request-bound calls."""

    plugin_id: str
    name: DispatchHookName
    handler: DispatchHandler
    subagent: PluginSubagent
    lifetime: PluginLifetime


class HookRegistry:
    """The hooks of every loaded plugin, per hook name in registration order."""

    def __init__(self) -> None:
        self._hooks: list[RegisteredHook] = []
        self._tool_hooks: list[RegisteredToolHook] = []
        self.native_host: NativeHost | None = None
        """Where ``reply_dispatch`` handlers' native children come from; ``None`` on a host without them."""

    def add(self, hook: RegisteredHook) -> None:
        """Add the dispatch hook ``hook`` after the ones already registered."""
        self._hooks.append(hook)

    def add_tool_hook(self, hook: RegisteredToolHook) -> None:
        """Add the tool hook ``hook`` after the ones already registered."""
        self._tool_hooks.append(hook)

    def remove_plugin(self, plugin_id: str) -> None:
        """Drop every hook ``plugin_id`` registered."""
        self._hooks = [h for h in self._hooks if h.plugin_id != plugin_id]
        self._tool_hooks = [h for h in self._tool_hooks if h.plugin_id != plugin_id]

    def handlers(self, name: DispatchHookName) -> tuple[RegisteredHook, ...]:
        """The live dispatch handlers for ``name``, in registration order."""
        return tuple(h for h in self._hooks if h.name == name and not h.lifetime.retired)

    def tool_handlers(self, name: ToolHookName, tool_name: str) -> tuple[RegisteredToolHook, ...]:
        """The live ``name`` handlers whose matcher admits ``tool_name``, in registration order."""
        return tuple(
            h
            for h in self._tool_hooks
            if h.name == name and not h.lifetime.retired and (h.matcher is None or tool_name in h.matcher)
        )

    def has_dispatch_hooks(self) -> bool:
        """Whether any plugin registered a dispatch hook."""
        return bool(self._hooks)

    def has_tool_hooks(self) -> bool:
        """Whether any plugin registered a tool hook."""
        return bool(self._tool_hooks)

    async def dispatch(
        self, requester: Requester, message: str, *, turn: DispatchTurn | None = None
    ) -> tuple[RegisteredHook, str] | None:
        """Offer ``message`` to every handler in turn; the first claim wins: ``(hook, reply)``, else ``None``.
        ``turn`` (the run host's) makes ``reply_dispatch`` handlers eligible for native children."""
        for name in DISPATCH_HOOK_NAMES:
            for hook in self.handlers(name):
                if hook.lifetime.retired:
                    continue  # retired while an earlier handler ran
                scope = PluginLifetime(hook.plugin_id)
                native = None
                if name == "reply_dispatch" and turn is not None and self.native_host is not None:
                    native = self.native_host.facade(
                        hook.plugin_id,
                        (scope, hook.lifetime),
                        requester,
                        parent_run_id=turn.run_id,
                        record_input=turn.record_input,
                    )
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
                        native=native,
                    ),
                )
                token = native.enter() if native is not None else None
                try:
                    # A completion the handler starts belongs to this invocation; the scope retires at its end.
                    with invocation_scope(scope):
                        reply = await hook.handler(ctx)
                except Exception as exc:
                    _log.warning("%s hook of plugin %s raised %s", name, hook.plugin_id, type(exc).__name__)
                    continue
                finally:
                    if native is not None and token is not None:
                        native.exit(token)
                if reply is not None:
                    return hook, str(reply)
        return None
