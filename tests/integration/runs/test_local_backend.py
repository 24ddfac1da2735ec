"""The local backend with real bubblewrap sandboxes, real monitors and a real scripted fake model listening on a
Unix socket where the pod's proxy worker socket would be (the runner only speaks chat completions to it).

Stand-ins for the runner are small scripts run by the sandbox's interpreter (``runner_args=("-c", SCRIPT)``);
each gets ``-- TASK`` as the real runner does. Nothing here sleeps to synchronise: every wait polls a condition
with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from clawstack.llm.fake import FakeModelServer
from clawstack.runs.backends import (
    SANDBOX_PROXY_SOCKET,
    IsolationUnavailableError,
    LocalBackend,
    RunLabels,
    SpawnError,
    WorkerSpec,
    WorkerState,
)
from clawstack.runs.backends.monitor import MONITOR_RECORD, ProcessId
from clawstack.worker import WorkerConfig

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed here (apt-get install -y bubblewrap)"
)

SECRET = "Zq7-run-secret-0042"
CREDENTIAL = f"run-1:{SECRET}"
CONTRACT = "You are a worker. CONTRACT-MARK"
POD = "pod-a"
LIMIT_S = 20.0


def labels(run_id: str = "run-1") -> RunLabels:
    return RunLabels(pod=POD, installation="acme", run_id=run_id)


def config(**changes: Any) -> bytes:
    values: dict[str, Any] = {
        "credential": CREDENTIAL,
        "model": "primary",
        "contract": CONTRACT,
        "model_unix_socket": SANDBOX_PROXY_SOCKET,
        "request_timeout_s": 60,
    }
    values.update(changes)
    return WorkerConfig(**values).to_json().encode()


def wait_until(condition: Callable[[], bool], timeout_s: float = LIMIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


async def wait_for_exit(backend: LocalBackend, run: RunLabels, timeout_s: float = LIMIT_S) -> WorkerState:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await backend.inspect(run)
        if state.exists and not state.running:
            return state
        assert time.monotonic() < deadline, "the worker did not end in time"
        await asyncio.sleep(0.02)


async def wait_for_output(backend: LocalBackend, run: RunLabels, text: bytes) -> WorkerState:
    deadline = time.monotonic() + LIMIT_S
    while True:
        state = await backend.inspect(run)
        if text in state.stdout:
            return state
        assert state.running, f"the worker ended first: {state}"
        assert time.monotonic() < deadline, "no output in time"
        await asyncio.sleep(0.02)


def record(backend: LocalBackend, run: RunLabels) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((backend.run_dir(run) / MONITOR_RECORD).read_text())
    return data


def sandbox_pids(backend: LocalBackend, run: RunLabels) -> set[int]:
    """Every host pid in the worker's pid namespace, plus the monitor and bubblewrap."""
    data = record(backend, run)
    runner = data["sandbox"]["runner"]["pid"]
    namespace = os.readlink(f"/proc/{runner}/ns/pid")
    found = {data["monitor"]["pid"], data["sandbox"]["bwrap"]["pid"]}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    found.add(int(entry))
            except OSError:
                continue
    return found


