"""The local backend, the embedded default: each worker is a bubblewrap sandbox running the one-shot runner.

Each worker belongs to a detached monitor process (:mod:`clawstack.runs.backends.monitor`), never to the
supervisor, so that workers outlive a supervisor restart and are re-adopted: everything this backend knows is
in the run's state directory, ``<state_dir>/<installation>/<run_id>/`` (0700), which any later instance reads
the same way:

* ``lock``: taken (``flock``) by ``spawn`` and ``remove``, and handed by ``spawn`` to the monitor until the
  worker has started or failed, so that no two workers ever exist for one run, whichever process asks (the pod
  lock's descriptor, when the spawn was given it, is held by the monitor for exactly as long);
* ``monitor.json``: the monitor's pid and start time (and the sandbox's), its cgroups, the isolation used;
* ``stdout`` (bounded by ``max_output_bytes``; ``stdout.truncated`` once more was discarded), ``stderr.log``
  (bounded), ``monitor.log``, and ``exit.json`` once the worker has ended. All files 0600.

``inspect`` reads these files alone. ``remove`` kills the whole sandbox, waits until nothing of it is alive and
deletes the run's directory, output included: inspect first.

Without bubblewrap the backend refuses to spawn unless built with ``allow_no_isolation=True``; then the runner
is a plain subprocess of the monitor and ``isolation`` is ``"none"``. See ``docs/decisions/0002-local-sandbox.md``.

Errors::

    ClawError                         (clawstack.common.errors)
     └── LocalBackendError            backend_error
          │                           labels_invalid      installation or run_id outside their patterns
          │                           spec_invalid        a limit out of range, a configuration too large
          │                           state_unreadable    a record could not be read (retryable)
          │                           remove_timeout      something of the worker still ran (retryable)
          ├── IsolationUnavailableError   isolation_unavailable   no bubblewrap, no-isolation not allowed
          └── SpawnError              spawn_failed        the worker could not be started (a timeout is retryable)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import select
import shutil
import signal
import site
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import clawstack
from clawstack.common.errors import ClawError
from clawstack.common.files import ensure_private_dir, fsync_dir
from clawstack.pod.compile import installed_runner_digest
from clawstack.pod.hermes import hermes_installation
from clawstack.runs.backends import monitor as _monitor
from clawstack.runs.backends.base import (
    INSTALLATION,
    INVALID_MEASURE,
    METER_OUT_DIR,
    METER_RECORD,
    RUN_ID,
    Isolation,
    IsolationReport,
    MeterVerdict,
    RunLabels,
    WorkerSpec,
    WorkerState,
    check_content,
    check_labels,
    check_limits,
    fresh_meter_out,
    meter_seq,
)
from clawstack.runs.backends.local_meter import METER_DIR, METER_INTERVAL_S, local_meter_verdict, meter_plan
from clawstack.runs.backends.monitor import (
    CONTENT_CHANGED,
    EXIT_RECORD,
    HOST_CONFIG_FILE,
    LOCK_FILE,
    LOST_EXIT_CODE,
    MONITOR_LOG,
    MONITOR_RECORD,
    PROXY_SOCKET_NAME,
    SANDBOX_CONFIG_FILE,
    SANDBOX_PROXY_DIR,
    SANDBOX_PROXY_SOCKET,
    SANDBOX_PYTHON,
    SANDBOX_SITE,
    SANDBOX_SOURCE,
    STDOUT_FILE,
    TRUNCATED_MARK,
    Bind,
    Cgroups,
    LaunchPlan,
    ProcessId,
    RecordInvalid,
    encode_launch,
    read_json,
)
from clawstack.sandbox import system_mounts
from clawstack.sandbox.cgroups import Containment, Enforcement
from clawstack.worker.contract import CONFIG_FILE_ENV, WorkerConfigError, parse_worker_config
from clawstack.worker.home_contract import HERMES_SITE_ENV, HOME_ENV
from clawstack.worker.meter import DEFAULT_MAX_ENTRIES

RUNNER_ARGS: Final = ("-m", "clawstack.worker.oneshot")
"""What the interpreter runs: the one-shot runner. The task follows as ``-- TASK``."""
HOME_RUNNER_ARGS: Final = ("-m", "clawstack.worker.hermes")
"""A task-home run's runner: the Hermes wrapper."""
SANDBOX_HERMES_SITE: Final = "/opt/claw/hermes"

