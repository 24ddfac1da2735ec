"""`claw demo` as a real subprocess: it runs the main job end to end, says the model is the scripted fake,
and stops its fake-model subprocess whether it succeeds or fails."""

from __future__ import annotations

import os
import signal
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
    assert "answer of acme/demo-1: Ticket 42 (open): the third-floor printer smokes" in output
    assert "status of acme/demo-1 state stopped cancelled False" in output
    assert "status of acme/demo-2 state stopped cancelled True" in output
    assert "revocation_proof cllama_ack" in output
    # One task on one home across two runs: the second resumes the first's session and the report is fetched.
    assert "the second run resumed the first run's session" in output
    assert "Deliverables of home acme/printers: report.md" in output
    assert "Ticket 42: the third-floor printer smokes when printing duplex." in output
    assert " ".join(FAKE_MODEL_STATEMENT.split()) in output
    assert _processes_with(marker) == []


def test_an_interrupted_demo_cleans_up() -> None:
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawstack", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "CLAWSTACK_DEMO_TEST_MARKER": marker},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("Starting the supervisor"):
            break
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    proc.stdout.close()
    assert proc.returncode != 0
    assert _processes_with(marker) == []
