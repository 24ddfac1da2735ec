"""The Docker Compose backend: each run is its own Compose project holding one hardened worker container.

``docker compose`` is the only lifecycle writer (``up`` to start a run's worker, ``down`` to remove it); the
Docker SDK is used for reads only (a worker's state, exit code and bounded stdout, and the scan for every worker
of the pod). Everything this backend writes lives in the run's directory, ``<state_dir>/<installation>/<run_id>/``
(0700):

* ``lock``: taken (``flock``) by ``spawn`` and ``remove``, so no two callers ever start or remove one run's worker
  at once;
* ``project.yml`` (0600): the rendered project. It holds placeholders only (``${CLAW_RUN_TASK}``,
  ``${CLAW_RUN_CONFIG}``): the task and the runner's configuration (the run's proxy credential included) reach the
  container by Compose interpolation at ``compose up``, from the environment of that one subprocess;
* ``config.secret`` (0600): that configuration, kept so that an interrupted ``up`` can be repeated after a restart.

The worker container runs the template's pinned image by ID (checked before ``up`` and again on the created
container: anything else is ``image_mismatch``), with the entrypoint replaced by the pinned wrapper
(:mod:`clawstack.worker.container`) and the task as its one argument; as ``init`` with uid 65534, a read-only root,
``cap_drop: [ALL]``, ``no-new-privileges``, memory (no swap) and pids limits, a tmpfs ``/tmp`` and no other
writable path, no bind mount, no volume, no Docker socket, no host namespace, and only the pod's runs network,
whose traffic to the host itself is dropped (:mod:`clawstack.pod.netguard`, ensured before every spawn). Its
stdout is bounded by the json-file log driver (two files of at most a few times ``max_output_bytes`` each), and
read back through the SDK up to ``max_output_bytes``.

Workers carry the labels ``claw.pod``, ``claw.installation``, ``claw.run_id`` and ``claw.role=worker``, which is
how a restarted supervisor finds (and adopts) them and how orphans are found.

Errors::

    ClawError                        (clawstack.common.errors)
     └── ComposeBackendError         backend_error
          │                          labels_invalid     installation or run_id outside their patterns
          │                          spec_invalid       a limit out of range, no pinned image
          │                          docker_unavailable the engine does not answer (retryable)
          │                          compose_failed     docker compose exited non-zero (retryable)
          │                          remove_timeout     a container still carries the run's labels (retryable)
          └── SpawnError             spawn_failed       the worker could not be started
                                     image_mismatch     the pinned image is absent, or another one was started
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import docker
import docker.errors

from clawstack.common.files import ensure_private_dir, fsync_dir, write_private
from clawstack.pod.netguard import RunsNetwork
from clawstack.runs.backends.base import (
    INVALID_MEASURE,
    METER_OUT_DIR,
    METER_RECORD,
    Isolation,
    IsolationReport,
    MeterVerdict,
    RunLabels,
    WorkerSpec,
    WorkerState,
    check_content,
    check_labels,
    check_limits,
    fresh_meter_out,
    meter_seq,
    meter_verdict,
)
from clawstack.runs.backends.compose_home import ENFORCED as HOME_ENFORCED
from clawstack.runs.backends.compose_home import FORWARDER_URL, home_network, render_home_project
from clawstack.runs.backends.compose_project import (
    CONFIG_VARIABLE,
    CONTAINER_ENFORCED,
    LABEL_INSTALLATION,
    LABEL_OUTPUT,
    LABEL_POD,
    LABEL_ROLE,
    LABEL_RUN,
    TASK_VARIABLE,
    WORKER_UID,
    ComposeBackendError,
    SpawnError,
    project_name,
    render_project,
)
from clawstack.runs.backends.monitor import RecordInvalid, read_json
from clawstack.worker.container import wrapper_digest
from clawstack.worker.contract import WorkerConfigError, parse_worker_config

DEFAULT_TMP_BYTES: Final = 64 * 1024 * 1024
UP_TIMEOUT_S: Final = 120.0
DOWN_TIMEOUT_S: Final = 60.0
WATCH_INTERVAL_S: Final = 0.1
"""Each look at a running worker is two Docker API reads, so this is longer than the local backend's."""
ENFORCED: Final = (*CONTAINER_ENFORCED, "no_mounts", "runs_network_only", "host_input_dropped")
"""What every stateless compose worker is held to (``isolation.enforced`` in a run's status)."""

