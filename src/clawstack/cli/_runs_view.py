"""How ``claw runs`` shows runs to a person: the ``ls`` table and the readable status block.

Both read only the status objects the supervisor answers with (never the task, which status does not carry).
Durations are whole units, rounded down: ``3s``, ``4m``, ``2h``, ``5d``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from rich.table import Table

from clawstack.common.clock import parse_timestamp

COLUMNS: Final = ("INSTALLATION", "RUN", "STATE", "FAILURE", "AGE", "RUNTIME", "TEMPLATE")
NONE: Final = "-"
_UNITS: Final = (("d", 86400), ("h", 3600), ("m", 60))


def human_duration(seconds: float) -> str:
    """``seconds`` in its largest whole unit: ``59s``, ``4m``, ``2h``, ``3d`` (negative clock skew shows ``0s``)."""
    whole = max(0, int(seconds))
    for suffix, size in _UNITS:
        if whole >= size:
            return f"{whole // size}{suffix}"
    return f"{whole}s"


def _time(status: dict[str, Any], name: str) -> datetime | None:
    value = status.get(name)
    if not isinstance(value, str):
        return None
    try:
        return parse_timestamp(value)
    except ValueError:
        return None


def age(status: dict[str, Any], now: datetime) -> str:
    """Time since the run was accepted."""
    accepted = _time(status, "accepted_at")
    return human_duration((now - accepted).total_seconds()) if accepted is not None else NONE


def runtime(status: dict[str, Any], now: datetime) -> str:
    """Time from the worker's start to the run's end (or to ``now`` while it has not ended); ``-`` if it never
    started."""
    started = _time(status, "started_at")
    if started is None:
        return NONE
    ended = _time(status, "ended_at") or now
    return human_duration((ended - started).total_seconds())


def runs_table(runs: Sequence[dict[str, Any]], now: datetime) -> Table:
    """The ``docker ps``-style table of ``claw runs ls``, one row per status, in the order given."""
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    for column in COLUMNS:
        table.add_column(column, no_wrap=True)
    for status in runs:
        table.add_row(
            str(status["installation"]),
            str(status["run_id"]),
            str(status["state"]),
            str(status.get("failure") or NONE),
            age(status, now),
            runtime(status, now),
            str(status.get("template") or NONE),
        )
    return table


def _text(value: Any) -> str:
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def status_rows(status: dict[str, Any]) -> list[tuple[str, str]]:
    """The readable ``claw runs status`` block as (name, value) rows: every field a person checks first, ``-``
    where the run has none yet."""
    models = ", ".join(
        f"{m.get('slot', '?')} {m.get('ref', '?')}" + (f" (from {m['requested']})" if m.get("requested") else "")
        for m in status.get("models") or []
    )
    given = status.get("callbacks") or {}
    kinds = [kind for kind in ("start", "end") if kind in given] + sorted(set(given) - {"start", "end"})
    callbacks = ", ".join(f"{kind} {given[kind]}" for kind in kinds)  # in the order they are sent
    result = status.get("result")
    rows = [
        ("run", f"{status['installation']}/{status['run_id']}"),
        ("state", _text(status.get("state"))),
        ("failure", _text(status.get("failure"))),
        ("cancelled", _text(status.get("cancelled"))),
        ("generation", _text(status.get("generation"))),
        ("template", _text(status.get("template"))),
        ("template_id", _text(status.get("template_id"))),
        ("models", models or NONE),
        ("exit_code", _text(status.get("exit_code"))),
        ("revoked", _text(status.get("revoked"))),
        ("revocation_proof", _text(status.get("revocation_proof"))),
        ("run_agent_id", _text(status.get("run_agent_id"))),
        ("credential", _text(status.get("credential"))),
        ("callbacks", callbacks or NONE),
        (
            "result",
            f"{result['bytes']} bytes" + (" (truncated)" if result.get("truncated") else "") if result else NONE,
        ),
        ("pending", _text(status.get("pending"))),
        ("isolation", _text(status.get("isolation"))),
    ]
    for name in ("accepted_at", "started_at", "exited_at", "ended_at", "deadline", "authority_expires_at"):
        rows.append((name, _text(status.get(name))))
    if "capture_epoch" in status:
        rows.append(
            ("capture_epoch", f"{status['capture_epoch']} (observed {status.get('capture_epoch_observed_at')})")
        )
    return rows


def status_block(status: dict[str, Any]) -> str:
    """:func:`status_rows` as aligned text lines."""
    rows = status_rows(status)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


__all__ = ["COLUMNS", "age", "human_duration", "runs_table", "runtime", "status_block", "status_rows"]
