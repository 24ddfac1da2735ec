"""Gateway plugins: loading ``claw.plugin.json`` plugins, the ``api`` object, and the plugin runtime.

* :mod:`~clawstack.gateway.plugins.loader`: :class:`PluginLoader` finds, validates and loads plugins, records each
  one's code identity, and reloads one (retiring the old instance's api).
* :mod:`~clawstack.gateway.plugins.api`: :class:`PluginApi` (``api.id``, ``api.trust``, ``api.code_identity``,
  ``api.logger``, ``api.plugin_config``, ``api.store``, ``api.runtime``, ``api.register_command``,
  ``api.register_tool``, ``api.register_hook``), command runtime capabilities and the plugin error tree.
* :mod:`~clawstack.gateway.plugins.store`: ``api.store``, each plugin's durable key-value space with a quota.
* :mod:`~clawstack.gateway.plugins.complete`: ``api.runtime.subagent.complete``, tool-free isolated inference on
  the shared ``subagent`` lane under the plugin's model policy.
* :mod:`~clawstack.gateway.plugins.subagent`: ``api.runtime.subagent`` (``run``, ``wait_for_run``,
  ``get_session_messages``, ``delete_session``) and the request-bound variant dispatch hooks get.
* :mod:`~clawstack.gateway.plugins.hooks`: the hook registry and ``before_dispatch`` / ``reply_dispatch``.
* :mod:`~clawstack.gateway.plugins.native_facade`: ``ctx.subagent.native``, requester-bound native children of an
  eligible ``reply_dispatch`` handler (``spawn``, ``collect``, ``list``).
* :mod:`~clawstack.gateway.plugins.tool_hooks`: ``before_tool_call`` / ``after_tool_call`` and the functions the
  agent loop runs them with.
* :mod:`~clawstack.gateway.plugins.hook_dispatch`: ``api.runtime.hooks.dispatch_hook_agent_turn``.

Errors (every one a :class:`~clawstack.gateway.errors.GatewayError` with a stable ``code``)::

    GatewayError
     └── PluginError                        plugin_error
          ├── PluginManifestError           plugin_manifest_invalid
          ├── PluginLoadError               plugin_load_failed
          ├── PluginNotFoundError           plugin_not_found
          ├── PluginRetiredError            plugin_retired
          ├── CommandRegistrationError      plugin_command_invalid
          │    └── CommandCapabilityError   plugin_capability_unsupported
          ├── PluginStoreError              plugin_store_error
          │    ├── PluginStoreUnavailableError plugin_store_unavailable
          │    ├── PluginStoreKeyError      plugin_store_key_invalid
          │    ├── PluginStoreValueError    plugin_store_value_invalid
          │    └── PluginStoreQuotaError    plugin_store_quota_exceeded
          └── SubagentError                 subagent_error
               ├── SubagentArgumentError    subagent_invalid_argument
               ├── SubagentUnavailableError subagent_unavailable
               ├── ModelOverrideRefusedError subagent_model_refused
               ├── SubagentCancelledError   subagent_cancelled
               ├── SubagentTimeoutError     subagent_timeout (retryable)
               ├── SubagentToolRefusedError subagent_tool_refused
               ├── SubagentSessionForbiddenError subagent_session_forbidden
               ├── SubagentSessionBusyError subagent_session_busy
               ├── SubagentRunNotFoundError subagent_run_not_found
               ├── SubagentRequesterError   subagent_requester_unavailable
               ├── SubagentAuthorityRevokedError requester_authority_revoked
               ├── SubagentModelError       subagent_model_failed
               └── NativeError              native_error (and its subclasses, native_facade)
"""

