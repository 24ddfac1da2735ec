"""The home meter: what it counts, when it gives up, its verdicts, and the process the supervisor runs by path."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import clawstack.worker.meter as meter
from clawstack.worker.meter import DEFAULT_INTERVAL_S, DEFAULT_MAX_ENTRIES, Measure, main, measure, verdict

METER = Path(meter.__file__)
BIG = 1 << 20


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def snapshot(root: Path) -> list[tuple[str, int, int]]:
    """Every path under ``root`` with its size and mtime, to show the meter changed nothing."""
    return sorted(
        (str(path.relative_to(root)), path.lstat().st_size, path.lstat().st_mtime_ns) for path in root.rglob("*")
    )


def run_meter(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", "-P", "-I", str(METER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    root.mkdir()
    return root


def test_constants() -> None:
    assert DEFAULT_MAX_ENTRIES == 5_000_000
    assert DEFAULT_INTERVAL_S == 1.0


def test_empty_root_is_nothing(home: Path) -> None:
    assert measure(str(home), max_entries=10) == Measure(0, 0, "ok", None)


def test_nested_tree_counts_file_sizes_and_every_entry(home: Path) -> None:
    write(home / "a.txt", 10)
    write(home / "d1" / "b.bin", 200)
    write(home / "d1" / "d2" / "d3" / "c", 3000)
    (home / "empty").mkdir()
    # a.txt, d1, b.bin, d2, d3, c, empty
    assert measure(str(home), max_entries=100) == Measure(3210, 7, "ok", None)


def test_symlink_counts_its_own_size_and_is_not_followed(home: Path, tmp_path: Path) -> None:
    big = write(tmp_path / "outside" / "big.bin", BIG)
    link = home / "link"
    link.symlink_to(big)
    (home / "dirlink").symlink_to(tmp_path / "outside", target_is_directory=True)
    expected = link.lstat().st_size + (home / "dirlink").lstat().st_size
    assert 0 < expected < BIG
    assert measure(str(home), max_entries=100) == Measure(expected, 2, "ok", None)


def test_dangling_symlink_counts(home: Path) -> None:
    (home / "dangling").symlink_to(home / "nowhere")
    assert measure(str(home), max_entries=100) == Measure(len(str(home / "nowhere")), 1, "ok", None)


def test_hard_link_counts_each_time_it_appears(home: Path) -> None:
    first = write(home / "first", 500)
    os.link(first, home / "second")
    assert measure(str(home), max_entries=100) == Measure(1000, 2, "ok", None)


def test_fifo_counts_no_bytes_one_entry_and_never_blocks(home: Path) -> None:
    os.mkfifo(home / "pipe")
    write(home / "file", 7)
    results: list[Measure] = []
    walker = threading.Thread(target=lambda: results.append(measure(str(home), max_entries=100)), daemon=True)
    walker.start()
    walker.join(10)
    assert not walker.is_alive()
    assert results == [Measure(7, 2, "ok", None)]


def test_entries_at_the_limit_are_ok_and_one_more_is_unavailable(home: Path) -> None:
    (home / "d").mkdir()
    for index in range(4):
        write(home / "d" / f"f{index}", 1)
    assert measure(str(home), max_entries=5) == Measure(4, 5, "ok", None)
    write(home / "d" / "f4", 1)
    over = measure(str(home), max_entries=5)
    assert (over.state, over.reason, over.entries) == ("unavailable", "too_many_entries", 6)
    assert verdict(over, 10**9) == "home_meter_unavailable"


def test_zero_entries_allowed_means_any_entry_is_too_many(home: Path) -> None:
    assert measure(str(home), max_entries=0).state == "ok"
    write(home / "f", 1)
    assert measure(str(home), max_entries=0).reason == "too_many_entries"


def fail_scandir_for(monkeypatch: pytest.MonkeyPatch, target: Path, error: type[OSError]) -> list[str]:
    """Make ``os.scandir`` raise ``error`` for ``target``; returns the paths it was asked to list."""
    real = os.scandir
    asked: list[str] = []

    def scandir(path: Any) -> Any:
        asked.append(os.fspath(path))
        if os.fspath(path) == str(target):
            raise error(13 if error is PermissionError else 2, "refused")
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return asked


def test_unreadable_subdirectory_makes_the_home_unavailable(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(home / "ok" / "f", 5)
    (home / "locked").mkdir()
    asked = fail_scandir_for(monkeypatch, home / "locked", PermissionError)
    measured = measure(str(home), max_entries=100)
    assert str(home / "locked") in asked
    assert (measured.state, measured.reason) == ("unavailable", "unreadable")
    assert verdict(measured, 10**9) == "home_meter_unavailable"


@pytest.mark.parametrize("error", [PermissionError, OSError])
def test_unreadable_root_is_unavailable(home: Path, monkeypatch: pytest.MonkeyPatch, error: type[OSError]) -> None:
    fail_scandir_for(monkeypatch, home, error)
    assert measure(str(home), max_entries=100) == Measure(0, 0, "unavailable", "unreadable")


def test_root_missing_not_a_directory_or_a_symlink_is_unreadable(tmp_path: Path) -> None:
    unreadable = Measure(0, 0, "unavailable", "unreadable")
    assert measure(str(tmp_path / "missing"), max_entries=100) == unreadable
    assert measure(str(write(tmp_path / "file", 3)), max_entries=100) == unreadable
    (tmp_path / "dir").mkdir()
    (tmp_path / "root-link").symlink_to(tmp_path / "dir", target_is_directory=True)
    assert measure(str(tmp_path / "root-link"), max_entries=100) == unreadable


def test_root_vanishing_before_it_is_listed_is_unreadable(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_scandir_for(monkeypatch, home, FileNotFoundError)
    assert measure(str(home), max_entries=100).reason == "unreadable"


def test_subdirectory_deleted_during_the_walk_is_skipped(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(home / "keep" / "f", 11)
    write(home / "gone" / "g", 1000)
    asked = fail_scandir_for(monkeypatch, home / "gone", FileNotFoundError)
    assert measure(str(home), max_entries=100) == Measure(11, 3, "ok", None)
    assert str(home / "gone") in asked


def test_entry_vanishing_between_listing_and_stat_is_skipped(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(home / "stays", 4)
    doomed = write(home / "doomed", 400)
    real = os.scandir

    class Listing:
        def __init__(self, path: Any) -> None:
            with real(path) as entries:
                self.entries = list(entries)
            doomed.unlink(missing_ok=True)

        def __enter__(self) -> Iterator[os.DirEntry[str]]:
            return iter(self.entries)

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(os, "scandir", Listing)
    assert measure(str(home), max_entries=100) == Measure(4, 1, "ok", None)


def test_verdicts() -> None:
    assert verdict(Measure(100, 1, "ok"), 100) == "ok"
    assert verdict(Measure(101, 1, "ok"), 100) == "home_full"
    assert verdict(Measure(0, 0, "ok"), 0) == "ok"
    assert verdict(Measure(0, 0, "unavailable", "unreadable"), 100) == "home_meter_unavailable"
    assert verdict(Measure(10**6, 9, "unavailable", "too_many_entries"), 100) == "home_meter_unavailable"


def test_measure_to_json() -> None:
    assert Measure(3, 2, "ok").to_json() == {"bytes": 3, "entries": 2, "state": "ok", "reason": None}
    assert json.loads(json.dumps(Measure(0, 6, "unavailable", "too_many_entries").to_json()))["reason"] == (
        "too_many_entries"
    )


def test_imports_only_the_standard_library() -> None:
    tree = ast.parse(METER.read_text(encoding="utf-8"))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    tops = {name.split(".")[0] for name in names}
    assert tops
    assert tops <= set(sys.stdlib_module_names) | {"__future__"}


def test_once_writes_one_record_and_exits(home: Path, tmp_path: Path) -> None:
    write(home / "d" / "f", 300)
    out = tmp_path / "state" / "meter.json"
    out.parent.mkdir()
    before = snapshot(home)
    started = time.time()
    done = run_meter("--root", str(home), "--max-bytes", "299", "--out", str(out), "--once")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    record = json.loads(out.read_text(encoding="utf-8"))
    assert set(record) == {"seq", "at", "bytes", "entries", "state", "reason", "verdict"}
    assert isinstance(record["at"], float)
    assert started - 1 <= record["at"] <= time.time() + 1
    assert {key: value for key, value in record.items() if key != "at"} == {
        "seq": 1,
        "bytes": 300,
        "entries": 2,
        "state": "ok",
        "reason": None,
        "verdict": "home_full",
    }
    assert os.listdir(out.parent) == ["meter.json"]
    assert snapshot(home) == before


def test_once_reports_an_unmeasurable_home(home: Path, tmp_path: Path) -> None:
    for index in range(3):
        write(home / f"f{index}", 1)
    out = tmp_path / "meter.json"
    done = run_meter(f"--root={home}", "--max-bytes=1000", "--max-entries=2", f"--out={out}", "--once")
    assert done.returncode == 0
    record = json.loads(out.read_text(encoding="utf-8"))
    assert (record["state"], record["reason"], record["verdict"]) == (
        "unavailable",
        "too_many_entries",
        "home_meter_unavailable",
    )
    missing = run_meter("--root", str(tmp_path / "nope"), "--max-bytes", "1", "--out", str(out), "--once")
    assert missing.returncode == 0
    assert json.loads(out.read_text(encoding="utf-8"))["reason"] == "unreadable"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_loop_updates_the_record_and_stops_on_a_signal(home: Path, tmp_path: Path, signum: int) -> None:
    write(home / "f", 5)
    before = snapshot(home)
    out_dir = tmp_path / "state"
    out_dir.mkdir()
    out = out_dir / "meter.json"
    args = ["--root", str(home), "--max-bytes", "10", "--out", str(out), "--interval", "0.05"]
    process = subprocess.Popen([sys.executable, "-S", "-P", "-I", str(METER), *args], stderr=subprocess.PIPE)
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (len(seen) < 3 or seen[-1] < 4):
            if out.exists():
                record = json.loads(out.read_text(encoding="utf-8"))  # always whole: it is replaced, never rewritten
                if not seen or record["seq"] != seen[-1]:
                    seen.append(record["seq"])
                if record["seq"] == 2:
                    write(home / "g", 6)  # now 11 bytes, over the limit
            time.sleep(0.01)
        assert seen == sorted(seen)
        assert seen[0] >= 1
        assert seen[-1] >= 4
        assert json.loads(out.read_text(encoding="utf-8"))["verdict"] == "home_full"
        assert process.poll() is None  # a verdict does not end the meter; the supervisor does
        signalled = time.monotonic()
        process.send_signal(signum)
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - signalled < 2
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        stderr = process.stderr.read()
        process.stderr.close()
    assert stderr == b""
    assert os.listdir(out_dir) == ["meter.json"]
    assert [entry for entry in snapshot(home) if entry[0] != "g"] == before


def test_a_long_interval_still_stops_promptly(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "meter.json"
    args = ["--root", str(home), "--max-bytes", "10", "--out", str(out), "--interval", "60"]
    process = subprocess.Popen([sys.executable, "-S", "-P", "-I", str(METER), *args])
    try:
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.exists()
        process.terminate()
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "-1"], "--interval"),
        (["--interval", "nan"], "--interval"),
        (["--interval", "soon"], "--interval"),
        (["--max-bytes", "lots"], "--max-bytes"),
        (["--max-bytes", "-5"], "--max-bytes"),
        (["--max-entries", "1.5"], "--max-entries"),
        (["--max-bytes"], "--max-bytes"),
        (["--max-bytes", "1", "--max-bytes", "2"], "--max-bytes"),
        (["--frobnicate", "1"], "--frobnicate"),
    ],
)
def test_bad_arguments_exit_2_naming_the_argument(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    base = ["--root", str(home), "--out", str(tmp_path / "meter.json")]
    if "--max-bytes" not in args:
        base += ["--max-bytes", "1"]
    assert main([*base, *args, "--once"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert named in captured.err
    assert str(tmp_path) not in captured.err
    assert not (tmp_path / "meter.json").exists()


@pytest.mark.parametrize("missing", ["--root", "--out", "--max-bytes"])
def test_required_arguments(home: Path, tmp_path: Path, missing: str) -> None:
    given = {"--root": str(home), "--out": str(tmp_path / "meter.json"), "--max-bytes": "1"}
    del given[missing]
    done = run_meter(*[part for pair in given.items() for part in pair], "--once")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert missing in done.stderr
    assert str(tmp_path) not in done.stderr


def test_a_positional_argument_is_refused_without_echoing_it(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = str(tmp_path / "some" / "path")
    assert main(["--root", str(home), "--max-bytes", "1", "--out", str(tmp_path / "m.json"), secret]) == 2
    err = capsys.readouterr().err
    assert err == "meter: unknown argument\n"


def test_out_inside_root_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(home), "--max-bytes", "1", "--out", str(home / "sub" / "meter.json"), "--once"]) == 2
    err = capsys.readouterr().err
    assert err == "meter: --out must not be inside --root\n"
    assert list(home.iterdir()) == []


def test_unwritable_out_fails_without_naming_it(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "no-such-dir" / "meter.json"
    done = run_meter("--root", str(home), "--max-bytes", "1", "--out", str(out), "--once")
    assert done.returncode == 1
    assert done.stderr == "meter: cannot write --out (FileNotFoundError)\n"


def test_out_is_replaced_and_no_temporary_file_is_left(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "meter.json"
    out.write_text("stale", encoding="utf-8")
    assert main(["--root", str(home), "--max-bytes", "1", "--out", str(out), "--once"]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["verdict"] == "ok"
    assert sorted(os.listdir(tmp_path)) == ["home", "meter.json"]


def test_main_restores_the_signal_handlers(home: Path, tmp_path: Path) -> None:
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    assert main(["--root", str(home), "--max-bytes", "1", "--out", str(tmp_path / "m.json"), "--once"]) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: ")
