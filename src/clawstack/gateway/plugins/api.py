"""The ``api`` object a plugin's ``register(api)`` receives, its commands, and the plugin error tree.

A :class:`PluginApi` belongs to one loaded instance of one plugin. When the instance is replaced (a reload) or
unloaded, the api is *retired*: every method and every attribute except ``id``, ``trust``, ``code_identity`` and
``retired`` raises :class:`PluginRetiredError`, retained references to ``api.runtime``, ``api.runtime.subagent``
and ``api.store`` fail the same way, its hooks never run again, and in-flight ``subagent.complete`` calls reject
with it.

**Command runtime capabilities.** A command may ask for the spec's command runtime capabilities
(:data:`COMMAND_RUNTIME_CAPABILITIES`: ``subagents``, ``scheduledTurns``), each declared in the manifest's
``contracts.commandRuntimeCapabilities``. A command asking for ``subagents`` registers on every host; at
invocation ``ctx.runtime_context.subagents`` is the native spawn/collect runtime where the host provides it for
that request and ``None`` otherwise (this gateway has no native children, so it is always ``None``). A command
asking for a capability the host does not support otherwise (``scheduledTurns`` here) is refused at registration
with :class:`CommandCapabilityError`, so the plugin can register a variant without it. Any other name is refused
at registration as not a command runtime capability.

Errors (all :class:`~clawstack.gateway.errors.GatewayError`, codes stable)::

    GatewayError
     └── PluginError                        plugin_error
          ├── PluginManifestError           plugin_manifest_invalid   problems: tuple[ConfigProblem, ...]
          ├── PluginLoadError               plugin_load_failed        the entry could not be imported or registered
          ├── PluginNotFoundError           plugin_not_found
          ├── PluginRetiredError            plugin_retired            the api belongs to a replaced instance
          ├── CommandRegistrationError      plugin_command_invalid    name rules, reserved, duplicate, undeclared
          │    └── CommandCapabilityError   plugin_capability_unsupported  a capability this host does not offer
          ├── PluginStoreError              plugin_store_error        ``api.store`` (tree in ``plugins.store``)
          └── SubagentError                 subagent_error
               ├── SubagentArgumentError    subagent_invalid_argument a malformed argument (type, range)
               ├── SubagentUnavailableError subagent_unavailable      no completion runtime is wired
               ├── ModelOverrideRefusedError subagent_model_refused   ``model`` outside the plugin's policy
               ├── SubagentCancelledError   subagent_cancelled        ``signal`` set while queued or running
               ├── SubagentTimeoutError     subagent_timeout          ``timeout_ms`` passed (retryable)
               ├── SubagentToolRefusedError subagent_tool_refused     ``tools_also_allow`` names a tool not solely its own
               ├── SubagentSessionForbiddenError subagent_session_forbidden  a session this plugin did not create
               ├── SubagentSessionBusyError subagent_session_busy     ``delete_session`` while a run is in flight
               ├── SubagentRunNotFoundError subagent_run_not_found    ``wait_for_run`` on a run it did not start
               ├── SubagentRequesterError   subagent_requester_unavailable  ``completion_delivery`` outside its hook
               └── SubagentModelError       subagent_model_failed     every model failed; ``model_error_code``
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, get_args, overload

from clawstack.gateway.commands import RESERVED_COMMANDS
from clawstack.gateway.errors import ConfigProblem, GatewayError
from clawstack.gateway.tools import TOOL_NAME_PATTERN, Tool, ToolInvocation, ToolRegistry

if TYPE_CHECKING:
    from clawstack.gateway.authority import AuthorityAssertion
    from clawstack.gateway.plugins.hook_dispatch import PluginHooks
    from clawstack.gateway.plugins.hooks import DispatchHandler, HookRegistry
    from clawstack.gateway.plugins.native_facade import NativeFacade
    from clawstack.gateway.plugins.profiles import PluginAgent
    from clawstack.gateway.plugins.store import PluginStoreSpace
    from clawstack.gateway.plugins.subagent import PluginSubagent
    from clawstack.gateway.plugins.tool_hooks import AfterToolCallHandler, BeforeToolCallHandler

__all__ = [
    "COMMAND_NAME_PATTERN",
    "COMMAND_RUNTIME_CAPABILITIES",
    "DISPATCH_HOOK_NAMES",
    "HOOK_NAMES",
    "RESERVED_COMMAND_NAMES",
    "TOOL_HOOK_NAMES",
    "CommandCapabilityError",
    "CommandContext",
    "CommandHandler",
    "CommandRegistrationError",
    "CommandRegistry",
    "CommandRuntimeCapability",
    "CommandRuntimeContext",
    "DispatchHookName",
    "HookName",
    "ModelOverrideRefusedError",
    "PluginApi",
    "PluginError",
    "PluginLifetime",
    "PluginLoadError",
    "PluginManifestError",
    "PluginNotFoundError",
    "PluginRetiredError",
    "PluginRuntime",
    "RegisteredCommand",
    "SubagentArgumentError",
    "SubagentCancelledError",
    "SubagentError",
    "SubagentModelError",
    "SubagentRequesterError",
    "SubagentRunNotFoundError",
    "SubagentSessionBusyError",
    "SubagentSessionForbiddenError",
    "SubagentTimeoutError",
    "SubagentToolRefusedError",
    "SubagentUnavailableError",
    "ToolHookName",
    "Trust",
    "freeze_config",
]

Trust = Literal["bundled", "trusted", "installed"]

DispatchHookName = Literal["before_dispatch", "reply_dispatch"]
ToolHookName = Literal["before_tool_call", "after_tool_call"]
HookName = Literal[DispatchHookName, ToolHookName]

#: The dispatch hooks a plugin may register, in the order the gateway runs them.
DISPATCH_HOOK_NAMES: Final[tuple[DispatchHookName, ...]] = get_args(DispatchHookName)

#: The tool hooks a plugin may register (``plugins.tool_hooks``).
TOOL_HOOK_NAMES: Final[tuple[ToolHookName, ...]] = get_args(ToolHookName)

#: Every hook a plugin may register with ``api.register_hook``.
HOOK_NAMES: Final[tuple[HookName, ...]] = (*DISPATCH_HOOK_NAMES, *TOOL_HOOK_NAMES)

CommandRuntimeCapability = Literal["subagents", "scheduledTurns"]

#: The command runtime capabilities the spec defines (manifest ``contracts.commandRuntimeCapabilities``).
COMMAND_RUNTIME_CAPABILITIES: Final[tuple[CommandRuntimeCapability, ...]] = get_args(CommandRuntimeCapability)

#: Command runtime capabilities a command may ask for on a host without them: absent at invocation instead.
_ABSENT_WHEN_UNSUPPORTED: Final = frozenset({"subagents"})

#: What a command name must match.
COMMAND_NAME_PATTERN: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")

#: Names the gateway's own commands use (:mod:`clawstack.gateway.commands`); no plugin may register them.
RESERVED_COMMAND_NAMES: Final = frozenset(RESERVED_COMMANDS)


# --------------------------------------------------------------------------------------------------------------------
# Errors


class PluginError(GatewayError):
    """Root of the plugin errors."""

    code = "plugin_error"


class PluginManifestError(PluginError):
    """``claw.plugin.json`` is missing, not JSON, or breaks the schema; ``problems`` names each key path."""

    code = "plugin_manifest_invalid"

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        super().__init__("claw.plugin.json: " + "; ".join(str(p) for p in self.problems))


class PluginLoadError(PluginError):
    """The entry module could not be imported, has no ``register``, or ``register`` raised."""

    code = "plugin_load_failed"


class PluginNotFoundError(PluginError):
    """No plugin with that id was found by the loader."""

    code = "plugin_not_found"


class PluginRetiredError(PluginError):
    """The api belongs to a plugin instance that was reloaded or unloaded."""

    code = "plugin_retired"


class CommandRegistrationError(PluginError):
    """A command, tool or hook was refused: bad name, reserved name, duplicate, or a capability not declared."""

    code = "plugin_command_invalid"


class CommandCapabilityError(CommandRegistrationError):
    """A command asked for a runtime capability this host does not offer (``scheduledTurns`` here)."""

    code = "plugin_capability_unsupported"


class SubagentError(PluginError):
    """Root of ``api.runtime.subagent`` errors."""

    code = "subagent_error"


class SubagentArgumentError(SubagentError):
    """An argument of a subagent call is malformed (wrong type, empty, out of range)."""

    code = "subagent_invalid_argument"


class SubagentUnavailableError(SubagentError):
    """This gateway has no completion runtime wired (``subagent.complete`` is not in the capabilities)."""

    code = "subagent_unavailable"


class ModelOverrideRefusedError(SubagentError):
    """The ``model`` override is outside ``plugins.entries.<id>.subagent`` policy; it is never downgraded."""

    code = "subagent_model_refused"


class SubagentCancelledError(SubagentError):
    """The completion was cancelled through its ``signal`` (queued work left at once, running work after cleanup)."""

    code = "subagent_cancelled"


class SubagentTimeoutError(SubagentError):
    """The completion did not finish within ``timeout_ms`` (queueing included)."""

    code = "subagent_timeout"
    retryable = True


class SubagentToolRefusedError(SubagentError):
    """A ``tools_also_allow`` name is not a tool this plugin alone registered (unknown, core, or another's)."""

    code = "subagent_tool_refused"


class SubagentSessionForbiddenError(SubagentError):
    """The session exists and this plugin did not create it (``subagent.run``/``get_session_messages``/``delete``)."""

    code = "subagent_session_forbidden"


class SubagentSessionBusyError(SubagentError):
    """``delete_session`` on a session with a run in flight; wait for it first."""

    code = "subagent_session_busy"


class SubagentRunNotFoundError(SubagentError):
    """``wait_for_run`` on a run id this plugin did not start (or that does not exist)."""

    code = "subagent_run_not_found"


class SubagentRequesterError(SubagentError):
    """``completion_delivery="current-requester"`` outside a ``before_dispatch`` hook of an authenticated request."""

    code = "subagent_requester_unavailable"


class SubagentModelError(SubagentError):
    """Every model of the chain failed; ``model_error_code`` is the last model error's own code."""

    code = "subagent_model_failed"

    def __init__(self, message: str, *, model_error_code: str) -> None:
        super().__init__(message)
        self.model_error_code = model_error_code


# --------------------------------------------------------------------------------------------------------------------
# Lifetime


class PluginLifetime:
    """Whether a plugin instance is live; retiring it fails every later use and cancels in-flight completions."""

    def __init__(self, plugin_id: str) -> None:
        self.plugin_id = plugin_id
        self._retired = False
        self._on_retire: list[Callable[[], None]] = []

    @property
    def retired(self) -> bool:
        """Whether :meth:`retire` was called."""
        return self._retired

    def check(self) -> None:
        """Raise :class:`PluginRetiredError` if retired."""
        if self._retired:
            raise PluginRetiredError(f"plugin {self.plugin_id!r}: this api belongs to a retired plugin instance")

    def on_retire(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when retired; returns a function that unregisters it."""
        self._on_retire.append(callback)

        def remove() -> None:
            if callback in self._on_retire:
                self._on_retire.remove(callback)

        return remove

    def retire(self) -> None:
        """Retire the instance (idempotent) and run the retirement callbacks."""
        if self._retired:
            return
        self._retired = True
        callbacks, self._on_retire = self._on_retire, []
        for callback in callbacks:
            callback()


# --------------------------------------------------------------------------------------------------------------------
# Commands


@dataclass(frozen=True, slots=True)
class CommandRuntimeContext:
    """``ctx.runtime_context``: the runtimes a command invocation gets for the capabilities it asked for.

    ``subagents`` is the requester-bound native spawn/collect runtime
    (:class:`~clawstack.gateway.plugins.native_facade.NativeFacade`): present only for an authorized requester's
    actual command with current operator authority, a ``require_auth`` command that asked for it, and a requester
    whose tool policy allows ``sessions_spawn`` and ``agents_wait``; ``None`` otherwise. ``scheduled_turns`` (the
    scheduling runtime) is not offered by this gateway: always ``None``. Probe both at invocation.
    """

    subagents: NativeFacade | None = None
    scheduled_turns: object | None = None


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a command handler receives: the text after the command name (``""`` without ``accepts_args``).

    ``channel`` is where the command came in (``"gateway"`` for Gateway chat, ``"webhook"``, …); ``sender_id`` is
    the channel's verified sender (``None`` on Gateway chat); ``authenticated`` says whether the sender passed the
    channel's command authorization. ``operator`` is the operator whose authority the command carries: the
    ``"gateway"`` operator on Gateway chat; on a channel, the operator a channel identity link ties an authorized
    sender to while that operator holds ``operator.admin``; otherwise ``None``. ``runtime_context`` holds the
    runtimes of the command's runtime capabilities (:class:`CommandRuntimeContext`). ``assertion`` is the captured
    operator authority of a ``require_auth`` command's authorized requester (``None`` otherwise): pass it as
    ``subagent.run(assert_current=ctx.assertion)`` so the run is admitted only while that authority holds.
    """

    plugin_id: str
    name: str
    args: str
    authenticated: bool
    channel: str = "gateway"
    sender_id: str | None = None
    operator: str | None = None
    runtime_context: CommandRuntimeContext = field(default_factory=CommandRuntimeContext)
    assertion: AuthorityAssertion | None = None


CommandHandler = Callable[[CommandContext], Awaitable[str]]

#: ``async (arguments) -> result text``: a plugin tool's handler.
PluginToolHandler = Callable[[dict[str, Any]], Awaitable[str]]
"""A command handler: takes one :class:`CommandContext`, returns the reply text."""


@dataclass(frozen=True, slots=True)
class RegisteredCommand:
    """A command a plugin registered, as the gateway lists and dispatches it."""

    plugin_id: str
    name: str
    description: str
    handler: CommandHandler
    require_auth: bool
    accepts_args: bool
    runtime_capabilities: frozenset[str]
    lifetime: PluginLifetime | None = None  # the registering plugin instance's


class CommandRegistry:
    """The commands of every loaded plugin; a name belongs to at most one plugin."""

    def __init__(self) -> None:
        self._commands: dict[str, RegisteredCommand] = {}

    def add(self, command: RegisteredCommand) -> None:
        """Add ``command``; :class:`CommandRegistrationError` if its name is taken."""
        owner = self._commands.get(command.name)
        if owner is not None:
            whose = "this plugin" if owner.plugin_id == command.plugin_id else f"plugin {owner.plugin_id!r}"
            raise CommandRegistrationError(f"command {command.name!r} is already registered by {whose}")
        self._commands[command.name] = command

    def remove_plugin(self, plugin_id: str) -> None:
        """Drop every command ``plugin_id`` registered."""
        self._commands = {k: c for k, c in self._commands.items() if c.plugin_id != plugin_id}

    def get(self, name: str) -> RegisteredCommand | None:
        """The command called ``name``, if any."""
        return self._commands.get(name)

    def all(self) -> tuple[RegisteredCommand, ...]:
        """Every registered command, by name."""
        return tuple(self._commands[name] for name in sorted(self._commands))

    def of(self, plugin_id: str) -> tuple[RegisteredCommand, ...]:
        """The commands ``plugin_id`` registered, by name."""
        return tuple(c for c in self.all() if c.plugin_id == plugin_id)


# --------------------------------------------------------------------------------------------------------------------
# The api object


class PluginRuntime:
    """``api.runtime``: the capabilities this gateway supports, the subagent runtime and hook dispatch."""

    def __init__(
        self, lifetime: PluginLifetime, capabilities: frozenset[str], subagent: PluginSubagent, hooks: PluginHooks
    ) -> None:
        self._lifetime = lifetime
        self._capabilities = capabilities
        self._subagent = subagent
        self._hooks = hooks

    @property
    def capabilities(self) -> frozenset[str]:
        """The capability strings this gateway offers this plugin now, no more: a capability that is always
        refused for it (``hooks.dispatch_hook_agent_turn`` for an ``installed`` plugin) is not listed."""
        self._lifetime.check()
        return self._capabilities

    @property
    def subagent(self) -> PluginSubagent:
        """``api.runtime.subagent``: background model work (``complete``, ``run``, ``wait_for_run``, …)."""
        self._lifetime.check()
        return self._subagent

    @property
    def hooks(self) -> PluginHooks:
        """``api.runtime.hooks``: ``dispatch_hook_agent_turn`` (bundled and trusted plugins only)."""
        self._lifetime.check()
        return self._hooks


def freeze_config(value: Any) -> Any:
    """A read-only deep copy of a JSON config value: objects become read-only mappings, arrays tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze_config(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze_config(v) for v in value)
    return value


class PluginApi:
    """The object a plugin's ``register(api)`` receives; see the module docstring for retirement."""

    def __init__(
        self,
        *,
        plugin_id: str,
        trust: Trust,
        code_identity: str | None,
        command_capabilities: frozenset[str],
        commands: CommandRegistry,
        tools: ToolRegistry,
        hooks: HookRegistry,
        runtime: PluginRuntime,
        lifetime: PluginLifetime,
        plugin_config: Mapping[str, Any] | None = None,
        store: PluginStoreSpace | None = None,
        supported_command_capabilities: frozenset[str] = frozenset(),
        agent: PluginAgent | None = None,
    ) -> None:
        self._id = plugin_id
        self._trust: Trust = trust
        self._code_identity = code_identity
        self._command_capabilities = command_capabilities
        self._supported_command_capabilities = supported_command_capabilities
        self._commands = commands
        self._tools = tools
        self._hooks = hooks
        self._runtime = runtime
        self._lifetime = lifetime
        self._plugin_config: Mapping[str, Any] = freeze_config(plugin_config or {})
        self._store = store
        self._agent = agent
        self._logger = logging.getLogger(f"clawstack.plugins.{plugin_id}")

    def __repr__(self) -> str:
        state = "retired" if self._lifetime.retired else "live"
        return f"PluginApi(id={self._id!r}, {state})"

    @property
    def id(self) -> str:
        """The plugin's id (from its manifest)."""
        return self._id

    @property
    def trust(self) -> Trust:
        """The trust class from ``plugins.entries.<id>.trust``."""
        return self._trust

    @property
    def code_identity(self) -> str | None:
        """The code identity captured at load: ``sha256:<hex>`` over the manifest and every ``.py`` file; for a
        bundled plugin, the build's identity, or ``None`` when it has none (run from source, or loaded from
        outside its build's ``bundled-plugins`` directory)."""
        return self._code_identity

    @property
    def retired(self) -> bool:
        """Whether this instance was replaced or unloaded."""
        return self._lifetime.retired

    @property
    def logger(self) -> logging.Logger:
        """The logger ``clawstack.plugins.<id>``."""
        self._lifetime.check()
        return self._logger

    @property
    def plugin_config(self) -> Mapping[str, Any]:
        """``plugins.entries.<id>.config`` as captured at load, read-only (arrays as tuples); ``{}`` when absent."""
        self._lifetime.check()
        return self._plugin_config

    @property
    def store(self) -> PluginStoreSpace:
        """``api.store``: this plugin's durable key-value space (``plugins.store``).

        Raises :class:`~clawstack.gateway.plugins.store.PluginStoreUnavailableError` when this gateway keeps no
        plugin store (``"store"`` is then not in ``api.runtime.capabilities``).
        """
        self._lifetime.check()
        if self._store is None:
            from clawstack.gateway.plugins.store import PluginStoreUnavailableError

            raise PluginStoreUnavailableError("this gateway keeps no plugin store (api.store is not available)")
        return self._store

    @property
    def agent(self) -> PluginAgent | None:
        """``api.agent``: ``register_subagent_profile`` (``None`` unless the manifest declares
        ``contracts.subagentProfiles`` on a gateway with native children; see
        :mod:`clawstack.gateway.plugins.profiles`)."""
        self._lifetime.check()
        return self._agent

    @property
    def runtime(self) -> PluginRuntime:
        """``api.runtime``: capabilities and the subagent runtime."""
        self._lifetime.check()
        return self._runtime

    @property
    def commands(self) -> tuple[RegisteredCommand, ...]:
        """The commands this plugin instance registered, by name."""
        self._lifetime.check()
        return self._commands.of(self._id)

    def register_command(
        self,
        name: str,
        handler: CommandHandler,
        *,
        description: str,
        require_auth: bool = True,
        accepts_args: bool = False,
        runtime_capabilities: Iterable[str] = (),
    ) -> RegisteredCommand:
        """Register the slash command ``name``; raise :class:`CommandRegistrationError` if refused.

        ``name`` must match :data:`COMMAND_NAME_PATTERN` and not be in :data:`RESERVED_COMMAND_NAMES` or taken by
        any plugin. Each of ``runtime_capabilities`` must be one of :data:`COMMAND_RUNTIME_CAPABILITIES`, declared
        in the manifest's ``contracts.commandRuntimeCapabilities``, and either offered by this gateway or
        ``subagents`` (which registers everywhere and is absent at invocation where the host lacks it); a
        capability the host does not offer raises :class:`CommandCapabilityError`.
        """
        self._lifetime.check()
        if not isinstance(name, str) or not COMMAND_NAME_PATTERN.fullmatch(name):
            raise CommandRegistrationError(
                f"command name {name!r} is not valid: a lower-case letter, then up to 31 lower-case letters,"
                " digits, '_' or '-'"
            )
        if name in RESERVED_COMMAND_NAMES:
            raise CommandRegistrationError(f"command name {name!r} is reserved by the gateway")
        if not callable(handler):
            raise CommandRegistrationError(f"command {name!r}: the handler must be callable")
        if not isinstance(description, str) or not description.strip():
            raise CommandRegistrationError(f"command {name!r}: a non-empty description is required")
        wanted = self._check_runtime_capabilities(name, runtime_capabilities)
        command = RegisteredCommand(
            plugin_id=self._id,
            name=name,
            description=description,
            handler=handler,
            require_auth=bool(require_auth),
            accepts_args=bool(accepts_args),
            runtime_capabilities=wanted,
            lifetime=self._lifetime,
        )
        self._commands.add(command)
        return command

    def _check_runtime_capabilities(self, name: str, capabilities: Iterable[str]) -> frozenset[str]:
        listed = () if isinstance(capabilities, str) or not isinstance(capabilities, Iterable) else tuple(capabilities)
        if isinstance(capabilities, str) or not all(isinstance(c, str) for c in listed):
            raise CommandRegistrationError(f"command {name!r}: runtime_capabilities must be a list of strings")
        wanted = frozenset(listed)
        unknown = sorted(wanted.difference(COMMAND_RUNTIME_CAPABILITIES))
        if unknown:
            hint = (
                " (api.runtime.subagent needs no declaration)"
                if any(c.startswith("subagent.") for c in unknown)
                else ""
            )
            raise CommandRegistrationError(
                f"command {name!r}: {unknown} are not command runtime capabilities; the known ones are"
                f" {list(COMMAND_RUNTIME_CAPABILITIES)}{hint}"
            )
        undeclared = sorted(wanted - self._command_capabilities)
        if undeclared:
            raise CommandRegistrationError(
                f"command {name!r}: runtime capabilities {undeclared} are not declared in the manifest's"
                " contracts.commandRuntimeCapabilities"
            )
        unsupported = sorted(wanted - self._supported_command_capabilities - _ABSENT_WHEN_UNSUPPORTED)
        if unsupported:
            raise CommandCapabilityError(
                f"command {name!r}: runtime capabilities {unsupported} are not supported by this gateway;"
                " register a variant without them"
            )
        return wanted

    def register_tool(
        self,
        name: str,
        handler: PluginToolHandler,
        *,
        description: str,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        """Register a tool this plugin owns; it reaches a model only through ``subagent.run(tools_also_allow=…)``.

        ``parameters`` is the JSON schema of the arguments object (default: no arguments). The name follows the
        tool-name rule and may not be taken by the gateway or another plugin
        (:class:`~clawstack.gateway.tools.ToolExistsError`).
        """
        self._lifetime.check()
        if not callable(handler):
            raise CommandRegistrationError(f"tool {name!r}: the handler must be callable")
        if not isinstance(description, str) or not description.strip():
            raise CommandRegistrationError(f"tool {name!r}: a non-empty description is required")
        schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}

        async def invoke(arguments: dict[str, Any], invocation: ToolInvocation) -> str:
            # Imported here: the completion runtime imports this module. A completion the tool starts ends with
            # the tool call.
            from clawstack.gateway.plugins.complete import invocation_scope

            with invocation_scope(PluginLifetime(self._id)):
                return await handler(arguments)

        self._tools.register(Tool(name, description, schema, invoke, owner=self._id))

    @overload
    def register_hook(self, name: DispatchHookName, handler: DispatchHandler) -> None: ...

    @overload
    def register_hook(
        self,
        name: Literal["before_tool_call"],
        handler: BeforeToolCallHandler,
        *,
        matcher: Iterable[str] | None = None,
    ) -> None: ...

    @overload
    def register_hook(
        self,
        name: Literal["after_tool_call"],
        handler: AfterToolCallHandler,
        *,
        matcher: Iterable[str] | None = None,
    ) -> None: ...

    def register_hook(self, name: HookName, handler: Any, *, matcher: Iterable[str] | None = None) -> None:
        """Register a hook handler: a dispatch hook (``before_dispatch``, ``reply_dispatch``; see
        ``clawstack.gateway.plugins.hooks``) or a tool hook (``before_tool_call``, ``after_tool_call``; see
        ``clawstack.gateway.plugins.tool_hooks``).

        ``matcher``, for tool hooks only, is a non-empty list of exact tool names the handler is for; without it
        the handler sees every tool call.
        """
        from clawstack.gateway.plugins.hooks import RegisteredHook
        from clawstack.gateway.plugins.tool_hooks import RegisteredToolHook

        self._lifetime.check()
        if name not in HOOK_NAMES:
            raise CommandRegistrationError(f"hook {name!r} is not one of {', '.join(HOOK_NAMES)}")
        if not callable(handler):
            raise CommandRegistrationError(f"hook {name!r}: the handler must be callable")
        if name == "before_dispatch" or name == "reply_dispatch":
            if matcher is not None:
                raise CommandRegistrationError(f"hook {name!r}: matcher applies only to tool hooks")
            self._hooks.add(RegisteredHook(self._id, name, handler, self._runtime.subagent, self._lifetime))
            return
        tools = None if matcher is None else _check_matcher(name, matcher)
        self._hooks.add_tool_hook(RegisteredToolHook(self._id, name, handler, self._lifetime, tools))


def _check_matcher(hook: str, matcher: Iterable[str]) -> frozenset[str]:
    if isinstance(matcher, str) or not isinstance(matcher, Iterable):
        raise CommandRegistrationError(f"hook {hook!r}: matcher must be a list of tool names")
    names = list(matcher)
    if not names:
        raise CommandRegistrationError(f"hook {hook!r}: matcher must name at least one tool (omit it for all)")
    for tool in names:
        if not isinstance(tool, str) or not TOOL_NAME_PATTERN.fullmatch(tool):
            raise CommandRegistrationError(
                f"hook {hook!r}: matcher entries are exact tool names (1 to 64 of A-Z a-z 0-9 _ -)"
            )
    return frozenset(names)
