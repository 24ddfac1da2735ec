"""``claw up`` and ``claw down``: compile a pod, write it, and start or stop its long-lived part.

Both take the pod lock first and refuse while another holder (the supervisor, another ``claw up``) has it; every
``docker compose`` they run inherits the lock, so a killed ``claw up``'s in-flight compose keeps writer authority.
``claw up`` also refuses while any run is unfinished, because it would rotate ``.claw-runtime`` and recreate the
proxy under live workers. It is idempotent: when nothing compiled differs and the pod's proxy is healthy (and,
under compose, the runs network guard is in place), it restarts nothing. Nothing is written unless the whole pod
compiled.

Under compose, ``claw up`` builds the per-run services that declare ``build:`` (``docker compose build`` from the
private project ``.claw-runs/build.compose.yml``), pins every image by ID, writes ``compose.generated.yml`` and
runs ``docker compose up -d --remove-orphans --pull never``; then it guards the runs network
(:mod:`clawstack.pod.netguard`) and waits for the operator API. ``claw down`` runs ``docker compose down`` and
verifies through the Docker SDK (reads only) that the pod's containers and its runs network are gone.

Errors (:class:`~clawstack.pod.errors.PodError` and subclasses), by code:

``runs_unfinished``       ``claw up`` while runs are unfinished
``pod_locked``            another process holds the pod lock
``image_not_found``       the proxy image (run ``claw images build``) or a per-run image is missing
``docker_unavailable``    no Docker engine answers, or ``docker compose`` cannot be run
``compose_failed``        ``docker compose build`` or ``up`` failed (the last lines of its stderr, credentials
                          scrubbed)
``proxy_start_failed``    the proxy did not become healthy in time
``network_guard_failed``  the runs network guard cannot be installed, verified or removed
``teardown_failed``       ``claw down`` cannot remove or verify the pod's containers and network, or run workers
                          remain; unfinished state is kept for recovery
``proxy_stop_failed``     the local proxy does not exit
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from clawstack.common.files import write_private
from clawstack.common.ids import new_secret
from clawstack.pod.artifacts import (
    OPERATOR_TOKEN_ENV,
    PodPaths,
    existing_operator_token,
    proxy_config_bytes,
    read_pod_manifest,
    write_pod,
)
from clawstack.pod.compile import CompiledPod, ImageInspector, compile_pod
from clawstack.pod.compose import (
    PROXY_IMAGE,
    PROXY_SERVICE,
    built_templates,
    render_build_project,
    render_compose,
)
from clawstack.pod.docker_state import leftover, network_exists, running_proxy
from clawstack.pod.errors import BackendError, PodError
from clawstack.pod.images import inspect_image
from clawstack.pod.localproxy import LocalProxy, operator_healthy, wait_for_operator_healthy
from clawstack.pod.lock import PodLock
from clawstack.pod.netguard import ensure_guard, guard_present, remove_guard, runs_network
from clawstack.pod.podfile import PodSpec, load_pod

COMPOSE_TIMEOUT_S: Final = 600
PROXY_START_TIMEOUT_S: Final = 30.0
DOWN_TIMEOUT_S: Final = 10

UnfinishedRuns = Callable[[PodPaths], int]
ComposeRunner = Callable[[Sequence[str], int | None], "subprocess.CompletedProcess[str]"]
"""Runs ``docker compose <argv>`` handing it the lock descriptor (``None``: none held); injectable for tests."""


@dataclass(frozen=True, slots=True)
class UpResult:
    compiled: CompiledPod
    changed: bool  # whether anything was (re)written or (re)started
    proxy_pid: int | None  # local backend
    proxy_container: str | None = None  # compose backend: the proxy container's ID


def _no_runs(paths: PodPaths) -> int:
    return 0


def run_compose(argv: Sequence[str], lock_fd: int | None) -> subprocess.CompletedProcess[str]:
    """``docker compose <argv>``, inheriting ``lock_fd`` (the default :data:`ComposeRunner`)."""
    env = {k: v for k, v in os.environ.items() if k != OPERATOR_TOKEN_ENV}
    return subprocess.run(  # noqa: S603 (fixed argv, no shell)
        ["docker", "compose", *argv],  # noqa: S607 (docker from PATH)
        capture_output=True,
        text=True,
        env=env,
        timeout=COMPOSE_TIMEOUT_S,
        check=False,
        pass_fds=() if lock_fd is None else (lock_fd,),
    )


def compile_only(
    pod_dir: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    inspector: ImageInspector = inspect_image,
) -> CompiledPod:
    """Load and compile a pod without building or writing anything (``claw up --check``)."""
    return compile_pod(load_pod(pod_dir, environ=environ), inspector=inspector)


def _refuse_unfinished(paths: PodPaths, unfinished_runs: UnfinishedRuns) -> None:
    pending = unfinished_runs(paths)
    if pending:
        raise PodError(
            f"{pending} run(s) are unfinished; claw up would rotate the proxy under live workers. "
            "Let them finish or cancel them, stop the supervisor, then run claw up",
            code="runs_unfinished",
        )


def up(
    pod_dir: str | os.PathLike[str],
    *,
    detach: bool = True,
    environ: Mapping[str, str] | None = None,
    inspector: ImageInspector = inspect_image,
    unfinished_runs: UnfinishedRuns = _no_runs,
    compose_runner: ComposeRunner = run_compose,
) -> UpResult:
    """Compile and write the pod; with ``detach``, make its proxy run (local) or its project run (compose)."""
    paths = PodPaths(Path(pod_dir).resolve())
    spec = load_pod(paths.pod, environ=environ)
    if spec.backend == "compose":
        return _up_compose(spec, paths, detach, inspector, unfinished_runs, compose_runner)
    compiled = compile_pod(spec, inspector=inspector)  # reads only: nothing written if invalid
    with PodLock(paths.lock, holder="claw up"):
        _refuse_unfinished(paths, unfinished_runs)
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


def _proxy_image_id(inspector: ImageInspector) -> str:
    try:
        return inspector(PROXY_IMAGE).image_id
    except BackendError as exc:
        if exc.code != "image_not_found":
            raise
        raise BackendError(
            f"the proxy image {PROXY_IMAGE} is not in the local Docker engine; run claw images build, then claw up",
            code="image_not_found",
        ) from exc


def _up_compose(
    spec: PodSpec,
    paths: PodPaths,
    detach: bool,
    inspector: ImageInspector,
    unfinished_runs: UnfinishedRuns,
    compose_runner: ComposeRunner,
) -> UpResult:
    to_build = built_templates(spec)
    # Without anything to build, compile (reads only) before the lock: an invalid pod writes nothing at all.
    compiled = None if to_build else compile_pod(spec, inspector=inspector)
    proxy_image_id = _proxy_image_id(inspector)
    lock = PodLock(paths.lock, holder="claw up")
    lock.acquire(inheritable=True)
    try:
        _refuse_unfinished(paths, unfinished_runs)
        token = existing_operator_token(paths) or new_secret(32)
        secrets = [token, *(v for t in spec.templates for v in t.cllama_env.values())]
        if compiled is None:
            write_private(paths.build_file, render_build_project(spec))
            names = [t.name for t in to_build]
            _compose(
                compose_runner,
                lock,
                ["-p", spec.name, "-f", str(paths.build_file), *_ENV, "build", *names],
                secrets,
                action="build",
            )
            compiled = compile_pod(spec, inspector=inspector)
        config = proxy_config_bytes(compiled, paths, token)
        config_digest = "sha256:" + hashlib.sha256(config + compiled.digest.encode()).hexdigest()
        user = f"{os.geteuid()}:{os.getegid()}"
        rendered = render_compose(
            compiled, paths, proxy_image_id=proxy_image_id, user=user, config_digest=config_digest
        )
        network = runs_network(spec.name)
        if detach and _read(paths.compose_file) == rendered:
            running = running_proxy(spec.name, config_digest)
            if running is not None and operator_healthy(paths) and guard_present(network):
                return UpResult(compiled=compiled, changed=False, proxy_pid=None, proxy_container=running)
        write_pod(compiled, paths, operator_token=token)
        write_private(paths.compose_file, rendered)
        if not detach:
            return UpResult(compiled=compiled, changed=True, proxy_pid=None)
        LocalProxy(paths).stop()  # a proxy this pod ran under the local backend would hold the same sockets
        _compose(
            compose_runner,
            lock,
            [*compose_project_argv(spec.name, paths), "up", "-d", "--remove-orphans", "--pull", "never"],
            secrets,
            action="up",
        )
        ensure_guard(network)
        if not wait_for_operator_healthy(paths, timeout_s=PROXY_START_TIMEOUT_S):
            raise BackendError(
                f"the proxy did not become healthy within {PROXY_START_TIMEOUT_S:g} s; see docker compose -p "
                f"{spec.name} -f {paths.compose_file} logs {PROXY_SERVICE}",
                code="proxy_start_failed",
            )
        return UpResult(
            compiled=compiled,
            changed=True,
            proxy_pid=None,
            proxy_container=running_proxy(spec.name, config_digest),
        )
    finally:
        lock.release()


CancelRuns = Callable[[PodPaths, int | None], list[str]]
"""``(paths, writer_lock_fd)``: the pod lock's descriptor, for the lifecycle subprocesses it runs."""
ProxyStopped = Callable[[PodPaths, list[str]], None]


