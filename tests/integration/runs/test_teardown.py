"""``claw down`` cancels unfinished runs first, and ends them ``proxy_stopped`` when the proxy cannot acknowledge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from clawstack.pod.artifacts import PodPaths
from clawstack.pod.localproxy import LocalProxy
from clawstack.runs.backends import backend_for
from clawstack.runs.ledger import Ledger
from tests.docker_images import docker_client

from .conftest import BACKENDS, RunsStack

pytestmark = pytest.mark.parametrize("stack", BACKENDS, indirect=True)


def claw(stack: RunsStack, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clawstack", *command, "--pod", str(stack.pod)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def record(stack: RunsStack, run_id: str) -> object:
    ledger = Ledger(PodPaths(stack.pod.resolve()).runs)
    ledger.open()
    try:
        return ledger.get("acme", run_id)
    finally:
        ledger.close()


def kill_proxy(stack: RunsStack) -> None:
    if stack.supervisor.backend.name == "local":
        proxy = LocalProxy(PodPaths(stack.pod.resolve())).running()
        assert proxy is not None
        os.kill(proxy.pid, signal.SIGKILL)
        return
    client = docker_client()
    try:
        wanted = [f"claw.pod={stack.supervisor.pod_name}", "claw.role=proxy"]
        (container,) = client.containers.list(filters={"label": wanted})
        container.kill()
        container.reload()
        assert container.status != "running"
    finally:
        client.close()


async def test_down_cancels_and_revokes_unfinished_runs(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("left", "@fake reply: x\n@fake delay-ms: 60000"))
    await stack.call("GET", "/v1/runs/acme/left?wait=running&timeout=60s")
    await stack.server.stop()  # the supervisor goes away; its worker keeps running
    up_refused = claw(stack, "up", "-d")
    assert up_refused.returncode != 0
    assert "1 run(s) are unfinished" in up_refused.stderr
    done = claw(stack, "down")
    assert done.returncode == 0, done.stderr
    assert "cancelled acme/left (revoked)" in done.stdout
    final = record(stack, "left")
    assert final.state == "stopped"  # type: ignore[attr-defined]
    assert final.cancelled is True  # type: ignore[attr-defined]
    assert final.revocation_proof == "cllama_ack"  # type: ignore[attr-defined]


async def test_down_ends_runs_proxy_stopped_when_the_proxy_cannot_acknowledge(stack: RunsStack) -> None:
    await stack.restart(callback_origin="http://127.0.0.1:9")
    body = {**stack.launch_body("orphaned", "@fake reply: x\n@fake delay-ms: 60000"), "credential": "orchestrator-tok"}
    await stack.call("POST", "/v1/runs", body)
    await stack.call("GET", "/v1/runs/acme/orphaned?wait=running&timeout=60s")
    await stack.server.stop()
    secrets = PodPaths(stack.pod.resolve()).runs / "secrets" / "acme"
    assert sorted(p.name for p in secrets.iterdir()) == ["orphaned.credential", "orphaned.identity"]
    kill_proxy(stack)  # the proxy can no longer acknowledge anything
    done = claw(stack, "down")
    assert done.returncode == 0, done.stderr
    assert "cancelled acme/orphaned (revocation_proof: proxy_stopped)" in done.stdout
    final = record(stack, "orphaned")
    assert final.state == "stopped"  # type: ignore[attr-defined]
    assert final.revoked is True  # type: ignore[attr-defined]
    assert final.revocation_proof == "proxy_stopped"  # type: ignore[attr-defined]
    assert list(secrets.iterdir()) == []  # the run's token and credential are gone with the pod


async def test_orphans_block_serving_and_doctor_removes_them(stack: RunsStack) -> None:
    from clawstack.runs.backends.base import RunLabels, WorkerSpec
    from clawstack.runs.supervisor import StartupError
    from clawstack.worker.contract import WorkerConfig

    from .conftest import make_server

    await stack.server.stop()
    paths = PodPaths(stack.pod.resolve())
    backend = backend_for(paths)  # the stopped supervisor's own backend is closed
    endpoint = backend.model_endpoint
    config = WorkerConfig(
        credential="x:" + "y" * 32,
        model="primary",
        contract="",
        model_unix_socket=endpoint.get("model_unix_socket"),
        model_base_url=endpoint.get("model_base_url"),
    )
    template = json.loads((paths.templates / "worker.json").read_text())
    await backend.spawn(
        WorkerSpec(
            labels=RunLabels(pod=stack.supervisor.pod_name, installation="acme", run_id="stray"),
            task="@fake reply: stray\n@fake delay-ms: 60000",
            config=config.to_json().encode(),
            proxy_socket=paths.worker_socket,
            memory_bytes=256 * 1024**2,
            pids=64,
            max_runtime_s=120,
            max_output_bytes=4096,
            image_id=template["runner"].get("image_id"),
        )
    )
    backend.close()
    refused = make_server(stack.pod, stack.socket_dir)
    with pytest.raises(StartupError) as info:
        await refused.start()
    assert "workers exist that the ledger does not know: acme/stray" in info.value.message
    report = claw(stack, "runs", "doctor")
    assert report.returncode == 1
    assert "orphaned workers: 1" in report.stdout
    assert "acme/stray" in report.stdout
    removed = claw(stack, "runs", "doctor", "--remove-orphans")
    assert removed.returncode == 0, removed.stderr
    assert "removed acme/stray" in removed.stdout
    stack.server = make_server(stack.pod, stack.socket_dir)
    await stack.server.start()
