"""Loading host modules named by ``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES``.

The variable lists Python modules, separated by commas or newlines: dotted module paths (``mypkg.runtimes``) or
``.py`` files. Each module exposes ``register_agent_session_runtimes(registry)``, a plain function. A module
registers into a staging registry first and its runtimes are adopted only when it finished without error, so a
broken module leaves nothing half-registered; it is reported (logged on stderr and returned) and the others still
load. Without the variable nothing is registered.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Final

from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
from clawstack.connect.errors import AgentSessionRegistrationError

ENV_VAR: Final = "CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES"
HOOK: Final = "register_agent_session_runtimes"
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModuleLoadReport:
    """What loading one entry did: the runtimes it registered, or why it registered none."""

    entry: str
    ok: bool
    runtimes: tuple[str, ...] = ()
    code: str | None = None
    error: str | None = None


def split_spec(spec: str | None) -> list[str]:
    """The entries of the variable's value, in order, blanks dropped."""
    if not spec:
        return []
    return [part.strip() for line in spec.splitlines() for part in line.split(",") if part.strip()]


def _is_file_entry(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry


def _import(entry: str) -> ModuleType:
    if not _is_file_entry(entry):
        return importlib.import_module(entry)
    path = Path(entry).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(entry)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"clawconnect_runtime_module_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {entry}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(name, None)
        raise
    return module


def _load_one(registry: AgentSessionRuntimeRegistry, entry: str) -> ModuleLoadReport:
    try:
        module = _import(entry)
    except (ModuleNotFoundError, FileNotFoundError):
        return ModuleLoadReport(entry, False, code="module_not_found", error="the module cannot be found")
    except Exception as exc:
        return ModuleLoadReport(entry, False, code="module_import_failed", error=f"import raised {type(exc).__name__}")
    hook = getattr(module, HOOK, None)
    if hook is None or not callable(hook):
        return ModuleLoadReport(entry, False, code="register_missing", error=f"the module has no {HOOK}(registry)")
    if inspect.iscoroutinefunction(hook):
        return ModuleLoadReport(entry, False, code="register_invalid", error=f"{HOOK} must be a plain function")
    staging = AgentSessionRuntimeRegistry()
    try:
        hook(staging)
        registry._adopt(staging)
    except AgentSessionRegistrationError as exc:
        return ModuleLoadReport(entry, False, code=exc.code, error=exc.message)
    except Exception as exc:
        return ModuleLoadReport(entry, False, code="register_failed", error=f"{HOOK} raised {type(exc).__name__}")
    return ModuleLoadReport(entry, True, runtimes=staging.ids())


def load_runtime_modules(registry: AgentSessionRuntimeRegistry, spec: str | None) -> list[ModuleLoadReport]:
    """Load every module ``spec`` names into ``registry``; one report per entry, failures logged on stderr."""
    reports = []
    for entry in split_spec(spec):
        report = _load_one(registry, entry)
        if report.ok:
            _log.info("agent-session host module %s registered %s", entry, ", ".join(report.runtimes) or "nothing")
        else:
            _log.error("agent-session host module %s not loaded: [%s] %s", entry, report.code, report.error)
        reports.append(report)
    return reports


__all__ = ["ENV_VAR", "HOOK", "ModuleLoadReport", "load_runtime_modules", "split_spec"]
