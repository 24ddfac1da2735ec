"""Read-only inspection of local Docker images, for the compose backend.

``claw up`` under the compose backend pins a per-run template to the image ID it will run, reads the runner type
the image declares, and rejects an image that declares ``VOLUME``. All of that is a read of the local engine's
image store: this module asks the engine for an image's configuration and nothing else. It never pulls (no
registry is reachable from a pod's host, and a pull would change what a template pins behind the operator's
back), never builds, and never creates a container; ``docker compose`` is the only lifecycle writer.

Every failure leaves as :class:`~clawstack.pod.errors.BackendError` with one of these codes:

``docker_unavailable``  no engine answers (not installed, not started, no access to its socket)
``image_not_found``     the engine answers but has no such image; clawstack never pulls, so build or load it
``image_invalid``       the reference is not a well-formed image reference
``backend_unavailable`` the engine answered the inspection with an unexpected error

Docker SDK exceptions are translated here, at the boundary, and never leak to callers.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from clawstack.pod.errors import BackendError

__all__ = ["CLAW_TYPE_ENV", "CLAW_TYPE_LABEL", "ClientFactory", "ImageInfo", "docker_available", "inspect_image"]

CLAW_TYPE_ENV = "CLAW_TYPE"
"""The environment variable in an image's configuration that names its runner type."""

CLAW_TYPE_LABEL = "claw.type"
"""The image label that names its runner type when the environment does not."""

_DEFAULT_HOST = "unix:///var/run/docker.sock"
# Inspection is one small local request: an engine that takes longer than this is not usable for `claw up`.
_TIMEOUT_S = 30
_START_HINT = "start a Docker engine (in a clawstack checkout, as root: scripts/docker-up) or set DOCKER_HOST to one"

# The reference grammar of the Docker distribution project: [domain[:port]/]path[/path...][:tag][@digest].
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)
_IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}", re.ASCII)
_NAME_MAX = 255
_REFERENCE_MAX = 600  # a 255-byte name, a 128-byte tag and a sha512 digest fit; longer is not worth matching

ClientFactory = Callable[[], "docker.DockerClient"]
"""Makes a Docker SDK client; the caller closes it."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the local engine says about one image, as far as a per-run template needs it.

    ``claw_type`` is the image's runner type: the ``CLAW_TYPE`` environment variable of the image configuration,
    or else its ``claw.type`` label. When both are set the environment variable wins, because it is what the
    runner inside the container actually sees. An empty value counts as unset.
    """

    reference: str
    """The reference as the pod wrote it, e.g. ``my-worker:latest``."""
    image_id: str
    """The local image ID (``sha256:…``): what a template pins."""
    claw_type: str | None
    volumes: tuple[str, ...]
    """Paths the image declares with ``VOLUME``, sorted."""
    user: str | None
    entrypoint: tuple[str, ...] | None
    cmd: tuple[str, ...] | None


def _default_client() -> docker.DockerClient:
    host = _docker_host()
    if host.startswith("unix://"):
        # The SDK leaks its socket when a Unix connect fails, so an absent engine is detected here first.
        path = host.removeprefix("unix://")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(_TIMEOUT_S)
            try:
                probe.connect(path)
            except OSError as error:
                raise OSError(error.errno, f"cannot connect to {path}: {error.strerror or error}") from error
    return docker.from_env(timeout=_TIMEOUT_S)


def _docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or _DEFAULT_HOST


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def docker_available(client_factory: ClientFactory = _default_client) -> str | None:
    """Whether a Docker engine answers: ``None`` when it does, else a one-line reason saying how to start one.

    ``client_factory`` makes the client to ask (default: the engine ``DOCKER_HOST`` names, or the local socket).
    Never raises for an absent or broken engine; that is what the reason is for.
    """
    try:
        client = client_factory()
    except (docker.errors.DockerException, OSError) as error:
        return f"no Docker engine answers at {_docker_host()} ({_one_line(error)}); {_START_HINT}"
    try:
        client.ping()
    except (docker.errors.DockerException, OSError) as error:
        return f"the Docker engine at {_docker_host()} does not answer ({_one_line(error)}); {_START_HINT}"
    finally:
        client.close()
    return None


