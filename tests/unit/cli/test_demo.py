"""`claw demo` as a real subprocess: it runs the main job end to end, says the model is the scripted fake,
and stops its fake-model subprocess whether it succeeds or fails."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from clawstack.cli.demo import FAKE_MODEL_STATEMENT


def _run_demo(*args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    marker = uuid.uuid4().hex
    result = subprocess.run(
        [sys.executable, "-m", "clawstack", "demo", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CLAWSTACK_DEMO_TEST_MARKER": marker},
        check=False,
    )
    return result, marker


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment carries ``marker``: the demo's children, if any were left behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if f"CLAWSTACK_DEMO_TEST_MARKER={marker}".encode() in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def test_demo_runs_end_to_end_and_says_the_model_is_fake() -> None:
    result, marker = _run_demo()
    assert result.returncode == 0, result.stderr
    output = " ".join(result.stdout.split())
    assert "Hello from clawstack's scripted fake model." in output
    assert "Streaming works too: this sentence comes back to you word by word." in output
    assert "not a language model" in output
    assert " ".join(FAKE_MODEL_STATEMENT.split()) in output
    assert _processes_with(marker) == []


def test_demo_failure_is_reported_and_cleans_up() -> None:
    result, marker = _run_demo("--timeout-s", "0.001")
    assert result.returncode == 1
    assert "Error: the demo timed out after 0.001 s while waiting for the fake model to be ready" in result.stderr
    assert _processes_with(marker) == []
