"""Workspace bootstrap files: which are read, how they are rendered and cut, what is never read, the blind form."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.gateway.bootstrap import (
    BLIND_WORKSPACE,
    BOOTSTRAP_FILES,
    SEEDED_FILES,
    SUBAGENT_BOOTSTRAP_FILES,
    USER_FILE_MAX_CHARS,
    WorkspaceError,
    bootstrap_context,
    prepare_workspace,
)

_HEADING = re.compile(r"^## (.+)$", re.MULTILINE)


def _sections(text: str) -> dict[str, str]:
    """The rendered files by heading path, each with its body (the notice's heading names no file)."""
    parts = _HEADING.split(text)
    return {
        parts[i]: parts[i + 1].removeprefix("\n").removesuffix("\n") for i in range(1, len(parts), 2) if "/" in parts[i]
    }


def _write(workspace: Path, **files: str | bytes) -> Path:
    workspace.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = workspace / name.replace("_", ".")
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return workspace


def test_files_are_rendered_in_openclaws_order_under_their_paths(tmp_path: Path) -> None:
    ws = _write(
        tmp_path / "ws",
        MEMORY_md="memory\n",
        USER_md="user",
        BOOTSTRAP_md="first run",
        IDENTITY_md="identity",
        SOUL_md="soul",
        AGENTS_md="agents\n\n",
        TOOLS_md="tools",  # retired by OpenClaw: not a bootstrap file
    )
    context = bootstrap_context(ws)
    lines = context.text.splitlines()
    assert lines[:2] == ["# Project Context", "The agent's workspace files follow; the user can edit them."]
    sections = _sections(context.text)
    assert list(sections) == [f"{ws}/{name}" for name in BOOTSTRAP_FILES]
    assert sections[f"{ws}/AGENTS.md"] == "agents"  # trailing whitespace dropped
    assert sections[f"{ws}/MEMORY.md"] == "memory"
    assert "tools" not in context.text
    assert [f.state for f in context.files] == ["injected"] * 6
    assert not context.truncated


def test_empty_and_missing_files(tmp_path: Path) -> None:
    ws = _write(tmp_path / "ws", SOUL_md="  \n\t\n", USER_md="")
    context = bootstrap_context(ws)
    sections = _sections(context.text)
    # AGENTS.md and IDENTITY.md are expected, so their absence is shown; SOUL.md is empty and left out; USER.md,
    # BOOTSTRAP.md and MEMORY.md are optional.
    assert sections == {
        f"{ws}/AGENTS.md": f"[MISSING] Expected at: {ws}/AGENTS.md",
        f"{ws}/IDENTITY.md": f"[MISSING] Expected at: {ws}/IDENTITY.md",
    }
    states = {f.name: f.state for f in context.files}
    assert states == {
        "AGENTS.md": "missing",
        "SOUL.md": "empty",
        "IDENTITY.md": "missing",
        "USER.md": "empty",
        "BOOTSTRAP.md": "missing",
        "MEMORY.md": "missing",
    }


def test_nothing_to_show_is_an_empty_section(tmp_path: Path) -> None:
    assert bootstrap_context(tmp_path / "absent").text == ""
    ws = _write(tmp_path / "ws", AGENTS_md="x")
    assert bootstrap_context(ws, files=("USER.md", "MEMORY.md")).text == ""


def test_a_subagent_gets_agents_md_only(tmp_path: Path) -> None:
    ws = _write(tmp_path / "ws", AGENTS_md="rules", SOUL_md="soul", USER_md="user")
    assert _sections(bootstrap_context(ws, files=SUBAGENT_BOOTSTRAP_FILES).text) == {f"{ws}/AGENTS.md": "rules"}


def test_a_long_file_keeps_head_and_tail_around_a_marker(tmp_path: Path) -> None:
    text = "".join(f"line {i:05d}\n" for i in range(3000)).rstrip()
    ws = _write(tmp_path / "ws", AGENTS_md=text, SOUL_md="soul")
    context = bootstrap_context(ws, max_chars=2000)
    body = _sections(context.text)[f"{ws}/AGENTS.md"]
    assert len(body) <= 2000
    head, marker, counts, tail = re.split(r"\n(\[\.\.\.truncated[^\n]*\])\n(…\(truncated[^\n]*\)…)\n", body)
    assert marker == "[...truncated, read AGENTS.md for full content...]"
    kept = re.fullmatch(r"…\(truncated AGENTS\.md: kept (\d+)\+(\d+) chars of (\d+)\)…", counts)
    assert kept is not None
    assert (len(head), len(tail), int(kept.group(3))) == (int(kept.group(1)), int(kept.group(2)), len(text))
    assert text.startswith(head)
    assert text.endswith(tail)
    assert len(head) > 2 * len(tail)  # three quarters head, one quarter tail
    assert context.text.startswith("## Bootstrap Context Notice\n")
    assert context.truncated
    assert (context.files[0].state, context.files[0].chars, context.files[0].injected_chars) == (
        "truncated",
        len(text),
        len(body),
    )
    assert _sections(context.text)[f"{ws}/SOUL.md"] == "soul"


def test_user_md_has_its_own_cap(tmp_path: Path) -> None:
    ws = _write(tmp_path / "ws", USER_md="u" * 5000, MEMORY_md="m" * 5000)
    sections = _sections(bootstrap_context(ws).text)
    assert len(sections[f"{ws}/USER.md"]) <= USER_FILE_MAX_CHARS < 5000
    assert sections[f"{ws}/MEMORY.md"] == "m" * 5000
    lowered = _sections(bootstrap_context(ws, max_chars=1000).text)
    assert len(lowered[f"{ws}/USER.md"]) <= 1000


def test_the_total_cap_cuts_and_then_stops(tmp_path: Path) -> None:
    ws = _write(tmp_path / "ws", AGENTS_md="a" * 900, SOUL_md="s" * 900, IDENTITY_md="i" * 900, USER_md="u")
    context = bootstrap_context(ws, max_chars=1000, total_max_chars=1200)
    sections = _sections(context.text)
    assert sections[f"{ws}/AGENTS.md"] == "a" * 900
    assert len(sections[f"{ws}/SOUL.md"]) <= 300
    assert "truncated" in sections[f"{ws}/SOUL.md"]
    assert sum(len(body) for body in sections.values()) <= 1200
    # Less than 64 characters were left after SOUL.md: nothing more is added.
    assert list(sections) == [f"{ws}/AGENTS.md", f"{ws}/SOUL.md"]


def test_a_tiny_cap_still_marks_the_cut(tmp_path: Path) -> None:
    ws = _write(tmp_path / "ws", AGENTS_md="abcdefghij" * 20)
    body = _sections(bootstrap_context(ws, max_chars=40).text)[f"{ws}/AGENTS.md"]
    assert len(body) <= 40
    assert body.endswith("[…truncated AGENTS.md]")


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    ws = _write(tmp_path / "ws", AGENTS_md=b"before \xff\xfe after")
    assert _sections(bootstrap_context(ws).text)[f"{ws}/AGENTS.md"] == "before \ufffd\ufffd after"


def test_a_huge_file_is_read_at_its_ends_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with (ws / "AGENTS.md").open("wb") as file:
        file.write("é-head-".encode() * 100)
        file.write(b"x" * 5_000_000)
        file.write(b"-tail-end")
    size = (ws / "AGENTS.md").stat().st_size
    context = bootstrap_context(ws, max_chars=1000)
    body = _sections(context.text)[f"{ws}/AGENTS.md"]
    assert len(body) <= 1000
    assert body.startswith("é-head-é-head-")
    assert body.endswith("-tail-end")
    assert f"chars of a {size}-byte file)…" in body
    assert (context.files[0].state, context.files[0].chars) == ("truncated", None)


def test_links_and_special_files_are_never_read(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("TOP-SECRET")
    ws = _write(tmp_path / "ws", USER_md="user")
    (ws / "AGENTS.md").symlink_to(outside)
    (ws / "SOUL.md").symlink_to(ws / "USER.md")  # even a link inside the workspace
    os.link(outside, ws / "IDENTITY.md")  # a second name of a file outside
    (ws / "BOOTSTRAP.md").mkdir()
    os.mkfifo(ws / "MEMORY.md")  # would block a plain open()
    context = bootstrap_context(ws)
    assert "TOP-SECRET" not in context.text
    sections = _sections(context.text)
    assert sections[f"{ws}/AGENTS.md"] == "[UNREADABLE: a symlink is not read]"
    assert sections[f"{ws}/SOUL.md"] == "[UNREADABLE: a symlink is not read]"
    assert sections[f"{ws}/IDENTITY.md"] == "[UNREADABLE: a hard-linked file is not read]"
    assert sections[f"{ws}/BOOTSTRAP.md"] == "[UNREADABLE: not a regular file]"
    assert sections[f"{ws}/MEMORY.md"] == "[UNREADABLE: not a regular file]"
    assert sections[f"{ws}/USER.md"] == "user"


def test_blind_hides_the_workspace_path_everywhere(tmp_path: Path) -> None:
    real = tmp_path / "real-ws"
    _write(real, AGENTS_md=f"my files are in {real}/notes and {tmp_path}/link-ws/x")
    link = tmp_path / "link-ws"
    link.symlink_to(real)
    context = bootstrap_context(link, blind=True, files=("AGENTS.md", "SOUL.md"))
    assert str(tmp_path) not in context.text
    assert _sections(context.text) == {
        f"{BLIND_WORKSPACE}/AGENTS.md": f"my files are in {BLIND_WORKSPACE}/notes and {BLIND_WORKSPACE}/x",
        f"{BLIND_WORKSPACE}/SOUL.md": f"[MISSING] Expected at: {BLIND_WORKSPACE}/SOUL.md",
    }


def test_bad_limits_and_an_unusable_workspace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bootstrap_context(tmp_path, max_chars=0)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(WorkspaceError) as info:
        bootstrap_context(not_a_dir)
    assert info.value.code == "workspace_unavailable"


# --- preparing a workspace --------------------------------------------------------------------------------------


def test_prepare_creates_private_directories_and_seeds_missing_files(tmp_path: Path) -> None:
    ws = tmp_path / "a" / "b" / "ws"
    assert prepare_workspace(ws) == ws
    for directory in (tmp_path / "a", tmp_path / "a" / "b", ws):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(os.listdir(ws)) == sorted(SEEDED_FILES) == ["AGENTS.md", "IDENTITY.md", "SOUL.md", "USER.md"]
    for name in SEEDED_FILES:
        assert stat.S_IMODE((ws / name).stat().st_mode) == 0o600
        assert (ws / name).read_text().startswith(f"# {name}\n")
    sections = _sections(bootstrap_context(ws).text)
    assert list(sections) == [f"{ws}/{name}" for name in ("AGENTS.md", "SOUL.md", "IDENTITY.md", "USER.md")]


def test_prepare_never_overwrites_or_follows_links(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o755)
    ws.chmod(0o755)
    (ws / "AGENTS.md").write_text("mine")
    target = tmp_path / "outside.md"
    (ws / "SOUL.md").symlink_to(target)  # dangling: must not be created through
    prepare_workspace(ws, skip_optional=("USER.md",))
    assert stat.S_IMODE(ws.stat().st_mode) == 0o755  # an existing directory keeps its mode
    assert (ws / "AGENTS.md").read_text() == "mine"
    assert not target.exists()
    assert sorted(os.listdir(ws)) == ["AGENTS.md", "IDENTITY.md", "SOUL.md"]


def test_prepare_without_seeding_and_on_a_file(tmp_path: Path) -> None:
    ws = prepare_workspace(tmp_path / "ws", seed=False)
    assert ws.is_dir()
    assert os.listdir(ws) == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(WorkspaceError, match="not a directory"):
        prepare_workspace(blocker)
    with pytest.raises(WorkspaceError):
        prepare_workspace(blocker / "below")


_CONTENT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=3000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    agents=_CONTENT,
    user=_CONTENT,
    max_chars=st.integers(min_value=1, max_value=2500),
    total=st.integers(min_value=1, max_value=4000),
)
def test_any_contents_stay_within_the_caps(tmp_path: Path, agents: str, user: str, max_chars: int, total: int) -> None:
    ws = _write(tmp_path / "prop", AGENTS_md=agents, USER_md=user, SOUL_md="soul", IDENTITY_md="id")
    context = bootstrap_context(ws, max_chars=max_chars, total_max_chars=total)
    injected = sum(f.injected_chars for f in context.files)
    assert injected <= total
    for file in context.files:
        cap = min(max_chars, USER_FILE_MAX_CHARS) if file.name == "USER.md" else max_chars
        assert file.state in ("missing", "unreadable") or file.injected_chars <= cap
    sections = _sections(context.text)
    body = sections.get(f"{ws}/AGENTS.md")
    if body is not None and context.files[0].state != "truncated":
        assert body == agents.rstrip()
