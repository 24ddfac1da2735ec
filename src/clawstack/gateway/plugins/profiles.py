"""Plugin-local subagent profiles: ``api.agent.register_subagent_profile`` (``native-subagent-profiles-v1``).

A profile adds package-owned instructions to a native child and can only remove tools from the child's inherited
surface; it cannot select a model, an identity, credentials, authentication or a sandbox. A plugin declares its
profile ids in its manifest (``contracts.subagentProfiles``); only such a plugin gets
``api.agent.register_subagent_profile`` (``None`` otherwise) and the capability string, and only a declared id
registers.

* ``id``: a lowercase letter, then letters, digits, ``_`` or ``-``, at most 64 characters.
* ``description`` and ``instructions_file`` are required. The file is relative to the plugin's directory: no
  absolute path, no ``..``, no symbolic link anywhere on the way, not hard-linked elsewhere, a regular file of
  valid UTF-8 of at most 256 KiB. The whole file is captured at registration; later edits on disk change nothing
  until the plugin is reloaded.
* ``tools`` is ``None`` or exactly ``{"deny": [names]}``: names, aliases and ``group:`` names as in any tool deny;
  an empty or omitted deny list removes nothing (and grants nothing).
* ``output_schema``: a JSON schema the child's final answer must satisfy (a JSON document); the collector enforces
  it and neither a spawn nor a tool hook can replace or remove it.

Profiles belong to the registering plugin instance (its registry generation): another plugin cannot select one,
by its id or with the owner's id as a prefix, and a reload starts with none until the new instance registers them.
Each child spawned with a profile records ``subagentProfile`` (``pluginId``, ``id``, ``instructionsFile`` and the
hex SHA-256 ``instructionsSha256`` of the captured bytes).

Errors: :class:`SubagentProfileError` (``subagent_profile_invalid``), a
:class:`~clawstack.gateway.plugins.api.PluginError`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from clawstack.gateway.plugins.api import PluginError, PluginLifetime
from clawstack.gateway.tools import ToolPolicy, ToolPolicyError

__all__ = [
    "MAX_INSTRUCTIONS_BYTES",
    "PROFILES_CAPABILITY",
    "PluginAgent",
    "ProfileRegistry",
    "SubagentProfile",
    "SubagentProfileError",
    "check_output_schema",
]

PROFILES_CAPABILITY: Final = "native-subagent-profiles-v1"
MAX_INSTRUCTIONS_BYTES: Final = 256 * 1024
PROFILE_ID: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")


class SubagentProfileError(PluginError):
    """A profile registration, or a profile's output schema, was refused."""

    code = "subagent_profile_invalid"


@dataclass(frozen=True, slots=True)
class SubagentProfile:
    """A registered profile, its instructions captured."""

    plugin_id: str
    id: str
    description: str
    instructions_file: str
    instructions: str
    instructions_sha256: str
    tools_deny: tuple[str, ...]
    output_schema: Mapping[str, Any] | None

    def record(self) -> dict[str, str]:
        """``subagentProfile`` as a child run records it."""
        return {
            "pluginId": self.plugin_id,
            "id": self.id,
            "instructionsFile": self.instructions_file,
            "instructionsSha256": self.instructions_sha256,
        }


def check_output_schema(schema: object, what: str) -> Mapping[str, Any]:
    """``schema`` if it is a JSON schema object ``jsonschema`` accepts; :class:`SubagentProfileError` otherwise."""
    import jsonschema  # type: ignore[import-untyped]  # imported here: only a profile or a spawn schema needs it

    if not isinstance(schema, Mapping):
        raise SubagentProfileError(f"{what} must be a JSON schema object")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise SubagentProfileError(f"{what} is not a valid JSON schema: {exc.message}") from exc
    return dict(schema)


