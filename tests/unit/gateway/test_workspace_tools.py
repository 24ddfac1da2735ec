"""The workspace tools ``read``, ``write`` and ``edit``: OpenClaw's names, shapes and result texts, confinement to
the workspace, the size bounds, and the blind view. ``exec`` is in tests/integration/gateway/."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.gateway.tools import Tool, ToolError, ToolInvocation, ToolPolicy, ToolRegistry
from clawstack.gateway.workspace_tools import WORKSPACE_MARK, WorkspaceToolLimits, workspace_tools

SECRET = "outside secret\n"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_text(SECRET)
    (outside / "dir" / "f").write_text(SECRET)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (ws / "etc").symlink_to("/etc")
    (ws / "to-secret").symlink_to(outside / "secret")
    (ws / "rel-out").symlink_to("../outside/secret")
    (ws / "out-dir").symlink_to(outside / "dir")
    (ws / "link-in").symlink_to("notes.txt")
    return ws


def tools(**limits: Any) -> dict[str, Tool]:
    return {tool.name: tool for tool in workspace_tools(limits=WorkspaceToolLimits(**limits))}


def invocation(workspace: Path | None, *, blind: bool = False) -> ToolInvocation:
    return ToolInvocation("run-1", "agent:main:main", "main", "call-1", workspace=workspace, blind=blind)


async def call(name: str, arguments: dict[str, Any], workspace: Path | None, **options: Any) -> str:
    limits = options.pop("limits", {})
    return await tools(**limits)[name].handler(arguments, invocation(workspace, **options))


async def refused(name: str, arguments: dict[str, Any], workspace: Path | None, **options: Any) -> str:
    with pytest.raises(ToolError) as caught:
        await call(name, arguments, workspace, **options)
    return caught.value.message


# --- names and shapes -------------------------------------------------------------------------------------------


def test_the_tools_have_openclaws_names_and_argument_shapes() -> None:
    found = tools()
    assert list(found) == ["read", "write", "edit", "exec"]
    assert all(tool.owner is None for tool in found.values())
    properties = {name: set(tool.parameters["properties"]) for name, tool in found.items()}
    assert properties["read"] == {"path", "offset", "limit", "cursor", "optional"}
    assert properties["write"] == {"path", "content"}
    assert properties["edit"] == {"path", "edits"}
    assert set(found["edit"].parameters["properties"]["edits"]["items"]["properties"]) == {"oldText", "newText"}
    assert {"command", "workdir", "env", "timeoutSeconds"} <= properties["exec"]
    assert found["read"].parameters["required"] == ["path"]
    assert found["exec"].parameters["required"] == ["command"]
    assert "2000 lines or 50KB" in found["read"].description


def test_tool_groups_act_on_the_real_tools() -> None:
    registry = ToolRegistry(workspace_tools())
    assert ToolPolicy(deny=["group:fs"]).effective(registry.names()) == ["exec"]
    assert ToolPolicy(deny=["group:runtime"]).effective(registry.names()) == ["read", "write", "edit"]
    assert [entry["function"]["name"] for entry in registry.openai_tools(registry.names())] == registry.names()


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read", {"path": "notes.txt"}),
        ("write", {"path": "x", "content": "y"}),
        ("edit", {"path": "notes.txt", "edits": [{"oldText": "alpha", "newText": "a"}]}),
        ("exec", {"command": "true"}),
    ],
)
async def test_without_a_workspace_every_tool_refuses(name: str, arguments: dict[str, Any]) -> None:
    message = await refused(name, arguments, None)
    assert message.startswith(f"{name} needs a workspace")


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("read", {}, "read: path must be a non-empty string"),
        ("read", {"path": ""}, "read: path must be a non-empty string"),
        ("read", {"path": 7}, "read: path must be a non-empty string"),
        ("read", {"path": "a\0b"}, "read: path must be free of NUL"),
        ("read", {"path": "x" * 5000}, "read: path must be free of NUL and at most 4096 bytes"),
        ("read", {"path": "notes.txt", "file_path": "x"}, "read: unknown argument(s) file_path"),
        ("read", {"path": "notes.txt", "offset": 0}, "Offset must be an integer at least 1"),
        ("read", {"path": "notes.txt", "offset": 1.5}, "Offset must be an integer at least 1"),
        ("read", {"path": "notes.txt", "offset": True}, "Offset must be an integer at least 1"),
        ("read", {"path": "notes.txt", "cursor": -1}, "Cursor must be an integer at least 0"),
        ("read", {"path": "notes.txt", "limit": 0}, "read: limit must be a number of lines, at least 1"),
        ("read", {"path": "notes.txt", "limit": "5"}, "read: limit must be a number of lines, at least 1"),
        ("read", {"path": "notes.txt", "optional": False}, "read: optional must be true when given"),
        ("write", {"path": "x"}, "write: content must be a string"),
        ("write", {"path": "x", "content": 5}, "write: content must be a string"),
        ("write", {"path": "x", "content": "\ud800"}, "write: the content is not valid Unicode"),
        ("edit", {"path": "notes.txt"}, "Edit tool input is invalid. edits must contain at least one replacement."),
        ("edit", {"path": "notes.txt", "edits": []}, "Edit tool input is invalid."),
        ("edit", {"path": "notes.txt", "edits": "alpha"}, "edit: edits must be an array"),
        ("edit", {"path": "notes.txt", "edits": [{"oldText": "a"}]}, "edit: edits[0] must be an object"),
        ("edit", {"path": "notes.txt", "edits": [{"oldText": "a", "newText": 1}]}, "edit: edits[0] must be"),
        ("edit", {"path": "notes.txt", "oldText": "alpha"}, "edit: oldText and newText go together"),
    ],
)
async def test_malformed_arguments_get_a_clear_error(
    workspace: Path, name: str, arguments: dict[str, Any], expected: str
) -> None:
    before = (workspace / "notes.txt").read_text()
    assert (await refused(name, arguments, workspace)).startswith(expected)
    assert (workspace / "notes.txt").read_text() == before
    assert not (workspace / "x").exists()


# --- containment ----------------------------------------------------------------------------------------------

ESCAPES = [
    "../outside/secret",
    "../../etc/passwd",
    "/etc/passwd",
    "{outside}/secret",
    "{ws}/../outside/secret",
    "etc/passwd",
    "to-secret",
    "rel-out",
    "out-dir/f",
    "out-dir/new-file",
]


@pytest.mark.parametrize("template", ESCAPES)
async def test_no_path_leads_out_of_the_workspace(workspace: Path, template: str) -> None:
    outside = workspace.parent / "outside"
    path = template.format(ws=workspace, outside=outside)
    attempts = [
        ("read", {"path": path}),
        ("write", {"path": path, "content": "pwned"}),
        ("edit", {"path": path, "edits": [{"oldText": "outside", "newText": "pwned"}]}),
    ]
    for name, arguments in attempts:
        message = await refused(name, arguments, workspace)
        assert "escapes workspace root" in message or "is a symbolic link" in message, (name, message)
        assert SECRET not in message
    assert (outside / "secret").read_text() == SECRET
    assert (outside / "dir" / "f").read_text() == SECRET
    assert sorted(p.name for p in (outside / "dir").iterdir()) == ["f"]


async def test_an_absolute_path_inside_the_workspace_is_accepted(workspace: Path) -> None:
    assert await call("read", {"path": str(workspace / "notes.txt")}, workspace) == "alpha\nbeta\ngamma\n"
    assert await call("write", {"path": str(workspace / "made.txt"), "content": "x"}, workspace) == (
        f"Successfully wrote 1 bytes to {workspace / 'made.txt'}"
    )


async def test_a_symlink_inside_is_followed_by_read_but_never_written_through(workspace: Path) -> None:
    assert await call("read", {"path": "link-in"}, workspace) == "alpha\nbeta\ngamma\n"
    message = await refused("write", {"path": "link-in", "content": "x"}, workspace)
    assert message == "link-in is a symbolic link; writes do not follow symbolic links"
    message = await refused("edit", {"path": "link-in", "edits": [{"oldText": "alpha", "newText": "a"}]}, workspace)
    assert "link-in is a symbolic link" in message
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"


# --- read ---------------------------------------------------------------------------------------------------


async def test_read_returns_a_small_file_verbatim_with_crlf_and_bom_normalized(workspace: Path) -> None:
    (workspace / "dos.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    assert await call("read", {"path": "dos.txt"}, workspace) == "one\ntwo\n"
    assert await call("read", {"path": "notes.txt", "offset": 2}, workspace) == "beta\ngamma\n"


async def test_read_with_a_limit_says_how_many_lines_remain(workspace: Path) -> None:
    assert await call("read", {"path": "notes.txt", "limit": 1}, workspace) == (
        "alpha\n\n[2 more lines in file. Use offset=2 to continue.]"
    )
    assert await call("read", {"path": "notes.txt", "offset": 2, "limit": 1}, workspace) == (
        "beta\n\n[1 more line in file. Use offset=3 to continue.]"
    )
    assert await call("read", {"path": "notes.txt", "offset": 3, "limit": 5}, workspace) == "gamma\n"


async def test_read_caps_a_page_at_2000_lines(workspace: Path) -> None:
    (workspace / "long.txt").write_text("".join(f"{index}\n" for index in range(1, 2501)))
    page = await call("read", {"path": "long.txt"}, workspace)
    body, notice = page.rsplit("\n\n", 1)
    assert body.split("\n") == [str(index) for index in range(1, 2001)]
    assert notice == "[Showing lines 1-2000 of 2500 (50.0KB limit). Use offset=2001 to continue.]"
    rest = await call("read", {"path": "long.txt", "offset": 2001}, workspace)
    assert rest == "".join(f"{index}\n" for index in range(2001, 2501))


async def test_read_caps_a_page_at_50_kb(workspace: Path) -> None:
    line = "x" * 99
    (workspace / "wide.txt").write_text(f"{line}\n" * 1000)
    page = await call("read", {"path": "wide.txt"}, workspace)
    assert len(page.encode()) <= 50 * 1024
    body, notice = page.rsplit("\n\n", 1)
    shown = body.split("\n")
    assert set(shown) == {line}
    assert notice == f"[Showing lines 1-{len(shown)} of 1000 (50.0KB limit). Use offset={len(shown) + 1} to continue.]"


async def test_a_line_longer_than_a_page_continues_by_cursor(workspace: Path) -> None:
    text = "".join(chr(0x41 + index % 26) for index in range(120_000)) + "é\nnext\n"
    (workspace / "one-line.txt").write_text(text)
    first = await call("read", {"path": "one-line.txt"}, workspace)
    match = re.search(
        r"\n\n\[Showing part of line 1 \(50\.0KB limit\)\. Use read with offset=1, cursor=(\d+) to continue\.\]$", first
    )
    assert match is not None, first[-200:]
    cursor = int(match.group(1))
    assert first[: match.start()] == text[:cursor]
    second = await call("read", {"path": "one-line.txt", "cursor": cursor}, workspace)
    assert second.startswith(text[cursor : cursor + 1000])
    beyond = await call("read", {"path": "one-line.txt", "cursor": 200_000}, workspace)
    assert beyond == "Cursor 200000 is at or beyond the end of line 1 (120001 characters). Use offset=2 to continue."


def _follow_pages(page: str) -> tuple[str, dict[str, int] | None]:
    """A page's content and the arguments its notice says to continue with."""
    match = re.search(r"\n\n\[(?:Showing [^\]]*?\. )?Use (?:read with )?offset=(\d+)(?:, cursor=(\d+))?[^\]]*\]$", page)
    if match is None:
        return page, None
    following = {"offset": int(match.group(1))}
    if match.group(2):
        following["cursor"] = int(match.group(2))
    return page[: match.start()], following


