"""The task-home worker contract, shared by the Hermes wrapper (:mod:`clawstack.worker.hermes`) and the supervisor.

A task-home worker is the wrapper, run once per run in a sandbox that holds the run's home at :data:`HOME_ENV`.
Its task is its only positional argument and its configuration arrives as the stateless worker's does
(:mod:`clawstack.worker.contract`). It ends in one of two ways:

* exit 0 with a result: stdout holds one header line, ``claw-home-result {"outcome":…,"session":…}``, then the
  answer marker and the result text (the reply Hermes stored for this turn, or the question the worker left in
  ``.claw-run/question.md``);
* a non-zero exit with a failure report: stdout holds the line ``claw-home-failure REASON`` (one of
  :data:`FAILURE_REASONS`), followed for ``worker_runner_exit`` by Hermes's exit code. The report carries no
  worker output, session id or path. The supervisor reads a report only from a non-zero exit: an exit of 0 can
  never report a failure, and a report it does not recognise leaves the run's reason ``exit_nonzero``.

Paths in the home the wrapper manages (:data:`RUN_DIR`, :data:`DELIVERABLES_DIR`, :data:`STORE_DIR`) must be
real directories; anything else is ``worker_home_invalid``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final, Literal

HOME_ENV: Final = "CLAW_HOME"
"""Where the sandbox mounts the run's home (``run.home.mount``, default ``/home/task``)."""
HERMES_SITE_ENV: Final = "CLAW_HERMES_SITE"
"""The read-only site directory of the pinned Hermes installation, inside the sandbox."""

RUN_DIR: Final = ".claw-run"
"""The wrapper's own directory in the home: the saved session id and the worker's question."""
SESSION_FILE: Final = "session"
QUESTION_FILE: Final = "question.md"
DELIVERABLES_DIR: Final = "deliverables"
STORE_DIR: Final = ".hermes"
"""Hermes's persistent state in the home: its session store (``state.db``), memories and skills."""

SESSION_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""What a saved session id may be (Hermes's ids are ``YYYYMMDD_HHMMSS_<6 hex>``)."""

RESULT_HEADER: Final = "claw-home-result "
FAILURE_HEADER: Final = "claw-home-failure "
FAILURE_EXIT: Final = 3
"""The wrapper's exit code for a reported failure (``worker_usage`` exits 2)."""
USAGE_EXIT: Final = 2

FAILURE_REASONS: Final = frozenset(
    {
        "worker_runner_exit",
        "worker_turn_not_stored",
        "worker_session_unproven",
        "worker_session_locator_malformed",
        "worker_home_invalid",
        "worker_usage",
    }
)

Outcome = Literal["answer", "question"]


@dataclass(frozen=True, slots=True)
class HomeResult:
    """What a finished turn produced: ``answer`` or ``question``, and the session that holds the turn."""

    outcome: Outcome
    session: str


@dataclass(frozen=True, slots=True)
class HomeFailure:
    """A failure the wrapper reported: one allowlisted reason, and Hermes's exit code for ``worker_runner_exit``."""

    reason: str
    runner_code: int | None = None


def format_result(result: HomeResult) -> str:
    """The header line of a result (the answer marker and the text follow it)."""
    return RESULT_HEADER + json.dumps({"outcome": result.outcome, "session": result.session}) + "\n"


def format_failure(failure: HomeFailure) -> str:
    if failure.reason not in FAILURE_REASONS:
        raise ValueError(f"unknown failure reason {failure.reason!r}")
    code = "" if failure.runner_code is None else f" {failure.runner_code}"
    return f"{FAILURE_HEADER}{failure.reason}{code}\n"


def parse_result(stdout: bytes) -> HomeResult | None:
    """The result header at the start of ``stdout``, or ``None`` when there is none that is well formed."""
    line = stdout.split(b"\n", 1)[0].decode("utf-8", "replace")
    if not line.startswith(RESULT_HEADER):
        return None
    try:
        header = json.loads(line[len(RESULT_HEADER) :])
    except ValueError:
        return None
    if not isinstance(header, dict) or set(header) != {"outcome", "session"}:
        return None
    outcome, session = header["outcome"], header["session"]
    if outcome not in ("answer", "question") or not isinstance(session, str) or not SESSION_ID.fullmatch(session):
        return None
    return HomeResult(outcome=outcome, session=session)


def parse_failure(stdout: bytes) -> HomeFailure | None:
    """The failure report in ``stdout`` (its first line), or ``None`` when it is not one this contract names."""
    line = stdout.split(b"\n", 1)[0].decode("ascii", "replace")
    if not line.startswith(FAILURE_HEADER):
        return None
    parts = line[len(FAILURE_HEADER) :].split(" ")
    reason = parts[0]
    if reason not in FAILURE_REASONS:
        return None
    if reason == "worker_runner_exit":
        if len(parts) != 2 or not re.fullmatch(r"-?[0-9]{1,3}", parts[1]):
            return None
        return HomeFailure(reason, int(parts[1]))
    return HomeFailure(reason) if len(parts) == 1 else None


def read_home_exit(exit_code: int, stdout: bytes) -> tuple[str | None, int | None, HomeResult | None]:
    """What a task-home worker's exit means to the supervisor: ``(failure, runner_code, result)``.

    An exit of 0 is a success only with a well-formed result header (else ``result_missing``), and never a
    failure of the worker's choosing, whatever its output says; a non-zero exit is the reason its report names
    (with Hermes's code for ``worker_runner_exit``), or ``exit_nonzero`` for a report this contract does not name.
    """
    if exit_code == 0:
        result = parse_result(stdout)
        return (None, None, result) if result is not None else ("result_missing", None, None)
    report = parse_failure(stdout)
    if report is None:
        return "exit_nonzero", None, None
    return report.reason, report.runner_code, None


__all__ = [
    "DELIVERABLES_DIR",
    "FAILURE_EXIT",
    "FAILURE_HEADER",
    "FAILURE_REASONS",
    "HERMES_SITE_ENV",
    "HOME_ENV",
    "QUESTION_FILE",
    "RESULT_HEADER",
    "RUN_DIR",
    "SESSION_FILE",
    "SESSION_ID",
    "STORE_DIR",
    "USAGE_EXIT",
    "HomeFailure",
    "HomeResult",
    "Outcome",
    "format_failure",
    "format_result",
    "parse_failure",
    "parse_result",
    "read_home_exit",
]
