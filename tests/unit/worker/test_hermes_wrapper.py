"""The task-home wrapper (``python -m clawstack.worker.hermes``) end to end, against a scripted stand-in for Hermes.

The stand-in is a site directory holding ``hermes_cli/main.py``. Its ``main()`` reads a plan from the task (a JSON
object; any other task gets one ordinary turn), records what it was started with in ``runs.jsonl`` next to the
package (outside the home), and then does what the plan says to the session store, the home and its exit code, so
each test can make it misbehave in one exact way and check what the wrapper reports.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socketserver
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clawstack.worker.contract import extract_answer
from clawstack.worker.hermes import TASK_HOME_NOTE, TOOLSETS
from clawstack.worker.home_contract import HomeFailure, HomeResult, parse_failure, parse_result

SECRET = "s3cr3t-value-QX7"
CREDENTIAL = f"run-tok:{SECRET}"
CONTRACT = "You are the home worker. CONTRACT-MARK-41"
FAKE_STDOUT = "FAKE-STDOUT-MARK-9d2"
FAKE_STDERR = "FAKE-STDERR-MARK-7c1"
TIMEOUT_S = 30

S1 = "20250101_120000_aaaaaa"
S2 = "20250101_120500_bbbbbb"
S3 = "20250101_121000_cccccc"
OLD = "20241231_090000_dddddd"

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, source TEXT, parent_session_id TEXT, started_at REAL, ended_at REAL, end_reason TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT, content TEXT, tool_calls TEXT,
    timestamp REAL, active INTEGER DEFAULT 1
);
"""

FAKE_MAIN = r"""
import json, os, secrets, shutil, sqlite3, sys, time, urllib.request
from pathlib import Path

SITE = Path(__file__).resolve().parent.parent
SCHEMA = @SCHEMA@


def _record(hermes_home, home):
    def text(name):
        path = hermes_home / name
        return path.read_text() if path.is_file() else None

    links = {p.name: os.readlink(p) for p in hermes_home.iterdir() if p.is_symlink()}
    mask = os.umask(0)
    os.umask(mask)
    record = {
        "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": mask,
        "config": text("config.yaml"), "soul": text("SOUL.md"), "update_check": text(".update_check"),
        "links": links, "hermes_home": str(hermes_home),
        "question_present": os.path.lexists(home / ".claw-run" / "question.md"),
    }
    with open(SITE / "runs.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")


class Store:
    def __init__(self, path, wal):
        self.db = sqlite3.connect(path, isolation_level=None)
        if wal:
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def session(self, sid, parent=None, end_reason=None, started_at=None):
        self.db.execute(
            "INSERT INTO sessions (id, source, parent_session_id, started_at, end_reason) VALUES (?, 'cli', ?, ?, ?)",
            (sid, parent, time.time() if started_at is None else started_at, end_reason),
        )

    def message(self, sid, role, content, active=1):
        self.db.execute(
            "INSERT INTO messages (session_id, role, content, timestamp, active) VALUES (?, ?, ?, ?, ?)",
            (sid, role, content, time.time(), active),
        )


def main():
    args = sys.argv[1:]
    task = args[args.index("-q") + 1]
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    hermes_home = Path(os.environ["HERMES_HOME"])
    home = Path(os.getcwd())
    _record(hermes_home, home)
    print(FAKE_STDOUT, flush=True)
    print(FAKE_STDERR, file=sys.stderr, flush=True)
    try:
        plan = json.loads(task)
    except ValueError:
        plan = {"ops": [{"op": "turn", "reply": "reply to: " + task}]}
    store = None

    def db():
        nonlocal store
        if store is None:
            store = Store(hermes_home / "state.db", plan.get("wal", False))
        return store

    def where(path):
        if path.startswith("hermes:"):
            return hermes_home / path[len("hermes:"):]
        return home / path

    for op in plan.get("ops", []):
        kind = op["op"]
        if kind == "turn":  # what real Hermes does: resume or start a session, store the exchange, name it
            sid = op.get("session") or resume
            if sid is None:
                sid = time.strftime("%Y%m%d_%H%M%S_") + secrets.token_hex(3)
                db().session(sid)
            db().message(sid, "user", task)
            for reply in op.get("replies", [op.get("reply")]):
                db().message(sid, "assistant", reply)
            if op.get("print", True):
                sys.stderr.write("\nsession_id: " + sid + "\n")
        elif kind == "session":
            db().session(op["id"], op.get("parent"), op.get("end_reason"), op.get("started_at"))
        elif kind == "message":
            db().message(op["session"], op["role"], op["content"], op.get("active", 1))
        elif kind == "end":
            db().db.execute("UPDATE sessions SET end_reason = ?, ended_at = ? WHERE id = ?",
                            (op["reason"], time.time(), op["id"]))
        elif kind == "delete_session":
            db().db.execute("DELETE FROM sessions WHERE id = ?", (op["id"],))
        elif kind == "print":
            sys.stderr.write(op["text"])
        elif kind == "file":
            path = where(op["path"])
            path.write_text(op["text"])
            if "mode" in op:
                os.chmod(path, op["mode"])
        elif kind == "mkdir":
            where(op["path"]).mkdir()
        elif kind == "symlink":
            os.symlink(op["target"], where(op["path"]))
        elif kind == "swap_for_symlink":
            shutil.rmtree(where(op["path"]))
            os.symlink(op["target"], where(op["path"]))
        elif kind == "dump_env":
            where(op["path"]).write_text(json.dumps(dict(os.environ)))
        elif kind == "require_absent":
            if os.path.lexists(where(op["path"])):
                return 99
        elif kind == "fetch":  # one model call to the configured base URL; its body becomes the reply
            model = json.loads((hermes_home / "config.yaml").read_text())["model"]
            request = urllib.request.Request(
                model["base_url"].rstrip("/") + "/chat/completions",
                data=json.dumps({"model": model["default"], "messages": [{"role": "user", "content": task}]}).encode(),
                headers={"Authorization": "Bearer " + model["api_key"], "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                db().message(op["session"], "assistant", response.read().decode())
        else:
            raise SystemExit("unknown op " + kind)
    if "kill" in plan:
        os.kill(os.getpid(), plan["kill"])
    if plan.get("hard_exit"):  # no clean close of the store, as a crash would leave it
        sys.stderr.flush()
        os._exit(plan.get("exit", 0))
    if store is not None:
        store.db.close()
    return plan.get("exit", 0)
""".replace("@SCHEMA@", repr(SCHEMA))
FAKE_MAIN = f"FAKE_STDOUT = {FAKE_STDOUT!r}\nFAKE_STDERR = {FAKE_STDERR!r}\n{FAKE_MAIN}"


