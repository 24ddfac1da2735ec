"""The compose backend without Docker: the rendered project, the proxy's container paths, the runner rules, the
build step (through a recording compose runner), and the runs network guard (through a scripted iptables)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawstack.pod.artifacts import PodPaths
from clawstack.pod.compose import PROXY_SERVICE, PROXY_WORKER_PORT, PROXY_WORKER_URL
from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild import PROXY_IMAGE
from clawstack.pod.images import ImageInfo
from clawstack.pod.netguard import RunsNetwork, ensure_guard, guard_present, remove_guard, runs_network
from clawstack.pod.up import compile_only, up
from clawstack.worker.container import wrapper_digest

PODS = Path(__file__).resolve().parents[2] / "pods"
SECRET = "ticket-token-" + "s" * 20
PROXY_ID = "sha256:" + "p" * 64
WORKER_ID = "sha256:" + "w" * 64


def compose_pod(tmp_path: Path, mutate: Callable[[dict[str, Any]], None] | None = None) -> Path:
    pod = tmp_path / "pod"
    if not pod.exists():
        shutil.copytree(PODS / "base", pod)
    document: dict[str, Any] = yaml.safe_load((PODS / "base" / "claw-pod.yml").read_text())
    document["x-claw"]["backend"] = "compose"
    document["x-claw"]["cllama-defaults"]["env"]["TICKET_API_TOKEN"] = SECRET
    document["services"]["worker"]["image"] = "acme/worker:1"
    document["services"]["ticket-api"]["x-claw"]["endpoint"] = "http://ticket-api:8080"
    document["services"]["ticket-api"]["environment"] = {"GREETING": "cost $5"}
    if mutate is not None:
        mutate(document)
    (pod / "claw-pod.yml").write_text(yaml.safe_dump(document))
    return pod


def fake_inspector(claw_type: str = "oneshot", known: set[str] | None = None) -> Callable[[str], ImageInfo]:
    def inspect(reference: str) -> ImageInfo:
        if known is not None and reference not in known:
            raise BackendError(f"image {reference!r} is not in the local Docker engine", code="image_not_found")
        return ImageInfo(
            reference=reference,
            image_id=PROXY_ID if reference == PROXY_IMAGE else WORKER_ID,
            claw_type=claw_type,
            volumes=(),
            user=None,
            entrypoint=None,
            cmd=None,
        )

    return inspect


def written(pod: Path, **kwargs: Any) -> tuple[dict[str, Any], PodPaths]:
    up(pod, detach=False, environ={}, inspector=kwargs.pop("inspector", fake_inspector()), **kwargs)
    paths = PodPaths(pod.resolve())
    return yaml.safe_load(paths.compose_file.read_text()), paths


def test_the_proxy_service_is_hardened_and_pinned(tmp_path: Path) -> None:
    project, paths = written(compose_pod(tmp_path))
    assert stat.S_IMODE(paths.compose_file.stat().st_mode) == 0o600
    assert project["name"] == "t"
    assert set(project["services"]) == {PROXY_SERVICE, "ticket-api"}  # no per-run service
    proxy = project["services"][PROXY_SERVICE]
    assert proxy["image"] == PROXY_ID
    assert proxy["user"] == f"{os.geteuid()}:{os.getegid()}"
    assert proxy["read_only"] is True
    assert proxy["cap_drop"] == ["ALL"]
    assert proxy["security_opt"] == ["no-new-privileges:true"]
    assert proxy["tmpfs"] == ["/tmp"]
    assert proxy["init"] is True
    assert proxy["restart"] == "unless-stopped"
    assert proxy["entrypoint"] == ["python3", "-m", "clawstack", "proxy"]  # `cllama auth …` is `claw proxy auth …`
    assert proxy["command"] == ["serve", "--config", "/claw/proxy/proxy.json"]
    assert proxy["environment"] == {
        "CLAW_REVOCATION_DIR": "/claw/revocations",
        "CLAW_PROXY_CONFIG": "/claw/proxy/proxy.json",
    }
    assert proxy["labels"]["claw.pod"] == "t"
    assert proxy["labels"]["claw.role"] == "proxy"
    assert "extra_hosts" not in proxy
    assert "ports" not in proxy
    assert sorted(proxy["networks"]) == ["claw-runs-t", "default"]
    assert SECRET not in paths.compose_file.read_text()


def test_the_proxy_mounts_exactly_its_directories(tmp_path: Path) -> None:
    project, paths = written(compose_pod(tmp_path))
    mounts = {(m["source"], m["target"], m["read_only"]) for m in project["services"][PROXY_SERVICE]["volumes"]}
    assert all(m["type"] == "bind" for m in project["services"][PROXY_SERVICE]["volumes"])
    assert mounts == {
        (str(paths.proxy), "/claw/proxy", True),
        (str(paths.proxy / "state"), "/claw/state", False),
        (str(paths.revocations), "/claw/revocations", False),
        (str(paths.sockets), "/claw/sock", False),
        (str(paths.auth), "/claw/auth", False),  # the plan sign-in store: the proxy's alone
    }
    for source, _, _ in mounts:  # every source exists, owned by the operator, so Docker never creates one as root
        assert Path(source).is_dir()
        assert Path(source).stat().st_uid == os.geteuid()


def test_the_journal_is_mounted_only_when_on(tmp_path: Path) -> None:
    project, paths = written(compose_pod(tmp_path, lambda d: d["x-claw"].update(journal=True)))
    targets = {m["target"]: m["source"] for m in project["services"][PROXY_SERVICE]["volumes"]}
    assert targets["/claw/journal"] == str(paths.proxy / "journal")
    assert json.loads(paths.proxy_config.read_text())["journal"] == {"directory": "/claw/journal"}


def test_the_runs_network_is_internal_and_pinned_to_its_bridge(tmp_path: Path) -> None:
    project, _ = written(compose_pod(tmp_path))
    bridge = "clawr-" + hashlib.sha256(b"t").hexdigest()[:9]
    assert runs_network("t") == RunsNetwork(name="claw-runs-t", bridge=bridge)
    assert project["networks"]["claw-runs-t"] == {
        "name": "claw-runs-t",
        "driver": "bridge",
        "internal": True,
        "enable_ipv6": False,
        "driver_opts": {"com.docker.network.bridge.name": bridge},
        "labels": {"claw.pod": "t", "claw.role": "runs-network"},
    }
    assert "default" in project["networks"]
    assert "networks" not in project["services"]["ticket-api"]  # tool services stay on the default network


@pytest.mark.parametrize("name", ["t", "a" * 63, "work_queue-2"])
def test_a_bridge_name_fits_linux(name: str) -> None:
    assert len(runs_network(name).bridge) <= 15


def test_tool_services_are_rendered_without_x_claw_and_never_reinterpolated(tmp_path: Path) -> None:
    project, _ = written(compose_pod(tmp_path))
    ticket = project["services"]["ticket-api"]
    assert "x-claw" not in ticket
    assert ticket["image"] == "example/ticket-api"
    assert ticket["environment"] == {"GREETING": "cost $$5"}  # Compose reads $$ back as $


@pytest.mark.parametrize(
    ("where", "url", "expected"),
    [
        ("upstream", "http://host.docker.internal:18089/v1", True),
        ("tool", "http://host.docker.internal:18091", True),
        ("upstream", "http://127.0.0.1:18089/v1", False),
        ("tool", "http://host.docker.internal.example:18091", False),
    ],
)
def test_extra_hosts_only_for_host_docker_internal(tmp_path: Path, where: str, url: str, expected: bool) -> None:
    def mutate(d: dict[str, Any]) -> None:
        if where == "upstream":
            d["x-claw"]["upstreams"]["local"]["base-url"] = url
        else:
            d["services"]["ticket-api"]["x-claw"]["endpoint"] = url

    project, _ = written(compose_pod(tmp_path, mutate))
    proxy = project["services"][PROXY_SERVICE]
    assert proxy.get("extra_hosts") == (["host.docker.internal:host-gateway"] if expected else None)


def test_the_compose_proxy_config_names_container_paths(tmp_path: Path) -> None:
    _, paths = written(compose_pod(tmp_path))
    config = json.loads(paths.proxy_config.read_text())
    assert stat.S_IMODE(paths.proxy_config.stat().st_mode) == 0o600
    assert config["worker"] == {
        "host": "0.0.0.0",
        "port": PROXY_WORKER_PORT,
        "unix_socket": "/claw/sock/worker/proxy.sock",
    }
    assert config["operator"] == {"unix_socket": "/claw/sock/operator.sock"}
    assert config["state_dir"] == "/claw/state"
    assert "revocation_dir" not in config
    assert "journal" not in config
    assert config["tools"]["ticket-api"] == {
        "base_url": "http://ticket-api:8080",
        "descriptor_file": "/claw/proxy/tools/ticket-api.json",
    }
    assert PROXY_WORKER_URL == "http://cllama:8080/v1"
    assert str(paths.pod) not in paths.proxy_config.read_text()  # no host path the container cannot see


def test_the_compose_proxy_config_parses_as_the_proxy_reads_it(tmp_path: Path) -> None:
    from clawstack.proxy.config import parse_config

    _, paths = written(compose_pod(tmp_path))
    data = json.loads(paths.proxy_config.read_text())
    config = parse_config(data, base_dir=Path("/claw/proxy"), environ={"CLAW_REVOCATION_DIR": "/claw/revocations"})
    assert config.revocation_dir == "/claw/revocations"
    assert config.worker.port == PROXY_WORKER_PORT


def test_an_unchanged_pod_renders_the_same_bytes_and_a_change_does_not(tmp_path: Path) -> None:
    pod = compose_pod(tmp_path)
    _, paths = written(pod)
    first = paths.compose_file.read_bytes()
    written(pod)
    assert paths.compose_file.read_bytes() == first
    written(compose_pod(tmp_path, lambda d: d["x-claw"]["cllama-defaults"]["env"].update(TICKET_API_TOKEN="r" * 24)))
    assert paths.compose_file.read_bytes() != first  # a rotated credential recreates the proxy


def test_the_oneshot_wrapper_is_pinned(tmp_path: Path) -> None:
    compiled = compile_only(compose_pod(tmp_path), environ={}, inspector=fake_inspector())
    assert compiled.templates[0].document["runner"]["wrapper"] == wrapper_digest()


def test_picoclaw_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackendError) as info:
        compile_only(compose_pod(tmp_path), environ={}, inspector=fake_inspector("picoclaw"))
    assert info.value.code == "runner_unsupported"
    assert "PicoClaw" in info.value.message
    assert "not run" in info.value.message


def test_a_missing_proxy_image_says_to_build_it(tmp_path: Path) -> None:
    pod = compose_pod(tmp_path)
    with pytest.raises(BackendError) as info:
        up(pod, detach=False, environ={}, inspector=fake_inspector(known={"acme/worker:1"}))
    assert info.value.code == "image_not_found"
    assert "claw images build" in info.value.message
    assert not (pod / ".claw-runs").exists()


class RecordingCompose:
    """Stands in for ``docker compose``: records each argv and the build project it was given."""

    def __init__(self, returncode: int = 0, stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.projects: list[dict[str, Any]] = []
        self.fds: list[int | None] = []
        self.returncode, self.stderr = returncode, stderr

    def __call__(self, argv: Sequence[str], lock_fd: int | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        self.fds.append(lock_fd)
        if "build" in argv:
            self.projects.append(yaml.safe_load(Path(argv[argv.index("-f") + 1]).read_text()))
        return subprocess.CompletedProcess(list(argv), self.returncode, "", self.stderr)


@pytest.mark.parametrize(
    ("service", "image"),
    [
        ({"build": "./ctx"}, "t-worker"),
        ({"build": {"context": "ctx", "dockerfile": "Dockerfile.w"}, "image": "acme/built:2"}, "acme/built:2"),
    ],
)
def test_build_is_honoured_before_compiling(tmp_path: Path, service: dict[str, Any], image: str) -> None:
    def mutate(d: dict[str, Any]) -> None:
        worker = d["services"]["worker"]
        worker.pop("image")
        worker.update(service)

    pod = compose_pod(tmp_path, mutate)
    compose = RecordingCompose()
    _, paths = written(pod, compose_runner=compose)
    (call,) = compose.calls
    assert call[:4] == ["-p", "t", "-f", str(paths.pod / ".claw-runs" / "build.compose.yml")]
    assert call[-2:] == ["build", "worker"]
    assert compose.fds[0] is not None  # the build inherits the pod lock
    (project,) = compose.projects
    assert project["services"]["worker"]["image"] == image
    assert project["services"]["worker"]["build"]["context"] == str(paths.pod / "ctx")
    assert stat.S_IMODE((paths.pod / ".claw-runs" / "build.compose.yml").stat().st_mode) == 0o600
    template = json.loads((paths.templates / "worker.json").read_text())
    assert template["runner"]["image"] == image
    assert template["runner"]["image_id"] == WORKER_ID


def test_check_never_builds(tmp_path: Path) -> None:
    pod = compose_pod(tmp_path, lambda d: d["services"]["worker"].update(build="./ctx", image="acme/w:1"))
    with pytest.raises(BackendError) as info:
        compile_only(pod, environ={}, inspector=fake_inspector(known={PROXY_IMAGE}))
    assert info.value.code == "image_not_found"
    assert "claw up builds it" in info.value.message
    assert not (pod / ".claw-runs").exists()


def test_a_failed_build_reports_compose_output_without_credentials(tmp_path: Path) -> None:
    pod = compose_pod(tmp_path, lambda d: d["services"]["worker"].update(build="./ctx"))
    compose = RecordingCompose(returncode=1, stderr=f"step 1\nstep 2\nfailed near TICKET_API_TOKEN={SECRET}\n")
    with pytest.raises(BackendError) as info:
        written(pod, compose_runner=compose)
    assert info.value.code == "compose_failed"
    assert "failed near TICKET_API_TOKEN=[redacted]" in info.value.message
    assert SECRET not in info.value.message
    assert not PodPaths(pod.resolve()).compose_file.exists()


class ScriptedIptables:
    """An in-memory INPUT chain answering ``-C``/``-I``/``-D`` the way iptables does."""

    def __init__(self, refuse: bool = False) -> None:
        self.rules: list[tuple[str, ...]] = []
        self.refuse = refuse

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        tool, action, rule = argv[0], argv[3], (argv[0], *argv[4:])
        if self.refuse:
            return subprocess.CompletedProcess(list(argv), 4, "", f"{tool}: Permission denied (you must be root)")
        if action == "-C":
            return subprocess.CompletedProcess(list(argv), 0 if rule in self.rules else 1, "", "")
        if action == "-I":
            self.rules.insert(0, rule)
        elif action == "-D":
            self.rules.remove(rule)
        return subprocess.CompletedProcess(list(argv), 0, "", "")


@pytest.mark.parametrize("ipv6", [False, True])
def test_the_guard_is_idempotent(ipv6: bool) -> None:
    network = runs_network("t")
    chain = ScriptedIptables()
    assert not guard_present(network, runner=chain, ipv6=ipv6)
    ensure_guard(network, runner=chain, ipv6=ipv6)
    ensure_guard(network, runner=chain, ipv6=ipv6)
    tools = ["iptables", "ip6tables"] if ipv6 else ["iptables"]
    assert sorted(chain.rules) == sorted((t, "INPUT", "-i", network.bridge, "-j", "DROP") for t in tools)
    assert guard_present(network, runner=chain, ipv6=ipv6)
    remove_guard(network, runner=chain, ipv6=ipv6)
    remove_guard(network, runner=chain, ipv6=ipv6)
    assert chain.rules == []


def test_a_refused_guard_is_a_structured_error() -> None:
    with pytest.raises(BackendError) as info:
        ensure_guard(runs_network("t"), runner=ScriptedIptables(refuse=True), ipv6=False)
    assert info.value.code == "network_guard_failed"
    assert "Permission denied" in info.value.message


def test_a_missing_iptables_is_a_structured_error() -> None:
    def missing(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    with pytest.raises(BackendError) as info:
        guard_present(runs_network("t"), runner=missing, ipv6=False)
    assert info.value.code == "network_guard_failed"
