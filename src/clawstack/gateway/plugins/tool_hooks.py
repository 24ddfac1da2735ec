"""Tool hooks: ``before_tool_call`` may rewrite or refuse a tool call, ``after_tool_call`` observes it.

Plugins register them with ``api.register_hook("before_tool_call", handler, matcher=None)`` (and
``"after_tool_call"``); ``matcher`` is a non-empty list of exact tool names, or ``None`` for every tool. A handler
takes one event dataclass and may be ``async`` or plain. The agent loop calls the two runner functions around each
tool call:

* :func:`before_tool_call` returns a :class:`ToolCallDecision`. A tool outside ``allowed_tools`` (the run's
  effective tool policy) is refused before any hook runs. The matching ``before_tool_call`` handlers then run one
  after another in registration order (plugin load order); each gets a :class:`BeforeToolCallEvent` holding its
  own copy of the current parameters, so a rewrite by one handler is what the next one sees. A handler returns
  ``None`` (no decision) or a :class:`BeforeToolCallResult`: ``block=True`` refuses the call with
  ``block_reason`` and ends the chain; ``params`` is merged over the current parameters (keys it names replace
  theirs, as in OpenClaw). The call is refused, and never runs, when a handler raises, takes longer than
  ``timeout_s`` (15 s; it is cancelled), returns anything else, or its plugin is retired while it runs (fail
  closed: logged with the plugin id); and when a rewrite is not a JSON object, names another tool
  (``tool_name``), or leaves parameters that do not validate against the tool's JSON schema. The decision carries
  the tool name and the final parameters the tool must run with, and which plugins rewrote them.
* :func:`after_tool_call` gives every matching ``after_tool_call`` handler an :class:`AfterToolCallEvent` (the
  parameters the tool ran with, its result text, its error text when it failed, and its duration), all handlers
  at once; it returns when they are done. A handler that raises or takes longer than ``timeout_s`` (15 s) is
  logged and changes nothing. Only calls that ran are observed.

Handlers of a retired plugin instance never run. OpenClaw gives every ``before_tool_call`` handler the original
parameters and keeps the last rewrite; here each handler sees the rewrites before it, so a handler that blocks
judges the parameters that would run. Refusal codes (:data:`ToolCallRefusal`): ``tool_not_allowed``,
``tool_call_blocked``, ``tool_hook_failed``, ``tool_rewrite_invalid``. Schemas are checked with ``jsonschema``
(the draft a schema's ``$schema`` names, else 2020-12), imported only when a rewrite is checked.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from clawstack.gateway.plugins.api import PluginLifetime, ToolHookName
from clawstack.gateway.plugins.complete import invocation_scope
from clawstack.gateway.plugins.store import encode_json_value

if TYPE_CHECKING:
    from clawstack.gateway.plugins.hooks import HookRegistry

__all__ = [
    "AFTER_TOOL_CALL_TIMEOUT_S",
    "BEFORE_TOOL_CALL_TIMEOUT_S",
    "HOOK_FAILURE_REASON",
    "AfterToolCallEvent",
    "AfterToolCallHandler",
    "BeforeToolCallEvent",
    "BeforeToolCallHandler",
    "BeforeToolCallResult",
    "RegisteredToolHook",
    "ToolCallDecision",
    "ToolCallRefusal",
    "after_tool_call",
    "before_tool_call",
    "schema_problem",
]

_log = logging.getLogger(__name__)

#: How long one ``before_tool_call`` handler may take before the call is refused.
BEFORE_TOOL_CALL_TIMEOUT_S: Final = 15.0

#: How long one ``after_tool_call`` handler may take before it is cancelled (and logged).
AFTER_TOOL_CALL_TIMEOUT_S: Final = 15.0

#: The reason given when a ``before_tool_call`` handler fails.
HOOK_FAILURE_REASON: Final = "Tool call blocked because before_tool_call hook failed"

#: The reason given when a handler blocks without a reason of its own.
_DEFAULT_BLOCK_REASON: Final = "Tool call blocked by plugin hook"

_MAX_REASON_CHARS: Final = 1000

ToolCallRefusal = Literal["tool_not_allowed", "tool_call_blocked", "tool_hook_failed", "tool_rewrite_invalid"]


@dataclass(frozen=True, slots=True)
class BeforeToolCallEvent:
    """What a ``before_tool_call`` handler receives: the call, with the parameters as rewritten so far."""

    tool_name: str
    params: dict[str, Any]
    run_id: str
    tool_call_id: str
    session_key: str
    agent_id: str


@dataclass(frozen=True, slots=True)
class BeforeToolCallResult:
    """A ``before_tool_call`` decision: block the call, or rewrite some of its parameters.

    ``params`` is merged over the current parameters. ``tool_name``, when given, must be the call's own tool: a
    hook cannot turn one tool call into another.
    """

    params: Mapping[str, Any] | None = None
    block: bool = False
    block_reason: str | None = None
    tool_name: str | None = None


@dataclass(frozen=True, slots=True)
class AfterToolCallEvent:
    """What an ``after_tool_call`` handler receives: the call as it ran and how it ended.

    ``result`` is the tool's result text (the error text when it failed); ``error`` is that text when the call
    failed and ``None`` when it succeeded; ``duration_ms`` is how long it ran.
    """

    tool_name: str
    params: dict[str, Any]
    run_id: str
    tool_call_id: str
    session_key: str
    agent_id: str
    result: str
    error: str | None = None
    duration_ms: int | None = None


BeforeToolCallHandler = Callable[
    [BeforeToolCallEvent], Awaitable[BeforeToolCallResult | None] | BeforeToolCallResult | None
]
"""A ``before_tool_call`` handler: ``None`` for no decision, or a :class:`BeforeToolCallResult`."""

AfterToolCallHandler = Callable[[AfterToolCallEvent], Awaitable[None] | None]
"""An ``after_tool_call`` handler: observes; its return value is ignored."""


@dataclass(frozen=True, slots=True)
class RegisteredToolHook:
    """One tool hook a plugin registered; ``matcher`` is the tool names it is for (``None``: all)."""

    plugin_id: str
    name: ToolHookName
    handler: Callable[[Any], object]
    lifetime: PluginLifetime
    matcher: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDecision:
    """What :func:`before_tool_call` decided: run ``tool_name`` with ``params``, or refuse the call.

    When ``blocked``, ``code`` and ``reason`` say why (``reason`` is the text for the call's error result) and
    ``plugin_id`` names the plugin whose hook refused it, if one did. ``rewritten_by`` lists the plugins whose
    hooks changed the parameters, in order.
    """

    tool_name: str
    params: dict[str, Any]
    blocked: bool = False
    code: ToolCallRefusal | None = None
    reason: str | None = None
    plugin_id: str | None = None
    rewritten_by: tuple[str, ...] = ()


def _refuse(
    event: BeforeToolCallEvent,
    params: dict[str, Any],
    code: ToolCallRefusal,
    reason: str,
    plugin_id: str | None = None,
    rewritten_by: list[str] | None = None,
) -> ToolCallDecision:
    return ToolCallDecision(
        event.tool_name,
        params,
        blocked=True,
        code=code,
        reason=reason,
        plugin_id=plugin_id,
        rewritten_by=tuple(rewritten_by or ()),
    )


def _live(hook: RegisteredToolHook) -> bool:
    return not hook.lifetime.retired


def _failed(
    event: BeforeToolCallEvent, params: dict[str, Any], hook: RegisteredToolHook, why: str, rewritten_by: list[str]
) -> ToolCallDecision:
    _log.warning("before_tool_call hook of plugin %s %s (tool %s): call refused", hook.plugin_id, why, event.tool_name)
    return _refuse(event, params, "tool_hook_failed", HOOK_FAILURE_REASON, hook.plugin_id, rewritten_by)


async def _call(hook: RegisteredToolHook, event: object, timeout_s: float) -> object:
    # A completion the handler starts belongs to this invocation and ends with it.
    with invocation_scope(PluginLifetime(hook.plugin_id)):
        async with asyncio.timeout(timeout_s):
            outcome = hook.handler(event)
            if inspect.isawaitable(outcome):
                outcome = await outcome
    return outcome


async def before_tool_call(
    hooks: HookRegistry,
    event: BeforeToolCallEvent,
    *,
    schema: Mapping[str, Any],
    allowed_tools: Collection[str],
    timeout_s: float = BEFORE_TOOL_CALL_TIMEOUT_S,
) -> ToolCallDecision:
    """Decide whether the call in ``event`` runs, and with which parameters (see the module docstring).

    ``schema`` is the tool's JSON schema for its arguments; ``allowed_tools`` the tool names the run's effective
    policy allows.
    """
    name = event.tool_name
    params = event.params
    if name not in allowed_tools:
        return _refuse(event, params, "tool_not_allowed", f"the tool {json.dumps(name)} is not allowed here")
    rewritten_by: list[str] = []
    for hook in hooks.tool_handlers("before_tool_call", name):
        if not _live(hook):
            continue  # retired while an earlier handler ran
        try:
            outcome = await _call(hook, replace(event, params=copy.deepcopy(params)), timeout_s)
        except TimeoutError:
            return _failed(event, params, hook, f"took longer than {timeout_s:g} s", rewritten_by)
        except Exception as exc:
            return _failed(event, params, hook, f"raised {type(exc).__name__}", rewritten_by)
        if not _live(hook):
            return _failed(event, params, hook, "was retired while it ran", rewritten_by)
        if outcome is None:
            continue
        if not isinstance(outcome, BeforeToolCallResult) or not isinstance(outcome.block, bool):
            why = f"returned a {type(outcome).__name__}, not a BeforeToolCallResult or None"
            return _failed(event, params, hook, why, rewritten_by)
        if outcome.block:
            reason = outcome.block_reason
            text = reason[:_MAX_REASON_CHARS] if isinstance(reason, str) and reason.strip() else _DEFAULT_BLOCK_REASON
            return _refuse(event, params, "tool_call_blocked", text, hook.plugin_id, rewritten_by)
        if outcome.tool_name is not None and outcome.tool_name != name:
            return _refuse(
                event,
                params,
                "tool_rewrite_invalid",
                f"the before_tool_call hook of plugin {hook.plugin_id!r} tried to turn this call into a call of"
                " another tool",
                hook.plugin_id,
                rewritten_by,
            )
        rewrite: object = outcome.params
        if rewrite is None:
            continue
        if not isinstance(rewrite, Mapping):
            return _refuse(
                event,
                params,
                "tool_rewrite_invalid",
                f"the before_tool_call hook of plugin {hook.plugin_id!r} rewrote the arguments into something"
                " that is not an object",
                hook.plugin_id,
                rewritten_by,
            )
        merged = {**params, **rewrite}
        try:
            text = encode_json_value(merged)
        except ValueError as exc:
            return _refuse(
                event,
                params,
                "tool_rewrite_invalid",
                f"the arguments rewritten by the before_tool_call hook of plugin {hook.plugin_id!r} are not JSON:"
                f" the object {exc}",
                hook.plugin_id,
                rewritten_by,
            )
        params = json.loads(text)  # a copy of its own: the plugin keeps no reference to what runs
        rewritten_by.append(hook.plugin_id)
    if rewritten_by:
        problem = schema_problem(schema, params)
        if problem is not None:
            who = ", ".join(repr(p) for p in dict.fromkeys(rewritten_by))
            return _refuse(
                event,
                params,
                "tool_rewrite_invalid",
                f"the arguments rewritten by the before_tool_call hook of plugin {who} do not match the tool's"
                f" schema: {problem}",
                rewritten_by[-1],
                rewritten_by,
            )
    return ToolCallDecision(name, params, rewritten_by=tuple(rewritten_by))


async def after_tool_call(
    hooks: HookRegistry, event: AfterToolCallEvent, *, timeout_s: float = AFTER_TOOL_CALL_TIMEOUT_S
) -> None:
    """Give ``event`` to every matching ``after_tool_call`` handler at once; return when all are done.

    A handler's failure or timeout is logged with its plugin id and changes nothing.
    """
    handlers = hooks.tool_handlers("after_tool_call", event.tool_name)
    if handlers:
        await asyncio.gather(*(_observe(hook, event, timeout_s) for hook in handlers))


async def _observe(hook: RegisteredToolHook, event: AfterToolCallEvent, timeout_s: float) -> None:
    if not _live(hook):
        return
    try:
        await _call(hook, replace(event, params=copy.deepcopy(event.params)), timeout_s)
    except TimeoutError:
        _log.warning(
            "after_tool_call hook of plugin %s took longer than %g s (tool %s)",
            hook.plugin_id,
            timeout_s,
            event.tool_name,
        )
    except Exception as exc:
        _log.warning(
            "after_tool_call hook of plugin %s raised %s (tool %s)", hook.plugin_id, type(exc).__name__, event.tool_name
        )


def schema_problem(schema: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
    """Why ``params`` does not validate against the JSON ``schema`` (key path and rule, never a value), or ``None``.

    A schema the validator cannot apply counts as a problem: the check fails closed.
    """
    import jsonschema  # type: ignore[import-untyped]  # imported here: only a hook's rewrite needs it

    document = dict(schema)
    try:
        validator_class = jsonschema.validators.validator_for(document, default=jsonschema.Draft202012Validator)
        validator_class.check_schema(document)
        error = jsonschema.exceptions.best_match(validator_class(document).iter_errors(dict(params)))
    except jsonschema.exceptions.SchemaError:
        return "the tool's schema is not a valid JSON schema"
    except Exception as exc:  # an unresolvable $ref and the like: refuse rather than let it through
        return f"the tool's schema cannot be applied ({type(exc).__name__})"
    if error is None:
        return None
    rule = json.dumps(error.validator_value, default=str)
    if len(rule) > 80:
        rule = rule[:77] + "..."
    return f"{error.json_path} does not satisfy {error.validator}: {rule}"
