"""The images clawstack builds for the compose backend, without a registry (see ``claw images build``).

Four images, all built locally by ``docker build`` from Dockerfiles shipped in this package
(``clawstack/pod/dockerfiles/``); nothing is ever pulled:

``clawstack/base:<version>``    ``FROM scratch``: the host interpreter (``sys.base_prefix``) at ``/opt/python``,
                                its shared libraries, CA bundle, ``/etc/passwd``; no shell
                                (:mod:`clawstack.pod.imagebuild_rootfs`)
``clawstack/proxy:<version>``   base + clawstack and its runtime dependency closure at ``/opt/clawstack/site``;
                                runs ``python3 -m clawstack proxy serve --config /claw/proxy/proxy.json``
``clawstack/worker:<version>``  base + the same site directory (a shared layer); ``CLAW_TYPE=oneshot``, runs
                                ``python3 -m clawstack.worker.oneshot`` (:mod:`clawstack.pod.imagebuild_site`)
``clawstack/hermes:<version>``  worker + the pinned Hermes installation and a shell with the usual tools;
                                ``CLAW_TYPE=hermes``, runs ``python3 -m clawstack.worker.hermes``
                                (:mod:`clawstack.pod.imagebuild_hermes`); needs ``scripts/hermes-up``

:func:`build_images` assembles each build context in a private temporary directory and labels the image with
the digest of that context (:data:`CONTEXT_DIGEST_LABEL`); a tag that already carries the digest is up to date
and not rebuilt. The proxy's and worker's digests include the base's image ID, so a rebuilt base rebuilds them.

Every failure leaves as :class:`~clawstack.pod.errors.BackendError` with one of these codes:

``docker_unavailable``   no engine answers, or the ``docker`` CLI is missing
``image_build_failed``   ``docker build`` failed or timed out (the message ends with the last lines it printed)
``rootfs_failed``        the base's root filesystem cannot be assembled from the host interpreter
``dependency_missing``   a runtime dependency of clawstack is not installed in this environment
``requirement_invalid``  an installed distribution's requirement metadata cannot be parsed
``backend_unavailable``  the engine answered an image inspection with an unexpected error
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.resources
import os
import py_compile
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

import docker
import docker.errors

from clawstack import __version__
from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild_hermes import copy_site, hermes_pin_parts, tools_layout
from clawstack.pod.imagebuild_rootfs import (
    IMAGE_PREFIX,
    RootfsLayout,
    base_rootfs,
    file_digest,
    host_interpreter,
    shared_libraries,
)
from clawstack.pod.imagebuild_site import populate_site, runtime_closure
from clawstack.pod.images import docker_available

BASE_IMAGE: Final = f"clawstack/base:{__version__}"
PROXY_IMAGE: Final = f"clawstack/proxy:{__version__}"
WORKER_IMAGE: Final = f"clawstack/worker:{__version__}"
HERMES_IMAGE: Final = f"clawstack/hermes:{__version__}"

ImageName = Literal["base", "proxy", "worker", "hermes"]
"""Which of the four images."""

IMAGE_NAMES: Final[tuple[ImageName, ...]] = get_args(ImageName)
"""Every image, in build order."""

IMAGE_TAGS: Final[Mapping[ImageName, str]] = {
    "base": BASE_IMAGE,
    "proxy": PROXY_IMAGE,
    "worker": WORKER_IMAGE,
    "hermes": HERMES_IMAGE,
}

CONTEXT_DIGEST_LABEL: Final = "claw.context-digest"
"""The label holding the digest of the build context an image was built from."""

SITE_DIR: Final = "/opt/clawstack/site"
"""Where clawstack and its runtime dependencies live in the proxy and worker images (their ``PYTHONPATH``)."""

INTERPRETER: Final = f"{IMAGE_PREFIX}/bin/python3"
"""The interpreter in every image (``python3`` on ``PATH``)."""

BUILD_TIMEOUT_S: Final = 600
"""How long one ``docker build`` may take."""

Progress = Callable[[str], None]
"""Receives one line per step, for a person waiting."""

_OUTPUT_TAIL_LINES: Final = 15
_INSPECT_TIMEOUT_S: Final = 30
_DOCKERFILES: Final[Mapping[ImageName, str]] = {
    "base": "base.Dockerfile",
    "proxy": "proxy.Dockerfile",
    "worker": "worker.Dockerfile",
    "hermes": "hermes.Dockerfile",
}

__all__ = [
    "BASE_IMAGE",
    "BUILD_TIMEOUT_S",
    "CONTEXT_DIGEST_LABEL",
    "HERMES_IMAGE",
    "IMAGE_NAMES",
    "IMAGE_TAGS",
    "INTERPRETER",
    "PROXY_IMAGE",
    "SITE_DIR",
    "WORKER_IMAGE",
    "BuiltImage",
    "ImageName",
    "Progress",
    "build_images",
    "docker_build",
    "dockerfile",
]


@dataclass(frozen=True, slots=True)
class BuiltImage:
    """One image :func:`build_images` built or found up to date."""

    name: ImageName
    tag: str
    """``clawstack/<name>:<version>``."""
    image_id: str
    """``sha256:…``."""
    status: Literal["built", "up_to_date"]
    context_digest: str
    """``sha256:…`` of the build context, the value of the :data:`CONTEXT_DIGEST_LABEL` label."""
    size_bytes: int
    seconds: float
    """Time spent on this image: assembling its context (the base's), checking and building it."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``claw images build --json`` prints."""
        return {
            "name": self.name,
            "tag": self.tag,
            "image_id": self.image_id,
            "status": self.status,
            "context_digest": self.context_digest,
            "size_bytes": self.size_bytes,
            "seconds": round(self.seconds, 3),
        }

    def line(self) -> str:
        """``built clawstack/proxy:0.1.0 sha256:…`` or ``up to date clawstack/proxy:0.1.0 sha256:…``."""
        return f"{'built' if self.status == 'built' else 'up to date'} {self.tag} {self.image_id}"


def dockerfile(name: ImageName) -> bytes:
    """The shipped Dockerfile of image ``name``."""
    resource = importlib.resources.files("clawstack.pod").joinpath("dockerfiles", _DOCKERFILES[name])
    return resource.read_bytes()


def _digest(parts: Sequence[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for key, value in parts:
        digest.update(f"{key}\0{value}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def _tree_digest(root: Path, files: Sequence[Path]) -> str:
    return _digest(
        [(f"{path.as_posix()}:{oct((root / path).stat().st_mode & 0o111)}", file_digest(root / path)) for path in files]
    )


class _Engine:
    """The ``docker`` CLI (builds) and SDK client (reads) of one :func:`build_images` call."""

    def __init__(self, docker_cli: str, progress: Progress) -> None:
        executable = shutil.which(docker_cli)
        if executable is None:
            raise BackendError(
                f"the docker CLI ({docker_cli}) is not on PATH; claw images build runs docker build "
                "(in a clawstack checkout, as root: scripts/docker-up)",
                code="docker_unavailable",
            )
        reason = docker_available()
        if reason is not None:
            raise BackendError(f"cannot build images: {reason}", code="docker_unavailable")
        self._cli = executable
        self._progress = progress
        try:
            self._client = docker.from_env(timeout=_INSPECT_TIMEOUT_S)
        except docker.errors.DockerException as error:
            raise BackendError(f"cannot build images: {error}", code="docker_unavailable") from error

    def close(self) -> None:
        self._client.close()

    def inspect(self, reference: str) -> Mapping[str, Any] | None:
        try:
            attrs: Mapping[str, Any] = self._client.api.inspect_image(reference)
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.DockerException, OSError) as error:
            raise BackendError(f"the Docker engine failed to inspect image {reference!r}: {error}") from error
        return attrs

    def ensure(
        self,
        name: ImageName,
        context: Path,
        digest: str,
        started: float,
        build_args: Mapping[str, str],
        prepare: Callable[[], None] | None = None,
    ) -> BuiltImage:
        """Build ``name`` from ``context`` unless its tag already carries ``digest``; ``prepare`` completes the
        context first, only when a build is needed."""
        tag = IMAGE_TAGS[name]
        attrs = self.inspect(tag)
        labels: Mapping[str, str] = ((attrs or {}).get("Config") or {}).get("Labels") or {}
        status: Literal["built", "up_to_date"] = "up_to_date"
        if attrs is None or labels.get(CONTEXT_DIGEST_LABEL) != digest:
            self._progress(f"building {tag}")
            if prepare is not None:
                prepare()
            docker_build(
                context,
                _DOCKERFILES[name],
                tag=tag,
                labels={CONTEXT_DIGEST_LABEL: digest},
                build_args=build_args,
                docker_cli=self._cli,
            )
            attrs = self.inspect(tag)
            if attrs is None:
                raise BackendError(
                    f"docker build reported success but {tag} is not in the engine", code="image_build_failed"
                )
            status = "built"
        return BuiltImage(
            name, tag, str(attrs["Id"]), status, digest, int(attrs.get("Size") or 0), time.monotonic() - started
        )


def docker_build(
    context: Path,
    dockerfile_name: str,
    *,
    tag: str,
    labels: Mapping[str, str] | None = None,
    build_args: Mapping[str, str] | None = None,
    docker_cli: str = "docker",
    timeout_s: float = BUILD_TIMEOUT_S,
) -> None:
    """Run ``docker build`` of ``context`` with its file ``dockerfile_name``, tagging the result ``tag``.

    Uses the classic builder, which resolves ``FROM`` against the local image store only and never pulls.
    Raises :class:`BackendError`: ``image_build_failed`` (with the last lines of the build's output) when the
    build fails or outlasts ``timeout_s``, ``docker_unavailable`` when ``docker_cli`` cannot be run.
    """
    command = [docker_cli, "build", "--force-rm", "--tag", tag, "--file", str(context / dockerfile_name)]
    for key, value in sorted((labels or {}).items()):
        command += ["--label", f"{key}={value}"]
    for key, value in sorted((build_args or {}).items()):
        command += ["--build-arg", f"{key}={value}"]
    command.append(str(context))
    # BuildKit may ask a registry about a FROM image; the classic builder only looks in the local store.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    try:
        result = subprocess.run(  # noqa: S603 - the docker CLI with arguments built here
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise BackendError(
            f"docker build of {tag} did not finish within {timeout_s:g} s", code="image_build_failed"
        ) from error
    except OSError as error:
        raise BackendError(f"cannot run {docker_cli}: {error}", code="docker_unavailable") from error
    if result.returncode != 0:
        output = result.stdout.decode("utf-8", "replace").splitlines()
        lines = [line.strip() for line in output if line.strip()][-_OUTPUT_TAIL_LINES:]
        tail = " | ".join(lines) or "no output"
        raise BackendError(
            f"docker build of {tag} failed (exit {result.returncode}): {tail}", code="image_build_failed"
        )


def _write_dockerfile(context: Path, name: ImageName) -> str:
    data = dockerfile(name)
    (context / _DOCKERFILES[name]).write_bytes(data)
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _base_context(context: Path, progress: Progress) -> tuple[str, RootfsLayout]:
    interpreter = host_interpreter()
    progress(f"assembling the root filesystem of {BASE_IMAGE} from {interpreter.prefix}")
    context.mkdir(mode=0o700)
    layout = base_rootfs(interpreter)
    rootfs_digest = layout.write_tar(context / "rootfs.tar")
    dockerfile_digest = _write_dockerfile(context, "base")
    return _digest([("Dockerfile", dockerfile_digest), ("rootfs.tar", rootfs_digest)]), layout


def _compile_site(site: Path) -> None:
    """Byte-code for the site, compiled here because the images have no shell and run with a read-only root:
    without it every worker would compile clawstack and its dependencies again at each start (about half a
    second). Checked against its source's hash, not its mtime (the copies carry a fixed mtime), and shown with
    its path in the image. It is left out of the context digest: only the sources decide a rebuild."""
    compiled = compileall.compile_dir(
        site,
        ddir=SITE_DIR,
        quiet=2,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        workers=1,
    )
    if not compiled:
        raise BackendError("the site directory did not compile to byte code", code="image_build_failed")


def _app_context(context: Path, base: RootfsLayout, progress: Progress) -> str:
    """The proxy's and worker's shared context; returns the digest of what they share (site and libraries)."""
    distributions = runtime_closure()
    progress(f"assembling the site directory: clawstack and {len(distributions) - 1} runtime dependencies")
    context.mkdir(mode=0o700)
    files = populate_site(context / "site", distributions)
    _compile_site(context / "site")
    sources = {Path(str(d.locate_file(""))).resolve() for d in distributions}
    extensions = [context / "site" / path for path in files if ".so" in path.suffixes]
    extra = RootfsLayout()
    for library in shared_libraries(extensions):
        resolved = Path(library).resolve()
        if not any(resolved.is_relative_to(source) for source in sources):
            extra.add_host_path(library)
    libs_digest = extra.write_tar(context / "libs.tar", exclude=base.paths())
    return _digest([("site", _tree_digest(context / "site", files)), ("libs.tar", libs_digest)])


def _hermes(engine: _Engine, context: Path, base: RootfsLayout, worker: BuiltImage, progress: Progress) -> BuiltImage:
    started = time.monotonic()
    progress("assembling the Hermes image's tools")
    context.mkdir(mode=0o700)
    tools_digest = tools_layout(base.paths()).write_tar(context / "tools.tar", exclude=base.paths())
    digest = _digest(
        [
            ("Dockerfile", _write_dockerfile(context, "hermes")),
            ("tools.tar", tools_digest),
            *hermes_pin_parts(),
            ("worker", worker.image_id),
        ]
    )
    return engine.ensure(
        "hermes", context, digest, started, {"WORKER_IMAGE": worker.image_id}, prepare=lambda: copy_site(context)
    )


def _selection(only: Collection[ImageName] | None) -> tuple[ImageName, ...]:
    if only is None:
        return IMAGE_NAMES
    unknown = sorted(set(only) - set(IMAGE_NAMES))
    if unknown:
        raise ValueError(f"unknown image name(s) {', '.join(map(repr, unknown))}; expected {IMAGE_NAMES}")
    wanted = set(only) | {"base"}  # every image is built on the base, so the base is brought up to date too
    if "hermes" in wanted:
        wanted.add("worker")  # the Hermes image is built on the worker
    return tuple(name for name in IMAGE_NAMES if name in wanted)


def build_images(
    only: Collection[ImageName] | None = None,
    *,
    progress: Progress | None = None,
    docker_cli: str = "docker",
) -> list[BuiltImage]:
    """Build the images in ``only`` (default: all four) and the images they are built on, skipping those up to
    date.

    Returns one :class:`BuiltImage` per image, in build order (base, proxy, worker, hermes). ``progress`` receives a
    line per step. ``docker_cli`` is the ``docker`` executable to run. Raises :class:`BackendError` (see the
    module docstring for the codes) and ``ValueError`` for an unknown name in ``only``.
    """
    selection = _selection(only)
    say: Progress = progress or (lambda _line: None)
    engine = _Engine(docker_cli, say)
    results: list[BuiltImage] = []
    try:
        with tempfile.TemporaryDirectory(prefix="claw-images-") as scratch:
            started = time.monotonic()
            base_digest, base_layout = _base_context(Path(scratch) / "base", say)
            base = engine.ensure("base", Path(scratch) / "base", base_digest, started, {})
            results.append(base)
            dependents = [name for name in selection if name not in ("base", "hermes")]
            if dependents:
                started = time.monotonic()
                app = Path(scratch) / "app"
                shared_digest = _app_context(app, base_layout, say)
                for name in dependents:
                    digest = _digest(
                        [
                            ("Dockerfile", _write_dockerfile(app, name)),
                            ("shared", shared_digest),
                            ("base", base.image_id),
                        ]
                    )
                    results.append(engine.ensure(name, app, digest, started, {"BASE_IMAGE": base.image_id}))
                    started = time.monotonic()
            if "hermes" in selection:
                worker = next(image for image in results if image.name == "worker")
                results.append(_hermes(engine, Path(scratch) / "hermes", base_layout, worker, say))
    finally:
        engine.close()
    return results
