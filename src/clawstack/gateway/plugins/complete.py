"""``api.runtime.subagent.complete``: tool-free isolated inference for plugins.

A completion has no session and no transcript: the model gets the agent's instructions (plus an optional extra
system prompt) as the system message and the plugin's text as the one user message, and no tools. The model is
the agent's chain (primary, then fallbacks, as in :class:`~clawstack.gateway.agent.AgentLoop`) unless the plugin
asks for ``model``.

**Model policy.** An override must pass :func:`~clawstack.gateway.plugins.model_policy.check_model_override`
(``plugins.entries.<id>.subagent``), the one check ``subagent.run`` and native spawns use too; anything else is
refused with :class:`~clawstack.gateway.plugins.api.ModelOverrideRefusedError`, never silently replaced. An
allowed override replaces the agent's primary model only: the agent's configured fallbacks still follow it (minus the override
itself), as in a turn.

Scheduling: every completion of every plugin runs on the ``subagent`` lane of one shared
:class:`~clawstack.gateway.lanes.Lanes` (limit ``agents.defaults.subagents.maxConcurrent``), without a session.
Cancelling the caller, setting ``signal``, the ``timeout_ms`` deadline (which counts queueing), retiring the
plugin instance or the end of the invocation it was started in stops the work: queued work leaves the queue at
once, running work keeps its slot until its cleanup has finished and the call then rejects
(:class:`SubagentCancelledError`, :class:`SubagentTimeoutError`, :class:`PluginRetiredError`; the caller's own
cancellation propagates as such). A result that arrives after any of these is discarded.

**Invocations.** Plugin code the gateway runs on someone's behalf (a dispatch hook handler, a plugin tool call, a
command) runs inside :func:`invocation_scope`. A completion the plugin starts there, directly or in a task it
creates there, belongs to that invocation: when the invocation ends it is cancelled as above
(:class:`SubagentCancelledError`), and one started after it ended is refused without being queued. Work that is
meant to outlive the invocation (a ``subagent.run``) is started under :func:`detached`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from clawstack.gateway.agent import AgentLoop, ModelChainError
from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.lanes import Lanes
from clawstack.gateway.plugins.api import (
    PluginError,
    PluginLifetime,
    PluginRetiredError,
    SubagentCancelledError,
    SubagentModelError,
    SubagentTimeoutError,
)
from clawstack.gateway.plugins.model_policy import check_model_override

__all__ = [
    "DEFAULT_COMPLETE_TIMEOUT_MS",
    "SUBAGENT_COMPLETE",
    "CompleteResult",
    "CompletionUsage",
    "SubagentCompleter",
    "current_invocation",
    "detached",
    "invocation_scope",
]

#: The capability string advertised when completions are wired.
SUBAGENT_COMPLETE: Final = "subagent.complete"

#: ``timeout_ms`` when the caller gives none.
DEFAULT_COMPLETE_TIMEOUT_MS: Final = 30_000

_INVOCATION: Final[ContextVar[PluginLifetime | None]] = ContextVar("clawstack_plugin_invocation", default=None)


@contextlib.contextmanager
def invocation_scope(scope: PluginLifetime) -> Iterator[PluginLifetime]:
    """Run the body as one invocation of ``scope.plugin_id``'s code; ``scope`` is retired when the body ends.

    Completions that plugin starts in the body, or in tasks created in it, are cancelled when ``scope`` is retired
    (see the module docstring). The caller may retire ``scope`` earlier itself.
    """
    token = _INVOCATION.set(scope)
    try:
        yield scope
    finally:
        _INVOCATION.reset(token)
        scope.retire()


@contextlib.contextmanager
def detached() -> Iterator[None]:
    """Run the body outside any invocation: tasks it creates (a run's driver) do not belong to the caller's."""
    token = _INVOCATION.set(None)
    try:
        yield
    finally:
        _INVOCATION.reset(token)


def current_invocation(plugin_id: str) -> PluginLifetime | None:
    """The invocation of ``plugin_id`` the current context runs in, if any."""
    scope = _INVOCATION.get()
    return scope if scope is not None and scope.plugin_id == plugin_id else None


@dataclass(frozen=True, slots=True)
class CompletionUsage:
    """Token counts the model reported."""

    input_tokens: int
    output_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class CompleteResult:
    """The answer of a completion: its text, the canonical ``provider/model`` that gave it, and usage if known."""

    text: str
    model: str
    usage: CompletionUsage | None


class SubagentCompleter:
    """Runs completions for every plugin of one gateway on one shared ``subagent`` lane.

    Model clients, the agent lookup and the model-chain fallback are the ``loop``'s, so completions reach the
    same providers with the same clients as agent turns. ``lanes`` defaults to a new :class:`Lanes` whose
    ``subagent`` limit is ``agents.defaults.subagents.maxConcurrent``; a gateway passes its own.
    """

    def __init__(self, config: GatewayConfig, loop: AgentLoop, *, lanes: Lanes | None = None) -> None:
        self._config = config
        self._loop = loop
        self.lanes = lanes or Lanes({"subagent": config.agents.defaults.subagents.max_concurrent})

    def model_chain(self, plugin_id: str, agent_id: str, model: str | None) -> tuple[str, ...]:
        """The models a completion or run of ``plugin_id`` for ``agent_id`` tries, after the model policy check.

        Without ``model``: the agent's chain. With it: the override, then the agent's configured fallbacks.
        """
        self._loop.agent(agent_id)  # UnknownAgentError for an unknown agent
        if model is None:
            return self._loop.model_chain(agent_id, None)
        check_model_override(self._config, plugin_id, agent_id, model)
        return self._loop.model_chain(agent_id, model)

    async def complete(
        self,
        plugin_id: str,
        lifetime: PluginLifetime,
        agent_id: str,
        message: str,
        *,
        extra_system_prompt: str | None,
        model: str | None,
        timeout_ms: int,
        signal: asyncio.Event | None,
        invocation: PluginLifetime | None = None,
    ) -> CompleteResult:
        """Run one completion for ``plugin_id`` (see the module docstring).

        ``lifetime`` is the plugin instance's; ``invocation``, when given, the invocation the completion belongs to.
        """
        lifetime.check()
        if invocation is not None and invocation.retired:
            raise SubagentCancelledError("the invocation that started the completion has ended")
        chain = self.model_chain(plugin_id, agent_id, model)
        instructions = self._loop.agent(agent_id).instructions
        system = "\n\n".join(part for part in (instructions, extra_system_prompt) if part)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": message})
        if signal is not None and signal.is_set():
            raise SubagentCancelledError("the completion was cancelled before it was queued")

        running = asyncio.get_running_loop()
        inner = running.create_task(self.lanes.run("subagent", None, lambda: self._infer(agent_id, chain, messages)))
        stopped: list[PluginError] = []

        def stop(error: PluginError) -> None:
            if not stopped:
                stopped.append(error)
            inner.cancel()

        remove_retire = lifetime.on_retire(
            lambda: stop(PluginRetiredError(f"plugin {plugin_id!r} was retired during the completion"))
        )
        remove_invocation = (
            None
            if invocation is None
            else invocation.on_retire(
                lambda: stop(SubagentCancelledError("the invocation that started the completion ended"))
            )
        )
        timer = running.call_later(
            timeout_ms / 1000, stop, SubagentTimeoutError(f"the completion took longer than {timeout_ms} ms")
        )
        watcher: asyncio.Task[object] | None = None
        if signal is not None:
            watcher = running.create_task(signal.wait())
            watcher.add_done_callback(
                lambda done: None if done.cancelled() else stop(SubagentCancelledError("the completion was cancelled"))
            )
        try:
            await asyncio.wait((inner,))
        finally:
            timer.cancel()
            remove_retire()
            if remove_invocation is not None:
                remove_invocation()
            if watcher is not None:
                watcher.cancel()
            if not inner.done():
                # Best-effort shutdown step on the caller's cancellation: take queued work out of the queue now
                # and let running work finish its cleanup before the cancellation goes on.
                inner.cancel()
                await asyncio.wait((inner,))
        if stopped:
            if not inner.cancelled():
                inner.exception()  # the late outcome is discarded
            raise stopped[0]
        if inner.cancelled():
            raise SubagentCancelledError("the completion was cancelled")
        lifetime.check()
        return inner.result()

    async def _infer(self, agent_id: str, chain: tuple[str, ...], messages: list[dict[str, Any]]) -> CompleteResult:
        try:
            completion, provider_id, model_id = await self._loop.complete(agent_id, chain, messages)
        except ModelChainError as exc:
            raise SubagentModelError(exc.message, model_error_code=exc.model_error_code) from None
        usage = completion.usage
        return CompleteResult(
            text=completion.content or "",
            model=f"{provider_id}/{model_id}",
            usage=None
            if usage is None
            else CompletionUsage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
        )