# --- the harness -----------------------------------------------------------------------------------------------


@dataclass
class Run:
    code: int
    stdout: bytes
    stderr: bytes

    def result(self) -> tuple[HomeResult, str]:
        assert self.code == 0, (self.code, self.stdout, self.stderr)
        result = parse_result(self.stdout)
        assert result is not None, self.stdout
        found = extract_answer(self.stdout)
        assert found is not None
        return result, found[0].decode()

    def failure(self) -> HomeFailure:
        assert self.code != 0, self.stdout
        failure = parse_failure(self.stdout)
        assert failure is not None, (self.code, self.stdout, self.stderr)
        return failure


class Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.site = root / "site"
        self.config_file = root / "private" / "worker.json"
        self.home.mkdir(mode=0o700)
        (self.site / "hermes_cli").mkdir(parents=True)
        (self.site / "hermes_cli" / "__init__.py").write_text("")
        (self.site / "hermes_cli" / "main.py").write_text(FAKE_MAIN)
        self.config_file.parent.mkdir(mode=0o700)

    @property
    def db_path(self) -> Path:
        return self.home / ".hermes" / "state.db"

    def write_config(self, **changes: Any) -> None:
        config: dict[str, Any] = {
            "version": 1,
            "credential": CREDENTIAL,
            "model": "primary",
            "contract": CONTRACT,
            "model_base_url": "http://127.0.0.1:9/v1",
        }
        config |= changes
        config = {key: value for key, value in config.items() if value is not None}
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(config, file)

    def run(self, *args: str, config: bool = True, **config_changes: Any) -> Run:
        if config:
            self.write_config(**config_changes)
        env = {
            "PATH": os.environ["PATH"],
            "CLAW_WORKER_CONFIG_FILE": str(self.config_file),
            "CLAW_HOME": str(self.home),
            "CLAW_HERMES_SITE": str(self.site),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "clawstack.worker.hermes", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    def turn(self, plan: dict[str, Any] | str, **config_changes: Any) -> Run:
        task = plan if isinstance(plan, str) else json.dumps(plan)
        return self.run("--", task, **config_changes)

    def runs(self) -> list[dict[str, Any]]:
        log = self.site / "runs.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    def seed(
        self, sessions: list[tuple[str, str | None, str | None, float]], messages: list[tuple[str, str, str]]
    ) -> None:
        """Put sessions ``(id, parent, end_reason, started_at)`` and messages ``(session, role, content)`` in the
        home's store, as earlier turns would have."""
        self.db_path.parent.mkdir(mode=0o700, exist_ok=True)
        with sqlite3.connect(self.db_path) as db:
            db.executescript(SCHEMA)
            db.executemany(
                "INSERT INTO sessions (id, source, parent_session_id, end_reason, started_at) VALUES (?, 'cli', ?, ?, ?)",
                sessions,
            )
            db.executemany("INSERT INTO messages (session_id, role, content) VALUES (?, ?, ?)", messages)
        db.close()

    def save(self, session: str) -> None:
        (self.home / ".claw-run").mkdir(mode=0o700, exist_ok=True)
        (self.home / ".claw-run" / "session").write_text(session + "\n")

    def saved(self) -> str:
        return (self.home / ".claw-run" / "session").read_text().strip()


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def reply_in(session: str, content: str = "the reply") -> dict[str, Any]:
    return {"op": "message", "session": session, "role": "assistant", "content": content}


