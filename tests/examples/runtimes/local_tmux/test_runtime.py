"""The ``local-tmux`` example runtime against a stub ``tmux`` placed first on ``PATH``, and against a real tmux.

The stub is a small script whose behaviour the test controls through files in ``TMUX_STUB_DIR``: a file
``sessions/<name>`` is a live tmux session whose pane is alive (content ``0``) or dead (``1``); no ``sessions``
directory means no tmux server; ``broken`` makes every call fail as an unreachable server would; ``hang`` makes
every call hang. Each call is appended to ``calls.jsonl``, and the stub refuses a target that is not exact (``=``).

The real-tmux tests run their own tmux server (a private ``TMUX_TMPDIR``) and kill it afterwards; they are skipped,
saying why, where tmux is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.examples.runtimes.loading import RUNTIMES, Detach, Options, RecordingRegistry, Ref, load_example

runtime = load_example("local_tmux")

STUB = f"""#!{sys.executable}
import json, os, pathlib, sys, time
state = pathlib.Path(os.environ["TMUX_STUB_DIR"])
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if (state / "hang").exists():
    (state / "hung.pid").write_text(str(os.getpid()))
    time.sleep(600)
if (state / "broken").exists():
    print("error connecting to /tmp/tmux-0/default (Permission denied)", file=sys.stderr)
    sys.exit(1)
command, args = sys.argv[1], sys.argv[2:]
target = args[args.index("-t") + 1]
if not target.startswith("="):
    print("stub: targets must be exact", file=sys.stderr)
    sys.exit(2)
sessions = state / "sessions"
if not sessions.is_dir():
    print("no server running on /tmp/tmux-0/default", file=sys.stderr)
    sys.exit(1)
session = sessions / target[1:].removesuffix(":")
if command == "display-message" and not session.exists():
    print("")  # as tmux does: an unresolvable target still exits 0
    sys.exit(0)
if not session.exists():
    print("can't find session: " + session.name, file=sys.stderr)
    sys.exit(1)
if command == "has-session":
    sys.exit(0)
if command == "display-message":
    print(session.read_text().strip())
    sys.exit(0)
if command == "kill-session":
    session.unlink()
    sys.exit(0)
sys.exit(3)
"""

T0 = 1_790_000_000_000  # epoch ms
ISO_T0 = "2026-09-21T14:13:20Z"  # the same instant


@dataclass
class Host:
    """The stub tmux and the transcript root of one test."""

    state: Path
    root: Path

    def start(self, name: str, *, pane_dead: bool = False, own: bool = True) -> None:
        """A tmux session; ``own``: the host also gives it its directory under the root, making it the runtime's."""
        (self.state / "sessions").mkdir(exist_ok=True)
        (self.state / "sessions" / name).write_text("1" if pane_dead else "0")
        if own:
            (self.root / name).mkdir(exist_ok=True)

    def end(self, name: str) -> None:
        (self.state / "sessions" / name).unlink()

    def alive(self, name: str) -> bool:
        return (self.state / "sessions" / name).exists()

    def transcript(self, name: str, *entries: Any) -> Path:
        directory = self.root / name
        directory.mkdir(exist_ok=True)
        path = directory / "transcript.jsonl"
        lines = [e if isinstance(e, str) else json.dumps(e) for e in entries]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def calls(self) -> list[list[str]]:
        log = self.state / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    bin_dir, state, root = tmp_path / "bin", tmp_path / "stub", tmp_path / "sessions"
    for directory in (bin_dir, state, root):
        directory.mkdir()
    stub = bin_dir / "tmux"
    stub.write_text(STUB)
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("TMUX_STUB_DIR", str(state))
    yield Host(state, root)
    pid_file = state / "hung.pid"
    if pid_file.exists():  # a hanging stub that a test failed to abort must not outlive it
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 9)


def registered(host: Host) -> Any:
    registry = RecordingRegistry()
    runtime.register_agent_session_runtimes(registry, {"LOCAL_TMUX_RUNTIME_ROOT": str(host.root)})
    return registry.only()