def down(
    pod_dir: str | os.PathLike[str],
    *,
    cancel_runs: CancelRuns | None = None,
    after_proxy_stopped: ProxyStopped | None = None,
    compose_runner: ComposeRunner = run_compose,
) -> bool:
    """Stop the pod's long-lived part; return whether something was running. Homes and revocations stay.

    ``cancel_runs`` (under the pod lock, before anything stops, given the lock's descriptor for the lifecycle
    subprocesses it runs) cancels every unfinished run and returns those
    whose revocation the proxy could not acknowledge; once the proxy is verified stopped, ``after_proxy_stopped``
    ends them with ``revocation_proof: proxy_stopped``.
    """
    paths = PodPaths(Path(pod_dir).resolve())
    lock = PodLock(paths.lock, holder="claw down")
    lock.acquire(inheritable=True)
    try:
        awaiting = cancel_runs(paths, lock.fd) if cancel_runs is not None else []
        if paths.compose_file.exists():
            stopped = _down_compose(paths, lock, compose_runner)
        else:
            proxy = LocalProxy(paths)
            stopped = proxy.stop()
            if proxy.running() is not None:
                raise BackendError("the proxy is still running after claw down", code="proxy_stop_failed")
        if awaiting and after_proxy_stopped is not None:
            after_proxy_stopped(paths, awaiting)
        if paths.compose_file.exists():
            remove_guard(runs_network(_pod_name(paths)))
        return stopped
    finally:
        lock.release()


