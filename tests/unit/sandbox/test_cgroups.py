"""Containment: cgroup discovery, creation, events and removal, the rlimit fallback's decision, and a real
sandbox contained by whichever mechanism this host offers (cgroup v1, v2, or rlimits under a uid of its own)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clawstack.sandbox import Sandbox, SandboxSpec, default_env, dev, proc, system_mounts, tmpfs
from clawstack.sandbox.cgroups import (
    Cgroups,
    Containment,
    Enforcement,
    create_cgroups,
    parse_cgroup_mounts,
    parse_proc_cgroup,
    plan_cgroups,
    rlimit_fallback,
)

ROOT = os.geteuid() == 0


# --- cgroups ---------------------------------------------------------------------------------------------------

HYBRID_CGROUP = "4:memory:/jobs/7\n8:pids:/\n1:name=systemd:/\n0::/\n"
HYBRID_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "31 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "32 25 0:28 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "40 1 8:1 / / rw - ext4 /dev/vda rw\n"
)


def test_proc_cgroup_and_mountinfo_are_parsed() -> None:
    assert parse_proc_cgroup(HYBRID_CGROUP) == {"memory": "/jobs/7", "pids": "/", "name=systemd": "/", "": "/"}
    assert parse_cgroup_mounts(HYBRID_MOUNTS) == [
        ("/sys/fs/cgroup/memory", "/", {"rw", "memory"}),
        ("/sys/fs/cgroup/pids", "/", {"rw", "pids"}),
        ("/sys/fs/cgroup/unified", "/", {"cgroup2"}),
    ]


def test_v1_hierarchies_win_and_nest_under_our_own_cgroups() -> None:
    planned = plan_cgroups("claw-x", proc_cgroup=HYBRID_CGROUP, mountinfo=HYBRID_MOUNTS)
    assert planned == Cgroups("v1", ("/sys/fs/cgroup/memory/jobs/7/claw-x", "/sys/fs/cgroup/pids/claw-x"))
    assert planned.limits == "cgroup-v1"


def test_v2_needs_both_controllers_delegated(tmp_path: Path) -> None:
    (tmp_path / "svc").mkdir()
    mounts = f"30 25 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    (tmp_path / "svc" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    planned = plan_cgroups("claw-x", proc_cgroup="0::/svc\n", mountinfo=mounts)
    assert planned == Cgroups("v2", (str(tmp_path / "svc" / "claw-x"),))
    (tmp_path / "svc" / "cgroup.subtree_control").write_text("cpu memory\n")
    assert plan_cgroups("claw-x", proc_cgroup="0::/svc\n", mountinfo=mounts) is None


def test_no_cgroup_file_system_means_no_cgroups() -> None:
    assert plan_cgroups("claw-x", proc_cgroup="0::/\n", mountinfo="40 1 8:1 / / rw - ext4 /dev/vda rw\n") is None
    assert plan_cgroups("claw-x", proc_cgroup="garbage", mountinfo="") is None


def test_creating_cgroups_writes_the_limits(tmp_path: Path) -> None:
    cgroups = Cgroups("v2", (str(tmp_path / "claw-x"),))
    create_cgroups(cgroups, memory_bytes=1 << 27, pids=16)
    assert (tmp_path / "claw-x" / "memory.max").read_text() == f"{1 << 27}\n"
    assert (tmp_path / "claw-x" / "pids.max").read_text() == "16\n"
    assert not (tmp_path / "claw-x" / "memory.swap.max").exists()  # only where the kernel offers it


def test_a_failed_creation_leaves_nothing(tmp_path: Path) -> None:
    cgroups = Cgroups("v1", (str(tmp_path / "claw-x"), str(tmp_path / "missing" / "claw-x")))
    with pytest.raises(FileNotFoundError):
        create_cgroups(cgroups, memory_bytes=1 << 27, pids=16)
    assert not (tmp_path / "claw-x").exists()


def test_cgroups_round_trip_and_refuse_unknown_versions() -> None:
    cgroups = Cgroups("v1", ("/a", "/b"))
    assert Cgroups.from_json({"version": "v1", "paths": ["/a", "/b"]}) == cgroups
    assert Cgroups.from_json(None) is None
    with pytest.raises(ValueError, match="version"):
        Cgroups.from_json({"version": "v3", "paths": []})


def test_cgroups_serialise_for_the_monitor_record() -> None:
    cgroups = Cgroups("v2", ("/sys/fs/cgroup/svc/claw-x",))
    assert Cgroups.from_json(cgroups.to_json()) == cgroups


def test_limit_events_name_the_limit_the_kernel_enforced(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    cgroups = Cgroups("v2", (str(v2),))
    assert cgroups.limit_reached() is None  # no event files yet: nothing reached
    (v2 / "pids.events").write_text("max 0\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n")
    assert cgroups.limit_reached() is None  # reclaim at the limit is not an OOM kill
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert cgroups.limit_reached() == "memory"
    (v2 / "pids.events").write_text("max 3\n")
    assert cgroups.limit_reached() == "pids"
    memory, pids = tmp_path / "m", tmp_path / "p"
    memory.mkdir()
    pids.mkdir()
    v1 = Cgroups("v1", (str(memory), str(pids)))
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert v1.limit_reached() == "memory"


# --- the rlimit fallback ---------------------------------------------------------------------------------------


def test_rlimit_nproc_holds_only_under_a_uid_of_the_sandboxs_own() -> None:
    assert rlimit_fallback(sandbox_uid=65534, own_uid=0) == Enforcement(memory="rlimit", pids="rlimit")
    assert rlimit_fallback(sandbox_uid=65534, own_uid=1000) == Enforcement(memory="rlimit", pids="rlimit")
    # The caller's own uid: its own process budget would be spent (or, as root, nothing bounded).
    assert rlimit_fallback(sandbox_uid=None, own_uid=1000) == Enforcement(memory="rlimit", pids=None)
    assert rlimit_fallback(sandbox_uid=1000, own_uid=1000) == Enforcement(memory="rlimit", pids=None)
    assert rlimit_fallback(sandbox_uid=0, own_uid=1000) == Enforcement(memory="rlimit", pids=None)
    assert rlimit_fallback(sandbox_uid=None, own_uid=0) == Enforcement(memory="rlimit", pids=None)


def test_without_cgroups_the_fallback_gives_the_rlimits_it_reports() -> None:
    own = Containment.create("unused", memory_bytes=1 << 28, pids=32, sandbox_uid=None, use_cgroups=False)
    assert own.cgroups is None
    assert own.limits == "rlimit"
    assert own.rlimits() == {"address_space_bytes": 1 << 28}
    other = Containment.create("unused", memory_bytes=1 << 28, pids=32, sandbox_uid=65534, use_cgroups=False, own_uid=0)
    assert other.enforcement == Enforcement(memory="rlimit", pids="rlimit")
    assert other.rlimits() == {"address_space_bytes": 1 << 28, "processes": 32}
    assert other.release() is True


def test_enforcement_round_trips_and_refuses_unknown_mechanisms() -> None:
    enforcement = Enforcement(memory="cgroup-v1", pids=None)
    assert Enforcement.from_json(enforcement.to_json()) == enforcement
    assert Enforcement.from_json(None) is None
    with pytest.raises(ValueError, match="mechanism"):
        Enforcement.from_json({"memory": "ulimit", "pids": None})


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Containment.create("unused", memory_bytes=0, pids=1, sandbox_uid=None, use_cgroups=False)


# --- on this host ----------------------------------------------------------------------------------------------


def test_cgroups_here_are_created_joined_killed_and_removed() -> None:
    containment = Containment.create("claw-unit-host", memory_bytes=1 << 28, pids=16, sandbox_uid=None)
    if containment.cgroups is None:
        pytest.skip("no usable cgroup on this host (the rlimit fallback is tested above)")
    try:
        assert containment.enforcement.memory == containment.enforcement.pids == containment.limits
        child = subprocess.Popen(["sleep", "30"])
        containment.join(child.pid)
        assert child.pid in containment.cgroups.pids()
        containment.kill_all()
        assert child.wait(timeout=10) < 0
    finally:
        assert containment.release() is True
    assert not any(os.path.exists(path) for path in containment.cgroups.paths)


@pytest.fixture
def sandbox() -> Sandbox:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap (bwrap) is not installed here: apt-get install -y bubblewrap")
    return Sandbox()


def _spec(home: Path) -> SandboxSpec:
    return SandboxSpec(env=default_env("/tmp"), mounts=(*system_mounts(), proc(), dev(), tmpfs("/tmp")), chdir="/tmp")


@pytest.mark.parametrize("use_cgroups", [True, False])
async def test_a_fork_loop_is_held_by_the_mechanism_reported(
    sandbox: Sandbox, tmp_path: Path, use_cgroups: bool
) -> None:
    """With cgroups the sandbox is killed at the first refused fork; under the rlimit fallback (root only: it
    needs a uid of the sandbox's own) RLIMIT_NPROC refuses forks past the limit and the loop gives up."""
    if not use_cgroups and not ROOT:
        pytest.skip("the rlimit fallback bounds processes only under a uid of the sandbox's own (needs root)")
    uid = 65534 if ROOT else None
    containment = await asyncio.to_thread(
        Containment.create, "claw-unit-fork", memory_bytes=1 << 28, pids=16, sandbox_uid=uid, use_cgroups=use_cgroups
    )
    if use_cgroups and containment.cgroups is None:
        pytest.skip("no usable cgroup on this host (the rlimit fallback is the other case)")
    script = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(20); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print('forked', n, flush=True)\n"
        "os._exit(0)\n"
    )
    try:
        result = await sandbox.run(
            _spec(tmp_path),
            ["python3", "-c", script],
            timeout_s=30,
            output_limit_bytes=4096,
            containment=containment,
            uid=uid,
        )
    finally:
        assert await asyncio.to_thread(containment.release)
    if containment.cgroups is not None:
        assert result.limit_reached == "pids"
        assert result.exit_code is None
    else:
        assert containment.enforcement.pids == "rlimit"
        forked = int(result.stdout.split()[-1])
        assert 0 < forked < 16
    assert result.duration_s < 20


async def test_the_sandbox_runs_as_the_uid_it_is_given(sandbox: Sandbox, tmp_path: Path) -> None:
    if not ROOT:
        pytest.skip("only root can run a sandbox as another uid")
    result = await sandbox.run(_spec(tmp_path), ["id", "-u"], timeout_s=20, output_limit_bytes=4096, uid=65534)
    assert result.stdout.strip() == b"65534"
