"""The build context of ``clawstack/hermes:<version>``, the task-home worker image for the compose backend.

It is ``clawstack/worker`` plus:

* the pinned Hermes installation's site directory (:mod:`clawstack.pod.hermes`, built on this host with the same
  interpreter the images carry) at :data:`HERMES_SITE`, copied in as it is;
* ``tools.tar``: a shell and the usual command-line tools with their shared libraries, for Hermes's terminal tool
  (the base image has no shell of its own).

Its context digest is the Hermes pin (version and ``RECORD`` digest), the tools' digest and the worker image's
ID, so the site (a few hundred megabytes) is copied into a context only when the image must be built.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Final

from clawstack.pod.errors import BackendError
from clawstack.pod.hermes import hermes_installation
from clawstack.pod.imagebuild_rootfs import RootfsLayout, shared_libraries

HERMES_SITE: Final = "/opt/hermes/site"
"""Where the Hermes site directory is in the image (``CLAW_HERMES_SITE``)."""

TOOLS: Final = (
    "bash", "sh", "ls", "cat", "head", "tail", "mkdir", "rmdir", "rm", "cp", "mv", "ln", "wc", "grep", "sed",
    "find", "xargs", "env", "sort", "uniq", "cut", "tr", "tee", "touch", "chmod", "printf", "echo", "test", "[",
    "date", "stat", "uname", "basename", "dirname", "readlink", "realpath", "sleep", "true", "false", "pwd", "id",
    "diff", "du", "df", "od", "md5sum", "sha256sum", "base64", "seq", "expr", "tar", "gzip", "which", "timeout",
)  # fmt: skip
"""The commands the image gives Hermes's terminal tool, from this host's ``/usr/bin``."""


def tools_layout(exclude: frozenset[str]) -> RootfsLayout:
    """The tools and every shared library they need that the base (``exclude``) does not have already."""
    layout = RootfsLayout()
    binaries = []
    for name in TOOLS:
        path = shutil.which(name, path="/usr/bin:/bin")
        if path is None:
            raise BackendError(f"the host has no {name} to put in the Hermes image", code="rootfs_failed")
        binaries.append(Path(path))
        layout.add_host_path(path)
    for library in shared_libraries(binaries, strict=True):
        if library not in exclude:
            layout.add_host_path(library)
    if not Path("/bin").is_symlink():
        raise BackendError("the host's /bin is not merged into /usr/bin", code="rootfs_failed")
    layout.add_symlink("/bin", "usr/bin")
    return layout


def hermes_pin_parts() -> list[tuple[str, str]]:
    """What decides the image besides its tools and the worker image: the pinned Hermes installation."""
    found = hermes_installation()
    return [("hermes-version", found.version), ("hermes-record", found.record_sha256)]


def copy_site(context: Path) -> None:
    """The Hermes site directory into ``context/hermes`` (only when the image is built)."""
    shutil.copytree(hermes_installation().site, context / "hermes", symlinks=True)


__all__ = ["HERMES_SITE", "TOOLS", "copy_site", "hermes_pin_parts", "tools_layout"]
