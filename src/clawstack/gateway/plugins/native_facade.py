"""``ctx.subagent.native`` (and ``api.runtime.subagent.native``): requester-bound native children for plugins, and
``ctx.runtime_context.subagents`` of a command that asked for them.

The facade exists only inside an eligible ``reply_dispatch`` handler (an authenticated requester whose operator
authority is current, on the gateway's reply-dispatch path, with the host's user-turn recorder) or an eligible
command invocation (a ``require_auth`` command declaring the ``subagents`` runtime capability, run by an
authorized requester's actual command with current operator authority, whose tool policy allows
``sessions_spawn`` and ``agents_wait``; the command text is the turn's input). Elsewhere (a
``before_dispatch`` handler, a service, a timer, a retained reference after the handler settled) there is none:
``native`` is ``None``, and a kept facade raises :class:`~clawstack.gateway.plugins.api.PluginRetiredError`.
The gateway supplies the parent (the requester's session and its current incarnation, the dispatch run as the
parent turn, the agent's own tool surface): a plugin can choose none of it.

* :meth:`NativeFacade.spawn` commits the turn's actual input first (the host's recorder: the user message is in
  the transcript before any child exists), then spawns through the same :class:`~clawstack.gateway.native.
  NativeChildren` as ``sessions_spawn``, always with collector completion, the plugin recorded as the child's
  owner in the same custody transaction. A nonempty ``request_id`` replays within the plugin and the parent turn:
  the same arguments answer the same child, other arguments are refused (``native_request_conflict``), never a
  second child.
* :meth:`NativeFacade.collect` reads (``timeout_seconds=0``), waits (bounded) or joins (``await_results=True``,
  never together with a timeout) results of children this plugin accepted for this parent incarnation.
* :meth:`NativeFacade.list` lists them: at most 200, newest first, filtered by status before the bound.

Every call rechecks the plugin instance, the invocation, the requester's operator authority and the tool policy
(spawn needs ``sessions_spawn`` and ``agents_wait`` on the requester agent's surface, collect and list need
``agents_wait``) before it acts and after every await; nothing falls back to another actor. An accepted child is
retained under the requester's operator authority: revoking it (a demotion, an unlinked channel identity) fails
the child at once while it waits for a slot, and refuses it at its next admission check.

A spawn goes through the ``before_tool_call`` hooks as a ``sessions_spawn`` call (parameters in OpenClaw's
camelCase, with ``runtime: "subagent"``, ``mode: "run"`` and the ``requestId``): a hook may block it
(``native_spawn_refused``) or rewrite its task, label, model, thinking and context, or add ``blind``; a rewrite of
the runtime, the run mode, the request id, or one that removes ``blind``, is refused before any child exists
(``native_rewrite_refused``). The replay identity is the spawn's own arguments, before any rewrite.

``profile`` selects a subagent profile this plugin instance registered (:mod:`clawstack.gateway.plugins.profiles`):
its instructions are added to the child's system prompt and its denies narrow the child's tools, and the child
records ``subagentProfile``. ``output_schema`` (or the profile's, which a spawn cannot replace) is enforced by the
collector: a ``done`` child whose answer is not one JSON document matching it is collected ``failed`` with the
reason, its text still in ``result``; a matching one comes back as ``structured_output``. Neither can be removed by
a tool hook: both are applied after the hooks ran.

``model`` is held to the plugin's model policy (``plugins.entries.<id>.subagent``, the one
:func:`~clawstack.gateway.plugins.model_policy.check_model_override` that ``complete`` and ``subagent.run`` apply),
both as the plugin asked and as a tool hook left it: outside it the spawn is refused (``subagent_model_refused``)
before any child exists, never run on another model. A profile cannot name a model.

``fast_mode``: this gateway has no fast mode, so ``None``, ``"auto"`` (the host default) and ``False`` are what a
child gets anyway; ``True`` is refused by name (:class:`NativeUnsupportedError`), never silently ignored.

A :meth:`NativeFacade.list` during which the runtime config changed (a reload applied new operators or channel
senders) is rejected with :class:`NativePolicyChangedError`; the invocation stays active, so it can retry.

Errors are in :mod:`clawstack.gateway.plugins.native_errors`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from clawstack.common.digest import spec_digest
from clawstack.gateway.authority import AuthorityAssertion, AuthorityError, OperatorAuthority
from clawstack.gateway.custody import ChildRecord, ChildStore, PluginOwner
from clawstack.gateway.dispatch import Requester
from clawstack.gateway.native import NativeChildren, Parent, SpawnRefusedError, SpawnRequest
from clawstack.gateway.plugins.api import PluginLifetime
from clawstack.gateway.plugins.model_policy import check_model_override
from clawstack.gateway.plugins.native_answers import accepted, child_instructions, collected, list_entry
from clawstack.gateway.plugins.native_errors import (
    NativeArgumentError,
    NativeAuthorityError,
    NativeError,
    NativeNotOwnerError,
    NativePolicyChangedError,
    NativeRefusedError,
    NativeRequestConflictError,
    NativeRewriteError,
    NativeToolDeniedError,
    NativeUnsupportedError,
)
from clawstack.gateway.plugins.profiles import (
    ProfileRegistry,
    SubagentProfile,
    SubagentProfileError,
    check_output_schema,
)

if TYPE_CHECKING:
    from clawstack.gateway.agent import AgentLoop
    from clawstack.gateway.config import GatewayConfig
    from clawstack.gateway.plugins.hooks import HookRegistry
    from clawstack.gateway.sessions import SessionStore

__all__ = [
    "BLIND_CAPABILITY",
    "COMMAND_CAPABILITY",
    "LIST_CAPABILITY",
    "LIST_STATUSES",
    "MAX_LIST",
    "NativeArgumentError",
    "NativeAuthorityError",
    "NativeError",
    "NativeFacade",
    "NativeHost",
    "NativeNotOwnerError",
    "NativePolicyChangedError",
    "NativeRefusedError",
    "NativeRequestConflictError",
    "NativeRewriteError",
    "NativeToolDeniedError",
    "NativeUnsupportedError",
    "current_native",
]

BLIND_CAPABILITY: Final = "native-subagent-blind-v1"
COMMAND_CAPABILITY: Final = "command-native-subagents-v1"
LIST_CAPABILITY: Final = "native-subagent-list-v1"
MAX_LIST: Final = 200
LIST_STATUSES: Final = ("done", "failed", "killed", "timeout", "queued", "running", "interrupted", "terminal")
DEFAULT_COLLECT_S: Final = 30.0
_SPAWN_TOOLS: Final = ("sessions_spawn", "agents_wait")


RecordInput = Callable[[], Awaitable[None]]
"""The host's user-turn recorder: commits the dispatched message to the requester's transcript (idempotent)."""


@dataclass(frozen=True, slots=True)
class NativeHost:
    """What the facade stands on, gateway-wide: native children and their custody, sessions, tool surfaces,
    configuration and operator authority."""

    natives: NativeChildren
    children: ChildStore
    store: SessionStore
    agent: AgentLoop
    config: GatewayConfig
    authority: OperatorAuthority | None
    hooks: HookRegistry | None = None
    """Whose ``before_tool_call`` handlers see a facade spawn as a ``sessions_spawn`` call."""
    profiles: ProfileRegistry = field(default_factory=ProfileRegistry)
    """The plugin instances' subagent profiles."""

    def allows_spawning(self, agent_id: str) -> bool:
        """Whether ``agent_id``'s tool policy has both ``sessions_spawn`` and ``agents_wait`` on its surface."""
        surface = self.agent.effective_tools(agent_id)
        return all(name in surface for name in _SPAWN_TOOLS)

    def facade(
        self,
        plugin_id: str,
        lifetimes: tuple[PluginLifetime, ...],
        requester: Requester,
        *,
        parent_run_id: str,
        record_input: RecordInput,
    ) -> NativeFacade | None:
        """The facade for an eligible reply-dispatch invocation, or ``None`` when it is not eligible."""
        if not requester.authenticated:
            return None
        assertion = self.authority.capture(requester) if self.authority is not None else None
        if self.authority is not None and assertion is None:
            return None
        return NativeFacade(self, plugin_id, lifetimes, requester, assertion, parent_run_id, record_input)


