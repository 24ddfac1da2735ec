"""Run one task through ClawConnect the way an MCP client does: start ``claw connect mcp`` over stdio with the
official MCP client, call ``run_task``, follow it with ``check_task`` until it ends, print the answer.

    .venv/bin/python examples/connect/run_task.py --agents examples/connect/agents.json "@fake reply: Hello"

The gateway named in agents.json must be running (see the README's ClawConnect section).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(name, arguments)
    data = result.structured_content
    if result.is_error or not isinstance(data, dict):
        raise SystemExit(f"{name} failed: {json.dumps(data)}")
    return data


async def main(agents: str, task: str, data_dir: str) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "clawstack", "connect", "mcp", "--agents", agents, "--data-dir", data_dir, "--log-level", "error"],
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        job = await call(session, "run_task", {"task": task})
        print(f"started {job['jobId']} on {job['agent']} (session {job['sessionKey']})")
        while True:
            snapshot = await call(session, "check_task", job["nextAction"]["args"])
            if snapshot["isTerminal"]:
                break
            print(f"  still {snapshot['status']} ({snapshot['liveness']})")
        print(f"{snapshot['status']} ({snapshot['terminalReason']}): {snapshot['summary'] or snapshot['error']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run one task through claw connect mcp.")
    parser.add_argument("--agents", required=True, help="agents.json")
    parser.add_argument("--data-dir", help="the job store's directory (default: a temporary one)")
    parser.add_argument("task")
    args = parser.parse_args()
    asyncio.run(main(args.agents, args.task, args.data_dir or tempfile.mkdtemp(prefix="clawconnect-")))
