"""Lifecycle subprocesses inherit the pod lock: a SIGKILLed supervisor's in-flight spawn keeps writer authority
until it is done, so ``claw up`` refuses meanwhile and succeeds in taking the lock once the worker has started."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from clawstack.pod.artifacts import PodPaths
from clawstack.pod.errors import LockError
from clawstack.pod.lock import PodLock

from .conftest import BACKENDS, RunsStack, eventually

# A supervisor whose sandbox starts only when the test opens a gate: the spawn stays in flight as long as needed.
SERVE = """
import asyncio, sys
from pathlib import Path
from clawstack.pod.artifacts import PodPaths, read_pod_manifest
from clawstack.runs.backends.local import LocalBackend
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor

async def main() -> None:
    pod, sock, bwrap = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    paths = PodPaths(pod.resolve())
    backend = LocalBackend(paths.runs / "workers", pod=read_pod_manifest(paths)["pod"], bwrap=bwrap)
    server = RunsServer(Supervisor(pod, backend), sock)
    await server.start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def claw_up(pod: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clawstack", "up", "-d", "--pod", str(pod)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **environ},
    )


def lock_is_free(path: Path) -> bool:
    lock = PodLock(path, holder="test")
    try:
        lock.acquire()
    except LockError:
        return False
    lock.release()
    return True


async def kill_while_in_flight(
    stack: RunsStack, serve: str, wrapper: Path, gate: Path, in_flight: Callable[[], bool], what: str
) -> None:
    """Serve the pod with ``serve`` (whose lifecycle subprocess, ``wrapper``, waits for ``gate``), launch a run,
    SIGKILL the supervisor once ``in_flight`` holds, and check that the orphaned subprocess keeps the pod lock
    (``claw up`` is refused) until the gate opens; then a new supervisor adopts the worker and the run ends as
    usual."""
    paths = PodPaths(stack.pod.resolve())
    serving = subprocess.Popen(  # noqa: ASYNC220 (started once; its output is read in a thread)
        [sys.executable, "-c", serve, str(stack.pod), str(stack.socket_dir), str(wrapper)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert serving.stdout is not None
        assert await asyncio.to_thread(serving.stdout.readline) == "ready\n"
        launched = await stack.call("POST", "/v1/runs", stack.launch_body("inflight", "@fake reply: after the kill"))
        assert launched.status == 202
        await eventually(in_flight, what=what)
        serving.send_signal(signal.SIGKILL)
        await asyncio.to_thread(serving.wait, 10)
        # The supervisor is gone, but its lifecycle subprocess is still in flight: it holds the pod lock.
        assert not lock_is_free(paths.lock)
        refused = await asyncio.to_thread(claw_up, stack.pod, stack.environ)
        assert refused.returncode != 0
        assert "locked" in refused.stderr, refused.stderr
        await asyncio.to_thread(gate.touch)  # the subprocess goes on, starts the worker, and lets the lock go
        await eventually(lambda: lock_is_free(paths.lock), what="the release of the pod lock")
    finally:
        await asyncio.to_thread(gate.touch)
        if serving.poll() is None:
            serving.kill()
            serving.wait(10)
        if serving.stdout is not None:
            serving.stdout.close()
    # A new supervisor adopts the worker the killed one had started, and the run ends as usual.
    await stack.restart()
    final = (await stack.call("GET", "/v1/runs/acme/inflight?wait=stopped&timeout=60s")).json()
    assert final["state"] == "stopped", final
    assert (await stack.call("GET", "/v1/runs/acme/inflight/result")).body == b"after the kill"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the spawn under test is a bubblewrap sandbox's")
async def test_a_killed_supervisors_in_flight_spawn_keeps_writer_authority(stack: RunsStack) -> None:
    paths = PodPaths(stack.pod.resolve())
    await stack.server.stop()
    # The sandbox is started as another user in a mount namespace whose /tmp is its own: the gate lives elsewhere.
    gate_dir = Path(tempfile.mkdtemp(prefix="cs-gate-", dir="/var/tmp"))
    os.chmod(gate_dir, 0o755)
    gate = gate_dir / "open"
    wrapper = gate_dir / "bwrap"
    wrapper.write_text(f'#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.05; done\nexec {shutil.which("bwrap")} "$@"\n')
    os.chmod(wrapper, 0o755)
    monitor = paths.runs / "workers" / "acme" / "inflight" / "monitor.json"
    await kill_while_in_flight(stack, SERVE, wrapper, gate, monitor.exists, "the monitor's start")
    shutil.rmtree(gate_dir, ignore_errors=True)


# The same supervisor on the compose backend, whose `docker compose up` waits for the test's gate.
SERVE_COMPOSE = """
import asyncio, sys
from pathlib import Path
from clawstack.pod.artifacts import PodPaths, read_pod_manifest
from clawstack.pod.compose import PROXY_WORKER_URL
from clawstack.pod.netguard import ensure_guard, runs_network
from clawstack.runs.backends.compose import ComposeBackend
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor

async def main() -> None:
    pod, sock, compose = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    paths = PodPaths(pod.resolve())
    name = read_pod_manifest(paths)["pod"]
    network = runs_network(name)
    backend = ComposeBackend(
        paths.runs / "workers", pod=name, network=network.name, proxy_url=PROXY_WORKER_URL,
        guard=lambda: ensure_guard(network), compose=(compose,),
    )
    server = RunsServer(Supervisor(pod, backend), sock)
    await server.start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("stack", [BACKENDS[1]], indirect=True)
async def test_a_killed_supervisors_in_flight_compose_up_keeps_writer_authority(stack: RunsStack) -> None:
    await stack.server.stop()
    gate_dir = Path(tempfile.mkdtemp(prefix="cs-gate-", dir="/var/tmp"))
    gate, waiting = gate_dir / "open", gate_dir / "waiting"
    wrapper = gate_dir / "compose"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" up "*) touch {waiting}; while [ ! -e {gate} ]; do sleep 0.05; done;; esac\n'
        'exec docker compose "$@"\n'
    )
    os.chmod(wrapper, 0o755)
    await kill_while_in_flight(stack, SERVE_COMPOSE, wrapper, gate, waiting.exists, "docker compose up in flight")
    chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    assert len(chat) == 1
    shutil.rmtree(gate_dir, ignore_errors=True)