def _capture(root: Path, relative: object) -> tuple[str, bytes]:
    if not isinstance(relative, str) or not relative.strip():
        raise SubagentProfileError("instructions_file must be a non-empty relative path")
    parts = Path(relative).parts
    if Path(relative).is_absolute() or any(part in ("..", ".") for part in parts) or "\0" in relative:
        raise SubagentProfileError("instructions_file must stay inside the plugin (no absolute path, no ..)")
    current = root
    for part in parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except OSError as exc:
            raise SubagentProfileError(f"instructions_file {relative!r} does not exist") from exc
        if stat.S_ISLNK(mode):
            raise SubagentProfileError(f"instructions_file {relative!r} goes through a symbolic link")
    fd = os.open(current, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise SubagentProfileError(f"instructions_file {relative!r} is not a regular file")
        if status.st_nlink > 1:
            raise SubagentProfileError(f"instructions_file {relative!r} is hard-linked elsewhere")
        if status.st_size > MAX_INSTRUCTIONS_BYTES:
            raise SubagentProfileError(f"instructions_file {relative!r} is larger than {MAX_INSTRUCTIONS_BYTES} bytes")
        data = os.read(fd, MAX_INSTRUCTIONS_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_INSTRUCTIONS_BYTES:
        raise SubagentProfileError(f"instructions_file {relative!r} is larger than {MAX_INSTRUCTIONS_BYTES} bytes")
    return relative, data


class ProfileRegistry:
    """Every live plugin instance's profiles, gateway-wide; a profile is found only with its own instance."""

    def __init__(self) -> None:
        self._profiles: dict[tuple[int, str], SubagentProfile] = {}

    def add(self, lifetime: PluginLifetime, profile: SubagentProfile) -> None:
        self._profiles[(id(lifetime), profile.id)] = profile
        lifetime.on_retire(lambda: self._forget(lifetime))

    def _forget(self, lifetime: PluginLifetime) -> None:
        for key in [key for key in self._profiles if key[0] == id(lifetime)]:
            del self._profiles[key]

    def get(self, lifetime: PluginLifetime, plugin_id: str, profile_id: str) -> SubagentProfile | None:
        """The profile ``profile_id`` the plugin instance ``lifetime`` registered, or ``None``."""
        profile = self._profiles.get((id(lifetime), profile_id))
        return profile if profile is not None and profile.plugin_id == plugin_id and not lifetime.retired else None


class PluginAgent:
    """``api.agent``: ``register_subagent_profile`` for a plugin that declared profiles, ``None`` otherwise."""

    def __init__(
        self,
        plugin_id: str,
        root: Path,
        lifetime: PluginLifetime,
        declared: Sequence[str],
        registry: ProfileRegistry | None,
    ) -> None:
        self._plugin_id = plugin_id
        self._root = root
        self._lifetime = lifetime
        self._declared = frozenset(declared)
        self._registry = registry
        self.register_subagent_profile = self._register if declared and registry is not None else None

    def _register(
        self,
        *,
        id: str,
        description: str,
        instructions_file: str,
        tools: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        **forged: object,
    ) -> SubagentProfile:
        """Register a declared profile (see the module docstring); returns it as captured."""
        self._lifetime.check()
        assert self._registry is not None
        if forged:
            raise SubagentProfileError(
                f"a profile cannot set {', '.join(sorted(forged))}: it only adds instructions, denies tools and may "
                "require an output schema (no model, identity, credentials, authentication or sandbox)"
            )
        if not isinstance(id, str) or not PROFILE_ID.fullmatch(id):
            raise SubagentProfileError("id must be a lowercase letter, then letters, digits, _ or -, at most 64")
        if id not in self._declared:
            raise SubagentProfileError(f"profile {id!r} is not declared in contracts.subagentProfiles")
        if not isinstance(description, str) or not description.strip():
            raise SubagentProfileError("description is required")
        deny: tuple[str, ...] = ()
        if tools is not None:
            if not isinstance(tools, Mapping) or set(tools) - {"deny"}:
                raise SubagentProfileError('tools accepts only {"deny": [...]}: a profile can only remove tools')
            listed = tools.get("deny", [])
            if isinstance(listed, str) or not isinstance(listed, Sequence):
                raise SubagentProfileError("tools.deny must be a list of tool names")
            try:
                ToolPolicy(deny=list(listed))
            except ToolPolicyError as exc:
                raise SubagentProfileError(f"tools.deny: {exc.message}") from exc
            deny = tuple(listed)
        schema = None if output_schema is None else check_output_schema(output_schema, "output_schema")
        relative, data = _capture(self._root, instructions_file)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SubagentProfileError(f"instructions_file {relative!r} is not valid UTF-8") from exc
        profile = SubagentProfile(
            plugin_id=self._plugin_id,
            id=id,
            description=description,
            instructions_file=relative,
            instructions=text,
            instructions_sha256=hashlib.sha256(data).hexdigest(),
            tools_deny=deny,
            output_schema=schema,
        )
        self._registry.add(self._lifetime, profile)
        return profile