async def inspect(host: Host, session_id: str) -> Any:
    return await registered(host).inspect(Ref(session_id, runtime="local-tmux"), Options(asyncio.Event()))


async def detach(host: Host, session_id: str, *, stop_runtime: bool = True) -> Any:
    request = Detach("done with it", stop_runtime)
    return await registered(host).detach(Ref(session_id), request, Options(asyncio.Event()))


def user(ts: Any, text: str = "do the thing") -> dict[str, Any]:
    return {"ts": ts, "role": "user", "text": text}


def assistant(ts: Any, text: str) -> dict[str, Any]:
    return {"ts": ts, "role": "assistant", "text": text}


# --- registration ---------------------------------------------------------------------------------------------


def test_registers_inspect_and_detach_and_no_continue(host: Host) -> None:
    registration = registered(host)
    assert registration.id == "local-tmux"
    assert registration.provider == "local-agent"
    assert callable(registration.inspect)
    assert callable(registration.detach)
    assert registration.continue_ is None  # no follow-up turns: the seam answers unsupported_operation


def test_the_provider_can_be_named(host: Host) -> None:
    registry = RecordingRegistry()
    environ = {"LOCAL_TMUX_RUNTIME_ROOT": str(host.root), "LOCAL_TMUX_RUNTIME_PROVIDER": "some-agent"}
    runtime.register_agent_session_runtimes(registry, environ)
    assert registry.only().provider == "some-agent"


@pytest.mark.parametrize("root", [None, "", "  ", "relative/dir"])
def test_registration_needs_an_absolute_root(root: str | None, caplog: pytest.LogCaptureFixture) -> None:
    registry = RecordingRegistry()
    environ = {} if root is None else {"LOCAL_TMUX_RUNTIME_ROOT": root}
    with caplog.at_level(logging.ERROR), pytest.raises(runtime.LocalTmuxError) as caught:
        runtime.register_agent_session_runtimes(registry, environ)
    assert caught.value.code == "not_configured"
    assert registry.calls == []
    [record] = caplog.records
    assert record.getMessage().startswith("local-tmux is not registered: LOCAL_TMUX_RUNTIME_ROOT")


