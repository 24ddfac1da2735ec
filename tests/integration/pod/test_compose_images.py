"""``claw up`` under the compose backend against a real Docker engine: images built locally, never pulled."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawstack.pod.errors import BackendError
from clawstack.pod.up import up
from clawstack.worker.container import wrapper_digest
from tests.docker_images import LocalImages, requires_docker

pytestmark = [*requires_docker.marks, pytest.mark.usefixtures("clawstack_images")]  # claw up pins the proxy image

PODS = Path(__file__).resolve().parents[2] / "pods"


def compose_pod(tmp_path: Path, image: str, *, home: bool = False) -> Path:
    pod = tmp_path / "pod"
    shutil.copytree(PODS / "base", pod)
    document: dict[str, Any] = yaml.safe_load((PODS / "base" / "claw-pod.yml").read_text())
    document["x-claw"]["backend"] = "compose"
    worker = document["services"]["worker"]
    worker["image"] = image
    if home:
        worker["x-claw"]["run"] = {"home": {}}
    (pod / "claw-pod.yml").write_text(yaml.safe_dump(document))
    return pod


@pytest.fixture
def images() -> Any:
    with LocalImages() as built:
        yield built


def test_the_template_pins_the_local_image_id(tmp_path: Path, images: LocalImages) -> None:
    tag, image_id = images.build("worker", env={"CLAW_TYPE": "oneshot"})
    result = up(compose_pod(tmp_path, tag), detach=False, environ={})
    runner = result.compiled.templates[0].document["runner"]
    assert runner == {"image": tag, "image_id": image_id, "type": "oneshot", "wrapper": wrapper_digest()}


def test_an_image_with_a_volume_is_refused(tmp_path: Path, images: LocalImages) -> None:
    tag, _ = images.build("worker", env={"CLAW_TYPE": "oneshot"}, volumes=["/data"])
    pod = compose_pod(tmp_path, tag)
    with pytest.raises(BackendError) as info:
        up(pod, detach=False, environ={})
    assert f"the image {tag} declares VOLUME /data" in info.value.message
    assert not (pod / ".claw-runs").exists()


def test_the_runner_type_must_fit_the_profile(tmp_path: Path, images: LocalImages) -> None:
    tag, _ = images.build("hermes", labels={"claw.type": "hermes"})
    with pytest.raises(BackendError) as info:
        up(compose_pod(tmp_path, tag), detach=False, environ={})
    assert "the stateless profile supports the one-shot runner only, not hermes" in info.value.message
    result = up(compose_pod(tmp_path / "home", tag, home=True), detach=False, environ={})
    assert result.compiled.templates[0].document["profile"] == "task_home"


def test_a_missing_image_is_never_pulled(tmp_path: Path) -> None:
    pod = compose_pod(tmp_path, "clawstack-test/never-built:1")
    with pytest.raises(BackendError) as info:
        up(pod, detach=False, environ={})
    assert info.value.code == "image_not_found"
    assert "never pulls" in info.value.message