LINE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\0"), min_size=1, max_size=3000
)


@settings(max_examples=40, deadline=None)
@given(st.lists(LINE, min_size=1, max_size=60), st.booleans())
async def test_following_the_notices_reads_the_whole_file(lines: list[str], trailing: bool) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        text = "\n".join(lines) + ("\n" if trailing else "")
        (root / "f.txt").write_text(text, encoding="utf-8")
        limits = {"read_max_bytes": 2048, "read_max_lines": 7}
        arguments: dict[str, Any] = {"path": "f.txt"}
        pieces: list[str] = []
        for _ in range(10_000):
            page = await call("read", arguments, root, limits=limits)
            assert len(page.encode()) <= 2048
            content, following = _follow_pages(page)
            pieces.append(content)
            if following is None:
                break
            pieces.append("" if "cursor" in following else "\n")
            arguments = {"path": "f.txt", **following}
        assert "".join(pieces) == text


@pytest.mark.parametrize(
    ("content", "arguments", "expected"),
    [
        (b"", {}, "File is empty (0 bytes)."),
        (b"\xef\xbb\xbf", {}, "File contains no readable text (3 bytes)."),
        (b"\n\n\n", {}, "File contains 3 blank lines."),
        (b"a\nb\n", {"offset": 3}, "Offset 3 is beyond end of file (2 lines total). Retry with offset <= 2."),
        (b"a\nb\n", {"offset": 2, "cursor": 1}, "Cursor 1 is at or beyond the end of line 2 (1 characters)."),
    ],
)
async def test_read_answers_openclaws_special_cases(
    workspace: Path, content: bytes, arguments: dict[str, Any], expected: str
) -> None:
    (workspace / "special").write_bytes(content)
    assert await call("read", {"path": "special", **arguments}, workspace) == expected


