"""The root filesystem of clawstack/base: what it holds, what it leaves out, and that it is deterministic."""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import pytest

from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild_rootfs import IMAGE_PREFIX, TAR_MTIME, RootfsLayout, base_rootfs, host_interpreter


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    return path, base_rootfs(host_interpreter()).write_tar(path)


def test_the_tarball_is_deterministic(rootfs: tuple[Path, str], tmp_path: Path) -> None:
    _, digest = rootfs
    assert base_rootfs(host_interpreter()).write_tar(tmp_path / "again.tar") == digest


def test_entries_are_sorted_owned_by_root_with_a_fixed_mtime(rootfs: tuple[Path, str]) -> None:
    with tarfile.open(rootfs[0]) as archive:
        members = archive.getmembers()
    names = [member.name for member in members]
    assert names == sorted(names)
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
    # The fixed mtime, but for a stdlib source shipped with its byte code, which is checked against its mtime.
    compiled = {
        name.replace("__pycache__/", "").replace(f".{sys.implementation.cache_tag}.pyc", ".py")
        for name in names
        if name.endswith(".pyc")
    }
    assert {m.name for m in members if m.mtime != TAR_MTIME} == compiled


def test_it_holds_the_interpreter_and_what_a_server_needs(rootfs: tuple[Path, str]) -> None:
    with tarfile.open(rootfs[0]) as archive:
        members = {member.name: member for member in archive.getmembers()}
    version = host_interpreter().version
    prefix = IMAGE_PREFIX.lstrip("/")
    assert members[f"{prefix}/bin/python{version}"].isfile()
    assert members[f"{prefix}/bin/python3"].linkname == f"python{version}"
    assert f"{prefix}/lib/python{version}/os.py" in members
    assert f"{prefix}/lib/python{version}/site-packages" in members
    assert members["tmp"].isdir()
    assert members["tmp"].mode == 0o1777
    for needed in ("etc/passwd", "etc/group", "etc/nsswitch.conf"):
        assert members[needed].isfile()
    assert any(name.endswith("/libc.so.6") for name in members)
    assert any(os.path.basename(name).startswith("ld-linux") for name in members)
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        assert "etc/ssl/certs/ca-certificates.crt" in members
    with tarfile.open(rootfs[0]) as archive:
        passwd = archive.extractfile("etc/passwd")
        assert passwd is not None
        assert b"nobody:x:65534:65534:" in passwd.read()


def test_it_leaves_out_tests_tools_site_packages_and_any_shell(rootfs: tuple[Path, str]) -> None:
    with tarfile.open(rootfs[0]) as archive:
        names = archive.getnames()
    stdlib = f"{IMAGE_PREFIX.lstrip('/')}/lib/python{host_interpreter().version}/"
    for left_out in ("test/", "tkinter/", "idlelib/", "turtledemo/", "ensurepip/", "site-packages/", "unittest/test/"):
        assert not [name for name in names if name.startswith(stdlib + left_out)], left_out
    assert not [
        name for name in names if name.endswith(".pyc") and not name.endswith(f".{sys.implementation.cache_tag}.pyc")
    ]
    assert not [name for name in names if "/lib-dynload/_test" in name or "_tkinter" in name]
    assert not [name for name in names if os.path.basename(name) in ("sh", "bash", "dash", "busybox")]
    assert not [name for name in names if name.startswith(f"{IMAGE_PREFIX.lstrip('/')}/bin/pip")]


def test_current_stdlib_byte_code_comes_with_its_source_mtime(rootfs: tuple[Path, str]) -> None:
    # A worker runs with a read-only root: without the byte code it would compile the stdlib at every start.
    with tarfile.open(rootfs[0]) as archive:
        members = {member.name: member for member in archive.getmembers()}
    stdlib = f"{IMAGE_PREFIX.lstrip('/')}/lib/python{host_interpreter().version}"
    cached = members.get(f"{stdlib}/__pycache__/os.{sys.implementation.cache_tag}.pyc")
    if cached is None:
        pytest.skip("the host interpreter has no current byte code for os.py")
    source = members[f"{stdlib}/os.py"]
    with tarfile.open(rootfs[0]) as archive:
        stream = archive.extractfile(cached)
        assert stream is not None
        header = stream.read(16)
    assert int.from_bytes(header[8:12], "little") == source.mtime != 0
    assert int.from_bytes(header[12:16], "little") == source.size
    assert members[f"{stdlib}/json/encoder.py"].mtime != 0 or f"{stdlib}/json/__pycache__" not in members


def test_host_paths_keep_their_symlinks(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "lib.so.1.2").write_bytes(b"elf")
    (tmp_path / "real" / "lib.so.1").symlink_to("lib.so.1.2")
    (tmp_path / "link").symlink_to("real")
    layout = RootfsLayout()
    layout.add_host_path(str(tmp_path / "link" / "lib.so.1"))
    paths = layout.paths()
    assert str(tmp_path / "link") in paths
    assert str(tmp_path / "real" / "lib.so.1") in paths
    assert str(tmp_path / "real" / "lib.so.1.2") in paths
    with pytest.raises(BackendError) as info:
        layout.add_host_path(str(tmp_path / "real"))
    assert info.value.code == "rootfs_failed"
