"""A compose run's project file: what :class:`~clawstack.runs.backends.compose.ComposeBackend` hands to
``docker compose up`` for one run (see that module for the rules it follows)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import yaml

from clawstack.common.errors import ClawError
from clawstack.runs.backends.base import RunLabels, WorkerSpec
from clawstack.worker.container import WRAPPER_ENTRYPOINT

WORKER_UID: Final = 65534
TASK_VARIABLE: Final = "CLAW_RUN_TASK"
CONFIG_VARIABLE: Final = "CLAW_RUN_CONFIG"
LABEL_POD: Final = "claw.pod"
LABEL_INSTALLATION: Final = "claw.installation"
LABEL_RUN: Final = "claw.run_id"
LABEL_ROLE: Final = "claw.role"
LABEL_OUTPUT: Final = "claw.max-output-bytes"
CONTAINER_ENFORCED: Final = (
    "container",
    "read_only_root",
    "tmpfs_tmp",
    "uid_65534",
    "cap_drop_all",
    "no_new_privileges",
    "memory_limit",
    "pids_limit",
)
"""What every compose worker container is held to, stateless or task-home (``isolation.enforced``)."""


class ComposeBackendError(ClawError):
    """Root of the compose backend's errors."""

    code = "backend_error"


class SpawnError(ComposeBackendError):
    """The worker could not be started."""

    code = "spawn_failed"


_LOG_FACTOR: Final = 8  # json-file counts encoded bytes: an escaped control character is six
HARDENING: Final[Mapping[str, Any]] = {
    "pull_policy": "never",
    "init": True,
    "user": f"{WORKER_UID}:{WORKER_UID}",
    "read_only": True,
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges:true"],
    "ipc": "none",  # a private IPC namespace without /dev/shm, which would be a second writable path
    "restart": "no",
    "stop_grace_period": "1s",
}
"""What every container of a run's project is started with, whatever it runs."""


def run_labels(labels: RunLabels, role: str, **extra: str) -> dict[str, str]:
    """The labels a container of the run carries: how its run finds it, and how orphans are found."""
    return {
        LABEL_POD: labels.pod,
        LABEL_INSTALLATION: labels.installation,
        LABEL_RUN: labels.run_id,
        LABEL_ROLE: role,
        **extra,
    }


def worker_logging(max_output_bytes: int) -> dict[str, Any]:
    """The worker's stdout bound: two json-file logs of a few times what the run may print."""
    size = max(64 * 1024, max_output_bytes * _LOG_FACTOR)
    return {"driver": "json-file", "options": {"max-size": str(size), "max-file": "2"}}


def project_name(labels: RunLabels) -> str:
    """The run's Compose project: lowercase and bounded, whatever the run id's case and length."""
    digest = hashlib.sha256(f"{labels.pod}\0{labels.installation}\0{labels.run_id}".encode()).hexdigest()
    return f"clawrun-{digest[:24]}"


def escape(text: str) -> str:
    """A literal for a Compose file: ``$`` would start an interpolation."""
    return text.replace("$", "$$")


def render_project(spec: WorkerSpec, *, network: str, tmp_bytes: int) -> bytes:
    """The run's Compose project; it holds no task text and no credential, only their placeholders."""
    if spec.image_id is None:
        raise ComposeBackendError("the template pins no image", code="spec_invalid")
    labels = spec.labels
    service: dict[str, Any] = {
        **HARDENING,
        "image": spec.image_id,
        "entrypoint": [escape(part) for part in WRAPPER_ENTRYPOINT],
        "command": [f"${{{TASK_VARIABLE}:?}}"],
        "environment": {"CLAW_WORKER_CONFIG": f"${{{CONFIG_VARIABLE}:?}}"},
        "mem_limit": spec.memory_bytes,
        "memswap_limit": spec.memory_bytes,
        "pids_limit": spec.pids,
        "tmpfs": [f"/tmp:size={tmp_bytes},mode=1777"],  # noqa: S108 - the container's own tmpfs
        "working_dir": "/tmp",  # noqa: S108
        "networks": ["runs"],
        "labels": run_labels(labels, "worker", **{LABEL_OUTPUT: str(spec.max_output_bytes)}),
        "logging": worker_logging(spec.max_output_bytes),
    }
    document = {
        "name": project_name(labels),
        "services": {"worker": service},
        "networks": {"runs": {"name": network, "external": True}},
    }
    header = "# Rendered by claw runs serve for one run. The task and the configuration are placeholders.\n"
    return (header + yaml.safe_dump(document, sort_keys=True, default_flow_style=False, width=1 << 20)).encode()


__all__ = [
    "CONFIG_VARIABLE",
    "CONTAINER_ENFORCED",
    "HARDENING",
    "LABEL_INSTALLATION",
    "LABEL_OUTPUT",
    "LABEL_POD",
    "LABEL_ROLE",
    "LABEL_RUN",
    "TASK_VARIABLE",
    "WORKER_UID",
    "ComposeBackendError",
    "SpawnError",
    "escape",
    "project_name",
    "render_project",
    "run_labels",
    "worker_logging",
]
