"""The compose backend's rendered project, without Docker: placeholders only, and every hardening key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clawstack.runs.backends.base import RunLabels, WorkerSpec
from clawstack.runs.backends.compose import ComposeBackend, ComposeBackendError, project_name, render_project
from clawstack.worker.container import WRAPPER_SOURCE

LABELS = RunLabels(pod="acme-pod", installation="acme", run_id="Run_42")
IMAGE = "sha256:" + "ab" * 32


def spec(**changes: object) -> WorkerSpec:
    fields: dict[str, object] = {
        "labels": LABELS,
        "task": "Summarize ticket 42 $HOME ${X}",
        "config": b'{"credential": "run-x:SECRET-TOKEN"}',
        "proxy_socket": Path("/nonexistent"),
        "memory_bytes": 512 * 1024 * 1024,
        "pids": 128,
        "max_runtime_s": 60,
        "max_output_bytes": 69632,
        "image_id": IMAGE,
    }
    fields.update(changes)
    return WorkerSpec(**fields)  # type: ignore[arg-type]


def rendered(**changes: object) -> tuple[str, dict[str, object]]:
    text = render_project(spec(**changes), network="claw-runs-acme-pod", tmp_bytes=64 * 1024 * 1024).decode()
    return text, yaml.safe_load(text)


def test_the_project_holds_placeholders_never_the_task_or_the_credential() -> None:
    text, document = rendered()
    assert "Summarize" not in text
    assert "SECRET-TOKEN" not in text
    service = document["services"]["worker"]  # type: ignore[index]
    assert service["command"] == ["${CLAW_RUN_TASK:?}"]
    assert service["environment"] == {"CLAW_WORKER_CONFIG": "${CLAW_RUN_CONFIG:?}"}


def test_the_container_is_hardened_as_the_spec_lists() -> None:
    _, document = rendered()
    service = document["services"]["worker"]  # type: ignore[index]
    assert service["image"] == IMAGE
    assert service["pull_policy"] == "never"
    assert service["init"] is True
    assert service["user"] == "65534:65534"
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["mem_limit"] == service["memswap_limit"] == 512 * 1024 * 1024
    assert service["pids_limit"] == 128
    assert service["tmpfs"] == ["/tmp:size=67108864,mode=1777"]
    assert service["ipc"] == "none"
    assert service["networks"] == ["runs"]
    assert service["restart"] == "no"
    for key in ("volumes", "privileged", "network_mode", "pid", "devices", "cap_add", "ports"):
        assert key not in service
    assert document["networks"] == {"runs": {"name": "claw-runs-acme-pod", "external": True}}
    assert service["labels"] == {
        "claw.pod": "acme-pod",
        "claw.installation": "acme",
        "claw.run_id": "Run_42",
        "claw.role": "worker",
        "claw.max-output-bytes": "69632",
    }


def test_the_entrypoint_is_the_pinned_wrapper_with_dollars_escaped() -> None:
    _, document = rendered()
    entrypoint = document["services"]["worker"]["entrypoint"]  # type: ignore[index]
    assert entrypoint[:2] == ["python3", "-c"]
    assert entrypoint[2].replace("$$", "$") == WRAPPER_SOURCE
    assert len(entrypoint) == 3


def test_project_names_are_compose_names_and_distinct() -> None:
    name = project_name(LABELS)
    assert name == name.lower()
    assert name.startswith("clawrun-")
    assert len(name) == len("clawrun-") + 24
    others = {
        project_name(RunLabels(pod="acme-pod", installation="acme", run_id="run_42")),
        project_name(RunLabels(pod="other", installation="acme", run_id="Run_42")),
        project_name(RunLabels(pod="acme-pod", installation="acme2", run_id="Run_42")),
    }
    assert name not in others
    assert len(others) == 3


def test_no_pinned_image_is_refused() -> None:
    with pytest.raises(ComposeBackendError) as info:
        rendered(image_id=None)
    assert info.value.code == "spec_invalid"


async def test_a_spawn_for_another_pod_is_refused_before_docker_is_asked(tmp_path: Path) -> None:
    def no_docker() -> object:
        raise AssertionError("docker was asked")

    backend = ComposeBackend(
        tmp_path,
        pod="other-pod",
        network="claw-runs-other-pod",
        proxy_url="http://cllama:8080/v1",
        client_factory=no_docker,  # type: ignore[arg-type]
    )
    with pytest.raises(ComposeBackendError) as info:
        await backend.spawn(spec())
    assert info.value.code == "labels_invalid"
    assert backend.isolation_report["backend"] == "compose"
    assert backend.model_endpoint == {"model_base_url": "http://cllama:8080/v1"}
