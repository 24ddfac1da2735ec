"""clawstack's task-home runner: ``python -m clawstack.worker.hermes [--] TASK``, a wrapper around one Hermes turn.

One process per run, in a sandbox whose only persistent writable path is the run's home (:data:`HOME_ENV`). It

1. takes its configuration (the run's proxy credential, the model slot, the contract) as the one-shot runner
   does, so nothing secret stays in its environment;
2. checks the paths it manages in the home (``.claw-run/``, ``deliverables/``, ``.hermes/``): each must be a real
   directory, the saved session id (``.claw-run/session``) a regular file holding a valid id;
3. writes Hermes's configuration, with the credential, into a private directory on the sandbox's tmpfs (never
   into the home), links Hermes's persistent state (``state.db``, ``memories``, ``skills``) to ``.hermes/`` in the
   home, and configures it fully offline (context length given, lazy installs, tirith and the update check off,
   approvals off);
4. relays Hermes's model calls through a forwarder (:mod:`clawstack.worker.forwarder`) to the proxy's worker
   socket when the proxy is a Unix socket, the only route out of the sandbox;
5. runs ``hermes chat -Q -q TASK [--resume SESSION] -t terminal,file,memory,skills,todo`` in the home, with the
   saved session on a resume;
6. proves the turn from the session store (:mod:`clawstack.worker.hermes_store`), never from Hermes's output,
   whose ``session_id:`` line is only a cross-check; saves the turn's session; and reports the result or a
   failure as :mod:`clawstack.worker.home_contract` says.

``deliverables/`` and the regular files directly in it are made readable at the start and at the end of the
turn; everything else the turn creates stays private (umask 077). Hermes's exit code reaches the supervisor only
in a ``worker_runner_exit`` report; the wrapper's own exit code is the run's ``exit_code``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from clawstack.worker.contract import WorkerConfig, WorkerConfigError, format_answer, load_worker_config
from clawstack.worker.forwarder import Forwarder
from clawstack.worker.hermes_store import SessionUnprovenError, StoreSnapshot, snapshot, stored_reply, turn_session
from clawstack.worker.home_contract import (
    DELIVERABLES_DIR,
    FAILURE_EXIT,
    HERMES_SITE_ENV,
    HOME_ENV,
    QUESTION_FILE,
    RUN_DIR,
    SESSION_FILE,
    SESSION_ID,
    STORE_DIR,
    USAGE_EXIT,
    HomeFailure,
    HomeResult,
    format_failure,
    format_result,
)

RUNNER_MODULES: Final[tuple[str, ...]] = (
    "clawstack",
    "clawstack.common",
    "clawstack.common.clock",
    "clawstack.common.digest",
    "clawstack.common.errors",
    "clawstack.common.files",
    "clawstack.common.ids",
    "clawstack.common.strictjson",
    "clawstack.worker",
    "clawstack.worker.contract",
    "clawstack.worker.forwarder",
    "clawstack.worker.hermes",
    "clawstack.worker.hermes_store",
    "clawstack.worker.home_contract",
)
"""Every clawstack module the wrapper loads: the files whose digest pins it (with the Hermes installation)."""

HERMES_VERSION: Final = "0.19.0"
TOOLSETS: Final = "terminal,file,memory,skills,todo"
CONTEXT_LENGTH: Final = 128_000
CONFIG_ERROR_EXIT: Final = 78
OUTPUT_LIMIT_BYTES: Final = 1024 * 1024
LOST_LINE_EXIT: Final = 70
"""Hermes's exit when its ``session_id:`` line was lost; a stored turn still stands."""
TASK_HOME_NOTE: Final = (
    "You work in a task home that keeps your files and this conversation from one run to the next. To hand files "
    "to the person who gave you the task, put them directly in deliverables/ at the top of your home (flat: no "
    "subdirectories or links; names of letters, digits, dots, dashes, underscores and spaces; at most 512 KiB "
    "each). If you need an answer from that person before you can go on, write your question to "
    ".claw-run/question.md in your home and end your turn: the answer arrives as your next task."
)
"""What the worker's contract says about its home, after the template's contract (Hermes's ``SOUL.md``)."""
_SESSION_LINE: Final = re.compile(rb"^session_id: (\S+)\s*$", re.MULTILINE)
_LAUNCH: Final = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); from hermes_cli.main import main; "
    "sys.argv[0] = 'hermes'; sys.exit(main())"
)


class _Failed(Exception):
    def __init__(self, reason: str, runner_code: int | None = None) -> None:
        super().__init__(reason)
        self.failure = HomeFailure(reason, runner_code)


