"""The local backend's monitor: one detached process per worker, outside the sandbox, that owns it to the end.

Why a process of its own: workers outlive the supervisor and are re-adopted after a restart, so the sandbox
cannot be the supervisor's child (bubblewrap's ``--die-with-parent`` would take it down with the supervisor,
and nobody else could collect its exit status). ``LocalBackend.spawn`` runs this file as a script
(``python -P monitor.py``: the supervisor's package stays unloaded, and this module imports nothing from
clawstack but :mod:`clawstack.sandbox.spec` and :mod:`clawstack.sandbox.cgroups`, which need only the standard
library and are loaded by their paths, to keep one monitor per worker small); it forks once more so that init
adopts it, and then:

1. reads its :class:`LaunchPlan`, the task and the runner's configuration from a memory file descriptor (none
   of them is in its argv or environment; the configuration reaches the sandbox by another descriptor);
2. contains the run (:class:`~clawstack.sandbox.cgroups.Containment`): memory and pids cgroups (v1 or v2,
   nested under its own) where the host lets it, else ``RLIMIT_AS``, and ``RLIMIT_NPROC`` when the sandbox
   has a uid of its own;
3. writes the :data:`MONITOR_RECORD` (its pid and start time from ``/proc``, so that a recycled pid is never
   mistaken for it) while it still holds the run's lock, which the spawner handed over;
4. starts the sandbox (see :func:`bwrap_argv`), as root first staging what the sandbox binds in a private
   mount namespace and then dropping to the sandbox uid, and reports readiness once the runner is exec'd;
5. captures stdout into a bounded file (the rest is read and discarded), stderr into a bounded log, kills the
   whole sandbox at the run's deadline or on SIGTERM, and writes the :data:`EXIT_RECORD` atomically (0600)
   when the worker has ended.

Killing a bubblewrap sandbox is killing its pid 1: the kernel then kills everything in its pid namespace,
forks and daemons included. Everything here is single-threaded and synchronous on purpose: ``preexec_fn`` is
only safe in a process without threads.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import importlib
import importlib.util
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal


def _sandbox_module(name: str) -> ModuleType:
    """``clawstack.sandbox.<name>`` (:mod:`~clawstack.sandbox.spec` or :mod:`~clawstack.sandbox.cgroups`, which
    import only the standard library): imported as usual inside the supervisor, loaded by its file path when this
    file runs as the monitor, so that the monitor does not load :mod:`clawstack.common` (the HTTP stack) with the
    package."""
    qualified = f"clawstack.sandbox.{name}"
    if __name__ != "__main__" or qualified in sys.modules:
        return importlib.import_module(qualified)
    location = Path(__file__).resolve().parents[2] / "sandbox" / f"{name}.py"
    found = importlib.util.spec_from_file_location(qualified, location)
    assert found is not None
    assert found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[qualified] = module  # dataclasses look their module up by name
    found.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from clawstack.sandbox import cgroups as sandbox_cgroups
    from clawstack.sandbox import spec as sandbox_spec
    from clawstack.sandbox.cgroups import Cgroups, Containment, Limits
else:
    sandbox_spec = _sandbox_module("spec")
    sandbox_cgroups = _sandbox_module("cgroups")
    Cgroups, Containment, Limits = sandbox_cgroups.Cgroups, sandbox_cgroups.Containment, sandbox_cgroups.Limits

# --- the run directory -----------------------------------------------------------------------------------------

LOCK_FILE: Final = "lock"
MONITOR_RECORD: Final = "monitor.json"
EXIT_RECORD: Final = "exit.json"
STDOUT_FILE: Final = "stdout"
TRUNCATED_MARK: Final = "stdout.truncated"
STDERR_FILE: Final = "stderr.log"
MONITOR_LOG: Final = "monitor.log"
HOST_CONFIG_FILE: Final = "config.json"
"""Where the runner's configuration waits for it without a sandbox: in the 0700 run directory, 0600."""

# --- the sandbox's layout --------------------------------------------------------------------------------------