async def test_read_marks_invalid_utf8_and_refuses_binary(workspace: Path) -> None:
    (workspace / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert await call("read", {"path": "latin1.txt"}, workspace) == (
        "[latin1.txt is not valid UTF-8; invalid bytes are shown as \ufffd.]\ncaf\ufffd\n"
    )
    (workspace / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    assert await refused("read", {"path": "blob.bin"}, workspace) == (
        "Read only supports text files; blob.bin looks binary (it holds NUL bytes)."
    )


async def test_read_errors_use_openclaws_words(workspace: Path) -> None:
    (workspace / "sub").mkdir()
    assert await refused("read", {"path": "missing.txt"}, workspace) == f"File not found: {workspace}/missing.txt."
    assert await refused("read", {"path": "notes.txt/x"}, workspace) == f"File not found: {workspace}/notes.txt/x."
    assert await call("read", {"path": "missing.txt", "optional": True}, workspace) == (
        "Optional file not found: missing.txt."
    )
    assert await refused("read", {"path": "sub"}, workspace) == (
        "Read requires a file path, but sub is a directory. List the directory, then read a specific file."
    )


async def test_read_refuses_a_file_over_its_bound(workspace: Path) -> None:
    (workspace / "big.log").write_text("x" * 2000)
    message = await refused("read", {"path": "big.log"}, workspace, limits={"read_max_file_bytes": 1000})
    assert message.startswith("big.log is 2000 bytes; read takes files of at most 1000 bytes")


# --- write ------------------------------------------------------------------------------------------------------


async def test_write_creates_parents_and_reports_like_openclaw(workspace: Path) -> None:
    assert await call("write", {"path": "a/b/c.txt", "content": "héllo"}, workspace) == (
        "Successfully wrote 6 bytes to a/b/c.txt"
    )
    assert (workspace / "a" / "b" / "c.txt").read_text() == "héllo"
    assert await call("write", {"path": "a/b/c.txt", "content": "héllo"}, workspace) == (
        "No changes made to a/b/c.txt. The file already has identical content."
    )
    assert (
        await call("write", {"path": "a/b/c.txt", "content": ""}, workspace)
        == "Successfully wrote 0 bytes to a/b/c.txt"
    )
    assert (workspace / "a" / "b" / "c.txt").read_text() == ""


async def test_write_refuses_content_over_its_bound(workspace: Path) -> None:
    message = await refused("write", {"path": "big.txt", "content": "x" * (1024 * 1024 + 1)}, workspace)
    assert message == "write: the content would be 1048577 bytes; files here are at most 1048576 bytes"
    assert not (workspace / "big.txt").exists()
    assert await call("write", {"path": "max.txt", "content": "x" * 1024 * 1024}, workspace) == (
        "Successfully wrote 1048576 bytes to max.txt"
    )


async def test_write_refuses_a_directory(workspace: Path) -> None:
    (workspace / "sub").mkdir()
    assert await refused("write", {"path": "sub", "content": "x"}, workspace) == "sub is a directory"


# --- edit -------------------------------------------------------------------------------------------------------


async def test_edit_replaces_each_unique_text(workspace: Path) -> None:
    edits = [{"oldText": "alpha", "newText": "ALPHA"}, {"oldText": "gamma\n", "newText": "GAMMA\nDELTA\n"}]
    assert await call("edit", {"path": "notes.txt", "edits": edits}, workspace) == (
        "Successfully replaced 2 block(s) in notes.txt."
    )
    assert (workspace / "notes.txt").read_text() == "ALPHA\nbeta\nGAMMA\nDELTA\n"


async def test_edit_takes_a_top_level_pair_too(workspace: Path) -> None:
    arguments = {"path": "notes.txt", "oldText": "beta", "newText": "BETA"}
    assert await call("edit", arguments, workspace) == "Successfully replaced 1 block(s) in notes.txt."
    assert (workspace / "notes.txt").read_text() == "alpha\nBETA\ngamma\n"


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        (
            [{"oldText": "delta", "newText": "x"}],
            "Could not find the exact text in notes.txt. The old text must match exactly",
        ),
        ([{"oldText": "a", "newText": "x"}], "Found 5 occurrences of the text in notes.txt. The text must be unique."),
        ([{"oldText": "", "newText": "x"}], "oldText must not be empty in notes.txt."),
        (
            [{"oldText": "beta", "newText": "x"}, {"oldText": "a\nb", "newText": "y"}],
            "edits[1] and edits[0] overlap in notes.txt. Merge them into one edit or target disjoint regions.",
        ),
        (
            [{"oldText": "beta", "newText": "x"}, {"oldText": "zzz", "newText": "y"}],
            "Could not find edits[1] in notes.txt.",
        ),
        ([{"oldText": "beta", "newText": "x"}, {"oldText": "", "newText": "y"}], "edits[1].oldText must not be empty"),
    ],
)
async def test_edit_refuses_what_is_not_exactly_once(
    workspace: Path, edits: list[dict[str, str]], expected: str
) -> None:
    message = await refused("edit", {"path": "notes.txt", "edits": edits}, workspace)
    assert message.startswith(expected), message
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"


