"""Finding, validating and loading plugins: ``claw.plugin.json`` plus a Python entry module.

A plugin is a directory holding ``claw.plugin.json``::

    {"id": "hello", "version": "1.0.0", "entry": "plugin.py",
     "contracts": {"subagentProfiles": [], "commandRuntimeCapabilities": ["subagents"]}}

:class:`PluginLoader` looks in ``plugins.load.paths`` and its own ``search_paths``; each path is a plugin
directory or a directory of plugin directories. For every plugin found it validates the manifest (unknown
top-level keys refused, precise key paths), skips it when ``plugins.entries.<id>.enabled`` is false, captures its
source and computes its **code identity** (:func:`code_identity`), executes the captured entry source as a module
of its own (a fresh module name per load), and calls ``register(api)`` once. A plugin whose manifest is invalid,
whose entry cannot be imported, or whose ``register`` raises is reported ``failed`` with the error's code and
message, and contributes no commands; the other plugins load. :meth:`PluginLoader.reload` retires the old
instance's api (see :mod:`clawstack.gateway.plugins.api`) and loads a new instance with a new api.

**Contracts this gateway does not support** never fail the plugin; each is named in a warning (logged, and kept
in :attr:`LoadedPlugin.warnings`) and only what needs it is refused:

* an unknown ``contracts`` key (``sessionScheduledTurns``, …) is recorded as unsupported;
* a ``commandRuntimeCapabilities`` entry that is not a command runtime capability (``subagents``,
  ``scheduledTurns``) is recorded, and a command asking for it is refused at registration;
* ``subagentProfiles`` lists the profile ids the plugin may register (``api.agent.register_subagent_profile``);
  only such a plugin gets that method and the ``native-subagent-profiles-v1`` capability.

Each plugin's ``api.runtime.capabilities`` lists what is offered to it: ``subagent.complete`` and
``subagent.run`` when wired, ``hooks.dispatch_hook_agent_turn`` when wired and the plugin is ``bundled`` or
``trusted``, ``store`` when the loader has a :class:`~clawstack.gateway.plugins.store.PluginStore`, and
``native-subagent-blind-v1``, ``native-subagent-list-v1`` and ``command-native-subagents-v1`` when its hook
registry has a native host (the ``reply_dispatch`` and command facade,
:mod:`~clawstack.gateway.plugins.native_facade`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import sys
import types
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, ValidationError
from pydantic.alias_generators import to_camel

from clawstack.gateway.config import GatewayConfig, PluginEntry, PluginId, _problems_from_pydantic
from clawstack.gateway.errors import ConfigProblem
from clawstack.gateway.plugins.api import (
    COMMAND_RUNTIME_CAPABILITIES,
    CommandRegistry,
    PluginApi,
    PluginError,
    PluginLifetime,
    PluginLoadError,
    PluginManifestError,
    PluginNotFoundError,
    PluginRuntime,
    Trust,
)
from clawstack.gateway.plugins.complete import SUBAGENT_COMPLETE, SubagentCompleter
from clawstack.gateway.plugins.hook_dispatch import HOOK_AGENT_TURNS, HookDispatcher, PluginHooks
from clawstack.gateway.plugins.hooks import HookRegistry
from clawstack.gateway.plugins.native_facade import BLIND_CAPABILITY, COMMAND_CAPABILITY, LIST_CAPABILITY
from clawstack.gateway.plugins.profiles import PROFILES_CAPABILITY, PluginAgent
from clawstack.gateway.plugins.store import PLUGIN_STORE, PluginStore, PluginStoreSpace
from clawstack.gateway.plugins.subagent import SUBAGENT_RUN, PluginSubagent, SubagentRunner
from clawstack.gateway.tools import ToolRegistry

__all__ = [
    "BUILD_INFO_FILE",
    "BUNDLED_PLUGINS_DIR",
    "MANIFEST_NAME",
    "BuildInfo",
    "LoadedPlugin",
    "PluginContracts",
    "PluginLoader",
    "PluginManifest",
    "PluginState",
    "bundled_identity",
    "code_identity",
    "contract_warnings",
    "process_build_info",
    "read_manifest",
]

#: The manifest's file name inside a plugin directory.
MANIFEST_NAME: Final = "claw.plugin.json"

#: The largest manifest accepted, in bytes.
_MANIFEST_MAX_BYTES: Final = 64 * 1024

PluginState = Literal["loaded", "failed", "disabled"]


def _check_version(value: str) -> str:
    if not value or len(value) > 64 or not all(c.isalnum() or c in ".+-" for c in value):
        raise ValueError("must be 1-64 letters, digits, '.', '+' or '-'")
    return value


def _check_entry(value: str) -> str:
    path = PurePosixPath(value)
    if not value.endswith(".py") or path.is_absolute() or ".." in path.parts or "\\" in value or value.startswith("~"):
        raise ValueError('must be a relative path to a ".py" file inside the plugin directory')
    return value


def _check_profile(value: str) -> str:
    if not (
        0 < len(value) <= 64
        and value[0].isascii()
        and value[0].islower()
        and all(c.isascii() and (c.islower() or c.isdigit() or c in "_-") for c in value)
    ):
        raise ValueError("must be a lower-case letter, then lower-case letters, digits, '_' or '-' (at most 64)")
    return value


def _check_capability(value: str) -> str:
    if not value or len(value) > 64 or any(c.isspace() for c in value):
        raise ValueError("must be a non-empty capability name without whitespace")
    return value


def _unique(values: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(values)) != len(values):
        raise ValueError("must not repeat an entry")
    return values


class _Manifest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=False, hide_input_in_errors=True
    )


class PluginContracts(_Manifest):
    """``contracts``: what the plugin declares it will use; keys this gateway does not know are kept aside."""

    model_config = ConfigDict(
        extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=False, hide_input_in_errors=True
    )

    subagent_profiles: Annotated[
        tuple[Annotated[StrictStr, AfterValidator(_check_profile)], ...], AfterValidator(_unique)
    ] = ()
    command_runtime_capabilities: Annotated[
        tuple[Annotated[StrictStr, AfterValidator(_check_capability)], ...], AfterValidator(_unique)
    ] = ()

    @property
    def unknown_keys(self) -> tuple[str, ...]:
        """The ``contracts`` keys this gateway does not know, sorted."""
        return tuple(sorted(self.model_extra or {}))


class PluginManifest(_Manifest):
    """``claw.plugin.json``, validated."""

    id: PluginId
    version: Annotated[StrictStr, AfterValidator(_check_version)]
    entry: Annotated[StrictStr, Field(min_length=1), AfterValidator(_check_entry)]
    contracts: PluginContracts = PluginContracts()


def read_manifest(directory: Path) -> tuple[PluginManifest, bytes]:
    """Read and validate ``directory/claw.plugin.json``; return it and its exact bytes.

    Raises :class:`PluginManifestError` naming the key path of every problem; the entry file must exist inside
    ``directory``.
    """
    path = directory / MANIFEST_NAME
    try:
        with path.open("rb") as file:
            data = file.read(_MANIFEST_MAX_BYTES + 1)
    except OSError as exc:
        raise PluginManifestError([ConfigProblem("", f"cannot read: {exc.strerror or type(exc).__name__}")]) from None
    if len(data) > _MANIFEST_MAX_BYTES:
        raise PluginManifestError([ConfigProblem("", f"larger than {_MANIFEST_MAX_BYTES} bytes")])
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise PluginManifestError([ConfigProblem("", "not valid UTF-8")]) from None
    except json.JSONDecodeError as exc:
        problem = ConfigProblem("", f"not valid JSON (line {exc.lineno}, column {exc.colno})")
        raise PluginManifestError([problem]) from None
    if not isinstance(document, dict):
        raise PluginManifestError([ConfigProblem("", "must be a JSON object")])
    problems: list[ConfigProblem] = []
    try:
        manifest = PluginManifest.model_validate(document)
    except ValidationError as exc:
        problems = _problems_from_pydantic(exc.errors(include_url=False, include_input=False))
    if problems:
        raise PluginManifestError(problems)
    entry = (directory / manifest.entry).resolve()
    if not entry.is_relative_to(directory.resolve()):
        raise PluginManifestError([ConfigProblem("entry", "resolves outside the plugin directory")])
    if not entry.is_file():
        raise PluginManifestError([ConfigProblem("entry", "no such file in the plugin directory")])
    return manifest, data


def code_identity(directory: Path, manifest_bytes: bytes) -> tuple[str, dict[str, bytes]]:
    """``"sha256:<hex>"`` over the manifest bytes and every ``.py`` file under ``directory``, and those files.

    Files are taken in order of their relative POSIX path; each contributes its path and its bytes, every part
    length-prefixed so that no two different trees give the same input. Returns the identity and the captured
    sources by relative path.
    """
    digest = hashlib.sha256()

    def part(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    part(manifest_bytes)
    sources: dict[str, bytes] = {}
    files = sorted(
        (p.relative_to(directory).as_posix(), p) for p in directory.rglob("*.py") if p.is_file() and not p.is_symlink()
    )
    for relative, path in files:
        data = path.read_bytes()
        sources[relative] = data
        part(relative.encode("utf-8"))
        part(data)
    return "sha256:" + digest.hexdigest(), sources


#: The build record of an installed clawstack build (absent in a source checkout), beside the package.
BUILD_INFO_FILE: Final = "build-info.json"

#: Where a build keeps its bundled plugins, beside the package.
BUNDLED_PLUGINS_DIR: Final = "bundled-plugins"


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """The build record a gateway process read once at start: build id, version, commit and build time."""

    build_id: str
    version: str
    commit: str
    built_at: str
    root: Path

    @classmethod
    def read(cls, package_root: Path) -> BuildInfo | None:
        """The record in ``package_root/build-info.json``; ``None`` when there is none or it is malformed."""
        try:
            data = json.loads((package_root / BUILD_INFO_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        fields = ("buildId", "version", "commit", "builtAt")
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k] for k in fields):
            return None
        return cls(data["buildId"], data["version"], data["commit"], data["builtAt"], package_root.resolve())


@functools.cache
def process_build_info() -> BuildInfo | None:
    """This process's build record, read once (the first call) from beside the ``clawstack`` package."""
    import clawstack

    return BuildInfo.read(Path(clawstack.__file__).parent)


