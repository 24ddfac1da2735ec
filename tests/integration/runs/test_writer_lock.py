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
    serving = subprocess.Popen(  # noqa: ASYNC220 (started once; its output is read in a thread)
        [sys.executable, "-c", SERVE, str(stack.pod), str(stack.socket_dir), str(wrapper)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert serving.stdout is not None
        assert await asyncio.to_thread(serving.stdout.readline) == "ready\n"
        launched = await stack.call("POST", "/v1/runs", stack.launch_body("inflight", "@fake reply: after the kill"))
        assert launched.status == 202
        monitor = paths.runs / "workers" / "acme" / "inflight" / "monitor.json"
        await eventually(monitor.exists, what="the monitor's start")
        serving.send_signal(signal.SIGKILL)
        await asyncio.to_thread(serving.wait, 10)
        # The supervisor is gone, but its spawn is still in flight: it holds the pod lock.
        assert not lock_is_free(paths.lock)
        refused = await asyncio.to_thread(claw_up, stack.pod, stack.environ)
        assert refused.returncode != 0
        assert "locked" in refused.stderr, refused.stderr
        gate.touch()  # the sandbox starts; the spawn is done and lets the lock go
        await eventually(lambda: lock_is_free(paths.lock), what="the release of the pod lock")
    finally:
        gate.touch()
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
    paths = PodPaths(stack.pod.resolve())
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
    serving = subprocess.Popen(  # noqa: ASYNC220 (started once; its output is read in a thread)
        [sys.executable, "-c", SERVE_COMPOSE, str(stack.pod), str(stack.socket_dir), str(wrapper)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert serving.stdout is not None
        assert await asyncio.to_thread(serving.stdout.readline) == "ready\n"
        launched = await stack.call("POST", "/v1/runs", stack.launch_body("inflight", "@fake reply: after the kill"))
        assert launched.status == 202
        await eventually(waiting.exists, what="docker compose up in flight")
        serving.send_signal(signal.SIGKILL)
        await asyncio.to_thread(serving.wait, 10)
        # The supervisor is gone, but its docker compose up is still in flight: it holds the pod lock.
        assert not lock_is_free(paths.lock)
        refused = await asyncio.to_thread(claw_up, stack.pod, stack.environ)
        assert refused.returncode != 0
        assert "locked" in refused.stderr, refused.stderr
        gate.touch()  # compose up goes on, starts the worker, exits, and lets the lock go
        await eventually(lambda: lock_is_free(paths.lock), what="the release of the pod lock")
    finally:
        gate.touch()
        if serving.poll() is None:
            serving.kill()
            serving.wait(10)
        if serving.stdout is not None:
            serving.stdout.close()
    # A new supervisor adopts the container the killed one's compose up started: one worker, one model call.
    await stack.restart()
    final = (await stack.call("GET", "/v1/runs/acme/inflight?wait=stopped&timeout=60s")).json()
    assert final["state"] == "stopped", final
    assert (await stack.call("GET", "/v1/runs/acme/inflight/result")).body == b"after the kill"
    chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    assert len(chat) == 1
    shutil.rmtree(gate_dir, ignore_errors=True)