def test_the_root_defaults_to_the_process_environment(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_TMUX_RUNTIME_ROOT", str(host.root))
    registry = RecordingRegistry()
    runtime.register_agent_session_runtimes(registry)
    assert registry.only().id == "local-tmux"


# --- inspect ----------------------------------------------------------------------------------------------------


async def test_no_tmux_session_and_no_directory_is_no_such_session(host: Host) -> None:
    assert await inspect(host, "s1") is None  # no tmux server at all
    host.start("other")
    assert await inspect(host, "s1") is None  # a server, but not this session
    assert host.calls() == []  # without its directory, tmux is never asked


async def test_a_session_name_is_matched_exactly_never_as_a_prefix(host: Host) -> None:
    (host.root / "s1").mkdir()
    host.start("s1-longer")
    observation = await inspect(host, "s1")
    assert observation["state"] == "dead"
    assert observation["metadata"]["pane"] == "gone"  # s1-longer was not taken for s1
    assert host.calls()
    assert all(call[call.index("-t") + 1].startswith("=") for call in host.calls())


# --- which sessions are this runtime's --------------------------------------------------------------------------


async def test_a_tmux_session_without_its_directory_is_refused_and_never_touched(host: Host) -> None:
    host.start("theirs", own=False)  # a tmux session on this host that the host never gave a directory
    assert await inspect(host, "theirs") is None
    assert await detach(host, "theirs", stop_runtime=True) is None
    assert host.alive("theirs")
    assert host.calls() == []
    # The positive control: a session the host started, with its directory, is read and stopped.
    host.start("mine")
    assert (await inspect(host, "mine"))["state"] == "running"
    assert (await detach(host, "mine", stop_runtime=True))["state"] == "dead"
    assert not host.alive("mine")
    assert host.alive("theirs")
    assert all(call[call.index("-t") + 1] in ("=mine", "=mine:") for call in host.calls())


async def test_a_symlinked_session_directory_is_refused_and_its_session_never_touched(
    host: Host, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "transcript.jsonl").write_text(json.dumps(assistant(T0, "from elsewhere")) + "\n")
    host.start("linked", own=False)
    (host.root / "linked").symlink_to(elsewhere)
    assert await inspect(host, "linked") is None
    assert await detach(host, "linked", stop_runtime=True) is None
    assert host.alive("linked")
    assert host.calls() == []
    # The positive control: the same layout as a real directory is the runtime's.
    host.start("real")
    (host.root / "real" / "transcript.jsonl").write_text(json.dumps(assistant(T0, "mine")) + "\n")
    assert (await inspect(host, "real"))["latestResponse"] == "mine"


async def test_a_directory_under_the_root_is_the_only_way_in(host: Host, tmp_path: Path) -> None:
    (host.root / "file").write_text("not a directory")
    host.start("file", own=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    host.start("outside", own=False)
    for session_id in ("file", "outside", "no-such"):
        assert await inspect(host, session_id) is None, session_id
        assert await detach(host, session_id) is None, session_id
    assert host.alive("file")
    assert host.alive("outside")
    assert host.calls() == []


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../s1", "a\0b", "/etc"], ids=repr)
def test_a_name_that_is_not_one_entry_of_the_root_is_never_opened(host: Host, name: str) -> None:
    (host.root / "s1").mkdir()
    instance = runtime.LocalTmuxRuntime(host.root / "s1")
    assert not instance.owns(name)
    assert instance.read_transcript(name) is None


async def test_running_while_the_pane_is_alive_even_with_an_answer_in_the_transcript(host: Host) -> None:
    host.start("s1")
    host.transcript("s1", user(T0), assistant(T0 + 1000, "partial answer"))
    observation = await inspect(host, "s1")
    assert observation["state"] == "running"
    assert observation["alive"] is True
    assert observation["terminated"] is False
    assert "finalResponse" not in observation
    assert observation["latestResponse"] == "partial answer"
    assert observation["lastEventAt"] == T0 + 1000
    assert observation["metadata"]["pane"] == "alive"


async def test_running_without_a_transcript_file(host: Host) -> None:
    host.start("s1")
    observation = await inspect(host, "s1")
    assert observation["state"] == "running"
    assert observation["metadata"]["transcript"] == "missing"
    assert "lastEventAt" not in observation


async def test_completed_with_the_last_answer_only_after_the_session_ended(host: Host) -> None:
    host.start("s1")
    host.transcript("s1", user(T0), assistant(T0 + 1000, "first"), user(T0 + 2000), assistant(ISO_T0, "the answer"))
    assert (await inspect(host, "s1"))["state"] == "running"
    host.end("s1")
    observation = await inspect(host, "s1")
    assert observation["state"] == "completed"
    assert observation["alive"] is False
    assert observation["terminated"] is True
    assert observation["finalResponse"] == "the answer"
    assert observation["lastEventAt"] == T0 + 2000
    assert observation["metadata"] == {
        "pane": "gone",
        "transcript": "present",
        "transcriptEntries": "4",
        "skippedEntries": "0",
    }
    assert all(isinstance(value, str) for value in observation["metadata"].values())


async def test_completed_when_the_pane_is_dead_but_the_session_is_kept(host: Host) -> None:
    host.start("s1", pane_dead=True)  # tmux's remain-on-exit
    host.transcript("s1", user(T0), assistant(T0 + 5, "kept"))
    observation = await inspect(host, "s1")
    assert observation["state"] == "completed"
    assert observation["finalResponse"] == "kept"
    assert observation["metadata"]["pane"] == "dead"


@pytest.mark.parametrize(
    "undatable",
    [
        assistant(None, "newest"),
        assistant("yesterday", "newest"),
        assistant("2026-09-21T14:13:20", "newest"),  # no zone
        assistant(True, "newest"),
        assistant(-5, "newest"),
        {"role": "assistant", "text": "newest"},
        '{"ts": NaN, "role": "assistant", "text": "newest"}',
        '{"ts": 1790000000000, "role": "assistant", "text": ',
        "not json at all",
        json.dumps(["a", "list"]),
        {"ts": T0 + 9, "role": "assistant", "text": 42},
        {"ts": T0 + 9, "role": None, "text": "newest"},
    ],
    ids=repr,
)
async def test_an_entry_it_cannot_date_or_read_is_skipped(host: Host, undatable: Any) -> None:
    host.transcript("s1", user(T0), assistant(T0 + 1, "dated"), undatable)
    observation = await inspect(host, "s1")  # no session: the pane has ended
    assert observation["state"] == "completed"
    assert observation["finalResponse"] == "dated"
    assert observation["metadata"]["skippedEntries"] == "1"


async def test_dead_when_the_pane_ended_without_a_datable_answer(host: Host) -> None:
    host.transcript("s1", user(T0), assistant(None, "undatable"))
    observation = await inspect(host, "s1")
    assert observation["state"] == "dead"
    assert observation["terminated"] is True
    assert "finalResponse" not in observation
    assert "latestResponse" not in observation


async def test_dead_when_the_pane_ended_and_the_directory_has_no_transcript(host: Host) -> None:
    (host.root / "s1").mkdir()
    observation = await inspect(host, "s1")
    assert observation["state"] == "dead"
    assert observation["metadata"]["transcriptEntries"] == "0"


async def test_a_symlinked_session_directory_or_transcript_is_not_followed(host: Host, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "transcript.jsonl").write_text(json.dumps(assistant(T0, "from elsewhere")) + "\n")
    (host.root / "s1").symlink_to(elsewhere)
    assert await inspect(host, "s1") is None
    (host.root / "s2").mkdir()
    (host.root / "s2" / "transcript.jsonl").symlink_to(elsewhere / "transcript.jsonl")
    observation = await inspect(host, "s2")
    assert observation["state"] == "dead"
    assert "finalResponse" not in observation


async def test_only_the_tail_of_a_long_transcript_is_read(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "MAX_TRANSCRIPT_TAIL_BYTES", 200)
    filler = [user(T0 + i, "x" * 50) for i in range(20)]
    host.transcript("s1", *filler, assistant(T0 + 100, "at the end"))
    observation = await inspect(host, "s1")
    assert observation["finalResponse"] == "at the end"
    assert observation["metadata"]["skippedEntries"] == "0"  # the partial first line of the tail is not an entry


BAD_SESSION_IDS = ["../../etc/passwd", "a/b", "..", ".", "", "-t", ".hidden", "a.b", "a:b", "a b", "x" * 129, "é"]


@pytest.mark.parametrize("session_id", BAD_SESSION_IDS, ids=repr)
async def test_a_session_id_that_is_not_a_plain_segment_is_refused_before_any_use(host: Host, session_id: str) -> None:
    with pytest.raises(runtime.LocalTmuxError) as caught:
        await inspect(host, session_id)
    assert caught.value.code == "invalid_session_id"
    with pytest.raises(runtime.LocalTmuxError):
        await detach(host, session_id)
    assert host.calls() == []  # never reached tmux


@given(st.text(max_size=140))
def test_check_session_id_accepts_only_plain_segments(value: str) -> None:
    try:
        runtime.check_session_id(value)
    except runtime.LocalTmuxError:
        return
    assert "/" not in value
    assert value not in (".", "..")
    assert not value.startswith(("-", "."))
    assert ":" not in value
    assert "." not in value


async def test_a_tmux_that_cannot_be_reached_is_an_error_not_a_state(host: Host) -> None:
    host.start("s1")
    host.transcript("s1", assistant(T0, "answer"))
    (host.state / "broken").touch()
    with pytest.raises(runtime.LocalTmuxError) as caught:
        await inspect(host, "s1")
    assert caught.value.code == "tmux_failed"


async def test_a_missing_tmux_is_an_error_not_a_state(host: Host) -> None:
    (host.root / "s1").mkdir()
    instance = runtime.LocalTmuxRuntime(host.root, tmux=str(host.state / "no-such-tmux"))
    with pytest.raises(runtime.LocalTmuxError) as caught:
        await instance.inspect(Ref("s1"), Options(asyncio.Event()))
    assert caught.value.code == "tmux_unavailable"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


async def test_the_signal_aborts_a_hanging_tmux_and_kills_it(host: Host) -> None:
    (host.root / "s1").mkdir()
    (host.state / "hang").touch()
    signal = asyncio.Event()
    call = asyncio.create_task(registered(host).inspect(Ref("s1"), Options(signal)))
    deadline = time.monotonic() + 10
    while not (host.state / "hung.pid").exists():
        assert time.monotonic() < deadline, "the stub never started"
        await asyncio.sleep(0.01)
    assert not call.done()
    signal.set()
    with pytest.raises(runtime.LocalTmuxError) as caught:
        await asyncio.wait_for(call, 10)
    assert caught.value.code == "aborted"
    pid = int((host.state / "hung.pid").read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid):
        assert time.monotonic() < deadline, "the hanging tmux was left running"
        await asyncio.sleep(0.01)


# --- detach -----------------------------------------------------------------------------------------------------


async def test_detach_kills_a_live_session_and_reports_it_dead(host: Host) -> None:
    host.start("s1")
    host.transcript("s1", user(T0), assistant(T0 + 1, "an earlier turn's answer"))
    observation = await detach(host, "s1")
    assert not host.alive("s1")
    assert ["kill-session", "-t", "=s1"] in host.calls()
    assert observation["state"] == "dead"  # killed mid-turn: the transcript's answer is not this turn's
    assert observation["terminated"] is True
    assert "finalResponse" not in observation
    assert observation["metadata"]["pane"] == "killed"
    assert (await inspect(host, "s1"))["state"] == "completed"  # afterwards the ended pane's transcript reads


async def test_detach_of_a_dead_pane_cleans_up_and_keeps_its_answer(host: Host) -> None:
    host.start("s1", pane_dead=True)
    host.transcript("s1", assistant(T0, "done"))
    observation = await detach(host, "s1")
    assert not host.alive("s1")
    assert observation["state"] == "completed"
    assert observation["finalResponse"] == "done"


async def test_detach_without_stop_runtime_stops_nothing(host: Host) -> None:
    host.start("s1")
    observation = await detach(host, "s1", stop_runtime=False)
    assert host.alive("s1")
    assert observation["state"] == "running"
    assert not any(call[0] == "kill-session" for call in host.calls())


async def test_detach_of_an_unknown_session_is_no_such_session(host: Host) -> None:
    assert await detach(host, "s1") is None
    assert host.calls() == []


# --- parsing ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (T0, T0),
        (T0 / 1000, T0),
        (1_790_000_000, T0),
        (ISO_T0, T0),
        ("2026-09-21T16:13:20+02:00", T0),
        ("2026-09-21T14:13:20.250Z", T0 + 250),
        (0, None),
        (float("inf"), None),
        (True, None),
        ("2026-09-21T14:13:20", None),
        ("", None),
        ([T0], None),
        (None, None),
    ],
    ids=repr,
)
def test_parse_timestamp(value: Any, expected: int | None) -> None:
    assert runtime.parse_timestamp(value) == expected