def resumed(h: Harness) -> None:
    """A home whose earlier turn left session S1 (with one exchange) saved."""
    h.seed([(S1, None, None, 1.0)], [(S1, "user", "first task"), (S1, "assistant", "first reply")])
    h.save(S1)


# --- the happy path --------------------------------------------------------------------------------------------


def test_first_run_answers_with_the_new_root_session_and_saves_it(h: Harness) -> None:
    plan = {"ops": [{"op": "turn", "replies": ["a draft", "the final answer", ""]}]}
    run = h.turn(plan)
    result, text = run.result()
    assert result.outcome == "answer"
    assert text == "the final answer"  # the last non-empty assistant message of the turn
    assert (
        run.stdout == f'claw-home-result {{"outcome": "answer", "session": "{result.session}"}}\n\n🦞 {text}\n'.encode()
    )
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]{6}", result.session)
    assert h.saved() == result.session
    assert mode(h.home / ".claw-run" / "session") == 0o600
    with sqlite3.connect(h.db_path) as db:
        assert db.execute("SELECT id FROM sessions").fetchall() == [(result.session,)]
    db.close()


def test_a_second_run_resumes_the_saved_session_and_answers_with_its_own_reply(h: Harness) -> None:
    first, first_text = h.turn("what is two and two").result()
    assert first_text == "reply to: what is two and two"
    second, second_text = h.turn("and three and three").result()
    assert second == HomeResult("answer", first.session)
    assert second_text == "reply to: and three and three"
    one, two = h.runs()
    assert "--resume" not in one["argv"]
    argv = two["argv"]
    assert argv[argv.index("--resume") + 1] == first.session
    assert argv[argv.index("-q") + 1] == "and three and three"
    assert argv[:3] == ["hermes", "chat", "-Q"]
    assert argv[argv.index("-t") + 1] == TOOLSETS == "terminal,file,memory,skills,todo"
    assert h.saved() == first.session