def bundled_identity(build: BuildInfo | None, plugin_id: str, directory: Path, entry: str) -> str | None:
    """A bundled plugin's code identity: the exact build plus the plugin id and its real root and entry paths.

    ``None`` (no sound identity) when the process has no build record (run from source) or the plugin was loaded
    from outside that build's ``bundled-plugins`` directory (an override or a checkout). Every build records a new
    build time, so a rebuild, upgrade or downgrade changes the identity even at the same paths and version.
    """
    if build is None:
        return None
    root = directory.resolve()
    if not root.is_relative_to(build.root / BUNDLED_PLUGINS_DIR):
        return None
    record = {
        "build": {
            "buildId": build.build_id,
            "version": build.version,
            "commit": build.commit,
            "builtAt": build.built_at,
        },
        "pluginId": plugin_id,
        "root": str(root),
        "entry": str((directory / entry).resolve()),
    }
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class LoadedPlugin:
    """One plugin as the loader found it: ``loaded`` (with its ``api``), ``failed`` (with ``error``) or ``disabled``.

    ``error`` is ``{"code", "message"}``; ``id`` is the manifest's id, or the directory name when the manifest
    could not be read. ``warnings`` names each declared contract this gateway does not support (see the module
    docstring).
    """

    id: str
    path: Path
    state: PluginState
    version: str | None = None
    trust: Trust = "installed"
    code_identity: str | None = None
    error: dict[str, str] | None = None
    api: PluginApi | None = None
    warnings: tuple[str, ...] = ()


