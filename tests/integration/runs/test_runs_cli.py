"""`claw runs ls` and `claw runs status` as real processes against a real supervisor on its socket: the table, its
ages and runtimes, following cursors, --json, --watch on a terminal until Ctrl-C, and the readable status block."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import signal
import struct
import sys
import termios
from datetime import timedelta
from typing import Any

from clawstack.common.clock import SystemClock, format_timestamp

from .conftest import RunsStack
from .test_listing import SECRET, every_page, launch, seed, wait_stopped

COLUMNS = ["INSTALLATION", "RUN", "STATE", "FAILURE", "AGE", "RUNTIME", "TEMPLATE"]


def ago(seconds: float) -> str:
    return format_timestamp(SystemClock().now() - timedelta(seconds=seconds))


def claw_args(stack: RunsStack, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "clawstack",
        "runs",
        *args,
        "--pod",
        str(stack.pod),
        "--socket-dir",
        str(stack.socket_dir),
    ]


async def claw(stack: RunsStack, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *claw_args(stack, *args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def table_rows(output: str) -> list[list[str]]:
    lines = output.strip("\n").splitlines()
    assert lines[0].split() == COLUMNS, lines[0]
    return [line.split() for line in lines[1:]]


async def test_ls_prints_the_table_newest_first_with_ages_and_runtimes(stack: RunsStack) -> None:
    seed(
        stack,
        "cli-old",
        state="failed",
        failure="timeout",
        accepted_at=ago(2 * 3600 + 30),
        started_at=ago(2 * 3600 + 20),
        ended_at=ago(2 * 3600 + 20 - 4 * 60 - 5),
    )
    seed(stack, "cli-live", state="running", accepted_at=ago(3 * 60 + 40), started_at=ago(3 * 60 + 30))
    await launch(stack, "cli-new")
    await wait_stopped(stack, ["cli-new"])
    seed(stack, "cli-queued", installation="beta", state="accepted", accepted_at=ago(10))
    code, out, err = await claw(stack, "ls")
    assert code == 0, err
    rows = table_rows(out)
    assert [row[:2] for row in rows] == [
        ["acme", "cli-new"],
        ["beta", "cli-queued"],
        ["acme", "cli-live"],
        ["acme", "cli-old"],
    ]
    new, queued, live, old = rows
    assert new[2:4] == ["stopped", "-"]
    assert re.fullmatch(r"\d+s", new[4])
    assert re.fullmatch(r"\d+s", new[5])
    assert new[6] == "worker"
    assert queued[2:4] == ["accepted", "-"]
    assert re.fullmatch(r"1\ds", queued[4])
    assert queued[5] == "-"  # never started: no runtime
    assert live[2:6] == ["running", "-", "3m", "3m"]  # running: runtime to now
    assert old[2:6] == ["failed", "timeout", "2h", "4m"]  # ended: runtime to its end
    assert SECRET not in out

    code, out, _ = await claw(stack, "ls", "--state", "failed")
    assert [row[1] for row in table_rows(out)] == ["cli-old"]
    code, out, _ = await claw(stack, "ls", "--installation", "beta")
    assert [row[1] for row in table_rows(out)] == ["cli-queued"]
    code, out, _ = await claw(stack, "ls", "--limit", "2")
    assert [row[1] for row in table_rows(out)] == ["cli-new", "cli-queued"]
    code, out, _ = await claw(stack, "ls", "--installation", "nobody")
    assert (code, table_rows(out)) == (0, [])

    code, out, err = await claw(stack, "ls", "--installation", "Not-Valid")
    assert code == 1
    assert "request_invalid" in err
    code, _, err = await claw(stack, "ls", "--state", "cancelled")
    assert code == 2  # a usage error, before the supervisor is asked


async def test_ls_follows_cursors_and_json_prints_the_status_objects(stack: RunsStack) -> None:
    for i in range(520):
        seed(stack, f"many-{i:04d}", accepted_at=f"2025-04-01T00:{i // 60:02d}:{i % 60:02d}Z")
    code, out, err = await claw(stack, "ls")
    assert code == 0, err
    rows = table_rows(out)
    assert [row[1] for row in rows] == [f"many-{i:04d}" for i in range(519, -1, -1)]  # more than one page of 500
    code, out, _ = await claw(stack, "ls", "--limit", "510")
    assert len(table_rows(out)) == 510
    code, out, err = await claw(stack, "ls", "--json")
    assert code == 0, err
    printed = json.loads(out)
    assert printed == await every_page(stack)  # every status object, exactly as the API gives it
    code, out, _ = await claw(stack, "ls", "--json", "--limit", "3", "--installation", "acme")
    assert [s["run_id"] for s in json.loads(out)] == ["many-0519", "many-0518", "many-0517"]
    code, out, _ = await claw(stack, "ls", "--json", "--installation", "nobody")
    assert json.loads(out) == []
    code, _, err = await claw(stack, "ls", "--json", "--watch")
    assert code == 2


async def read_until(master: int, seen: bytearray, wanted: bytes, timeout_s: float = 30) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        while wanted not in seen:
            ready = asyncio.Event()
            loop.add_reader(master, ready.set)
            try:
                await ready.wait()
            finally:
                loop.remove_reader(master)
            seen.extend(os.read(master, 65536))


async def test_ls_watch_redraws_on_a_terminal_until_ctrl_c(stack: RunsStack) -> None:
    seed(stack, "watch-first", accepted_at=ago(5))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    process = await asyncio.create_subprocess_exec(
        *claw_args(stack, "ls", "--watch"), stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    seen = bytearray()
    try:
        await read_until(master, seen, b"watch-first")
        assert b"INSTALLATION" in seen
        seed(stack, "watch-second", accepted_at=ago(1))
        await read_until(master, seen, b"watch-second")  # a later redraw shows a run that was not there
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            code = await process.wait()
        assert code == 0
        assert b"Traceback" not in seen
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        os.close(master)


def status_rows(output: str) -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in output.strip("\n").splitlines():
        name, _, value = line.partition(" ")
        rows[name] = value.strip()
    return rows


async def test_status_prints_a_readable_block_and_json_prints_the_raw_status(stack: RunsStack) -> None:
    await launch(stack, "shown")
    await wait_stopped(stack, ["shown"])
    raw: dict[str, Any] = (await stack.call("GET", "/v1/runs/acme/shown")).json()
    code, out, err = await claw(stack, "status", "acme", "shown")
    assert code == 0, err
    with_json = await claw(stack, "status", "acme", "shown", "--json")
    assert with_json[0] == 0
    assert json.loads(with_json[1]) == raw
    rows = status_rows(out)
    assert rows["run"] == "acme/shown"
    assert rows["state"] == "stopped"
    assert rows["failure"] == "-"
    assert rows["template"] == "worker"
    assert rows["template_id"] == raw["template_id"]
    for model in raw["models"]:
        assert f"{model['slot']} {model['ref']}" in rows["models"]
    assert rows["callbacks"] == "start skipped, end skipped"
    assert rows["revocation_proof"] == raw["revocation_proof"] == "cllama_ack"
    assert rows["result"] == f"{raw['result']['bytes']} bytes"
    assert rows["pending"] == "-"
    for name in ("accepted_at", "started_at", "exited_at", "ended_at"):
        assert rows[name] == raw[name]
    assert SECRET not in out

    seed(stack, "broken", state="failed", failure="exit_nonzero", pending="revocation unavailable; retrying")
    rows = status_rows((await claw(stack, "status", "acme", "broken"))[1])
    assert (rows["state"], rows["failure"]) == ("failed", "exit_nonzero")
    assert rows["pending"] == "revocation unavailable; retrying"
    assert rows["started_at"] == "-"
    code, _, err = await claw(stack, "status", "acme", "ghost")
    assert code == 1
    assert "not_found" in err
