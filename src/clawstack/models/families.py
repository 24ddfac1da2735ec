"""Model families: ``openai/@terra`` names whatever exact model the family table says, resolved at ``claw up``.

The table ships with clawstack and is versioned (:data:`FAMILY_TABLE_VERSION`); a pod may override or add
entries in ``x-claw.model-families``. A family always resolves within its own provider prefix, so a family never
moves a template to another billing path (a ``chatgpt/@…`` family stays on the plan route). The compiled chain
entry keeps the exact ``ref`` and the ``requested`` family, both part of the template id; ``claw runs doctor``
reports *drift* when the family now resolves elsewhere than a compiled template says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from clawstack.models.refs import is_family_ref, split_model_ref

FAMILY_TABLE_VERSION: Final = "2026-11-10"
SHIPPED_FAMILIES: Final[Mapping[str, str]] = {
    "openai/@terra": "openai/gpt-6.1-terra",
    "openai/@luna": "openai/gpt-6-luna",
    "openai/@nano": "openai/gpt-4.1-nano",
    "chatgpt/@terra": "chatgpt/gpt-6.1-terra",
    "vercel/openai/@terra": "vercel/openai/gpt-6.1-terra",
    "vercel/openai/@nano": "vercel/openai/gpt-4.1-nano",
    "anthropic/@sonnet": "anthropic/claude-sonnet-5",
    "openrouter/google/@flash": "openrouter/google/gemini-3.8-flash",
}


class FamilyError(ValueError):
    """A family reference or override that cannot be used; the message says why (never a credential)."""


def family_provider(ref: str) -> str:
    """What a family reference (or its resolution) must share: everything before the last segment."""
    return ref.rsplit("/", 1)[0]


@dataclass(frozen=True, slots=True)
class FamilyTable:
    """The shipped table with a pod's overrides on top."""

    overrides: Mapping[str, str]

    @classmethod
    def with_overrides(cls, overrides: Mapping[str, object]) -> FamilyTable:
        """Validate a pod's ``x-claw.model-families``; raise :class:`FamilyError` naming the bad entry."""
        checked: dict[str, str] = {}
        for family, target in overrides.items():
            if not isinstance(family, str) or not is_family_ref(family):
                raise FamilyError(f"{family!r} is not a family reference such as openai/@terra")
            if not isinstance(target, str) or split_model_ref(target) is None or is_family_ref(target):
                raise FamilyError(f"{family} must resolve to an exact provider/model reference")
            if family_provider(target) != family_provider(family):
                raise FamilyError(f"{family} must resolve within {family_provider(family)}/, not to {target}")
            checked[family] = target
        return cls(checked)

    def resolve(self, requested: str) -> str:
        """The exact model ``requested`` names today; raise :class:`FamilyError` for an unknown family."""
        target = self.overrides.get(requested) or SHIPPED_FAMILIES.get(requested)
        if target is None:
            known = sorted({*SHIPPED_FAMILIES, *self.overrides})
            raise FamilyError(
                f"unknown model family {requested!r} (table {FAMILY_TABLE_VERSION}; known: {', '.join(known)}; "
                "add it under x-claw.model-families)"
            )
        return target

    def source(self, requested: str) -> str:
        """``pod`` when the pod's override decides ``requested``, else ``shipped``."""
        return "pod" if requested in self.overrides else "shipped"


SHIPPED_TABLE: Final = FamilyTable({})

__all__ = ["FAMILY_TABLE_VERSION", "SHIPPED_FAMILIES", "SHIPPED_TABLE", "FamilyError", "FamilyTable", "family_provider"]
