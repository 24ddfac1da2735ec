"""clawstack.pod.images: read-only inspection of local images, against a real engine where one is needed.

Tests marked ``docker`` load tiny images into the local engine (tests/docker_images.py) and record every HTTP
request the Docker client sends, so "never pulls, never creates" is checked on the wire, not assumed. The rest
need no engine: reference validation, an unreachable engine, and the translation of engine errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from clawstack.pod.errors import BackendError
from clawstack.pod.images import ImageInfo, docker_available, inspect_image
from tests.docker_images import (
    LocalImages,
    build_test_image,
    docker_client,
    remove_test_image,
    requires_docker,
    unique_tag,
)

DIGEST = "sha256:" + "ab" * 32


# -- no engine needed ---------------------------------------------------------------------------------------------


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """DOCKER_HOST pointing at a Unix socket that does not exist."""
    host = f"unix://{tmp_path}/absent.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    return host


MALFORMED = [
    "",
    " ",
    "my-worker:latest ",
    "UPPER:latest",
    "Worker",
    "a b",
    "name:",
    ":tag",
    "name:-tag",
    "name:" + "t" * 129,
    "name@sha256:abc",
    "name@" + "ab" * 32,
    "/leading",
    "trailing/",
    "a//b",
    "../escape",
    "a/../b",
    "-name",
    "name-",
    "a..b",
    "name:tag:tag",
    "na\nme",
    "name\x00",
    "wörker",
    "name:täg",
    "my-worker:latest\n",
    "n" * 256,
    "localhost:port/name",
    "x" * 700,
]

WELL_FORMED = [
    "my-worker",
    "my-worker:latest",
    "a__b.c-d:v1.2_3",
    "team/worker:1.0",
    "localhost:5000/team/worker:1.0",
    "registry.example.com/a/b@" + DIGEST,
    "registry.example.com/a/b:tag@" + DIGEST,
    "[::1]:5000/worker",
    DIGEST,
    "0123456789ab",
]


@pytest.mark.parametrize("reference", MALFORMED)
def test_malformed_reference_is_image_invalid_before_any_engine_contact(no_engine: str, reference: str) -> None:
    with pytest.raises(BackendError) as caught:
        inspect_image(reference)
    assert caught.value.code == "image_invalid"
    assert "not a valid image reference" in caught.value.message
    assert "\n" not in caught.value.message


def test_image_invalid_message_shortens_a_huge_reference(no_engine: str) -> None:
    with pytest.raises(BackendError) as caught:
        inspect_image("x" * 100_000)
    assert len(caught.value.message) < 400


@pytest.mark.parametrize("reference", WELL_FORMED)
def test_well_formed_reference_reaches_the_engine(no_engine: str, reference: str) -> None:
    with pytest.raises(BackendError) as caught:
        inspect_image(reference)
    assert caught.value.code == "docker_unavailable"
    assert no_engine in caught.value.message
    assert "scripts/docker-up" in caught.value.message
    assert isinstance(caught.value.__cause__, OSError)
    assert "absent.sock" in caught.value.message


def test_docker_available_names_an_unreachable_socket(no_engine: str) -> None:
    reason = docker_available()
    assert reason is not None
    assert no_engine in reason
    assert "No such file or directory" in reason
    assert "scripts/docker-up" in reason
    assert "\n" not in reason


def test_docker_available_names_a_refusing_tcp_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")  # loopback port 1: nothing listens, refused at once
    reason = docker_available()
    assert reason is not None
    assert "tcp://127.0.0.1:1" in reason
    with pytest.raises(BackendError) as caught:
        inspect_image("my-worker:latest")
    assert caught.value.code == "docker_unavailable"
    assert isinstance(caught.value.__cause__, docker.errors.DockerException)


@dataclass
class FakeAPI:
    """Stands in for the engine's answer to one inspection; these tests are about what happens to that answer."""

    answer: dict[str, Any] | None = None
    error: Exception | None = None
    asked: list[str] = field(default_factory=list)

    def inspect_image(self, reference: str) -> dict[str, Any]:
        self.asked.append(reference)
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


@dataclass
class FakeClient:
    api: FakeAPI
    closed: bool = False
    ping_error: Exception | None = None

    def ping(self) -> bool:
        if self.ping_error is not None:
            raise self.ping_error
        return True

    def close(self) -> None:
        self.closed = True