# -- the home ---------------------------------------------------------------------------------------------------


def _real_dir(path: Path, *, create: bool = True, mode: int = 0o700) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise _Failed("worker_home_invalid") from None
        os.mkdir(path, mode)
        return
    if not stat.S_ISDIR(info.st_mode):
        raise _Failed("worker_home_invalid")


def _regular_or_absent(path: Path) -> bool:
    """Whether ``path`` is a regular file (``False`` when absent); anything else is ``worker_home_invalid``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode):
        raise _Failed("worker_home_invalid")
    return True


def prepare_home(home: Path) -> str | None:
    """Check and create the managed paths; returns the saved session id (``None`` on a first run)."""
    _real_dir(home, create=False)
    for name in (RUN_DIR, DELIVERABLES_DIR, STORE_DIR):
        _real_dir(home / name)
    for name in ("memories", "skills"):
        _real_dir(home / STORE_DIR / name)
    _regular_or_absent(home / STORE_DIR / "state.db")
    if _regular_or_absent(home / RUN_DIR / QUESTION_FILE):
        os.unlink(home / RUN_DIR / QUESTION_FILE)  # a question belongs to the turn that asked it
    if not _regular_or_absent(home / RUN_DIR / SESSION_FILE):
        return None
    saved = _read_small(home / RUN_DIR / SESSION_FILE, 256).decode("ascii", "replace").strip()
    if not SESSION_ID.fullmatch(saved):
        raise _Failed("worker_session_locator_malformed")
    return saved


def _read_small(path: Path, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Failed("worker_home_invalid")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def open_deliverables(home: Path) -> None:
    """Make ``deliverables/`` and the regular files directly in it readable; nothing else."""
    directory = home / DELIVERABLES_DIR
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # not a directory any more: the next turn's check reports it
    try:
        os.fchmod(fd, 0o755)
        for name in os.listdir(fd):
            with contextlib.suppress(OSError):
                entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
                try:
                    if stat.S_ISREG(os.fstat(entry).st_mode):
                        os.fchmod(entry, 0o644)
                finally:
                    os.close(entry)
    finally:
        os.close(fd)


def save_session(home: Path, session: str) -> None:
    """Write the turn's session id to ``.claw-run/session`` atomically (``worker_home_invalid`` if the turn
    replaced ``.claw-run`` with something else than a directory)."""
    directory = home / RUN_DIR
    _real_dir(directory, create=False)
    fd, temporary = tempfile.mkstemp(prefix=".session-", dir=directory)
    try:
        os.write(fd, session.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, directory / SESSION_FILE)


def read_question(home: Path) -> str | None:
    """The question the worker left for its requester this turn, if any."""
    path = home / RUN_DIR / QUESTION_FILE
    if not _regular_or_absent(path):
        return None
    text = _read_small(path, OUTPUT_LIMIT_BYTES).decode("utf-8", "replace")
    os.unlink(path)
    return text


# -- Hermes -----------------------------------------------------------------------------------------------------


def write_hermes_home(directory: Path, home: Path, config: WorkerConfig, base_url: str) -> None:
    """Hermes's configuration (with the credential) in ``directory`` on the tmpfs; its state linked to the home."""
    document = {
        "model": {
            "provider": "custom",
            "default": config.model,
            "base_url": base_url,
            "api_key": config.credential,
            "context_length": CONTEXT_LENGTH,
        },
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        "approvals": {"mode": "off"},
        "agent": {"environment_probe": False},
    }
    _private_write(directory / "config.yaml", json.dumps(document, indent=2))  # JSON is YAML
    update = {"ts": 9_999_999_999, "behind": 0, "rev": None, "ver": HERMES_VERSION}
    _private_write(directory / ".update_check", json.dumps(update))
    _private_write(directory / "SOUL.md", "\n\n".join(part for part in (config.contract, TASK_HOME_NOTE) if part))
    for name in ("state.db", "memories", "skills"):
        os.symlink(home / STORE_DIR / name, directory / name)


def _private_write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


async def _bounded(stream: asyncio.StreamReader | None) -> bytes:
    kept = bytearray()
    if stream is None:
        return b""
    while chunk := await stream.read(65536):
        if len(kept) < OUTPUT_LIMIT_BYTES:
            kept += chunk[: OUTPUT_LIMIT_BYTES - len(kept)]
    return bytes(kept)


