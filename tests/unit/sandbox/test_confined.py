"""File access confined to a directory: every way out is refused, symlinks inside are followed, writes never
follow a symlink, and a path swapped for a symlink while in use never leads out."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawstack.sandbox import ConfinedDir, ConfinedPathError, PathEscapeError, PathNotFoundError

SECRET = b"outside secret"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``tmp_path/outside/`` (a secret file and a directory) beside ``tmp_path/ws/``, the confined root."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_bytes(SECRET)
    (outside / "dir" / "f").write_bytes(SECRET)
    ws = tmp_path / "ws"
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "f").write_bytes(b"inside")
    (ws / "sub" / "deep" / "g").write_bytes(b"deeper")
    (ws / "to-secret").symlink_to(outside / "secret")  # absolute, out
    (ws / "rel-out").symlink_to("../outside/secret")  # relative, out
    (ws / "etc").symlink_to("/etc")
    (ws / "out-dir").symlink_to(outside / "dir")
    (ws / "in-dir").symlink_to("sub")  # relative, in
    (ws / "abs-in").symlink_to(ws / "sub" / "f")  # absolute, in
    (ws / "sub" / "up").symlink_to("../sub/f")  # climbs, stays in
    (ws / "sub" / "too-far").symlink_to("../../outside/secret")
    (ws / "loop-a").symlink_to("loop-b")
    (ws / "loop-b").symlink_to("loop-a")
    return ws


def read(confined: ConfinedDir, path: str, *, follow: bool = True) -> bytes:
    fd = confined.open_file(path, follow=follow)
    try:
        return os.pread(fd, 1 << 16, 0)
    finally:
        os.close(fd)


ESCAPES = [
    "../outside/secret",
    "../../etc/passwd",
    "sub/../../outside/secret",
    "sub/deep/../../../outside/secret",
    "/etc/passwd",
    "{outside}/secret",
    "{ws}/../outside/secret",
    "{ws}/sub/../../outside/secret",
    "to-secret",
    "rel-out",
    "etc/passwd",
    "out-dir/f",
    "sub/too-far",
    "in-dir/too-far",
    "..",
    "{ws}/..",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_every_way_out_is_refused(tree: Path, template: str) -> None:
    path = template.format(ws=tree, outside=tree.parent / "outside")
    confined = ConfinedDir(tree, label="workspace root")
    with pytest.raises(PathEscapeError) as caught:
        read(confined, path)
    assert caught.value.code == "path_escape"
    assert caught.value.message.endswith(f"escapes workspace root ({tree}): {path}")
    with pytest.raises(ConfinedPathError) as caught:
        confined.replace_file(path, b"overwritten")
    assert caught.value.code in ("path_escape", "is_a_symlink")  # a final symlink is not followed at all
    assert (tree.parent / "outside" / "secret").read_bytes() == SECRET
    assert (tree.parent / "outside" / "dir" / "f").read_bytes() == SECRET


def test_an_escape_through_a_symlink_says_so(tree: Path) -> None:
    confined = ConfinedDir(tree, label="workspace root")
    with pytest.raises(PathEscapeError, match=r"^Symlink escapes"):
        read(confined, "etc/passwd")
    with pytest.raises(PathEscapeError, match=r"^Path escapes"):
        read(confined, "../outside/secret")


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("sub/f", b"inside"),
        ("./sub//f", b"inside"),
        ("sub/deep/../f", b"inside"),
        ("in-dir/f", b"inside"),
        ("in-dir/deep/g", b"deeper"),
        ("abs-in", b"inside"),
        ("sub/up", b"inside"),
        ("{ws}/sub/f", b"inside"),
        ("{ws}//sub/./f", b"inside"),
    ],
)
def test_paths_and_symlinks_that_stay_inside_work(tree: Path, path: str, content: bytes) -> None:
    assert read(ConfinedDir(tree), path.format(ws=tree)) == content


def test_the_root_may_be_named_by_its_real_path(tree: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(tree)
    confined = ConfinedDir(alias)
    assert read(confined, f"{alias}/sub/f") == b"inside"
    assert read(confined, f"{tree}/sub/f") == b"inside"
    assert read(confined, "abs-in") == b"inside"  # its target names the real path


def test_what_cannot_be_used_gets_a_code(tree: Path) -> None:
    confined = ConfinedDir(tree)
    cases = {
        "missing": PathNotFoundError,
        "sub/missing/f": PathNotFoundError,
        "sub/f/x": ConfinedPathError,
        "sub": ConfinedPathError,
        "loop-a": ConfinedPathError,
        "": ConfinedPathError,
        "a\0b": ConfinedPathError,
    }
    codes = {}
    for path, error in cases.items():
        with pytest.raises(error) as caught:
            read(confined, path)
        codes[path] = caught.value.code
    assert codes == {
        "missing": "path_not_found",
        "sub/missing/f": "path_not_found",
        "sub/f/x": "not_a_directory",
        "sub": "is_a_directory",
        "loop-a": "symlink_loop",
        "": "path_invalid",
        "a\0b": "path_invalid",
    }
    os.mkfifo(tree / "fifo")
    with pytest.raises(ConfinedPathError) as caught:
        read(confined, "fifo")  # opened without blocking, then refused
    assert caught.value.code == "not_a_regular_file"


def test_a_missing_root_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfinedPathError) as caught:
        read(ConfinedDir(tmp_path / "nowhere"), "f")
    assert caught.value.code == "root_missing"


def test_without_following_a_final_symlink_is_refused(tree: Path) -> None:
    with pytest.raises(ConfinedPathError) as caught:
        read(ConfinedDir(tree), "abs-in", follow=False)
    assert caught.value.code == "is_a_symlink"
    assert read(ConfinedDir(tree), "in-dir/f", follow=False) == b"inside"  # on the way, it is followed


def test_directories_resolve_to_their_real_components(tree: Path) -> None:
    confined = ConfinedDir(tree)
    assert confined.directory("in-dir/deep") == ("sub", "deep")
    assert confined.directory(".") == ()
    assert confined.directory("sub/deep/..") == ("sub",)
    with pytest.raises(PathEscapeError):
        confined.directory("out-dir")
    with pytest.raises(ConfinedPathError) as caught:
        confined.directory("sub/f")
    assert caught.value.code == "not_a_directory"


# --- writes ----------------------------------------------------------------------------------------------------


def test_a_write_creates_directories_and_keeps_the_mode(tree: Path) -> None:
    confined = ConfinedDir(tree)
    assert confined.replace_file("new/dir/file.txt", b"one") is True
    assert (tree / "new" / "dir" / "file.txt").read_bytes() == b"one"
    (tree / "sub" / "f").chmod(0o640)
    assert confined.replace_file("sub/f", b"two") is False
    assert (tree / "sub" / "f").read_bytes() == b"two"
    assert (tree / "sub" / "f").stat().st_mode & 0o777 == 0o640
    assert [entry for entry in os.listdir(tree / "sub") if entry.startswith(".claw-")] == []


def test_a_write_never_follows_a_symlink(tree: Path) -> None:
    confined = ConfinedDir(tree)
    for path in ("abs-in", "in-dir"):
        with pytest.raises(ConfinedPathError) as caught:
            confined.replace_file(path, b"x")
        assert caught.value.code in ("is_a_symlink", "is_a_directory")
    assert (tree / "sub" / "f").read_bytes() == b"inside"
    with pytest.raises(ConfinedPathError) as caught:
        confined.replace_file("sub", b"x")
    assert caught.value.code == "is_a_directory"


def test_a_write_replaces_a_hard_link_instead_of_writing_through_it(tree: Path) -> None:
    os.link(tree.parent / "outside" / "secret", tree / "hard")
    ConfinedDir(tree).replace_file("hard", b"replaced")
    assert (tree / "hard").read_bytes() == b"replaced"
    assert (tree.parent / "outside" / "secret").read_bytes() == SECRET


# --- swaps under way ---------------------------------------------------------------------------------------------


@pytest.fixture
def flipping(tree: Path) -> Iterator[tuple[Path, threading.Event]]:
    """``ws/flip`` turns into a symlink out and back into a regular file (and ``ws/dflip`` a directory and a
    symlink to an outside directory), atomically, as fast as a thread can make it."""
    stop = threading.Event()
    outside = tree.parent / "outside"
    (tree / "dflip").mkdir()
    (tree / "dflip" / "f").write_bytes(b"inside")

    def replace_dir(source: Path, target: Path) -> None:
        """Rename ``source`` to ``target``, removing a directory a write made there meanwhile."""
        while True:
            try:
                os.rename(source, target)
                return
            except OSError:
                shutil.rmtree(target, ignore_errors=True)

    def flip() -> None:
        os.symlink(outside / "dir", tree / ".dlink")
        while not stop.is_set():
            os.symlink(outside / "secret", tree / ".link")
            os.replace(tree / ".link", tree / "flip")
            (tree / ".file").write_bytes(b"inside")
            os.replace(tree / ".file", tree / "flip")
            replace_dir(tree / "dflip", tree / ".dsaved")
            replace_dir(tree / ".dlink", tree / "dflip")
            replace_dir(tree / "dflip", tree / ".dlink")
            replace_dir(tree / ".dsaved", tree / "dflip")

    (tree / "flip").write_bytes(b"inside")
    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    yield tree, stop
    stop.set()
    thread.join()


def test_a_path_swapped_for_a_symlink_while_read_never_leads_out(flipping: tuple[Path, threading.Event]) -> None:
    tree, _ = flipping
    confined = ConfinedDir(tree)
    outcomes: set[str] = set()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for path in ("flip", "dflip/f"):
            try:
                content = read(confined, path)
            except ConfinedPathError as exc:
                outcomes.add(exc.code)
                continue
            assert content == b"inside"
            outcomes.add("read")
    assert "read" in outcomes
    assert outcomes <= {"read", "path_escape", "path_not_found"}


def test_a_path_swapped_for_a_symlink_while_written_never_leads_out(flipping: tuple[Path, threading.Event]) -> None:
    tree, stop = flipping
    confined = ConfinedDir(tree)
    deadline = time.monotonic() + 1.5
    writes = 0
    refusals: set[str] = set()
    while time.monotonic() < deadline:
        for path in ("flip", "dflip/f"):
            try:
                confined.replace_file(path, b"written")
                writes += 1
            except ConfinedPathError as exc:
                refusals.add(exc.code)
    stop.set()
    assert writes > 0
    assert refusals <= {"is_a_symlink", "path_escape", "path_not_found"}
    assert (tree.parent / "outside" / "secret").read_bytes() == SECRET
    assert (tree.parent / "outside" / "dir" / "f").read_bytes() == SECRET
    assert sorted(os.listdir(tree.parent / "outside" / "dir")) == ["f"]