def test_docker_available_reports_a_failed_ping_and_closes_the_client() -> None:
    client = FakeClient(FakeAPI(), ping_error=requests.exceptions.ConnectionError("connection reset"))
    reason = docker_available(lambda: client)
    assert reason is not None
    assert "does not answer" in reason
    assert "connection reset" in reason
    assert client.closed


def test_docker_available_is_none_when_the_ping_answers() -> None:
    client = FakeClient(FakeAPI())
    assert docker_available(lambda: client) is None
    assert client.closed


ENGINE_ERRORS = [
    (docker.errors.ImageNotFound("No such image"), "image_not_found"),
    (docker.errors.APIError("invalid reference format", response=None), "backend_unavailable"),
    (requests.exceptions.ConnectionError("connection aborted"), "docker_unavailable"),
    (requests.exceptions.ReadTimeout("read timed out"), "docker_unavailable"),
    (docker.errors.DockerException("engine went away"), "docker_unavailable"),
]


@pytest.mark.parametrize(("error", "code"), ENGINE_ERRORS, ids=[code for _, code in ENGINE_ERRORS])
def test_engine_errors_are_translated_with_their_cause(error: Exception, code: str) -> None:
    client = FakeClient(FakeAPI(error=error))
    with pytest.raises(BackendError) as caught:
        inspect_image("my-worker:latest", client=client)
    assert caught.value.code == code
    assert caught.value.__cause__ is error
    assert not client.closed, "a client passed in belongs to the caller"


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.reason = "Bad Request"
        self.url = "http+docker://localhost/v1.41/images/my-worker:latest/json"


def test_engine_rejecting_a_reference_is_image_invalid() -> None:
    error = docker.errors.APIError("invalid reference format", response=_Response(400))
    with pytest.raises(BackendError) as caught:
        inspect_image("my-worker:latest", client=FakeClient(FakeAPI(error=error)))
    assert caught.value.code == "image_invalid"


CONFIGS = [
    ({"Env": ["CLAW_TYPE=", "PATH=/bin"], "Labels": {"claw.type": "hermes"}}, "hermes"),
    ({"Env": ["CLAW_TYPE=oneshot"], "Labels": {"claw.type": ""}}, "oneshot"),
    ({"Env": None, "Labels": None}, None),
    ({"Env": ["NOEQUALS", "CLAW_TYPE"], "Labels": {}}, None),
    ({}, None),
]


@pytest.mark.parametrize(("config", "claw_type"), CONFIGS)
def test_claw_type_edge_cases(config: dict[str, Any], claw_type: str | None) -> None:
    client = FakeClient(FakeAPI(answer={"Id": DIGEST, "Config": config}))
    assert inspect_image("my-worker", client=client).claw_type == claw_type


def test_empty_and_string_forms_of_user_entrypoint_and_cmd() -> None:
    answer = {"Id": DIGEST, "Config": {"User": "", "Entrypoint": "/run.sh", "Cmd": None, "Volumes": None}}
    info = inspect_image("my-worker", client=FakeClient(FakeAPI(answer=answer)))
    assert (info.user, info.entrypoint, info.cmd, info.volumes) == (None, ("/run.sh",), None, ())


