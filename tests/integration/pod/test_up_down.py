"""``claw up`` and ``claw down`` as a user runs them: the example pod, its proxy process, idempotence, the lock."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawstack.pod.artifacts import PodPaths, existing_operator_token
from clawstack.pod.localproxy import LocalProxy
from clawstack.pod.lock import PodLock
from clawstack.proxy.client import ProxyOperatorClient

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pod"


def claw(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "clawstack", *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"claw {' '.join(args)} failed: {done.stderr}")
    return done


@pytest.fixture
def pod(short_dir: Path) -> Iterator[Path]:
    target = short_dir / "pod"
    shutil.copytree(EXAMPLE, target)
    yield target
    claw("down", "--pod", str(target), check=False)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_up_down_idempotence_and_a_working_proxy(pod: Path) -> None:
    first = claw("up", "--pod", str(pod), "-d")
    assert "template worker: sha256:" in first.stdout
    assert "proxy started (pid" in first.stdout
    paths = PodPaths(pod.resolve())
    running = LocalProxy(paths).running()
    assert running is not None
    assert alive(running.pid)

    token = existing_operator_token(paths)
    assert token is not None

    async def self_test() -> None:
        async with ProxyOperatorClient(token=token, unix_socket=str(paths.operator_socket)) as op:
            report = await op.self_test(worker_unix_socket=str(paths.worker_socket))
            assert report.passed

    asyncio.run(self_test())

    again = claw("up", "--pod", str(pod), "-d")
    assert f"proxy unchanged, still running (pid {running.pid})" in again.stdout

    pod_file = pod / "claw-pod.yml"
    pod_file.write_text(pod_file.read_text().replace("max-runtime: 5m", "max-runtime: 4m"))
    changed = claw("up", "--pod", str(pod), "-d")
    assert "proxy started" in changed.stdout
    restarted = LocalProxy(paths).running()
    assert restarted is not None
    assert restarted.pid != running.pid
    assert not alive(running.pid)

    assert claw("down", "--pod", str(pod)).stdout.strip() == "stopped"
    assert not alive(restarted.pid)
    assert claw("down", "--pod", str(pod)).stdout.strip() == "nothing was running"
    assert (paths.revocations / "revocations.log").exists()  # the ledger stays


def test_up_and_down_refuse_while_the_lock_is_held(pod: Path) -> None:
    paths = PodPaths(pod.resolve())
    with PodLock(paths.lock, holder="claw runs serve"):
        for command in ("up", "down"):
            refused = claw(command, "--pod", str(pod), *(["-d"] if command == "up" else []), check=False)
            assert refused.returncode != 0
            assert f"the pod is locked by pid {os.getpid()} (claw runs serve); stop it first" in refused.stderr
    assert LocalProxy(paths).running() is None


def test_check_compiles_without_writing(pod: Path) -> None:
    done = claw("up", "--pod", str(pod), "--check")
    assert done.stdout.startswith("worker: sha256:")
    assert not (pod / ".claw-runs").exists()
    assert not (pod / ".claw-runtime").exists()


def test_a_broken_pod_fails_with_its_message_and_writes_nothing(pod: Path) -> None:
    pod_file = pod / "claw-pod.yml"
    pod_file.write_text(pod_file.read_text().replace("pids: 128", "pids: 1"))
    done = claw("up", "--pod", str(pod), "-d", check=False)
    assert done.returncode == 1
    assert "Error: claw-pod.yml: services.worker.x-claw.run.pids: must be between 16 and 32768" in done.stderr
    assert not (pod / ".claw-runs").exists()
