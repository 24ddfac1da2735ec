"""A task home's content mounts never expose the pod's private state, and a source swapped after ``claw up`` is
refused at spawn, not followed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from clawstack.pod.errors import PodError
from clawstack.pod.podfile import PRIVATE_STATE
from clawstack.pod.up import compile_only
from clawstack.runs.backends import LocalBackend, RunLabels, SpawnError, WorkerSpec
from clawstack.runs.backends.base import ContentMount, TaskHome, check_content
from clawstack.runs.backends.monitor import CONTENT_CHANGED, MonitorError, open_pinned

pytestmark = pytest.mark.security

PODS = Path(__file__).resolve().parents[1] / "pods"
WORKER = "      models: {primary: local/m}\n"


def pod_with_content(tmp_path: Path, source: str) -> Path:
    pod = tmp_path / "pod"
    shutil.copytree(PODS / "base", pod)
    text = (PODS / "base" / "claw-pod.yml").read_text()
    text = text.replace("image: clawstack/oneshot", "image: clawstack/hermes").replace(
        WORKER, WORKER + f"      run:\n        home: {{}}\n        content: [{{source: '{source}', target: /ref}}]\n"
    )
    (pod / "claw-pod.yml").write_text(text)
    for name in PRIVATE_STATE:
        if name == ".env":
            (pod / name).write_text("OPENAI_API_KEY=sk-secret\n")
        else:
            (pod / name / "inner").mkdir(parents=True)
    return pod


def refusal(pod: Path) -> PodError:
    with pytest.raises(PodError) as info:
        compile_only(pod, environ={})
    return info.value


@pytest.mark.parametrize("source", [".", "./", "reference/..", "reference/../."])
def test_the_pod_directory_itself_is_refused(tmp_path: Path, source: str) -> None:
    error = refusal(pod_with_content(tmp_path, source))
    assert error.code == "content_private"
    assert error.message == (
        f"claw-pod.yml: services.worker.x-claw.run.content[0].source: {source!r} is the pod directory, which holds "
        "its private state; name a directory inside it"
    )


@pytest.mark.parametrize("name", PRIVATE_STATE)
@pytest.mark.parametrize("inner", [False, True])
def test_private_state_is_refused_as_a_source_or_inside_one(tmp_path: Path, name: str, inner: bool) -> None:
    source = f"{name}/inner" if inner and name != ".env" else name
    error = refusal(pod_with_content(tmp_path, source))
    assert error.code == "content_private"
    assert f"exposes the pod's private state ({name})" in error.message


def test_a_link_into_private_state_is_refused(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "reference/runtime")
    os.symlink("../.claw-runtime", pod / "reference" / "runtime")
    assert refusal(pod).code == "content_private"


def test_a_source_holding_a_private_file_it_links_to_is_refused(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "reference")
    (pod / ".env").unlink()
    (pod / "reference" / "keys.env").write_text("OPENAI_API_KEY=sk-secret\n")
    os.symlink("reference/keys.env", pod / ".env")
    assert refusal(pod).code == "content_private"


def test_positive_control_a_reference_directory_compiles_and_is_pinned(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "./reference/handbook")
    [template] = compile_only(pod, environ={}).templates
    st = os.stat(pod / "reference" / "handbook")
    assert template.document["content"] == [
        {"source": "reference/handbook", "target": "/ref", "device": st.st_dev, "inode": st.st_ino}
    ]


# --- at spawn ---------------------------------------------------------------------------------------------------


def pinned(pod: Path, source: str) -> ContentMount:
    st = os.stat(pod / source)
    return ContentMount(pod=pod, source=source, target="/ref", device=st.st_dev, inode=st.st_ino)


def test_a_link_swapped_in_after_claw_up_is_refused_not_followed(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "reference/handbook")
    mount = pinned(pod, "reference/handbook")
    check_content([mount], SpawnError)  # positive control: unchanged, it is accepted
    os.rename(pod / "reference" / "handbook", pod / "reference" / "old")
    os.symlink("old", pod / "reference" / "handbook")  # the very same directory, reached through a link
    with pytest.raises(SpawnError) as info:
        check_content([mount], SpawnError)
    assert info.value.code == CONTENT_CHANGED
    assert str(pod) not in info.value.message


def test_a_link_on_the_way_is_refused(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "reference/handbook")
    mount = pinned(pod, "reference/handbook")
    os.rename(pod / "reference", pod / "elsewhere")
    os.symlink("elsewhere", pod / "reference")
    with pytest.raises(MonitorError) as info:
        open_pinned(str(pod), mount.source, mount.device, mount.inode)
    assert info.value.code == CONTENT_CHANGED


def test_another_directory_in_its_place_is_refused(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "reference/handbook")
    mount = pinned(pod, "reference/handbook")
    os.rename(pod / "reference" / "handbook", pod / "reference" / "old")  # kept: its inode is not reused
    (pod / "reference" / "handbook").mkdir()
    with pytest.raises(SpawnError) as info:
        check_content([mount], SpawnError)
    assert info.value.code == CONTENT_CHANGED


def test_the_local_backend_refuses_the_spawn_before_starting_anything(tmp_path: Path) -> None:
    pod = pod_with_content(tmp_path, "reference/handbook")
    mount = pinned(pod, "reference/handbook")
    os.rename(pod / "reference" / "handbook", pod / "reference" / "old")
    os.symlink("../.claw-runtime", pod / "reference" / "handbook")
    backend = LocalBackend(tmp_path / "state", pod="t", allow_no_isolation=True)
    spec = WorkerSpec(
        labels=RunLabels(pod="t", installation="acme", run_id="r1"),
        task="task",
        config=b"{}",
        proxy_socket=tmp_path / "proxy.sock",
        memory_bytes=256 * 1024 * 1024,
        pids=64,
        max_runtime_s=30,
        max_output_bytes=4096,
        home=TaskHome(path=tmp_path / "home", mount="/home/task", max_bytes=1 << 30, content=(mount,)),
    )
    with pytest.raises(SpawnError) as info:
        backend._spawn(spec)
    assert info.value.code == CONTENT_CHANGED
    assert not (tmp_path / "state").exists()