def proc(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as handle:
        return handle.read()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.fixture
async def fake(short_dir: Path) -> AsyncIterator[FakeModelServer]:
    path = short_dir / "proxy" / "proxy.sock"  # alone in its directory, as the proxy's worker socket is
    path.parent.mkdir(mode=0o711)
    async with FakeModelServer(unix_socket=path, api_key=CREDENTIAL) as server:  # only the run's credential works
        os.chmod(path, 0o666)  # as the proxy's worker socket: the directories decide who reaches it
        yield server


@pytest.fixture
async def backend(short_dir: Path) -> AsyncIterator[LocalBackend]:
    """A backend; whatever workers the test leaves in ``short_dir/state``, by any instance, are removed after."""
    instance = LocalBackend(short_dir / "state", pod=POD)
    yield instance
    for run in await instance.list_workers():
        await instance.remove(run)


def spec(fake: FakeModelServer, task: str, run: RunLabels | None = None, **changes: Any) -> WorkerSpec:
    assert fake.unix_socket is not None
    values: dict[str, Any] = {
        "labels": run or labels(),
        "task": task,
        "config": config(),
        "proxy_socket": Path(fake.unix_socket),
        "memory_bytes": 512 * 1024 * 1024,
        "pids": 64,
        "max_runtime_s": 30,
        "max_output_bytes": 64 * 1024,
    }
    values.update(changes)
    return WorkerSpec(**values)


def stand_in(backend: LocalBackend, script: str, **options: Any) -> LocalBackend:
    """Another instance on ``backend``'s state directory, running ``script`` in place of the runner."""
    return LocalBackend(backend.state_dir, pod=POD, runner_args=("-c", script), **options)


# --- the one-shot runner in the sandbox ------------------------------------------------------------------------


async def test_a_run_answers_with_the_marker_and_exit_0(backend: LocalBackend, fake: FakeModelServer) -> None:
    task = "Summarise TASK-MARK.\n@fake reply: answer"
    await backend.spawn(spec(fake, task))
    state = await wait_for_exit(backend, labels())
    assert state.exit_code == 0
    assert state.stdout == "\n🦞 answer\n".encode()
    assert not state.stdout_truncated
    assert not state.timed_out
    assert state.isolation == "bubblewrap"
    [request] = fake.requests
    assert request.body["messages"] == [{"role": "system", "content": CONTRACT}, {"role": "user", "content": task}]
    stderr = (backend.run_dir(labels()) / "stderr.log").read_text()
    assert "unix:/run/claw/proxy.sock" in stderr
    files = {path.name: path.stat().st_mode & 0o777 for path in backend.run_dir(labels()).iterdir()}
    assert files == dict.fromkeys(["lock", "monitor.json", "monitor.log", "stdout", "stderr.log", "exit.json"], 0o600)
    for leak in (SECRET, "TASK-MARK", "CONTRACT-MARK"):
        assert leak not in stderr


async def test_the_credential_stays_out_of_argv_environ_and_disk(backend: LocalBackend, fake: FakeModelServer) -> None:
    await backend.spawn(spec(fake, "TASK-MARK\n@fake delay-ms: 60000"))
    async with asyncio.timeout(LIMIT_S):
        await fake.wait_for_requests(1)  # the runner has read its configuration
    data = record(backend, labels())
    runner = data["sandbox"]["runner"]["pid"]
    assert os.listdir(f"/proc/{runner}/root/tmp/claw") == []  # the file is gone
    pids = sandbox_pids(backend, labels())
    assert len(pids) >= 4  # monitor, bubblewrap, the sandbox's pid 1, the runner
    for pid in pids:
        for name in ("cmdline", "environ"):
            assert SECRET.encode() not in proc(pid, name), (pid, name)
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not any(link.startswith("/memfd:claw") for link in links), (pid, links)
    cmdline = proc(runner, "cmdline").split(b"\0")
    assert cmdline[-3:] == [b"--", b"TASK-MARK\n@fake delay-ms: 60000", b""]  # the task, as the one positional
    for path in backend.run_dir(labels()).iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name
        assert path.stat().st_mode & 0o777 == 0o600, path.name
    assert backend.run_dir(labels()).stat().st_mode & 0o777 == 0o700
    fields = dict(line.split(":", 1) for line in proc(runner, "status").decode().splitlines())
    assert fields["Uid"].split() == ["65534"] * 4
    assert fields["CapEff"].strip() == fields["CapBnd"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"
    for namespace in ("pid", "net", "ipc", "uts", "mnt", "user"):
        assert os.readlink(f"/proc/{runner}/ns/{namespace}") != os.readlink(f"/proc/self/ns/{namespace}")


SEES = r"""
import json, os, socket, sys
probe = json.loads(sys.argv[-1])
seen = {"uid": os.getuid(), "argv": sys.argv[1:-1], "interfaces": [name for _, name in socket.if_nameindex()]}
seen["visible"] = [path for path in probe["paths"] if os.path.exists(path)]
config = os.environ["CLAW_WORKER_CONFIG_FILE"]
seen["config"] = [oct(os.stat(config).st_mode & 0o777), oct(os.stat(os.path.dirname(config)).st_mode & 0o777),
                  os.stat(config).st_uid]
seen["env"] = sorted(os.environ)
for where in ("/", "/usr", "/opt/claw/python", "/dev", "/run/claw"):
    try:
        open(os.path.join(where, "probe"), "w").close()
        seen.setdefault("writable", []).append(where)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", probe["port"]), timeout=2).close()
    seen["tcp"] = "connected"
except OSError as exc:
    seen["tcp"] = type(exc).__name__
with socket.socket(socket.AF_UNIX) as unix:
    unix.connect("/run/claw/proxy.sock")
    seen["proxy"] = "connected"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
seen["new_userns"] = libc.unshare(0x10000000)  # CLONE_NEWUSER: no way back to capabilities
print(json.dumps(seen))
"""


async def test_the_sandbox_sees_no_host_paths_and_no_network(
    fake: FakeModelServer, backend: LocalBackend, short_dir: Path
) -> None:
    backend = stand_in(backend, SEES)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        private = ["/root", "/work", "/home", str(Path.cwd()), str(short_dir), str(backend.state_dir), "/etc"]
        probe = {"port": listener.getsockname()[1], "paths": [*private, "/usr/bin", "/tmp"]}
        await backend.spawn(spec(fake, json.dumps(probe)))
        state = await wait_for_exit(backend, labels())
    assert state.exit_code == 0, (backend.run_dir(labels()) / "stderr.log").read_text()
    seen = json.loads(state.stdout)
    assert seen["uid"] == 65534
    assert seen["argv"] == ["--"]
    assert seen["visible"] == ["/usr/bin", "/tmp"]
    assert seen["interfaces"] == ["lo"]
    assert seen["tcp"] == "ConnectionRefusedError"  # the sandbox's own loopback, not the host's listener
    assert seen["proxy"] == "connected"
    assert seen["new_userns"] == -1
    assert seen["config"] == ["0o600", "0o700", 65534]
    assert "writable" not in seen
    assert seen["env"] == [
        "CLAW_WORKER_CONFIG_FILE",
        "HOME",
        "LANG",
        "LD_LIBRARY_PATH",
        "PATH",
        "PWD",  # bubblewrap's, for --chdir
        "PYTHONPATH",
        "PYTHONUTF8",
    ]
    await backend.remove(labels())


# --- limits ----------------------------------------------------------------------------------------------------

SLEEPS = "import time\nprint('ready', flush=True)\ntime.sleep(3600)\n"


async def test_the_deadline_kills_a_runner_that_sleeps_forever(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = stand_in(backend, SLEEPS)
    started = time.monotonic()
    await backend.spawn(spec(fake, "sleep", max_runtime_s=1))
    await wait_for_output(backend, labels(), b"ready")
    pids = sandbox_pids(backend, labels())
    state = await wait_for_exit(backend, labels())
    assert state.timed_out
    assert state.exit_code == 128 + signal.SIGKILL
    assert state.stdout == b"ready\n"
    assert 1.0 <= time.monotonic() - started < 10.0
    wait_until(lambda: not any(alive(pid) for pid in pids))
    await backend.remove(labels())


STUBBORN = r"""
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(3):
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(3600)
        time.sleep(3600)
print("forked", flush=True)
time.sleep(3600)
"""


async def test_remove_kills_a_worker_that_ignores_sigterm_and_forks(
    fake: FakeModelServer, backend: LocalBackend
) -> None:
    backend = stand_in(backend, STUBBORN)
    await backend.spawn(spec(fake, "stubborn"))
    await wait_for_output(backend, labels(), b"forked")
    pids = sandbox_pids(backend, labels())
    assert len(pids) >= 2 + 1 + 1 + 6  # monitor, bubblewrap, pid 1, the runner and its six descendants
    cgroups = record(backend, labels())["cgroups"]
    await backend.remove(labels())
    assert [pid for pid in pids if alive(pid)] == []
    assert not backend.run_dir(labels()).exists()
    assert (await backend.inspect(labels())).exists is False
    assert await backend.list_workers() == []
    if cgroups is not None:
        assert not any(map(os.path.exists, cgroups["paths"]))


FLOOD = r"""
import os
chunk = b"x" * (1 << 20)
for _ in range(256):
    os.write(1, chunk)
    os.write(2, chunk[:4096])
"""


async def test_a_flood_of_output_is_cut_at_its_bounds(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = stand_in(backend, FLOOD, stderr_limit_bytes=1000)
    await backend.spawn(spec(fake, "flood", max_output_bytes=100_000))
    state = await wait_for_exit(backend, labels(), timeout_s=60)
    assert state.exit_code == 0
    assert state.stdout == b"x" * 100_000
    assert state.stdout_truncated
    assert (backend.run_dir(labels()) / "stdout").stat().st_size == 100_000
    assert (backend.run_dir(labels()) / "stderr.log").stat().st_size == 1000
    await backend.remove(labels())


FILL_TMP = r"""
import errno, os
written = 0
try:
    with open("/tmp/fill", "wb") as handle:
        while True:
            handle.write(b"x" * 65536)
            handle.flush()
            written += 65536
except OSError as exc:
    print(errno.errorcode[exc.errno], written)
"""


async def test_filling_tmp_hits_the_tmpfs_limit(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = stand_in(backend, FILL_TMP, tmp_bytes=4 * 1024 * 1024)
    await backend.spawn(spec(fake, "fill"))
    state = await wait_for_exit(backend, labels())
    assert state.exit_code == 0
    code, written = state.stdout.split()
    assert code == b"ENOSPC"
    assert int(written) <= 4 * 1024 * 1024
    await backend.remove(labels())


HOG = r"""
block = bytearray(400 * 1024 * 1024)
for index in range(0, len(block), 4096):
    block[index] = 1
print("allocated", flush=True)
"""

FORKS = r"""
import os, time
children = 0
try:
    while children < 200:
        if os.fork() == 0:
            time.sleep(3600)
        children += 1
except OSError as exc:
    print(type(exc).__name__, children, flush=True)
"""


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroups", "rlimits"])
async def test_memory_is_limited(fake: FakeModelServer, backend: LocalBackend, use_cgroups: bool) -> None:
    backend = stand_in(backend, HOG, use_cgroups=use_cgroups)
    await backend.spawn(spec(fake, "hog", memory_bytes=128 * 1024 * 1024))
    state = await wait_for_exit(backend, labels())
    assert state.exit_code == (128 + signal.SIGKILL if use_cgroups else 1)  # the OOM killer, or a MemoryError
    assert b"allocated" not in state.stdout
    expected = ("cgroup-v1", "cgroup-v2") if use_cgroups else ("rlimit",)
    assert record(backend, labels())["limits"] in expected
    await backend.remove(labels())


async def test_pids_are_limited(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = stand_in(backend, FORKS)
    await backend.spawn(spec(fake, "forks", pids=16))
    state = await wait_for_exit(backend, labels())
    assert state.exit_code == 0
    kind, count = state.stdout.split()
    assert kind == b"BlockingIOError"  # EAGAIN from fork
    assert int(count) < 16
    await backend.remove(labels())


# --- idempotence and re-adoption -------------------------------------------------------------------------------


async def test_concurrent_spawns_start_one_worker(fake: FakeModelServer, backend: LocalBackend) -> None:
    first = backend
    second = LocalBackend(backend.state_dir, pod=POD)
    work = spec(fake, "@fake delay-ms: 300\n@fake reply: once")
    await asyncio.gather(*(instance.spawn(work) for instance in (first, second, first, second, first)))
    state = await wait_for_exit(first, labels())
    assert state.stdout == "\n🦞 once\n".encode()
    await first.spawn(work)  # an exited worker is a worker: nothing starts
    assert (await first.inspect(labels())).stdout == state.stdout
    assert len(fake.requests) == 1
    assert await second.list_workers() == [labels()]
    await first.remove(labels())


SPAWN_AND_DIE = r"""
import asyncio, os, signal, sys
from pathlib import Path
from clawstack.runs.backends import LocalBackend, RunLabels, WorkerSpec
state, socket_path, script, config = sys.argv[1:]
backend = LocalBackend(state, pod="pod-a", runner_args=("-c", script))
spec = WorkerSpec(RunLabels("pod-a", "acme", "run-1"), "adopt me", config.encode(), Path(socket_path),
                  512 * 1024 * 1024, 64, 30, 65536)
asyncio.run(backend.spawn(spec))
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_a_new_instance_adopts_a_worker_whose_supervisor_died(
    fake: FakeModelServer, backend: LocalBackend
) -> None:
    assert fake.unix_socket is not None
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SPAWN_AND_DIE, str(backend.state_dir), fake.unix_socket, SLEEPS, config().decode()
    )
    assert await supervisor.wait() == -signal.SIGKILL
    state = await wait_for_output(backend, labels(), b"ready")
    assert (state.exists, state.running, state.isolation) == (True, True, "bubblewrap")
    assert await backend.list_workers() == [labels()]
    pids = sandbox_pids(backend, labels())
    await backend.remove(labels())
    assert [pid for pid in pids if alive(pid)] == []
    assert (await backend.inspect(labels())).exists is False


async def test_a_monitor_killed_takes_its_sandbox_down(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = stand_in(backend, SLEEPS)
    await backend.spawn(spec(fake, "orphan"))
    await wait_for_output(backend, labels(), b"ready")
    pids = sandbox_pids(backend, labels())
    monitor = ProcessId.from_json(record(backend, labels())["monitor"])
    assert monitor is not None
    monitor.kill()
    wait_until(lambda: not any(alive(pid) for pid in pids))  # --die-with-parent
    state = await backend.inspect(labels())
    assert (state.exists, state.running, state.exit_code) == (True, False, 128 + signal.SIGKILL)
    await backend.remove(labels())


async def test_the_exit_status_passes_through(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = stand_in(backend, "import sys; print('partial'); sys.exit(3)")
    await backend.spawn(spec(fake, "three"))
    state = await wait_for_exit(backend, labels())
    assert (state.exit_code, state.stdout, state.timed_out) == (3, b"partial\n", False)
    await backend.remove(labels())


# --- without bubblewrap, and failures ----------------------------------------------------------------------------


async def test_without_bubblewrap_spawn_is_refused(fake: FakeModelServer, backend: LocalBackend) -> None:
    backend = LocalBackend(backend.state_dir, pod=POD, bwrap="/nonexistent/bwrap")
    assert backend.isolation == "none"
    with pytest.raises(IsolationUnavailableError) as caught:
        await backend.spawn(spec(fake, "@fake reply: no"))
    assert caught.value.code == "isolation_unavailable"
    assert not backend.state_dir.exists()
    assert fake.requests == []


async def test_without_bubblewrap_and_allowed_the_runner_is_a_plain_subprocess(
    fake: FakeModelServer, backend: LocalBackend
) -> None:
    backend = LocalBackend(backend.state_dir, pod=POD, bwrap="/nonexistent/bwrap", allow_no_isolation=True)
    await backend.spawn(spec(fake, "plain\n@fake reply: unconfined"))
    state = await wait_for_exit(backend, labels())
    assert (state.exit_code, state.stdout, state.isolation) == (0, "\n🦞 unconfined\n".encode(), "none")
    assert not (backend.run_dir(labels()) / "config.json").exists()
    assert record(backend, labels())["isolation"] == "none"
    await backend.remove(labels())


async def test_a_sandbox_that_cannot_start_is_a_spawn_error_and_leaves_nothing(
    fake: FakeModelServer, backend: LocalBackend, short_dir: Path
) -> None:
    with pytest.raises(SpawnError) as caught:
        await backend.spawn(spec(fake, "@fake reply: no", proxy_socket=short_dir / "missing" / "proxy.sock"))
    assert caught.value.code == "spawn_failed"
    assert SECRET not in caught.value.message
    assert (await backend.inspect(labels())).exists is False
    assert await backend.list_workers() == []
    await backend.spawn(spec(fake, "@fake reply: second try"))  # nothing was left to block a retry
    assert (await wait_for_exit(backend, labels())).stdout == "\n🦞 second try\n".encode()
    await backend.remove(labels())


async def test_remove_and_inspect_of_a_run_without_a_worker(backend: LocalBackend) -> None:
    await backend.remove(labels("never"))
    assert (await backend.inspect(labels("never"))).exists is False
    assert await backend.list_workers() == []
