"""Loading an example runtime module from its file, the way a host names it in
``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES``, and a registry stub that records what a module registers."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RUNTIMES = ROOT / "examples" / "runtimes"


def load_example(name: str) -> ModuleType:
    """``examples/runtimes/<name>/runtime.py`` as a module (imported once per test session)."""
    module_name = f"example_runtime_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, RUNTIMES / name / "runtime.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses resolve their module by name while the file executes
    spec.loader.exec_module(module)
    return module


@dataclass
class Registration:
    id: str
    provider: str
    inspect: Any
    continue_: Any
    detach: Any


@dataclass
class RecordingRegistry:
    """Stands in for the seam's registry: records every ``register`` call and refuses a duplicate id."""

    calls: list[Registration] = field(default_factory=list)

    def register(self, id: str, *, provider: str, inspect: Any, continue_: Any = None, detach: Any = None) -> None:
        assert all(call.id != id for call in self.calls), f"{id} registered twice"
        self.calls.append(Registration(id, provider, inspect, continue_, detach))

    def only(self) -> Registration:
        [registration] = self.calls
        return registration


@dataclass(frozen=True)
class Ref:
    """The fields of the seam's ``AgentSessionRef`` that the examples read."""

    session_id: str
    runtime: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    signal: Any
    deadline_ms: int = 60_000


@dataclass(frozen=True)
class Continue:
    prompt: str | None
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Detach:
    reason: str
    stop_runtime: bool
