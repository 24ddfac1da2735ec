"""``claw runs doctor --remove-orphans`` while another process holds the pod lock (a serving supervisor): a clear
error with the lock's code and a non-zero exit, no traceback, and the orphan left alone."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from clawstack.cli import cli
from clawstack.common.files import ensure_private_dir, write_private
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.lock import PodLock


def local_pod_with_an_orphan(root: Path) -> PodPaths:
    paths = PodPaths(root.resolve())
    ensure_private_dir(paths.runs)
    write_private(paths.manifest, json.dumps({"pod": "p", "backend": "local"}).encode())
    run_dir = paths.runs / "workers" / "acme" / "stray"
    run_dir.mkdir(parents=True, mode=0o700)
    labels = {"pod": "p", "installation": "acme", "run_id": "stray"}
    record = {"labels": labels, "isolation": "bubblewrap", "monitor": None, "sandbox": None, "cgroups": None}
    (run_dir / "monitor.json").write_text(json.dumps(record))
    return paths


def test_remove_orphans_while_the_supervisor_holds_the_pod_is_a_clear_error(tmp_path: Path) -> None:
    paths = local_pod_with_an_orphan(tmp_path / "pod")
    held = PodLock(paths.lock, holder="claw runs serve")
    held.acquire()
    try:
        result = CliRunner().invoke(cli, ["runs", "doctor", "--pod", str(paths.pod), "--remove-orphans"])
    finally:
        held.release()
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # click's own exit, not an exception escaping
    assert "Traceback" not in result.output
    assert "Error: pod_locked:" in result.output
    assert "claw runs serve" in result.output  # who holds it
    assert "acme/stray" in result.output  # reported, and left in place
    assert (paths.runs / "workers" / "acme" / "stray" / "monitor.json").exists()


def test_remove_orphans_with_the_pod_free_removes_them(tmp_path: Path) -> None:
    paths = local_pod_with_an_orphan(tmp_path / "pod")
    result = CliRunner().invoke(cli, ["runs", "doctor", "--pod", str(paths.pod), "--remove-orphans"])
    assert "removed acme/stray" in result.output, result.output
    assert not (paths.runs / "workers" / "acme" / "stray").exists()
