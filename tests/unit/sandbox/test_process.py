"""Commands in real bubblewrap sandboxes: exit codes, the time limit (the whole sandbox dies), bounded output,
no network, a read-only root, a clean environment, resource limits, cancellation, and the errors."""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from clawstack.sandbox import (
    ResourceLimits,
    Sandbox,
    SandboxResult,
    SandboxSpec,
    SandboxSpecError,
    SandboxStartError,
    SandboxUnavailableError,
    bind,
    default_env,
    dev,
    proc,
    system_mounts,
    tmpfs,
)


def workspace_spec(workspace: Path) -> SandboxSpec:
    mounts = (*system_mounts(), proc(), dev(), tmpfs("/tmp", 1 << 24), bind(workspace))
    return SandboxSpec(env=default_env(workspace), mounts=mounts, chdir=str(workspace))


async def sh(
    sandbox: Sandbox,
    workspace: Path,
    script: str,
    *,
    timeout_s: float = 20.0,
    limit: int = 1 << 16,
    **options: object,
) -> SandboxResult:
    return await sandbox.run(
        workspace_spec(workspace),
        ["/bin/sh", "-c", script],
        timeout_s=timeout_s,
        output_limit_bytes=limit,
        **options,  # type: ignore[arg-type]
    )


def marker() -> str:
    """A sleep duration no other process on this host has in its command line."""
    return f"7777.{secrets.randbelow(10**9)}"


def processes_with(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry))
    return found


async def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if check():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


# --- running -----------------------------------------------------------------------------------------------------