async def test_an_edit_that_changes_nothing_says_so(workspace: Path) -> None:
    arguments = {"path": "notes.txt", "edits": [{"oldText": "beta", "newText": "beta"}]}
    assert await call("edit", arguments, workspace) == (
        "No changes made to notes.txt. The replacement text is identical to the original."
    )


async def test_edit_keeps_crlf_line_endings_and_a_bom(workspace: Path) -> None:
    (workspace / "dos.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\nthree\r\n")
    arguments = {"path": "dos.txt", "edits": [{"oldText": "one\ntwo", "newText": "1\n2\n2.5"}]}
    assert await call("edit", arguments, workspace) == "Successfully replaced 1 block(s) in dos.txt."
    assert (workspace / "dos.txt").read_bytes() == b"\xef\xbb\xbf1\r\n2\r\n2.5\r\nthree\r\n"


async def test_edit_errors_use_openclaws_words(workspace: Path) -> None:
    arguments: dict[str, Any] = {"path": "missing.txt", "edits": [{"oldText": "a", "newText": "b"}]}
    assert await refused("edit", arguments, workspace) == "Could not edit file: missing.txt. Error code: ENOENT."
    (workspace / "latin1.txt").write_bytes(b"caf\xe9\n")
    arguments["path"] = "latin1.txt"
    assert await refused("edit", arguments, workspace) == "Could not edit file: latin1.txt. It is not valid UTF-8 text."
    assert (workspace / "latin1.txt").read_bytes() == b"caf\xe9\n"


