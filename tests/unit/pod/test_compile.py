"""Template identity, what claw up writes and with which modes, the template listing, and the compose backend
with a stand-in image inspector (the real Docker engine is exercised in tests/integration/pod)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawstack.pod.artifacts import PodPaths, list_templates, load_template
from clawstack.pod.compile import compile_pod, runner_digest
from clawstack.pod.errors import BackendError, PodError
from clawstack.pod.images import ImageInfo
from clawstack.pod.podfile import load_pod
from clawstack.pod.up import up
from clawstack.worker.container import wrapper_digest

PODS = Path(__file__).resolve().parents[2] / "pods"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pod"
SECRET = "ticket-token-" + "s" * 20


def make_pod(tmp_path: Path, mutate: Any = None) -> Path:
    pod = tmp_path / "pod"
    if not pod.exists():
        shutil.copytree(PODS / "base", pod)
    document = yaml.safe_load((PODS / "base" / "claw-pod.yml").read_text())
    document["x-claw"]["cllama-defaults"]["env"]["TICKET_API_TOKEN"] = "${TICKET_TOKEN}"
    if mutate is not None:
        mutate(document)
    (pod / "claw-pod.yml").write_text(yaml.safe_dump(document))
    (pod / ".env").write_text(f"TICKET_TOKEN={SECRET}\n")
    return pod


def compiled_id(tmp_path: Path, mutate: Any = None, environ: dict[str, str] | None = None) -> tuple[str, str]:
    spec = load_pod(make_pod(tmp_path, mutate), environ=environ or {})
    template = compile_pod(spec).templates[0]
    return template.id, template.document["context_digest"]


def test_credential_rotation_keeps_the_id_and_every_other_change_changes_it(tmp_path: Path) -> None:
    base = compiled_id(tmp_path)
    assert base == compiled_id(tmp_path)  # deterministic
    assert compiled_id(tmp_path, environ={"TICKET_TOKEN": "rotated-" + "r" * 24}) == base  # credential only

    def endpoint(d: dict[str, Any]) -> None:
        d["services"]["ticket-api"]["x-claw"]["endpoint"] = "http://127.0.0.1:19999"

    def model(d: dict[str, Any]) -> None:
        d["services"]["worker"]["x-claw"]["models"] = {"primary": "local/other"}

    def effort(d: dict[str, Any]) -> None:
        d["services"]["worker"]["x-claw"]["reasoning-effort"] = {"primary": "low"}

    def grant(d: dict[str, Any]) -> None:
        d["services"]["worker"]["x-claw"]["tools"] = []

    def limit(d: dict[str, Any]) -> None:
        d["services"]["worker"]["x-claw"]["run"] = {"max-runtime": "10m"}

    def upstream(d: dict[str, Any]) -> None:
        d["x-claw"]["upstreams"]["local"]["base-url"] = "http://127.0.0.1:10/v1"

    def policy(d: dict[str, Any]) -> None:
        d["x-claw"]["journal"] = True

    ids = {base[0]}
    for change in (endpoint, model, effort, grant, limit, upstream, policy):
        changed = compiled_id(tmp_path, change)
        assert changed[0] not in ids, change.__name__
        ids.add(changed[0])
    assert compiled_id(tmp_path, endpoint)[1] != base[1]  # the context digest covers the endpoint
    # A changed contract or descriptor file changes the id too.
    (tmp_path / "pod" / "AGENTS.md").write_text("# Another contract\n")
    assert compiled_id(tmp_path)[0] not in ids


def test_pinned_identity_of_the_base_pod(tmp_path: Path) -> None:
    template = compile_pod(load_pod(make_pod(tmp_path), environ={})).templates[0]
    document = template.document
    body = {k: v for k, v in document.items() if k not in ("id", "runner")}
    # Everything but the runner pin (a digest of the installed runner's files) is pinned here.
    assert body == {
        "schema": 1,
        "name": "worker",
        "pod": "t",
        "backend": "local",
        "profile": "stateless",
        "contract": {
            "file": "./AGENTS.md",
            "sha256": "sha256:" + __import__("hashlib").sha256(b"# Test contract\n\nAnswer the task.\n").hexdigest(),
            "text": "# Test contract\n\nAnswer the task.\n",
        },
        "tools": ["ticket-api.get_ticket"],
        "limits": {
            "max_runtime_seconds": 1800,
            "max_authority_seconds": 7200,
            "max_task_bytes": 32768,
            "max_result_bytes": 262144,
            "memory_bytes": 1073741824,
            "pids": 256,
        },
        "network": {"name": "sandbox", "mode": "proxy-only"},
        "models": [{"slot": "primary", "ref": "local/m"}],
        "home": None,
        "content": [],
        "content_targets": [],
        "data_policy": {  # the base pod's policy is permissive
            "mode": "permissive",
            "regions": [],
            "training": "allowed",
            "retention": "allowed",
            "local_retention": "metadata",  # the proxy's audit.jsonl keeps call metadata in every pod
            "attested_providers": [],
        },
        "context_digest": document["context_digest"],
    }
    assert template.context == {
        "template": "worker",
        "models": [{"slot": "primary", "ref": "local/m"}],
        "tools": {
            "ticket-api": {
                "endpoint": "http://127.0.0.1:18091",
                "descriptor_sha256": "sha256:"
                + __import__("hashlib").sha256((PODS / "base" / "tools" / "ticket-api.json").read_bytes()).hexdigest(),
                "auth_env": "TICKET_API_TOKEN",
            }
        },
        "upstreams": {"local": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": None}},
        "credentials": ["TICKET_API_TOKEN"],
        "journal": False,
        "data_policy": "permissive",
    }
    assert document["runner"]["image"] == "clawstack/oneshot"
    assert document["runner"]["type"] == "oneshot"
    assert document["runner"]["digest"].startswith("sha256:")


def test_runner_digest_covers_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pinned_runner_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("print('a')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = runner_digest(("pinned_runner_pkg", "pinned_runner_pkg.main"))
    (package / "main.py").write_text("print('b')\n")
    assert runner_digest(("pinned_runner_pkg", "pinned_runner_pkg.main")) != first
    with pytest.raises(BackendError, match="not installed"):
        runner_digest(("no_such_runner_module_x",))


def modes(paths: PodPaths) -> dict[str, int]:
    return {
        str(p.relative_to(paths.pod)): stat.S_IMODE(p.stat().st_mode)
        for p in paths.pod.rglob("*")
        if p.parts[len(paths.pod.parts)].startswith(".claw-") and not p.is_socket()
    }


def test_what_claw_up_writes_and_its_modes(tmp_path: Path) -> None:
    pod = make_pod(tmp_path)
    result = up(pod, detach=False, environ={})
    paths = PodPaths(pod.resolve())
    for path, mode in modes(paths).items():
        if (paths.pod / path).is_dir():
            assert mode == 0o700, path
        elif not path.endswith("pod.lock"):
            assert mode == 0o600, path
    template_text = (paths.templates / "worker.json").read_text()
    context_text = (paths.contexts / "worker.json").read_text()
    proxy_text = paths.proxy_config.read_text()
    assert SECRET not in template_text
    assert SECRET not in context_text
    assert SECRET in proxy_text  # the private proxy context is where the credential lives
    proxy = json.loads(proxy_text)
    assert proxy["tools"]["ticket-api"]["base_url"] == "http://127.0.0.1:18091"
    assert proxy["revocation_dir"] == str(paths.revocations)
    assert len(proxy["env"]["CLAW_PROXY_OPERATOR_TOKEN"]) >= 32
    assert result.changed


def test_template_listing_verifies_files(tmp_path: Path) -> None:
    pod = make_pod(tmp_path)
    up(pod, detach=False, environ={})
    paths = PodPaths(pod.resolve())
    listing = list_templates(paths)
    assert listing["invalid"] == []
    (entry,) = listing["templates"]
    assert set(entry) == {"name", "id", "context_digest", "models", "profile", "content_targets", "data_policy"}
    assert entry["models"] == [{"slot": "primary", "ref": "local/m"}]
    assert SECRET not in json.dumps(listing)
    assert load_template(paths, "worker")["id"] == entry["id"]
    # Tampering with the template or its context makes it invalid, never served.
    document = json.loads((paths.templates / "worker.json").read_text())
    document["tools"] = ["ticket-api.get_ticket", "ticket-api.more"]
    (paths.templates / "worker.json").write_text(json.dumps(document))
    assert list_templates(paths) == {"templates": [], "invalid": ["worker"]}
    with pytest.raises(PodError) as info:
        load_template(paths, "worker")
    assert info.value.code == "template_invalid"
    up(pod, detach=False, environ={})
    context = json.loads((paths.contexts / "worker.json").read_text())
    context["tools"]["ticket-api"]["endpoint"] = "http://evil.example"
    (paths.contexts / "worker.json").write_text(json.dumps(context))
    os.chmod(paths.contexts / "worker.json", 0o600)
    assert list_templates(paths)["invalid"] == ["worker"]
    with pytest.raises(PodError) as info:
        load_template(paths, "nope")
    assert info.value.code == "template_unknown"


def test_a_removed_template_is_removed(tmp_path: Path) -> None:
    def two(d: dict[str, Any]) -> None:
        d["services"]["second"] = d["services"]["worker"]

    pod = make_pod(tmp_path, two)
    up(pod, detach=False, environ={})
    paths = PodPaths(pod.resolve())
    assert sorted(t["name"] for t in list_templates(paths)["templates"]) == ["second", "worker"]
    make_pod(tmp_path)
    up(pod, detach=False, environ={})
    assert [t["name"] for t in list_templates(paths)["templates"]] == ["worker"]


def test_the_example_pod_compiles() -> None:
    spec = load_pod(EXAMPLE, environ={})
    compiled = compile_pod(spec)
    template, researcher = compiled.templates
    assert template.name == "worker"
    assert (researcher.name, researcher.document["profile"]) == ("researcher", "task_home")
    assert researcher.document["home"] == {"mount": "/home/task", "max_bytes": 256 * 1024**2}
    assert researcher.document["runner"]["type"] == "hermes"
    assert template.document["tools"] == ["ticket-api.get_ticket"]
    assert template.document["models"] == [{"slot": "primary", "ref": "local/clawstack-fake"}]
    assert template.context["upstreams"]["local"]["base_url"] == "http://127.0.0.1:18089/v1"
    moved = load_pod(EXAMPLE, environ={"CLAW_FAKE_LLM_URL": "http://127.0.0.1:9999/v1"})
    assert compile_pod(moved).templates[0].context["upstreams"]["local"]["base_url"] == "http://127.0.0.1:9999/v1"


# ------------------------------------------------------------------------------------------ compose backend


def compose_pod(tmp_path: Path, home: bool = False) -> Path:
    def mutate(d: dict[str, Any]) -> None:
        d["x-claw"]["backend"] = "compose"
        d["services"]["worker"]["image"] = "acme/worker:1"
        if home:
            d["services"]["worker"]["x-claw"]["run"] = {"home": {}}
        d["services"]["ticket-api"]["expose"] = ["8080"]
        del d["services"]["ticket-api"]["x-claw"]["endpoint"]

    return make_pod(tmp_path, mutate)


def inspector(claw_type: str | None, volumes: tuple[str, ...] = ()) -> Any:
    def inspect(reference: str) -> ImageInfo:
        return ImageInfo(
            reference=reference,
            image_id="sha256:" + "a" * 64,
            claw_type=claw_type,
            volumes=volumes,
            user=None,
            entrypoint=None,
            cmd=None,
        )

    return inspect


def test_compose_pins_the_image_id_and_renders_the_project(tmp_path: Path) -> None:
    pod = compose_pod(tmp_path)
    result = up(pod, detach=False, environ={}, inspector=inspector("oneshot"))
    document = result.compiled.templates[0].document
    assert document["runner"] == {
        "image": "acme/worker:1",
        "image_id": "sha256:" + "a" * 64,
        "type": "oneshot",
        "wrapper": wrapper_digest(),
    }
    assert document["network"] == {"name": "claw-runs-t", "internal": True}
    paths = PodPaths(pod.resolve())
    assert stat.S_IMODE(paths.compose_file.stat().st_mode) == 0o600
    project = yaml.safe_load(paths.compose_file.read_text())
    assert "worker" not in project["services"]
    assert project["networks"]["claw-runs-t"]["internal"] is True
    assert "claw-runs-t" in project["services"]["cllama"]["networks"]
    assert "x-claw" not in project["services"]["ticket-api"]
    assert result.compiled.spec.tool_services[0].endpoint == "http://ticket-api:8080"
    assert SECRET not in paths.compose_file.read_text()


@pytest.mark.parametrize(
    ("claw_type", "volumes", "home", "fragment"),
    [
        ("oneshot", ("/data",), False, "declares VOLUME /data"),
        (None, (), False, "does not say its runner type; set CLAW_TYPE"),
        ("hermes", (), False, "the stateless profile supports the one-shot runner only, not hermes"),
        ("oneshot", (), True, "the task-home profile supports the Hermes runner only, not oneshot"),
        ("picoclaw", (), False, "is a PicoClaw runner (CLAW_TYPE picoclaw), which clawstack does not run"),
    ],
)
def test_compose_image_rules(
    tmp_path: Path, claw_type: str | None, volumes: tuple[str, ...], home: bool, fragment: str
) -> None:
    pod = compose_pod(tmp_path, home=home)
    with pytest.raises(BackendError) as info:
        up(pod, detach=False, environ={}, inspector=inspector(claw_type, volumes))
    assert fragment in info.value.message
    assert not (pod / ".claw-runs").exists()


def test_a_compose_task_home_template_pins_its_forwarder_and_meter_image(tmp_path: Path) -> None:
    from clawstack.pod.imagebuild import WORKER_IMAGE

    pod = compose_pod(tmp_path, home=True)
    seen: list[str] = []

    def inspect(reference: str) -> ImageInfo:
        seen.append(reference)
        kind = "oneshot" if reference == WORKER_IMAGE else "hermes"
        digit = "b" if reference == WORKER_IMAGE else "a"
        return ImageInfo(reference, "sha256:" + digit * 64, kind, (), None, None, None)

    result = up(pod, detach=False, environ={}, inspector=inspect)
    runner = result.compiled.templates[0].document["runner"]
    assert runner == {
        "image": "acme/worker:1",
        "image_id": "sha256:" + "a" * 64,
        "type": "hermes",
        "helper_image_id": "sha256:" + "b" * 64,
    }
    assert WORKER_IMAGE in seen


def test_a_compose_task_home_template_without_clawstacks_worker_image_is_refused(tmp_path: Path) -> None:
    from clawstack.pod.imagebuild import WORKER_IMAGE

    pod = compose_pod(tmp_path, home=True)

    def inspect(reference: str) -> ImageInfo:
        if reference == WORKER_IMAGE:
            raise BackendError(f"no image {reference}", code="image_not_found")
        return ImageInfo(reference, "sha256:" + "a" * 64, "hermes", (), None, None, None)

    with pytest.raises(BackendError) as info:
        up(pod, detach=False, environ={}, inspector=inspect)
    assert info.value.code == "image_not_found"
    assert "run claw images build" in info.value.message
    assert not (pod / ".claw-runs").exists()