@dataclass(slots=True)
class _Instance:
    record: LoadedPlugin
    lifetime: PluginLifetime | None
    module_name: str | None


class PluginLoader:
    """Loads the plugins of one gateway; see the module docstring.

    ``completer`` runs ``api.runtime.subagent.complete`` for every plugin (one shared lane); without it the
    capability is not advertised and calls raise ``subagent_unavailable``. ``store`` backs every plugin's
    ``api.store``; without it ``api.store`` raises ``plugin_store_unavailable``. ``commands`` defaults to a new
    :class:`CommandRegistry`.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        search_paths: Sequence[str | Path] = (),
        completer: SubagentCompleter | None = None,
        runner: SubagentRunner | None = None,
        hook_dispatcher: HookDispatcher | None = None,
        commands: CommandRegistry | None = None,
        tools: ToolRegistry | None = None,
        hooks: HookRegistry | None = None,
        build: BuildInfo | None = None,
        store: PluginStore | None = None,
    ) -> None:
        self._config = config
        self._build = build
        self._search_paths = (*config.plugins.load.paths, *(Path(p) for p in search_paths))
        self._completer = completer
        self._runner = runner
        self._hook_dispatcher = hook_dispatcher
        self._store = store
        self.commands = commands or CommandRegistry()
        self.tools = tools if tools is not None else ToolRegistry()
        self.hooks = hooks if hooks is not None else HookRegistry()
        capabilities = set()
        if completer is not None:
            capabilities.add(SUBAGENT_COMPLETE)
        if runner is not None:
            capabilities.add(SUBAGENT_RUN)
        if hook_dispatcher is not None:
            capabilities.add(HOOK_AGENT_TURNS)
        if store is not None:
            capabilities.add(PLUGIN_STORE)
        if self.hooks.native_host is not None:
            capabilities |= {BLIND_CAPABILITY, LIST_CAPABILITY, COMMAND_CAPABILITY}
        self.capabilities: frozenset[str] = frozenset(capabilities)
        self._instances: dict[str, _Instance] = {}

    def capabilities_for(self, trust: Trust) -> frozenset[str]:
        """What a plugin of ``trust`` is offered: :attr:`capabilities` less what is always refused to it."""
        if trust in ("bundled", "trusted"):
            return self.capabilities
        return self.capabilities - {HOOK_AGENT_TURNS}

    @property
    def plugins(self) -> tuple[LoadedPlugin, ...]:
        """Every plugin found by the last :meth:`load` (and later reloads), by id."""
        return tuple(self._instances[k].record for k in sorted(self._instances))

    def get(self, plugin_id: str) -> LoadedPlugin:
        """The current record of ``plugin_id``; :class:`PluginNotFoundError` if there is none."""
        instance = self._instances.get(plugin_id)
        if instance is None:
            raise PluginNotFoundError(f"no plugin {plugin_id!r} was found")
        return instance.record

    def discover(self) -> list[Path]:
        """The plugin directories on the search paths, in search-path order, then by name."""
        found: list[Path] = []
        for root in self._search_paths:
            if (root / MANIFEST_NAME).is_file():
                found.append(root)
            elif root.is_dir():
                found.extend(sorted(p for p in root.iterdir() if (p / MANIFEST_NAME).is_file()))
        return found

    def load(self) -> tuple[LoadedPlugin, ...]:
        """Retire what is loaded, then find and load every plugin; returns :attr:`plugins`."""
        self.retire_all()
        self._instances.clear()
        for directory in self.discover():
            self._load_directory(directory)
        return self.plugins

    def reload(self, plugin_id: str) -> LoadedPlugin:
        """Retire ``plugin_id``'s current instance and load a new one from the same directory."""
        old = self._instances.get(plugin_id)
        if old is None:
            raise PluginNotFoundError(f"no plugin {plugin_id!r} was found")
        self._retire(old)
        del self._instances[plugin_id]
        return self._load_directory(old.record.path)

    def retire_all(self) -> None:
        """Retire every loaded instance (idempotent): their apis fail and their commands are dropped."""
        for instance in self._instances.values():
            self._retire(instance)

    def _retire(self, instance: _Instance) -> None:
        if instance.lifetime is not None:
            instance.lifetime.retire()
            self._unregister(instance.record.id)
        if instance.module_name is not None:
            sys.modules.pop(instance.module_name, None)

    def _unregister(self, plugin_id: str) -> None:
        self.commands.remove_plugin(plugin_id)
        self.tools.unregister_owner(plugin_id)
        self.hooks.remove_plugin(plugin_id)

    def _load_directory(self, directory: Path) -> LoadedPlugin:
        try:
            manifest, manifest_bytes = read_manifest(directory)
        except PluginManifestError as exc:
            return self._record(_Instance(_failed(directory.name, directory, exc), None, None))
        if manifest.id in self._instances:
            duplicate = PluginLoadError(
                f"plugin id {manifest.id!r} is already taken by {self._instances[manifest.id].record.path}"
            )
            failed = _failed(manifest.id, directory, duplicate, version=manifest.version)
            # The first plugin with this id keeps it; the duplicate is reported in the log only.
            _log_failure(failed)
            return failed
        entry = self._config.plugins.entries.get(manifest.id) or PluginEntry()
        base = LoadedPlugin(
            id=manifest.id, path=directory, state="disabled", version=manifest.version, trust=entry.trust
        )
        if not entry.enabled:
            return self._record(_Instance(base, None, None))
        source_identity, sources = code_identity(directory, manifest_bytes)
        identity = (
            bundled_identity(self._build, manifest.id, directory, manifest.entry)
            if entry.trust == "bundled"
            else source_identity
        )
        lifetime = PluginLifetime(manifest.id)
        native_host = self.hooks.native_host
        profiles = manifest.contracts.subagent_profiles if native_host is not None else ()
        capabilities = self.capabilities_for(entry.trust) | ({PROFILES_CAPABILITY} if profiles else set())
        runtime = PluginRuntime(
            lifetime,
            capabilities,
            PluginSubagent(manifest.id, lifetime, self._completer, self._runner),
            PluginHooks(manifest.id, entry.trust, lifetime, self._hook_dispatcher),
        )
        api = PluginApi(
            plugin_id=manifest.id,
            trust=entry.trust,
            code_identity=identity,
            command_capabilities=frozenset(manifest.contracts.command_runtime_capabilities),
            supported_command_capabilities=frozenset({"subagents"})
            if self.hooks.native_host is not None
            else frozenset(),
            agent=PluginAgent(
                manifest.id,
                directory,
                lifetime,
                profiles,
                None if native_host is None else native_host.profiles,
            ),
            commands=self.commands,
            tools=self.tools,
            hooks=self.hooks,
            runtime=runtime,
            lifetime=lifetime,
            plugin_config=entry.config,
            store=None if self._store is None else PluginStoreSpace(self._store, manifest.id, lifetime),
        )
        warnings = contract_warnings(manifest.contracts)
        module_name = f"clawstack_plugin_{manifest.id.replace('.', '_').replace('-', '_')}_{uuid.uuid4().hex}"
        record = LoadedPlugin(
            id=manifest.id,
            path=directory,
            state="loaded",
            version=manifest.version,
            trust=entry.trust,
            code_identity=identity,
            api=api,
            warnings=warnings,
        )
        try:
            self._execute(directory, manifest.entry, sources, module_name, api)
        except PluginError as exc:
            lifetime.retire()
            self._unregister(manifest.id)
            sys.modules.pop(module_name, None)
            failed = _failed(manifest.id, directory, exc, version=manifest.version, trust=entry.trust)
            return self._record(_Instance(replace(failed, code_identity=identity, warnings=warnings), None, None))
        return self._record(_Instance(record, lifetime, module_name))

    @staticmethod
    def _execute(directory: Path, entry: str, sources: dict[str, bytes], module_name: str, api: PluginApi) -> None:
        entry_key = PurePosixPath(entry).as_posix().removeprefix("./")
        source = sources.get(entry_key)
        if source is None:
            raise PluginLoadError(f"entry {entry!r} is not a regular .py file of the plugin")
        path = directory / entry
        module = types.ModuleType(module_name)
        module.__file__ = str(path)
        sys.modules[module_name] = module
        try:
            exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - loading the plugin is the point
        except Exception as exc:
            raise PluginLoadError(f"importing {entry} failed: {type(exc).__name__}: {exc}") from exc
        register = getattr(module, "register", None)
        if not callable(register):
            raise PluginLoadError(f"{entry} defines no register(api) function")
        try:
            result = register(api)
        except PluginError as exc:
            raise PluginLoadError(f"register(api) failed: [{exc.code}] {exc.message}", code=exc.code) from exc
        except Exception as exc:
            raise PluginLoadError(f"register(api) raised {type(exc).__name__}: {exc}") from exc
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise PluginLoadError("register(api) must be a plain function, not a coroutine function")

    def _record(self, instance: _Instance) -> LoadedPlugin:
        self._instances[instance.record.id] = instance
        log = logging.getLogger("clawstack.plugins")
        for warning in instance.record.warnings:
            log.warning("plugin %s: %s", instance.record.id, warning)
        if instance.record.state == "failed":
            _log_failure(instance.record)
        return instance.record


