"""A compose task-home run's project: its worker, its forwarder, its home meter and its own network.

* ``worker``: the template's pinned Hermes image (``clawstack/hermes`` or one built ``FROM`` it), running the
  wrapper (``python3 -m clawstack.worker.hermes``) with the task as its one argument and the configuration by
  Compose interpolation, hardened as a stateless worker is (init, uid 65534, read-only root, ``cap_drop: [ALL]``,
  ``no-new-privileges``, memory and pids limits, a tmpfs ``/tmp``, no IPC namespace of the host's), with exactly
  two kinds of mount: its home (the one persistent writable path) and the template's ``content``, read-only. Its
  only network is the run's own.
* ``forwarder``: ``clawstack.worker.forwarder`` from ``clawstack/worker`` (pinned at ``claw up``), on the run's
  network and the pod's runs network, relaying to the proxy's worker API and nowhere else.
* ``meter``: ``clawstack.worker.meter`` from the same image, with the home read-only, no network at all and no
  credentials, writing its measures to the run's directory (``meter-out/``).
* the run's network ``clawh-<24 hex>``: ``internal: true``, on its own bridge (``clawh-<9 hex>``, so that the
  host guard can drop its traffic to the host), with the address block the supervisor allocated at admission.

Every container carries the run's labels (``claw.role`` worker, forwarder or meter): a run is stopped or failed
only once none of them remains.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from clawstack.pod.netguard import RunsNetwork
from clawstack.runs.backends.base import METER_OUT_DIR, METER_RECORD, RunLabels, WorkerSpec
from clawstack.runs.backends.compose_project import (
    CONFIG_VARIABLE,
    CONTAINER_ENFORCED,
    HARDENING,
    LABEL_OUTPUT,
    TASK_VARIABLE,
    ComposeBackendError,
    escape,
    project_name,
    run_labels,
    worker_logging,
)
from clawstack.worker.home_contract import HOME_ENV

FORWARDER_PORT: Final = 8080
FORWARDER_URL: Final = f"http://forwarder:{FORWARDER_PORT}/v1"
"""The model base URL a compose task-home worker is configured with."""
METER_SCRIPT: Final = "/opt/clawstack/site/clawstack/worker/meter.py"
METER_OUT: Final = "/meter"
HELPER_MEMORY_BYTES: Final = 256 * 1024 * 1024
HELPER_PIDS: Final = 32
ENFORCED: Final = (*CONTAINER_ENFORCED, "home_mount_only", "run_network_only", "host_input_dropped")
"""What a compose task-home worker is held to (``isolation.enforced``): its home (and read-only content) are its
only mounts, its own network its only network."""


def home_network(labels: RunLabels) -> RunsNetwork:
    """The run's own network and the bridge it is pinned to."""
    digest = hashlib.sha256(f"{labels.pod}\0{labels.installation}\0{labels.run_id}".encode()).hexdigest()
    return RunsNetwork(name=f"clawh-{digest[:24]}", bridge=f"clawh-{digest[:9]}")


def render_home_project(
    spec: WorkerSpec, *, run_dir: Path, runs_network: str, proxy_url: str, tmp_bytes: int, meter_interval_s: float
) -> bytes:
    """The task-home run's Compose project; it holds no task text and no credential, only their placeholders."""
    home = spec.home
    if home is None or spec.image_id is None or home.helper_image_id is None or home.subnet is None:
        raise ComposeBackendError(
            "a task-home run needs its image, helper image and address block", code="spec_invalid"
        )
    labels = spec.labels
    proxy = urlsplit(proxy_url)
    if proxy.hostname is None or proxy.port is None:
        raise ComposeBackendError("the proxy URL names no host and port", code="spec_invalid")
    source = escape(str(home.path))
    volumes: list[dict[str, Any]] = [{"type": "bind", "source": source, "target": home.mount}]
    volumes += [
        {"type": "bind", "source": escape(str(c.path)), "target": c.target, "read_only": True} for c in home.content
    ]
    worker: dict[str, Any] = {
        **HARDENING,
        "image": spec.image_id,
        "entrypoint": ["python3", "-m", "clawstack.worker.hermes"],
        "command": [f"${{{TASK_VARIABLE}:?}}"],
        "environment": {"CLAW_WORKER_CONFIG": f"${{{CONFIG_VARIABLE}:?}}", HOME_ENV: home.mount},
        "mem_limit": spec.memory_bytes,
        "memswap_limit": spec.memory_bytes,
        "pids_limit": spec.pids,
        "tmpfs": [f"/tmp:size={tmp_bytes},mode=1777"],  # noqa: S108 - the container's own tmpfs
        "working_dir": home.mount,
        "volumes": volumes,
        "networks": ["home"],
        "depends_on": ["forwarder"],
        "labels": run_labels(labels, "worker", **{LABEL_OUTPUT: str(spec.max_output_bytes)}),
        "logging": worker_logging(spec.max_output_bytes),
    }
    helper: dict[str, Any] = {
        **HARDENING,
        "image": home.helper_image_id,
        "mem_limit": HELPER_MEMORY_BYTES,
        "memswap_limit": HELPER_MEMORY_BYTES,
        "pids_limit": HELPER_PIDS,
        "logging": {"driver": "json-file", "options": {"max-size": "65536", "max-file": "1"}},
    }
    forwarder = {
        **helper,
        "entrypoint": ["python3", "-m", "clawstack.worker.forwarder"],
        "command": ["--listen", f"0.0.0.0:{FORWARDER_PORT}", "--to", f"{proxy.hostname}:{proxy.port}"],
        "networks": ["home", "runs"],
        "labels": run_labels(labels, "forwarder"),
    }
    meter = {
        **helper,
        "entrypoint": ["python3", "-I", METER_SCRIPT],
        "command": [
            *("--root", home.mount, "--max-bytes", str(home.max_bytes)),
            *("--interval", f"{meter_interval_s:g}", "--out", f"{METER_OUT}/{METER_RECORD}"),
        ],
        "volumes": [
            {"type": "bind", "source": source, "target": home.mount, "read_only": True},
            {"type": "bind", "source": escape(str(run_dir / METER_OUT_DIR)), "target": METER_OUT},
        ],
        "network_mode": "none",
        "labels": run_labels(labels, "meter"),
    }
    network = home_network(labels)
    document = {
        "name": project_name(labels),
        "services": {"worker": worker, "forwarder": forwarder, "meter": meter},
        "networks": {
            "home": {
                "name": network.name,
                "internal": True,
                "driver": "bridge",
                "driver_opts": {"com.docker.network.bridge.name": network.bridge},
                "ipam": {"config": [{"subnet": home.subnet}]},
            },
            "runs": {"name": runs_network, "external": True},
        },
    }
    header = "# Rendered by claw runs serve for one task-home run. The task and the configuration are placeholders.\n"
    return (header + yaml.safe_dump(document, sort_keys=True, default_flow_style=False, width=1 << 20)).encode()


__all__ = [
    "ENFORCED",
    "FORWARDER_URL",
    "home_network",
    "render_home_project",
]
