"""A task-home spawn under a root supervisor that fails after the meter's output directory was handed to the
sandbox uid is retried and works: the retry reuses a meter that started, or makes the directory anew for one that
did not, without following anything the meter's uid left in it. Real bubblewrap sandboxes and monitors; the first
attempt's failure is injected at the one place a real one would come from (a monitor that does not start)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clawstack.runs.backends import LocalBackend, RunLabels, SpawnError, WorkerSpec
from clawstack.runs.backends.base import METER_OUT_DIR, METER_RECORD, TaskHome
from clawstack.runs.backends.local import SANDBOX_UID
from clawstack.runs.backends.local_meter import METER_DIR
from clawstack.runs.backends.monitor import LaunchPlan

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed here"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the hand-over to uid 65534 happens only under a root supervisor"),
]

POD = "pod-a"
RUN = RunLabels(pod=POD, installation="acme", run_id="run-1")
HERMES = "def main():\n    return 0\n"


class FirstAttemptFails(LocalBackend):
    """Its first start of the monitor named by ``failing`` (``worker`` or ``meter``) fails, as a monitor that does
    not report a start in time does; ``before_failing`` runs first (what the meter's uid could leave behind)."""

    def __init__(self, *args: Any, failing: str, before_failing: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failing = failing
        self.before_failing = before_failing
        self.failed = False

    def _start_monitor(
        self, run_dir: Path, lock: int, plan: LaunchPlan, task: str, config: bytes, writer_lock: int | None
    ) -> None:
        which = "meter" if run_dir.name == METER_DIR else "worker"
        if which == self.failing and not self.failed:
            self.failed = True
            if self.before_failing is not None:
                self.before_failing(run_dir)
            raise SpawnError("the worker did not report a start in time", retryable=True)
        super()._start_monitor(run_dir, lock, plan, task, config, writer_lock)


@pytest.fixture
def hermes_site(short_dir: Path) -> Path:
    site = short_dir / "site"
    (site / "hermes_cli").mkdir(parents=True)
    (site / "hermes_cli" / "__init__.py").write_text("")
    (site / "hermes_cli" / "main.py").write_text(HERMES)
    return site


def home_spec(short_dir: Path) -> WorkerSpec:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    os.chown(home, SANDBOX_UID, SANDBOX_UID)  # as the supervisor's Homes makes it
    proxy = short_dir / "proxy"
    proxy.mkdir(mode=0o711)
    return WorkerSpec(
        labels=RUN,
        task="a task",
        config=b"{}",
        proxy_socket=proxy / "proxy.sock",
        memory_bytes=512 * 1024 * 1024,
        pids=64,
        max_runtime_s=30,
        max_output_bytes=64 * 1024,
        home=TaskHome(path=home, mount="/home/task", max_bytes=1 << 30),
    )


@pytest.fixture
async def cleanup(short_dir: Path) -> AsyncIterator[list[LocalBackend]]:
    made: list[LocalBackend] = []
    yield made
    for backend in made:
        await backend.remove(RUN)


async def wait_for_meter_ok(backend: LocalBackend) -> None:
    deadline = time.monotonic() + 20
    while (await backend.inspect(RUN)).home_meter != "ok":
        assert time.monotonic() < deadline, "the meter reported no measure in time"
        await asyncio.sleep(0.05)


async def test_a_spawn_that_failed_after_the_meter_started_is_retried(
    short_dir: Path, hermes_site: Path, cleanup: list[LocalBackend]
) -> None:
    backend = FirstAttemptFails(
        short_dir / "state", pod=POD, hermes_site=hermes_site, failing="worker", meter_interval_s=0.1
    )
    cleanup.append(backend)
    spec = home_spec(short_dir)
    with pytest.raises(SpawnError) as first:
        await backend.spawn(spec)
    assert first.value.retryable
    out = backend.run_dir(RUN) / METER_OUT_DIR
    assert os.lstat(out).st_uid == SANDBOX_UID  # handed over to the meter, which is running
    await backend.spawn(spec)  # the retry: the worker starts, beside the meter the first attempt started
    state = await backend.inspect(RUN)
    assert state.exists
    await wait_for_meter_ok(backend)
    await backend.remove(RUN)
    assert await backend.list_workers() == []


async def test_a_retry_makes_the_meters_directory_anew_and_follows_nothing_left_in_it(
    short_dir: Path, hermes_site: Path, cleanup: list[LocalBackend]
) -> None:
    outside = short_dir / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the supervisor's own file")

    def plant(meter_dir: Path) -> None:
        """What anything running as the meter's uid could leave in its directory."""
        out = meter_dir.parent / METER_OUT_DIR
        os.symlink(outside / "keep.txt", out / METER_RECORD)
        os.symlink(outside, out / "dir-link")
        (out / "sub").mkdir()
        (out / "sub" / "deep").write_text("x")
        os.symlink(outside, out / "sub" / "link")
        os.mkfifo(out / "fifo")
        for path in (out / METER_RECORD, out / "dir-link", out / "sub", out / "sub" / "deep", out / "fifo"):
            os.lchown(path, SANDBOX_UID, SANDBOX_UID)
        os.chmod(out / "sub", 0)

    backend = FirstAttemptFails(
        short_dir / "state",
        pod=POD,
        hermes_site=hermes_site,
        failing="meter",
        before_failing=plant,
        meter_interval_s=0.1,
    )
    cleanup.append(backend)
    spec = home_spec(short_dir)
    with pytest.raises(SpawnError):
        await backend.spawn(spec)
    out = backend.run_dir(RUN) / METER_OUT_DIR
    assert os.lstat(out).st_uid == SANDBOX_UID
    assert (out / "fifo").exists()
    await backend.spawn(spec)
    await wait_for_meter_ok(backend)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [METER_RECORD]
    assert not (out / METER_RECORD).is_symlink()
    found = os.lstat(out)
    assert (found.st_uid, found.st_mode & 0o777) == (SANDBOX_UID, 0o700)
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "the supervisor's own file"
