"""Model family drift: a compiled template's chain entry that was resolved from a family which, under the table
in effect now (the shipped one with the pod's ``x-claw.model-families`` on top), resolves to another model.

``claw runs doctor`` reports it; ``claw up`` recompiles the template with the new resolution (and a new template
id, so a spec pinned to the old id is refused with ``template_changed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clawstack.models.families import FamilyError, FamilyTable
from clawstack.pod.artifacts import PodPaths, list_templates
from clawstack.pod.errors import PodError
from clawstack.pod.podfile import POD_FILE
from clawstack.pod.yamlload import load_yaml


@dataclass(frozen=True, slots=True)
class Drift:
    template: str
    slot: str
    requested: str
    compiled: str
    now: str | None  # None: the family no longer resolves at all

    def describe(self) -> str:
        now = f"now resolves to {self.now}" if self.now else "no longer resolves"
        return f"{self.template} {self.slot} {self.requested} {now}; compiled {self.compiled}"


def current_families(paths: PodPaths) -> FamilyTable:
    """The family table the pod file declares today; raises :class:`PodError` when it cannot be read."""
    document: Any = load_yaml((paths.pod / POD_FILE).read_bytes(), source=POD_FILE)
    overrides = ((document or {}).get("x-claw") or {}).get("model-families") or {}
    if not isinstance(overrides, dict):
        raise PodError("must be a mapping", where=f"{POD_FILE}: x-claw.model-families")
    try:
        return FamilyTable.with_overrides(overrides)
    except FamilyError as exc:
        raise PodError(str(exc), where=f"{POD_FILE}: x-claw.model-families") from None


def family_drift(paths: PodPaths, table: FamilyTable | None = None) -> tuple[int, list[Drift]]:
    """How many compiled chain entries came from a family, and those that drifted."""
    table = table or current_families(paths)
    in_use, drifted = 0, []
    for template in list_templates(paths)["templates"]:
        for model in template["models"]:
            requested = model.get("requested")
            if requested is None:
                continue
            in_use += 1
            try:
                now: str | None = table.resolve(requested)
            except FamilyError:
                now = None
            if now != model["ref"]:
                drifted.append(Drift(template["name"], model["slot"], requested, model["ref"], now))
    return in_use, drifted


__all__ = ["Drift", "current_families", "family_drift"]