SANDBOX_PROXY_DIR: Final = "/run/claw"
"""Where the directory of the pod's proxy worker socket is bound (read-only) inside the sandbox."""
PROXY_SOCKET_NAME: Final = "proxy.sock"
SANDBOX_PROXY_SOCKET: Final = f"{SANDBOX_PROXY_DIR}/{PROXY_SOCKET_NAME}"
"""Where the pod's proxy worker socket appears inside the sandbox: the runner's ``model_unix_socket``."""
SANDBOX_CONFIG_FILE: Final = "/tmp/claw/config.json"  # noqa: S108 - the sandbox's own private tmpfs
"""Where the runner's configuration appears inside the sandbox (0600 in a 0700 directory, owned by the runner)."""
SANDBOX_PYTHON: Final = "/opt/claw/python"
SANDBOX_SOURCE: Final = "/opt/claw/src"
SANDBOX_SITE: Final = "/opt/claw/site"
SANDBOX_HOSTNAME: Final = sandbox_spec.SANDBOX_HOSTNAME
PYTHON_FLAGS: Final = ("-S", "-B", "-P")
"""No ``site`` (only the bound paths count), no bytecode writes, no current directory on ``sys.path``."""

LOST_EXIT_CODE: Final = 128 + signal.SIGKILL
"""Reported when the monitor died without an exit record: its death SIGKILLs the sandbox (``--die-with-parent``)."""

# Covered by a tmpfs of our own, in the monitor child's private mount namespace only.
_STAGE_DIR: Final = "/tmp"  # noqa: S108
_EXEC_POLL_S: Final = 0.005
_EXEC_TIMEOUT_S: Final = 30.0
_DRAIN_S: Final = 2.0
_READ_CHUNK: Final = 1 << 16

SandboxIsolation = Literal["bubblewrap", "none"]


class MonitorError(Exception):
    """A failure before the worker ran; ``code`` is what the spawner reports."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- processes -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessId:
    """A process named so that a recycled pid never matches: its pid and its start time (clock ticks since boot)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The process ``pid`` as it is now, or ``None`` if there is none."""
        start = _proc_stat(pid)
        return None if start is None or start[0] in "ZX" else cls(pid, start[1])

    def alive(self) -> bool:
        """Whether this very process still runs (a zombie has ended)."""
        now = _proc_stat(self.pid)
        return now is not None and now[1] == self.start and now[0] not in "ZX"

    def kill(self) -> None:
        """SIGKILL this very process, if it still runs; a pidfd makes the check and the signal one step."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return
        try:
            if self.alive():
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass  # it ended in between
        finally:
            os.close(fd)

    @classmethod
    def from_json(cls, value: Any) -> ProcessId | None:
        if not isinstance(value, dict):
            return None
        return cls(int(value["pid"]), int(value["start"]))


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0].decode(), int(fields[19])


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(part) for part in handle.read().split()]
    except OSError:
        return []


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None


