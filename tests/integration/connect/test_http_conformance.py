"""The official MCP conformance suite's server scenarios against ``claw connect http``.

The suite (npm ``@modelcontextprotocol/conformance``, installed with its own Node.js under ``.peers/`` by
``scripts/openclaw-up``) connects to a real ``claw connect http`` process, with ``claw gateway serve`` and
``claw fake-llm serve`` behind it, as an MCP client over Streamable HTTP; its client sends no header of ours, so the
caller's personal token rides in the ``pass`` query parameter. Every scenario that applies to this server runs and
must end with no failure and no warning in its ``checks.json``; the others are excluded by name, each with the
reason, and the suite's own scenario list must be exactly those two sets, so that a new scenario is never skipped
unseen. The test skips, saying why, when the suite is not installed, and fails instead under
``CLAWSTACK_REQUIRE_OPENCLAW=1`` (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.connect.harness import GatewayProcess, HttpConnect, connect_env
from tests.integration.gateway import peers

CONFORMANCE_CLI = peers.NODE.parent.parent / "conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js"
TOKEN = "conformance-token-0123456789abcdef"
RUN_S = 120.0


def conformance_missing_reason() -> str | None:
    """Why the conformance suite cannot run here, or ``None`` when ``scripts/openclaw-up`` installed it."""
    for path in (peers.NODE, CONFORMANCE_CLI):
        if not path.exists():
            return f"the MCP conformance suite is not installed ({path} is missing); run scripts/openclaw-up"
    return None


pytestmark = [pytest.mark.conformance, pytest.mark.slow]
if os.environ.get(peers.REQUIRE_OPENCLAW_ENV) != "1":
    _reason = conformance_missing_reason()
    pytestmark.append(pytest.mark.skipif(_reason is not None, reason=f"needs the MCP conformance suite: {_reason}"))

#: The server scenarios that apply to ClawConnect: each must pass without a warning.
SCENARIOS = ["server-initialize", "ping", "tools-list", "server-sse-multiple-streams", "dns-rebinding-protection"]

#: The server scenarios that do not apply, and why. The ``tools-call-*`` ones call the suite's own test tools; two
#: of them would "pass" only because ClawConnect's refusal of an unknown tool is a text result with ``isError``.
EXCLUDED = {
    "logging-set-level": "the server declares no logging capability, so logging/setLevel is rightly -32601",
    "completion-complete": "the server declares no completions capability",
    "tools-call-simple-text": "calls the suite's test_simple_text tool, which this server does not have",
    "tools-call-image": "calls the suite's test_image_content tool, which this server does not have",
    "tools-call-audio": "calls the suite's test_audio_content tool, which this server does not have",
    "tools-call-embedded-resource": "calls the suite's test_embedded_resource tool, which this server does not have",
    "tools-call-mixed-content": "calls the suite's test_multiple_content_types tool, which this server does not have",
    "tools-call-with-logging": "calls the suite's test_tool_with_logging tool, which this server does not have",
    "tools-call-error": "calls the suite's test_error_handling tool, which this server does not have",
    "tools-call-with-progress": "calls the suite's test_tool_with_progress tool, which this server does not have",
    "tools-call-sampling": "needs the suite's test_sampling tool; no ClawConnect tool asks the client to sample",
    "tools-call-elicitation": "needs the suite's test_elicitation tool; no ClawConnect tool elicits from the client",
    "elicitation-sep1034-defaults": "needs the suite's elicitation test tool; no ClawConnect tool elicits",
    "elicitation-sep1330-enums": "needs the suite's elicitation test tool; no ClawConnect tool elicits",
    "json-schema-2020-12": "pending in the suite; needs its json_schema_2020_12_tool, which this server does not have",
    "server-sse-polling": "pending in the suite; needs its test_reconnection tool, and its POST names revision "
    "2025-03-26, which SEP-1699 gives no priming event (test_http_sessions.py covers priming and resumption)",
    "resources-list": "the server declares no resources",
    "resources-read-text": "the server declares no resources",
    "resources-read-binary": "the server declares no resources",
    "resources-templates-read": "the server declares no resources",
    "resources-subscribe": "the server declares no resources",
    "resources-unsubscribe": "the server declares no resources",
    "prompts-list": "the server declares no prompts",
    "prompts-get-simple": "the server declares no prompts",
    "prompts-get-with-args": "the server declares no prompts",
    "prompts-get-embedded-resource": "the server declares no prompts",
    "prompts-get-with-image": "the server declares no prompts",
}


def conformance(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One run of the suite's CLI with the Node.js ``scripts/openclaw-up`` installed."""
    reason = conformance_missing_reason()
    if reason is not None:
        pytest.fail(f"{peers.REQUIRE_OPENCLAW_ENV}=1 but {reason}")
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "npm_"))}
    return subprocess.run(
        [str(peers.NODE), str(CONFORMANCE_CLI), *args],
        capture_output=True,
        text=True,
        timeout=RUN_S,
        cwd=workdir,
        env={**env, "HOME": str(home)},
        check=False,
    )


def checks_of(results: Path) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for path in sorted(results.glob("*/checks.json")):
        checks.extend(json.loads(path.read_text()))
    return checks


def test_every_server_scenario_is_run_or_excluded_with_a_reason(tmp_path: Path) -> None:
    listed = conformance(tmp_path, "list", "--server")
    assert listed.returncode == 0, listed.stderr
    names = {line.strip()[2:].split(" ")[0] for line in listed.stdout.splitlines() if line.strip().startswith("- ")}
    assert names == set(SCENARIOS) | set(EXCLUDED)
    assert not set(SCENARIOS) & set(EXCLUDED)


@pytest.fixture
def server(tmp_path: Path, gateway: GatewayProcess) -> Iterator[HttpConnect]:
    http = HttpConnect(tmp_path / "c", connect_env(gateway, MCP_USER_TOKENS=f"Conformance:{TOKEN}"))
    try:
        yield http
    finally:
        assert http.close() == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_conformance_scenario_passes_without_warnings(tmp_path: Path, server: HttpConnect, scenario: str) -> None:
    results = tmp_path / "results"
    run = conformance(
        tmp_path, "server", "--url", f"{server.url}?pass={TOKEN}", "--scenario", scenario, "-o", str(results)
    )
    summary = [line for line in run.stdout.splitlines() if "passed" in line and "failed" in line]
    assert run.returncode == 0, f"{scenario}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    checks = checks_of(results)
    assert checks, f"{scenario}: no checks.json under {results}"
    bad = [(c["id"], c["status"], c.get("errorMessage")) for c in checks if c["status"] in ("FAILURE", "WARNING")]
    assert bad == [], f"{scenario}: {summary}"
    assert any(c["status"] == "SUCCESS" for c in checks), summary
    assert TOKEN not in run.stdout.replace(f"?pass={TOKEN}", "")  # the suite echoes the URL, and nothing else of it
