"""Task homes on disk: one private directory per (installation, home), built from ids only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clawstack.runs.homes import Homes


def test_two_installations_with_one_id_get_two_homes(tmp_path: Path) -> None:
    homes = Homes(tmp_path / ".claw-homes")
    acme, beta = homes.ensure("acme", "task-1"), homes.ensure("beta", "task-1")
    assert acme != beta
    (acme / "note").write_text("acme's")
    assert not (beta / "note").exists()
    for path in (tmp_path / ".claw-homes", acme.parent, acme):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_root_supervisors_homes_belong_to_the_workers_uid(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another uid")
    home = Homes(tmp_path / ".claw-homes", owner_uid=65534).ensure("acme", "h")
    assert (home.stat().st_uid, home.parent.stat().st_uid) == (65534, 0)


@pytest.mark.parametrize(
    ("installation", "home"),
    [
        ("acme", ".hidden"),
        ("acme", ""),
        ("acme", "a" * 129),
        ("acme", "a/b"),
        ("acme", ".."),
        ("Acme", "h"),
        ("../x", "h"),
    ],
)
def test_no_path_is_built_from_a_bad_id(tmp_path: Path, installation: str, home: str) -> None:
    with pytest.raises(ValueError, match="invalid installation or home id"):
        Homes(tmp_path).path(installation, home)


def test_the_longest_id_and_every_allowed_character(tmp_path: Path) -> None:
    homes = Homes(tmp_path)
    assert homes.ensure("acme", "a" * 128).name == "a" * 128
    assert homes.ensure("acme", "A-z_0.9").name == "A-z_0.9"


def test_deleting_removes_links_without_following_them(tmp_path: Path) -> None:
    homes = Homes(tmp_path / ".claw-homes")
    home = homes.ensure("acme", "h")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    (home / "link").symlink_to(outside)
    assert homes.delete("acme", "h") is True
    assert not home.exists()
    assert (outside / "keep").read_text() == "kept"
    assert homes.delete("acme", "h") is False
    assert not homes.exists("acme", "h")


def test_a_home_replaced_by_a_link_is_not_a_home(tmp_path: Path) -> None:
    homes = Homes(tmp_path / ".claw-homes")
    homes.ensure("acme", "other")
    (tmp_path / ".claw-homes" / "acme" / "h").symlink_to(tmp_path)
    assert not homes.exists("acme", "h")
    with pytest.raises(ValueError, match="not a directory"):
        homes.ensure("acme", "h")
    assert homes.delete("acme", "h") is True  # the link itself goes
    assert tmp_path.is_dir()
