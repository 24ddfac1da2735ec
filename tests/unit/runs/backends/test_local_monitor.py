"""The monitor's pure parts: bubblewrap's command line, the launch plan, process identity (its cgroups are
:mod:`clawstack.sandbox.cgroups`'s, tested in ``tests/unit/sandbox/test_cgroups.py``). The monitor as a process is
exercised in ``tests/integration/runs/test_local_backend.py``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from clawstack.runs.backends.monitor import (
    PYTHON_FLAGS,
    SANDBOX_CONFIG_FILE,
    SANDBOX_PROXY_DIR,
    Bind,
    LaunchPlan,
    ProcessId,
    bwrap_argv,
    encode_launch,
    runner_command,
    staged_sources,
)

TASK = "--help me, TASK-MARK"
CONFIG = b'{"credential": "run-1:UNIT-SECRET"}'


def plan(**changes: Any) -> LaunchPlan:
    values: dict[str, Any] = {
        "run_dir": "/state/acme/run-1",
        "labels": {"pod": "p", "installation": "acme", "run_id": "run-1"},
        "isolation": "bubblewrap",
        "python": "/opt/claw/python/bin/python3.11",
        "runner_args": ("-m", "clawstack.worker.oneshot"),
        "env": {"PYTHONPATH": "/opt/claw/site/0", "CLAW_WORKER_CONFIG_FILE": SANDBOX_CONFIG_FILE},
        "memory_bytes": 1 << 28,
        "pids": 64,
        "max_runtime_s": 30,
        "max_output_bytes": 4096,
        "stderr_limit_bytes": 1024,
        "tmp_bytes": 1 << 22,
        "bwrap": "/usr/bin/bwrap",
        "system": (("ro-bind", "/usr", "/usr"), ("symlink", "usr/lib", "/lib")),
        "binds": (
            Bind("/root/.pyenv/versions/3.11.7", "/opt/claw/python"),
            Bind("/venv/site", "/opt/claw/site/0"),
            Bind("/pod/sock/worker", SANDBOX_PROXY_DIR),
        ),
        "sandbox_uid": 65534,
    }
    values.update(changes)
    return LaunchPlan(**values)


def argv_for(launch: LaunchPlan) -> list[str]:
    sources = staged_sources(len(launch.binds))
    return bwrap_argv(launch, sources=sources, config_fd=7, status_fd=8, task=TASK)


def pairs(argv: list[str], flag: str, width: int = 1) -> list[tuple[str, ...]]:
    return [tuple(argv[index + 1 : index + 1 + width]) for index, item in enumerate(argv) if item == flag]


# --- bubblewrap's command line ---------------------------------------------------------------------------------


def test_the_sandbox_unshares_everything_and_keeps_no_network() -> None:
    argv = argv_for(plan())
    head = argv[: argv.index("--")]
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in head
    assert "--share-net" not in argv
    assert pairs(argv, "--cap-drop") == [("ALL",)]
    assert "--clearenv" in head
    assert pairs(argv, "--hostname") == [("claw",)]


def test_the_root_is_read_only_with_a_sized_private_tmp() -> None:
    argv = argv_for(plan())
    assert pairs(argv, "--remount-ro") == [("/dev",), ("/",)]
    assert argv.index("--remount-ro", argv.index("--file")) > argv.index("--file")  # the root goes read-only last
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs - 2 : tmpfs + 2] == ["--size", str(1 << 22), "--tmpfs", "/tmp"]
    assert pairs(argv, "--ro-bind", 2) == [
        ("/usr", "/usr"),
        ("/tmp/0", "/opt/claw/python"),
        ("/tmp/1", "/opt/claw/site/0"),
        ("/tmp/2", SANDBOX_PROXY_DIR),  # the one way out: the directory holding only the proxy's socket
    ]
    assert pairs(argv, "--symlink", 2) == [("usr/lib", "/lib")]
    assert "--bind" not in argv
    for private in ("/root", "/work", "/state", "/pod"):
        assert not any(item.startswith(private) for item in argv[: argv.index("--")] if item.startswith("/"))


def test_the_configuration_is_a_private_file_fed_from_a_descriptor() -> None:
    argv = argv_for(plan())
    file = argv.index("--file")
    assert argv[file - 2 : file + 3] == ["--perms", "0600", "--file", "7", SANDBOX_CONFIG_FILE]
    directory = argv.index("--dir")
    assert argv[directory - 2 : directory + 2] == ["--perms", "0700", "--dir", "/tmp/claw"]
    assert pairs(argv, "--json-status-fd") == [("8",)]
    assert all(b"UNIT-SECRET" not in item.encode() for item in argv)
    assert pairs(argv, "--setenv", 2) == sorted(plan().env.items())


def test_the_task_is_only_the_last_positional_argument() -> None:
    argv = argv_for(plan())
    command = argv[argv.index("--") + 1 :]
    assert command == ["/opt/claw/python/bin/python3.11", *PYTHON_FLAGS, "-m", "clawstack.worker.oneshot", "--", TASK]
    assert argv.count(TASK) == 1
    assert runner_command(plan(), TASK) == command


def test_without_a_uid_to_drop_the_sources_are_bound_as_they_are() -> None:
    launch = plan(sandbox_uid=None)
    argv = bwrap_argv(launch, sources=[bind.source for bind in launch.binds], config_fd=3, status_fd=4, task=TASK)
    assert pairs(argv, "--ro-bind", 2)[1:] == [(bind.source, bind.dest) for bind in launch.binds]


def test_the_launch_plan_round_trips_through_json() -> None:
    launch = plan()
    assert LaunchPlan.from_json(json.loads(json.dumps(launch.to_json()))) == launch
    document = json.loads(encode_launch(launch, TASK, CONFIG))
    assert document["task"] == TASK
    assert b"UNIT-SECRET" not in json.dumps(document["plan"]).encode()


# --- process identity ------------------------------------------------------------------------------------------


def test_a_process_is_its_pid_and_start_time() -> None:
    me = ProcessId.of(os.getpid())
    assert me is not None
    assert me.alive()
    assert not ProcessId(me.pid, me.start + 1).alive()
    assert ProcessId.of(999_999_999) is None
    assert ProcessId.from_json({"pid": me.pid, "start": me.start}) == me
    assert ProcessId.from_json(None) is None


def test_a_zombie_has_ended() -> None:
    child = subprocess.Popen(["sleep", "60"])
    identity = ProcessId.of(child.pid)
    assert identity is not None
    assert identity.alive()
    identity.kill()
    deadline = time.monotonic() + 10
    while _state(child.pid) != "Z":  # killed, not yet reaped
        assert time.monotonic() < deadline
    assert not identity.alive()
    assert ProcessId.of(child.pid) is None
    child.wait()
    identity.kill()  # an ended process is not an error


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
