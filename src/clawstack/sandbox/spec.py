"""What a sandbox is, and bubblewrap's command line for it. Standard library only.

This module imports nothing from clawstack, not even :mod:`clawstack.common`: the local run backend's monitor
(one small process per worker) loads it by its file path, so that the monitor stays free of the HTTP stack.

A :class:`SandboxSpec` is an environment, an ordered list of :class:`Mount` entries, a working directory and a
hostname. :func:`bwrap_argv` renders it with what every sandbox here gets, whatever the spec says: new user
(with no further ones), PID, IPC, UTS, cgroup and network namespaces (the network namespace has only its own
loopback), no capabilities, ``no_new_privs`` (bubblewrap always sets it), death with the parent, a new session
(no ``TIOCSTI`` into the caller's terminal), a cleared environment, and the root remounted read-only after the
mounts. A :class:`ResourceLimits` is the ``setrlimit`` set a sandboxed command gets.

Malformed specs raise :class:`ValueError`; :mod:`clawstack.sandbox` turns that into its ``spec_invalid`` error.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

MountKind = Literal["ro-bind", "bind", "bind-fd", "symlink", "proc", "dev", "tmpfs", "dir", "file"]

SANDBOX_HOSTNAME: Final = "claw"
SYSTEM_DIRS: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""The top-level host directories a sandbox sees as the host has them (a symlink stays a symlink); ``/usr`` too."""

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PERMS: Final = re.compile(r"0[0-7]{3}")


@dataclass(frozen=True, slots=True)
class Mount:
    """One entry of the sandbox's file system; build them with the functions below.

    ``source`` is the host path of a bind, the target of a symlink, or the descriptor number a ``file`` is read
    from or a ``bind-fd`` binds (a directory opened by the caller, so no path to it need be reachable); ``size`` bounds a ``tmpfs`` in bytes; ``perms`` is the octal mode of a ``dir`` or ``file``.
    """

    kind: MountKind
    dest: str
    source: str = ""
    size: int | None = None
    perms: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in get_args(MountKind):
            raise ValueError(f"unknown mount kind {self.kind!r}")
        if not self.dest.startswith("/") or "\0" in self.dest or "\0" in self.source:
            raise ValueError(f"a sandbox mount needs an absolute destination without NUL, not {self.dest!r}")
        if self.kind in ("ro-bind", "bind", "bind-fd", "symlink", "file") and not self.source:
            raise ValueError(f"a {self.kind} mount needs a source")
        if self.size is not None and (isinstance(self.size, bool) or self.size <= 0):
            raise ValueError("a tmpfs size is a positive number of bytes")
        if self.kind in ("bind-fd", "file") and not self.source.isdigit():
            raise ValueError(f"a {self.kind} mount's source is a descriptor number, not {self.source!r}")
        if self.perms is not None and _PERMS.fullmatch(self.perms) is None:
            raise ValueError(f"perms must be an octal mode such as 0700, not {self.perms!r}")

    def argv(self) -> list[str]:
        """This entry's bubblewrap options."""
        perms = ["--perms", self.perms] if self.perms is not None else []
        match self.kind:
            case "ro-bind" | "bind" | "symlink":
                return [f"--{self.kind}", self.source, self.dest]
            case "bind-fd":
                return ["--bind-fd", self.source, self.dest]
            case "proc":
                return ["--proc", self.dest]
            case "dev":
                return ["--dev", self.dest, "--remount-ro", self.dest]
            case "tmpfs":
                return ([] if self.size is None else ["--size", str(self.size)]) + ["--tmpfs", self.dest]
            case "dir":
                return [*perms, "--dir", self.dest]
            case "file":
                return [*perms, "--file", self.source, self.dest]
        raise ValueError(f"unknown mount kind {self.kind!r}")


def ro_bind(source: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None) -> Mount:
    """The host path ``source`` at ``dest`` (default: the same path), read-only."""
    return Mount("ro-bind", os.fspath(source if dest is None else dest), os.fspath(source))


def bind(source: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None) -> Mount:
    """The host path ``source`` at ``dest`` (default: the same path), writable."""
    return Mount("bind", os.fspath(source if dest is None else dest), os.fspath(source))


def bind_fd(fd: int, dest: str) -> Mount:
    """The directory open as ``fd`` at ``dest``, writable: the sandbox reaches it even where a path to it is
    closed to the sandbox's uid."""
    return Mount("bind-fd", dest, str(fd))


def symlink(target: str, dest: str) -> Mount:
    """A symlink ``dest -> target``."""
    return Mount("symlink", dest, target)


def proc(dest: str = "/proc") -> Mount:
    """A procfs of the sandbox's own PID namespace."""
    return Mount("proc", dest)


def dev(dest: str = "/dev") -> Mount:
    """A minimal ``/dev`` (null, zero, full, random, urandom, tty, shm, pts), then remounted read-only."""
    return Mount("dev", dest)


def tmpfs(dest: str, size: int | None = None) -> Mount:
    """A private tmpfs at ``dest``, at most ``size`` bytes."""
    return Mount("tmpfs", dest, size=size)


