"""The README's ClawConnect example runs as written: the example gateway config, the example agents.json and
examples/connect/run_task.py (ports moved to free ones so that tests can run side by side)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.connect.harness import free_port, start_process, stop

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def test_the_readme_example(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    fake_port, gateway_port = free_port(), free_port()
    config = tmp_path / "examples" / "gateway" / "gateway.json5"
    config.write_text(config.read_text().replace("18089", str(fake_port)).replace("18789", str(gateway_port)))
    agents = tmp_path / "examples" / "connect" / "agents.json"
    agents.write_text(agents.read_text().replace("18789", str(gateway_port)))
    python = [sys.executable, "-m", "clawstack"]
    fake, _ = start_process([*python, "fake-llm", "serve", "--port", str(fake_port)], "fake-llm listening on ")
    try:
        gateway, _ = start_process(
            [*python, "gateway", "serve", "--config", str(config)],
            "gateway listening on ",
            {"CLAW_GATEWAY_TOKEN": json.loads(agents.read_text())["agents"][0]["token"]},
        )
        try:
            result = subprocess.run(
                [
                    sys.executable,
                    str(tmp_path / "examples" / "connect" / "run_task.py"),
                    "--agents",
                    str(agents),
                    "--data-dir",
                    str(tmp_path / "jobs"),
                    "@fake reply: Hello from the scripted model",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "HOME": str(tmp_path)},
                check=False,
            )
        finally:
            stop(gateway)
    finally:
        stop(fake)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "completed (final): Hello from the scripted model"