def test_hermes_runs_in_the_home_with_a_clean_environment_and_its_state_linked_there(h: Harness) -> None:
    plan = {"ops": [{"op": "turn", "reply": "ok"}, {"op": "file", "path": "hermes:memories/MEMORY.md", "text": "m"}]}
    h.turn(plan).result()
    (record,) = h.runs()
    allowed = {
        "PATH",
        "LANG",
        "HOME",
        "HERMES_HOME",
        "HERMES_WRITE_SAFE_ROOT",
        "PYTHONDONTWRITEBYTECODE",
        "LD_LIBRARY_PATH",
    }
    assert set(record["env"]) <= allowed
    assert Path(record["cwd"]) == h.home
    assert record["env"]["HERMES_WRITE_SAFE_ROOT"] == str(h.home)
    assert record["env"]["HERMES_HOME"] == record["hermes_home"]
    assert not Path(record["hermes_home"]).is_relative_to(h.home)
    assert not os.path.lexists(record["hermes_home"])  # the private directory goes with the turn
    assert record["links"] == {name: str(h.home / ".hermes" / name) for name in ("state.db", "memories", "skills")}
    assert (h.home / ".hermes" / "memories" / "MEMORY.md").read_text() == "m"
    assert record["umask"] == 0o077


# --- configuration and the credential --------------------------------------------------------------------------


def test_hermes_config_carries_the_credential_offline_settings_and_the_contract(h: Harness, short_dir: Path) -> None:
    h.turn("hello", model_base_url=None, model_unix_socket=str(short_dir / "proxy.sock")).result()
    (record,) = h.runs()
    config = json.loads(record["config"])  # JSON is YAML
    model = config["model"]
    assert model["api_key"] == CREDENTIAL
    assert model["default"] == "primary"
    assert model["provider"] == "custom"
    assert re.fullmatch(r"http://127\.0\.0\.1:[1-9][0-9]*/v1", model["base_url"])  # the forwarder
    assert model["context_length"] == 128_000
    assert config["security"]["allow_lazy_installs"] is False
    assert config["security"]["tirith_enabled"] is False
    assert config["approvals"]["mode"] == "off"
    assert config["agent"]["environment_probe"] is False
    assert json.loads(record["update_check"])["behind"] == 0
    assert record["soul"] == f"{CONTRACT}\n\n{TASK_HOME_NOTE}"
    assert "deliverables/" in TASK_HOME_NOTE
    assert ".claw-run/question.md" in TASK_HOME_NOTE


def test_a_tcp_proxy_is_given_to_hermes_as_it_is(h: Harness) -> None:
    h.turn("hello", model_base_url="http://10.0.0.7:8089/v1").result()
    (record,) = h.runs()
    assert json.loads(record["config"])["model"]["base_url"] == "http://10.0.0.7:8089/v1"


def test_the_credential_is_nowhere_in_the_home_nor_in_hermes_environment(h: Harness) -> None:
    plan = {"ops": [{"op": "turn", "reply": "done"}, {"op": "dump_env", "path": "env.json"}]}
    run = h.turn(plan)
    run.result()
    env = json.loads((h.home / "env.json").read_text())
    assert all(SECRET not in value for value in env.values())
    assert not {"CLAW_WORKER_CONFIG_FILE", "CLAW_HOME", "CLAW_HERMES_SITE"} & set(env)
    files = [path for path in h.home.rglob("*") if path.is_file() and not path.is_symlink()]
    assert h.home / ".hermes" / "state.db" in files
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET.encode() not in run.stdout + run.stderr


def test_the_config_file_is_taken_and_the_wrapper_needs_one(h: Harness) -> None:
    h.turn("hello").result()
    assert not h.config_file.exists()
    run = h.run("--", "hello", config=False)
    assert run.code == 78
    assert run.stdout == b""
    assert h.runs()[1:] == []  # Hermes was not started for the second run


# --- the forwarder ---------------------------------------------------------------------------------------------


class _ModelHandler(http.server.BaseHTTPRequestHandler):
    server: _UnixModel

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        reply = b"relayed over the unix socket \xf0\x9f\xa6\x9e"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _UnixModel(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, _ModelHandler)
        self.seen: list[tuple[str, str | None, Any]] = []