def directory(dest: str, perms: str = "0755") -> Mount:
    """An empty directory at ``dest`` (inside a tmpfs) with mode ``perms``."""
    return Mount("dir", dest, perms=perms)


def fd_file(fd: int, dest: str, perms: str = "0600") -> Mount:
    """A file at ``dest`` (inside a tmpfs) with mode ``perms``, filled from the descriptor ``fd``."""
    return Mount("file", dest, str(fd), perms=perms)


def system_mounts(extra: Sequence[str] = ()) -> tuple[Mount, ...]:
    """``/usr`` read-only, the top-level :data:`SYSTEM_DIRS` as the host has them (symlinks or read-only
    binds), and each of the host paths ``extra`` that exists, read-only."""
    mounts = [ro_bind("/usr")]
    for name in SYSTEM_DIRS:
        path = Path("/", name)
        if path.is_symlink():
            mounts.append(symlink(os.readlink(path), str(path)))
        elif path.is_dir():
            mounts.append(ro_bind(str(path)))
    mounts.extend(ro_bind(path) for path in extra if os.path.exists(path))
    return tuple(mounts)


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """A sandbox: its environment (the only variables the command gets), its mounts in order (later ones may
    sit inside earlier ones, such as a bind inside a tmpfs), the working directory and the hostname.
    ``status_fd`` is a descriptor bubblewrap reports the sandbox's pid and exit code to, as JSON."""

    env: Mapping[str, str]
    mounts: Sequence[Mount]
    chdir: str = "/"
    hostname: str = SANDBOX_HOSTNAME
    status_fd: int | None = None

    def __post_init__(self) -> None:
        for key, value in self.env.items():
            if _ENV_NAME.fullmatch(key) is None or "\0" in value:
                raise ValueError(f"environment variable names are [A-Za-z_][A-Za-z0-9_]*, values free of NUL: {key!r}")
        if not self.chdir.startswith("/") or "\0" in self.chdir:
            raise ValueError("the working directory must be an absolute path")


def bwrap_argv(bwrap: str, spec: SandboxSpec, command: Sequence[str]) -> list[str]:
    """bubblewrap's command line (``bwrap`` is its path) running ``command`` in ``spec``; see the module
    docstring for what every sandbox gets."""
    if not command or any("\0" in part for part in command):
        raise ValueError("the command must be a non-empty list of arguments without NUL")
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    argv += ["--cap-drop", "ALL", "--hostname", spec.hostname, "--clearenv"]
    for key, value in sorted(spec.env.items()):
        argv += ["--setenv", key, value]
    for mount in spec.mounts:
        argv += mount.argv()
    argv += ["--remount-ro", "/", "--chdir", spec.chdir]
    if spec.status_fd is not None:
        argv += ["--json-status-fd", str(spec.status_fd)]
    return [*argv, "--", *command]


_RLIMITS: Final = (
    ("address_space_bytes", resource.RLIMIT_AS, "as"),
    ("processes", resource.RLIMIT_NPROC, "nproc"),
    ("file_bytes", resource.RLIMIT_FSIZE, "fsize"),
    ("open_files", resource.RLIMIT_NOFILE, "nofile"),
    ("core_bytes", resource.RLIMIT_CORE, "core"),
)


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """``setrlimit`` limits (soft and hard) for a sandboxed command; ``None`` leaves one as it is. Each is
    lowered to the caller's own hard limit, which an unprivileged process cannot raise.

    ``processes`` (``RLIMIT_NPROC``) counts every process of the user, inside the sandbox or not, and does not
    bind root. Core dumps are off unless ``core_bytes`` says otherwise.
    """

    address_space_bytes: int | None = None
    processes: int | None = None
    file_bytes: int | None = None
    open_files: int | None = None
    core_bytes: int | None = 0

    def __post_init__(self) -> None:
        for name, _, _ in _RLIMITS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None")

    def values(self) -> list[tuple[int, int, str]]:
        """``(resource, value, prlimit option)`` for each limit set, each lowered to this process's hard limit."""
        found: list[tuple[int, int, str]] = []
        for name, which, option in _RLIMITS:
            value = getattr(self, name)
            if value is None:
                continue
            _, hard = resource.getrlimit(which)
            found.append((which, value if hard == resource.RLIM_INFINITY else min(value, hard), option))
        return found

    def apply(self) -> None:
        """Set these limits on this process (a child between fork and exec: they are inherited)."""
        for which, value, _ in self.values():
            resource.setrlimit(which, (value, value))

    def prlimit_argv(self, prlimit: str) -> list[str]:
        """``prlimit``'s command line setting these limits, to be followed by the command."""
        return [prlimit, *(f"--{option}={value}" for _, value, option in self.values()), "--"]


__all__ = [
    "SANDBOX_HOSTNAME",
    "SYSTEM_DIRS",
    "Mount",
    "MountKind",
    "ResourceLimits",
    "SandboxSpec",
    "bind",
    "bind_fd",
    "bwrap_argv",
    "dev",
    "directory",
    "fd_file",
    "proc",
    "ro_bind",
    "symlink",
    "system_mounts",
    "tmpfs",
]