def _down_compose(paths: PodPaths, lock: PodLock, compose_runner: ComposeRunner) -> bool:
    pod = _pod_name(paths)
    workers = leftover(pod, runs_only=True)
    if workers:
        raise BackendError(
            f"run containers remain after cancelling the pod's runs: {', '.join(workers)}; their runs stay "
            "unfinished for recovery (claw runs doctor lists them)",
            code="teardown_failed",
        )
    existed = bool(leftover(pod))
    _compose(
        compose_runner,
        lock,
        [*compose_project_argv(pod, paths), "down", "--remove-orphans", "--timeout", str(DOWN_TIMEOUT_S)],
        _secrets_of(paths),
        action="down",
        code="teardown_failed",
    )
    remaining = leftover(pod)
    if remaining:
        raise BackendError(
            f"containers of the pod remain after docker compose down: {', '.join(remaining)}", code="teardown_failed"
        )
    if network_exists(runs_network(pod).name):
        raise BackendError(
            f"the runs network {runs_network(pod).name} remains after docker compose down", code="teardown_failed"
        )
    return existed


_ENV: Final = ("--env-file", os.devnull)  # the pod file is interpolated already: Compose reads no .env


def compose_project_argv(pod: str, paths: PodPaths) -> list[str]:
    """``docker compose`` arguments that address the pod's own project (its name, file, and no ``.env``)."""
    return ["-p", pod, "-f", str(paths.compose_file), *_ENV]


def _pod_name(paths: PodPaths) -> str:
    try:
        return read_pod_manifest(paths)["pod"]
    except PodError as exc:
        raise BackendError(
            "compose.generated.yml exists but the pod manifest .claw-runs/pod.json does not name the pod; "
            "run claw up first",
            code="teardown_failed",
        ) from exc


def _secrets_of(paths: PodPaths) -> list[str]:
    try:
        env = json.loads(paths.proxy_config.read_bytes()).get("env", {})
    except (OSError, ValueError, AttributeError):
        return []
    return [value for value in env.values() if isinstance(value, str)]


def _scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text


def _compose(
    runner: ComposeRunner,
    lock: PodLock,
    argv: Sequence[str],
    secrets: Iterable[str],
    *,
    action: str,
    code: str = "compose_failed",
) -> None:
    started = time.monotonic()
    try:
        done = runner(argv, lock.fd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(
            f"docker compose {action} could not run ({_scrub(str(exc), secrets)})",
            code="docker_unavailable" if code == "compose_failed" else code,
        ) from exc
    if done.returncode != 0:
        tail = _scrub(" / ".join(done.stderr.strip().splitlines()[-3:]), secrets)
        raise BackendError(
            f"docker compose {action} failed after {time.monotonic() - started:.1f} s: {tail}", code=code
        )


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


__all__ = ["ComposeRunner", "UpResult", "compile_only", "compose_project_argv", "down", "run_compose", "up"]