def contract_warnings(contracts: PluginContracts) -> tuple[str, ...]:
    """One message per declared contract this gateway does not support (see the module docstring)."""
    warnings = [
        f"contracts.{key if key.isidentifier() else json.dumps(key)}: not supported by this gateway; recorded as"
        " unsupported, and whatever needs it is refused"
        for key in contracts.unknown_keys
    ]
    unknown = [c for c in contracts.command_runtime_capabilities if c not in COMMAND_RUNTIME_CAPABILITIES]
    if unknown:
        warnings.append(
            f"contracts.commandRuntimeCapabilities: {unknown} are not command runtime capabilities (known:"
            f" {list(COMMAND_RUNTIME_CAPABILITIES)}); a command asking for them is refused"
        )
    return tuple(warnings)


def _failed(
    plugin_id: str, directory: Path, exc: PluginError, *, version: str | None = None, trust: Trust = "installed"
) -> LoadedPlugin:
    return LoadedPlugin(id=plugin_id, path=directory, state="failed", version=version, trust=trust, error=exc.to_dict())


def _log_failure(record: LoadedPlugin) -> None:
    error = record.error or {}
    logging.getLogger("clawstack.plugins").warning(
        "plugin %s (%s) failed to load: [%s] %s", record.id, record.path, error.get("code"), error.get("message")
    )
