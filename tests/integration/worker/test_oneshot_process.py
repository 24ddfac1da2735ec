"""``python -m clawstack.worker.oneshot`` as a real process against a real scripted fake model on a real socket.

Every run also checks what must never appear on stderr: the task, the contract and the credential's secret.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clawstack.llm.fake import FakeModelServer, parse_script
from clawstack.worker import (
    CONFIG_ENV,
    CONFIG_FILE_ENV,
    ExitCode,
    WorkerConfig,
    WorkerMaxTurnsError,
    answer_from_stdout,
)
from clawstack.worker.oneshot import RUNNER_MODULES, TOOLS_UNAVAILABLE, run_task

SECRET = "Sx9-secret-value-4242"
CREDENTIAL = f"run-42:{SECRET}"
CONTRACT = "You are a careful worker.\nCONTRACT-MARK: answer briefly."
TASK_MARK = "TASK-MARK-7f3a"
MARKER = "\n🦞 ".encode()
PROCESS_LIMIT_S = 30.0


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: str


def config_for(fake: FakeModelServer, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "version": 1,
        "model_base_url": None if fake.unix_socket else fake.base_url,
        "model_unix_socket": fake.unix_socket,
        "credential": CREDENTIAL,
        "model": "primary",
        "contract": CONTRACT,
        "max_turns": 8,
        "request_timeout_s": 30,
    }
    config.update(changes)
    return config


def config_for_url(url: str) -> dict[str, Any]:
    """The smallest config: the optional keys left to their defaults."""
    return {"version": 1, "model_base_url": url, "credential": CREDENTIAL, "model": "primary", "contract": CONTRACT}


def runner_env(config: dict[str, Any] | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != CONFIG_ENV}
    if config is not None:
        env[CONFIG_ENV] = json.dumps(config)
    return env


async def start_runner(config: dict[str, Any] | None, *args: str, python_flags: tuple[str, ...] = ()) -> Any:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *python_flags,
        "-m",
        "clawstack.worker.oneshot",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=runner_env(config),
    )


async def finish(process: Any) -> Finished:
    async with asyncio.timeout(PROCESS_LIMIT_S):
        stdout, stderr = await process.communicate()
    finished = Finished(process.returncode, stdout, stderr.decode("utf-8", "replace"))
    for secret in (SECRET, TASK_MARK, "CONTRACT-MARK", CONFIG_ENV + "={"):
        assert secret not in finished.stderr, f"{secret!r} leaked to stderr"
    return finished


async def run_runner(config: dict[str, Any] | None, *args: str, python_flags: tuple[str, ...] = ()) -> Finished:
    return await finish(await start_runner(config, *args, python_flags=python_flags))


def task(*directives: str) -> str:
    return "\n".join([f"Please do the job {TASK_MARK}.", *directives])


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


# --- answers ---------------------------------------------------------------------------------------------------


async def test_normal_answer(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake), task("@fake reply: The answer is 42."))
    assert result.returncode == ExitCode.ANSWERED
    assert result.stdout == "\n🦞 The answer is 42.\n".encode()
    assert answer_from_stdout(result.stdout.decode()) == "The answer is 42."
    assert "request 1 of 8" in result.stderr


async def test_the_task_is_the_only_user_message_and_the_contract_the_system_message(fake: FakeModelServer) -> None:
    text = task("@fake reply: done")
    result = await run_runner(config_for(fake), text, "session-9")
    assert result.returncode == 0
    [request] = fake.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == [
        {"role": "system", "content": CONTRACT},
        {"role": "user", "content": text},
    ]
    assert request.body["model"] == "primary"
    for field in ("tools", "tool_choice", "stream", "user"):
        assert field not in request.body
    assert "session-9" not in json.dumps(request.body)


async def test_an_empty_contract_sends_no_system_message(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake, contract=""), task("@fake echo"))
    assert result.returncode == 0
    assert [message["role"] for message in fake.requests[0].body["messages"]] == ["user"]


async def test_an_empty_answer_still_prints_the_marker(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake), task("@fake empty"))
    assert result.returncode == 0
    assert result.stdout == "\n🦞 \n".encode()


async def test_a_multiline_answer_is_printed_as_it_is(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake), task("@fake reply: line one", "@fake reply: 🦞 line two"))
    assert result.stdout == "\n🦞 line one\n🦞 line two\n".encode()
    assert result.stdout.startswith(MARKER)  # stdout begins with the runner's marker, so the first one is ours
    assert answer_from_stdout(result.stdout.decode()) == "line one\n🦞 line two"


async def test_a_task_may_begin_with_a_dash(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake), "--", "--help me\n@fake echo")
    assert result.returncode == 0
    assert result.stdout == "\n🦞 --help me\n".encode()


async def test_over_a_unix_socket(short_dir: Path) -> None:
    async with FakeModelServer(unix_socket=short_dir / "m.sock") as fake:
        result = await run_runner(config_for(fake), task("@fake reply: over the socket"))
    assert result.returncode == 0
    assert result.stdout == "\n🦞 over the socket\n".encode()
    assert "unix:" in result.stderr


async def test_the_credential_is_sent_as_the_bearer() -> None:
    async with FakeModelServer(api_key=CREDENTIAL) as fake:
        accepted = await run_runner(config_for(fake), task("@fake reply: authorised"))
        refused = await run_runner(config_for(fake, credential="run-42:another-secret"), task("@fake reply: no"))
    assert accepted.returncode == 0
    assert accepted.stdout == "\n🦞 authorised\n".encode()
    assert refused.returncode == ExitCode.MODEL_FAILED
    assert refused.stdout == b""
    assert "llm_unauthorized" in refused.stderr
    assert "another-secret" not in refused.stderr


async def test_the_config_may_come_from_a_private_file_that_the_runner_removes(
    fake: FakeModelServer, tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_for(fake)))
    path.chmod(0o600)
    # The runner's own main(), then what is left of the CLAW_ variables in its environment.
    code = (
        "import os, sys; "
        "from clawstack.worker.oneshot import main; "
        "status = main(); "
        "sys.stderr.write('env-after:' + repr(sorted(k for k in os.environ if k.startswith('CLAW_'))) + '\\n'); "
        "sys.exit(status)"
    )
    env = runner_env(None)
    env[CONFIG_FILE_ENV] = str(path)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        "--",
        task("@fake reply: from the file"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    result = await finish(process)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n🦞 from the file\n".encode()
    assert not path.exists()
    assert "env-after:[]" in result.stderr


# --- tool calls ------------------------------------------------------------------------------------------------


async def test_a_tool_call_is_answered_unavailable_and_the_model_asked_again(fake: FakeModelServer) -> None:
    text = task('@fake tool-call: search {"q": "x"}', "@fake tool-call: fetch", "@fake reply: done without tools")
    result = await run_runner(config_for(fake), text)
    assert result.returncode == 0
    assert result.stdout == "\n🦞 done without tools\n".encode()
    first, second = fake.requests
    assert "tools" not in first.body
    assert "tools" not in second.body
    system, user, assistant, *tool_messages = second.body["messages"]
    assert (system, user) == ({"role": "system", "content": CONTRACT}, {"role": "user", "content": text})
    assert assistant["role"] == "assistant"
    calls = assistant["tool_calls"]
    assert [(call["type"], call["function"]["name"]) for call in calls] == [
        ("function", "search"),
        ("function", "fetch"),
    ]
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "x"}
    assert tool_messages == [
        {"role": "tool", "tool_call_id": call["id"], "content": TOOLS_UNAVAILABLE} for call in calls
    ]
    assert "2 tool call(s)" in result.stderr


async def test_a_model_that_keeps_asking_for_tools_ends_with_max_turns() -> None:
    step = {"tool_calls": [{"name": "exec", "arguments": {"cmd": "ls"}}]}
    async with FakeModelServer(parse_script([step] * 3)) as fake:
        result = await run_runner(config_for(fake, max_turns=3), f"Work {TASK_MARK}")
        assert len(fake.requests) == 3
        assert fake.script_steps_remaining == 0
    assert result.returncode == 5
    assert result.stdout == b""
    assert "after 3 request(s)" in result.stderr


# --- failures --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("directive", "code"),
    [
        ("@fake fail: 500", "llm_server_error"),
        ("@fake fail: 429", "llm_rate_limited"),
        ("@fake fail: 400", "llm_bad_request"),
        ("@fake malformed", "llm_protocol_error"),
        ("@fake drop-after-chunks: 0", "llm_transport_error"),
    ],
)
async def test_a_model_failure_exits_4_without_a_marker(fake: FakeModelServer, directive: str, code: str) -> None:
    result = await run_runner(config_for(fake), task(directive))
    assert result.returncode == 4
    assert result.stdout == b""
    assert code in result.stderr
    assert "told to fail" not in result.stderr  # what the endpoint said stays out


async def test_an_unreachable_proxy_exits_4() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        result = await run_runner(config_for_url(f"http://127.0.0.1:{port}/v1"), task())
    assert result.returncode == ExitCode.MODEL_FAILED
    assert result.stdout == b""
    assert "llm_connect_failed" in result.stderr


async def test_a_slow_model_hits_the_request_timeout(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake, request_timeout_s=0.5), task("@fake delay-ms: 60000"))
    assert result.returncode == ExitCode.MODEL_FAILED
    assert result.stdout == b""
    assert "llm_deadline_exceeded" in result.stderr


async def test_sigterm_while_the_model_delays_exits_promptly_without_a_marker(fake: FakeModelServer) -> None:
    process = await start_runner(config_for(fake), task("@fake delay-ms: 60000", "@fake reply: too late"))
    async with asyncio.timeout(PROCESS_LIMIT_S):
        await fake.wait_for_requests(1)
    signalled_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    result = await finish(process)
    assert time.monotonic() - signalled_at < 5.0
    assert result.returncode == 143
    assert result.stdout == b""
    async with asyncio.timeout(PROCESS_LIMIT_S):
        await fake.wait_for_client_disconnects(1)  # the request in flight was dropped, not left open


async def test_sigint_exits_130_without_a_marker(fake: FakeModelServer) -> None:
    process = await start_runner(config_for(fake), task("@fake delay-ms: 60000"))
    async with asyncio.timeout(PROCESS_LIMIT_S):
        await fake.wait_for_requests(1)
    process.send_signal(signal.SIGINT)
    result = await finish(process)
    assert result.returncode == 130
    assert result.stdout == b""


# --- usage and configuration -----------------------------------------------------------------------------------


async def test_no_task_is_a_usage_error(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake))
    assert result.returncode == ExitCode.USAGE
    assert result.stdout == b""
    assert "usage: python -m clawstack.worker.oneshot" in result.stderr
    assert fake.requests == []


async def test_too_many_arguments_is_a_usage_error(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake), task(), "session", "extra")
    assert result.returncode == ExitCode.USAGE
    assert fake.requests == []


async def test_a_missing_config_is_a_config_error() -> None:
    result = await run_runner(None, task())
    assert result.returncode == ExitCode.CONFIG
    assert result.stdout == b""
    assert "worker_config_missing" in result.stderr


async def test_an_invalid_config_is_a_config_error(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake, tools=["exec"]), task())
    assert result.returncode == ExitCode.CONFIG
    assert result.stdout == b""
    assert 'unknown key "tools"' in result.stderr
    assert fake.requests == []


# --- what runs -------------------------------------------------------------------------------------------------


async def test_a_real_run_loads_no_clawstack_module_beyond_the_pinned_ones(fake: FakeModelServer) -> None:
    result = await run_runner(config_for(fake), task("@fake reply: ok"), python_flags=("-X", "importtime"))
    assert result.returncode == 0
    loaded = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    clawstack_loaded = {name for name in loaded if name == "clawstack" or name.startswith("clawstack.")}
    # Run with -m, the runner itself executes as __main__ rather than being imported under its name.
    assert clawstack_loaded == set(RUNNER_MODULES) - {"clawstack.worker.oneshot"}


# --- the turn loop, in process ---------------------------------------------------------------------------------


async def test_run_task_in_process(fake: FakeModelServer) -> None:
    lines: list[str] = []
    config = WorkerConfig(credential=CREDENTIAL, model="m", contract="", model_base_url=fake.base_url, max_turns=2)
    answer = await run_task(config, task("@fake tool-call: exec", "@fake reply: fine"), progress=lines.append)
    assert answer == "fine"
    assert len(lines) == 3
    assert all(TASK_MARK not in line and SECRET not in line for line in lines)


async def test_run_task_gives_up_after_max_turns() -> None:
    step = {"tool_calls": [{"name": "spawn", "arguments": {}}]}
    async with FakeModelServer(parse_script([step])) as fake:
        config = WorkerConfig(credential=CREDENTIAL, model="m", contract="c", model_base_url=fake.base_url, max_turns=1)
        with pytest.raises(WorkerMaxTurnsError) as caught:
            await run_task(config, "t", progress=lambda line: None)
    assert caught.value.code == "worker_max_turns"