async def test_edit_respects_the_size_bound(workspace: Path) -> None:
    (workspace / "big.txt").write_text("x" * 100 + "marker")
    arguments = {"path": "big.txt", "edits": [{"oldText": "marker", "newText": "m"}]}
    message = await refused("edit", arguments, workspace, limits={"write_max_bytes": 50})
    assert message == "Could not edit file: big.txt. It is 106 bytes; edit takes files of at most 50 bytes."
    arguments = {"path": "notes.txt", "edits": [{"oldText": "beta", "newText": "b" * 100}]}
    message = await refused("edit", arguments, workspace, limits={"write_max_bytes": 50})
    assert message.startswith("edit: the content would be 113 bytes")
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"


# --- blind ------------------------------------------------------------------------------------------------------


async def test_a_blind_invocation_never_sees_the_workspace_path(workspace: Path) -> None:
    message = await refused("read", {"path": "missing.txt"}, workspace, blind=True)
    assert message == f"File not found: {WORKSPACE_MARK}/missing.txt."
    message = await refused("read", {"path": "../outside/secret"}, workspace, blind=True)
    assert message == f"Path escapes workspace root ({WORKSPACE_MARK}): ../outside/secret"
    assert str(workspace) not in message
    written = await call(
        "write", {"path": f"{WORKSPACE_MARK}/blind.txt", "content": f"at {workspace}"}, workspace, blind=True
    )
    assert written == f"Successfully wrote {len(f'at {workspace}'.encode())} bytes to {WORKSPACE_MARK}/blind.txt"
    assert await call("read", {"path": "blind.txt"}, workspace, blind=True) == f"at {WORKSPACE_MARK}"
    assert await call("read", {"path": "blind.txt"}, workspace) == f"at {workspace}"


async def test_the_mark_is_only_a_path_for_a_blind_invocation(workspace: Path) -> None:
    message = await refused("read", {"path": f"{WORKSPACE_MARK}/notes.txt"}, workspace)
    assert message == f"File not found: {workspace}/{WORKSPACE_MARK}/notes.txt."
