"""Gateway plugins: loading ``claw.plugin.json`` plugins, the ``api`` object, and the plugin runtime.

* :mod:`~clawstack.gateway.plugins.loader`: :class:`PluginLoader` finds, validates and loads plugins, records each
  one's code identity, and reloads one (retiring the old instance's api).
* :mod:`~clawstack.gateway.plugins.api`: :class:`PluginApi` (``api.id``, ``api.trust``, ``api.code_identity``,
  ``api.logger``, ``api.runtime``, ``api.register_command``, ``api.register_tool``, ``api.register_hook``) and the
  plugin error tree.
* :mod:`~clawstack.gateway.plugins.complete`: ``api.runtime.subagent.complete``, tool-free isolated inference on
  the shared ``subagent`` lane under the plugin's model policy.
* :mod:`~clawstack.gateway.plugins.subagent`: ``api.runtime.subagent`` (``run``, ``wait_for_run``,
  ``get_session_messages``, ``delete_session``) and the request-bound variant dispatch hooks get.
* :mod:`~clawstack.gateway.plugins.hooks`: ``before_dispatch`` / ``reply_dispatch`` handlers.
* :mod:`~clawstack.gateway.plugins.hook_dispatch`: ``api.runtime.hooks.dispatch_hook_agent_turn``.

Errors (every one a :class:`~clawstack.gateway.errors.GatewayError` with a stable ``code``)::

    GatewayError
     └── PluginError                        plugin_error
          ├── PluginManifestError           plugin_manifest_invalid
          ├── PluginLoadError               plugin_load_failed
          ├── PluginNotFoundError           plugin_not_found
          ├── PluginRetiredError            plugin_retired
          ├── CommandRegistrationError      plugin_command_invalid
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
               └── SubagentModelError       subagent_model_failed
"""

from clawstack.gateway.plugins.api import (
    HOOK_NAMES,
    RESERVED_COMMAND_NAMES,
    CommandContext,
    CommandHandler,
    CommandRegistrationError,
    CommandRegistry,
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
from clawstack.gateway.plugins.complete import SUBAGENT_COMPLETE, CompleteResult, CompletionUsage, SubagentCompleter
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
from clawstack.gateway.plugins.subagent import (
    SUBAGENT_RUN,
    PluginSubagent,
    RequestSubagent,
    SessionMessages,
    SubagentRun,
    SubagentRunner,
    WaitResult,
)

__all__ = [
    "HOOK_AGENT_TURNS",
    "HOOK_NAMES",
    "MANIFEST_NAME",
    "RESERVED_COMMAND_NAMES",
    "SUBAGENT_COMPLETE",
    "SUBAGENT_RUN",
    "CommandContext",
    "CommandHandler",
    "CommandRegistrationError",
    "CommandRegistry",
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
    "PluginSubagent",
    "RegisteredCommand",
    "RegisteredHook",
    "RequestSubagent",
    "SessionMessages",
    "SubagentArgumentError",
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
    "Trust",
    "WaitResult",
    "code_identity",
    "read_manifest",
]
