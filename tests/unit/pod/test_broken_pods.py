"""Every broken pod in tests/pods/broken/ is refused with its exact error, and nothing is written.

Each file's first line is ``# expect: <the exact message>``; the rest is its claw-pod.yml, placed in a copy of
tests/pods/base/ (a valid pod with its contract, tool descriptor and reference content).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from clawstack.pod.errors import PodError
from clawstack.pod.up import up

PODS = Path(__file__).resolve().parents[2] / "pods"
BROKEN = sorted((PODS / "broken").glob("*.yml"))


def pod_from(tmp_path: Path, pod_file: str) -> Path:
    pod = tmp_path / "pod"
    shutil.copytree(PODS / "base", pod)
    (pod / "claw-pod.yml").write_text(pod_file)
    return pod


def snapshot(directory: Path) -> dict[str, tuple[int, float]]:
    return {
        str(path.relative_to(directory)): (path.stat().st_size, path.stat().st_mtime)
        for path in sorted(directory.rglob("*"))
    }


def test_the_base_pod_compiles(tmp_path: Path) -> None:
    pod = pod_from(tmp_path, (PODS / "base" / "claw-pod.yml").read_text())
    result = up(pod, detach=False, environ={})
    assert [t.name for t in result.compiled.templates] == ["worker"]
    assert (pod / ".claw-runs" / "templates" / "worker.json").exists()


@pytest.mark.parametrize("case", BROKEN, ids=lambda p: p.stem)
def test_broken_pod_is_refused_and_nothing_is_written(tmp_path: Path, case: Path) -> None:
    first, _, pod_file = case.read_text().partition("\n")
    assert first.startswith("# expect: "), f"{case.name} must start with '# expect: <message>'"
    expected = first.removeprefix("# expect: ")
    pod = pod_from(tmp_path, pod_file)
    (tmp_path / "outside").mkdir()
    before = snapshot(pod)
    with pytest.raises(PodError) as info:
        up(pod, detach=False, environ={"CLAW_TEST_PRESENT": "x"})
    assert info.value.message == expected
    assert snapshot(pod) == before


def test_content_symlink_escaping_the_pod_is_refused(tmp_path: Path) -> None:
    base = (PODS / "base" / "claw-pod.yml").read_text()
    pod = pod_from(
        tmp_path,
        base.replace("image: clawstack/oneshot", "image: clawstack/hermes").replace(
            "      models: {primary: local/m}\n",
            "      models: {primary: local/m}\n      run:\n        home: {}\n"
            "        content: [{source: ./reference/link, target: /ref}]\n",
        ),
    )
    os.symlink("/etc", pod / "reference" / "link")
    with pytest.raises(PodError) as info:
        up(pod, detach=False, environ={})
    assert info.value.message == (
        "claw-pod.yml: services.worker.x-claw.run.content[0].source: './reference/link' leaves the pod directory"
    )
