"""The runtime registry: an instance a host fills and injects into a server factory, never a global.

A runtime registers an id, a provider and up to three callbacks; its capabilities are derived from which
callbacks exist (``inspect`` is required, ``continue`` and ``detach`` are optional). There is no spawn and no list
callback: the registry can only address a session it was told about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from clawstack.connect.agent_session.types import (
    ContinueCallback,
    DetachCallback,
    InspectCallback,
    Operation,
    is_runtime_id,
)
from clawstack.connect.errors import AgentSessionRegistrationError

MAX_PROVIDER_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class RuntimeEntry:
    """One registered runtime."""

    id: str
    provider: str
    inspect: InspectCallback
    continue_: ContinueCallback | None = None
    detach: DetachCallback | None = None

    @property
    def capabilities(self) -> frozenset[str]:
        present = {"inspect": True, "continue": self.continue_ is not None, "detach": self.detach is not None}
        return frozenset(name for name, there in present.items() if there)

    def supports(self, operation: Operation) -> bool:
        return operation in self.capabilities


class AgentSessionRuntimeRegistry:
    """The runtimes one ClawConnect server may address. Two registries never share anything."""

    def __init__(self) -> None:
        self._entries: dict[str, RuntimeEntry] = {}

    def register(
        self,
        id: str,
        *,
        provider: str,
        inspect: InspectCallback,
        continue_: ContinueCallback | None = None,
        detach: DetachCallback | None = None,
    ) -> None:
        """Register a runtime; :class:`AgentSessionRegistrationError` for a bad or duplicate id, an empty provider,
        a missing ``inspect`` or a callback that cannot be called."""
        if not is_runtime_id(id):
            raise AgentSessionRegistrationError(
                "runtime id: must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}", code="agent_session_runtime_id_invalid"
            )
        if id in self._entries:
            raise AgentSessionRegistrationError(
                f"runtime {id!r} is already registered", code="agent_session_runtime_duplicate"
            )
        if not isinstance(provider, str) or not provider.strip() or len(provider) > MAX_PROVIDER_CHARS:
            raise AgentSessionRegistrationError(
                f"runtime {id!r}: provider must be a non-empty string of at most {MAX_PROVIDER_CHARS} characters",
                code="agent_session_provider_invalid",
            )
        if inspect is None or not callable(inspect):
            raise AgentSessionRegistrationError(
                f"runtime {id!r}: inspect is required and must be callable", code="agent_session_callback_invalid"
            )
        for name, callback in (("continue", continue_), ("detach", detach)):
            if callback is not None and not callable(callback):
                raise AgentSessionRegistrationError(
                    f"runtime {id!r}: {name} must be callable or omitted", code="agent_session_callback_invalid"
                )
        self._entries[id] = RuntimeEntry(id, provider, inspect, continue_, detach)

    def get(self, runtime_id: str) -> RuntimeEntry | None:
        """The runtime registered as ``runtime_id``, or ``None``."""
        return self._entries.get(runtime_id)

    def ids(self) -> tuple[str, ...]:
        """Registered runtime ids, in registration order."""
        return tuple(self._entries)

    def capabilities(self, runtime_id: str) -> frozenset[str]:
        """A subset of ``{"inspect", "continue", "detach"}``; empty for an unknown runtime."""
        entry = self._entries.get(runtime_id)
        return entry.capabilities if entry is not None else frozenset()

    def _adopt(self, other: AgentSessionRuntimeRegistry) -> None:
        """Take every runtime of ``other`` (a module's staging registry), or none when an id is already taken."""
        clash = sorted(set(other._entries) & set(self._entries))
        if clash:
            raise AgentSessionRegistrationError(
                f"runtime {clash[0]!r} is already registered", code="agent_session_runtime_duplicate"
            )
        self._entries.update(other._entries)

    def __contains__(self, runtime_id: object) -> bool:
        return runtime_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"AgentSessionRuntimeRegistry({list(self._entries)!r})"


__all__ = ["AgentSessionRuntimeRegistry", "RuntimeEntry"]
