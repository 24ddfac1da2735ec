"""Deliverables of a task home: what is served (names, kinds, sizes, counts), what each refusal is, and that the
untrusted worker's races (files rewritten, swapped for links or FIFOs) never leak a descriptor, block or serve a
file that is not a deliverable."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import signal
import socket
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from clawstack.runs import deliverables as mod
from clawstack.runs.deliverables import (
    MAX_DELIVERABLE_BYTES,
    MAX_ENTRIES,
    MAX_LISTED,
    NAME,
    Deliverable,
    DeliverableError,
    Listing,
    fetch_deliverable,
    list_deliverables,
)

# The spec's words, written out again here rather than imported: the test must fail if the code drifts from them.
SPEC_NAME = r"[A-Za-z0-9][A-Za-z0-9._ -]{0,127}"
STATUS = {
    "deliverable_unknown": 404,
    "deliverable_too_large": 413,
    "deliverable_changed": 409,
    "home_unknown": 404,
    "deliverables_unreadable": 503,
}
INSTALLATION = "acme"
TIMES = ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
HOME = "home-1"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_descriptor_leak() -> Iterator[None]:
    before = open_fds()
    yield
    assert open_fds() == before


@pytest.fixture
def homes(tmp_path: Path) -> Path:
    root = tmp_path / "homes"
    (root / INSTALLATION / HOME / "deliverables").mkdir(parents=True)
    return root


@pytest.fixture
def out(homes: Path) -> Path:
    return homes / INSTALLATION / HOME / "deliverables"


def listing(homes: Path) -> Listing:
    return list_deliverables(homes, INSTALLATION, HOME)


def names(homes: Path) -> list[str]:
    return [d.name for d in listing(homes).deliverables]


def fetch(homes: Path, name: str, **kwargs: Any) -> dict[str, Any]:
    return fetch_deliverable(homes, INSTALLATION, HOME, name, **kwargs)


def refusal(call: Callable[[], object], code: str, tmp_path: Path) -> DeliverableError:
    with pytest.raises(DeliverableError) as caught:
        call()
    err = caught.value
    assert err.code == code
    assert err.status == STATUS[code]
    assert str(tmp_path) not in str(err)
    assert str(tmp_path) not in repr(err)
    assert "/" not in err.message
    return err


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError("blocked")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def deny_open(monkeypatch: pytest.MonkeyPatch, denied: str) -> None:
    """``os.open`` of ``denied`` fails as for a file the supervisor may not read (tests often run as root)."""
    real = os.open

    def fake(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == denied:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake)


# -- what is served -----------------------------------------------------------------------------------------------


def test_a_listing_is_sorted_by_name_with_size_digest_and_mtime(homes: Path, out: Path) -> None:
    contents = {"b.txt": b"second", "A report.md": b"# first\n", "a-1.csv": b"x,y\n1,2\n", "empty": b""}
    for name, data in contents.items():
        (out / name).write_bytes(data)
    os.utime(out / "b.txt", (1_700_000_000, 1_700_000_000.75))
    result = listing(homes)
    assert [d.name for d in result.deliverables] == ["A report.md", "a-1.csv", "b.txt", "empty"]
    assert result.truncated is False
    for item in result.deliverables:
        data = contents[item.name]
        assert item.bytes == len(data)
        assert item.sha256 == hashlib.sha256(data).hexdigest()
        mtime = datetime.fromtimestamp(int((out / item.name).stat().st_mtime), UTC)
        assert item.modified_at == mtime.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert result.deliverables[2].modified_at == "2023-11-14T22:13:20Z"


def test_the_json_shapes(homes: Path, out: Path) -> None:
    (out / "a.txt").write_bytes(b"hello")
    os.utime(out / "a.txt", (0, 0))
    digest = hashlib.sha256(b"hello").hexdigest()
    assert listing(homes).to_json() == {
        "deliverables": [{"name": "a.txt", "bytes": 5, "sha256": digest, "modified_at": "1970-01-01T00:00:00Z"}],
        "truncated": False,
    }
    assert fetch(homes, "a.txt") == {
        "name": "a.txt",
        "bytes": 5,
        "sha256": digest,
        "content_base64": base64.b64encode(b"hello").decode(),
    }


def test_mtimes_before_1970_and_out_of_range_still_format() -> None:
    assert mod._utc(-1) == "1969-12-31T23:59:59Z"
    assert mod._utc(-(10**9)) == "1969-12-31T23:59:59Z"
    assert mod._utc(-(10**9) - 1) == "1969-12-31T23:59:58Z"
    year_5 = int((datetime(5, 1, 2, 3, 4, 5) - datetime(1970, 1, 1)).total_seconds())
    assert mod._utc(year_5 * 10**9 + 999_999_999) == "0005-01-02T03:04:05Z"
    assert mod._utc(2**63 - 1) == "2262-04-11T23:47:16Z"
    assert mod._utc(10**12 * 10**9) == "9999-12-31T23:59:59Z"  # past the year 9999
    assert mod._utc((2**63 - 1) * 10**9) == "9999-12-31T23:59:59Z"  # the largest time a kernel reports
    assert mod._utc(-(10**12) * 10**9) == "0001-01-01T00:00:00Z"
    assert mod._utc(-(2**63) * 10**9) == "0001-01-01T00:00:00Z"


def test_the_name_rule_is_the_spec_regex() -> None:
    assert NAME.pattern == SPEC_NAME


@pytest.mark.parametrize(
    ("name", "served"),
    [
        ("report final v2.txt", True),
        ("trailing space ", True),
        ("0.tar.gz", True),
        ("a" * 128, True),
        ("a" * 129, False),
        (".hidden", False),
        (" leading space", False),
        ("_underscore", False),
        ("-dash", False),
        ("café.txt", False),
        ("line\nbreak", False),
        ("tab\there", False),
        ("colon:here", False),
    ],
)
def test_names(homes: Path, out: Path, tmp_path: Path, name: str, served: bool) -> None:
    (out / name).write_bytes(b"data")
    assert names(homes) == ([name] if served else [])
    if served:
        assert base64.b64decode(fetch(homes, name)["content_base64"]) == b"data"
    else:
        refusal(lambda: fetch(homes, name), "deliverable_unknown", tmp_path)


def test_a_name_that_is_not_utf8_is_not_served(homes: Path, out: Path, tmp_path: Path) -> None:
    fd = os.open(os.fsencode(out) + b"/bad\xff.txt", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    (out / "good.txt").write_bytes(b"")
    assert names(homes) == ["good.txt"]
    refusal(lambda: fetch(homes, os.fsdecode(b"bad\xff.txt")), "deliverable_unknown", tmp_path)


def test_a_subdirectory_is_not_served(homes: Path, out: Path, tmp_path: Path) -> None:
    (out / "sub").mkdir()
    (out / "sub" / "inner.txt").write_bytes(b"inner")
    assert names(homes) == []
    refusal(lambda: fetch(homes, "sub"), "deliverable_unknown", tmp_path)


@pytest.mark.parametrize("target", ["inside", "directory", "outside", "dangling"])
def test_a_symlink_is_not_served(homes: Path, out: Path, tmp_path: Path, target: str) -> None:
    (out / "real.txt").write_bytes(b"real")
    (out / "dir").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"supervisor secret")
    pointee = {"inside": out / "real.txt", "directory": out / "dir", "outside": secret, "dangling": tmp_path / "no"}
    (out / "link.txt").symlink_to(pointee[target])
    assert names(homes) == ["real.txt"]
    refusal(lambda: fetch(homes, "link.txt"), "deliverable_unknown", tmp_path)


def test_a_hard_link_is_not_served(homes: Path, out: Path, tmp_path: Path) -> None:
    outside = homes / INSTALLATION / HOME / "private.txt"
    outside.write_bytes(b"not a deliverable")
    os.link(outside, out / "linked.txt")
    assert (out / "linked.txt").stat().st_nlink == 2
    (out / "plain.txt").write_bytes(b"plain")
    assert names(homes) == ["plain.txt"]
    refusal(lambda: fetch(homes, "linked.txt"), "deliverable_unknown", tmp_path)


def test_a_fifo_is_skipped_and_its_fetch_never_blocks(homes: Path, out: Path, tmp_path: Path) -> None:
    os.mkfifo(out / "pipe")
    (out / "a.txt").write_bytes(b"a")
    with deadline(5):
        assert names(homes) == ["a.txt"]
        refusal(lambda: fetch(homes, "pipe"), "deliverable_unknown", tmp_path)


def test_a_fifo_swapped_in_after_the_lstat_never_blocks(
    homes: Path, out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (out / "swap").write_bytes(b"file")
    real = os.stat

    def swap_then_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        result = real(path, *args, **kwargs)
        if path == "swap":
            (out / "swap").unlink()
            os.mkfifo(out / "swap")
        return result

    monkeypatch.setattr(os, "stat", swap_then_stat)
    with deadline(5):
        assert names(homes) == []
        refusal(lambda: fetch(homes, "swap"), "deliverable_unknown", tmp_path)


def test_a_unix_socket_is_not_served(homes: Path, out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(out)  # a relative address: the full path may be longer than a socket address allows
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("sock")
        assert stat.S_ISSOCK((out / "sock").lstat().st_mode)
        assert names(homes) == []
        refusal(lambda: fetch(homes, "sock"), "deliverable_unknown", tmp_path)


def test_the_size_limit(homes: Path, out: Path, tmp_path: Path) -> None:
    (out / "limit.bin").write_bytes(b"x" * MAX_DELIVERABLE_BYTES)
    (out / "over.bin").write_bytes(b"x" * (MAX_DELIVERABLE_BYTES + 1))
    assert MAX_DELIVERABLE_BYTES == 524288
    [item] = listing(homes).deliverables
    assert (item.name, item.bytes) == ("limit.bin", 524288)
    fetched = fetch(homes, "limit.bin")
    assert fetched["bytes"] == 524288
    assert len(base64.b64decode(fetched["content_base64"])) == 524288
    refusal(lambda: fetch(homes, "over.bin"), "deliverable_too_large", tmp_path)


def test_a_file_that_grows_past_the_limit_while_read_is_too_large(
    homes: Path, out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (out / "growing.bin").write_bytes(b"x" * (MAX_DELIVERABLE_BYTES + 10))
    (out / "small.txt").write_bytes(b"s")

    def shrink(real: Callable[..., os.stat_result]) -> Callable[..., os.stat_result]:
        def small(*args: Any, **kwargs: Any) -> os.stat_result:
            st = real(*args, **kwargs)  # as the size was before the worker appended to the file
            fields = list(st)
            fields[stat.ST_SIZE] = 10
            return os.stat_result(fields, {k: getattr(st, k) for k in TIMES})

        return small

    monkeypatch.setattr(os, "stat", shrink(os.stat))
    monkeypatch.setattr(os, "fstat", shrink(os.fstat))
    assert names(homes) == ["small.txt"]
    refusal(lambda: fetch(homes, "growing.bin"), "deliverable_too_large", tmp_path)


# -- counts -------------------------------------------------------------------------------------------------------


def make_files(out: Path, count: int, prefix: str = "f") -> list[str]:
    made = [f"{prefix}{i:05d}" for i in range(count)]
    for name in made:
        (out / name).write_bytes(b"")
    return made


def test_200_files_are_all_listed(homes: Path, out: Path) -> None:
    assert MAX_LISTED == 200
    made = make_files(out, 200)
    result = listing(homes)
    assert [d.name for d in result.deliverables] == made
    assert result.truncated is False


def test_201_files_list_the_first_200_by_name(homes: Path, out: Path) -> None:
    made = make_files(out, 201)
    result = listing(homes)
    assert [d.name for d in result.deliverables] == sorted(made)[:200]
    assert result.truncated is True


def test_unservable_entries_do_not_count_towards_the_200(homes: Path, out: Path) -> None:
    made = make_files(out, 200)
    make_files(out, 50, prefix=".hidden")
    for i in range(10):
        (out / f"dir{i}").mkdir()
    result = listing(homes)
    assert [d.name for d in result.deliverables] == made
    assert result.truncated is False


def test_more_than_4096_entries_is_truncated(homes: Path, out: Path) -> None:
    assert MAX_ENTRIES == 4096
    make_files(out, 4990, prefix=".hidden")
    servable = make_files(out, 10)
    result = listing(homes)
    assert result.truncated is True
    assert len(result.deliverables) <= 10
    assert {d.name for d in result.deliverables} <= set(servable)


def test_5000_servable_entries_list_at_most_200(homes: Path, out: Path) -> None:
    make_files(out, 5000)
    result = listing(homes)
    assert result.truncated is True
    listed = [d.name for d in result.deliverables]
    assert len(listed) == 200
    assert listed == sorted(listed)


def test_exactly_4096_entries_is_not_truncated(homes: Path, out: Path) -> None:
    make_files(out, 4090, prefix=".hidden")
    servable = make_files(out, 6)
    result = listing(homes)
    assert [d.name for d in result.deliverables] == servable
    assert result.truncated is False


# -- refusals -----------------------------------------------------------------------------------------------------


def test_the_error_codes_and_statuses(tmp_path: Path) -> None:
    for code, status in STATUS.items():
        err = DeliverableError(code, "message")
        assert (err.code, err.status, err.message) == (code, status, "message")


def test_an_unreadable_file_fails_the_list_and_the_fetch(
    homes: Path, out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (out / "a.txt").write_bytes(b"a")
    (out / "locked.txt").write_bytes(b"locked")
    deny_open(monkeypatch, "locked.txt")
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "locked.txt"), "deliverables_unreadable", tmp_path)
    assert fetch(homes, "a.txt")["bytes"] == 1


def test_an_io_error_while_reading_is_unreadable(
    homes: Path, out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (out / "a.txt").write_bytes(b"a")

    def failing(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "read", failing)
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "a.txt"), "deliverables_unreadable", tmp_path)


def test_too_many_open_files_is_unreadable(homes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def exhausted(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == HOME:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", exhausted)
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "a.txt"), "deliverables_unreadable", tmp_path)


def test_an_unreadable_directory_is_unreadable(homes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deny_open(monkeypatch, "deliverables")
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "a.txt"), "deliverables_unreadable", tmp_path)


@pytest.mark.parametrize("target", ["elsewhere", "dangling"])
def test_deliverables_as_a_symlink_is_unreadable(homes: Path, out: Path, tmp_path: Path, target: str) -> None:
    out.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_bytes(b"secret")
    out.symlink_to(elsewhere if target == "elsewhere" else tmp_path / "nowhere")
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "secret.txt"), "deliverables_unreadable", tmp_path)


def test_deliverables_as_a_file_is_unreadable(homes: Path, out: Path, tmp_path: Path) -> None:
    out.rmdir()
    out.write_bytes(b"not a directory")
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "a.txt"), "deliverables_unreadable", tmp_path)


@pytest.mark.parametrize("level", ["home", "installation"])
def test_a_home_or_installation_replaced_by_a_symlink_is_unreadable(homes: Path, tmp_path: Path, level: str) -> None:
    real = tmp_path / "real"
    (real / "deliverables").mkdir(parents=True)
    (real / "deliverables" / "a.txt").write_bytes(b"a")
    if level == "home":
        (homes / INSTALLATION / HOME).rename(tmp_path / "moved")
        (homes / INSTALLATION / HOME).symlink_to(real)
    else:
        (homes / INSTALLATION).rename(tmp_path / "moved")
        (real / HOME / "deliverables").mkdir(parents=True)
        (homes / INSTALLATION).symlink_to(real)
    refusal(lambda: listing(homes), "deliverables_unreadable", tmp_path)
    refusal(lambda: fetch(homes, "a.txt"), "deliverables_unreadable", tmp_path)


@pytest.mark.parametrize("missing", ["homes_dir", "installation", "home"])
def test_a_missing_home_is_home_unknown(tmp_path: Path, missing: str) -> None:
    homes = tmp_path / "homes"
    if missing != "homes_dir":
        (homes / INSTALLATION).mkdir(parents=True)
    if missing == "home":
        (homes / INSTALLATION / "other-home" / "deliverables").mkdir(parents=True)
    refusal(lambda: listing(homes), "home_unknown", tmp_path)
    refusal(lambda: fetch(homes, "a.txt"), "home_unknown", tmp_path)


def test_a_home_without_deliverables_lists_empty(homes: Path, out: Path, tmp_path: Path) -> None:
    out.rmdir()
    assert listing(homes) == Listing((), False)
    assert listing(homes).to_json() == {"deliverables": [], "truncated": False}
    refusal(lambda: fetch(homes, "a.txt"), "deliverable_unknown", tmp_path)


def test_a_missing_file_is_unknown(homes: Path, tmp_path: Path) -> None:
    refusal(lambda: fetch(homes, "absent.txt"), "deliverable_unknown", tmp_path)


# -- fetch against a listing --------------------------------------------------------------------------------------


def test_a_fetch_with_the_listed_digest(homes: Path, out: Path) -> None:
    data = bytes(range(256)) * 3
    (out / "data.bin").write_bytes(data)
    [item] = listing(homes).deliverables
    fetched = fetch(homes, "data.bin", expected_sha256=item.sha256)
    content = base64.b64decode(fetched["content_base64"])
    assert content == data
    assert fetched["sha256"] == hashlib.sha256(content).hexdigest() == item.sha256
    assert fetched["bytes"] == len(content) == item.bytes
    assert fetch(homes, "data.bin", expected_sha256=item.sha256.upper())["sha256"] == item.sha256


def test_a_file_rewritten_since_the_listing_is_changed(homes: Path, out: Path, tmp_path: Path) -> None:
    (out / "report.txt").write_bytes(b"draft")
    [item] = listing(homes).deliverables
    (out / "report.txt").write_bytes(b"FINAL CONTENT")
    err = refusal(lambda: fetch(homes, "report.txt", expected_sha256=item.sha256), "deliverable_changed", tmp_path)
    encoded = base64.b64encode(b"FINAL CONTENT").decode()
    assert "FINAL" not in str(err)
    assert encoded not in repr(vars(err))
    assert not hasattr(err, "content_base64")
    assert base64.b64decode(fetch(homes, "report.txt")["content_base64"]) == b"FINAL CONTENT"


def test_a_file_swapped_for_a_symlink_since_the_listing_is_unknown(homes: Path, out: Path, tmp_path: Path) -> None:
    (out / "report.txt").write_bytes(b"draft")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"draft")  # the same bytes: only the kind of file changed
    [item] = listing(homes).deliverables
    (out / "report.txt").unlink()
    (out / "report.txt").symlink_to(secret)
    refusal(lambda: fetch(homes, "report.txt", expected_sha256=item.sha256), "deliverable_unknown", tmp_path)
    assert names(homes) == []


def test_a_file_removed_between_listing_and_opening_is_skipped(
    homes: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (out / "a.txt").write_bytes(b"a")
    (out / "b.txt").write_bytes(b"b")
    real = os.stat

    def remove_after_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        result = real(path, *args, **kwargs)
        if path == "a.txt":
            (out / "a.txt").unlink()
        return result

    monkeypatch.setattr(os, "stat", remove_after_stat)
    assert names(homes) == ["b.txt"]


# -- identifiers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("installation", "home"),
    [
        ("Acme", HOME),
        ("", HOME),
        ("-acme", HOME),
        ("a" * 65, HOME),
        ("ac/me", HOME),
        ("..", HOME),
        (INSTALLATION, ""),
        (INSTALLATION, ".."),
        (INSTALLATION, ".home"),
        (INSTALLATION, "a/b"),
        (INSTALLATION, "a" * 129),
        (INSTALLATION, "home\n"),
    ],
)
def test_bad_ids_raise_value_error_before_any_path_is_opened(tmp_path: Path, installation: str, home: str) -> None:
    homes = tmp_path / "does-not-exist"
    with pytest.raises(ValueError, match="invalid") as caught:
        list_deliverables(homes, installation, home)
    assert str(tmp_path) not in str(caught.value)
    with pytest.raises(ValueError, match="invalid"):
        fetch_deliverable(homes, installation, home, "a.txt")


def test_the_longest_ids_are_accepted(tmp_path: Path) -> None:
    installation, home = "a" * 64, "_" + "h" * 127
    (tmp_path / installation / home / "deliverables").mkdir(parents=True)
    (tmp_path / installation / home / "deliverables" / "x").write_bytes(b"x")
    assert [d.name for d in list_deliverables(tmp_path, installation, home).deliverables] == ["x"]


def test_results_are_frozen(homes: Path, out: Path) -> None:
    (out / "a.txt").write_bytes(b"a")
    item = listing(homes).deliverables[0]
    assert isinstance(item, Deliverable)
    with pytest.raises(AttributeError):
        item.name = "b.txt"  # type: ignore[misc]
