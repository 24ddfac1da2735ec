"""The one-shot worker contract, shared by the runner and the supervisor that launches it.

A stateless worker is one process per run. Its task is its only positional argument; its configuration, with
the run's proxy credential, arrives as a private file named by :data:`CONFIG_FILE_ENV`, which the runner reads
and removes before anything else (a sandbox supervisor's way: nothing secret in the environment or argv), or
in the environment variable :data:`CONFIG_ENV`, which the runner removes from its own environment first; its
answer is everything on stdout after the first :data:`ANSWER_MARKER`; its exit status is one of
:class:`ExitCode`. See ``docs/worker.md``.

Errors::

    ClawError                          (clawstack.common.errors)
     └── WorkerError                   worker_error
          ├── WorkerUsageError         worker_usage            no task, or bad arguments
          ├── WorkerConfigError        worker_config_missing   no variable, an empty one, or no file
          │                            worker_config_invalid   not strict JSON, an unknown or missing key,
          │                                                    a wrong type or value; a file that is not a
          │                                                    regular file or cannot be read or removed
          └── WorkerMaxTurnsError      worker_max_turns        the model still asked for tools after max_turns

Messages name a key and the rule it broke, never a value: the configuration carries the credential and the
contract, and the arguments carry the task.
"""

from __future__ import annotations

import enum
import errno
import json
import math
import os
import re
import stat
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from clawstack.common.errors import ClawError
from clawstack.common.strictjson import StrictJSONError, loads

CONFIG_ENV: Final = "CLAW_WORKER_CONFIG"
"""The environment variable that carries the runner's configuration, as one JSON object."""

CONFIG_FILE_ENV: Final = "CLAW_WORKER_CONFIG_FILE"
"""The environment variable that names a private file holding the configuration; preferred over
:data:`CONFIG_ENV`. The runner removes the file once it has read it."""

ANSWER_MARKER: Final = "\n🦞"
"""The answer is everything on stdout after the first occurrence of this marker."""

CONFIG_VERSION: Final = 1
DEFAULT_MAX_TURNS: Final = 8
MAX_TURNS_LIMIT: Final = 64
DEFAULT_REQUEST_TIMEOUT_S: Final = 600.0
MAX_REQUEST_TIMEOUT_S: Final = 86_400.0
MAX_CONFIG_BYTES: Final = 1024 * 1024
UNIX_SOCKET_BASE_URL: Final = "http://localhost/v1"
"""The base URL the runner uses over a Unix socket, where only the path counts."""

_SUN_PATH_MAX: Final = 107
_CREDENTIAL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}:[\x21-\x7e]{1,1024}")
_KEYS: Final = frozenset(
    {
        "version",
        "model_base_url",
        "model_unix_socket",
        "credential",
        "model",
        "contract",
        "max_turns",
        "request_timeout_s",
    }
)
_REQUIRED_KEYS: Final = ("version", "credential", "model", "contract")


class ExitCode(enum.IntEnum):
    """The runner's exit statuses. Only :attr:`ANSWERED` comes with an answer on stdout."""

    ANSWERED = 0
    INTERNAL_ERROR = 1
    USAGE = 2
    CONFIG = 3
    MODEL_FAILED = 4
    MAX_TURNS = 5
    INTERRUPTED = 130
    TERMINATED = 143


class WorkerError(ClawError):
    """Root of the worker's error tree."""

    code = "worker_error"


class WorkerUsageError(WorkerError):
    """The runner was started without a task or with arguments it does not take."""

    code = "worker_usage"


class WorkerConfigError(WorkerError):
    """The configuration variable is missing (``worker_config_missing``) or invalid (``worker_config_invalid``)."""

    code = "worker_config_invalid"


class WorkerMaxTurnsError(WorkerError):
    """The model asked for tools on every one of ``max_turns`` requests."""

    code = "worker_max_turns"


def _invalid(message: str) -> WorkerConfigError:
    return WorkerConfigError(f"{CONFIG_ENV}: {message}")


def _key_name(key: str) -> str:
    return json.dumps(key if len(key) <= 40 else key[:40] + "…", ensure_ascii=True)


def _require_text(key: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _invalid(f"{key} must be a string")
    if not value and not allow_empty:
        raise _invalid(f"{key} must not be empty")
    return value


def _check_base_url(value: object) -> None:
    url = _require_text("model_base_url", value)
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:
        raise _invalid("model_base_url is not a valid URL") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise _invalid("model_base_url must be an absolute http:// or https:// URL")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise _invalid("model_base_url may not carry credentials, a query or a fragment")
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in url):
        raise _invalid("model_base_url may not contain spaces or control characters")