# --- the plan --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path bound into the sandbox at ``dest``: read-only unless ``writable`` (a task home).

    A pinned bind (a template's content) has an ``anchor`` (the pod directory): ``source`` is then relative to it
    and must still be the file ``claw up`` pinned, ``device`` and ``inode`` (see :func:`open_pinned`)."""

    source: str
    dest: str
    writable: bool = False
    anchor: str | None = None
    device: int = 0
    inode: int = 0


CONTENT_CHANGED: Final = "content_changed"
"""The spawn refusal for a content source that is not what ``claw up`` pinned (a link, another file)."""


def open_pinned(anchor: str, relative: str, device: int, inode: int) -> int:
    """An ``O_PATH`` descriptor (close-on-exec) of ``anchor/relative``, opened one component at a time without
    following any link below ``anchor``, if it is still the file of ``device`` and ``inode``. Raises
    :class:`MonitorError` (:data:`CONTENT_CHANGED`) otherwise; the message names no path."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    changed = MonitorError(CONTENT_CHANGED, "a content source is not what claw up pinned; run claw up again")
    if ".." in parts:
        raise changed
    try:
        fd = os.open(anchor, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise changed from None
    try:
        for part in parts:
            following = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = following
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise changed
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (device, inode):
            raise changed
    except OSError:
        os.close(fd)
        raise changed from None
    except MonitorError:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything the monitor needs to start one worker, except the task and the configuration.

    ``python`` is the interpreter as the worker sees it (inside the sandbox, or on the host without one);
    ``system`` lists ``("symlink", target, dest)`` and ``("ro-bind", source, dest)`` entries for the host's
    system directories; ``binds`` (the interpreter, the runner's code and the proxy socket) are staged by a root
    monitor before it drops to ``sandbox_uid``.
    """

    run_dir: str
    labels: dict[str, str]
    isolation: SandboxIsolation
    python: str
    runner_args: tuple[str, ...]
    env: dict[str, str]
    memory_bytes: int
    pids: int
    max_runtime_s: int
    max_output_bytes: int
    stderr_limit_bytes: int
    tmp_bytes: int
    bwrap: str | None = None
    system: tuple[tuple[str, str, str], ...] = ()
    binds: tuple[Bind, ...] = ()
    sandbox_uid: int | None = None
    use_cgroups: bool = True
    cgroup_name: str = ""
    task_arg: bool = True
    """Whether the task follows the runner's arguments (``-- TASK``); a task-home meter takes none."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> LaunchPlan:
        data = dict(value)
        data["runner_args"] = tuple(data["runner_args"])
        data["system"] = tuple(tuple(entry) for entry in data["system"])
        data["binds"] = tuple(Bind(**bind) for bind in data["binds"])
        return cls(**data)


def runner_command(plan: LaunchPlan, task: str) -> list[str]:
    """The runner's command line: the interpreter, its flags, the runner, ``--`` and the task, nothing else."""
    return [plan.python, *PYTHON_FLAGS, *plan.runner_args, *(("--", task) if plan.task_arg else ())]


def bwrap_argv(plan: LaunchPlan, *, sources: Sequence[str], config_fd: int, status_fd: int, task: str) -> list[str]:
    """bubblewrap's command line for ``plan``, by :func:`clawstack.sandbox.spec.bwrap_argv`; ``sources`` are where
    each of ``plan.binds`` can be found (staged or as they are).

    New user (no further ones), PID, IPC, UTS, cgroup and network namespaces: the network namespace has only a
    loopback of its own, so the proxy socket (one of the binds) is the one way out. No capabilities,
    ``no_new_privs`` (bubblewrap always sets it), a read-only root, ``/dev`` read-only, a private size-limited
    tmpfs ``/tmp`` and the configuration as a 0600 file in a 0700 directory of it, a clean environment and a new
    session.
    """
    assert plan.bwrap is not None
    mounts = [
        sandbox_spec.symlink(source, dest) if kind == "symlink" else sandbox_spec.ro_bind(source, dest)
        for kind, source, dest in plan.system
    ]
    mounts += [sandbox_spec.proc(), sandbox_spec.dev()]
    # A socket on a read-only mount still takes connections.
    mounts += [
        (sandbox_spec.bind if bind.writable else sandbox_spec.ro_bind)(source, bind.dest)
        for bind, source in zip(plan.binds, sources, strict=True)
    ]
    mounts += [
        sandbox_spec.tmpfs("/tmp", plan.tmp_bytes),  # noqa: S108 - the sandbox's own
        sandbox_spec.directory(os.path.dirname(SANDBOX_CONFIG_FILE), "0700"),
        sandbox_spec.fd_file(config_fd, SANDBOX_CONFIG_FILE, "0600"),
    ]
    spec = sandbox_spec.SandboxSpec(
        env=plan.env,
        mounts=mounts,
        chdir="/tmp",  # noqa: S108 - the sandbox's own
        hostname=SANDBOX_HOSTNAME,
        status_fd=status_fd,
    )
    return sandbox_spec.bwrap_argv(plan.bwrap, spec, runner_command(plan, task))


# --- staging (root only, in the child, before it drops to the sandbox uid) -------------------------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
_MS_PRIVATE = 1 << 18
_CLONE_NEWNS = 0x00020000
_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def staged_sources(count: int) -> list[str]:
    """Where :func:`stage_binds` puts ``count`` bind sources."""
    return [f"{_STAGE_DIR}/{index}" for index in range(count)]


def stage_binds(sources: Sequence[str], writable: Sequence[bool] = (), pins: Sequence[Bind | None] = ()) -> None:
    """Make ``sources`` reachable for the unprivileged sandbox user without changing the host: in a private
    mount namespace, open each while still root, cover :data:`_STAGE_DIR` with a small tmpfs and bind each
    source (read-only, unless ``writable`` says otherwise for it) at :func:`staged_sources`. The host's mount
    table never sees any of it. A source whose entry in ``pins`` is a pinned :class:`Bind` is opened with
    :func:`open_pinned` instead, so that the descriptor checked is the one bound."""
    writable = list(writable) or [False] * len(sources)
    pinned = list(pins) or [None] * len(sources)
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    # Opened in the new namespace (a bind's source must be in it) and before anything is covered.
    fds = [
        os.open(source, os.O_PATH | os.O_CLOEXEC)
        if pin is None or pin.anchor is None
        else open_pinned(pin.anchor, pin.source, pin.device, pin.inode)
        for source, pin in zip(sources, pinned, strict=True)
    ]
    _check(
        libc.mount(b"claw-stage", _STAGE_DIR.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k"),
        "mount stage",
    )
    for fd, target, rw in zip(fds, staged_sources(len(fds)), writable, strict=True):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        _check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, _MS_BIND | _MS_REC, None), "bind")
        flags = _MS_BIND | _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | (0 if rw else _MS_RDONLY)
        _check(libc.mount(None, target.encode(), None, flags, None), "remount")
        os.close(fd)


def drop_privileges(uid: int) -> None:
    """Become ``uid`` (and the same gid) with no supplementary groups; the kernel clears every capability."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


# --- records ---------------------------------------------------------------------------------------------------


MAX_RECORD_BYTES: Final = 64 * 1024
"""The largest record :func:`read_json` reads: a monitor's record, an exit record, a meter's measure."""


class RecordInvalid(ValueError):
    """A record that is not a regular file with one link, of at most :data:`MAX_RECORD_BYTES`, holding a JSON
    object: a link, a FIFO, a socket, a directory or a larger file in its place (a meter's output directory is
    writable by the meter, so its measure is read as if hostile)."""


def read_json(path: Path, *, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any] | None:
    """A record (written atomically by this module or a meter), or ``None`` when it is not there.

    Read the way a file someone else may have written must be: opened without following a link, without blocking
    on a FIFO, and its type, size and bytes taken from that one descriptor. Raises :class:`RecordInvalid` for
    anything but a bounded regular file holding a JSON object, ``OSError`` when it could not be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link, a socket
            raise RecordInvalid(f"{path.name} is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise RecordInvalid(f"{path.name} is not a regular file")
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise RecordInvalid(f"{path.name} is larger than {max_bytes} bytes")
    try:
        data = json.loads(b"".join(chunks))
    except ValueError:
        raise RecordInvalid(f"{path.name} is not JSON") from None
    if not isinstance(data, dict):
        raise RecordInvalid(f"{path.name} is not a JSON object")
    return data


def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    """Atomically and durably replace ``path`` (0600): what ``clawstack.common.files.write_private`` does. It is
    not imported because ``clawstack.common`` loads the HTTP stack, which would multiply every monitor's memory
    (one monitor per worker) several times over; this module imports nothing of clawstack.common."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(value, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the monitor -----------------------------------------------------------------------------------------------


class _Capture:
    """A pipe read into a file up to ``limit`` bytes; the rest is read and discarded."""

    def __init__(self, fd: int, path: Path, limit: int, mark: Path | None = None) -> None:
        self.fd, self.limit, self.mark = fd, limit, mark
        self.out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self.written = 0
        self.truncated = False
        self.open = True

    def pump(self) -> None:
        try:
            chunk = os.read(self.fd, _READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self.open = False
            return
        keep = chunk[: max(0, self.limit - self.written)]
        if keep:
            os.write(self.out, keep)
            self.written += len(keep)
        if len(keep) < len(chunk) and not self.truncated:
            self.truncated = True
            if self.mark is not None:
                os.close(os.open(self.mark, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def close(self) -> None:
        os.fsync(self.out)
        os.close(self.out)
        os.close(self.fd)


@dataclass
class _Started:
    process: subprocess.Popen[bytes]
    status_fd: int | None
    stdout: _Capture
    stderr: _Capture
    init: ProcessId | None = None
    status: bytes = b""
    exit_code: int | None = None


class Monitor:
    """One worker's monitor, in the detached process. See the module docstring for the sequence."""

    def __init__(self, plan: LaunchPlan, task: str, config: bytes) -> None:
        self.plan, self.task, self.config = plan, task, config
        self.run_dir = Path(plan.run_dir)
        self.me = ProcessId.of(os.getpid())
        self.containment: Containment | None = None
        self.record: dict[str, Any] = {}
        self.stopped: list[int] = []
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        # From the start, so that a SIGTERM during the start stops the worker instead of orphaning its records.
        signal.set_wakeup_fd(wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda number, _frame: self.stopped.append(number))
        signal.signal(signal.SIGCHLD, lambda _number, _frame: None)

    # -- start ------------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Cgroups first, then the monitor record: once the record exists, ``remove`` can find everything."""
        containment = self.containment = Containment.create(
            self.plan.cgroup_name,
            memory_bytes=self.plan.memory_bytes,
            pids=self.plan.pids,
            sandbox_uid=self.plan.sandbox_uid,
            use_cgroups=self.plan.use_cgroups and bool(self.plan.cgroup_name),
        )
        assert self.me is not None
        self.record = {
            "version": 1,
            "labels": self.plan.labels,
            "isolation": self.plan.isolation,
            "limits": containment.limits,
            "enforcement": containment.enforcement.to_json(),
            "uid": self.plan.sandbox_uid if self.plan.sandbox_uid is not None else os.geteuid(),
            "monitor": asdict(self.me),
            "cgroups": None if containment.cgroups is None else containment.cgroups.to_json(),
            "max_output_bytes": self.plan.max_output_bytes,
            "max_runtime_s": self.plan.max_runtime_s,
            "started_at": _timestamp(),
            "sandbox": None,
        }
        _write_json(self.run_dir / MONITOR_RECORD, self.record)

    def _preexec(self, stage: Sequence[str], diagnostics: int) -> None:
        writable = [bind.writable for bind in self.plan.binds]
        # Runs in the forked child, single-threaded, as root when a uid is to be dropped.
        try:
            assert self.containment is not None  # prepared first
            self.containment.join(os.getpid())
            # Where no cgroup holds a limit, the rlimit that really bounds the sandbox does; core dumps off anyway.
            sandbox_spec.ResourceLimits(**self.containment.rlimits()).apply()
            if self.plan.isolation == "none":
                _check(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            if stage:
                stage_binds(stage, writable, self.plan.binds)
            if self.plan.sandbox_uid is not None:
                drop_privileges(self.plan.sandbox_uid)
        except Exception as exc:
            with contextlib.suppress(OSError):
                os.write(diagnostics, f"{type(exc).__name__}: {exc}".encode()[:500])
            raise

    def _bind_sources(self) -> list[str]:
        """Where each bind's source is found. A pinned one (a template's content) is checked here first, so that a
        link or another file swapped in since ``claw up`` is refused (``content_changed``), not followed; a root
        monitor's staging opens it once more with the same check in the namespace it binds it from, so what is
        bound is what was checked. Without staging, bubblewrap resolves the checked path itself."""
        sources = []
        for bind in self.plan.binds:
            if bind.anchor is None:
                sources.append(bind.source)
                continue
            os.close(open_pinned(bind.anchor, bind.source, bind.device, bind.inode))
            sources.append(bind.source if self.plan.sandbox_uid is not None else os.path.join(bind.anchor, bind.source))
        return sources

    def start(self) -> _Started:
        """Start the worker; return once its runner is exec'd. Raises :class:`MonitorError` otherwise."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        diag_r, diag_w = os.pipe()
        status_r: int | None = None
        keep: list[int] = []
        stage: list[str] = []
        if self.plan.isolation == "bubblewrap":
            status_r, status_w = os.pipe()
            config_fd = os.memfd_create("claw-config", os.MFD_CLOEXEC)
            os.write(config_fd, self.config)
            os.lseek(config_fd, 0, os.SEEK_SET)
            sources = self._bind_sources()
            if self.plan.sandbox_uid is not None:
                stage, sources = sources, staged_sources(len(sources))
            argv = bwrap_argv(self.plan, sources=sources, config_fd=config_fd, status_fd=status_w, task=self.task)
            keep = [config_fd, status_w]
            env = {"PATH": "/usr/bin:/bin"}
        else:
            config_path = self.run_dir / HOST_CONFIG_FILE
            with contextlib.suppress(FileNotFoundError):
                os.unlink(config_path)  # a crashed monitor's leftover
            fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(self.config)
            argv = runner_command(self.plan, self.task)
            env = dict(self.plan.env)
        stdout = _Capture(out_r, self.run_dir / STDOUT_FILE, self.plan.max_output_bytes, self.run_dir / TRUNCATED_MARK)
        stderr = _Capture(err_r, self.run_dir / STDERR_FILE, self.plan.stderr_limit_bytes)
        try:
            process = subprocess.Popen(  # noqa: S603 - argv built from the plan, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=keep,
                env=env,
                cwd="/",
                start_new_session=self.plan.isolation == "none",
                preexec_fn=lambda: self._preexec(stage, diag_w),  # safe: the monitor has no other thread
            )
        except (OSError, subprocess.SubprocessError) as exc:
            detail = _read_available(diag_r).decode("utf-8", "replace") or f"{type(exc).__name__}: {exc}"
            raise MonitorError("sandbox_unavailable", f"the worker could not be started ({detail})") from exc
        finally:
            for fd in (out_w, err_w, diag_w, diag_r, *keep):
                os.close(fd)
        self.config = b""  # the worker has its copy; the monitor keeps none
        started = _Started(process, status_r, stdout, stderr)
        if status_r is not None:
            self._wait_for_exec(started)
        else:
            self.record["sandbox"] = {"runner": _asdict_or_none(ProcessId.of(process.pid))}
            _write_json(self.run_dir / MONITOR_RECORD, self.record)
        return started

    def _wait_for_exec(self, started: _Started) -> None:
        """Wait for bubblewrap's pid 1, then for the runner's exec; bubblewrap exiting first is a failure."""
        assert started.status_fd is not None
        os.set_blocking(started.status_fd, False)
        deadline = time.monotonic() + _EXEC_TIMEOUT_S
        runner: ProcessId | None = None
        while time.monotonic() < deadline:
            started.status += _read_available(started.status_fd)
            self._parse_status(started)
            if started.process.poll() is not None:
                break
            if started.init is not None:
                for child in _children(started.init.pid):
                    comm = _comm(child)
                    if comm is not None and comm != "bwrap":
                        runner = ProcessId.of(child)
                if runner is not None:
                    break
            time.sleep(_EXEC_POLL_S)
        if runner is None:
            self._kill(started)
            started.process.wait()
            while started.stderr.open:
                started.stderr.pump()
            detail = (self.run_dir / STDERR_FILE).read_bytes()[:500].decode("utf-8", "replace").strip()
            raise MonitorError(
                "sandbox_unavailable", f"bubblewrap could not start the worker ({detail or 'no detail'})"
            )
        self.record["sandbox"] = {
            "bwrap": _asdict_or_none(ProcessId.of(started.process.pid)),
            "init": _asdict_or_none(started.init),
            "runner": asdict(runner),
        }
        _write_json(self.run_dir / MONITOR_RECORD, self.record)

    @staticmethod
    def _parse_status(started: _Started) -> None:
        """bubblewrap's ``--json-status-fd`` stream: ``{"child-pid": N, …}`` then ``{"exit-code": N}``."""
        decoder = json.JSONDecoder()
        text = started.status.decode("utf-8", "replace")
        position = 0
        while True:
            start = len(text) - len(text[position:].lstrip())
            try:
                document, position = decoder.raw_decode(text, start)
            except ValueError:
                break
            if isinstance(document, dict):
                if "child-pid" in document and started.init is None:
                    started.init = ProcessId.of(int(document["child-pid"]))
                if "exit-code" in document:
                    started.exit_code = int(document["exit-code"])
        started.status = text[position:].encode()

    # -- run --------------------------------------------------------------------------------------------------

    def _kill(self, started: _Started) -> None:
        """Kill the whole worker: bubblewrap's pid 1 (its pid namespace goes with it), or without a sandbox the
        runner's process group; then whatever the cgroups still hold."""
        if started.init is not None:
            started.init.kill()
        if started.process.poll() is None:
            with contextlib.suppress(OSError):
                if self.plan.isolation == "none":
                    os.killpg(started.process.pid, signal.SIGKILL)
                else:
                    started.process.kill()
        if self.containment is not None:
            self.containment.kill_all()

    def run(self, started: _Started) -> None:
        """Supervise the worker to its end and write the exit record."""
        stopped = self.stopped
        selector = selectors.DefaultSelector()
        for capture in (started.stdout, started.stderr):
            os.set_blocking(capture.fd, False)
            selector.register(capture.fd, selectors.EVENT_READ, capture)
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        if started.status_fd is not None:
            selector.register(started.status_fd, selectors.EVENT_READ, "status")
        deadline = time.monotonic() + self.plan.max_runtime_s
        timed_out = killed = False
        drain_until: float | None = None
        while True:
            now = time.monotonic()
            if started.process.poll() is not None:
                if drain_until is None:
                    drain_until = now + _DRAIN_S
                if not (started.stdout.open or started.stderr.open) or now >= drain_until:
                    break
            elif stopped and not killed:
                killed = True
                self._kill(started)
            elif now >= deadline and not killed:
                timed_out = killed = True
                self._kill(started)
            limit = drain_until if drain_until is not None else deadline
            for key, _ in selector.select(timeout=max(0.0, min(limit - now, 1.0)) if not killed else 0.05):
                if key.data is None:
                    _read_available(self._wake_r)
                elif key.data == "status":
                    try:
                        chunk = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:  # bubblewrap has gone; nothing more will come
                        selector.unregister(key.fd)
                    started.status += chunk
                    self._parse_status(started)
                elif isinstance(key.data, _Capture):
                    key.data.pump()
                    if not key.data.open:
                        selector.unregister(key.fd)
        returncode = started.process.wait()
        exit_code = started.exit_code
        if exit_code is None:
            exit_code = 128 - returncode if returncode < 0 else returncode
        if self.plan.isolation == "none":
            with contextlib.suppress(OSError):
                os.killpg(started.process.pid, signal.SIGKILL)  # what the runner left behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.run_dir / HOST_CONFIG_FILE)
        started.stdout.close()
        started.stderr.close()
        _write_json(
            self.run_dir / EXIT_RECORD,
            {
                "exit_code": exit_code,
                "timed_out": timed_out,
                "stopped": bool(stopped) and not timed_out,
                "stdout_bytes": started.stdout.written,
                "stdout_truncated": started.stdout.truncated,
                "ended_at": _timestamp(),
            },
        )
        self.release_cgroups()

    def release_cgroups(self) -> None:
        """Remove the run's cgroups once nothing is left in them (bounded: ``remove`` tries again)."""
        if self.containment is not None:
            self.containment.release(_DRAIN_S)

    def abandon(self) -> None:
        """Undo :meth:`prepare` after a failed start: no worker ran, so nothing of it may seem to exist."""
        self.release_cgroups()
        for name in (MONITOR_RECORD, STDOUT_FILE, TRUNCATED_MARK, STDERR_FILE, HOST_CONFIG_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.run_dir / name)


def _asdict_or_none(value: ProcessId | None) -> dict[str, int] | None:
    return None if value is None else asdict(value)


def _read_available(fd: int) -> bytes:
    chunks: list[bytes] = []
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.set_blocking(fd, blocking)
    return b"".join(chunks)


def _report(fd: int, message: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (json.dumps(message) + "\n").encode())
    with contextlib.suppress(OSError):
        os.close(fd)


def _read_launch(fd: int) -> tuple[LaunchPlan, str, bytes]:
    with os.fdopen(fd, "rb") as handle:
        handle.seek(0)
        launch = json.loads(handle.read())
    return LaunchPlan.from_json(launch["plan"]), launch["task"], base64.b64decode(launch["config"])


def encode_launch(plan: LaunchPlan, task: str, config: bytes) -> bytes:
    """The document the spawner hands the monitor through ``--launch-fd``."""
    return json.dumps({"plan": plan.to_json(), "task": task, "config": base64.b64encode(config).decode()}).encode()


@contextlib.contextmanager
def _closing(fd: int | None) -> Iterator[int | None]:
    try:
        yield fd
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -P monitor.py --launch-fd N --ready-fd N --lock-fd N [--writer-lock-fd N]``: the fds are inherited
    from the spawner. The run's lock and the pod lock (``--writer-lock-fd``) are held until the worker has started
    or failed: a spawn in flight keeps writer authority even if the supervisor that asked for it was killed."""
    args = list(sys.argv[1:] if argv is None else argv)
    fds = {name: int(value) for name, value in zip(args[::2], args[1::2], strict=True)}
    launch_fd, ready_fd, lock_fd = fds["--launch-fd"], fds["--ready-fd"], fds["--lock-fd"]
    writer_lock_fd = fds.get("--writer-lock-fd")
    # Detach: the spawner waits only for this first process; init adopts the second, which outlives the spawner.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    with _closing(lock_fd), _closing(writer_lock_fd):
        try:
            plan, task, config = _read_launch(launch_fd)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _report(
                ready_fd,
                {"ok": False, "code": "launch_invalid", "message": f"unreadable launch ({type(exc).__name__})"},
            )
            return 1
        monitor = Monitor(plan, task, config)
        try:
            monitor.prepare()
            started = monitor.start()
        except MonitorError as exc:
            monitor.abandon()
            _report(ready_fd, {"ok": False, "code": exc.code, "message": exc.message})
            return 1
        except Exception as exc:
            monitor.abandon()
            _report(ready_fd, {"ok": False, "code": "monitor_failed", "message": f"{type(exc).__name__}: {exc}"})
            return 1
    del config
    assert monitor.containment is not None  # prepared
    _report(
        ready_fd,
        {
            "ok": True,
            "isolation": plan.isolation,
            "limits": monitor.containment.limits,
            "enforcement": monitor.containment.enforcement.to_json(),
        },
    )
    monitor.run(started)
    return 0


__all__ = [
    "CONTENT_CHANGED",
    "EXIT_RECORD",
    "HOST_CONFIG_FILE",
    "LOCK_FILE",
    "LOST_EXIT_CODE",
    "MAX_RECORD_BYTES",
    "MONITOR_LOG",
    "MONITOR_RECORD",
    "PROXY_SOCKET_NAME",
    "PYTHON_FLAGS",
    "SANDBOX_CONFIG_FILE",
    "SANDBOX_HOSTNAME",
    "SANDBOX_PROXY_DIR",
    "SANDBOX_PROXY_SOCKET",
    "SANDBOX_PYTHON",
    "SANDBOX_SITE",
    "SANDBOX_SOURCE",
    "STDERR_FILE",
    "STDOUT_FILE",
    "TRUNCATED_MARK",
    "Bind",
    "Cgroups",
    "LaunchPlan",
    "Monitor",
    "MonitorError",
    "ProcessId",
    "RecordInvalid",
    "bwrap_argv",
    "drop_privileges",
    "encode_launch",
    "main",
    "open_pinned",
    "read_json",
    "runner_command",
    "stage_binds",
    "staged_sources",
]

if __name__ == "__main__":
    sys.exit(main())