async def test_the_exit_code_and_both_streams_come_back(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await sh(sandbox, tmp_path, "echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.timed_out) == (3, False)
    assert (result.stdout, result.stderr) == (b"out\n", b"err\n")
    assert not result.stdout_truncated
    assert not result.stderr_truncated


async def test_merged_streams_keep_the_order_written(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await sh(sandbox, tmp_path, "echo a; echo b >&2; echo c", stderr="merge")
    assert (result.stdout, result.stderr) == (b"a\nb\nc\n", b"")


async def test_a_signal_is_reported_as_128_plus_its_number(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await sh(sandbox, tmp_path, "kill -9 $$")
    assert result.exit_code == 128 + 9


async def test_at_the_time_limit_the_whole_sandbox_is_killed(sandbox: Sandbox, tmp_path: Path) -> None:
    mark = marker()
    result = await sh(sandbox, tmp_path, f"sleep {mark} & sleep {mark}; echo never", timeout_s=0.5)
    assert (result.exit_code, result.timed_out) == (None, True)
    assert result.duration_s < 5
    assert b"never" not in result.stdout
    await wait_until(lambda: not processes_with(mark), "the sandbox's processes to be gone")


async def test_a_background_process_dies_with_the_command(sandbox: Sandbox, tmp_path: Path) -> None:
    mark = marker()
    result = await sh(sandbox, tmp_path, f"sleep {mark} > /dev/null 2>&1 & echo started")
    assert (result.exit_code, result.stdout) == (0, b"started\n")
    await wait_until(lambda: not processes_with(mark), "the background sleep to be gone")


async def test_cancelling_the_call_kills_the_sandbox(sandbox: Sandbox, tmp_path: Path) -> None:
    mark = marker()
    call = asyncio.create_task(sh(sandbox, tmp_path, f"touch started; sleep {mark}"))
    await wait_until(lambda: (tmp_path / "started").exists(), "the command to start")
    assert processes_with(mark)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_until(lambda: not processes_with(mark), "the cancelled sandbox to be gone")


# --- output bounds -------------------------------------------------------------------------------------------


async def test_output_keeps_the_head_by_default(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await sh(sandbox, tmp_path, "seq 1 100000", limit=12)
    assert result.stdout == b"1\n2\n3\n4\n5\n6\n"
    assert result.stdout_truncated


async def test_output_can_keep_the_tail(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await sh(sandbox, tmp_path, "seq 1 100000", limit=13, keep="tail")
    assert result.stdout == b"99999\n100000\n"
    assert result.stdout_truncated


async def test_a_flood_is_read_to_its_end_and_discarded(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await sh(sandbox, tmp_path, "head -c 50000000 /dev/zero; echo done >&2", limit=1024)
    assert result.exit_code == 0
    assert len(result.stdout) == 1024
    assert result.stdout_truncated
    assert result.stderr == b"done\n"


# --- isolation -------------------------------------------------------------------------------------------------


async def test_the_network_is_unreachable_even_on_loopback(sandbox: Sandbox, tmp_path: Path) -> None:
    connections: list[object] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(reader)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    script = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "except OSError as exc:\n"
        "    print('refused', type(exc).__name__)\n"
        "else:\n"
        "    print('connected')\n"
    )
    try:
        result = await sh(sandbox, tmp_path, f'python3 -c "{script}"; cat /proc/net/dev')
    finally:
        server.close()
        await server.wait_closed()
    assert result.stdout.startswith(b"refused ConnectionRefusedError"), result
    interfaces = {line.split(b":")[0].strip() for line in result.stdout.splitlines()[3:] if b":" in line}
    assert interfaces == {b"lo"}
    assert connections == []


async def test_the_root_is_read_only_and_only_the_bound_directory_is_writable(sandbox: Sandbox, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "beside").write_text("host file next to the workspace")
    script = (
        "touch /usr/claw-probe 2>/dev/null && echo usr-writable;"
        "touch /claw-probe 2>/dev/null && echo root-writable;"
        f"test -e {tmp_path}/beside && echo beside-visible;"
        "test -e /etc/passwd && echo etc-visible;"
        "echo x > /tmp/private && echo tmp-ok;"
        "echo hello > made && echo ws-ok"
    )
    result = await sh(sandbox, workspace, script)
    assert result.stdout == b"tmp-ok\nws-ok\n"
    assert (workspace / "made").read_text() == "hello\n"
    assert not os.path.exists("/usr/claw-probe")  # noqa: ASYNC240 (a stat, once)
    assert not os.path.exists("/tmp/private")  # noqa: ASYNC240 (a stat, once)


async def test_the_command_gets_the_spec_environment_only(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAW_TEST_SECRET", "do-not-leak")
    result = await sh(sandbox, tmp_path, "env")
    names = {line.split(b"=", 1)[0].decode() for line in result.stdout.splitlines()}
    assert b"do-not-leak" not in result.stdout
    assert names - {"PWD", "OLDPWD", "SHLVL", "_"} == set(default_env(tmp_path))
    assert f"HOME={tmp_path}".encode() in result.stdout


async def test_resource_limits_hold_inside(sandbox: Sandbox, tmp_path: Path) -> None:
    limits = ResourceLimits(address_space_bytes=1 << 30, file_bytes=1 << 20, open_files=64)
    result = await sh(
        sandbox, tmp_path, "ulimit -n; ulimit -v; ulimit -c; head -c 2000000 /dev/zero > big", limits=limits
    )
    assert result.stdout.split(b"\n")[:3] == [b"64", str((1 << 30) // 1024).encode(), b"0"]
    assert result.exit_code != 0
    assert (tmp_path / "big").stat().st_size <= 1 << 20


# --- errors ----------------------------------------------------------------------------------------------------


async def test_without_bubblewrap_the_sandbox_is_unavailable(tmp_path: Path) -> None:
    missing = Sandbox(bwrap=str(tmp_path / "no-bwrap"))
    assert missing.bwrap is None
    with pytest.raises(SandboxUnavailableError) as caught:
        await missing.run(workspace_spec(tmp_path), ["true"], timeout_s=5, output_limit_bytes=10)
    assert caught.value.code == "sandbox_unavailable"
    assert "apt-get install -y bubblewrap" in caught.value.message


async def test_a_bubblewrap_that_cannot_sandbox_here_is_unavailable(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(SandboxUnavailableError, match="No permissions to creating new namespace"):
        await Sandbox(bwrap=str(fake)).check()


async def test_a_bubblewrap_that_cannot_be_started_is_a_start_failure(tmp_path: Path) -> None:
    broken = tmp_path / "bwrap"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    with pytest.raises(SandboxStartError) as caught:
        await Sandbox(bwrap=str(broken)).check()
    assert caught.value.retryable


async def test_limits_without_prlimit_are_unavailable(tmp_path: Path) -> None:
    sandbox = Sandbox(prlimit=str(tmp_path / "no-prlimit"))
    with pytest.raises(SandboxUnavailableError, match="prlimit"):
        await sandbox.run(
            workspace_spec(tmp_path), ["true"], timeout_s=5, output_limit_bytes=10, limits=ResourceLimits()
        )


@pytest.mark.parametrize(
    ("command", "timeout_s", "limit"),
    [([], 5.0, 10), (["a\0b"], 5.0, 10), (["true"], 0.0, 10), (["true"], 5.0, -1)],
)
async def test_a_bad_command_or_bound_is_a_spec_error(
    sandbox: Sandbox, tmp_path: Path, command: list[str], timeout_s: float, limit: int
) -> None:
    with pytest.raises(SandboxSpecError) as caught:
        await sandbox.run(workspace_spec(tmp_path), command, timeout_s=timeout_s, output_limit_bytes=limit)
    assert caught.value.code == "spec_invalid"