@given(st.binary(max_size=2000), st.booleans())
def test_parse_transcript_never_raises_and_keeps_only_datable_entries(data: bytes, truncated: bool) -> None:
    transcript = runtime.parse_transcript(data, truncated=truncated)
    for entry in transcript.entries:
        assert isinstance(entry.at_ms, int)
        assert isinstance(entry.role, str)
        assert isinstance(entry.text, str)


def test_the_readme_names_what_the_module_does() -> None:
    readme = (RUNTIMES / "local_tmux" / "README.md").read_text()
    for needle in ("LOCAL_TMUX_RUNTIME_ROOT", "CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES", "stopRuntime", "local-tmux"):
        assert needle in readme


# --- with the seam's real registry -----------------------------------------------------------------------------


async def test_loaded_by_the_seam_as_a_host_module(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_session = pytest.importorskip("clawstack.connect.agent_session.loader", reason="the seam's core is absent")
    from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry
    from clawstack.connect.agent_session.types import AgentSessionRef, CallOptions, DetachRequest

    monkeypatch.setenv("LOCAL_TMUX_RUNTIME_ROOT", str(host.root))
    registry = AgentSessionRuntimeRegistry()
    [report] = agent_session.load_runtime_modules(registry, str(RUNTIMES / "local_tmux" / "runtime.py"))
    assert report.ok, report
    assert registry.ids() == ("local-tmux",)
    assert registry.capabilities("local-tmux") == {"inspect", "detach"}
    entry = registry.get("local-tmux")
    assert entry is not None
    host.start("s1")
    host.transcript("s1", assistant(T0, "answer"))
    ref = AgentSessionRef(runtime="local-tmux", session_id="s1")
    options = CallOptions(signal=asyncio.Event(), deadline_ms=60_000)
    assert (await entry.inspect(ref, options))["state"] == "running"
    assert entry.detach is not None
    dead = await entry.detach(ref, DetachRequest(reason="done", stop_runtime=True), options)
    assert dead is not None
    assert dead["state"] == "dead"
    assert (await entry.inspect(ref, options))["finalResponse"] == "answer"


# --- against a real tmux ----------------------------------------------------------------------------------------


@dataclass
class RealTmux:
    """A tmux server of the test's own (its sockets under a private ``TMUX_TMPDIR``) and the runtime's root."""

    tmux: str
    root: Path

    def start(self, name: str) -> None:
        subprocess.run([self.tmux, "new-session", "-d", "-s", name, "sleep 600"], check=True, capture_output=True)

    def alive(self, name: str) -> bool:
        return subprocess.run([self.tmux, "has-session", "-t", f"={name}"], capture_output=True).returncode == 0

    def runtime(self) -> Any:
        return runtime.LocalTmuxRuntime(self.root, tmux=self.tmux)


@pytest.fixture
def real_tmux(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RealTmux]:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed here (apt-get install -y tmux); the stub tests cover the same rules")
    monkeypatch.delenv("TMUX", raising=False)  # inside tmux, a client would talk to the enclosing server
    monkeypatch.setenv("TMUX_TMPDIR", str(short_dir))
    root = short_dir / "root"
    root.mkdir()
    try:
        yield RealTmux(tmux, root)
    finally:
        subprocess.run([tmux, "kill-server"], capture_output=True)


async def test_real_tmux_a_session_outside_the_root_is_never_killed(real_tmux: RealTmux, short_dir: Path) -> None:
    instance = real_tmux.runtime()
    stop = Detach("no longer needed", True)
    real_tmux.start("theirs")  # on this host, but the host never gave it a directory under the root
    real_tmux.start("linked")  # its directory under the root is a symbolic link to one outside it
    (short_dir / "outside").mkdir()
    (real_tmux.root / "linked").symlink_to(short_dir / "outside")
    real_tmux.start("mine-too")  # a name that "mine" is a prefix of
    real_tmux.start("mine")  # the positive control: started by the host, with its directory
    (real_tmux.root / "mine").mkdir()

    for session_id in ("theirs", "linked"):
        assert await instance.inspect(Ref(session_id), Options(asyncio.Event())) is None, session_id
        assert await instance.detach(Ref(session_id), stop, Options(asyncio.Event())) is None, session_id
        assert real_tmux.alive(session_id), f"{session_id} was killed"

    assert (await instance.inspect(Ref("mine"), Options(asyncio.Event())))["state"] == "running"
    stopped = await instance.detach(Ref("mine"), stop, Options(asyncio.Event()))
    assert stopped["state"] == "dead"
    assert stopped["metadata"]["pane"] == "killed"
    assert not real_tmux.alive("mine")
    assert real_tmux.alive("mine-too")
    assert real_tmux.alive("theirs")
    assert real_tmux.alive("linked")
    after = await instance.inspect(Ref("mine"), Options(asyncio.Event()))
    assert after["state"] == "dead"
    assert after["metadata"]["pane"] == "gone"
