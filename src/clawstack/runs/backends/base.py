"""What the supervisor needs from a backend: start one worker for a run, observe it, remove it, find them all.

A backend never decides a run's state; it reports what exists. Every operation is idempotent per run, because
the supervisor may repeat any step after a crash: ``spawn`` of a run that already has a worker starts nothing,
``remove`` of a run without one succeeds. Workers carry the run's labels (pod, installation, run id) so that
the supervisor can find them after a restart, and they outlive the supervisor.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypedDict

from clawstack.common.errors import ClawError
from clawstack.common.files import fsync_dir
from clawstack.runs.backends.monitor import MonitorError, open_pinned
from clawstack.worker.contract import MAX_CONFIG_BYTES

INSTALLATION: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
RUN_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_ARGUMENT_BYTES: Final = 128 * 1024 - 1  # Linux's MAX_ARG_STRLEN, less the terminating NUL

Isolation = Literal["bubblewrap", "container", "none"]


class IsolationReport(TypedDict):
    """What a run's status says about its worker's isolation: which backend ran it, by what mechanism, and what
    that enforced (stable names, documented in docs/runs.md)."""

    backend: Literal["local", "compose"]
    mechanism: Isolation
    enforced: list[str]


@dataclass(frozen=True, slots=True)
class RunLabels:
    pod: str
    installation: str
    run_id: str


METER_OUT_DIR: Final = "meter-out"
"""Where a task-home run's meter writes its measures, in the run's directory of either backend."""
METER_RECORD: Final = "meter.json"
MeterVerdict = Literal["ok", "pending", "home_full", "home_meter_unavailable"]
INVALID_MEASURE: Final = {"verdict": "home_meter_unavailable"}
"""What a meter's measure counts as when its file is no measure (a link, a FIFO, an oversized or malformed file):
the meter failed, and the run ends ``home_meter_unavailable``."""


def meter_verdict(measured: Mapping[str, Any] | None, running: bool | None) -> MeterVerdict:
    """A meter's verdict from its last measure (:mod:`clawstack.worker.meter`) and whether it runs (``None``: it
    is being started). A meter that is gone or failed is ``home_meter_unavailable``."""
    verdict = None if measured is None else measured.get("verdict")
    if verdict == "home_full":
        return "home_full"
    if verdict == "home_meter_unavailable":
        return "home_meter_unavailable"
    if running is None:
        return "pending"
    if not running:
        return "home_meter_unavailable"
    return "ok" if verdict == "ok" else "pending"


def meter_seq(measured: Mapping[str, Any] | None) -> int | None:
    """The sequence number of a meter's measure (``None`` when there is none, or it is not a whole number): a
    meter that is alive but stuck keeps writing nothing new, and only a moving ``seq`` shows it still measures."""
    seq = None if measured is None else measured.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


@dataclass(frozen=True, slots=True)
class ContentMount:
    """A template's read-only reference mount: ``source`` relative to the ``pod`` directory, resolved at ``claw up``
    and pinned there by its ``device`` and ``inode``; a spawn refuses it (``content_changed``) if it is not that
    file any more, and never follows a link below the pod directory."""

    pod: Path
    source: str
    target: str
    device: int
    inode: int

    @property
    def path(self) -> Path:
        return self.pod / self.source


def check_content(content: Sequence[ContentMount], error: type[ClawError]) -> None:
    """Refuse (``content_changed``, permanent) a content source that is not the file ``claw up`` pinned: a link
    anywhere below the pod directory, or another file or directory in its place."""
    for mount in content:
        try:
            os.close(open_pinned(str(mount.pod), mount.source, mount.device, mount.inode))
        except MonitorError as exc:
            raise error(exc.message, code=exc.code) from None


@dataclass(frozen=True, slots=True)
class TaskHome:
    """A task-home run's home: the host directory, where the worker sees it, what the meter allows, the
    read-only ``content`` mounts resolved and pinned at ``claw up``, and (compose) the address
    block of the run's own network."""

    path: Path
    mount: str
    max_bytes: int
    content: tuple[ContentMount, ...] = ()
    subnet: str | None = None  # compose: the address block of the run's own network
    helper_image_id: str | None = None  # compose: the image its forwarder and meter run (clawstack/worker)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything needed to start one run's worker. ``config`` holds the run's proxy credential: it reaches the
    worker only as a private file the runner reads and deletes, never through argv or the environment."""

    labels: RunLabels
    task: str  # the runner's one positional argument
    config: bytes  # the runner's JSON configuration (clawstack.worker.contract.WorkerConfig)
    proxy_socket: Path  # the proxy's worker socket, proxy.sock alone in its directory, which a local sandbox binds
    memory_bytes: int
    pids: int
    max_runtime_s: int
    max_output_bytes: int  # stdout beyond this is discarded and the capture marked truncated
    image_id: str | None = None  # the template's pinned image (compose)
    home: TaskHome | None = None  # a task-home run: the Hermes wrapper, the home and its meter
    writer_lock_fd: int | None = None
    """The pod lock's descriptor: the spawn holds it until the worker has started or failed, so that a killed
    supervisor's in-flight spawn keeps writer authority (``claw up`` refuses) until it is done."""


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What exists for one run, as observed now."""

    exists: bool  # a worker (or its leftovers: output, exit record) carries the run's labels
    running: bool
    exit_code: int | None  # set once the worker exited (128+N for a signal)
    timed_out: bool  # the backend killed it at max_runtime_s
    stdout: bytes  # the bounded capture
    stdout_truncated: bool
    isolation: Isolation = "container"
    home_meter: MeterVerdict | None = None
    """A task-home run's meter: ``pending`` until its first measure, then its verdict; a meter that is gone or
    failed is ``home_meter_unavailable``. ``None`` for a stateless run."""
    home_meter_seq: int | None = None
    """The ``seq`` of the meter's last measure, which counts up with every measure (``None`` before the first):
    the supervisor ends a run whose meter stops counting (:func:`meter_seq`)."""


class Backend(Protocol):
    """The supervisor's view of a backend."""

    @property
    def name(self) -> Literal["local", "compose"]: ...

    @property
    def isolation(self) -> Isolation: ...

    @property
    def isolation_report(self) -> IsolationReport: ...

    @property
    def home_isolation_report(self) -> IsolationReport:
        """What a task-home worker started now is held to."""
        ...

    @property
    def model_endpoint(self) -> Mapping[str, str]:
        """How the runner reaches the proxy: ``{"model_unix_socket": …}`` or ``{"model_base_url": …}``."""
        ...

    @property
    def watch_interval_s(self) -> float:
        """How often the supervisor looks at a running worker."""
        ...

    async def pin_mismatch(self, template: Mapping[str, Any]) -> str | None:
        """Why a run of ``template`` may not start on this backend (a ``failure_detail`` code), or ``None``."""
        ...

    async def spawn(self, spec: WorkerSpec) -> None: ...

    async def inspect(self, labels: RunLabels) -> WorkerState: ...

    async def remove(self, labels: RunLabels, *, writer_lock_fd: int | None = None) -> None:
        """Remove the run's worker; ``writer_lock_fd`` (the pod lock) is inherited by any lifecycle subprocess."""
        ...

    async def list_workers(self) -> Sequence[RunLabels]: ...

    def close(self) -> None:
        """Release what the backend holds (its Docker connection); workers keep running. Idempotent."""
        ...