_CURRENT: contextvars.ContextVar[NativeFacade | None] = contextvars.ContextVar("clawstack_native", default=None)


def current_native(plugin_id: str) -> NativeFacade | None:
    """The facade of the eligible invocation of ``plugin_id`` running now, if any (``api.runtime.subagent.native``)."""
    facade = _CURRENT.get()
    return facade if facade is not None and facade.plugin_id == plugin_id else None


def _text(name: str, value: object, *, optional: bool = False, limit: int = 256) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise NativeArgumentError(f"{name} must be a non-empty string of at most {limit} characters")
    return value


class NativeFacade:
    """One eligible invocation's native runtime (see the module docstring)."""

    def __init__(
        self,
        host: NativeHost,
        plugin_id: str,
        lifetimes: tuple[PluginLifetime, ...],
        requester: Requester,
        assertion: AuthorityAssertion | None,
        parent_run_id: str,
        record_input: RecordInput,
    ) -> None:
        self._host = host
        self.plugin_id = plugin_id
        self._lifetimes = lifetimes
        self._requester = requester
        self._assertion = assertion
        self._parent_run_id = parent_run_id
        self._record_input = record_input
        self._replays: dict[str, asyncio.Lock] = {}

    def enter(self) -> contextvars.Token[NativeFacade | None]:
        """Make this the current invocation's facade (``api.runtime.subagent.native``) until :meth:`exit`."""
        return _CURRENT.set(self)

    @staticmethod
    def exit(token: contextvars.Token[NativeFacade | None]) -> None:
        _CURRENT.reset(token)

    # -- checks -------------------------------------------------------------------------------------------------

    def _check(self, tools: Sequence[str]) -> tuple[str, ...]:
        """The invocation and plugin are live, the authority holds, ``tools`` are on the requester's surface;
        returns that surface."""
        for lifetime in self._lifetimes:
            lifetime.check()
        if self._assertion is not None and self._host.authority is not None:
            try:
                self._host.authority.check(self._assertion)
            except AuthorityError as exc:
                raise NativeAuthorityError("the requester's operator authority has ended") from exc
        surface = tuple(self._host.agent.effective_tools(self._requester.agent_id))
        denied = [name for name in tools if name not in surface]
        if denied:
            raise NativeToolDeniedError(f"the requester's tool policy does not allow {', '.join(denied)}")
        return surface

    async def _parent(self, surface: tuple[str, ...]) -> Parent:
        store, key = self._host.store, self._requester.session_key
        session = await asyncio.to_thread(store.get, key)
        if session is None:
            raise NativeArgumentError("the requester's session does not exist")
        return Parent(
            session_key=key,
            session_id=session.session_id,
            agent_id=self._requester.agent_id,
            run_id=self._parent_run_id,
            tools=surface,
            model=self._host.config.agent_model(self._requester.agent_id).chain[0],
            blind=await self._host.natives.blind_session(key),
        )

    # -- spawn --------------------------------------------------------------------------------------------------

    async def spawn(
        self,
        *,
        task: str,
        request_id: str | None = None,
        label: str | None = None,
        model: str | None = None,
        thinking: str | None = None,
        context: Literal["isolated", "fork"] | None = None,
        blind: bool = False,
        fast_mode: bool | Literal["auto"] | None = None,
        profile: str | None = None,
        output_schema: dict[str, Any] | None = None,
        **forged: object,
    ) -> dict[str, Any]:
        """Spawn a native child for this invocation's requester; ``{run_id, child_session_key, request_id,
        selection}``."""
        if forged:
            raise NativeArgumentError(
                f"a plugin cannot choose {', '.join(sorted(forged))}: the gateway supplies the parent session, the "
                "requester, credentials and permission scope"
            )
        chosen = self._profile(profile)
        schema = self._schema(chosen, output_schema)
        if fast_mode is True:
            raise NativeUnsupportedError('fast_mode: this gateway has no fast mode (false or "auto" only)')
        if fast_mode not in (None, "auto", False):
            raise NativeArgumentError('fast_mode must be true, false or "auto"')
        if not isinstance(task, str) or not task.strip():
            raise NativeArgumentError("task must be a non-empty string")
        _text("request_id", request_id, optional=True, limit=128)
        _text("label", label, optional=True)
        _text("model", model, optional=True)
        if model is not None:
            check_model_override(self._host.config, self.plugin_id, self._requester.agent_id, model)
        if context not in (None, "isolated", "fork"):
            raise NativeArgumentError('context must be "isolated" or "fork"')
        if not isinstance(blind, bool):
            raise NativeArgumentError("blind must be a boolean")
        requested: dict[str, Any] = {
            key: value
            for key, value in (("model", model), ("thinking", thinking), ("context", context), ("fast_mode", fast_mode))
            if value is not None
        }
        if blind:
            requested["blind"] = True
        if chosen is not None:
            requested["profile"] = chosen.id
        digest = spec_digest(
            {
                "task": task,
                "label": label,
                "output_schema": None if output_schema is None else dict(output_schema),
                **{k: str(v) for k, v in requested.items()},
            }
        )
        if request_id is None:
            return await self._spawn(
                task, None, label, model, thinking, context, blind, digest, requested, chosen, schema
            )
        lock = self._replays.setdefault(request_id, asyncio.Lock())
        async with lock:  # one spawn per request id at a time, so a concurrent replay never makes a second child
            self._check(_SPAWN_TOOLS)
            found = await asyncio.to_thread(
                self._host.children.plugin_request, self.plugin_id, self._parent_run_id, request_id
            )
            if found is not None:
                record, recorded = found
                if recorded != digest:
                    raise NativeRequestConflictError(
                        "request_id was used in this turn with other arguments; use a new request_id"
                    )
                owner = await asyncio.to_thread(self._host.children.plugin_owner, record.run_id)
                return accepted(record, owner, requested)
            return await self._spawn(
                task, request_id, label, model, thinking, context, blind, digest, requested, chosen, schema
            )

    async def _spawn(
        self,
        task: str,
        request_id: str | None,
        label: str | None,
        model: str | None,
        thinking: str | None,
        context: Literal["isolated", "fork"] | None,
        blind: bool,
        digest: str,
        requested: dict[str, Any],
        profile: SubagentProfile | None,
        schema: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        surface = self._check(_SPAWN_TOOLS)
        parent = await self._parent(surface)
        hooked = await self._through_hooks(
            SpawnRequest(task=task, label=label, model=model, thinking=thinking, context=context, blind=blind),
            request_id,
            digest,
            surface,
        )
        if hooked.model is not None:
            # A model a tool hook put in is held to the same policy: no path widens what the plugin may choose.
            check_model_override(self._host.config, self.plugin_id, self._requester.agent_id, hooked.model)
        # What a profile and a schema add is the host's, after the hooks: no hook can remove or replace it.
        request = dataclasses.replace(
            hooked,
            instructions=child_instructions(profile, schema),
            tools_deny=() if profile is None else profile.tools_deny,
            profile_record=None if profile is None else profile.record(),
        )
        await self._record_input()  # the host commits the turn's actual input before any child exists
        self._check(_SPAWN_TOOLS)
        try:
            owner = PluginOwner(
                self.plugin_id,
                request_id,
                digest,
                output_schema=schema,
                profile=None if profile is None else profile.record(),
                thinking=request.thinking,
            )
            receipt = await self._host.natives.spawn(parent, request, plugin=owner)
        except SpawnRefusedError as exc:
            raise NativeRefusedError(exc.message) from exc
        run_id = str(receipt["runId"])
        if self._assertion is not None and self._host.authority is not None:
            # The child works under the requester's authority: a revocation fails it (at once while it queues).
            self._host.authority.retain(run_id, self._assertion)
        record = await asyncio.to_thread(self._host.children.get, run_id)
        assert record is not None  # recorded before its run started
        return accepted(record, owner, requested)

    def _profile(self, profile: object) -> SubagentProfile | None:
        if profile is None:
            return None
        if not isinstance(profile, str) or not profile:
            raise NativeArgumentError("profile must be the id of a profile this plugin registered")
        found = self._host.profiles.get(self._lifetimes[-1], self.plugin_id, profile)
        if found is None:
            raise NativeArgumentError(f"profile {profile[:64]!r} is not a profile this plugin registered")
        return found

    @staticmethod
    def _schema(profile: SubagentProfile | None, output_schema: object) -> Mapping[str, Any] | None:
        if output_schema is None:
            return None if profile is None else profile.output_schema
        if profile is not None and profile.output_schema is not None:
            raise NativeArgumentError("the profile's output schema cannot be replaced by the spawn's output_schema")
        try:
            return check_output_schema(output_schema, "output_schema")
        except SubagentProfileError as exc:
            raise NativeArgumentError(exc.message) from exc

    async def _through_hooks(
        self, request: SpawnRequest, request_id: str | None, digest: str, surface: tuple[str, ...]
    ) -> SpawnRequest:
        """The spawn as the ``before_tool_call`` hooks leave it (see the module docstring)."""
        hooks = self._host.hooks
        if hooks is None or not hooks.tool_handlers("before_tool_call", "sessions_spawn"):
            return request
        from clawstack.gateway.plugins.tool_hooks import BeforeToolCallEvent, before_tool_call

        params: dict[str, Any] = {"task": request.task, "runtime": "subagent", "mode": "run"}
        for key, value in (
            ("label", request.label),
            ("model", request.model),
            ("thinking", request.thinking),
            ("context", request.context),
            ("requestId", request_id),
        ):
            if value is not None:
                params[key] = value
        if request.blind:
            params["blind"] = True
        event = BeforeToolCallEvent(
            tool_name="sessions_spawn",
            params=params,
            run_id=self._parent_run_id,
            tool_call_id=f"native-{digest.removeprefix('sha256:')[:16]}",
            session_key=self._requester.session_key,
            agent_id=self._requester.agent_id,
        )
        decision = await before_tool_call(hooks, event, schema={"type": "object"}, allowed_tools=surface)
        self._check(_SPAWN_TOOLS)
        if decision.blocked:
            raise NativeRefusedError(f"a tool hook refused the spawn: {decision.reason}")
        rewritten = decision.params
        if rewritten.get("context") not in (None, "isolated", "fork"):
            raise NativeRewriteError('a tool hook set a context other than "isolated" or "fork"')
        if (
            rewritten.get("runtime") != "subagent"
            or rewritten.get("mode") != "run"
            or rewritten.get("requestId") != request_id
            or (request.blind and rewritten.get("blind") is not True)
        ):
            raise NativeRewriteError(
                "a tool hook changed what a native spawn keeps (runtime, run mode, request id or blind)"
            )
        try:
            return SpawnRequest(
                task=str(rewritten["task"]),
                label=_text("label", rewritten.get("label"), optional=True),
                model=_text("model", rewritten.get("model"), optional=True),
                thinking=rewritten.get("thinking"),
                context=rewritten.get("context"),
                blind=rewritten.get("blind") is True,
            )
        except (KeyError, NativeArgumentError) as exc:
            raise NativeRewriteError("a tool hook left the spawn without a valid task, label or model") from exc

    # -- collect ------------------------------------------------------------------------------------------------

    async def collect(
        self, *, ids: Sequence[str], timeout_seconds: float | None = None, await_results: bool = False
    ) -> dict[str, Any]:
        """``{results: [...], pending: [run ids]}`` for children this plugin accepted for this parent."""
        if isinstance(ids, str) or not ids or not all(isinstance(i, str) and i.strip() for i in ids):
            raise NativeArgumentError("ids must be a non-empty list of run ids")
        if await_results and timeout_seconds is not None:
            raise NativeArgumentError("await_results joins every result: it takes no timeout_seconds")
        if timeout_seconds is not None and (
            isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int | float) or timeout_seconds < 0
        ):
            raise NativeArgumentError("timeout_seconds must be a non-negative number")
        wanted = list(dict.fromkeys(ids))
        surface = self._check(("agents_wait",))
        parent = await self._parent(surface)
        for run_id in wanted:
            await self._own(parent, run_id)
        wait_s = DEFAULT_COLLECT_S if timeout_seconds is None else float(timeout_seconds)
        while True:
            state = await self._host.natives.wait(parent, wanted, 0.0 if await_results else wait_s)
            self._check(("agents_wait",))
            if not await_results or not state["pending"]:
                break
            await self._host.natives.wait(parent, list(state["pending"]), None)
            self._check(("agents_wait",))
        results, pending = [], []
        for run_id in wanted:
            record = await asyncio.to_thread(self._host.children.get, run_id)
            owner = await asyncio.to_thread(self._host.children.plugin_owner, run_id)
            if record is None or owner is None:
                continue
            if record.completion is None:
                pending.append(run_id)
            else:
                results.append(collected(record, owner))
        return {"results": results, "pending": pending}

    async def _own(self, parent: Parent, run_id: str) -> ChildRecord:
        record = await self._host.natives.owned(parent, run_id)
        owner = None if record is None else await asyncio.to_thread(self._host.children.plugin_owner, record.run_id)
        if record is None or owner is None or owner.plugin_id != self.plugin_id:
            raise NativeNotOwnerError("a run id is not a child this plugin accepted for this parent")
        return record

    # -- list ---------------------------------------------------------------------------------------------------

    async def list(self, *, status: str | None = None) -> list[dict[str, Any]]:
        """The children this plugin accepted for this parent incarnation (see the module docstring)."""
        if status is not None and status not in LIST_STATUSES:
            raise NativeArgumentError(f"status must be one of {', '.join(LIST_STATUSES)}")
        generation = self._config_generation()
        surface = self._check(("agents_wait",))
        parent = await self._parent(surface)
        rows = await asyncio.to_thread(
            self._host.children.plugin_children,
            self.plugin_id,
            parent.session_key,
            parent.session_id,
            status=status,
            limit=MAX_LIST,
        )
        self._check(("agents_wait",))
        if self._config_generation() != generation:
            raise NativePolicyChangedError("the runtime config changed while listing; retry the list")
        return [list_entry(record, request_id) for record, request_id in rows]

    def _config_generation(self) -> int:
        """Counts the live config changes (operators, channel senders) the gateway applied."""
        return 0 if self._host.authority is None else self._host.authority.generation