def test_image_info_is_frozen() -> None:
    info = ImageInfo("w", DIGEST, None, (), None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.claw_type = "oneshot"  # type: ignore[misc]


@given(st.text(max_size=80))
def test_any_text_is_rejected_or_only_read(reference: str) -> None:
    api = FakeAPI(error=docker.errors.ImageNotFound("No such image"))
    with pytest.raises(BackendError) as caught:
        inspect_image(reference, client=FakeClient(api))
    assert caught.value.code in {"image_invalid", "image_not_found"}
    assert api.asked == ([reference] if caught.value.code == "image_not_found" else [])


# -- against the local engine -------------------------------------------------------------------------------------


@dataclass
class Engine:
    """A real client for the local engine, with every request it sends recorded as ``(method, path)``."""

    client: docker.DockerClient
    sent: list[tuple[str, str]]

    def assert_only_reads(self) -> None:
        assert self.sent, "the client sent nothing"
        assert {method for method, _ in self.sent} == {"GET"}, self.sent
        assert not [path for _, path in self.sent if "/images/create" in path], "something asked for a pull"


@pytest.fixture
def images() -> Iterator[LocalImages]:
    with LocalImages() as built:
        yield built


@pytest.fixture
def engine() -> Iterator[Engine]:
    client = docker_client()
    sent: list[tuple[str, str]] = []

    def record(response: requests.Response, *args: object, **kwargs: object) -> None:
        sent.append((str(response.request.method), str(response.request.path_url)))

    client.api.hooks["response"].append(record)
    try:
        yield Engine(client, sent)
    finally:
        client.close()


@requires_docker
class TestWithEngine:
    def test_docker_available_is_none(self) -> None:
        assert docker_available() is None

    def test_claw_type_from_environment(self, images: LocalImages, engine: Engine) -> None:
        tag, image_id = images.build("env", env={"CLAW_TYPE": "oneshot", "PATH": "/bin"})
        info = inspect_image(tag, client=engine.client)
        assert info == ImageInfo(tag, image_id, "oneshot", (), None, None, None)
        assert image_id.startswith("sha256:")
        engine.assert_only_reads()

    def test_claw_type_from_label_only(self, images: LocalImages, engine: Engine) -> None:
        tag, _ = images.build("label", labels={"claw.type": "hermes", "other": "x"})
        assert inspect_image(tag, client=engine.client).claw_type == "hermes"
        engine.assert_only_reads()

    def test_environment_wins_over_label(self, images: LocalImages) -> None:
        tag, _ = images.build("both", env={"CLAW_TYPE": "oneshot"}, labels={"claw.type": "hermes"})
        assert inspect_image(tag).claw_type == "oneshot"

    def test_no_claw_type(self, images: LocalImages) -> None:
        tag, _ = images.build("none", env={"OTHER": "1"}, labels={"claw.kind": "x"})
        assert inspect_image(tag).claw_type is None

    def test_declared_volumes_are_sorted(self, images: LocalImages) -> None:
        tag, _ = images.build("volumes", volumes=["/var/data", "/home/task", "/cache"])
        assert inspect_image(tag).volumes == ("/cache", "/home/task", "/var/data")

    def test_user_entrypoint_and_cmd(self, images: LocalImages) -> None:
        tag, _ = images.build("argv", user="1000:1000", entrypoint=["/bin/run", "--once"], cmd=["task text"])
        info = inspect_image(tag)
        assert (info.user, info.entrypoint, info.cmd) == ("1000:1000", ("/bin/run", "--once"), ("task text",))

    def test_inspect_by_image_id_keeps_the_reference_given(self, images: LocalImages, engine: Engine) -> None:
        _, image_id = images.build("by-id", env={"CLAW_TYPE": "oneshot"})
        info = inspect_image(image_id, client=engine.client)
        assert (info.reference, info.image_id, info.claw_type) == (image_id, image_id, "oneshot")
        engine.assert_only_reads()

    def test_retagged_reference_resolves_to_the_new_image(self, images: LocalImages) -> None:
        tag, first = images.build("retag", env={"CLAW_TYPE": "oneshot"})
        try:
            second = build_test_image(tag, env={"CLAW_TYPE": "hermes"})
            assert second != first
            info = inspect_image(tag)
            assert (info.image_id, info.claw_type) == (second, "hermes")
        finally:
            remove_test_image(first)  # no longer tagged, so the fixture would not remove it

    @pytest.mark.parametrize("missing", ["never-built", "with-digest", "image-id"])
    def test_missing_image_is_not_found_and_nothing_is_pulled(self, engine: Engine, missing: str) -> None:
        name = unique_tag("missing")
        reference = {"never-built": name, "with-digest": f"{name.split(':')[0]}@{DIGEST}", "image-id": DIGEST}[missing]
        before = {image.id for image in engine.client.images.list(all=True)}
        containers_before = engine.client.containers.list(all=True)
        engine.sent.clear()
        with pytest.raises(BackendError) as caught:
            inspect_image(reference, client=engine.client)
        assert caught.value.code == "image_not_found"
        assert "never pulls" in caught.value.message
        assert "docker load" in caught.value.message
        assert isinstance(caught.value.__cause__, docker.errors.ImageNotFound)
        engine.assert_only_reads()
        with pytest.raises(docker.errors.ImageNotFound):
            engine.client.images.get(reference)
        assert {image.id for image in engine.client.images.list(all=True)} == before
        assert engine.client.containers.list(all=True) == containers_before
