"""``claw up`` and ``claw down``: compile a pod, write it, and start or stop its long-lived part.

Both take the pod lock first and refuse while another holder (the supervisor, another ``claw up``) has it.
``claw up`` also refuses while any run is unfinished, because it would rotate ``.claw-runtime`` and recreate the
proxy under live workers. It is idempotent: when nothing compiled differs and the pod's proxy is healthy, it
restarts nothing. Nothing is written unless the whole pod compiled.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clawstack.common.files import write_private
from clawstack.pod.artifacts import PodPaths, write_pod
from clawstack.pod.compile import CompiledPod, ImageInspector, compile_pod
from clawstack.pod.compose import render_compose
from clawstack.pod.errors import BackendError, PodError
from clawstack.pod.images import inspect_image
from clawstack.pod.localproxy import LocalProxy
from clawstack.pod.lock import PodLock
from clawstack.pod.podfile import load_pod

UnfinishedRuns = Callable[[PodPaths], int]


@dataclass(frozen=True, slots=True)
class UpResult:
    compiled: CompiledPod
    changed: bool  # whether anything was (re)written or (re)started
    proxy_pid: int | None


def _no_runs(paths: PodPaths) -> int:
    return 0


def compile_only(
    pod_dir: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    inspector: ImageInspector = inspect_image,
) -> CompiledPod:
    """Load and compile a pod without writing anything (``claw up --check``)."""
    return compile_pod(load_pod(pod_dir, environ=environ), inspector=inspector)


def up(
    pod_dir: str | os.PathLike[str],
    *,
    detach: bool = True,
    environ: Mapping[str, str] | None = None,
    inspector: ImageInspector = inspect_image,
    unfinished_runs: UnfinishedRuns = _no_runs,
) -> UpResult:
    """Compile and write the pod; with ``detach``, make its proxy run (local) or its project run (compose)."""
    paths = PodPaths(Path(pod_dir).resolve())
    compiled = compile_only(paths.pod, environ=environ, inspector=inspector)  # reads only: nothing written if invalid
    with PodLock(paths.lock, holder="claw up"):
        pending = unfinished_runs(paths)
        if pending:
            raise PodError(
                f"{pending} run(s) are unfinished; claw up would rotate the proxy under live workers. "
                "Let them finish or cancel them, stop the supervisor, then run claw up",
                code="runs_unfinished",
            )
        if compiled.spec.backend == "compose":
            write_pod(compiled, paths)
            write_private(paths.compose_file, render_compose(compiled, paths))
            if detach:
                _compose(paths, "up", "-d", "--remove-orphans")
            return UpResult(compiled=compiled, changed=True, proxy_pid=None)
        proxy = LocalProxy(paths)
        current = proxy.running()
        if current is not None and current.digest == compiled.digest and proxy.healthy():
            return UpResult(compiled=compiled, changed=False, proxy_pid=current.pid)
        if current is not None:
            proxy.stop()
        write_pod(compiled, paths)
        if not detach:
            return UpResult(compiled=compiled, changed=True, proxy_pid=None)
        started = proxy.start(digest=compiled.digest)
        return UpResult(compiled=compiled, changed=True, proxy_pid=started.pid)


CancelRuns = Callable[[PodPaths], list[str]]
ProxyStopped = Callable[[PodPaths, list[str]], None]


def down(
    pod_dir: str | os.PathLike[str],
    *,
    cancel_runs: CancelRuns | None = None,
    after_proxy_stopped: ProxyStopped | None = None,
) -> bool:
    """Stop the pod's long-lived part; return whether something was running. Homes and revocations stay.

    ``cancel_runs`` (under the pod lock, before anything stops) cancels every unfinished run and returns those
    whose revocation the proxy could not acknowledge; once the proxy is verified stopped, ``after_proxy_stopped``
    ends them with ``revocation_proof: proxy_stopped``.
    """
    paths = PodPaths(Path(pod_dir).resolve())
    with PodLock(paths.lock, holder="claw down"):
        awaiting = cancel_runs(paths) if cancel_runs is not None else []
        if paths.compose_file.exists():
            _compose(paths, "down", "--remove-orphans")
            stopped = True
        else:
            proxy = LocalProxy(paths)
            stopped = proxy.stop()
            if proxy.running() is not None:
                raise BackendError("the proxy is still running after claw down", code="proxy_stop_failed")
        if awaiting and after_proxy_stopped is not None:
            after_proxy_stopped(paths, awaiting)
        return stopped


def _compose(paths: PodPaths, *args: str) -> None:
    try:
        done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            ["docker", "compose", "-f", str(paths.compose_file), *args],  # noqa: S607 (docker from PATH)
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"docker compose could not run: {exc}", code="docker_unavailable") from exc
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise BackendError(f"docker compose {args[0]} failed: {' / '.join(tail)}", code="compose_failed")


__all__ = ["UpResult", "compile_only", "down", "up"]