async def run_hermes(task: str, saved: str | None, home: Path, hermes_home: Path, site: str) -> tuple[int, bytes]:
    """Run one Hermes turn; returns its exit code and its bounded stderr (its stdout is not the answer)."""
    argv = [sys.executable, "-S", "-c", _LAUNCH, site, "chat", "-Q", "-q", task, "-t", TOOLSETS]
    if saved is not None:
        argv += ["--resume", saved]
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(hermes_home),
        "HERMES_HOME": str(hermes_home),
        "HERMES_WRITE_SAFE_ROOT": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=home, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    loop = asyncio.get_running_loop()

    def forward(signum: int) -> None:  # a stop meant for the run reaches Hermes, which stores what it can
        if proc.returncode is None:
            proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, forward, signum)
    _, stderr = await asyncio.gather(_bounded(proc.stdout), _bounded(proc.stderr))
    return await proc.wait(), stderr


def prove_turn(home: Path, before: StoreSnapshot, saved: str | None, runner_code: int, stderr: bytes) -> str:
    """The session that holds the turn Hermes just ran, or :class:`_Failed` with the spec's reason."""
    database = home / STORE_DIR / "state.db"
    lines = _SESSION_LINE.findall(stderr)
    reported = lines[-1].decode("ascii", "replace") if lines else None
    try:
        any_reply = stored_reply(database, before)
    except sqlite3.Error:
        any_reply = None
    lost_line = runner_code == LOST_LINE_EXIT and reported is None and any_reply is not None
    if runner_code != 0 and not lost_line:
        raise _Failed("worker_runner_exit", runner_code)
    if any_reply is None:
        raise _Failed("worker_turn_not_stored")
    try:
        session = turn_session(database, before, saved)
        reply = stored_reply(database, before, session)
    except (SessionUnprovenError, sqlite3.Error):
        raise _Failed("worker_session_unproven") from None
    if reply is None or (reported is not None and reported != session):
        raise _Failed("worker_session_unproven")
    return session


async def run_turn(task: str, config: WorkerConfig, home: Path, site: str) -> tuple[HomeResult, str]:
    """One whole turn (see the module docstring); the result and its text."""
    saved = prepare_home(home)
    open_deliverables(home)
    try:
        before = snapshot(home / STORE_DIR / "state.db")
    except sqlite3.Error:
        raise _Failed("worker_session_unproven") from None
    forwarder = None
    with tempfile.TemporaryDirectory(prefix="claw-hermes-") as scratch:
        hermes_home = Path(scratch)
        if config.model_unix_socket is not None:
            forwarder = Forwarder(f"unix:{config.model_unix_socket}")
            base_url = f"http://127.0.0.1:{await forwarder.start()}/v1"
        else:
            assert config.model_base_url is not None
            base_url = config.model_base_url
        try:
            write_hermes_home(hermes_home, home, config, base_url)
            runner_code, stderr = await run_hermes(task, saved, home, hermes_home, site)
        finally:
            if forwarder is not None:
                await forwarder.close()
    try:
        session = prove_turn(home, before, saved, runner_code, stderr)
        question = read_question(home)
        try:
            reply = stored_reply(home / STORE_DIR / "state.db", before, session) or ""
        except sqlite3.Error:
            raise _Failed("worker_session_unproven") from None
        save_session(home, session)
    finally:
        open_deliverables(home)  # at the end of every turn Hermes ran, a failed one too
    if question is not None:
        return HomeResult("question", session), question
    return HomeResult("answer", session), reply


def _emit(text: str) -> None:
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.buffer.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    os.umask(0o077)
    # First of all, as the one-shot runner does: however the wrapper ends, the configuration file is gone.
    try:
        config: WorkerConfig | None = load_worker_config(os.environ)
        config_error: WorkerConfigError | None = None
    except WorkerConfigError as exc:
        config, config_error = None, exc
    if len(args) != 1 or not args[0].strip():
        _emit(format_failure(HomeFailure("worker_usage")))
        return USAGE_EXIT
    if config is None:
        assert config_error is not None
        print(f"clawstack-hermes: {config_error.code}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    home, site = os.environ.get(HOME_ENV), os.environ.get(HERMES_SITE_ENV)
    if not home or not site:
        _emit(format_failure(HomeFailure("worker_usage")))
        return USAGE_EXIT
    try:
        result, text = asyncio.run(run_turn(args[0], config, Path(home), site))
    except _Failed as failed:
        _emit(format_failure(failed.failure))
        return FAILURE_EXIT
    except OSError:
        _emit(format_failure(HomeFailure("worker_home_invalid")))
        return FAILURE_EXIT
    _emit(format_result(result) + format_answer(text))
    return 0


__all__ = ["HERMES_VERSION", "RUNNER_MODULES", "TOOLSETS", "main", "prepare_home", "prove_turn", "run_turn"]

if __name__ == "__main__":
    sys.exit(main())
