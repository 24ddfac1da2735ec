"""The local backend's home meter for a task-home run: a second sandbox, under a monitor of its own in the run's
directory (``meter/``), running :mod:`clawstack.worker.meter` with the home read-only, no network, no proxy socket
and no credentials. It writes only its measure file, ``meter-out/meter.json``, which :func:`meter_verdict` reads
together with the meter's monitor records: a meter that is gone or failed is ``home_meter_unavailable``.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from clawstack.runs.backends.base import METER_RECORD, MeterVerdict, WorkerSpec, meter_verdict
from clawstack.runs.backends.monitor import SANDBOX_PYTHON, Bind, LaunchPlan, ProcessId
from clawstack.worker import meter

SANDBOX_METER: Final = "/opt/claw/meter.py"
SANDBOX_METER_OUT: Final = "/run/claw-meter"
METER_DIR: Final = "meter"
"""The meter's own monitor directory inside the run's directory."""
METER_MEMORY_BYTES: Final = 256 * 1024 * 1024
METER_PIDS: Final = 16
METER_INTERVAL_S: Final = 1.0


def meter_plan(
    spec: WorkerSpec,
    meter_dir: Path,
    out_dir: Path,
    *,
    python: tuple[Path, Path],
    bwrap: str | None,
    system: tuple[tuple[str, str, str], ...],
    sandbox_uid: int | None,
    use_cgroups: bool,
    stderr_limit_bytes: int,
    interval_s: float,
    max_entries: int,
) -> LaunchPlan:
    """The meter's launch plan: ``python`` is the interpreter's prefix and executable (relative to it); without
    ``bwrap`` the meter runs unsandboxed on the host paths, as the worker does then."""
    home = spec.home
    assert home is not None
    script = str(Path(meter.__file__).resolve())
    prefix, executable = python
    sandboxed = bwrap is not None
    root, out = (home.mount, SANDBOX_METER_OUT) if sandboxed else (str(home.path), str(out_dir))
    args = [SANDBOX_METER if sandboxed else script, "--root", root, "--max-bytes", str(home.max_bytes)]
    args += ["--max-entries", str(max_entries), "--interval", f"{interval_s:g}", "--out", f"{out}/{METER_RECORD}"]
    binds: tuple[Bind, ...] = ()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if sandboxed:
        binds = (
            Bind(str(prefix), SANDBOX_PYTHON),
            Bind(script, SANDBOX_METER),
            Bind(str(home.path), home.mount),  # read-only
            Bind(str(out_dir), SANDBOX_METER_OUT, writable=True),
        )
        env["LD_LIBRARY_PATH"] = f"{SANDBOX_PYTHON}/lib"
    return LaunchPlan(
        run_dir=str(meter_dir),
        labels=dataclasses.asdict(spec.labels),
        isolation="bubblewrap" if sandboxed else "none",
        python=f"{SANDBOX_PYTHON}/{executable}" if sandboxed else sys.executable,
        runner_args=tuple(args),
        env=env,
        memory_bytes=METER_MEMORY_BYTES,
        pids=METER_PIDS,
        max_runtime_s=spec.max_runtime_s + 60,
        max_output_bytes=4096,
        stderr_limit_bytes=stderr_limit_bytes,
        tmp_bytes=1024 * 1024,
        bwrap=bwrap,
        system=system,
        binds=binds,
        sandbox_uid=sandbox_uid,
        use_cgroups=use_cgroups,
        cgroup_name=f"claw-{spec.labels.installation}-{spec.labels.run_id}-meter-{secrets.token_hex(4)}",
        task_arg=False,
    )


def local_meter_verdict(
    record: Mapping[str, Any] | None, exited: Mapping[str, Any] | None, measured: Mapping[str, Any] | None
) -> MeterVerdict:
    """The verdict of a local meter from its monitor's record and exit record and its last measure."""
    if record is None:
        return meter_verdict(measured, None)  # its monitor is being started
    monitor = ProcessId.from_json(record["monitor"])
    return meter_verdict(measured, exited is None and monitor is not None and monitor.alive())


__all__ = [
    "METER_DIR",
    "METER_INTERVAL_S",
    "local_meter_verdict",
    "meter_plan",
]
