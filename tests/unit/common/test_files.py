"""Private atomic writes and the socket-directory trust rule."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clawstack.common.files import (
    UnsafePathError,
    check_trusted_dir,
    ensure_private_dir,
    read_private,
    write_private,
)

from .conftest import NOBODY, requires_root


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_write_private_is_0600_and_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    old_umask = os.umask(0)
    try:
        write_private(target, b"one")
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"one"
    assert mode_of(target) == 0o600
    inode = os.stat(target).st_ino
    write_private(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.stat(target).st_ino != inode  # a new file renamed over the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]  # no temporary left behind


def test_write_private_failure_leaves_old_bytes_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    write_private(target, b"old")
    with pytest.raises(TypeError):
        write_private(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]


def test_write_private_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_private(tmp_path / "x", b"data")
    assert synced == ["file", "dir"]


def test_write_private_never_follows_a_planted_temp_symlink(tmp_path: Path) -> None:
    # The temporary name is random and opened with O_EXCL|O_NOFOLLOW; a symlink at the target is replaced,
    # not written through.
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    link = tmp_path / "secret"
    link.symlink_to(victim)
    write_private(link, b"new")
    assert victim.read_bytes() == b"untouched"
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"


def test_ensure_private_dir_creates_and_tightens(tmp_path: Path) -> None:
    made = ensure_private_dir(tmp_path / "a" / "b")
    assert mode_of(made) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    ensure_private_dir(loose)
    assert mode_of(loose) == 0o700


def test_ensure_private_dir_refuses_a_file_or_symlink(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        ensure_private_dir(tmp_path / "f")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePathError):
        ensure_private_dir(tmp_path / "link")


def test_read_private(tmp_path: Path) -> None:
    target = tmp_path / "s"
    write_private(target, b"abc")
    assert read_private(target, max_bytes=3) == b"abc"
    with pytest.raises(UnsafePathError):
        read_private(target, max_bytes=2)
    os.chmod(target, 0o644)
    with pytest.raises(UnsafePathError):
        read_private(target, max_bytes=10)
    link = tmp_path / "l"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink"):
        read_private(link, max_bytes=10)


@pytest.mark.parametrize("mode", [0o700, 0o750])
def test_trusted_dir_accepts_0700_and_0750(short_dir: Path, mode: int) -> None:
    sock_dir = short_dir / "sock"
    sock_dir.mkdir()
    os.chmod(sock_dir, mode)
    assert check_trusted_dir(sock_dir) == sock_dir.resolve()


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o777, 0o711, 0o1777, 0o600, 0o2700])
def test_trusted_dir_refuses_other_modes(short_dir: Path, mode: int) -> None:
    sock_dir = short_dir / "sock"
    sock_dir.mkdir()
    os.chmod(sock_dir, mode)
    with pytest.raises(UnsafePathError, match="mode"):
        check_trusted_dir(sock_dir)


def test_trusted_dir_refuses_writable_ancestor_without_sticky_bit(short_dir: Path) -> None:
    middle = short_dir / "shared"
    middle.mkdir()
    sock_dir = middle / "sock"
    sock_dir.mkdir(mode=0o700)
    for loose in (0o777, 0o775, 0o757):
        os.chmod(middle, loose)
        with pytest.raises(UnsafePathError, match="ancestor"):
            check_trusted_dir(sock_dir)
    os.chmod(middle, 0o1777)  # sticky, like /tmp: allowed
    check_trusted_dir(sock_dir)


def test_trusted_dir_checks_the_real_path_of_ancestors(short_dir: Path) -> None:
    loose = short_dir / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    (loose / "sock").mkdir(mode=0o700)
    safe = short_dir / "safe"
    safe.mkdir(mode=0o700)
    (safe / "via").symlink_to(loose)
    with pytest.raises(UnsafePathError, match="ancestor"):
        check_trusted_dir(safe / "via" / "sock")


def test_trusted_dir_refuses_symlink_missing_and_file(short_dir: Path) -> None:
    real = short_dir / "real"
    real.mkdir(mode=0o700)
    (short_dir / "link").symlink_to(real)
    with pytest.raises(UnsafePathError, match="symlink"):
        check_trusted_dir(short_dir / "link")
    with pytest.raises(UnsafePathError) as info:
        check_trusted_dir(short_dir / "missing")
    assert info.value.code == "path_missing"
    (short_dir / "file").write_text("x")
    with pytest.raises(UnsafePathError, match="not a directory"):
        check_trusted_dir(short_dir / "file")


@requires_root
def test_trusted_dir_owner_rules(short_dir: Path) -> None:
    sock_dir = short_dir / "sock"
    sock_dir.mkdir(mode=0o700)
    os.chown(sock_dir, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match="owned by uid 65534"):
        check_trusted_dir(sock_dir)
    assert check_trusted_dir(sock_dir, owner_uid=NOBODY) == sock_dir.resolve()
    # An ancestor owned by a third user could swap the directory out.
    os.chown(sock_dir, 0, 0)
    os.chown(short_dir, 4242, 4242)
    with pytest.raises(UnsafePathError, match="ancestor"):
        check_trusted_dir(sock_dir)
