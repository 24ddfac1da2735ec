"""`claw fake-llm serve` as a real subprocess: readiness line, requests over TCP and a Unix socket, clean exit
on SIGTERM and SIGINT, and refusals of bad arguments."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from clawstack.cli import cli
from clawstack.llm import LLMAuthenticationError, LLMClient

READY = "fake-llm listening on "


async def _start(*args: str, env: dict[str, str] | None = None) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "clawstack",
        "fake-llm",
        "serve",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(20):
            line = (await process.stdout.readline()).decode()
    except BaseException:
        process.kill()
        await process.wait()
        raise
    assert line.startswith(READY), line
    return process, line[len(READY) :].strip()


async def _stop(process: asyncio.subprocess.Process, signum: int) -> tuple[int, str]:
    process.send_signal(signum)
    async with asyncio.timeout(10):
        _, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stderr.decode()


def test_help_says_it_is_not_a_language_model() -> None:
    runner = CliRunner()
    for args in (["fake-llm", "--help"], ["fake-llm", "serve", "--help"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0
        assert "not a language model" in " ".join(result.output.split())


async def test_serve_on_tcp_answers_and_exits_on_sigterm() -> None:
    process, address = await _start("--port", "0")
    try:
        assert address.startswith("http://127.0.0.1:")
        assert not address.endswith(":0/v1")
        async with LLMClient(address) as client:
            completion = await client.chat_completion(
                model="m", messages=[{"role": "user", "content": "Private text\n@fake reply: from a process"}]
            )
        assert completion.content == "from a process"
    finally:
        status, stderr = await _stop(process, signal.SIGTERM)
    assert status == 0
    assert "POST /v1/chat/completions -> 200" in stderr
    assert "Private text" not in stderr


async def test_serve_on_a_unix_socket_with_script_and_key(tmp_path: Path) -> None:
    socket_path = tmp_path / "f.sock"
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"reply": "step one"}, {"reply": "step two"}]))
    process, address = await _start(
        "--unix-socket", str(socket_path), "--script", str(script), env={"CLAW_FAKE_LLM_API_KEY": "sk-env"}
    )
    try:
        assert address == f"unix:{socket_path}"
        async with LLMClient("http://localhost/v1", unix_socket=socket_path, api_key="sk-env") as client:
            answers = [
                (await client.chat_completion(model="m", messages=[{"role": "user", "content": "go"}])).content
                for _ in range(2)
            ]
        async with LLMClient("http://localhost/v1", unix_socket=socket_path) as anonymous:
            with pytest.raises(LLMAuthenticationError):
                await anonymous.list_models()
        assert answers == ["step one", "step two"]
    finally:
        status, stderr = await _stop(process, signal.SIGINT)
    assert status == 0
    assert "sk-env" not in stderr
    assert not socket_path.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--unix-socket", "/tmp/x.sock", "--port", "9"], "--unix-socket cannot be combined"),
        (["--port", "70000"], "70000 is not in the range"),
        (["--script", "/nonexistent/script.json"], "does not exist"),
    ],
)
def test_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["fake-llm", "serve", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_malformed_script_is_a_usage_error(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('[{"reply": "a", "echo": true}]')
    result = CliRunner().invoke(cli, ["fake-llm", "serve", "--script", str(script)])
    assert result.exit_code == 2
    assert "script step 1: choose one of reply, echo and empty" in result.output