_PROJECT_FILE: Final = "project.yml"  # not a name Compose picks up by itself from its working directory
_CONFIG_SECRET: Final = "config.secret"  # noqa: S105 - a file name
_LOCK_FILE: Final = "lock"
COMPOSE_PROJECT_LABEL: Final = "com.docker.compose.project"
"""The label Compose puts on every container it creates: the project that container belongs to."""
_PROJECT_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,127}")
_SDK_TIMEOUT_S: Final = 30

ClientFactory = Callable[[], "docker.DockerClient"]
Guard = Callable[[], None]


def _default_client() -> docker.DockerClient:
    return docker.from_env(timeout=_SDK_TIMEOUT_S, max_pool_size=32)


def _no_guard() -> None:
    return None


def _no_home_guard(network: RunsNetwork) -> None:
    return None


class ComposeBackend:
    """Workers as one-container Compose projects; see the module docstring.

    ``state_dir`` holds one directory per run. ``pod`` is the pod's name (its labels); ``network`` is the pod's
    runs network (``claw-runs-<pod>``), made by ``claw up``; ``proxy_url`` is the proxy's worker API on it.
    ``guard`` makes sure traffic from the runs network to the host is dropped; it is called before every spawn
    and raises when it cannot be. ``client_factory`` makes the Docker SDK client (reads only); ``compose`` is the
    command that runs Docker Compose.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        pod: str,
        network: str,
        proxy_url: str,
        guard: Guard = _no_guard,
        client_factory: ClientFactory = _default_client,
        compose: Sequence[str] = ("docker", "compose"),
        tmp_bytes: int = DEFAULT_TMP_BYTES,
        up_timeout_s: float = UP_TIMEOUT_S,
        down_timeout_s: float = DOWN_TIMEOUT_S,
        home_guard: Callable[[RunsNetwork], None] = _no_home_guard,
        home_unguard: Callable[[RunsNetwork], None] = _no_home_guard,
        meter_interval_s: float = 1.0,
    ) -> None:
        self._state_dir = Path(state_dir)
        self._pod = pod
        self._network = network
        self._proxy_url = proxy_url
        self._guard = guard
        self._client_factory = client_factory
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()
        self._closed = False
        self._compose = tuple(compose)
        self._tmp_bytes = tmp_bytes
        self._up_timeout_s = up_timeout_s
        self._down_timeout_s = down_timeout_s
        self._containers: dict[RunLabels, str] = {}  # a run's container id, once seen (ids never change)
        self._home_guard = home_guard
        self._home_unguard = home_unguard
        self._meter_interval_s = meter_interval_s

    @property
    def name(self) -> Literal["compose"]:
        return "compose"

    @property
    def isolation(self) -> Isolation:
        return "container"

    @property
    def isolation_report(self) -> IsolationReport:
        return {"backend": "compose", "mechanism": "container", "enforced": list(ENFORCED)}

    @property
    def home_isolation_report(self) -> IsolationReport:
        """What a task-home worker is held to: its home and read-only content its only mounts, its own network
        its only network (:mod:`.compose_home`)."""
        return {"backend": "compose", "mechanism": "container", "enforced": list(HOME_ENFORCED)}

    @property
    def watch_interval_s(self) -> float:
        return WATCH_INTERVAL_S

    @property
    def model_endpoint(self) -> Mapping[str, str]:
        return {"model_base_url": self._proxy_url}

    def run_dir(self, labels: RunLabels) -> Path:
        check_labels(labels, ComposeBackendError)
        return self._state_dir / labels.installation / labels.run_id

    async def pin_mismatch(self, template: Mapping[str, Any]) -> str | None:
        """Why a run of ``template`` may not start here: ``backend_changed``, ``wrapper_changed`` or
        ``image_missing`` (the pinned image ID is not in the engine); ``None`` when its pins hold."""
        if template.get("backend") != "compose":
            return "backend_changed"
        runner = template.get("runner") or {}
        if runner.get("type") == "oneshot" and runner.get("wrapper") != wrapper_digest():
            return "wrapper_changed"
        images = [str(runner.get("image_id") or "")]
        if runner.get("type") == "hermes":
            images.append(str(runner.get("helper_image_id") or ""))  # its forwarder's and meter's
        for image_id in images:
            if not await asyncio.to_thread(self._image_present, image_id):
                return "image_missing"
        return None

    async def spawn(self, spec: WorkerSpec) -> None:
        """Start the run's worker; start nothing if a container already carries its labels (a created one that
        never started is started, never duplicated)."""
        await asyncio.to_thread(self._spawn, spec)

    async def inspect(self, labels: RunLabels) -> WorkerState:
        return await asyncio.to_thread(self._inspect, labels)

    async def remove(self, labels: RunLabels, *, writer_lock_fd: int | None = None) -> None:
        """``docker compose down`` the run's project (inheriting ``writer_lock_fd``), verify that no container
        carries its labels, then delete its directory. A run without a worker is fine."""
        await asyncio.to_thread(self._remove, labels, writer_lock_fd)

    async def list_workers(self) -> Sequence[RunLabels]:
        """Every worker container of this pod, running or not."""
        return await asyncio.to_thread(self._list_workers)

    def close(self) -> None:
        """Close the Docker connection; a read still in flight in a thread afterwards fails (retryable) rather
        than opening a new one."""
        with self._client_lock:
            self._closed = True
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- Docker reads ---------------------------------------------------------------------------------------------

    def _sdk(self) -> docker.DockerClient:
        with self._client_lock:
            if self._closed:
                raise ComposeBackendError("the backend is closed", code="docker_unavailable", retryable=True)
            if self._client is None:
                try:
                    self._client = self._client_factory()
                except (docker.errors.DockerException, OSError) as exc:
                    raise ComposeBackendError(
                        "no Docker engine answers", code="docker_unavailable", retryable=True
                    ) from exc
            return self._client

    def _read(self, call: Callable[[docker.DockerClient], Any]) -> Any:
        try:
            return call(self._sdk())
        except docker.errors.NotFound:
            raise
        except (docker.errors.DockerException, OSError) as exc:
            raise ComposeBackendError(
                f"the Docker engine did not answer a read ({type(exc).__name__})",
                code="docker_unavailable",
                retryable=True,
            ) from exc

    def _image_present(self, image_id: str) -> bool:
        if not image_id.startswith("sha256:"):
            return False
        try:
            found = self._read(lambda client: client.api.inspect_image(image_id))
        except docker.errors.NotFound:
            return False
        return bool(found.get("Id") == image_id)

    def _find(self, labels: RunLabels, role: str | None = "worker") -> list[dict[str, Any]]:
        """The containers carrying the run's labels, of ``role`` (any role with ``None``)."""
        wanted = [
            f"{LABEL_POD}={labels.pod}",
            f"{LABEL_INSTALLATION}={labels.installation}",
            f"{LABEL_RUN}={labels.run_id}",
        ]
        if role is not None:
            wanted.append(f"{LABEL_ROLE}={role}")
        found: list[dict[str, Any]] = self._read(
            lambda client: client.api.containers(all=True, filters={"label": wanted})
        )
        return found

    def _container(self, labels: RunLabels) -> dict[str, Any] | None:
        """The run's container, inspected, or ``None``."""
        cached = self._containers.get(labels)
        if cached is not None:
            try:
                return self._inspect_container(cached)
            except docker.errors.NotFound:
                self._containers.pop(labels, None)
        for summary in self._find(labels):
            try:
                attrs = self._inspect_container(str(summary["Id"]))
            except docker.errors.NotFound:
                continue  # removed in between
            self._containers[labels] = str(attrs["Id"])
            return attrs
        return None

    def _inspect_container(self, container_id: str) -> dict[str, Any]:
        attrs: dict[str, Any] = self._read(lambda client: client.api.inspect_container(container_id))
        return attrs

    def _stdout(self, container_id: str, limit: int) -> tuple[bytes, bool]:
        """At most ``limit`` bytes of the container's stdout, and whether it wrote more."""

        def read(client: docker.DockerClient) -> tuple[bytes, bool]:
            # All of it at once: the log driver keeps at most two files of a few times ``limit`` each.
            data = bytes(client.api.logs(container_id, stdout=True, stderr=False, stream=False, follow=False))
            return data[:limit], len(data) > limit

        try:
            result: tuple[bytes, bool] = self._read(read)
        except docker.errors.NotFound:
            return b"", False
        return result

    # -- spawn ----------------------------------------------------------------------------------------------------

    def _spawn(self, spec: WorkerSpec) -> None:
        check_limits(spec, ComposeBackendError)
        if spec.labels.pod != self._pod:
            raise ComposeBackendError(f"this backend serves pod {self._pod!r} only", code="labels_invalid")
        if spec.image_id is None or not self._image_present(spec.image_id):
            raise SpawnError("the template's pinned image is not in the engine", code="image_mismatch")
        if spec.home is not None:
            # Docker resolves a bind's source itself: check the pins as close to compose up as we can.
            check_content(spec.home.content, SpawnError)
        run_dir = self.run_dir(spec.labels)
        ensure_private_dir(self._state_dir)
        ensure_private_dir(run_dir.parent)
        ensure_private_dir(run_dir)
        with _RunLock(run_dir):
            existing = self._container(spec.labels)
            if existing is not None and existing["State"].get("Status") != "created":
                return  # started before (perhaps by a supervisor that was killed since): adopt it
            self._guard()
            project = run_dir / _PROJECT_FILE
            config = spec.config
            if spec.home is None:
                rendered = render_project(spec, network=self._network, tmp_bytes=self._tmp_bytes)
            else:
                rendered, config = self._home_project(spec, run_dir)
            write_private(project, rendered)
            write_private(run_dir / _CONFIG_SECRET, config)
            environment = {TASK_VARIABLE: spec.task, CONFIG_VARIABLE: config.decode("utf-8", "surrogateescape")}
            self._run_compose(
                spec.labels,
                ["up", "--detach", "--no-build", "--no-recreate", "--pull", "never"],
                timeout_s=self._up_timeout_s,
                extra_env=environment,
                writer_lock_fd=spec.writer_lock_fd,
            )
            started = self._container(spec.labels)
            if started is None:
                raise SpawnError("docker compose up reported success but no container exists", retryable=True)
            if started.get("Image") != spec.image_id:
                self._down(spec.labels, writer_lock_fd=spec.writer_lock_fd)
                raise SpawnError("the started container does not run the pinned image", code="image_mismatch")

    def _home_project(self, spec: WorkerSpec, run_dir: Path) -> tuple[bytes, bytes]:
        """A task-home run's project and its worker's configuration (the model through its forwarder); its own
        network's bridge is guarded before the network exists, and its meter's output directory made."""
        home = spec.home
        assert home is not None
        if home.helper_image_id is None or not self._image_present(home.helper_image_id):
            raise SpawnError("the forwarder's and meter's pinned image is not in the engine", code="image_mismatch")
        if not self._find(spec.labels, role="meter"):
            # A retried spawn finds the directory an earlier attempt handed over: made anew, never trusted. A meter
            # an earlier ``up`` started keeps it (``--no-recreate`` keeps that container and its bind).
            fresh_meter_out(run_dir / METER_OUT_DIR, WORKER_UID if os.geteuid() == 0 else None)
        self._home_guard(home_network(spec.labels))
        try:
            config = parse_worker_config(spec.config.decode("utf-8", "surrogateescape"))
        except WorkerConfigError as exc:
            raise ComposeBackendError(f"the runner configuration is invalid ({exc.code})", code="spec_invalid") from exc
        config = dataclasses.replace(config, model_base_url=FORWARDER_URL, model_unix_socket=None)
        rendered = render_home_project(
            spec,
            run_dir=run_dir,
            runs_network=self._network,
            proxy_url=self._proxy_url,
            tmp_bytes=self._tmp_bytes,
            meter_interval_s=self._meter_interval_s,
        )
        return rendered, config.to_json().encode()

    def _run_compose(
        self,
        labels: RunLabels,
        args: list[str],
        *,
        timeout_s: float,
        extra_env: Mapping[str, str] | None = None,
        writer_lock_fd: int | None = None,
        project: str | None = None,
    ) -> None:
        run_dir = self.run_dir(labels)
        argv = [*self._compose, "--project-name", project or project_name(labels)]
        if args[0] == "up":
            # Only up reads the file: down finds the project by its name, and would otherwise need the task and
            # the configuration again to interpolate a file it does not use.
            argv += ["--file", str(run_dir / _PROJECT_FILE)]
        env = {key: os.environ[key] for key in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG") if key in os.environ}
        env.update(extra_env or {})
        try:
            done = subprocess.run(  # noqa: S603 - fixed argv, no shell
                [*argv, *args],
                capture_output=True,
                env=env,
                cwd=run_dir if run_dir.is_dir() else self._state_dir,
                timeout=timeout_s,
                pass_fds=() if writer_lock_fd is None else (writer_lock_fd,),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ComposeBackendError(
                f"docker compose {args[0]} did not finish within {timeout_s:g} s", code="compose_failed", retryable=True
            ) from exc
        except OSError as exc:
            raise ComposeBackendError(
                f"docker compose could not run ({exc.strerror or exc})", code="docker_unavailable", retryable=True
            ) from exc
        if done.returncode != 0:
            # compose's own messages; the task and the configuration are in its environment, never in argv.
            tail = " / ".join(done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:])[:600]
            raise ComposeBackendError(
                f"docker compose {args[0]} failed (exit {done.returncode}): {tail}",
                code="compose_failed",
                retryable=True,
            )

    # -- inspect --------------------------------------------------------------------------------------------------

    def _inspect(self, labels: RunLabels) -> WorkerState:
        check_labels(labels, ComposeBackendError)
        attrs = self._container(labels)
        if attrs is None:
            return WorkerState(
                exists=False,
                running=False,
                exit_code=None,
                timed_out=False,
                stdout=b"",
                stdout_truncated=False,
            )
        state = attrs.get("State") or {}
        status = state.get("Status")
        verdict = self._meter_verdict(labels)
        meter: dict[str, Any] = {} if verdict is None else {"home_meter": verdict[0], "home_meter_seq": verdict[1]}
        if status in ("created", "running", "restarting", "paused", "removing"):
            return WorkerState(
                exists=True,
                running=True,
                exit_code=None,
                timed_out=False,
                stdout=b"",
                stdout_truncated=False,
                **meter,
            )
        # An exit code is only ever read together with the output, once the container has ended.
        limit = _output_limit(attrs)
        stdout, truncated = self._stdout(str(attrs["Id"]), limit)
        return WorkerState(
            exists=True,
            running=False,
            exit_code=int(state.get("ExitCode", 255)),
            timed_out=False,
            stdout=stdout,
            stdout_truncated=truncated,
            **meter,
        )

    def _meter_verdict(self, labels: RunLabels) -> tuple[MeterVerdict, int | None] | None:
        """A task-home run's meter: its verdict from its last measure and whether its container still runs, and
        that measure's ``seq``."""
        out = self.run_dir(labels) / METER_OUT_DIR
        if not out.is_dir():
            return None  # a stateless run
        try:
            measured = read_json(out / METER_RECORD)
        except RecordInvalid:
            measured = INVALID_MEASURE  # the meter wrote something that is no measure: it failed
        except OSError as exc:
            raise ComposeBackendError(
                "the meter's measure could not be read", code="docker_unavailable", retryable=True
            ) from exc
        meters = self._find(labels, role="meter")
        running = bool(meters) and all(m.get("State") == "running" for m in meters)
        return meter_verdict(measured, running), meter_seq(measured)

    # -- remove ---------------------------------------------------------------------------------------------------

    def _remove(self, labels: RunLabels, writer_lock_fd: int | None = None) -> None:
        run_dir = self.run_dir(labels)
        if run_dir.is_dir():
            with _RunLock(run_dir):
                self._down(labels, writer_lock_fd=writer_lock_fd)
                shutil.rmtree(run_dir)
                fsync_dir(run_dir.parent)
        else:
            self._down(labels, writer_lock_fd=writer_lock_fd)

    def _down(self, labels: RunLabels, *, writer_lock_fd: int | None) -> None:
        found = self._find(labels, role=None)
        for project in _projects(labels, found):
            self._run_compose(
                labels,
                ["down", "--timeout", "0", "--remove-orphans"],
                timeout_s=self._down_timeout_s,
                writer_lock_fd=writer_lock_fd,
                project=project,
            )
        self._containers.pop(labels, None)
        if self._find(labels, role=None):  # its worker, and a task-home run's forwarder and meter
            raise ComposeBackendError(
                "a container still carries the run's labels after docker compose down",
                code="remove_timeout",
                retryable=True,
            )
        if (self.run_dir(labels) / METER_OUT_DIR).is_dir():  # a task-home run: its own network is gone too
            self._home_unguard(home_network(labels))

    # -- list -----------------------------------------------------------------------------------------------------

    def _list_workers(self) -> list[RunLabels]:
        # Every container of a run counts: a task-home run's forwarder or meter outliving its worker too.
        wanted = [f"{LABEL_POD}={self._pod}", LABEL_RUN]
        found: list[dict[str, Any]] = self._read(
            lambda client: client.api.containers(all=True, filters={"label": wanted})
        )
        workers = []
        for summary in found:
            tags = summary.get("Labels") or {}
            workers.append(
                RunLabels(
                    pod=str(tags.get(LABEL_POD, "")),
                    installation=str(tags.get(LABEL_INSTALLATION, "")),
                    run_id=str(tags.get(LABEL_RUN, "")),
                )
            )
        return sorted(set(workers), key=lambda w: (w.installation, w.run_id))


def _projects(labels: RunLabels, containers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Compose projects that hold the run's containers, by the project each container carries (a worker of
    another build, or of a pod renamed since, is still removed through Compose); none without a container."""
    carried = {str((c.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, "")) for c in containers}
    named = sorted(name for name in carried if _PROJECT_NAME.fullmatch(name))
    if containers and len(named) < len(carried):
        named.append(project_name(labels))  # a container without a usable project label: try the run's own
    return sorted(set(named))


def _output_limit(attrs: Mapping[str, Any]) -> int:
    """The stdout bound the run was started with, from its container's label."""
    try:
        return max(0, int(((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_OUTPUT, "0")))
    except ValueError:
        return 0


class _RunLock:
    """``flock`` on the run directory's lock file."""

    def __init__(self, run_dir: Path) -> None:
        self._path = run_dir / _LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> _RunLock:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = [
    "ENFORCED",
    "ComposeBackend",
    "ComposeBackendError",
    "SpawnError",
    "project_name",
    "render_project",
]
