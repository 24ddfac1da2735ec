"""The one-shot runner's contract: its configuration, arguments, output format, exit codes and module pin."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import clawstack.worker
import clawstack.worker.contract
import clawstack.worker.oneshot
from clawstack.worker import (
    ANSWER_MARKER,
    CONFIG_ENV,
    CONFIG_FILE_ENV,
    ExitCode,
    WorkerConfig,
    WorkerConfigError,
    WorkerUsageError,
    answer_from_stdout,
    format_answer,
    load_worker_config,
    parse_worker_config,
    take_worker_config,
    take_worker_config_file,
)
from clawstack.worker.oneshot import RUNNER_MODULES, USAGE, main, parse_arguments

SECRET = "s3cret-Value_xyz"
CREDENTIAL = f"run-7:{SECRET}"
CONTRACT = "You are a careful worker. CONTRACT-MARK"

VALID: dict[str, Any] = {
    "version": 1,
    "model_base_url": "http://127.0.0.1:8089/v1",
    "model_unix_socket": None,
    "credential": CREDENTIAL,
    "model": "primary",
    "contract": CONTRACT,
    "max_turns": 8,
    "request_timeout_s": 600,
}


def config_text(**changes: Any) -> str:
    """VALID with ``changes`` applied; a change to ``...`` removes the key."""
    config = {**VALID, **changes}
    return json.dumps({key: value for key, value in config.items() if value is not ...})


# --- configuration ---------------------------------------------------------------------------------------------


def test_valid_config_parses() -> None:
    config = parse_worker_config(config_text())
    assert config == WorkerConfig(
        credential=CREDENTIAL,
        model="primary",
        contract=CONTRACT,
        model_base_url="http://127.0.0.1:8089/v1",
        max_turns=8,
        request_timeout_s=600,
    )
    assert config.base_url == "http://127.0.0.1:8089/v1"


def test_unix_socket_config_uses_a_placeholder_base_url() -> None:
    config = parse_worker_config(config_text(model_base_url=None, model_unix_socket="/run/claw/proxy.sock"))
    assert config.model_unix_socket == "/run/claw/proxy.sock"
    assert config.base_url == "http://localhost/v1"


def test_optional_keys_take_their_defaults() -> None:
    text = config_text(model_unix_socket=..., max_turns=..., request_timeout_s=..., contract="")
    config = parse_worker_config(text)
    assert (config.max_turns, config.request_timeout_s, config.contract) == (8, 600.0, "")


def test_config_round_trips_through_json() -> None:
    config = parse_worker_config(config_text(request_timeout_s=2.5))
    assert json.loads(config.to_json()) == {**VALID, "request_timeout_s": 2.5}
    assert parse_worker_config(config.to_json()) == config
    assert config.to_json().isascii()


def test_repr_hides_the_credential_and_the_contract() -> None:
    shown = repr(parse_worker_config(config_text()))
    assert SECRET not in shown
    assert CONTRACT not in shown


BAD_CONFIGS: list[tuple[str, str, str, str]] = [
    # id, value of CLAW_WORKER_CONFIG, code, a fragment of the message
    ("empty", "", "worker_config_missing", "is empty"),
    ("not-json", "{version: 1}", "worker_config_invalid", "json_syntax"),
    ("truncated", config_text()[:-1], "worker_config_invalid", "json_syntax"),
    ("array", "[1]", "worker_config_invalid", "must be a JSON object"),
    ("string", '"x"', "worker_config_invalid", "must be a JSON object"),
    ("null", "null", "worker_config_invalid", "must be a JSON object"),
    ("duplicate-key", config_text()[:-1] + ', "model": "other"}', "worker_config_invalid", "json_duplicate_key"),
    ("lone-surrogate", config_text(model="\ud800"), "worker_config_invalid", "json_lone_surrogate"),
    ("nan", config_text().replace('"request_timeout_s": 600', '"request_timeout_s": NaN'), "", "json_non_finite"),
    ("nested", config_text(model={"a": {"b": 1}}), "worker_config_invalid", "json_too_deep"),
    ("unknown-key", config_text(tools=[]), "worker_config_invalid", 'unknown key "tools"'),
    ("unknown-key-2", config_text(api_key="k"), "worker_config_invalid", 'unknown key "api_key"'),
    ("missing-version", config_text(version=...), "worker_config_invalid", 'missing key "version"'),
    ("missing-credential", config_text(credential=...), "worker_config_invalid", 'missing key "credential"'),
    ("missing-model", config_text(model=...), "worker_config_invalid", 'missing key "model"'),
    ("missing-contract", config_text(contract=...), "worker_config_invalid", 'missing key "contract"'),
    ("version-2", config_text(version=2), "worker_config_invalid", "version must be 1"),
    ("version-str", config_text(version="1"), "worker_config_invalid", "version must be 1"),
    ("version-float", config_text(version=1.0), "worker_config_invalid", "version must be 1"),
    ("version-bool", config_text(version=True), "worker_config_invalid", "version must be 1"),
    ("both-transports", config_text(model_unix_socket="/s.sock"), "worker_config_invalid", "exactly one"),
    ("neither-transport", config_text(model_base_url=None), "worker_config_invalid", "exactly one"),
    ("neither-absent", config_text(model_base_url=..., model_unix_socket=...), "worker_config_invalid", "exactly one"),
    ("url-int", config_text(model_base_url=8089), "worker_config_invalid", "model_base_url must be a string"),
    ("url-empty", config_text(model_base_url=""), "worker_config_invalid", "model_base_url must not be empty"),
    ("url-scheme", config_text(model_base_url="ftp://h/v1"), "worker_config_invalid", "absolute http"),
    ("url-relative", config_text(model_base_url="/v1"), "worker_config_invalid", "absolute http"),
    ("url-no-host", config_text(model_base_url="http:///v1"), "worker_config_invalid", "absolute http"),
    ("url-bad-port", config_text(model_base_url="http://h:99999/v1"), "worker_config_invalid", "not a valid URL"),
    ("url-userinfo", config_text(model_base_url="http://u:p@h/v1"), "worker_config_invalid", "credentials"),
    ("url-query", config_text(model_base_url="http://h/v1?k=1"), "worker_config_invalid", "query"),
    ("url-space", config_text(model_base_url="http://h/v 1"), "worker_config_invalid", "spaces"),
    ("socket-int", config_text(model_base_url=None, model_unix_socket=1), "worker_config_invalid", "a string"),
    ("socket-relative", config_text(model_base_url=None, model_unix_socket="p.sock"), "worker_config_invalid", ""),
    ("socket-nul", config_text(model_base_url=None, model_unix_socket="/a\0b"), "worker_config_invalid", "absolute"),
    ("socket-long", config_text(model_base_url=None, model_unix_socket="/" + "a" * 107), "", "longer than 107 bytes"),
    ("credential-int", config_text(credential=7), "worker_config_invalid", "credential must be a string"),
    ("credential-null", config_text(credential=None), "worker_config_invalid", "credential must be a string"),
    ("credential-empty", config_text(credential=""), "worker_config_invalid", "credential must not be empty"),
    ("credential-no-colon", config_text(credential=SECRET), "worker_config_invalid", "<identity-id>:<secret>"),
    ("credential-no-id", config_text(credential=f":{SECRET}"), "worker_config_invalid", "<identity-id>:<secret>"),
    ("credential-no-secret", config_text(credential="run-7:"), "worker_config_invalid", "<identity-id>:<secret>"),
    ("credential-space", config_text(credential=f"run-7:{SECRET} x"), "worker_config_invalid", "visible ASCII"),
    ("credential-newline", config_text(credential=f"run-7:{SECRET}\nX-A: b"), "worker_config_invalid", "ASCII"),
    ("credential-non-ascii", config_text(credential=f"run-7:{SECRET}é"), "worker_config_invalid", "ASCII"),
    ("credential-bad-id", config_text(credential=f"run/7:{SECRET}"), "worker_config_invalid", "<identity-id>"),
    ("credential-id-dot", config_text(credential=f".run:{SECRET}"), "worker_config_invalid", "<identity-id>"),
    ("model-empty", config_text(model=""), "worker_config_invalid", "model must not be empty"),
    ("model-list", config_text(model=["primary"]), "worker_config_invalid", "model must be a string"),
    ("contract-null", config_text(contract=None), "worker_config_invalid", "contract must be a string"),
    ("turns-zero", config_text(max_turns=0), "worker_config_invalid", "max_turns must be an integer from 1 to 64"),
    ("turns-high", config_text(max_turns=65), "worker_config_invalid", "max_turns"),
    ("turns-float", config_text(max_turns=2.0), "worker_config_invalid", "max_turns"),
    ("turns-bool", config_text(max_turns=True), "worker_config_invalid", "max_turns"),
    ("turns-str", config_text(max_turns="8"), "worker_config_invalid", "max_turns"),
    ("turns-null", config_text(max_turns=None), "worker_config_invalid", "max_turns"),
    ("timeout-zero", config_text(request_timeout_s=0), "worker_config_invalid", "request_timeout_s"),
    ("timeout-negative", config_text(request_timeout_s=-1), "worker_config_invalid", "request_timeout_s"),
    ("timeout-huge", config_text(request_timeout_s=86_401), "worker_config_invalid", "at most 86400"),
    ("timeout-bool", config_text(request_timeout_s=True), "worker_config_invalid", "request_timeout_s"),
    ("timeout-str", config_text(request_timeout_s="600"), "worker_config_invalid", "request_timeout_s"),
    ("int-range", config_text(max_turns=2**60), "worker_config_invalid", "json_integer_range"),
]


@pytest.mark.parametrize(
    ("text", "code", "fragment"), [case[1:] for case in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_is_refused(text: str, code: str, fragment: str) -> None:
    with pytest.raises(WorkerConfigError) as caught:
        parse_worker_config(text)
    assert caught.value.code == (code or "worker_config_invalid")
    assert fragment in caught.value.message
    assert caught.value.message.startswith(CONFIG_ENV)
    assert SECRET not in caught.value.message
    assert CONTRACT not in caught.value.message


def test_config_larger_than_the_limit_is_refused() -> None:
    with pytest.raises(WorkerConfigError, match="json_too_large"):
        parse_worker_config(config_text(contract="x" * (1024 * 1024)))


def test_constructing_a_bad_config_in_code_is_refused_too() -> None:
    with pytest.raises(WorkerConfigError, match="exactly one"):
        WorkerConfig(credential=CREDENTIAL, model="m", contract="")
    with pytest.raises(WorkerConfigError, match="max_turns"):
        WorkerConfig(credential=CREDENTIAL, model="m", contract="", model_base_url="http://h/v1", max_turns=0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(sorted(VALID)), json_values, max_size=8))
def test_any_object_is_either_a_valid_config_or_a_config_error(data: dict[str, Any]) -> None:
    try:
        config = parse_worker_config(json.dumps(data))
    except WorkerConfigError:
        return
    assert parse_worker_config(config.to_json()) == config


@given(
    st.text(min_size=1, max_size=20).filter(lambda key: key not in VALID),
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=20),
)
def test_any_unknown_key_is_refused(key: str, value: Any) -> None:
    with pytest.raises(WorkerConfigError, match="unknown key"):
        parse_worker_config(json.dumps({**VALID, key: value}))


@given(st.text(max_size=200))
def test_no_text_raises_anything_but_a_config_error(text: str) -> None:
    with pytest.raises(WorkerConfigError):
        parse_worker_config(text)


def test_take_removes_the_variable_even_when_it_is_invalid() -> None:
    environ = {CONFIG_ENV: "{not json", "HOME": "/h"}
    with pytest.raises(WorkerConfigError):
        take_worker_config(environ)
    assert environ == {"HOME": "/h"}


def test_take_reports_a_missing_variable() -> None:
    with pytest.raises(WorkerConfigError) as caught:
        take_worker_config({})
    assert caught.value.code == "worker_config_missing"


def test_take_removes_the_variable_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, config_text())
    config = take_worker_config(os.environ)
    assert config.credential == CREDENTIAL
    assert CONFIG_ENV not in os.environ
    # A child inherits the C environment, which os.environ's removal reached.
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ.get({CONFIG_ENV!r}, 'absent'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout == "absent\n"


# --- the configuration file ------------------------------------------------------------------------------------


def private_config_file(directory: Path, text: str) -> Path:
    path = directory / "config.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


def test_take_file_reads_and_removes_the_file(tmp_path: Path) -> None:
    path = private_config_file(tmp_path, config_text())
    config = take_worker_config_file(path)
    assert config.credential == CREDENTIAL
    assert not path.exists()


def test_take_file_removes_an_invalid_file_too(tmp_path: Path) -> None:
    path = private_config_file(tmp_path, config_text(credential=SECRET))
    with pytest.raises(WorkerConfigError) as caught:
        take_worker_config_file(path)
    assert caught.value.code == "worker_config_invalid"
    assert SECRET not in caught.value.message
    assert not path.exists()


@pytest.mark.parametrize(("text", "code"), [("", "worker_config_missing"), ("{", "worker_config_invalid")])
def test_take_file_refuses_an_empty_or_broken_file(tmp_path: Path, text: str, code: str) -> None:
    path = private_config_file(tmp_path, text)
    with pytest.raises(WorkerConfigError) as caught:
        take_worker_config_file(path)
    assert caught.value.code == code
    assert not path.exists()


def test_take_file_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkerConfigError) as caught:
        take_worker_config_file(tmp_path / "absent.json")
    assert caught.value.code == "worker_config_missing"


def test_take_file_does_not_follow_a_symlink(tmp_path: Path) -> None:
    target = private_config_file(tmp_path, config_text())
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(WorkerConfigError, match="cannot be opened"):
        take_worker_config_file(link)
    assert target.exists()


def test_take_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(WorkerConfigError, match="not a regular file"):
        take_worker_config_file(fifo)
    assert not fifo.exists()


def test_take_file_refuses_a_file_it_cannot_remove() -> None:
    # /proc files are regular files that nobody can unlink, root included.
    with pytest.raises(WorkerConfigError, match="cannot be removed") as caught:
        take_worker_config_file("/proc/self/status")
    assert caught.value.code == "worker_config_invalid"


def test_take_file_refuses_a_file_over_the_limit(tmp_path: Path) -> None:
    path = private_config_file(tmp_path, config_text(contract="x" * (1024 * 1024)))
    with pytest.raises(WorkerConfigError, match="json_too_large"):
        take_worker_config_file(path)
    assert not path.exists()


def test_load_prefers_the_file_and_removes_both_variables(tmp_path: Path) -> None:
    path = private_config_file(tmp_path, config_text(model="from-file"))
    environ = {CONFIG_FILE_ENV: str(path), CONFIG_ENV: config_text(model="from-env"), "HOME": "/h"}
    assert load_worker_config(environ).model == "from-file"
    assert environ == {"HOME": "/h"}
    assert not path.exists()


def test_load_falls_back_to_the_variable() -> None:
    environ = {CONFIG_ENV: config_text(model="from-env")}
    assert load_worker_config(environ).model == "from-env"
    assert environ == {}


@pytest.mark.parametrize("environ", [{}, {CONFIG_FILE_ENV: ""}, {CONFIG_FILE_ENV: "", CONFIG_ENV: config_text()}])
def test_load_reports_a_missing_configuration(environ: dict[str, str]) -> None:
    with pytest.raises(WorkerConfigError) as caught:
        load_worker_config(environ)
    assert caught.value.code == "worker_config_missing"
    assert environ == {}


def test_main_reads_and_removes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = private_config_file(tmp_path, config_text(version=2))
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    assert main(["TASK-MARK"]) == ExitCode.CONFIG
    _, err = capsys.readouterr()
    assert "version must be 1" in err
    assert not path.exists()
    assert CONFIG_FILE_ENV not in os.environ


# --- arguments -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "task", "session"),
    [
        (["Summarise the report"], "Summarise the report", None),
        (["task", "session-1"], "task", "session-1"),
        (["--", "task"], "task", None),
        (["--", "--help"], "--help", None),
        (["--", "--", "s"], "--", "s"),
        (["-n 5 items"], "-n 5 items", None),
        (["line one\nline two", ""], "line one\nline two", ""),
    ],
)
def test_arguments(argv: list[str], task: str, session: str | None) -> None:
    arguments = parse_arguments(argv)
    assert (arguments.task, arguments.session) == (task, session)
    assert repr(arguments) == "Arguments()"  # the task is never shown


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [([], "no task"), (["--"], "no task"), ([""], "blank"), ([" \n\t"], "blank"), (["a", "b", "c"], "3 arguments")],
)
def test_bad_arguments(argv: list[str], fragment: str) -> None:
    with pytest.raises(WorkerUsageError, match=fragment) as caught:
        parse_arguments(argv)
    assert caught.value.code == "worker_usage"


# --- main, up to the model -------------------------------------------------------------------------------------


def test_main_without_a_task_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CONFIG_ENV, config_text())
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "no task given" in err
    assert USAGE.splitlines()[0] in err
    assert CONFIG_ENV not in os.environ
    assert SECRET not in err


def test_main_with_too_many_arguments_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CONFIG_ENV, config_text())
    assert main(["TASK-MARK", "s", "extra"]) == ExitCode.USAGE
    _, err = capsys.readouterr()
    assert "TASK-MARK" not in err


def test_main_without_config_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert main(["TASK-MARK"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert "worker_config_missing" in err
    assert "TASK-MARK" not in err


def test_main_with_an_invalid_config_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CONFIG_ENV, config_text(credential=f"{SECRET}", contract="CONTRACT-MARK x"))
    assert main(["TASK-MARK"]) == ExitCode.CONFIG
    out, err = capsys.readouterr()
    assert out == ""
    assert "worker_config_invalid" in err
    assert "credential" in err
    for secret in (SECRET, "CONTRACT-MARK", "TASK-MARK"):
        assert secret not in err
    assert CONFIG_ENV not in os.environ


def test_main_help(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert main(["--help"]) == 0
    assert capsys.readouterr().out == USAGE


def test_exit_codes_are_the_documented_ones() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "ANSWERED": 0,
        "INTERNAL_ERROR": 1,
        "USAGE": 2,
        "CONFIG": 3,
        "MODEL_FAILED": 4,
        "MAX_TURNS": 5,
        "INTERRUPTED": 130,
        "TERMINATED": 143,
    }


# --- output ----------------------------------------------------------------------------------------------------


def test_answer_format() -> None:
    assert ANSWER_MARKER == "\n\U0001f99e"
    assert format_answer("Paris.") == "\n🦞 Paris.\n"
    assert format_answer("") == "\n🦞 \n"
    assert format_answer("two\nlines\n") == "\n🦞 two\nlines\n\n"


@pytest.mark.parametrize("answer", ["Paris.", "", " padded ", "two\nlines\n", "a \n🦞 b", "\n", "🦞"])
def test_answer_round_trips(answer: str) -> None:
    assert answer_from_stdout(format_answer(answer)) == answer


def test_no_marker_means_no_answer() -> None:
    assert answer_from_stdout("") is None
    assert answer_from_stdout("🦞 no newline before the marker\n") is None


def test_the_first_marker_wins() -> None:
    assert answer_from_stdout("noise\n🦞 first\n🦞 second\n") == "first\n🦞 second"


# --- the module pin and the public API -------------------------------------------------------------------------


def test_runner_modules_are_exactly_what_the_runner_imports() -> None:
    code = (
        "import json, sys, clawstack.worker.oneshot; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('clawstack'))))"
    )
    env = {key: value for key, value in os.environ.items() if key != CONFIG_ENV}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert json.loads(result.stdout) == sorted(RUNNER_MODULES)
    assert list(RUNNER_MODULES) == sorted(set(RUNNER_MODULES))


def test_runner_modules_are_files_in_this_tree() -> None:
    for name in RUNNER_MODULES:
        path = importlib.import_module(name).__file__
        assert path is not None, name
        assert path.endswith(".py"), name


def _public_names(module: types.ModuleType) -> list[str]:
    return sorted(
        name
        for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
    )


WORKER_API = [
    "ANSWER_MARKER",
    "CONFIG_ENV",
    "CONFIG_FILE_ENV",
    "ExitCode",
    "WorkerConfig",
    "WorkerConfigError",
    "WorkerError",
    "WorkerMaxTurnsError",
    "WorkerUsageError",
    "answer_from_stdout",
    "format_answer",
    "load_worker_config",
    "parse_worker_config",
    "take_worker_config",
    "take_worker_config_file",
]

ONESHOT_API = [
    "CANCEL_GRACE_S",
    "RUNNER_MODULES",
    "TOOLS_UNAVAILABLE",
    "USAGE",
    "Arguments",
    "main",
    "parse_arguments",
    "run_task",
    "serve",
]


def test_worker_all_is_pinned() -> None:
    assert clawstack.worker.__all__ == WORKER_API
    assert _public_names(clawstack.worker) == sorted(WORKER_API)


def test_oneshot_all_is_pinned() -> None:
    assert clawstack.worker.oneshot.__all__ == ONESHOT_API


def test_contract_all_is_sorted_and_complete() -> None:
    names = clawstack.worker.contract.__all__
    assert set(WORKER_API) <= set(names)
    for name in names:
        assert hasattr(clawstack.worker.contract, name)


# --- the docs --------------------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[3] / "docs" / "worker.md"


def test_the_docs_list_every_exit_status_and_config_key() -> None:
    text = DOC.read_text()
    statuses = {int(match) for match in re.findall(r"^\| (\d+) \|", text, flags=re.MULTILINE)}
    assert statuses == {int(code) for code in ExitCode}
    keys = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE))
    assert keys == set(parse_worker_config(config_text()).to_dict())
    assert CONFIG_ENV in text
    assert USAGE.splitlines()[0].removeprefix("usage: ") in text
