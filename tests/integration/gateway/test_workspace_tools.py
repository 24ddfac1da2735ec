"""The ``exec`` workspace tool in a real bubblewrap sandbox: OpenClaw's result texts, the working directory
confined to the workspace, nothing written outside it, no network, the time and output bounds, the refused
arguments, and the blind view."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from clawstack.gateway.tools import ToolError, ToolInvocation
from clawstack.gateway.workspace_tools import WORKSPACE_MARK, WorkspaceToolLimits, workspace_tools
from clawstack.sandbox import Sandbox

SECRET = "outside secret\n"


@pytest.fixture
def sandbox() -> Sandbox:
    if shutil.which("bwrap") is None:
        pytest.fail("exec runs in bubblewrap, which is not installed here: apt-get install -y bubblewrap")
    return Sandbox()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text(SECRET)
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "notes.txt").write_text("alpha\n")
    (ws / "to-secret").symlink_to(outside / "secret")
    (ws / "out-dir").symlink_to(outside)
    (ws / "in-dir").symlink_to("sub")
    return ws


async def run(
    sandbox: Sandbox, workspace: Path | None, arguments: dict[str, Any], *, blind: bool = False, **limits: Any
) -> str:
    tool = {tool.name: tool for tool in workspace_tools(sandbox=sandbox, limits=WorkspaceToolLimits(**limits))}["exec"]
    invocation = ToolInvocation("run-1", "agent:main:main", "main", "call-1", workspace=workspace, blind=blind)
    return await tool.handler(arguments, invocation)


async def fails(sandbox: Sandbox, workspace: Path | None, arguments: dict[str, Any], **options: Any) -> str:
    with pytest.raises(ToolError) as caught:
        await run(sandbox, workspace, arguments, **options)
    return caught.value.message


# --- results ----------------------------------------------------------------------------------------------------


async def test_output_and_exit_codes_read_as_openclaws(sandbox: Sandbox, workspace: Path) -> None:
    assert await run(sandbox, workspace, {"command": "cat notes.txt; echo warn >&2"}) == "alpha\nwarn"
    assert await run(sandbox, workspace, {"command": "true"}) == "(no output)"
    assert await run(sandbox, workspace, {"command": "echo partial; exit 3"}) == (
        "partial\n\n(Command exited with code 3)"
    )
    assert await run(sandbox, workspace, {"command": "exit 4"}) == "(no output)\n\n(Command exited with code 4)"
    assert await fails(sandbox, workspace, {"command": "no-such-command-here"}) == (
        "/bin/sh: 1: no-such-command-here: not found\n\nCommand not found"
    )
    (workspace / "script.sh").write_text("echo hi\n")
    assert await fails(sandbox, workspace, {"command": "./script.sh"}) == (
        "/bin/sh: 1: ./script.sh: Permission denied\n\nCommand not executable (permission denied)"
    )


async def test_the_command_runs_in_the_workspace_at_its_own_path(sandbox: Sandbox, workspace: Path) -> None:
    assert await run(sandbox, workspace, {"command": "pwd; echo $HOME"}) == f"{workspace}\n{workspace}"
    assert await run(sandbox, workspace, {"command": "pwd", "workdir": "sub"}) == f"{workspace}/sub"
    assert await run(sandbox, workspace, {"command": "pwd", "workdir": "in-dir"}) == f"{workspace}/sub"
    assert await run(sandbox, workspace, {"command": "pwd", "workdir": str(workspace / "sub")}) == f"{workspace}/sub"
    assert await run(sandbox, workspace, {"command": "pwd", "workdir": ""}) == str(workspace)
    assert await run(sandbox, workspace, {"command": "echo made > sub/new.txt"}) == "(no output)"
    assert (workspace / "sub" / "new.txt").read_text() == "made\n"


@pytest.mark.parametrize("workdir", ["..", "/etc", "out-dir", "{outside}", "{ws}/../outside"])
async def test_the_working_directory_cannot_leave_the_workspace(
    sandbox: Sandbox, workspace: Path, workdir: str
) -> None:
    path = workdir.format(ws=workspace, outside=workspace.parent / "outside")
    message = await fails(sandbox, workspace, {"command": "pwd", "workdir": path})
    assert f"escapes workspace root ({workspace}): {path}" in message


async def test_bad_working_directories_are_refused(sandbox: Sandbox, workspace: Path) -> None:
    assert await fails(sandbox, workspace, {"command": "pwd", "workdir": "notes.txt"}) == (
        "notes.txt is not a directory"
    )
    assert await fails(sandbox, workspace, {"command": "pwd", "workdir": "missing"}) == "missing does not exist"
    assert (await fails(sandbox, workspace, {"command": "pwd", "workdir": "  "})).startswith(
        "exec: workdir must be a path"
    )


# --- containment ----------------------------------------------------------------------------------------------


async def test_nothing_outside_the_workspace_can_be_written(sandbox: Sandbox, workspace: Path) -> None:
    outside = workspace.parent / "outside"
    probe = f"claw-exec-probe-{secrets.token_hex(4)}"
    script = (
        f"echo pwned > {outside}/secret; echo pwned > {outside}/new; echo pwned > to-secret;"
        f"echo pwned > /usr/{probe}; echo pwned > /{probe}; echo tmp > /tmp/{probe};"
        f"cat /tmp/{probe}; cat to-secret; ls {outside}"
    )
    result = await run(sandbox, workspace, {"command": script})
    assert "tmp" in result.splitlines()
    assert SECRET.strip() not in result
    assert (outside / "secret").read_text() == SECRET
    assert sorted(path.name for path in outside.iterdir()) == ["secret"]
    assert not os.path.exists(f"/usr/{probe}")  # noqa: ASYNC240 (one stat)
    assert not os.path.exists(f"/tmp/{probe}")  # noqa: ASYNC240 (one stat): the sandbox's /tmp is its own


async def test_the_network_cannot_be_reached(sandbox: Sandbox, workspace: Path) -> None:
    accepted: list[object] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(reader)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')\n"
        "except OSError as exc:\n"
        "    print('unreachable', type(exc).__name__)\n"
    )
    try:
        result = await run(sandbox, workspace, {"command": f'python3 -c "{code}"'})
    finally:
        server.close()
        await server.wait_closed()
    assert result == "unreachable ConnectionRefusedError"
    assert accepted == []


async def test_the_environment_is_clean_and_env_overrides_apply(
    sandbox: Sandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAW_GATEWAY_SECRET", "never-inside")
    result = await run(sandbox, workspace, {"command": "env | sort", "env": {"GREETING": "hi there"}})
    assert "never-inside" not in result
    names = {line.split("=", 1)[0] for line in result.splitlines()}
    assert names - {"PWD", "OLDPWD", "SHLVL", "_"} == {"PATH", "HOME", "LANG", "GREETING"}
    assert "GREETING=hi there" in result.splitlines()


# --- bounds -----------------------------------------------------------------------------------------------------


async def test_a_command_over_its_time_is_killed(sandbox: Sandbox, workspace: Path) -> None:
    started = asyncio.get_running_loop().time()
    message = await fails(sandbox, workspace, {"command": "echo before; sleep 30 & sleep 30", "timeoutSeconds": 0.5})
    assert asyncio.get_running_loop().time() - started < 10
    assert message.startswith("before\n\nCommand timed out after 0.5 seconds.\n\nThe command was terminated")


async def test_the_default_time_limit_applies(sandbox: Sandbox, workspace: Path) -> None:
    message = await fails(sandbox, workspace, {"command": "sleep 30"}, exec_default_timeout_s=0.3)
    assert message.startswith("Command timed out after 0.3 seconds.")


@pytest.mark.parametrize("value", [0, -1, 601, "5", True, float("inf")])
async def test_time_limits_outside_the_bounds_are_refused(sandbox: Sandbox, workspace: Path, value: Any) -> None:
    message = await fails(sandbox, workspace, {"command": "true", "timeoutSeconds": value})
    assert message.startswith("exec: timeoutSeconds must be")


async def test_output_keeps_the_last_64_kib_with_a_marker(sandbox: Sandbox, workspace: Path) -> None:
    result = await run(sandbox, workspace, {"command": "seq 1 200000"})
    note = "[earlier output was discarded at the retention cap and cannot be recovered]\n\n"
    assert result.startswith(note)
    assert result.endswith("\n199999\n200000")
    assert len(result[len(note) :].encode()) <= 64 * 1024
    assert "\n1\n" not in result[:200]


# --- arguments ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "exec: command must be a non-empty string"),
        ({"command": "   "}, "exec: command must be a non-empty string"),
        ({"command": "a\0b"}, "exec: command must be free of NUL"),
        ({"command": "true", "yieldMs": 1000}, "exec: yieldMs is not supported"),
        ({"command": "true", "background": True}, "exec: background is not supported"),
        ({"command": "true", "pty": True}, "exec: pty is not supported"),
        ({"command": "true", "elevated": True}, "exec: elevated is not supported"),
        ({"command": "true", "host": "gateway"}, "exec: host must be auto or sandbox"),
        ({"command": "true", "node": "worker-1"}, "exec: node is not supported"),
        ({"command": "true", "ask": "always"}, "exec: ask is not supported"),
        ({"command": "true", "env": {"BAD-NAME": "x"}}, "exec: env names are"),
        ({"command": "true", "env": {"OK": 1}}, "exec: env names are"),
        ({"command": "true", "env": ["A=1"]}, "exec: env must be an object"),
        ({"command": "true", "title": "x" * 121}, "exec: title must be a string of at most 120 characters"),
        ({"command": "true", "shell": "bash"}, "exec: unknown argument(s) shell"),
    ],
)
async def test_what_a_one_shot_sandboxed_command_cannot_honour_is_refused(
    sandbox: Sandbox, workspace: Path, arguments: dict[str, Any], expected: str
) -> None:
    assert (await fails(sandbox, workspace, arguments)).startswith(expected)


async def test_defaults_that_change_nothing_are_accepted(sandbox: Sandbox, workspace: Path) -> None:
    arguments = {
        "command": "echo ok",
        "title": "say ok",
        "background": False,
        "pty": False,
        "elevated": False,
        "host": "sandbox",
        "ask": "off",
    }
    assert await run(sandbox, workspace, arguments) == "ok"


async def test_without_a_workspace_exec_refuses(sandbox: Sandbox) -> None:
    assert (await fails(sandbox, None, {"command": "true"})).startswith("exec needs a workspace")


async def test_without_bubblewrap_exec_says_so(workspace: Path, tmp_path: Path) -> None:
    message = await fails(Sandbox(bwrap=str(tmp_path / "no-bwrap")), workspace, {"command": "true"})
    assert message.startswith("exec could not run the command (sandbox_unavailable): bubblewrap (bwrap) was not found")


# --- blind ------------------------------------------------------------------------------------------------------


async def test_a_blind_invocation_sees_the_mark_instead_of_the_workspace(sandbox: Sandbox, workspace: Path) -> None:
    result = await run(sandbox, workspace, {"command": "pwd; echo $HOME; ls missing"}, blind=True)
    assert str(workspace) not in result
    assert result == (
        f"{WORKSPACE_MARK}\n{WORKSPACE_MARK}\nls: cannot access 'missing': No such file or directory"
        "\n\n(Command exited with code 2)"
    )
    message = await fails(sandbox, workspace, {"command": "pwd", "workdir": "../outside"}, blind=True)
    assert message == f"Path escapes workspace root ({WORKSPACE_MARK}): ../outside"
    assert await run(sandbox, workspace, {"command": "pwd", "workdir": f"{WORKSPACE_MARK}/sub"}, blind=True) == (
        f"{WORKSPACE_MARK}/sub"
    )


async def test_a_missing_workspace_directory_is_reported(sandbox: Sandbox, tmp_path: Path) -> None:
    missing = tmp_path / "not-made-yet"
    message = await fails(sandbox, missing, {"command": "true"})
    assert message == f"The workspace root {missing} does not exist or is not a directory"


# --- containment ----------------------------------------------------------------------------------------------

ROOT = os.geteuid() == 0


async def test_exec_never_runs_as_root_when_the_gateway_is_root(sandbox: Sandbox, workspace: Path) -> None:
    if not ROOT:
        pytest.skip("the gateway is not root here: exec runs as the gateway's own uid")
    assert (await run(sandbox, workspace, {"command": "id -u; id -g; id -G"})).split() == ["65534"] * 3
    assert (await run(sandbox, workspace, {"command": "id -u"}, exec_uid=4242)).strip() == "4242"


async def test_the_sandbox_uid_can_write_where_the_other_tools_wrote(sandbox: Sandbox, workspace: Path) -> None:
    if not ROOT:
        pytest.skip("the workspace is handed over only when the gateway is root")
    (workspace / "sub" / "made-by-root.txt").write_text("one\n")
    text = await run(sandbox, workspace, {"command": "echo two >> sub/made-by-root.txt && cat sub/made-by-root.txt"})
    assert text == "one\ntwo"
    assert (workspace / "sub" / "made-by-root.txt").stat().st_uid == 65534
    # Symlinks lead nowhere new: the file outside keeps its owner.
    assert (workspace.parent / "outside" / "secret").stat().st_uid == 0
    assert (workspace / "to-secret").lstat().st_uid == 65534


async def test_a_hard_linked_file_is_not_handed_over(sandbox: Sandbox, workspace: Path) -> None:
    if not ROOT:
        pytest.skip("the workspace is handed over only when the gateway is root")
    os.link(workspace.parent / "outside" / "secret", workspace / "linked")
    await run(sandbox, workspace, {"command": "true"})
    assert (workspace.parent / "outside" / "secret").stat().st_uid == 0


async def test_every_process_of_the_command_shares_one_pids_limit(sandbox: Sandbox, workspace: Path) -> None:
    message = await fails(sandbox, workspace, {"command": "for i in $(seq 40); do sleep 5 & done; wait"}, exec_pids=16)
    assert "process limit (16 processes) was reached" in message
    assert "every process of the command was killed" in message


async def test_a_command_within_its_limits_is_untouched(sandbox: Sandbox, workspace: Path) -> None:
    text = await run(
        sandbox, workspace, {"command": "for i in 1 2 3; do sleep 0.1 & done; wait; echo ok"}, exec_pids=16
    )
    assert text == "ok"


def test_exec_limits_come_from_the_gateway_config() -> None:
    from pydantic import ValidationError

    from clawstack.gateway.config.agents import ExecToolConfig
    from clawstack.gateway.workspace_tools import exec_limits

    limits = exec_limits(ExecToolConfig())
    assert (limits.exec_pids, limits.exec_memory_bytes, limits.exec_uid) == (256, 1024**3, 65534)
    limits = exec_limits(ExecToolConfig.model_validate({"pidsLimit": 8, "memoryLimitMb": 64, "sandboxUid": 1000}))
    assert (limits.exec_pids, limits.exec_memory_bytes, limits.exec_uid) == (8, 64 * 1024**2, 1000)
    for bad in ({"sandboxUid": 0}, {"pidsLimit": 0}, {"memoryLimitMb": -1}, {"pidsLimit": "8"}):
        with pytest.raises(ValidationError):
            ExecToolConfig.model_validate(bad)
    with pytest.raises(ValueError, match="uid other than root"):
        WorkspaceToolLimits(exec_uid=0)
