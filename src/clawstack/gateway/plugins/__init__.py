"""Gateway plugins: loading ``claw.plugin.json`` plugins, the ``api`` object, and ``subagent.complete``.

* :mod:`~clawstack.gateway.plugins.loader`: :class:`PluginLoader` finds, validates and loads plugins, records each
  one's code identity, and reloads one (retiring the old instance's api).
* :mod:`~clawstack.gateway.plugins.api`: :class:`PluginApi` (``api.id``, ``api.trust``, ``api.code_identity``,
  ``api.logger``, ``api.runtime``, ``api.register_command``, ``api.commands``) and the plugin error tree.
* :mod:`~clawstack.gateway.plugins.complete`: ``api.runtime.subagent.complete``, tool-free isolated inference on
  the shared ``subagent`` lane under the plugin's model policy.

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
               └── SubagentModelError       subagent_model_failed
"""

from clawstack.gateway.plugins.api import (
    RESERVED_COMMAND_NAMES,
    CommandContext,
    CommandHandler,
    CommandRegistrationError,
    CommandRegistry,
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
    SubagentTimeoutError,
    SubagentUnavailableError,
    Trust,
)
from clawstack.gateway.plugins.complete import (
    SUBAGENT_COMPLETE,
    CompleteResult,
    CompletionUsage,
    PluginSubagent,
    SubagentCompleter,
)
from clawstack.gateway.plugins.loader import (
    MANIFEST_NAME,
    LoadedPlugin,
    PluginLoader,
    PluginManifest,
    code_identity,
    read_manifest,
)

__all__ = [
    "MANIFEST_NAME",
    "RESERVED_COMMAND_NAMES",
    "SUBAGENT_COMPLETE",
    "CommandContext",
    "CommandHandler",
    "CommandRegistrationError",
    "CommandRegistry",
    "CompleteResult",
    "CompletionUsage",
    "LoadedPlugin",
    "ModelOverrideRefusedError",
    "PluginApi",
    "PluginError",
    "PluginLoadError",
    "PluginLoader",
    "PluginManifest",
    "PluginManifestError",
    "PluginNotFoundError",
    "PluginRetiredError",
    "PluginRuntime",
    "PluginSubagent",
    "RegisteredCommand",
    "SubagentArgumentError",
    "SubagentCancelledError",
    "SubagentCompleter",
    "SubagentError",
    "SubagentModelError",
    "SubagentTimeoutError",
    "SubagentUnavailableError",
    "Trust",
    "code_identity",
    "read_manifest",
]
