"""Containment: a memory and a pids limit on a whole sandbox, every process it starts included. Standard library
only, and nothing of clawstack either: the local run backend's monitor loads this module by its file path, as it
does :mod:`clawstack.sandbox.spec`.

A :class:`Containment` holds one sandbox's limits. Where the host lets it, they are cgroups nested under the
current process's own cgroup (:func:`plan_cgroups`): cgroup v1 when the ``memory`` and ``pids`` hierarchies are
mounted, else cgroup v2 when the parent delegates both controllers. The sandbox's first process joins them before
it forks anything, so nothing it starts escapes them; :meth:`Containment.kill_all` kills everything in them and
:meth:`Containment.release` removes them.

Without a usable cgroup, rlimits stand in, and only where they really bound the sandbox (:func:`rlimit_fallback`):

* ``RLIMIT_AS`` bounds each process's address space, not the sandbox's total: reported as ``rlimit``;
* ``RLIMIT_NPROC`` counts every process of a real uid, and does not bind root at all. It bounds the sandbox only
  when the sandbox runs under a uid of its own, never under the caller's own uid (the sandbox would then spend
  the caller's process budget, or nothing if the caller is root); otherwise the pids limit is not enforced.

:class:`Enforcement` says which mechanism holds each limit (``None``: nothing does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

CgroupVersion = Literal["v1", "v2"]
Limits = Literal["cgroup-v1", "cgroup-v2", "rlimit"]
"""How a limit is held: by the sandbox's cgroups (of either version), or by an rlimit."""
LimitReached = Literal["pids", "memory"]

_RELEASE_POLL_S: Final = 0.005


@dataclass(frozen=True, slots=True)
class Enforcement:
    """Which mechanism holds the sandbox's memory limit and its pids limit; ``None`` when nothing does."""

    memory: Limits | None
    pids: Limits | None

    def to_json(self) -> dict[str, str | None]:
        return {"memory": self.memory, "pids": self.pids}

    @classmethod
    def from_json(cls, value: Any) -> Enforcement | None:
        if not isinstance(value, dict):
            return None
        found = [value.get(key) for key in ("memory", "pids")]
        if any(item not in (None, "cgroup-v1", "cgroup-v2", "rlimit") for item in found):
            raise ValueError("unknown limit mechanism")
        return cls(found[0], found[1])


# --- cgroups ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cgroups:
    """One sandbox's cgroups: one directory per hierarchy (v1: memory and pids; v2: one)."""

    version: CgroupVersion
    paths: tuple[str, ...]

    @property
    def limits(self) -> Limits:
        return "cgroup-v1" if self.version == "v1" else "cgroup-v2"

    def join(self, pid: int) -> None:
        """Move ``pid`` (``0``: the calling process) into every one of the cgroups, before it forks anything."""
        for path in self.paths:
            Path(path, "cgroup.procs").write_text(f"{pid}\n")

    def pids(self) -> set[int]:
        """Every process still in the cgroups."""
        found: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in Path(path, "cgroup.procs").read_text().split())
        return found

    def kill_all(self) -> None:
        """SIGKILL everything in the cgroups (``cgroup.kill`` where the kernel has it)."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                Path(path, "cgroup.kill").write_text("1\n")
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the cgroup directories; ``False`` while one still holds a process."""
        done = True
        for path in self.paths:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done

    def limit_reached(self) -> LimitReached | None:
        """Which limit the kernel has enforced so far: ``pids`` once a fork was refused at ``pids.max``,
        ``memory`` once the OOM killer ended a process at the memory limit; ``None`` while neither."""
        memory, pids = (self.paths[0], self.paths[1]) if self.version == "v1" else (self.paths[0], self.paths[0])
        if _counter(Path(pids, "pids.events"), "max") > 0:
            return "pids"
        events = "memory.oom_control" if self.version == "v1" else "memory.events"
        if _counter(Path(memory, events), "oom_kill") > 0:
            return "memory"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "paths": list(self.paths)}

    @classmethod
    def from_json(cls, value: Any) -> Cgroups | None:
        if not isinstance(value, dict):
            return None
        version = value["version"]
        if version not in ("v1", "v2"):
            raise ValueError("unknown cgroup version")
        return cls(version, tuple(str(path) for path in value["paths"]))


