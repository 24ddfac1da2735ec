"""``claw images build`` against a real Docker engine: three local images, no registry, no shell, idempotent."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import docker
import docker.errors
import pytest
from click.testing import CliRunner

from clawstack.cli import cli
from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild import (
    BASE_IMAGE,
    CONTEXT_DIGEST_LABEL,
    HERMES_IMAGE,
    PROXY_IMAGE,
    SITE_DIR,
    WORKER_IMAGE,
    BuiltImage,
    build_images,
    docker_build,
)
from clawstack.pod.images import inspect_image
from clawstack.worker.container import WRAPPER_ENTRYPOINT
from clawstack.worker.contract import ExitCode
from tests.docker_images import docker_client, requires_docker, unique_tag

pytestmark = requires_docker.marks

CONFINED = [
    "--rm",
    "--user",
    "65534:65534",
    "--read-only",
    "--tmpfs",
    "/tmp",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--network",
    "none",
]


@pytest.fixture(scope="module")
def built() -> dict[str, BuiltImage]:
    lines: list[str] = []
    images = build_images(progress=lines.append)
    assert lines, "a person waiting sees progress"
    return {image.name: image for image in images}


def run(image: str, *argv: str, entrypoint: str | None = None, options: Sequence[str] = CONFINED) -> str:
    command = ["docker", "run", *options]
    if entrypoint is not None:
        command += ["--entrypoint", entrypoint]
    result = subprocess.run([*command, image, *argv], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_all_four_are_built_or_up_to_date(built: dict[str, BuiltImage]) -> None:
    assert [(image.name, image.tag) for image in built.values()] == [
        ("base", BASE_IMAGE),
        ("proxy", PROXY_IMAGE),
        ("worker", WORKER_IMAGE),
        ("hermes", HERMES_IMAGE),
    ]
    for image in built.values():
        assert image.image_id.startswith("sha256:")
        assert inspect_image(image.tag).image_id == image.image_id
        assert image.line().endswith(f" {image.tag} {image.image_id}")


def test_a_second_build_is_up_to_date_with_the_same_ids(built: dict[str, BuiltImage]) -> None:
    again = build_images()
    assert [(image.status, image.image_id) for image in again] == [
        ("up_to_date", image.image_id) for image in built.values()
    ]
    assert [image.context_digest for image in again] == [image.context_digest for image in built.values()]


def test_the_cli_prints_one_line_per_image(built: dict[str, BuiltImage]) -> None:
    result = CliRunner().invoke(cli, ["images", "build", "--only", "worker"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"up to date {BASE_IMAGE} {built['base'].image_id}",
        f"up to date {WORKER_IMAGE} {built['worker'].image_id}",
    ]
    as_json = CliRunner().invoke(cli, ["images", "build", "--json"])
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    assert [(entry["tag"], entry["image_id"], entry["status"]) for entry in document] == [
        (image.tag, image.image_id, "up_to_date") for image in built.values()
    ]


def test_each_image_carries_its_context_digest(built: dict[str, BuiltImage]) -> None:
    client = docker_client()
    try:
        for image in built.values():
            labels = client.api.inspect_image(image.tag)["Config"]["Labels"]
            assert labels[CONTEXT_DIGEST_LABEL] == image.context_digest
            assert labels["claw.role"] == image.name
    finally:
        client.close()


def test_the_base_has_no_shell_and_runs_python_confined(built: dict[str, BuiltImage]) -> None:
    result = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "/bin/sh", BASE_IMAGE, "-c", "true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "/bin/sh" in result.stderr
    out = run(
        BASE_IMAGE,
        "-c",
        "import os, pwd, ssl, sqlite3, sys, zlib; print(os.getuid(), pwd.getpwuid(os.getuid()).pw_name, sys.prefix)",
        entrypoint="python3",
    )
    assert out.split() == ["65534", "nobody", "/opt/python"]


@pytest.mark.parametrize("image", [PROXY_IMAGE, WORKER_IMAGE])
def test_the_runtime_dependencies_import_confined(built: dict[str, BuiltImage], image: str) -> None:
    code = "import clawstack.worker.oneshot, aiohttp, pydantic, yaml, clawstack; print(clawstack.__file__)"
    out = run(image, "-c", code, entrypoint="python3")
    assert out.strip() == f"{SITE_DIR}/clawstack/__init__.py"
    dev = "import importlib.util as u; print([m for m in ('pytest', 'mypy', 'hypothesis', 'ruff') if u.find_spec(m)])"
    missing = run(image, "-c", dev, entrypoint="python3")
    assert missing.strip() == "[]"


def test_the_worker_is_a_oneshot_image_without_volumes(built: dict[str, BuiltImage]) -> None:
    info = inspect_image(WORKER_IMAGE)
    assert info.claw_type == "oneshot"
    assert info.volumes == ()
    assert info.entrypoint == ("python3", "-m", "clawstack.worker.oneshot")


def test_the_proxy_runs_the_claw_command_tree(built: dict[str, BuiltImage]) -> None:
    info = inspect_image(PROXY_IMAGE)
    assert info.entrypoint == ("python3", "-m", "clawstack")
    assert info.cmd == ("proxy", "serve", "--config", "/claw/proxy/proxy.json")
    assert "Usage: python -m clawstack" in run(PROXY_IMAGE, "--help")


def test_the_proxy_and_worker_share_their_site_layer(built: dict[str, BuiltImage]) -> None:
    client = docker_client()
    try:
        layers = {name: client.api.inspect_image(image.tag)["RootFS"]["Layers"] for name, image in built.items()}
    finally:
        client.close()
    base = layers["base"]
    assert layers["proxy"][: len(base)] == base
    assert layers["proxy"] == layers["worker"]  # the libraries and site layers; the rest is configuration


def test_a_failed_build_names_the_cause_in_one_error(tmp_path: Path) -> None:
    (tmp_path / "broken.Dockerfile").write_text("FROM scratch\nCOPY absent-file /\n")
    tag = unique_tag("broken")
    with pytest.raises(BackendError) as info:
        docker_build(tmp_path, "broken.Dockerfile", tag=tag)
    assert info.value.code == "image_build_failed"
    assert "absent-file" in info.value.message
    assert "\n" not in info.value.message
    client = docker_client()
    try:
        with pytest.raises(docker.errors.ImageNotFound):
            client.api.inspect_image(tag)
    finally:
        client.close()


def test_the_worker_honours_the_compose_wrapper_entrypoint(built: dict[str, BuiltImage]) -> None:
    # Without its configuration the wrapper stops with the runner's usage status before any work starts.
    entrypoint, *argv = WRAPPER_ENTRYPOINT
    result = subprocess.run(
        ["docker", "run", *CONFINED, "--entrypoint", entrypoint, WORKER_IMAGE, *argv, "a task"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == int(ExitCode.USAGE), result.stderr
    assert "claw-wrapper: usage: claw-wrapper TASK" in result.stderr


def test_the_hermes_image_carries_the_pinned_hermes_a_shell_and_the_wrapper(built: dict[str, BuiltImage]) -> None:
    from clawstack.pod.hermes import VERSION

    probe = (
        "import importlib.metadata as m, site, sys; site.addsitedir('/opt/hermes/site'); "
        "print(m.version('hermes-agent'))"
    )
    assert run(HERMES_IMAGE, "-c", probe, entrypoint="python3").strip() == VERSION
    assert run(HERMES_IMAGE, "-c", "echo $((6 * 7)) | tr 4 x", entrypoint="bash").strip() == "x2"
    # Without a task the wrapper reports worker_usage, with its exit 2, and nothing else.
    result = subprocess.run(
        ["docker", "run", *CONFINED, HERMES_IMAGE], capture_output=True, text=True, timeout=120, check=False
    )
    assert (result.returncode, result.stdout) == (2, "claw-home-failure worker_usage\n")
    client = docker_client()
    try:
        attrs = client.api.inspect_image(HERMES_IMAGE)["Config"]
    finally:
        client.close()
    assert "CLAW_TYPE=hermes" in attrs["Env"]
    assert attrs["Labels"]["claw.type"] == "hermes"
