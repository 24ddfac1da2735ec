"""The home meter: ``python meter.py --root DIR --max-bytes N --out FILE [--max-entries N] [--interval S] [--once]``.

A watchdog, not a quota: it never stops a write, it only reports. Every ``--interval`` seconds it counts the
logical bytes under ``--root`` (the ``st_size`` of every regular file and symlink, by ``lstat``; other
non-directories count 0) and the entries below it, and replaces ``--out`` with one JSON object whose
``verdict`` is ``ok``, ``home_full`` (more than ``--max-bytes``) or ``home_meter_unavailable`` (more than
``--max-entries`` entries, or a directory it cannot read). Links are never followed; a hard link counts each
time it appears. An entry or subdirectory that vanishes mid-walk is skipped. It writes nothing but ``--out``.

The supervisor runs it by path in its own sandbox, with the home bound read-only, so it imports only the
standard library. SIGTERM or SIGINT ends it with status 0; bad arguments with 2 and one line on stderr.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final, Literal

DEFAULT_MAX_ENTRIES: Final = 5_000_000
DEFAULT_INTERVAL_S: Final = 1.0
USAGE: Final = "usage: meter.py --root DIR --max-bytes N --out FILE [--max-entries N] [--interval S] [--once]\n"

State = Literal["ok", "unavailable"]
Reason = Literal["too_many_entries", "unreadable"]
Verdict = Literal["ok", "home_full", "home_meter_unavailable"]


@dataclass(frozen=True)
class Measure:
    """One walk of a home; when ``unavailable``, ``bytes`` and ``entries`` are what it counted before stopping."""

    bytes: int
    entries: int
    state: State
    reason: Reason | None = None

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "entries": self.entries, "state": self.state, "reason": self.reason}


def measure(root: str, *, max_entries: int) -> Measure:
    """Walk ``root`` without following links; stop as soon as there are more than ``max_entries`` entries."""
    total = entries = 0

    def unavailable(reason: Reason) -> Measure:
        return Measure(total, entries, "unavailable", reason)

    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return unavailable("unreadable")
    except OSError:
        return unavailable("unreadable")
    stack = [root]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as listing:
                for entry in listing:
                    try:
                        info = None if entry.is_dir(follow_symlinks=False) else entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # gone between listing and stat
                    entries += 1
                    if entries > max_entries:
                        return unavailable("too_many_entries")
                    if info is None:
                        stack.append(entry.path)
                    elif stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
                        total += info.st_size
        except FileNotFoundError:
            if path is root:
                return unavailable("unreadable")
            # A subdirectory the worker removed since it was listed.
        except OSError:
            return unavailable("unreadable")
    return Measure(total, entries, "ok")


def verdict(measured: Measure, max_bytes: int) -> Verdict:
    """What the supervisor does with ``measured``: nothing (``ok``) or end the run with this reason."""
    if measured.state != "ok":
        return "home_meter_unavailable"
    return "home_full" if measured.bytes > max_bytes else "ok"


class _UsageError(Exception):
    pass


@dataclass(frozen=True)
class _Options:
    root: str
    out: str
    max_bytes: int
    max_entries: int
    interval: float
    once: bool


def _count(name: str, text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise _UsageError(f"{name} must be a whole number of at least 0")
    return int(text)


def _parse(argv: Sequence[str]) -> _Options:
    values: dict[str, str] = {}
    once = False
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name == "--once" and not eq:
            once = True
            continue
        if name not in ("--root", "--out", "--max-bytes", "--max-entries", "--interval"):
            plain = name[:2] == "--" and name[2:].replace("-", "").isalpha() and name.isascii() and len(name) <= 32
            raise _UsageError(f"unknown argument {name}" if plain else "unknown argument")
        if name in values:
            raise _UsageError(f"{name} given twice")
        if not eq:
            if not args:
                raise _UsageError(f"{name} needs a value")
            value = args.pop(0)
        values[name] = value
    for name in ("--root", "--max-bytes", "--out"):
        if not values.get(name):
            raise _UsageError(f"{name} is required")
    try:
        interval = float(values.get("--interval", DEFAULT_INTERVAL_S))
    except ValueError:
        interval = math.nan
    if not (math.isfinite(interval) and interval > 0):
        raise _UsageError("--interval must be a number of seconds greater than 0")
    root, out = values["--root"], values["--out"]
    real_root, out_dir = os.path.realpath(root), os.path.realpath(os.path.dirname(os.path.abspath(out)))
    if os.path.commonpath([real_root, out_dir]) == real_root:
        raise _UsageError("--out must not be inside --root")
    max_bytes = _count("--max-bytes", values["--max-bytes"])
    max_entries = _count("--max-entries", values.get("--max-entries", str(DEFAULT_MAX_ENTRIES)))
    return _Options(root, out, max_bytes, max_entries, interval, once)


def _write_atomically(path: str, text: str) -> None:
    directory, name = os.path.split(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class _Stop(BaseException):
    """Raised by the signal handler to cut a walk or a wait short."""


class _Signals:
    def __init__(self) -> None:
        self.stopped = False
        self.interruptible = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.stopped = True
        if self.interruptible:
            self.interruptible = False
            raise _Stop

    def allow(self) -> None:
        """From here on a signal raises :class:`_Stop`; one that came while it could not is raised now."""
        self.interruptible = True
        if self.stopped:
            self.interruptible = False
            raise _Stop


def _run(options: _Options, signals: _Signals) -> int:
    """Measure and write until signalled; the handler may cut a walk or a wait short, never a write."""
    seq = 0
    while True:
        started = time.monotonic()
        signals.allow()
        measured = measure(options.root, max_entries=options.max_entries)
        signals.interruptible = False
        seq += 1
        record = {"seq": seq, "at": time.time(), **measured.to_json(), "verdict": verdict(measured, options.max_bytes)}
        try:
            _write_atomically(options.out, json.dumps(record, allow_nan=False) + "\n")
        except OSError as exc:
            sys.stderr.write(f"meter: cannot write --out ({type(exc).__name__})\n")
            return 1
        if options.once:
            return 0
        signals.allow()
        time.sleep(max(0.0, options.interval - (time.monotonic() - started)))
        signals.interruptible = False


def main(argv: Sequence[str] | None = None) -> int:
    """The meter's entry point; returns the exit status. ``argv`` excludes the program name."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    try:
        options = _parse(args)
    except _UsageError as exc:
        sys.stderr.write(f"meter: {exc}\n")
        return 2
    signals = _Signals()
    previous = {signum: signal.signal(signum, signals) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run(options, signals)
    except _Stop:
        return 0
    except Exception as exc:  # the process boundary: the kind of failure only, never a path
        sys.stderr.write(f"meter: internal error ({type(exc).__name__})\n")
        return 1
    finally:
        signals.interruptible = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_MAX_ENTRIES", "USAGE", "Measure", "main", "measure", "verdict"]

if __name__ == "__main__":
    sys.exit(main())