def _counter(path: Path, name: str) -> int:
    """The counter ``name`` of a flat-keyed cgroup file (``max 3``), ``0`` when it is not there."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup``: the cgroup path per v1 controller, and under ``""`` the v2 path."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def parse_cgroup_mounts(text: str) -> list[tuple[str, str, set[str]]]:
    """``/proc/<pid>/mountinfo``: ``(mount point, root, options)`` of every cgroup file system; the options name
    a v1 hierarchy's controllers, or are ``{"cgroup2"}``."""
    mounts: list[tuple[str, str, set[str]]] = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, kinds = left.split(), right.split()
        if len(parts) < 5 or len(kinds) < 3:
            continue
        if kinds[0] == "cgroup":
            mounts.append((parts[4], parts[3], set(kinds[2].split(","))))
        elif kinds[0] == "cgroup2":
            mounts.append((parts[4], parts[3], {"cgroup2"}))
    return mounts


def _under(mount: str, root: str, path: str) -> str:
    relative = path[len(root) :] if root != "/" and path.startswith(root) else path
    return os.path.normpath(f"{mount}/{relative}")


def plan_cgroups(name: str, *, proc_cgroup: str | None = None, mountinfo: str | None = None) -> Cgroups | None:
    """Where a sandbox's cgroups go, nested under this process's own: v1 when memory and pids hierarchies are
    mounted, else v2 when the parent delegates both controllers; ``None`` when neither is possible. The texts
    default to this process's ``/proc/self/cgroup`` and ``/proc/self/mountinfo``."""
    try:
        own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup)
        mounts = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo)
    except (OSError, ValueError):
        return None
    v1: dict[str, str] = {}
    for controller in ("memory", "pids"):
        for mount, root, options in mounts:
            if controller in options and controller in own:
                v1[controller] = os.path.join(_under(mount, root, own[controller]), name)
                break
    if len(v1) == 2:
        return Cgroups("v1", (v1["memory"], v1["pids"]))
    for mount, root, options in mounts:
        if "cgroup2" in options and "" in own:
            parent = _under(mount, root, own[""])
            try:
                delegated = set(Path(parent, "cgroup.subtree_control").read_text().split())
            except OSError:
                return None
            if {"memory", "pids"} <= delegated:
                return Cgroups("v2", (os.path.join(parent, name),))
    return None


def create_cgroups(cgroups: Cgroups, *, memory_bytes: int, pids: int) -> None:
    """Create the cgroups with their limits (swap included); on any failure, nothing is left behind."""
    if cgroups.version == "v1":
        files = [
            (cgroups.paths[0], "memory.limit_in_bytes", memory_bytes, True),
            (cgroups.paths[0], "memory.memsw.limit_in_bytes", memory_bytes, False),
            (cgroups.paths[1], "pids.max", pids, True),
        ]
    else:
        files = [
            (cgroups.paths[0], "memory.max", memory_bytes, True),
            (cgroups.paths[0], "memory.swap.max", 0, False),
            (cgroups.paths[0], "pids.max", pids, True),
        ]
    try:
        for path in cgroups.paths:
            os.mkdir(path, 0o755)
        for path, name, value, required in files:
            target = Path(path, name)
            if required or target.exists():
                target.write_text(f"{value}\n")
    except OSError:
        cgroups.remove()
        raise


# --- the rlimit fallback ---------------------------------------------------------------------------------------