SANDBOX_UID: Final = 65534
"""The uid a root supervisor's workers run as (``nobody``); a non-root supervisor's run as its own uid."""
DEFAULT_TMP_BYTES: Final = 64 * 1024 * 1024
DEFAULT_STDERR_LIMIT_BYTES: Final = 64 * 1024
SPAWN_TIMEOUT_S: Final = 30.0
WATCH_INTERVAL_S: Final = 0.05
REMOVE_TIMEOUT_S: Final = 10.0

# Run by path, not with -m, so that the monitor does not import the supervisor's package (clawstack.runs).
_MONITOR_SCRIPT: Final = str(Path(_monitor.__file__).resolve())
_POLL_S: Final = 0.01


class LocalBackendError(ClawError):
    """Root of the local backend's errors."""

    code = "backend_error"


class IsolationUnavailableError(LocalBackendError):
    """bubblewrap is missing and the backend was not allowed to run workers without isolation."""

    code = "isolation_unavailable"


class SpawnError(LocalBackendError):
    """The worker could not be started; nothing of it exists."""

    code = "spawn_failed"


def _system_entries() -> tuple[tuple[str, str, str], ...]:
    """``/usr`` read-only, and the top-level system directories as the host has them (symlinks or binds), as
    the launch plan carries them: ``(kind, source, dest)``."""
    return tuple((mount.kind, mount.source, mount.dest) for mount in system_mounts())


@dataclasses.dataclass(frozen=True, slots=True)
class _PythonLayout:
    """This interpreter and the code the runner imports: the prefix, the site directories, clawstack."""

    prefix: Path
    executable: Path  # relative to prefix
    sites: tuple[Path, ...]
    package: Path | None  # clawstack's package directory, when no site directory holds it

    @classmethod
    def current(cls) -> _PythonLayout:
        prefix = Path(sys.base_prefix).resolve()
        try:
            executable = Path(sys.executable).resolve().relative_to(prefix)
        except ValueError as exc:
            raise LocalBackendError(f"the interpreter {sys.executable} is not inside its prefix {prefix}") from exc
        sites = tuple(dict.fromkeys(Path(path).resolve() for path in site.getsitepackages() if Path(path).is_dir()))
        package = Path(clawstack.__file__).resolve().parent
        inside = any(package.is_relative_to(directory) for directory in sites)
        return cls(prefix, executable, sites, None if inside else package)


def _empty_state(isolation: Isolation) -> WorkerState:
    return WorkerState(
        exists=False,
        running=False,
        exit_code=None,
        timed_out=False,
        stdout=b"",
        stdout_truncated=False,
        isolation=isolation,
    )