def check_labels(labels: RunLabels, error: type[ClawError]) -> None:
    """``labels`` can name a run (``error`` with code ``labels_invalid`` otherwise: each backend's own root)."""
    if INSTALLATION.fullmatch(labels.installation) is None:
        raise error("installation must match [a-z0-9][a-z0-9-]{0,63}", code="labels_invalid")
    if RUN_ID.fullmatch(labels.run_id) is None:
        raise error("run_id must match [A-Za-z0-9_-]{1,128}", code="labels_invalid")


def fresh_meter_out(out_dir: Path, uid: int | None) -> None:
    """Make the meter's output directory anew (0700, handed to ``uid`` when given) for a meter about to start.

    A retried spawn finds the directory an earlier attempt handed over, owned by the meter's uid and holding
    whatever ran as that uid left there (links, FIFOs, subdirectories): none of it is trusted or kept. The
    directory is removed without following a link in it and made again; its name cannot have been swapped, as it
    lies in the run's directory, which is the supervisor's own (0700)."""
    try:
        found = os.lstat(out_dir)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(out_dir)  # fd-based on Linux: a link inside is removed, never followed
        else:
            os.unlink(out_dir)
    os.mkdir(out_dir, 0o700)
    os.chmod(out_dir, 0o700)  # exactly, whatever the umask
    if uid is not None:
        os.chown(out_dir, uid, uid)
    fsync_dir(out_dir.parent)


def check_limits(spec: WorkerSpec, error: type[ClawError]) -> None:
    """The limits and the task of ``spec`` are usable (``error`` with code ``spec_invalid`` otherwise)."""
    for name in ("memory_bytes", "pids", "max_runtime_s"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise error(f"{name} must be a positive integer", code="spec_invalid")
    if (
        isinstance(spec.max_output_bytes, bool)
        or not isinstance(spec.max_output_bytes, int)
        or spec.max_output_bytes < 0
    ):
        raise error("max_output_bytes must be an integer, not negative", code="spec_invalid")
    task = spec.task.encode("utf-8", "surrogateescape")
    if b"\0" in task or len(task) > MAX_ARGUMENT_BYTES:
        raise error(
            f"the task must be free of NUL and at most {MAX_ARGUMENT_BYTES} bytes (one argument)", code="spec_invalid"
        )
    if len(spec.config) > MAX_CONFIG_BYTES:
        raise error(f"the configuration is larger than {MAX_CONFIG_BYTES} bytes", code="spec_invalid")


__all__ = [
    "INSTALLATION",
    "INVALID_MEASURE",
    "MAX_ARGUMENT_BYTES",
    "METER_OUT_DIR",
    "METER_RECORD",
    "RUN_ID",
    "Backend",
    "ContentMount",
    "Isolation",
    "IsolationReport",
    "MeterVerdict",
    "RunLabels",
    "TaskHome",
    "WorkerSpec",
    "WorkerState",
    "check_content",
    "check_labels",
    "check_limits",
    "fresh_meter_out",
    "meter_seq",
    "meter_verdict",
]
