"""The MCP Inspector's CLI mode drives ``claw connect mcp`` over stdio.

The Inspector (npm ``@modelcontextprotocol/inspector``, installed with its own Node.js under ``.peers/`` by
``scripts/openclaw-up``) starts ``claw connect mcp`` itself, as an MCP client configured with a command would, with
``claw gateway serve`` and ``claw fake-llm serve`` behind it. Each Inspector run is one ``claw connect`` process:
it lists the tools, calls ``run_task`` once, and a later run follows that task with ``check_task`` on the same
job store. The tests skip, saying why, when the Inspector is not installed, and fail instead under
``CLAWSTACK_REQUIRE_OPENCLAW=1`` (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.connect.harness import GATEWAY_PASSWORD, FakeModel, GatewayProcess
from tests.integration.connect.test_e2e import requests_for
from tests.integration.gateway import peers

pytestmark = peers.inspector_marks()

TOOLS = ["run_task", "check_task", "get_task", "list_tasks", "get_session", "list_sessions", "cancel_task"]
RUN_S = 120.0


def inspector(workdir: Path, gateway: GatewayProcess, *method: str) -> dict[str, Any]:
    """One ``mcp-inspector --cli`` run against ``claw connect mcp`` (job store in ``workdir/c``); its JSON output."""
    reason = peers.inspector_missing_reason()
    if reason is not None:
        pytest.fail(f"{peers.REQUIRE_OPENCLAW_ENV}=1 but {reason}")
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    server_env = {
        "HOME": str(home),
        "OPENCLAW_URL": gateway.url,
        "OPENCLAW_PASSWORD": GATEWAY_PASSWORD,
        "OPENCLAW_AGENT_ID": "main",
    }
    server = [peers.claw_executable(), "connect", "mcp", "--data-dir", str(workdir / "c"), "--log-level", "warning"]
    argv = [str(peers.NODE), str(peers.INSPECTOR_CLI), "--cli"]
    for name, value in server_env.items():
        argv += ["-e", f"{name}={value}"]
    argv += [*method, "--", *server]
    # The Inspector keeps a catalog under ~/.mcp-inspector: a scratch HOME keeps the real one untouched.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "npm_", "OPENCLAW_"))}
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=RUN_S, cwd=workdir, env={**env, "HOME": str(home)}, check=False
    )
    assert proc.returncode == 0, f"inspector exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    output = json.loads(proc.stdout)
    assert isinstance(output, dict)
    return output


def test_the_inspector_lists_the_tools_and_runs_a_task(
    tmp_path: Path, gateway: GatewayProcess, fake_model: FakeModel
) -> None:
    listed = inspector(tmp_path, gateway, "--method", "tools/list")
    assert [tool["name"] for tool in listed["tools"]] == TOOLS
    for tool in listed["tools"]:
        assert tool["description"].startswith("READ ONLY:") == (tool["name"] not in ("run_task", "cancel_task"))
        assert tool["inputSchema"]["type"] == "object"
    run_task = listed["tools"][0]
    assert run_task["inputSchema"]["required"] == ["task"]

    task = "inspector-marker\n@fake reply: pong via the inspector"
    started = inspector(
        tmp_path, gateway, "--method", "tools/call", "--tool-name", "run_task", "--tool-arg", f"task={task}"
    )
    assert started["isError"] is False
    job = started["structuredContent"]
    assert job["status"] == "running"
    assert job["agent"] == "openclaw"
    assert job["nextAction"] == {"tool": "check_task", "args": {"jobId": job["jobId"], "sessionKey": job["sessionKey"]}}
    assert json.loads(started["content"][0]["text"]) == job

    deadline = time.monotonic() + RUN_S
    while True:
        checked = inspector(
            tmp_path,
            gateway,
            *("--method", "tools/call", "--tool-name", "check_task"),
            *("--tool-arg", f"jobId={job['jobId']}", f"sessionKey={job['sessionKey']}", "waitMs=10000"),
        )
        snap = checked["structuredContent"]
        if snap["isTerminal"] or time.monotonic() > deadline:
            break
    assert (snap["status"], snap["summary"], snap["resultSource"]) == ("completed", "pong via the inspector", "parent")
    assert requests_for(fake_model, "inspector-marker") == 1


def test_the_inspector_runs_run_task_as_a_native_task(
    tmp_path: Path, gateway: GatewayProcess, fake_model: FakeModel
) -> None:
    # The Inspector's modern era speaks 2026-07-28 and the tasks extension: its --task call is answered with a task,
    # which it follows with tasks/get until the result is inlined.
    era = "modern"
    task = f"inspector-{era}-task\n@fake reply: pong as a task"
    answered = inspector(
        tmp_path,
        gateway,
        *("--protocol-era", era, "--method", "tools/call", "--tool-name", "run_task"),
        *("--tool-arg", f"task={task}", "--task"),
    )
    assert answered["structuredContent"]["summary"] == "pong as a task"
    assert requests_for(fake_model, f"inspector-{era}-task") == 1
