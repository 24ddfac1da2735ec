"""Compose workers as the spec hardens them, checked from outside (``docker inspect``) and from inside (a worker
image whose runner tries to escape: write to ``/``, reach a listener on the host, fork past the pids limit,
allocate past the memory limit, flood stdout)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from clawstack.common.digest import spec_digest
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.imagebuild import WORKER_IMAGE
from clawstack.pod.netguard import runs_network
from clawstack.runs.backends.base import RunLabels
from clawstack.runs.backends.compose import ComposeBackend, project_name
from tests.docker_images import LocalImages, docker_client, requires_docker

from .conftest import RunsStack, eventually, running_stack

pytestmark = requires_docker.marks

ESCAPE = r"""
import json, os, socket, sys, time
task = json.loads(sys.argv[-1])
report = {"uid": os.getuid(), "config_env": "CLAW_WORKER_CONFIG" in os.environ}
time.sleep(task.get("sleep", 0))
if task.get("flood"):
    chunk = "x" * 1023 + "\n"
    for _ in range(task["flood"] // 1024):
        sys.stdout.write(chunk)
    sys.stdout.write("\n\U0001f99e flooded\n")
    sys.exit(0)
try:
    with open("/escape", "w") as handle:
        handle.write("x")
    report["write_root"] = "written"
except OSError as exc:
    report["write_root"] = exc.errno
with open("/tmp/ok", "w") as handle:
    report["write_tmp"] = handle.write("x")
reached = {}
for host in task["hosts"]:
    probe = socket.socket()
    probe.settimeout(2)
    try:
        probe.connect((host, task["port"]))
        reached[host] = "connected"
    except OSError as exc:
        reached[host] = type(exc).__name__
    finally:
        probe.close()
report["hosts"] = reached
try:
    socket.create_connection(("cllama", 8080), timeout=5).close()
    report["proxy"] = "connected"
except OSError as exc:
    report["proxy"] = type(exc).__name__
children = []
try:
    for _ in range(task["forks"]):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    report["fork_error"] = None
except OSError as exc:
    report["fork_error"] = exc.errno
report["forks"] = len(children)
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    blocks = []
    while True:
        blocks.append(bytearray(32 * 1024 * 1024))
report["allocating_child"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
report["cap_eff"] = status["CapEff"].strip()
report["no_new_privs"] = status["NoNewPrivs"].strip()
report["docker_socket"] = os.path.exists("/var/run/docker.sock")
writable = []
for line in open("/proc/self/mounts"):
    point = line.split()[1]
    try:
        probe = os.path.join(point, ".claw-escape-probe")
        with open(probe, "w") as handle:
            handle.write("x")
        os.unlink(probe)
        writable.append(point)
    except OSError:
        pass
report["writable_mounts"] = sorted(set(writable))
sys.stdout.write("\n\U0001f99e" + json.dumps(report) + "\n")
"""


def _build_escape_image(tag: str, *, label: str = "escape") -> None:
    """A worker image whose ``clawstack.worker.oneshot`` is the escape script: what an untrusted image can do."""
    with tempfile.TemporaryDirectory() as context:
        root = Path(context)
        package = root / "hostile" / "clawstack" / "worker"
        package.mkdir(parents=True)
        (root / "hostile" / "clawstack" / "__init__.py").write_text("")
        (package / "__init__.py").write_text("")
        (package / "oneshot.py").write_text(ESCAPE)
        (root / "Dockerfile").write_text(
            f"FROM {WORKER_IMAGE}\nCOPY hostile /hostile\nENV PYTHONPATH=/hostile\nLABEL claw.type=oneshot\n"
            f"LABEL claw.test={label}\n"
        )
        subprocess.run(["docker", "build", "-q", "-t", tag, context], check=True, capture_output=True, timeout=120)


def _remove_image(tag: str) -> None:
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False, timeout=60)


@pytest.fixture(scope="module")
def escape_image() -> Iterator[str]:
    from clawstack.pod.imagebuild import build_images

    build_images()
    tag = f"clawstack-test/escape-{uuid.uuid4().hex[:10]}:latest"
    _build_escape_image(tag)
    try:
        yield tag
    finally:
        _remove_image(tag)


class HostListener:
    """A TCP listener on every host address that records whoever connects."""

    def __init__(self) -> None:
        self.connections: list[str] = []
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def __aenter__(self) -> HostListener:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections.append(str(writer.get_extra_info("peername")))
            writer.close()

        self.server = await asyncio.start_server(accepted, "0.0.0.0", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def _host_addresses(client: docker.DockerClient, network: str) -> list[str]:
    """The host's own addresses a worker might try: the runs network's gateway, docker0 and the main interface."""
    gateways = [c["Gateway"] for c in client.networks.get(network).attrs["IPAM"]["Config"] if c.get("Gateway")]
    docker0 = [c["Gateway"] for c in client.networks.get("bridge").attrs["IPAM"]["Config"] if c.get("Gateway")]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        main = probe.getsockname()[0]
    return sorted({*gateways, *docker0, main})


@pytest.fixture
async def hostile(escape_image: str, short_dir: Path) -> AsyncIterator[RunsStack]:
    async with running_stack(short_dir, "compose", worker_image=escape_image) as stack:
        yield stack


def _launch(stack: RunsStack, run_id: str, task: str) -> dict[str, Any]:
    body = stack.launch_body(run_id, task)
    body["spec_digest"] = spec_digest(body["spec"])
    return body


async def test_a_worker_cannot_escape(hostile: RunsStack) -> None:
    client = docker_client()
    try:
        network = runs_network(hostile.supervisor.pod_name).name
        hosts = _host_addresses(client, network)
        async with HostListener() as listener:
            task = json.dumps({"hosts": hosts, "port": listener.port, "forks": 400})
            assert (await hostile.call("POST", "/v1/runs", _launch(hostile, "escape", task))).status == 202
            running = (await hostile.call("GET", "/v1/runs/acme/escape?wait=running&timeout=60s")).json()
            assert running["isolation"]["backend"] == "compose"
            labels = RunLabels(pod=hostile.supervisor.pod_name, installation="acme", run_id="escape")
            found = client.containers.list(all=True, filters={"label": [f"claw.run_id={labels.run_id}"]})
            if found:  # it may already be gone: the hardening is also checked by test_the_container_is_hardened
                _check_hardening(found[0].attrs, network, memory=512 * 1024 * 1024, pids=128)
            done = (await hostile.call("GET", "/v1/runs/acme/escape?wait=stopped&timeout=60s")).json()
            assert listener.connections == []
        assert done["state"] == "stopped", done
        report = json.loads((await hostile.call("GET", "/v1/runs/acme/escape/result")).body)
    finally:
        client.close()
    assert report["uid"] == 65534
    assert report["config_env"] is False  # the wrapper took the configuration out of the environment
    assert report["write_root"] == 30  # EROFS
    assert report["write_tmp"] == 1
    assert report["proxy"] == "connected"  # the network works: the proxy is the one thing it reaches
    assert all(outcome != "connected" for outcome in report["hosts"].values()), report["hosts"]
    assert report["forks"] < 128
    assert report["fork_error"] == 11
    assert report["allocating_child"] == -9  # killed at the memory limit
    assert report["cap_eff"] == "0000000000000000"
    assert report["no_new_privs"] == "1"
    assert report["docker_socket"] is False
    assert report["writable_mounts"] == ["/tmp"]


async def test_a_flood_of_stdout_is_bounded(hostile: RunsStack) -> None:
    task = json.dumps({"flood": 64 * 1024 * 1024})
    assert (await hostile.call("POST", "/v1/runs", _launch(hostile, "flood", task))).status == 202
    done = (await hostile.call("GET", "/v1/runs/acme/flood?wait=stopped&timeout=60s")).json()
    assert done["state"] in ("stopped", "failed"), done
    if done["state"] == "failed":
        assert done["failure"] == "result_missing"  # the answer was past the bound
    else:
        assert done["result"]["truncated"] is True


def _check_hardening(attrs: dict[str, Any], network: str, *, memory: int, pids: int) -> None:
    host = attrs["HostConfig"]
    config = attrs["Config"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["Init"] is True
    assert host["Memory"] == memory
    assert host["MemorySwap"] == memory
    assert host["PidsLimit"] == pids
    assert host["Privileged"] is False
    assert host["NetworkMode"] == network
    assert host.get("Binds") in (None, [])
    assert attrs["Mounts"] == []
    assert set(host["Tmpfs"]) == {"/tmp"}
    assert host["PidMode"] == ""
    assert host["IpcMode"] == "none"
    assert host["UTSMode"] == ""
    assert list(attrs["NetworkSettings"]["Networks"]) == [network]
    assert config["User"] == "65534:65534"
    assert config["Volumes"] in (None, {})
    assert config["Labels"]["claw.role"] == "worker"


async def test_the_container_is_hardened_and_its_project_holds_no_secret(hostile: RunsStack) -> None:
    body = _launch(
        hostile, "inspected", json.dumps({"hosts": [], "port": 9, "forks": 0, "sleep": 3, "pad": "TASK-MARKER"})
    )
    assert (await hostile.call("POST", "/v1/runs", body)).status == 202
    labels = RunLabels(pod=hostile.supervisor.pod_name, installation="acme", run_id="inspected")
    backend = hostile.supervisor.backend
    assert isinstance(backend, ComposeBackend)
    run_dir = backend.run_dir(labels)
    project = await eventually(lambda: (run_dir / "project.yml").exists() and run_dir / "project.yml", what="project")
    assert project.stat().st_mode & 0o777 == 0o600
    assert (run_dir / "config.secret").stat().st_mode & 0o777 == 0o600
    assert run_dir.stat().st_mode & 0o777 == 0o700
    text = project.read_text()
    assert "TASK-MARKER" not in text
    assert "${CLAW_RUN_TASK:?}" in text
    assert "${CLAW_RUN_CONFIG:?}" in text
    identity = (await hostile.call("GET", "/v1/runs/acme/inspected")).json()["run_agent_id"]
    if identity:
        assert identity not in text
    client = docker_client()
    try:
        network = runs_network(labels.pod).name
        containers = await eventually(
            lambda: client.containers.list(all=True, filters={"label": ["claw.run_id=inspected"]}), what="worker"
        )
        assert len(containers) == 1
        attrs = containers[0].attrs
        _check_hardening(attrs, network, memory=512 * 1024 * 1024, pids=128)
        assert attrs["Config"]["Labels"]["com.docker.compose.project"] == project_name(labels)
        template = json.loads((PodPaths(hostile.pod).templates / "worker.json").read_text())
        assert attrs["Image"] == template["runner"]["image_id"]
        done = (await hostile.call("GET", "/v1/runs/acme/inspected?wait=stopped&timeout=60s")).json()
        assert done["state"] == "stopped", done
        assert client.containers.list(all=True, filters={"label": ["claw.run_id=inspected"]}) == []
        assert not run_dir.exists()
    finally:
        client.close()


async def test_a_run_whose_pinned_image_is_gone_fails_mismatch(escape_image: str, short_dir: Path) -> None:
    tag = f"clawstack-test/gone-{uuid.uuid4().hex[:10]}:latest"
    await asyncio.to_thread(_build_escape_image, tag, label=tag)  # an image of its own, shared with no other tag
    try:
        async with running_stack(short_dir, "compose", worker_image=tag) as stack:
            await asyncio.to_thread(_remove_image, tag)
            body = _launch(stack, "gone", json.dumps({"hosts": [], "port": 9, "forks": 0}))
            assert (await stack.call("POST", "/v1/runs", body)).status == 202
            done = (await stack.call("GET", "/v1/runs/acme/gone?wait=stopped&timeout=60s")).json()
            assert done["state"] == "failed", done
            assert done["failure"] == "mismatch"
            assert done["failure_detail"] == "image_missing"
            assert done["revoked"] is True
    finally:
        await asyncio.to_thread(_remove_image, tag)


async def test_an_image_without_the_runner_fails_the_run_at_once(escape_image: str, short_dir: Path) -> None:
    # No python3 in the image: the container's init cannot start the wrapper and exits 127; the run fails at once
    # (it is not retried until its authority ends) and its container is removed.
    with LocalImages() as images:
        tag, _ = await asyncio.to_thread(
            images.build, "nopython", env={"CLAW_TYPE": "oneshot"}, files={"/README": b"no interpreter here"}
        )
        async with running_stack(short_dir, "compose", worker_image=tag) as stack:
            body = _launch(stack, "unstartable", "@fake reply: never")
            assert (await stack.call("POST", "/v1/runs", body)).status == 202
            done = (await stack.call("GET", "/v1/runs/acme/unstartable?wait=stopped&timeout=60s")).json()
            assert done["state"] == "failed", done
            assert done["failure"] == "exit_nonzero"
            assert done["exit_code"] == 127
            assert done["revoked"] is True
            client = docker_client()
            try:
                assert client.containers.list(all=True, filters={"label": ["claw.run_id=unstartable"]}) == []
            finally:
                client.close()