def _read_capped(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except FileNotFoundError:
        return b""


class LocalBackend:
    """Workers as bubblewrap sandboxes on this host, each owned by a detached monitor; see the module docstring.

    ``state_dir`` holds one directory per run. With ``pod``, the backend serves that pod alone: ``spawn`` refuses
    other pods' labels and ``list_workers`` lists only its workers. ``allow_no_isolation`` lets the
    backend run workers as plain subprocesses when ``bwrap`` (a command name or path) is missing. ``tmp_bytes``
    sizes each sandbox's tmpfs ``/tmp`` (its pages also count against the run's memory limit);
    ``stderr_limit_bytes`` bounds ``stderr.log``. ``use_cgroups=False`` skips cgroups for ``RLIMIT_AS`` and
    ``RLIMIT_NPROC``. ``runner_args`` is what the interpreter runs before ``-- TASK``: the one-shot runner,
    which a test may replace with a stand-in (``("-c", SCRIPT)``).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        pod: str | None = None,
        allow_no_isolation: bool = False,
        bwrap: str = "bwrap",
        tmp_bytes: int = DEFAULT_TMP_BYTES,
        stderr_limit_bytes: int = DEFAULT_STDERR_LIMIT_BYTES,
        use_cgroups: bool = True,
        runner_args: Sequence[str] = RUNNER_ARGS,
        spawn_timeout_s: float = SPAWN_TIMEOUT_S,
        remove_timeout_s: float = REMOVE_TIMEOUT_S,
        hermes_site: str | os.PathLike[str] | None = None,
        meter_interval_s: float = METER_INTERVAL_S,
        meter_max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._state_dir = Path(state_dir)
        self._pod = pod
        self._bwrap = shutil.which(bwrap)
        self._allow_no_isolation = allow_no_isolation
        self._tmp_bytes = tmp_bytes
        self._stderr_limit_bytes = stderr_limit_bytes
        self._use_cgroups = use_cgroups
        self._runner_args = tuple(runner_args)
        self._spawn_timeout_s = spawn_timeout_s
        self._remove_timeout_s = remove_timeout_s
        self._hermes_site = None if hermes_site is None else Path(hermes_site)
        self._meter_interval_s = meter_interval_s
        self._meter_max_entries = meter_max_entries
        self._enforcement: Enforcement | None = None

    @property
    def isolation(self) -> Isolation:
        """``"bubblewrap"`` when bubblewrap is there, else ``"none"`` (and ``spawn`` refuses unless allowed)."""
        return "bubblewrap" if self._bwrap is not None else "none"

    @property
    def name(self) -> Literal["local"]:
        return "local"

    @property
    def isolation_report(self) -> IsolationReport:
        """What a worker started now is held to: with bubblewrap, its own namespaces (no network but the proxy's
        socket), a read-only view of the system, a private tmpfs ``/tmp`` and uid 65534 when the supervisor runs
        as root; with or without it, the memory and pids limits as they are really held (:func:`enforced_limits`:
        the last monitor's report, else what a probe finds)."""
        limits = enforced_limits(self._limit_enforcement())
        if self._bwrap is None:
            return {"backend": "local", "mechanism": "none", "enforced": limits}
        enforced = ["namespaces", "read_only_root", "tmpfs_tmp", *limits, "proxy_socket_only"]
        if os.geteuid() == 0:
            enforced.append("uid_65534")
        return {"backend": "local", "mechanism": "bubblewrap", "enforced": enforced}

    def _limit_enforcement(self) -> Enforcement:
        """How the last monitor held its worker's limits; before any, what containment a probe gets here (a
        monitor is the supervisor's child, in its cgroup, so it gets the same)."""
        if self._enforcement is None:
            uid = SANDBOX_UID if self._bwrap is not None and os.geteuid() == 0 else None
            probe = Containment.create(
                f"claw-probe-{secrets.token_hex(4)}",
                memory_bytes=1 << 30,
                pids=256,
                sandbox_uid=uid,
                use_cgroups=self._use_cgroups,
            )
            probe.release()
            self._enforcement = probe.enforcement
        return self._enforcement

    @property
    def home_isolation_report(self) -> IsolationReport:
        """A task-home worker is held to the same, its home the one writable path besides its ``/tmp``."""
        return self.isolation_report

    @property
    def model_endpoint(self) -> Mapping[str, str]:
        return {"model_unix_socket": SANDBOX_PROXY_SOCKET}

    @property
    def watch_interval_s(self) -> float:
        return WATCH_INTERVAL_S

    async def pin_mismatch(self, template: Mapping[str, Any]) -> str | None:
        """``backend_changed`` for a template compiled for another backend; ``runner_changed`` when the built-in
        runner's code is not what the template pinned at ``claw up``."""
        if template.get("backend") != "local":
            return "backend_changed"
        runner = template.get("runner") or {}
        if "digest" in runner:
            installed = await asyncio.to_thread(installed_runner_digest, str(runner.get("type")))
            if installed != runner["digest"]:
                return "runner_changed"
        return None

    @property
    def state_dir(self) -> Path:
        return self._state_dir

    def run_dir(self, labels: RunLabels) -> Path:
        """The run's state directory (``labels_invalid`` for labels that could not name one)."""
        check_labels(labels, LocalBackendError)
        return self._state_dir / labels.installation / labels.run_id

    async def spawn(self, spec: WorkerSpec) -> None:
        """Start the run's worker and return once its runner is running; start nothing if the run already has a
        worker, live or exited. Raises :class:`IsolationUnavailableError` or :class:`SpawnError`."""
        await asyncio.to_thread(self._spawn, spec)

    async def inspect(self, labels: RunLabels) -> WorkerState:
        """What exists for the run now, from its state directory alone."""
        return await asyncio.to_thread(self._inspect, labels)

    async def remove(self, labels: RunLabels, *, writer_lock_fd: int | None = None) -> None:
        """Kill the run's whole worker, wait until nothing of it is alive, then delete its state directory
        (output included). A run without a worker is fine. It runs no subprocess, so ``writer_lock_fd`` is not
        needed."""
        await asyncio.to_thread(self._remove, labels)

    async def list_workers(self) -> Sequence[RunLabels]:
        """Every run whose state directory holds a live or exited worker."""
        return await asyncio.to_thread(self._list_workers)

    def close(self) -> None:
        """Nothing to release: every call works on the state directory alone."""

    # -- spawn ------------------------------------------------------------------------------------------------

    def _spawn(self, spec: WorkerSpec) -> None:
        if self._bwrap is None and not self._allow_no_isolation:
            raise IsolationUnavailableError(
                "bubblewrap (bwrap) was not found; install it, or accept workers without isolation explicitly"
            )
        check_limits(spec, LocalBackendError)
        if self._pod is not None and spec.labels.pod != self._pod:
            raise LocalBackendError(f"this backend serves pod {self._pod!r} only", code="labels_invalid")
        run_dir = self.run_dir(spec.labels)
        if spec.home is not None:
            check_content(spec.home.content, SpawnError)
        ensure_private_dir(self._state_dir)
        ensure_private_dir(run_dir.parent)
        lock = self._lock(run_dir, create=True)
        assert lock is not None
        try:
            if (run_dir / MONITOR_RECORD).exists() or (run_dir / EXIT_RECORD).exists():
                return
            plan, config = self._plan(spec, run_dir)
            if spec.home is not None:
                self._spawn_meter(spec, run_dir)
            self._start_monitor(run_dir, lock, plan, spec.task, config, spec.writer_lock_fd)
        finally:
            os.close(lock)

    def _lock(self, run_dir: Path, *, create: bool) -> int | None:
        """Hold the run's lock; ``None`` when the run has no directory and ``create`` is false. A lock file that
        ``remove`` deleted while we waited is not the run's lock any more, so take the new one."""
        while True:
            if create:
                ensure_private_dir(run_dir)
            path = run_dir / LOCK_FILE
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            except FileNotFoundError:
                if create:
                    continue
                return None
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                return fd
            os.close(fd)
            if not create:
                return None

    def _plan(self, spec: WorkerSpec, run_dir: Path) -> tuple[LaunchPlan, bytes]:
        layout = _PythonLayout.current()
        home = spec.home
        site = None if home is None else self._hermes_site or hermes_installation().site
        common: dict[str, Any] = {
            "run_dir": str(run_dir),
            "labels": dataclasses.asdict(spec.labels),
            "runner_args": self._runner_args if home is None else HOME_RUNNER_ARGS,
            "memory_bytes": spec.memory_bytes,
            "pids": spec.pids,
            "max_runtime_s": spec.max_runtime_s,
            "max_output_bytes": spec.max_output_bytes,
            "stderr_limit_bytes": self._stderr_limit_bytes,
            "tmp_bytes": self._tmp_bytes,
            "use_cgroups": self._use_cgroups,
            "cgroup_name": f"claw-{spec.labels.installation}-{spec.labels.run_id}-{secrets.token_hex(4)}",
        }
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONUTF8": "1"}
        if self._bwrap is None:
            paths = ([str(layout.package.parent)] if layout.package else []) + [str(path) for path in layout.sites]
            env |= {"PYTHONPATH": os.pathsep.join(paths), CONFIG_FILE_ENV: str(run_dir / HOST_CONFIG_FILE)}
            if home is not None:
                env |= {HOME_ENV: str(home.path), HERMES_SITE_ENV: str(site)}
            plan = LaunchPlan(isolation="none", python=sys.executable, env=env, **common)
            return plan, self._host_config(spec)
        binds = [Bind(str(layout.prefix), SANDBOX_PYTHON)]
        paths = []
        if layout.package is not None:
            binds.append(Bind(str(layout.package), f"{SANDBOX_SOURCE}/{layout.package.name}"))
            paths.append(SANDBOX_SOURCE)
        for index, directory in enumerate(layout.sites):
            binds.append(Bind(str(directory), f"{SANDBOX_SITE}/{index}"))
            paths.append(f"{SANDBOX_SITE}/{index}")
        if spec.proxy_socket.name != PROXY_SOCKET_NAME:
            raise LocalBackendError(
                f"the proxy's worker socket must be {PROXY_SOCKET_NAME}, alone in its directory", code="spec_invalid"
            )
        # The socket's directory, not the socket: a restarted proxy's new socket is what the worker reaches.
        binds.append(Bind(str(spec.proxy_socket.parent), SANDBOX_PROXY_DIR))
        if home is not None:
            # The home is the one persistent writable path; content and Hermes's code are read-only.
            binds.append(Bind(str(home.path), home.mount, writable=True))
            binds += [Bind(c.source, c.target, anchor=str(c.pod), device=c.device, inode=c.inode) for c in home.content]
            binds.append(Bind(str(site), SANDBOX_HERMES_SITE))
            env |= {HOME_ENV: home.mount, HERMES_SITE_ENV: SANDBOX_HERMES_SITE}
        env |= {
            "HOME": "/tmp",  # noqa: S108 - the sandbox's own tmpfs
            "PYTHONPATH": os.pathsep.join(paths),
            "LD_LIBRARY_PATH": f"{SANDBOX_PYTHON}/lib",  # an interpreter may find libpython by an absolute RUNPATH
            CONFIG_FILE_ENV: SANDBOX_CONFIG_FILE,
        }
        plan = LaunchPlan(
            isolation="bubblewrap",
            python=f"{SANDBOX_PYTHON}/{layout.executable}",
            env=env,
            bwrap=self._bwrap,
            system=_system_entries(),
            binds=tuple(binds),
            sandbox_uid=SANDBOX_UID if os.geteuid() == 0 else None,
            **common,
        )
        return plan, spec.config

    def _spawn_meter(self, spec: WorkerSpec, run_dir: Path) -> None:
        """Start the run's home meter under a monitor of its own (:mod:`.local_meter`)."""
        meter_dir, out_dir = run_dir / METER_DIR, run_dir / METER_OUT_DIR
        ensure_private_dir(meter_dir)
        lock = self._lock(meter_dir, create=True)
        assert lock is not None
        try:
            if (meter_dir / MONITOR_RECORD).exists() or (meter_dir / EXIT_RECORD).exists():
                return  # an earlier attempt of this spawn started it: its output directory is its own now
            sandboxed = self._bwrap is not None
            uid = SANDBOX_UID if sandboxed and os.geteuid() == 0 else None
            fresh_meter_out(out_dir, uid)  # the meter writes its measures there, and nothing else
            layout = _PythonLayout.current()
            plan = meter_plan(
                spec,
                meter_dir,
                out_dir,
                python=(layout.prefix, layout.executable),
                bwrap=self._bwrap,
                system=_system_entries() if sandboxed else (),
                sandbox_uid=uid,
                use_cgroups=self._use_cgroups,
                stderr_limit_bytes=self._stderr_limit_bytes,
                interval_s=self._meter_interval_s,
                max_entries=self._meter_max_entries,
            )
            self._start_monitor(meter_dir, lock, plan, "", b"{}", None)
        finally:
            os.close(lock)

    def _meter_verdict(self, run_dir: Path) -> tuple[MeterVerdict, int | None] | None:
        """What the run's meter says now and the ``seq`` of its last measure; ``None`` for a run without one (a
        stateless run)."""
        meter_dir = run_dir / METER_DIR
        if not meter_dir.is_dir():
            return None
        record, exited = self._records(meter_dir)
        try:
            measured = read_json(run_dir / METER_OUT_DIR / METER_RECORD)
        except RecordInvalid:
            measured = INVALID_MEASURE  # the meter wrote something that is no measure: it failed
        except OSError as exc:
            raise LocalBackendError(
                "the meter's measure could not be read", code="state_unreadable", retryable=True
            ) from exc
        return local_meter_verdict(record, exited, measured), meter_seq(measured)

    @staticmethod
    def _host_config(spec: WorkerSpec) -> bytes:
        """Without a sandbox the proxy socket is at its host path, so the runner's configuration must say so."""
        try:
            config = parse_worker_config(spec.config.decode("utf-8", "surrogateescape"))
        except WorkerConfigError as exc:
            raise LocalBackendError(f"the runner configuration is invalid ({exc.code})", code="spec_invalid") from exc
        if config.model_unix_socket is not None:
            config = dataclasses.replace(config, model_unix_socket=str(spec.proxy_socket))
        return config.to_json().encode()

    def _start_monitor(
        self, run_dir: Path, lock: int, plan: LaunchPlan, task: str, config: bytes, writer_lock: int | None
    ) -> None:
        launch = os.memfd_create("claw-launch", os.MFD_CLOEXEC)
        ready_r, ready_w = os.pipe()
        try:
            os.write(launch, encode_launch(plan, task, config))
            os.lseek(launch, 0, os.SEEK_SET)
            log = os.open(run_dir / MONITOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                held = (launch, ready_w, lock) + (() if writer_lock is None else (writer_lock,))
                launcher = subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
                    [sys.executable, "-P", _MONITOR_SCRIPT, *_fd_args(launch, ready_w, lock, writer_lock)],
                    pass_fds=held,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    cwd="/",
                    env=_monitor_env(),
                    start_new_session=True,
                )
            finally:
                os.close(log)
        except OSError as exc:
            os.close(ready_r)
            raise SpawnError(f"the monitor could not be started ({type(exc).__name__})") from exc
        finally:
            os.close(launch)
            os.close(ready_w)
        try:
            deadline = time.monotonic() + self._spawn_timeout_s
            launcher.wait(timeout=self._spawn_timeout_s)  # it forks the monitor and exits at once
            answer = _read_answer(ready_r, deadline)
        except subprocess.TimeoutExpired as exc:
            raise SpawnError("the monitor did not start in time", retryable=True) from exc
        finally:
            os.close(ready_r)
        if answer is None:
            raise SpawnError("the worker did not report a start in time", retryable=True)
        if answer.get("ok"):
            with contextlib.suppress(ValueError):  # an older monitor's answer has none; the probe stands
                self._enforcement = Enforcement.from_json(answer.get("enforcement")) or self._enforcement
            return
        if not answer.get("ok"):
            code = answer.get("code", "spawn_failed")
            raise SpawnError(
                f"{code}: {answer.get('message', 'see monitor.log')}",
                code=CONTENT_CHANGED if code == CONTENT_CHANGED else None,
            )

    # -- inspect ----------------------------------------------------------------------------------------------

    def _inspect(self, labels: RunLabels) -> WorkerState:
        run_dir = self.run_dir(labels)
        state = self._worker_state(run_dir)
        meter = self._meter_verdict(run_dir) if state.exists else None
        return state if meter is None else dataclasses.replace(state, home_meter=meter[0], home_meter_seq=meter[1])

    def _worker_state(self, run_dir: Path) -> WorkerState:
        record, exited = self._records(run_dir)
        if record is None:
            return _empty_state(self.isolation)
        isolation: Isolation = record["isolation"]
        limit = int(record["max_output_bytes"])
        if exited is None:
            monitor = ProcessId.from_json(record["monitor"])
            if monitor is not None and monitor.alive():
                return WorkerState(
                    exists=True,
                    running=True,
                    exit_code=None,
                    timed_out=False,
                    stdout=_read_capped(run_dir / STDOUT_FILE, limit),
                    stdout_truncated=(run_dir / TRUNCATED_MARK).exists(),
                    isolation=isolation,
                )
            _, exited = self._records(run_dir)  # it may have finished in between
        if exited is None:  # the monitor died without a record; its death killed the sandbox
            return WorkerState(
                exists=True,
                running=False,
                exit_code=LOST_EXIT_CODE,
                timed_out=False,
                stdout=_read_capped(run_dir / STDOUT_FILE, limit),
                stdout_truncated=(run_dir / TRUNCATED_MARK).exists(),
                isolation=isolation,
            )
        return WorkerState(
            exists=True,
            running=False,
            exit_code=int(exited["exit_code"]),
            timed_out=bool(exited["timed_out"]),
            stdout=_read_capped(run_dir / STDOUT_FILE, limit),
            stdout_truncated=bool(exited["stdout_truncated"]),
            isolation=isolation,
        )

    @staticmethod
    def _records(run_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        try:
            return read_json(run_dir / MONITOR_RECORD), read_json(run_dir / EXIT_RECORD)
        except (OSError, ValueError) as exc:
            raise LocalBackendError(
                f"the worker records in {run_dir} could not be read ({type(exc).__name__})",
                code="state_unreadable",
                retryable=True,
            ) from exc

    # -- remove -----------------------------------------------------------------------------------------------

    def _remove(self, labels: RunLabels) -> None:
        run_dir = self.run_dir(labels)
        lock = self._lock(run_dir, create=False)
        if lock is None:
            return
        try:
            record, _ = self._records(run_dir)
            if record is not None:
                self._kill(record)
            if (run_dir / METER_DIR).is_dir():
                meter, _ = self._records(run_dir / METER_DIR)
                if meter is not None:
                    self._kill(meter)
            shutil.rmtree(run_dir)
            fsync_dir(run_dir.parent)
        finally:
            os.close(lock)

    def _kill(self, record: dict[str, Any]) -> None:
        """Kill the monitor first (so it writes nothing more), then the sandbox, then whatever its cgroups hold;
        return once none of it is alive."""
        deadline = time.monotonic() + self._remove_timeout_s
        monitor = ProcessId.from_json(record["monitor"])
        sandbox = record.get("sandbox") or {}
        others = [ProcessId.from_json(sandbox.get(key)) for key in ("init", "bwrap", "runner")]
        processes = [process for process in (monitor, *others) if process is not None]
        cgroups = Cgroups.from_json(record.get("cgroups"))
        if monitor is not None:
            monitor.kill()
            self._wait(lambda: not monitor.alive(), deadline)
        for process in processes:
            process.kill()
        runner = ProcessId.from_json(sandbox.get("runner"))
        if record["isolation"] == "none" and runner is not None:
            with contextlib.suppress(OSError):
                os.killpg(runner.pid, signal.SIGKILL)  # what it forked stays in its process group
        if cgroups is not None:
            cgroups.kill_all()
        self._wait(
            lambda: not any(process.alive() for process in processes) and not (cgroups and cgroups.pids()),
            deadline,
        )
        if cgroups is not None:
            self._wait(cgroups.remove, deadline)

    @staticmethod
    def _wait(done: Any, deadline: float) -> None:
        while not done():
            if time.monotonic() >= deadline:
                raise LocalBackendError(
                    "the worker is still alive after SIGKILL", code="remove_timeout", retryable=True
                )
            time.sleep(_POLL_S)

    # -- list -------------------------------------------------------------------------------------------------

    def _list_workers(self) -> list[RunLabels]:
        found: list[RunLabels] = []
        if not self._state_dir.is_dir():
            return found
        for installation in sorted(self._state_dir.iterdir()):
            if not installation.is_dir() or INSTALLATION.fullmatch(installation.name) is None:
                continue
            for run in sorted(installation.iterdir()):
                if not run.is_dir() or RUN_ID.fullmatch(run.name) is None:
                    continue
                if not (run / MONITOR_RECORD).exists():
                    continue
                try:
                    record = read_json(run / MONITOR_RECORD) or {}
                    pod = str(record["labels"]["pod"])
                except (OSError, ValueError, KeyError, TypeError):
                    pod = self._pod or ""  # listed all the same: an unreadable record is no proof that nothing runs
                if self._pod is not None and pod != self._pod:
                    continue
                found.append(RunLabels(pod=pod, installation=installation.name, run_id=run.name))
        return found


def enforced_limits(enforcement: Enforcement) -> list[str]:
    """The ``isolation.enforced`` names of a worker's limits: ``memory_limit`` and ``pids_limit`` for limits its
    cgroups hold on the whole sandbox; ``memory_rlimit`` when only ``RLIMIT_AS`` bounds each process, and
    ``pids_rlimit`` when ``RLIMIT_NPROC`` bounds the processes of the sandbox's own uid (65534, shared by every
    worker under it); nothing for a limit that nothing holds."""
    names = {"cgroup-v1": "limit", "cgroup-v2": "limit", "rlimit": "rlimit"}
    found = [] if enforcement.memory is None else [f"memory_{names[enforcement.memory]}"]
    return found + ([] if enforcement.pids is None else [f"pids_{names[enforcement.pids]}"])


def _fd_args(launch: int, ready: int, lock: int, writer_lock: int | None) -> list[str]:
    args = ["--launch-fd", str(launch), "--ready-fd", str(ready), "--lock-fd", str(lock)]
    return args if writer_lock is None else [*args, "--writer-lock-fd", str(writer_lock)]


def _monitor_env() -> dict[str, str]:
    """The monitor imports only the standard library and runs programs by absolute path: it needs nothing of the
    supervisor's environment, which may hold secrets."""
    return {"PATH": os.environ.get("PATH", os.defpath)}


def _read_answer(fd: int, deadline: float) -> dict[str, Any] | None:
    """The monitor's one-line readiness report, or ``None`` if none came before ``deadline``."""
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        answer = json.loads(data.split(b"\n", 1)[0]) if data else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return {"ok": False, "code": "monitor_failed", "message": "the monitor ended without a report (monitor.log)"}
    return answer


__all__ = [
    "DEFAULT_STDERR_LIMIT_BYTES",
    "DEFAULT_TMP_BYTES",
    "REMOVE_TIMEOUT_S",
    "RUNNER_ARGS",
    "SANDBOX_UID",
    "SPAWN_TIMEOUT_S",
    "IsolationUnavailableError",
    "LocalBackend",
    "LocalBackendError",
    "SpawnError",
]
