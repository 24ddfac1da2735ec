"""The reasoning efforts a model does not support, where this table knows it.

Keyed by the start of the model id (the reference's last segment), so ``openai/gpt-6-luna``,
``chatgpt/gpt-6.1-terra`` and ``vercel/openai/gpt-6.1-terra`` share the GPT-6 entry. A model the table does not
know is sent whatever effort its slot declares, and the upstream decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

UNSUPPORTED_EFFORTS: Final[Mapping[str, frozenset[str]]] = {
    "gpt-6": frozenset({"minimal"}),
}


def effort_refusal(ref: str, effort: str | None) -> str | None:
    """Why ``ref`` cannot take ``effort`` (a message), or ``None`` when it can or the table does not know."""
    if effort is None:
        return None
    model = ref.rsplit("/", 1)[-1]
    for prefix, efforts in UNSUPPORTED_EFFORTS.items():
        if model.startswith(prefix) and effort in efforts:
            return f"{ref} does not support reasoning effort {effort!r}"
    return None


__all__ = ["UNSUPPORTED_EFFORTS", "effort_refusal"]