def _check_reference(reference: str) -> None:
    match = _REFERENCE.fullmatch(reference) if len(reference) <= _REFERENCE_MAX else None
    if match is None or len(match.group("name")) > _NAME_MAX:
        shown = reference if len(reference) <= 200 else reference[:197] + "..."
        raise BackendError(
            f"{shown!r} is not a valid image reference: expected [registry/]name[:tag][@digest] "
            "with a lowercase name (for example my-worker:latest)",
            code="image_invalid",
        )


def inspect_image(reference: str, *, client: docker.DockerClient | None = None) -> ImageInfo:
    """Read the local image ``reference`` (a name, ``name:tag``, ``name@digest`` or an image ID); never pulls.

    ``client`` is used as given and left open; without one, a client for the engine ``DOCKER_HOST`` names (or
    the local socket) is made and closed here. Raises :class:`BackendError` with code ``image_invalid``,
    ``docker_unavailable``, ``image_not_found`` or ``backend_unavailable`` (see the module docstring).
    """
    _check_reference(reference)
    own_client = client is None
    if client is None:
        try:
            client = _default_client()
        except (docker.errors.DockerException, OSError) as error:
            raise BackendError(
                f"cannot inspect image {reference!r}: no Docker engine answers at {_docker_host()} "
                f"({_one_line(error)}); {_START_HINT}",
                code="docker_unavailable",
            ) from error
    try:
        attrs = client.api.inspect_image(reference)
    except docker.errors.ImageNotFound as error:
        build = "docker build -t NAME …" if _IMAGE_ID.fullmatch(reference) else f"docker build -t {reference} …"
        raise BackendError(
            f"image {reference!r} is not in the local Docker engine, and clawstack never pulls: build it "
            f"({build}) or load it (docker load -i image.tar), then run claw up again",
            code="image_not_found",
        ) from error
    except docker.errors.APIError as error:
        if error.status_code == 400:
            raise BackendError(
                f"the Docker engine rejects {reference!r} as an image reference: {_one_line(error)}",
                code="image_invalid",
            ) from error
        raise BackendError(
            f"the Docker engine failed to inspect image {reference!r}: {_one_line(error)}",
        ) from error
    except (docker.errors.DockerException, OSError) as error:
        raise BackendError(
            f"cannot inspect image {reference!r}: the Docker engine at {_docker_host()} did not answer "
            f"({_one_line(error)}); {_START_HINT}",
            code="docker_unavailable",
        ) from error
    finally:
        if own_client:
            client.close()
    return _image_info(reference, attrs)


def _image_info(reference: str, attrs: Mapping[str, Any]) -> ImageInfo:
    config: Mapping[str, Any] = attrs.get("Config") or {}
    env: dict[str, str] = {}
    for entry in config.get("Env") or ():
        name, sep, value = str(entry).partition("=")
        if sep:
            env[name] = value
    labels: Mapping[str, Any] = config.get("Labels") or {}
    claw_type = env.get(CLAW_TYPE_ENV) or str(labels.get(CLAW_TYPE_LABEL) or "") or None
    return ImageInfo(
        reference=reference,
        image_id=str(attrs["Id"]),
        claw_type=claw_type,
        volumes=tuple(sorted(str(path) for path in config.get("Volumes") or {})),
        user=str(config.get("User") or "") or None,
        entrypoint=_argv(config.get("Entrypoint")),
        cmd=_argv(config.get("Cmd")),
    )


def _argv(value: object) -> tuple[str, ...] | None:
    # The engine reports exec-form lists; an old image may carry a bare string.
    if isinstance(value, list):
        return tuple(str(part) for part in value)
    if isinstance(value, str) and value:
        return (value,)
    return None
