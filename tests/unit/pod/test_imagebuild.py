"""``claw images build`` without an engine, and the Dockerfiles it ships."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from clawstack import __version__
from clawstack.cli import cli
from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild import (
    BASE_IMAGE,
    HERMES_IMAGE,
    IMAGE_NAMES,
    IMAGE_TAGS,
    PROXY_IMAGE,
    WORKER_IMAGE,
    build_images,
    dockerfile,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_image_names_carry_the_version() -> None:
    assert IMAGE_NAMES == ("base", "proxy", "worker", "hermes")
    assert dict(IMAGE_TAGS) == {
        "base": BASE_IMAGE,
        "proxy": PROXY_IMAGE,
        "worker": WORKER_IMAGE,
        "hermes": HERMES_IMAGE,
    }
    assert BASE_IMAGE.rpartition(":")[2] == __version__


def test_the_dockerfiles_never_name_a_registry_image() -> None:
    froms = {
        name: [line for line in dockerfile(name).decode().splitlines() if line.startswith("FROM")]
        for name in IMAGE_NAMES
    }
    assert froms == {
        "base": ["FROM scratch"],
        "proxy": ["FROM ${BASE_IMAGE}"],
        "worker": ["FROM ${BASE_IMAGE}"],
        "hermes": ["FROM ${WORKER_IMAGE}"],
    }
    hermes = dockerfile("hermes").decode()
    assert "CLAW_TYPE=hermes" in hermes
    assert "VOLUME" not in hermes
    assert 'ENTRYPOINT ["python3", "-m", "clawstack.worker.hermes"]' in hermes
    worker = dockerfile("worker").decode()
    assert "ENV CLAW_TYPE=oneshot" in worker
    assert "VOLUME" not in worker
    assert 'ENTRYPOINT ["python3", "-m", "clawstack.worker.oneshot"]' in worker


def test_the_dockerfiles_are_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["clawstack"]
    for name in IMAGE_NAMES:
        path = f"pod/dockerfiles/{name}.Dockerfile"
        assert (ROOT / "src" / "clawstack" / path).is_file()
        assert any(fnmatch.fnmatch(path, pattern) for pattern in patterns), path


def test_an_unknown_image_name_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="unknown image name"):
        build_images(only=["nginx"])  # type: ignore[list-item]


def test_no_engine_is_one_line_with_a_stable_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/absent.sock")
    with pytest.raises(BackendError) as info:
        build_images()
    assert info.value.code == "docker_unavailable"
    result = CliRunner().invoke(cli, ["images", "build"])
    assert result.exit_code == 1
    assert result.output.startswith(
        "Error: docker_unavailable: cannot build images: no Docker engine answers at unix://"
    )
    assert result.output.count("\n") == 1


def test_a_missing_docker_cli_is_docker_unavailable() -> None:
    with pytest.raises(BackendError) as info:
        build_images(docker_cli="/nonexistent/docker")
    assert info.value.code == "docker_unavailable"
    assert "not on PATH" in info.value.message


def test_only_accepts_the_three_names() -> None:
    result = CliRunner().invoke(cli, ["images", "build", "--only", "nginx"])
    assert result.exit_code == 2
    assert "'nginx' is not one of 'base', 'proxy', 'worker'" in result.output