def _check_unix_socket(value: object) -> None:
    path = _require_text("model_unix_socket", value)
    if not path.startswith("/") or "\0" in path:
        raise _invalid("model_unix_socket must be an absolute path")
    if len(path.encode("utf-8", "surrogateescape")) > _SUN_PATH_MAX:
        raise _invalid(f"model_unix_socket is longer than {_SUN_PATH_MAX} bytes")


@dataclass(frozen=True)
class WorkerConfig:
    """The runner's configuration; constructing one validates it (:class:`WorkerConfigError`).

    Exactly one of ``model_base_url`` (the proxy's worker API root, ``http://host:port/v1``) and
    ``model_unix_socket`` (the proxy's worker socket) is set. ``credential`` is the run's identity,
    ``<identity-id>:<secret>``; ``contract`` is the agent contract, sent as the system message (none when empty).
    ``request_timeout_s`` bounds each model request.
    """

    credential: str = field(repr=False)
    model: str
    contract: str = field(repr=False)
    model_base_url: str | None = None
    model_unix_socket: str | None = None
    max_turns: int = DEFAULT_MAX_TURNS
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    version: Literal[1] = CONFIG_VERSION

    def __post_init__(self) -> None:
        version: object = self.version
        if isinstance(version, bool) or not isinstance(version, int) or version != CONFIG_VERSION:
            raise _invalid(f"version must be {CONFIG_VERSION}")
        if (self.model_base_url is None) == (self.model_unix_socket is None):
            raise _invalid("set exactly one of model_base_url and model_unix_socket")
        if self.model_base_url is not None:
            _check_base_url(self.model_base_url)
        if self.model_unix_socket is not None:
            _check_unix_socket(self.model_unix_socket)
        credential = _require_text("credential", self.credential)
        if _CREDENTIAL.fullmatch(credential) is None:
            raise _invalid("credential must be <identity-id>:<secret> in visible ASCII")
        _require_text("model", self.model)
        _require_text("contract", self.contract, allow_empty=True)
        turns: object = self.max_turns
        if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= MAX_TURNS_LIMIT:
            raise _invalid(f"max_turns must be an integer from 1 to {MAX_TURNS_LIMIT}")
        timeout: object = self.request_timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_REQUEST_TIMEOUT_S
        ):
            raise _invalid(
                f"request_timeout_s must be a number of seconds above 0 and at most {MAX_REQUEST_TIMEOUT_S:g}"
            )

    @property
    def base_url(self) -> str:
        """The base URL to give the client: ``model_base_url``, or a placeholder host over the Unix socket."""
        return self.model_base_url if self.model_base_url is not None else UNIX_SOCKET_BASE_URL

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerConfig:
        """Validate a decoded configuration object: unknown keys are refused, every required key must be there."""
        unknown = sorted(key for key in data if key not in _KEYS)
        if unknown:
            raise _invalid(f"unknown key {_key_name(unknown[0])}")
        for key in _REQUIRED_KEYS:
            if key not in data:
                raise _invalid(f"missing key {_key_name(key)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the JSON object the runner reads, every key present."""
        return {
            "version": self.version,
            "model_base_url": self.model_base_url,
            "model_unix_socket": self.model_unix_socket,
            "credential": self.credential,
            "model": self.model,
            "contract": self.contract,
            "max_turns": self.max_turns,
            "request_timeout_s": self.request_timeout_s,
        }

    def to_json(self) -> str:
        """The value for :data:`CONFIG_ENV`: compact, ASCII-only JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def parse_worker_config(text: str) -> WorkerConfig:
    """Parse the value of :data:`CONFIG_ENV` under the strict JSON rules (duplicate keys, lone surrogates,
    invalid UTF-8 and out-of-range integers are refused) and validate it."""
    if not text:
        raise WorkerConfigError(f"{CONFIG_ENV} is empty", code="worker_config_missing")
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise _invalid("not valid JSON (json_lone_surrogate)") from exc
    try:
        value = loads(data, max_bytes=MAX_CONFIG_BYTES, max_depth=2)
    except StrictJSONError as exc:
        raise _invalid(f"not valid JSON ({exc.code}: {exc.message})") from exc
    if not isinstance(value, dict):
        raise _invalid("must be a JSON object")
    return WorkerConfig.from_dict(value)


def take_worker_config(environ: MutableMapping[str, str]) -> WorkerConfig:
    """Remove :data:`CONFIG_ENV` from ``environ`` (always, valid or not) and parse it.

    Given :data:`os.environ`, the removal also reaches the process's C environment, so no child process and no
    later code sees the credential.
    """
    text = environ.pop(CONFIG_ENV, None)
    if text is None:
        raise WorkerConfigError(f"{CONFIG_ENV} is not set", code="worker_config_missing")
    return parse_worker_config(text)


def take_worker_config_file(path: str | os.PathLike[str]) -> WorkerConfig:
    """Read the configuration file at ``path``, remove it (always, valid or not, once it could be opened) and
    parse it under the rules of :func:`parse_worker_config`.

    The file must be a regular file, not a symlink, of at most :data:`MAX_CONFIG_BYTES`. A file that cannot be
    removed is refused too: the credential must not outlive the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise WorkerConfigError(f"{CONFIG_FILE_ENV} names no file", code="worker_config_missing") from exc
    except OSError as exc:
        raise _invalid(
            f"the configuration file cannot be opened ({errno.errorcode.get(exc.errno or 0, 'EIO')})"
        ) from exc
    try:
        try:
            os.unlink(path)
        except OSError as exc:
            raise _invalid(
                f"the configuration file cannot be removed ({errno.errorcode.get(exc.errno or 0, 'EIO')})"
            ) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _invalid("the configuration file is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise _invalid(f"the configuration file cannot be read ({errno.errorcode.get(exc.errno or 0, 'EIO')})") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data:
        raise WorkerConfigError(f"{CONFIG_FILE_ENV} names an empty file", code="worker_config_missing")
    return parse_worker_config(data.decode("utf-8", "surrogateescape"))


def load_worker_config(environ: MutableMapping[str, str]) -> WorkerConfig:
    """The runner's configuration, from the file :data:`CONFIG_FILE_ENV` names if it is set, else from
    :data:`CONFIG_ENV`.

    Both variables are removed from ``environ`` first, always, so neither the credential nor the file's name
    reaches a child process; the file is removed by :func:`take_worker_config_file`.
    """
    path = environ.pop(CONFIG_FILE_ENV, None)
    text = environ.pop(CONFIG_ENV, None)
    if path is not None:
        if not path:
            raise WorkerConfigError(f"{CONFIG_FILE_ENV} is empty", code="worker_config_missing")
        return take_worker_config_file(path)
    if text is None:
        raise WorkerConfigError(f"neither {CONFIG_FILE_ENV} nor {CONFIG_ENV} is set", code="worker_config_missing")
    return parse_worker_config(text)


def format_answer(answer: str) -> str:
    """Everything the runner prints on stdout: the marker, a space, the answer and a newline."""
    return f"{ANSWER_MARKER} {answer}\n"


def extract_answer(stdout: bytes, max_bytes: int | None = None) -> tuple[bytes, bool] | None:
    """The answer in a runner's stdout and whether it was cut; ``None`` without a marker.

    It is everything after the first marker, less the one space after the marker and the final newline, cut at
    ``max_bytes`` (never inside a UTF-8 character) when given.
    """
    marker = ANSWER_MARKER.encode()
    index = stdout.find(marker)
    if index < 0:
        return None
    answer = stdout[index + len(marker) :].removeprefix(b" ").removesuffix(b"\n")
    if max_bytes is None or len(answer) <= max_bytes:
        return answer, False
    cut = answer[:max_bytes]
    while cut and (cut[-1] & 0xC0) == 0x80:  # do not split a UTF-8 character
        cut = cut[:-1]
    if cut and cut[-1] >= 0xC0:
        cut = cut[:-1]
    return cut, True


def answer_from_stdout(stdout: str) -> str | None:
    """The answer in a runner's stdout, the inverse of :func:`format_answer`; ``None`` without a marker."""
    found = extract_answer(stdout.encode())
    return None if found is None else found[0].decode()


__all__ = [
    "ANSWER_MARKER",
    "CONFIG_ENV",
    "CONFIG_FILE_ENV",
    "CONFIG_VERSION",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "MAX_CONFIG_BYTES",
    "MAX_REQUEST_TIMEOUT_S",
    "MAX_TURNS_LIMIT",
    "UNIX_SOCKET_BASE_URL",
    "ExitCode",
    "WorkerConfig",
    "WorkerConfigError",
    "WorkerError",
    "WorkerMaxTurnsError",
    "WorkerUsageError",
    "answer_from_stdout",
    "extract_answer",
    "format_answer",
    "load_worker_config",
    "parse_worker_config",
    "take_worker_config",
    "take_worker_config_file",
]