@pytest.fixture
def unix_model(short_dir: Path) -> Iterator[_UnixModel]:
    server = _UnixModel(str(short_dir / "model.sock"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_model_calls_are_relayed_to_the_unix_socket(h: Harness, unix_model: _UnixModel) -> None:
    plan = {"ops": [{"op": "session", "id": S1}, {"op": "fetch", "session": S1}]}
    result, text = h.turn(plan, model_base_url=None, model_unix_socket=unix_model.server_address).result()
    assert result == HomeResult("answer", S1)
    assert text == "relayed over the unix socket 🦞"
    ((path, authorization, body),) = unix_model.seen
    assert path == "/v1/chat/completions"
    assert authorization == f"Bearer {CREDENTIAL}"
    assert body["model"] == "primary"


# --- usage -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), ("--",), ("--", ""), ("--", "  \n\t "), ("--", "one", "two")])
def test_no_task_is_worker_usage(h: Harness, args: tuple[str, ...]) -> None:
    run = h.run(*args)
    assert run.code == 2
    assert run.stdout == b"claw-home-failure worker_usage\n"
    assert h.runs() == []
    assert not h.config_file.exists()  # the configuration is taken first, however the wrapper ends


def test_no_task_without_a_configuration_is_still_worker_usage(h: Harness) -> None:
    run = h.run("--", config=False)
    assert (run.code, run.stdout) == (2, b"claw-home-failure worker_usage\n")


# --- worker_runner_exit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("plan", "code"), [({"exit": 1}, 1), ({"exit": 130}, 130), ({"kill": signal.SIGKILL}, -9)])
def test_a_non_zero_exit_is_reported_with_its_code_even_after_a_stored_reply(
    h: Harness, plan: dict[str, Any], code: int
) -> None:
    run = h.turn({"ops": [{"op": "turn", "reply": "stored anyway"}], **plan})
    assert run.code == 3
    assert run.failure() == HomeFailure("worker_runner_exit", code)
    assert run.stdout == f"claw-home-failure worker_runner_exit {code}\n".encode()
    assert not (h.home / ".claw-run" / "session").exists()


# --- a lost session_id: line -----------------------------------------------------------------------------------


@pytest.mark.parametrize("wal", [False, True])
def test_exit_70_without_a_session_line_still_answers_a_stored_turn(h: Harness, wal: bool) -> None:
    plan = {"ops": [{"op": "turn", "reply": "kept", "print": False}], "exit": 70, "wal": wal, "hard_exit": wal}
    result, text = h.turn(plan).result()
    assert (result.outcome, text) == ("answer", "kept")
    assert (h.db_path.parent / "state.db-wal").exists() == wal  # a crash leaves the log for the reader
    assert h.saved() == result.session


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "turn", "reply": "kept"}],  # the line was not lost
        [{"op": "turn", "reply": None, "print": False}],  # nothing was stored
    ],
    ids=["with-session-line", "nothing-stored"],
)
def test_exit_70_otherwise_is_a_runner_exit(h: Harness, ops: list[dict[str, Any]]) -> None:
    assert h.turn({"ops": ops, "exit": 70}).failure() == HomeFailure("worker_runner_exit", 70)


# --- worker_turn_not_stored ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ops",
    [
        [],
        [{"op": "session", "id": S1}, {"op": "message", "session": S1, "role": "user", "content": "the task"}],
        [{"op": "session", "id": S1}, reply_in(S1, "")],
        [{"op": "session", "id": S1}, {**reply_in(S1, "withdrawn"), "active": 0}],
        [{"op": "session", "id": S1}, {"op": "message", "session": S1, "role": "tool", "content": "output"}],
    ],
    ids=["nothing", "user-only", "empty-assistant", "inactive-assistant", "tool-only"],
)
def test_exit_0_without_a_stored_reply_is_turn_not_stored(h: Harness, ops: list[dict[str, Any]]) -> None:
    run = h.turn({"ops": [*ops, {"op": "print", "text": f"\nsession_id: {S1}\n"}]})
    assert run.code == 3
    assert run.failure() == HomeFailure("worker_turn_not_stored")


def test_an_earlier_turns_reply_does_not_stand_for_this_one(h: Harness) -> None:
    resumed(h)
    run = h.turn({"ops": [{"op": "message", "session": S1, "role": "user", "content": "again"}]})
    assert run.failure() == HomeFailure("worker_turn_not_stored")
    assert h.saved() == S1


# --- worker_session_unproven -----------------------------------------------------------------------------------


