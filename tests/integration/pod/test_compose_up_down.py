"""``claw up -d`` and ``claw down`` under ``x-claw.backend: compose`` against the real engine: the hardened proxy
container, its operator API over the host socket, the runs network and its host guard, idempotence, teardown
verified, and the pod lock."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import yaml

from clawstack.common.uds import sync_client
from clawstack.pod.artifacts import PodPaths, existing_operator_token
from clawstack.pod.errors import BackendError, LockError, PodError
from clawstack.pod.imagebuild import PROXY_IMAGE, WORKER_IMAGE
from clawstack.pod.lock import PodLock
from clawstack.pod.netguard import guard_present, runs_network
from clawstack.pod.up import down, up
from tests.docker_images import docker_client, requires_docker

pytestmark = [*requires_docker.marks, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pod"


@pytest.fixture
def pod(short_dir: Path, clawstack_images: list[Any]) -> Iterator[Path]:
    """The example pod under compose, named uniquely, its tool service a stand-in that serves HTTP."""
    target = short_dir / "pod"
    shutil.copytree(EXAMPLE, target)
    document: dict[str, Any] = yaml.safe_load((target / "claw-pod.yml").read_text())
    document["x-claw"]["backend"] = "compose"
    document["x-claw"]["pod"] = f"ct{os.getpid()}-{short_dir.name[-6:].lower().replace('_', '-')}"
    document["x-claw"]["upstreams"]["local"]["base-url"] = "http://host.docker.internal:18089/v1"
    document["x-claw"]["data-policy"]["attestations"][0]["endpoint"] = "http://host.docker.internal:18089/v1"
    document["services"]["worker"]["image"] = WORKER_IMAGE
    document["services"].pop("researcher")  # a pod of one per-run template is enough here
    document["services"]["ticket-api"] = {
        "image": WORKER_IMAGE,
        "entrypoint": ["python3", "-m", "http.server", "18091"],
        "user": "65534:65534",
        "read_only": True,
        "init": True,
        "expose": ["18091"],
        "x-claw": {"describe": "./tools/ticket-api.json"},
    }
    (target / "claw-pod.yml").write_text(yaml.safe_dump(document))
    yield target
    if (target / "compose.generated.yml").exists():
        try:
            down(target)
        except PodError:  # best-effort cleanup after a failed test, which reports the failure itself
            name = document["x-claw"]["pod"]
            subprocess.run(
                ["docker", "compose", "-p", name, "down", "--timeout", "1"], capture_output=True, check=False
            )


def health(paths: PodPaths) -> httpx.Response:
    token = existing_operator_token(paths)
    assert token is not None
    with sync_client(paths.operator_socket, timeout_s=5) as client:
        return client.get("/v1/health", headers={"Authorization": f"Bearer {token}"})


def inspect(container_id: str) -> dict[str, Any]:
    client = docker_client()
    try:
        attrs: dict[str, Any] = client.api.inspect_container(container_id)
        return attrs
    finally:
        client.close()


def network_exists(name: str) -> bool:
    client = docker_client()
    try:
        client.networks.get(name)
    except docker.errors.NotFound:
        return False
    finally:
        client.close()
    return True


def test_up_runs_a_hardened_proxy_idempotently_and_down_removes_it(pod: Path) -> None:
    paths = PodPaths(pod.resolve())
    started = time.monotonic()
    first = up(pod, environ={})
    up_s = time.monotonic() - started
    assert first.changed
    assert first.proxy_container is not None
    name = first.compiled.spec.name
    network = runs_network(name)

    attrs = inspect(first.proxy_container)
    host = attrs["HostConfig"]
    assert attrs["State"]["Running"]
    assert attrs["Image"] == inspect_image_id(PROXY_IMAGE)
    assert attrs["Config"]["User"] == f"{os.geteuid()}:{os.getegid()}"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["Init"] is True
    assert "/tmp" in host["Tmpfs"]
    assert host["RestartPolicy"]["Name"] == "unless-stopped"
    assert host["ExtraHosts"] == ["host.docker.internal:host-gateway"]
    assert not host.get("PortBindings")
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in attrs["Mounts"]}
    assert mounts == {
        "/claw/proxy": (str(paths.proxy), False),
        "/claw/state": (str(paths.proxy / "state"), True),
        "/claw/revocations": (str(paths.revocations), True),
        "/claw/sock": (str(paths.sockets), True),
        "/claw/auth": (str(paths.auth), True),  # the plan sign-in store, the proxy's alone
    }
    assert set(attrs["NetworkSettings"]["Networks"]) == {f"{name}_default", network.name}
    assert "CLAW_REVOCATION_DIR=/claw/revocations" in attrs["Config"]["Env"]

    answer = health(paths)
    assert answer.status_code == 200
    assert answer.json()["status"] == "ok"
    assert guard_present(network)
    assert paths.operator_socket.stat().st_uid == os.geteuid()  # the proxy writes as the operator
    # The spec's sign-in commands run in the proxy's container, through claw compose, against its own config.
    status = subprocess.run(
        [sys.executable, "-m", "clawstack", "compose", "--pod", str(pod), "run", "--rm", "cllama", "auth", "status"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert "chatgpt: not_signed_in" in status.stdout
    logout = subprocess.run(
        [
            sys.executable,
            "-m",
            "clawstack",
            "compose",
            "--pod",
            str(pod),
            "run",
            "--rm",
            "cllama",
            "auth",
            "logout",
            "chatgpt",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert logout.returncode == 0, logout.stderr

    started = time.monotonic()
    again = up(pod, environ={})
    again_s = time.monotonic() - started
    assert not again.changed
    assert again.proxy_container == first.proxy_container
    assert again_s < up_s + 5  # an unchanged pod is a few reads, not a restart

    started = time.monotonic()
    assert down(pod) is True
    down_s = time.monotonic() - started
    assert not network_exists(network.name)
    assert not guard_present(network)
    client = docker_client()
    try:
        assert client.containers.list(all=True, filters={"label": f"com.docker.compose.project={name}"}) == []
    finally:
        client.close()
    assert down(pod) is False
    assert (paths.revocations).is_dir()  # the ledger stays
    print(f"claw up -d {up_s:.2f} s, unchanged up {again_s:.2f} s, down {down_s:.2f} s")


def inspect_image_id(reference: str) -> str:
    client = docker_client()
    try:
        return str(client.api.inspect_image(reference)["Id"])
    finally:
        client.close()


def test_a_changed_pod_recreates_the_proxy(pod: Path) -> None:
    first = up(pod, environ={})
    pod_file = pod / "claw-pod.yml"
    pod_file.write_text(pod_file.read_text().replace("max-runtime: 5m", "max-runtime: 4m"))
    second = up(pod, environ={})
    assert second.changed
    assert second.proxy_container not in (None, first.proxy_container)
    assert health(PodPaths(pod.resolve())).status_code == 200


def test_up_and_down_refuse_while_the_lock_is_held(pod: Path) -> None:
    paths = PodPaths(pod.resolve())
    with PodLock(paths.lock, holder="claw runs serve"):
        with pytest.raises(LockError) as refused:
            up(pod, environ={})
        assert f"the pod is locked by pid {os.getpid()} (claw runs serve)" in refused.value.message
        with pytest.raises(LockError):
            down(pod)
    assert not paths.compose_file.exists()


@pytest.mark.parametrize(
    "labels",
    [
        {"claw.role": "worker"},
        {"claw.role": "forwarder", "claw.installation": "acme", "claw.run_id": "h1"},  # a task-home run's
        {"claw.role": "meter", "claw.installation": "acme", "claw.run_id": "h1"},
    ],
    ids=["worker", "forwarder", "meter"],
)
def test_down_refuses_to_leave_a_run_container_behind(pod: Path, labels: dict[str, str]) -> None:
    result = up(pod, environ={})
    name = result.compiled.spec.name
    network = runs_network(name)
    client = docker_client()
    try:
        worker = client.containers.run(
            WORKER_IMAGE,
            entrypoint=["python3", "-c", "import time; time.sleep(600)"],
            labels={"claw.pod": name, **labels},
            network=network.name,
            name=f"{name}-stray-worker",
            detach=True,
            init=True,
        )
        try:
            with pytest.raises(BackendError) as info:
                down(pod)
            assert info.value.code == "teardown_failed"
            assert f"{name}-stray-worker" in info.value.message
            assert guard_present(network)  # nothing was torn down around the live worker
        finally:
            worker.remove(force=True)
    finally:
        client.close()
    assert down(pod) is True
