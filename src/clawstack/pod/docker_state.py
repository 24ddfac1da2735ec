"""What the Docker engine holds of a compose pod, read through the Docker SDK (reads only: ``docker compose`` is
the only lifecycle writer). Each read makes its own client and closes it; an engine that cannot be asked or read
is a :class:`~clawstack.pod.errors.BackendError` with the caller's code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import docker
import docker.errors

from clawstack.pod.compose import CONFIG_LABEL, PROXY_SERVICE
from clawstack.pod.errors import BackendError
from clawstack.pod.images import docker_available


def _client(code: str) -> docker.DockerClient:
    reason = docker_available()
    if reason is not None:
        raise BackendError(reason, code=code)
    try:
        return docker.from_env(timeout=30)
    except docker.errors.DockerException as exc:
        raise BackendError(f"cannot reach the Docker engine: {exc}", code=code) from exc


def _read_docker(code: str, read: Callable[[docker.DockerClient], Any]) -> Any:
    client = _client(code)
    try:
        return read(client)
    except (docker.errors.DockerException, OSError) as exc:
        raise BackendError(f"the Docker engine could not be read: {' '.join(str(exc).split())}", code=code) from exc
    finally:
        client.close()


def running_proxy(pod: str, config_digest: str) -> str | None:
    """The ID of the pod's running proxy container that serves ``config_digest``, or ``None``."""
    labels = [f"com.docker.compose.project={pod}", f"com.docker.compose.service={PROXY_SERVICE}"]

    def read(client: docker.DockerClient) -> str | None:
        for container in client.containers.list(filters={"label": labels, "status": "running"}):
            if container.labels.get(CONFIG_LABEL) == config_digest:
                return str(container.id)
        return None

    result: str | None = _read_docker("docker_unavailable", read)
    return result


def leftover(pod: str, *, runs_only: bool = False) -> list[str]:
    """Names of the pod's containers (its project's, its proxy's, its runs'), or only its runs' containers: every
    container that carries a run's labels (a worker, and a task-home run's forwarder and meter)."""
    filters = [[f"claw.pod={pod}", "claw.role=worker"], [f"claw.pod={pod}", "claw.run_id"]]
    if not runs_only:
        filters += [[f"com.docker.compose.project={pod}"], [f"claw.pod={pod}", "claw.role=proxy"]]

    def read(client: docker.DockerClient) -> list[str]:
        names: set[str] = set()
        for labels in filters:
            names |= {str(c.name) for c in client.containers.list(all=True, filters={"label": labels})}
        return sorted(names)

    result: list[str] = _read_docker("teardown_failed", read)
    return result


def network_exists(name: str) -> bool:
    def read(client: docker.DockerClient) -> bool:
        return any(network.name == name for network in client.networks.list(names=[name]))

    result: bool = _read_docker("teardown_failed", read)
    return result


__all__ = ["leftover", "network_exists", "running_proxy"]
