"""Small value grammars of the pod file: durations and byte sizes (model references are :mod:`clawstack.models`)."""

from __future__ import annotations

import re
from typing import Any, Final

from clawstack.pod.errors import ValidationError

DURATION: Final = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
SIZE: Final = re.compile(r"(\d+)([kmg]?)b?", re.IGNORECASE)


def mapping(value: object, where: str) -> dict[str, Any]:
    """A pod-file mapping (``None`` is empty); anything else is refused naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping", where=where)
    return value


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


__all__ = [
    "bounded",
    "mapping",
    "parse_duration_s",
    "parse_size",
]
