"""The local backend without sandboxes: its API, its input checks, and what it reads from a run's state directory.

The records here are written by hand, the way the monitor writes them, so that every reading of them (running,
exited, lost, unreadable, another pod's) is pinned without starting a worker; the real thing is in
``tests/integration/runs/test_local_backend.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import types
from pathlib import Path
from typing import Any

import pytest

import clawstack.runs.backends
from clawstack.runs.backends import (
    SANDBOX_PROXY_SOCKET,
    IsolationUnavailableError,
    LocalBackend,
    LocalBackendError,
    RunLabels,
    WorkerSpec,
)
from clawstack.runs.backends.local import _read_answer
from clawstack.runs.backends.monitor import LOST_EXIT_CODE, ProcessId
from clawstack.worker import WorkerConfig, parse_worker_config

POD = "pod-a"
RUN = RunLabels(pod=POD, installation="acme", run_id="run-1")
SECRET = "unit-secret-77"


def config() -> bytes:
    return (
        WorkerConfig(credential=f"run-1:{SECRET}", model="primary", contract="", model_unix_socket=SANDBOX_PROXY_SOCKET)
        .to_json()
        .encode()
    )


def spec(**changes: Any) -> WorkerSpec:
    values: dict[str, Any] = {
        "labels": RUN,
        "task": "task",
        "config": config(),
        "proxy_socket": Path("/nonexistent/proxy.sock"),
        "memory_bytes": 256 * 1024 * 1024,
        "pids": 32,
        "max_runtime_s": 10,
        "max_output_bytes": 1024,
    }
    values.update(changes)
    return WorkerSpec(**values)


@pytest.fixture
def backend(short_dir: Path) -> LocalBackend:
    return LocalBackend(short_dir / "state", pod=POD, bwrap="/nonexistent/bwrap", allow_no_isolation=True)


def me() -> dict[str, int]:
    process = ProcessId.of(os.getpid())
    assert process is not None
    return {"pid": process.pid, "start": process.start}


def write_records(
    backend: LocalBackend,
    run: RunLabels = RUN,
    *,
    monitor: dict[str, int] | None = None,
    exited: dict[str, Any] | None = None,
    stdout: bytes = b"",
    truncated: bool = False,
    pod: str = POD,
) -> Path:
    run_dir = backend.run_dir(run)
    run_dir.mkdir(parents=True, mode=0o700)
    record = {
        "version": 1,
        "labels": {"pod": pod, "installation": run.installation, "run_id": run.run_id},
        "isolation": "bubblewrap",
        "limits": "rlimit",
        "uid": 65534,
        "monitor": monitor or {"pid": 999_999_999, "start": 1},
        "cgroups": None,
        "max_output_bytes": 8,
        "max_runtime_s": 10,
        "started_at": "2026-01-01T00:00:00.000Z",
        "sandbox": None,
    }
    (run_dir / "monitor.json").write_text(json.dumps(record))
    (run_dir / "stdout").write_bytes(stdout)
    if truncated:
        (run_dir / "stdout.truncated").touch()
    if exited is not None:
        (run_dir / "exit.json").write_text(json.dumps(exited))
    return run_dir


# --- the public API --------------------------------------------------------------------------------------------

BACKENDS_API = [
    "SANDBOX_CONFIG_FILE",
    "SANDBOX_PROXY_SOCKET",
    "Backend",
    "Isolation",
    "IsolationReport",
    "IsolationUnavailableError",
    "LocalBackend",
    "LocalBackendError",
    "RunLabels",
    "SpawnError",
    "WorkerSpec",
    "WorkerState",
    "backend_for",
]


def test_the_backends_api_is_pinned() -> None:
    module = clawstack.runs.backends
    assert module.__all__ == BACKENDS_API
    public = sorted(
        name
        for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
    )
    assert public == sorted(BACKENDS_API)


def test_errors_carry_stable_codes() -> None:
    assert LocalBackendError("x").code == "backend_error"
    assert IsolationUnavailableError("x").code == "isolation_unavailable"
    assert clawstack.runs.backends.SpawnError("x").code == "spawn_failed"
    assert issubclass(IsolationUnavailableError, LocalBackendError)


def test_the_sandbox_paths_are_the_contract_the_supervisor_writes() -> None:
    assert clawstack.runs.backends.SANDBOX_PROXY_SOCKET == "/run/claw/proxy.sock"
    assert clawstack.runs.backends.SANDBOX_CONFIG_FILE == "/tmp/claw/config.json"


# --- bad input -------------------------------------------------------------------------------------------------

BAD_LABELS = [
    ("installation-empty", "", "run-1"),
    ("installation-upper", "Acme", "run-1"),
    ("installation-dash-first", "-acme", "run-1"),
    ("installation-dots", "..", "run-1"),
    ("installation-slash", "a/b", "run-1"),
    ("installation-long", "a" * 65, "run-1"),
    ("run-empty", "acme", ""),
    ("run-dots", "acme", ".."),
    ("run-slash", "acme", "a/b"),
    ("run-space", "acme", "a b"),
    ("run-nul", "acme", "a\0b"),
    ("run-long", "acme", "r" * 129),
]


@pytest.mark.parametrize(("installation", "run_id"), [case[1:] for case in BAD_LABELS], ids=[c[0] for c in BAD_LABELS])
async def test_labels_that_cannot_name_a_directory_are_refused(
    backend: LocalBackend, installation: str, run_id: str
) -> None:
    bad = RunLabels(pod=POD, installation=installation, run_id=run_id)
    for call in (backend.spawn(spec(labels=bad)), backend.inspect(bad), backend.remove(bad)):
        with pytest.raises(LocalBackendError) as caught:
            await call
        assert caught.value.code == "labels_invalid"
    assert not backend.state_dir.exists()


async def test_labels_at_their_limits_are_accepted(backend: LocalBackend) -> None:
    good = RunLabels(pod=POD, installation="a" * 64, run_id="R_-9" * 32)
    assert (await backend.inspect(good)).exists is False
    assert backend.run_dir(good) == backend.state_dir / good.installation / good.run_id


async def test_another_pods_labels_are_refused(backend: LocalBackend) -> None:
    with pytest.raises(LocalBackendError) as caught:
        await backend.spawn(spec(labels=RunLabels(pod="pod-b", installation="acme", run_id="run-1")))
    assert caught.value.code == "labels_invalid"


BAD_SPECS: list[tuple[str, dict[str, Any]]] = [
    ("memory-zero", {"memory_bytes": 0}),
    ("memory-bool", {"memory_bytes": True}),
    ("pids-negative", {"pids": -1}),
    ("runtime-zero", {"max_runtime_s": 0}),
    ("runtime-float", {"max_runtime_s": 1.5}),
    ("output-negative", {"max_output_bytes": -1}),
    ("output-float", {"max_output_bytes": 1.0}),
    ("config-too-large", {"config": b"x" * (1024 * 1024 + 1)}),
    ("task-nul", {"task": "a\0b"}),
    ("task-too-long", {"task": "x" * (128 * 1024)}),
]


@pytest.mark.parametrize("changes", [case[1] for case in BAD_SPECS], ids=[case[0] for case in BAD_SPECS])
async def test_bad_specs_are_refused_and_change_nothing(backend: LocalBackend, changes: dict[str, Any]) -> None:
    with pytest.raises(LocalBackendError) as caught:
        await backend.spawn(spec(**changes))
    assert caught.value.code == "spec_invalid"
    assert SECRET not in caught.value.message
    assert not backend.state_dir.exists()


async def test_without_bubblewrap_nothing_is_created(short_dir: Path) -> None:
    backend = LocalBackend(short_dir / "state", bwrap="/nonexistent/bwrap")
    assert backend.isolation == "none"
    with pytest.raises(IsolationUnavailableError, match="bubblewrap"):
        await backend.spawn(spec())
    assert not backend.state_dir.exists()


def test_without_a_sandbox_the_runner_is_told_the_proxy_sockets_host_path(backend: LocalBackend) -> None:
    host = backend._host_config(spec(proxy_socket=Path("/run/pod/worker.sock")))
    parsed = parse_worker_config(host.decode())
    assert parsed.model_unix_socket == "/run/pod/worker.sock"
    assert parsed.credential == f"run-1:{SECRET}"
    with pytest.raises(LocalBackendError) as caught:
        backend._host_config(spec(config=b'{"version": 1}'))
    assert caught.value.code == "spec_invalid"


# --- reading a run's state directory ---------------------------------------------------------------------------


async def test_a_run_without_a_directory_does_not_exist(backend: LocalBackend) -> None:
    state = await backend.inspect(RUN)
    assert (state.exists, state.running, state.exit_code, state.stdout) == (False, False, None, b"")
    assert await backend.list_workers() == []
    await backend.remove(RUN)  # nothing to remove is fine


async def test_a_live_monitor_means_a_running_worker(backend: LocalBackend) -> None:
    write_records(backend, monitor=me(), stdout=b"partial output", truncated=True)
    state = await backend.inspect(RUN)
    assert (state.exists, state.running, state.exit_code) == (True, True, None)
    assert state.stdout == b"partial "  # capped at the record's max_output_bytes
    assert state.stdout_truncated
    assert state.isolation == "bubblewrap"


async def test_an_exit_record_means_an_exited_worker(backend: LocalBackend) -> None:
    exited = {"exit_code": 143, "timed_out": True, "stdout_truncated": False, "stdout_bytes": 2, "stopped": False}
    write_records(backend, monitor=me(), exited=exited, stdout=b"ok")
    state = await backend.inspect(RUN)
    assert (state.exists, state.running, state.exit_code, state.timed_out) == (True, False, 143, True)
    assert (state.stdout, state.stdout_truncated) == (b"ok", False)


async def test_a_dead_monitor_without_an_exit_record_is_a_killed_worker(backend: LocalBackend) -> None:
    write_records(backend, monitor={"pid": os.getpid(), "start": 1})  # our pid, another start: a recycled pid
    state = await backend.inspect(RUN)
    assert (state.exists, state.running, state.exit_code) == (True, False, LOST_EXIT_CODE)
    assert LOST_EXIT_CODE == 128 + signal.SIGKILL


async def test_an_unreadable_record_is_an_error_not_a_state(backend: LocalBackend) -> None:
    run_dir = write_records(backend)
    (run_dir / "monitor.json").write_text("{not json")
    with pytest.raises(LocalBackendError) as caught:
        await backend.inspect(RUN)
    assert (caught.value.code, caught.value.retryable) == ("state_unreadable", True)
    assert await backend.list_workers() == [RUN]  # still listed: it may run


async def test_list_workers_lists_this_pods_workers_only(backend: LocalBackend) -> None:
    second = RunLabels(pod=POD, installation="beta", run_id="r2")
    write_records(backend, monitor=me())
    write_records(backend, second, exited={"exit_code": 0, "timed_out": False, "stdout_truncated": False})
    write_records(backend, RunLabels(pod="pod-b", installation="beta", run_id="r3"), pod="pod-b")
    (backend.state_dir / "acme" / "no-record").mkdir()
    (backend.state_dir / "NOT-AN-INSTALLATION").mkdir()
    assert await backend.list_workers() == [RUN, second]
    everyone = LocalBackend(backend.state_dir)
    assert len(await everyone.list_workers()) == 3


async def test_remove_kills_the_recorded_processes_and_deletes_the_directory(backend: LocalBackend) -> None:
    child = await asyncio.create_subprocess_exec("sleep", "60")
    process = ProcessId.of(child.pid)
    assert process is not None
    run_dir = write_records(backend, monitor={"pid": process.pid, "start": process.start})
    await backend.remove(RUN)
    async with asyncio.timeout(10):
        assert await child.wait() == -signal.SIGKILL
    assert not run_dir.exists()
    assert (await backend.inspect(RUN)).exists is False


async def test_remove_never_signals_a_recycled_pid(backend: LocalBackend) -> None:
    child = await asyncio.create_subprocess_exec("sleep", "60")
    write_records(backend, monitor={"pid": child.pid, "start": 1})  # the pid, but not that process
    await backend.remove(RUN)
    assert ProcessId.of(child.pid) is not None  # still running, not even a zombie
    child.kill()
    await child.wait()


async def test_remove_reports_a_worker_that_will_not_die(short_dir: Path) -> None:
    backend = LocalBackend(short_dir / "state", pod=POD, remove_timeout_s=0.2)
    run_dir = write_records(backend)
    cgroup = short_dir / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("999999999\n")  # never empties, and names no real process
    record = json.loads((run_dir / "monitor.json").read_text())
    record["cgroups"] = {"version": "v2", "paths": [str(cgroup)]}
    (run_dir / "monitor.json").write_text(json.dumps(record))
    with pytest.raises(LocalBackendError) as caught:
        await backend.remove(RUN)
    assert (caught.value.code, caught.value.retryable) == ("remove_timeout", True)
    assert run_dir.exists()  # nothing is deleted while something may still run


# --- the monitor's readiness report ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        (b'{"ok": true}\n', {"ok": True}),
        (b'{"ok": false, "code": "x", "message": "m"}\n', {"ok": False, "code": "x", "message": "m"}),
        (b"garbage\n", {"ok": False, "code": "monitor_failed"}),
        (b"", {"ok": False, "code": "monitor_failed"}),
    ],
)
def test_the_readiness_report(written: bytes, expected: dict[str, Any]) -> None:
    read, write = os.pipe()
    try:
        os.write(write, written)
        os.close(write)
        answer = _read_answer(read, deadline=time.monotonic() + 10)
    finally:
        os.close(read)
    assert answer is not None
    assert {key: answer[key] for key in expected} == expected


def test_no_readiness_report_in_time_is_none() -> None:
    read, write = os.pipe()
    try:
        assert _read_answer(read, deadline=0.0) is None
    finally:
        os.close(read)
        os.close(write)


# --- the isolation field: what holds the limits ----------------------------------------------------------------


def test_the_isolation_field_names_what_really_holds_each_limit() -> None:
    from clawstack.runs.backends.local import enforced_limits
    from clawstack.sandbox import Enforcement

    assert enforced_limits(Enforcement("cgroup-v1", "cgroup-v1")) == ["memory_limit", "pids_limit"]
    assert enforced_limits(Enforcement("cgroup-v2", "cgroup-v2")) == ["memory_limit", "pids_limit"]
    assert enforced_limits(Enforcement("rlimit", "rlimit")) == ["memory_rlimit", "pids_rlimit"]
    assert enforced_limits(Enforcement("rlimit", None)) == ["memory_rlimit"]


def test_without_cgroups_the_report_no_longer_claims_cgroup_limits(tmp_path: Path) -> None:
    from clawstack.runs.backends import LocalBackend

    report = LocalBackend(tmp_path, use_cgroups=False).isolation_report
    assert "memory_limit" not in report["enforced"]
    assert "pids_limit" not in report["enforced"]
    assert "memory_rlimit" in report["enforced"]
    # RLIMIT_NPROC holds only under a uid of the workers' own: 65534 under a root supervisor.
    assert ("pids_rlimit" in report["enforced"]) == (os.geteuid() == 0 and report["mechanism"] == "bubblewrap")


def test_with_cgroups_here_the_report_says_so(tmp_path: Path) -> None:
    from clawstack.runs.backends import LocalBackend
    from clawstack.sandbox import Containment

    probe = Containment.create("claw-unit-probe", memory_bytes=1 << 28, pids=16, sandbox_uid=None)
    probe.release()
    if probe.cgroups is None:
        pytest.skip("no usable cgroup on this host (the fallback's report is tested above)")
    enforced = LocalBackend(tmp_path).isolation_report["enforced"]
    assert {"memory_limit", "pids_limit"} <= set(enforced)
    assert not {"memory_rlimit", "pids_rlimit"} & set(enforced)