def rlimit_fallback(*, sandbox_uid: int | None, own_uid: int | None = None) -> Enforcement:
    """What rlimits can hold when no cgroup can: ``RLIMIT_AS`` per process always, and ``RLIMIT_NPROC`` only for
    a sandbox under a uid of its own (``sandbox_uid`` neither root nor ``own_uid``, by default this process's
    real and effective uid)."""
    own = {os.getuid(), os.geteuid()} if own_uid is None else {own_uid}
    own_uid_used = sandbox_uid is None or sandbox_uid == 0 or sandbox_uid in own
    return Enforcement(memory="rlimit", pids=None if own_uid_used else "rlimit")


# --- containment -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Containment:
    """One sandbox's memory and pids limits, and what holds them (see the module docstring).

    Build it with :meth:`create`; the sandbox's first process :meth:`join`\\ s it before it forks (or the
    caller applies :meth:`rlimits` to it); :meth:`release` once the sandbox has ended.
    """

    memory_bytes: int
    pids: int
    cgroups: Cgroups | None
    enforcement: Enforcement

    @classmethod
    def create(
        cls,
        name: str,
        *,
        memory_bytes: int,
        pids: int,
        sandbox_uid: int | None,
        use_cgroups: bool = True,
        own_uid: int | None = None,
    ) -> Containment:
        """Limits for a sandbox whose processes run as ``sandbox_uid`` (``None``: as this process's uid): cgroups
        named ``name`` under this process's own where they can be created, else the rlimit fallback."""
        if memory_bytes <= 0 or pids <= 0:
            raise ValueError("memory_bytes and pids must be positive")
        if use_cgroups:
            planned = plan_cgroups(name)
            if planned is not None:
                try:
                    create_cgroups(planned, memory_bytes=memory_bytes, pids=pids)
                except OSError:
                    pass
                else:
                    mechanism = planned.limits
                    return cls(memory_bytes, pids, planned, Enforcement(memory=mechanism, pids=mechanism))
        return cls(memory_bytes, pids, None, rlimit_fallback(sandbox_uid=sandbox_uid, own_uid=own_uid))

    @property
    def limits(self) -> Limits:
        return "rlimit" if self.cgroups is None else self.cgroups.limits

    def rlimits(self) -> dict[str, int]:
        """The rlimits the sandbox needs besides its cgroups, as :class:`~clawstack.sandbox.spec.ResourceLimits`
        field values: ``address_space_bytes`` and ``processes`` where the fallback holds them, else none."""
        found: dict[str, int] = {}
        if self.enforcement.memory == "rlimit":
            found["address_space_bytes"] = self.memory_bytes
        if self.enforcement.pids == "rlimit":
            found["processes"] = self.pids
        return found

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (``0``: the calling process) into the cgroups; nothing to do without them."""
        if self.cgroups is not None:
            self.cgroups.join(pid)

    def limit_reached(self) -> LimitReached | None:
        """Which limit the kernel has enforced so far (known with cgroups only)."""
        return None if self.cgroups is None else self.cgroups.limit_reached()

    def kill_all(self) -> None:
        """SIGKILL everything in the cgroups (without them, killing the sandbox's pid 1 is the caller's part)."""
        if self.cgroups is not None:
            self.cgroups.kill_all()

    def release(self, timeout_s: float = 2.0) -> bool:
        """Kill what is left and remove the cgroups; ``False`` when something still held them at ``timeout_s``.
        Blocking: call it from a thread in an event loop."""
        if self.cgroups is None:
            return True
        deadline = time.monotonic() + timeout_s
        while not self.cgroups.remove():
            if time.monotonic() >= deadline:
                return False
            self.cgroups.kill_all()
            time.sleep(_RELEASE_POLL_S)
        return True


__all__ = [
    "CgroupVersion",
    "Cgroups",
    "Containment",
    "Enforcement",
    "LimitReached",
    "Limits",
    "create_cgroups",
    "parse_cgroup_mounts",
    "parse_proc_cgroup",
    "plan_cgroups",
    "rlimit_fallback",
]