def test_two_new_root_sessions_are_unproven(h: Harness) -> None:
    plan = {"ops": [{"op": "session", "id": S1}, {"op": "session", "id": S2}, reply_in(S1)]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")
    assert not (h.home / ".claw-run" / "session").exists()


def test_a_first_runs_only_new_session_having_a_parent_is_unproven(h: Harness) -> None:
    plan = {"ops": [{"op": "session", "id": S1, "parent": S2}, reply_in(S1)]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")


def test_a_resumed_session_without_a_record_is_unproven(h: Harness) -> None:
    resumed(h)
    h.seed([(OLD, None, None, 0.5)], [])
    plan = {"ops": [{"op": "delete_session", "id": S1}, reply_in(OLD), {"op": "print", "text": f"session_id: {OLD}\n"}]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")
    assert h.saved() == S1


def test_a_resume_that_started_a_fresh_session_instead_is_unproven(h: Harness) -> None:
    resumed(h)
    plan = {"ops": [{"op": "session", "id": S2}, {"op": "turn", "session": S2, "reply": "elsewhere"}]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")


def test_hermes_naming_another_session_than_the_store_proves_is_unproven(h: Harness) -> None:
    plan = {"ops": [{"op": "session", "id": S1}, reply_in(S1), {"op": "print", "text": f"\nsession_id: {S2}\n"}]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")


def test_the_last_session_line_is_the_one_checked(h: Harness) -> None:
    text = f"session_id: {S2}\nmore output\nsession_id: {S1}\n"
    plan = {"ops": [{"op": "session", "id": S1}, reply_in(S1), {"op": "print", "text": text}]}
    assert h.turn(plan).result()[0] == HomeResult("answer", S1)


def test_a_compressed_session_without_continuation_is_unproven(h: Harness) -> None:
    resumed(h)
    plan = {"ops": [reply_in(S1), {"op": "end", "id": S1, "reason": "compression"}]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")
    assert h.saved() == S1


def test_the_newest_message_is_never_the_proof(h: Harness) -> None:
    # A new root session appears (with no reply) while the reply lands in a session that already existed.
    h.seed([(OLD, None, None, 0.5)], [(OLD, "user", "old"), (OLD, "assistant", "old reply")])
    plan = {
        "ops": [{"op": "session", "id": S1}, reply_in(OLD, "newest"), {"op": "print", "text": f"session_id: {OLD}\n"}]
    }
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")
    # and with no new session at all
    plan = {"ops": [reply_in(OLD, "newest")]}
    assert h.turn(plan).failure() == HomeFailure("worker_session_unproven")
    assert not (h.home / ".claw-run" / "session").exists()


def test_an_unreadable_store_is_unproven_before_hermes_starts(h: Harness) -> None:
    (h.home / ".hermes").mkdir()
    h.db_path.write_bytes(b"this is not a database, not even close" * 100)
    assert h.turn("hello").failure() == HomeFailure("worker_session_unproven")
    assert h.runs() == []


# --- compression continuation ----------------------------------------------------------------------------------


def test_a_compressed_session_continues_in_its_child(h: Harness) -> None:
    resumed(h)
    plan = {
        "ops": [
            {"op": "session", "id": S2, "parent": S1, "started_at": 2.0},
            {"op": "end", "id": S1, "reason": "compression"},
            reply_in(S2, "continued"),
            {"op": "print", "text": f"\nsession_id: {S2}\n"},
        ]
    }
    assert h.turn(plan).result() == (HomeResult("answer", S2), "continued")
    assert h.saved() == S2
    assert h.runs()[0]["argv"][-2:] == ["--resume", S1]


def test_a_chain_of_compressions_is_followed_to_its_newest_end(h: Harness) -> None:
    resumed(h)
    plan = {
        "ops": [
            {"op": "session", "id": OLD, "parent": S1, "started_at": 1.5},  # an older child, not the continuation
            {"op": "session", "id": S2, "parent": S1, "end_reason": "compression", "started_at": 2.0},
            {"op": "session", "id": S3, "parent": S2, "started_at": 3.0},
            {"op": "end", "id": S1, "reason": "compression"},
            reply_in(S3, "at the end of the chain"),
        ]
    }
    assert h.turn(plan).result() == (HomeResult("answer", S3), "at the end of the chain")
    assert h.saved() == S3


# --- worker_session_locator_malformed --------------------------------------------------------------------------


@pytest.mark.parametrize("saved", ["../etc", "bad id!", "a" * 300, "", "two\nlines"])
def test_a_malformed_saved_session_is_reported_and_hermes_never_starts(h: Harness, saved: str) -> None:
    (h.home / ".claw-run").mkdir()
    (h.home / ".claw-run" / "session").write_text(saved)
    run = h.turn("hello")
    assert run.code == 3
    assert run.failure() == HomeFailure("worker_session_locator_malformed")
    assert h.runs() == []


# --- worker_home_invalid ---------------------------------------------------------------------------------------


def _outside(h: Harness) -> Path:
    outside = h.root / "outside"
    outside.mkdir(mode=0o700)
    (outside / "keep.txt").write_text("untouched")
    os.chmod(outside / "keep.txt", 0o600)
    return outside


def _deliverables_link(h: Harness, outside: Path) -> None:
    (h.home / "deliverables").symlink_to(outside)


def _run_dir_file(h: Harness, outside: Path) -> None:
    (h.home / ".claw-run").write_text("not a directory")


def _store_link(h: Harness, outside: Path) -> None:
    (h.home / ".hermes").symlink_to(outside)


def _state_db_dir(h: Harness, outside: Path) -> None:
    (h.home / ".hermes" / "state.db").mkdir(parents=True)


def _session_link(h: Harness, outside: Path) -> None:
    (h.home / ".claw-run").mkdir()
    (h.home / ".claw-run" / "session").symlink_to(outside / "keep.txt")


def _memories_link(h: Harness, outside: Path) -> None:
    (h.home / ".hermes").mkdir()
    (h.home / ".hermes" / "memories").symlink_to(outside)


def _question_link(h: Harness, outside: Path) -> None:
    (h.home / ".claw-run").mkdir()
    (h.home / ".claw-run" / "question.md").symlink_to(outside / "keep.txt")


def _no_home(h: Harness, outside: Path) -> None:
    h.home.rmdir()
    h.home.symlink_to(outside)


@pytest.mark.parametrize(
    "damage",
    [
        _deliverables_link,
        _run_dir_file,
        _store_link,
        _state_db_dir,
        _session_link,
        _memories_link,
        _question_link,
        _no_home,
    ],
)
def test_a_managed_path_that_is_not_safe_is_home_invalid(h: Harness, damage: Any) -> None:
    outside = _outside(h)
    damage(h, outside)
    run = h.turn("hello")
    assert run.code == 3
    assert run.failure() == HomeFailure("worker_home_invalid")
    assert h.runs() == []
    assert sorted(path.name for path in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "untouched"
    assert (mode(outside), mode(outside / "keep.txt")) == (0o700, 0o600)


# --- what a failure report carries -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setup",
    [
        {"ops": [{"op": "session", "id": S1}, {"op": "turn", "session": S1, "reply": f"leak {SECRET}"}], "exit": 1},
        {"ops": [{"op": "session", "id": S1}, {"op": "print", "text": f"\nsession_id: {S1}\n"}]},
        {"ops": [{"op": "session", "id": S1}, reply_in(S1), {"op": "print", "text": f"\nsession_id: {S2}\n"}]},
        "malformed",
        "invalid",
    ],
    ids=["runner-exit", "not-stored", "unproven", "malformed", "invalid"],
)
def test_a_failure_report_is_one_line_and_carries_nothing_else(h: Harness, setup: dict[str, Any] | str) -> None:
    if setup == "malformed":
        h.save(f"{S1}/../{S2}")
    elif setup == "invalid":
        (h.home / "deliverables").symlink_to(h.root)
    run = h.turn(setup if isinstance(setup, dict) else "hello")
    assert run.code == 3
    assert re.fullmatch(rb"claw-home-failure [a-z_]+( -?[0-9]+)?\n", run.stdout)
    for leak in (S1, S2, str(h.root), FAKE_STDOUT, FAKE_STDERR, SECRET, "leak"):
        assert leak.encode() not in run.stdout
        assert leak.encode() not in run.stderr


# --- the question ----------------------------------------------------------------------------------------------


def test_a_question_left_in_the_home_is_the_result(h: Harness) -> None:
    question = "Which year should the report cover?\n"
    plan = {
        "ops": [{"op": "turn", "reply": "I asked."}, {"op": "file", "path": ".claw-run/question.md", "text": question}]
    }
    result, text = h.turn(plan).result()
    assert result.outcome == "question"
    assert text == question
    assert h.saved() == result.session
    assert not os.path.lexists(h.home / ".claw-run" / "question.md")


def test_a_stale_question_is_removed_before_hermes_runs(h: Harness) -> None:
    (h.home / ".claw-run").mkdir()
    (h.home / ".claw-run" / "question.md").write_text("an old question")
    plan = {"ops": [{"op": "require_absent", "path": ".claw-run/question.md"}, {"op": "turn", "reply": "answered"}]}
    result, text = h.turn(plan).result()
    assert (result.outcome, text) == ("answer", "answered")
    assert h.runs()[0]["question_present"] is False


# --- deliverables and private files ----------------------------------------------------------------------------


def test_deliverables_are_opened_and_everything_else_stays_private(h: Harness) -> None:
    outside = _outside(h)
    plan = {
        "ops": [
            {"op": "turn", "reply": "made files"},
            {"op": "file", "path": "deliverables/report.txt", "text": "r", "mode": 0o600},
            {"op": "file", "path": "deliverables/plain.txt", "text": "p"},
            {"op": "mkdir", "path": "deliverables/sub"},
            {"op": "file", "path": "deliverables/sub/inner.txt", "text": "i"},
            {"op": "symlink", "path": "deliverables/link.txt", "target": str(outside / "keep.txt")},
            {"op": "file", "path": "notes.txt", "text": "private"},
            {"op": "mkdir", "path": "work"},
        ]
    }
    h.turn(plan).result()
    deliverables = h.home / "deliverables"
    assert mode(deliverables) == 0o755
    assert mode(deliverables / "report.txt") == 0o644
    assert mode(deliverables / "plain.txt") == 0o644
    assert mode(deliverables / "sub") == 0o700
    assert mode(deliverables / "sub" / "inner.txt") == 0o600
    assert mode(outside / "keep.txt") == 0o600  # the link's target is left alone
    assert mode(h.home / "notes.txt") == 0o600
    assert mode(h.home / "work") == 0o700
    assert mode(h.home / ".claw-run") == 0o700
    assert mode(h.home / ".hermes") == 0o700


@pytest.mark.parametrize(
    "ending",
    [{"exit": 1}, {"exit": 0}, {"exit": 0, "print_other": True}],
    ids=["runner-exit", "not-stored", "unproven"],
)
def test_deliverables_are_opened_at_the_end_of_a_failed_turn_too(h: Harness, ending: dict[str, Any]) -> None:
    ops: list[dict[str, Any]] = [{"op": "file", "path": "deliverables/partial.txt", "text": "p", "mode": 0o600}]
    if ending["exit"] == 1:
        ops.append({"op": "turn", "reply": "stored"})
    elif ending.get("print_other"):
        ops += [{"op": "session", "id": S1}, reply_in(S1), {"op": "print", "text": f"session_id: {S2}\n"}]
    h.turn({"ops": ops, "exit": ending["exit"]}).failure()
    assert mode(h.home / "deliverables" / "partial.txt") == 0o644


def test_deliverables_made_private_between_turns_are_opened_at_the_start(h: Harness) -> None:
    (h.home / "deliverables").mkdir(mode=0o700)
    (h.home / "deliverables" / "old.txt").write_text("old")
    os.chmod(h.home / "deliverables" / "old.txt", 0o600)
    h.turn({"ops": [{"op": "turn", "reply": "ok"}], "exit": 1}).failure()  # the end of the turn does not matter here
    assert mode(h.home / "deliverables") == 0o755
    assert mode(h.home / "deliverables" / "old.txt") == 0o644


def test_deliverables_swapped_for_a_link_during_the_turn_are_not_followed(h: Harness) -> None:
    outside = _outside(h)
    plan = {
        "ops": [
            {"op": "turn", "reply": "swapped"},
            {"op": "swap_for_symlink", "path": "deliverables", "target": str(outside)},
        ]
    }
    assert h.turn(plan).result()[1] == "swapped"
    assert (mode(outside), mode(outside / "keep.txt")) == (0o700, 0o600)
    assert h.turn("next").failure() == HomeFailure("worker_home_invalid")
