"""The pinned wrapper that starts the one-shot runner inside a compose worker container.

The compose backend overrides the image's entrypoint with ``python3 -c WRAPPER_SOURCE``, the task following as
the one argument (so the wrapper sees ``sys.argv == ['-c', TASK]``). The wrapper takes the runner's configuration (the run's proxy credential included) out of :data:`CONFIG_ENV`, writes
it to a 0600 file in the container's tmpfs ``/tmp``, and replaces itself with the runner, whose environment no
longer carries the configuration; the runner reads and removes that file. The task is the one positional
argument, passed on as such. A template pins the wrapper by :func:`wrapper_digest`, so a template compiled with
one wrapper is refused at spawn by a supervisor that would run another.

An image of runner type ``oneshot`` honours this by having ``python3`` on ``PATH`` with clawstack importable
(``clawstack/worker``, built by ``claw images build``, and any image built ``FROM`` it).
"""

from __future__ import annotations

from typing import Final

from clawstack.common.digest import sha256_digest
from clawstack.worker.contract import CONFIG_ENV, CONFIG_FILE_ENV, ExitCode

CONTAINER_CONFIG_FILE: Final = "/tmp/claw-worker-config.json"  # noqa: S108 - the container's own tmpfs

WRAPPER_SOURCE: Final = f"""\
import os, sys
config = os.environ.pop({CONFIG_ENV!r}, "")
if len(sys.argv) != 2 or not sys.argv[1] or not config:
    sys.stderr.write("claw-wrapper: usage: claw-wrapper TASK, with the configuration in {CONFIG_ENV}\\n")
    sys.exit({int(ExitCode.USAGE)})
fd = os.open({CONTAINER_CONFIG_FILE!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
os.write(fd, config.encode("utf-8", "surrogateescape"))
os.close(fd)
del config
env = dict(os.environ)
env[{CONFIG_FILE_ENV!r}] = {CONTAINER_CONFIG_FILE!r}
os.execve(sys.executable, [sys.executable, "-m", "clawstack.worker.oneshot", "--", sys.argv[1]], env)
"""
"""The wrapper, run as ``python3 -c WRAPPER_SOURCE TASK``."""

WRAPPER_ENTRYPOINT: Final = ("python3", "-c", WRAPPER_SOURCE)
"""The entrypoint a compose worker runs; the task follows as the one argument (the Compose ``command``)."""


def wrapper_digest() -> str:
    """``sha256:…`` of :data:`WRAPPER_SOURCE`: what a compose template's ``runner.wrapper`` pins."""
    return sha256_digest(WRAPPER_SOURCE.encode())


__all__ = ["CONTAINER_CONFIG_FILE", "WRAPPER_ENTRYPOINT", "WRAPPER_SOURCE", "wrapper_digest"]
