"""A prompt-injected model turns ``exec`` against the host: a fork bomb and a parallel memory hog. Each ends its
own call with a clear error, promptly, and the gateway keeps serving another session's turn meanwhile.

The limits here are small (32 processes, 128 MiB) and every wait is bounded, so that a regression fails the test
instead of taking the machine down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_ws_protocol import API_KEY, Client, config_document, connected

pytestmark = pytest.mark.security

PIDS = 32
MEMORY_MB = 128
EXEC_TIMEOUT_S = 20  # the call's own limit: a bomb must end well before it
BOMB_DEADLINE_S = 15.0
# The command waits for its bomb: a command that returned at once would end its sandbox, bomb and all, before the
# bomb could reach the limit.
FORK_BOMB = "bomb() { bomb | bomb & }; bomb; wait"
FORK_LOOP = "python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'"
# Four processes of 100 MiB each, together over the 128 MiB limit; each alone would fit.
MEMORY_HOG = "for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(100 << 20); time.sleep(30)' & done; wait"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[FakeModelServer, Client, Client]]:
    async with FakeModelServer(api_key=API_KEY) as fake:
        document = config_document(fake.base_url)
        document["agents"]["list"] = [{"id": "main", "default": True, "workspace": str(tmp_path / "ws")}]
        document["tools"] = {"exec": {"pidsLimit": PIDS, "memoryLimitMb": MEMORY_MB}}
        config = parse_config(document, base_dir=tmp_path, environ={})
        async with (
            GatewayServer(config, data_dir=tmp_path / "data") as server,
            aiohttp.ClientSession() as http,
        ):
            yield fake, await connected(http, server.port), await connected(http, server.port)


async def start(client: Client, key: str, message: str) -> str:
    res = await client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": message})
    assert res.get("ok"), res
    return str(res["payload"]["runId"])


async def finish(client: Client, key: str, run_id: str) -> list[dict[str, Any]]:
    async with asyncio.timeout(BOMB_DEADLINE_S + 10):
        await client.wait_for_chat(run_id, "final", "error")
    history = await client.request("chat.history", {"sessionKey": key, "limit": 100})
    return [m["content"][0] for m in history["payload"]["messages"] if m["role"] == "tool"]


async def quiet_turn(client: Client, fake: FakeModelServer, tag: str) -> float:
    """Another session's plain turn; its latency in seconds."""
    fake.add_script_steps(parse_script([{"match_user": tag, "reply": f"{tag} answered"}]))
    started = time.monotonic()
    run_id = await start(client, "agent:main:channel:web:other", tag)
    async with asyncio.timeout(10):
        await client.wait_for_chat(run_id, "final", "error")
    return time.monotonic() - started


async def bomb_while_another_session_talks(gateway: Any, tag: str, command: str) -> tuple[str, float, float]:
    fake, bomber, other = gateway
    baseline = await quiet_turn(other, fake, f"{tag}-BASELINE")
    fake.add_script_steps(
        parse_script(
            [
                {
                    "match_user": tag,
                    "tool_calls": [
                        {"name": "exec", "arguments": {"command": command, "timeoutSeconds": EXEC_TIMEOUT_S}}
                    ],
                },
                {"match_user": tag, "reply": "done"},
            ]
        )
    )
    started = time.monotonic()
    run_id = await start(bomber, "agent:main:main", tag)
    await asyncio.sleep(0.3)  # let the bomb go off (no synchronisation is possible with it: it is the attack)
    during = await quiet_turn(other, fake, f"{tag}-DURING")
    (result,) = await finish(bomber, "agent:main:main", run_id)
    elapsed = time.monotonic() - started
    assert result["isError"] is True
    assert elapsed < BOMB_DEADLINE_S, f"the bomb ran {elapsed:.1f}s"
    # An order of magnitude only: the machine is shared and noisy.
    assert during < max(3.0, 20 * baseline), f"another session's turn took {during:.2f}s (baseline {baseline:.2f}s)"
    return str(result["text"]), elapsed, during


@pytest.mark.parametrize("command", [FORK_BOMB, FORK_LOOP], ids=["shell-fork-bomb", "python-fork-loop"])
async def test_a_fork_bomb_ends_the_call_at_the_pids_limit(gateway: Any, command: str) -> None:
    text, _, _ = await bomb_while_another_session_talks(gateway, "FORK-BOMB", command)
    assert f"the sandbox's process limit ({PIDS} processes) was reached" in text
    assert "timed out" not in text


async def test_a_parallel_memory_hog_ends_the_call_at_the_memory_limit(gateway: Any) -> None:
    text, _, _ = await bomb_while_another_session_talks(gateway, "MEMORY-HOG", MEMORY_HOG)
    assert f"the sandbox's memory limit ({MEMORY_MB} MiB) was reached" in text


async def test_positive_control_a_command_within_the_limits_succeeds(gateway: Any) -> None:
    fake, client, _ = gateway
    fake.add_script_steps(
        parse_script(
            [
                {
                    "match_user": "CONTROL",
                    "tool_calls": [
                        {
                            "name": "exec",
                            "arguments": {
                                "command": "for i in 1 2 3 4; do python3 -c 'b = bytearray(8 << 20)' & done; wait; "
                                "echo fine; id -u"
                            },
                        }
                    ],
                },
                {"match_user": "CONTROL", "reply": "done"},
            ]
        )
    )
    (result,) = await finish(client, "agent:main:main", await start(client, "agent:main:main", "CONTROL"))
    assert result["isError"] is False
    lines = result["text"].split()
    assert lines[0] == "fine"