from clawstack.gateway.plugins.api import (
    COMMAND_RUNTIME_CAPABILITIES,
    DISPATCH_HOOK_NAMES,
    HOOK_NAMES,
    RESERVED_COMMAND_NAMES,
    TOOL_HOOK_NAMES,
    CommandCapabilityError,
    CommandContext,
    CommandHandler,
    CommandRegistrationError,
    CommandRegistry,
    CommandRuntimeContext,
    HookName,
    ModelOverrideRefusedError,
    PluginApi,
    PluginError,
    PluginLoadError,
    PluginManifestError,
    PluginNotFoundError,
    PluginRetiredError,
    PluginRuntime,
    RegisteredCommand,
    SubagentArgumentError,
    SubagentCancelledError,
    SubagentError,
    SubagentModelError,
    SubagentRequesterError,
    SubagentRunNotFoundError,
    SubagentSessionBusyError,
    SubagentSessionForbiddenError,
    SubagentTimeoutError,
    SubagentToolRefusedError,
    SubagentUnavailableError,
    Trust,
)
from clawstack.gateway.plugins.complete import (
    SUBAGENT_COMPLETE,
    CompleteResult,
    CompletionUsage,
    SubagentCompleter,
    invocation_scope,
)
from clawstack.gateway.plugins.hook_dispatch import HOOK_AGENT_TURNS, HookDispatcher, HookDispatchResult, PluginHooks
from clawstack.gateway.plugins.hooks import DispatchContext, DispatchHandler, HookRegistry, RegisteredHook
from clawstack.gateway.plugins.loader import (
    MANIFEST_NAME,
    LoadedPlugin,
    PluginLoader,
    PluginManifest,
    code_identity,
    read_manifest,
)
from clawstack.gateway.plugins.native_facade import NativeError, NativeFacade
from clawstack.gateway.plugins.store import (
    PLUGIN_STORE,
    PLUGIN_STORE_FILE,
    PluginStore,
    PluginStoreError,
    PluginStoreKeyError,
    PluginStoreQuotaError,
    PluginStoreSpace,
    PluginStoreUnavailableError,
    PluginStoreValueError,
    StoreUsage,
)
from clawstack.gateway.plugins.subagent import (
    SUBAGENT_RUN,
    PluginSubagent,
    RequestSubagent,
    SessionMessages,
    SubagentAuthorityRevokedError,
    SubagentRun,
    SubagentRunner,
    WaitResult,
)
from clawstack.gateway.plugins.tool_hooks import (
    AfterToolCallEvent,
    BeforeToolCallEvent,
    BeforeToolCallResult,
    RegisteredToolHook,
    ToolCallDecision,
    after_tool_call,
    before_tool_call,
)

__all__ = [
    "COMMAND_RUNTIME_CAPABILITIES",
    "DISPATCH_HOOK_NAMES",
    "HOOK_AGENT_TURNS",
    "HOOK_NAMES",
    "MANIFEST_NAME",
    "PLUGIN_STORE",
    "PLUGIN_STORE_FILE",
    "RESERVED_COMMAND_NAMES",
    "SUBAGENT_COMPLETE",
    "SUBAGENT_RUN",
    "TOOL_HOOK_NAMES",
    "AfterToolCallEvent",
    "BeforeToolCallEvent",
    "BeforeToolCallResult",
    "CommandCapabilityError",
    "CommandContext",
    "CommandHandler",
    "CommandRegistrationError",
    "CommandRegistry",
    "CommandRuntimeContext",
    "CompleteResult",
    "CompletionUsage",
    "DispatchContext",
    "DispatchHandler",
    "HookDispatchResult",
    "HookDispatcher",
    "HookName",
    "HookRegistry",
    "LoadedPlugin",
    "ModelOverrideRefusedError",
    "NativeError",
    "NativeFacade",
    "PluginApi",
    "PluginError",
    "PluginHooks",
    "PluginLoadError",
    "PluginLoader",
    "PluginManifest",
    "PluginManifestError",
    "PluginNotFoundError",
    "PluginRetiredError",
    "PluginRuntime",
    "PluginStore",
    "PluginStoreError",
    "PluginStoreKeyError",
    "PluginStoreQuotaError",
    "PluginStoreSpace",
    "PluginStoreUnavailableError",
    "PluginStoreValueError",
    "PluginSubagent",
    "RegisteredCommand",
    "RegisteredHook",
    "RegisteredToolHook",
    "RequestSubagent",
    "SessionMessages",
    "StoreUsage",
    "SubagentArgumentError",
    "SubagentAuthorityRevokedError",
    "SubagentCancelledError",
    "SubagentCompleter",
    "SubagentError",
    "SubagentModelError",
    "SubagentRequesterError",
    "SubagentRun",
    "SubagentRunNotFoundError",
    "SubagentRunner",
    "SubagentSessionBusyError",
    "SubagentSessionForbiddenError",
    "SubagentTimeoutError",
    "SubagentToolRefusedError",
    "SubagentUnavailableError",
    "ToolCallDecision",
    "Trust",
    "WaitResult",
    "after_tool_call",
    "before_tool_call",
    "code_identity",
    "invocation_scope",
    "read_manifest",
]
