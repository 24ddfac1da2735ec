"""Small value grammars of the pod file: durations, byte sizes, model references, slots, OpenRouter slugs."""

from __future__ import annotations

import re
from typing import Final

from clawstack.pod.errors import ValidationError

DURATION: Final = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
SIZE: Final = re.compile(r"(\d+)([kmg]?)b?", re.IGNORECASE)
SLOT: Final = re.compile(r"primary|fallback(?:-([2-9]|[1-9][0-9]))?")
OPENROUTER_SLUG: Final = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*){0,3}")
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high")
BUILTIN_PREFIXES: Final = frozenset({"openai", "anthropic", "xai", "google", "meta", "openrouter", "vercel"})
PLAN_PREFIXES: Final = frozenset({"chatgpt"})
PROVIDER_KEY_ENV: Final = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "xai": "XAI_API_KEY",
    "google": "GEMINI_API_KEY",
    "meta": "LLAMA_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "vercel": "AI_GATEWAY_API_KEY",
}


def parse_duration_s(value: object, *, where: str) -> int:
    """``30m``, ``2h``, ``1h30m``, ``900s`` or a bare number of seconds; whole seconds, at least 1."""
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if text.isdigit():
        seconds = int(text)
    else:
        match = DURATION.fullmatch(text)
        if not text or match is None or not any(match.groups()):
            raise ValidationError(f"{value!r} is not a duration in whole seconds such as 90s, 30m or 2h", where=where)
        hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds < 1:
        raise ValidationError("must be at least 1s", where=where)
    return seconds


def parse_size(value: object, *, where: str) -> int:
    """``512m``, ``1g``, ``65536`` (bytes); k/m/g are powers of 1024."""
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    match = SIZE.fullmatch(text)
    if match is None:
        raise ValidationError(f"{value!r} is not a size such as 512m, 1g or 65536", where=where)
    number, unit = int(match.group(1)), match.group(2).lower()
    return number * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit]


def bounded(value: int, low: int, high: int, *, where: str, unit: str = "") -> int:
    if not low <= value <= high:
        raise ValidationError(f"must be between {low}{unit} and {high}{unit}", where=where)
    return value


def slot_order(slot: str) -> int:
    """``primary`` 0, ``fallback`` 1, ``fallback-N`` N."""
    if slot == "primary":
        return 0
    if slot == "fallback":
        return 1
    return int(slot.split("-", 1)[1])


def split_model_ref(ref: str) -> tuple[str, str] | None:
    """``provider/model`` (``vercel`` and ``openrouter`` need ``provider/vendor/model``); ``None`` when malformed."""
    prefix, sep, model = ref.partition("/")
    if not sep or not prefix or not model or any(not part for part in model.split("/")):
        return None
    if prefix in ("vercel", "openrouter") and "/" not in model:
        return None
    return prefix, model


__all__ = [
    "BUILTIN_PREFIXES",
    "PLAN_PREFIXES",
    "PROVIDER_KEY_ENV",
    "REASONING_EFFORTS",
    "bounded",
    "parse_duration_s",
    "parse_size",
    "slot_order",
    "split_model_ref",
]
