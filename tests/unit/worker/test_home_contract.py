"""What a task-home worker's exit means to the supervisor: the result header, the failure report, and the rules
that an exit of 0 never reports a failure and an unknown report stays ``exit_nonzero``."""

from __future__ import annotations

import pytest

from clawstack.worker.contract import format_answer
from clawstack.worker.home_contract import (
    FAILURE_REASONS,
    HomeFailure,
    HomeResult,
    format_failure,
    format_result,
    read_home_exit,
)

SESSION = "20261201_120000_abcdef"


def success(outcome: str = "answer", text: str = "the answer") -> bytes:
    return (format_result(HomeResult(outcome, SESSION)) + format_answer(text)).encode()  # type: ignore[arg-type]


def test_a_proven_turn_is_a_result() -> None:
    assert read_home_exit(0, success()) == (None, None, HomeResult("answer", SESSION))
    assert read_home_exit(0, success("question")) == (None, None, HomeResult("question", SESSION))


@pytest.mark.parametrize("reason", sorted(FAILURE_REASONS - {"worker_runner_exit"}))
def test_each_reason_is_reported_by_a_non_zero_exit(reason: str) -> None:
    assert read_home_exit(3, format_failure(HomeFailure(reason)).encode()) == (reason, None, None)


def test_the_runner_exit_carries_hermess_code() -> None:
    report = format_failure(HomeFailure("worker_runner_exit", 130)).encode()
    assert report == b"claw-home-failure worker_runner_exit 130\n"
    assert read_home_exit(3, report) == ("worker_runner_exit", 130, None)


@pytest.mark.parametrize(
    "stdout",
    [
        b"",
        b"claw-home-failure worker_made_up\n",
        b"claw-home-failure worker_runner_exit\n",  # the code is missing
        b"claw-home-failure worker_runner_exit abc\n",
        b"claw-home-failure worker_runner_exit 1 2\n",
        b"claw-home-failure worker_usage extra\n",
        b"claw-home-failure worker_usage /etc/passwd\n",
        b"some output\nclaw-home-failure worker_usage\n",  # a report is the first line, nothing else
    ],
)
def test_an_unrecognised_report_stays_exit_nonzero(stdout: bytes) -> None:
    assert read_home_exit(3, stdout) == ("exit_nonzero", None, None)


def test_an_exit_of_zero_never_reports_a_failure() -> None:
    for reason in FAILURE_REASONS:
        failure, code, result = read_home_exit(0, format_failure(HomeFailure(reason, 1)).encode())
        assert (failure, code, result) == ("result_missing", None, None)


@pytest.mark.parametrize(
    "header",
    [
        b'claw-home-result {"outcome": "answer"}\n',
        b'claw-home-result {"outcome": "maybe", "session": "s"}\n',
        b'claw-home-result {"outcome": "answer", "session": "../x"}\n',
        b'claw-home-result {"outcome": "answer", "session": "s", "extra": 1}\n',
        b"claw-home-result not json\n",
        b"no header at all\n",
    ],
)
def test_an_exit_of_zero_without_a_well_formed_header_has_no_result(header: bytes) -> None:
    assert read_home_exit(0, header + format_answer("text").encode()) == ("result_missing", None, None)


def test_only_allowlisted_reasons_can_be_formatted() -> None:
    with pytest.raises(ValueError, match="unknown failure reason"):
        format_failure(HomeFailure("worker_secret_path /home/task"))


def test_the_wrappers_pinned_modules_are_exactly_what_it_imports() -> None:
    import json
    import subprocess
    import sys

    from clawstack.worker.hermes import RUNNER_MODULES

    code = (
        "import json, sys, clawstack.worker.hermes; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('clawstack'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == sorted(RUNNER_MODULES)
    assert list(RUNNER_MODULES) == sorted(set(RUNNER_MODULES))
