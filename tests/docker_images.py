"""Tiny Docker images for docker-marked tests, made locally without any registry.

No registry is reachable where clawstack is tested, and clawstack never pulls, so a test that needs an image makes
one here: an image archive (the ``docker save`` layout: ``manifest.json``, the image configuration, one layer tar)
is written in memory and handed to the engine's ``docker load``. That gives exact control over the configuration
(environment, labels, ``VOLUME``, user, entrypoint, command) with no Dockerfile quoting, no builder and no base
image. The same inputs give the same image ID, as a cached ``docker build`` would.

Use :data:`requires_docker` on every test that needs the engine: it adds the ``docker`` marker and skips the test
with the reason :func:`~clawstack.pod.images.docker_available` gives when no engine answers. Where an engine must
be there (CI, after ``scripts/docker-up``), set ``CLAWSTACK_REQUIRE_DOCKER=1``: the tests then run and fail
instead of skipping.

A test module builds images through :class:`LocalImages`, which removes everything it built when closed::

    @pytest.fixture
    def images() -> Iterator[LocalImages]:
        with LocalImages() as built:
            yield built
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, TypeVar, cast

import docker
import docker.errors
import pytest

from clawstack.pod.images import docker_available

__all__ = [
    "REQUIRE_DOCKER_ENV",
    "LocalImages",
    "build_test_image",
    "docker_client",
    "docker_unavailable_reason",
    "remove_test_image",
    "requires_docker",
    "unique_tag",
]

REQUIRE_DOCKER_ENV = "CLAWSTACK_REQUIRE_DOCKER"
"""Set to ``1`` where the engine must be present: docker-marked tests then fail rather than skip."""

_EPOCH = "1970-01-01T00:00:00Z"
_T = TypeVar("_T")


@functools.cache
def docker_unavailable_reason() -> str | None:
    """Why docker-marked tests cannot run here (``None`` when an engine answers); asked once per session."""
    return docker_available()


class _RequiresDocker:
    """The ``docker`` marker plus a skip that says why, as one decorator for a test function or class.

    For a whole module: ``pytestmark = requires_docker.marks``.
    """

    @property
    def marks(self) -> list[pytest.MarkDecorator]:
        marks = [pytest.mark.docker]
        if os.environ.get(REQUIRE_DOCKER_ENV) != "1":
            reason = docker_unavailable_reason()
            marks.append(pytest.mark.skipif(reason is not None, reason=f"needs a Docker engine: {reason}"))
        return marks

    def __call__(self, test: _T) -> _T:
        for mark in self.marks:
            test = cast(_T, mark(test))
        return test


requires_docker = _RequiresDocker()


def docker_client() -> docker.DockerClient:
    """A client for the local engine, or a RuntimeError that says why there is none; the caller closes it."""
    # Ask through clawstack first: it names the engine it tried, and the SDK alone leaks a socket when none answers.
    reason = docker_available()
    if reason is not None:
        raise RuntimeError(f"cannot reach the Docker engine: {reason}")
    return docker.from_env()


def unique_tag(name: str = "image") -> str:
    """A fresh ``clawstack-test/<name>-<random>:latest`` tag, so concurrent test runs never share an image."""
    return f"clawstack-test/{name}-{uuid.uuid4().hex[:12]}:latest"


def _tar(members: Mapping[str, bytes], *, executable: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        directories: set[str] = set()
        for name, data in sorted(members.items()):
            for parent in reversed(PurePosixPath(name).parents[:-1]):
                if str(parent) not in directories:
                    directories.add(str(parent))
                    info = tarfile.TarInfo(str(parent))
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if executable else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _layer_path(path: str) -> str:
    parts = PurePosixPath(path).parts
    relative = parts[1:] if parts[:1] == ("/",) else parts
    if not relative or any(part in ("..", ".") for part in relative):
        raise ValueError(f"not a plain file path for a test image: {path!r}")
    return "/".join(relative)


def build_test_image(
    tag: str,
    *,
    env: dict[str, str] | None = None,
    volumes: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    files: dict[str, bytes] | None = None,
    user: str | None = None,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
) -> str:
    """Load a one-layer image tagged ``tag`` into the local engine and return its image ID (``sha256:…``).

    ``env``, ``volumes``, ``labels``, ``user``, ``entrypoint`` and ``cmd`` become the image configuration exactly
    as given (``volumes`` as ``VOLUME`` paths). ``files`` maps absolute paths in the image to their contents,
    written executable. Nothing is pulled or built from a base image. Remove it with :func:`remove_test_image`.
    """
    layer = _tar({_layer_path(path): data for path, data in (files or {}).items()}, executable=True)
    client = docker_client()
    try:
        config: dict[str, Any] = {
            "Env": [f"{name}={value}" for name, value in (env or {}).items()],
            "Labels": dict(labels or {}),
            "Volumes": {path: {} for path in volumes},
            "User": user or "",
            "Entrypoint": list(entrypoint) if entrypoint is not None else None,
            "Cmd": list(cmd) if cmd is not None else None,
        }
        image_config = json.dumps(
            {
                "architecture": client.version().get("Arch", "amd64"),
                "os": "linux",
                "created": _EPOCH,
                "config": config,
                "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
                "history": [{"created": _EPOCH, "created_by": "tests/docker_images.py"}],
            },
            sort_keys=True,
        ).encode()
        config_name = f"{hashlib.sha256(image_config).hexdigest()}.json"
        manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]
        archive = _tar(
            {config_name: image_config, "layer/layer.tar": layer, "manifest.json": json.dumps(manifest).encode()}
        )
        client.images.load(archive)
        return str(client.api.inspect_image(tag)["Id"])
    finally:
        client.close()


def remove_test_image(reference: str) -> None:
    """Remove a tag (and its image, once no other tag names it) or an image ID; a missing one is not an error."""
    client = docker_client()
    try:
        client.api.remove_image(reference, force=True)
    except docker.errors.ImageNotFound:
        pass
    finally:
        client.close()


class LocalImages:
    """Builds test images and removes every one it built on :meth:`close` (also as a context manager)."""

    def __init__(self) -> None:
        self._tags: list[str] = []

    def build(self, name: str = "image", **config: Any) -> tuple[str, str]:
        """Build an image under a fresh tag (see :func:`build_test_image` for ``config``); returns (tag, ID)."""
        tag = unique_tag(name)
        image_id = build_test_image(tag, **config)
        self._tags.append(tag)
        return tag, image_id

    def close(self) -> None:
        """Remove every image built here, newest first."""
        while self._tags:
            remove_test_image(self._tags.pop())

    def __enter__(self) -> LocalImages:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
