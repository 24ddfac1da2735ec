"""What runs inside a worker: clawstack's stateless one-shot runner, ``python -m clawstack.worker.oneshot``, and
the contract it shares with the supervisor (:mod:`clawstack.worker.contract`: the configuration variables, the
answer marker, the exit codes); the task-home wrapper around one Hermes turn, ``python -m
clawstack.worker.hermes`` (:mod:`clawstack.worker.home_contract`, :mod:`clawstack.worker.hermes_store`), its
forwarder (:mod:`clawstack.worker.forwarder`) and the home meter (:mod:`clawstack.worker.meter`). See
``docs/worker.md``.

This package imports only the contract, never the runner, so that ``python -m clawstack.worker.oneshot`` loads
the runner once, as ``__main__``, and the supervisor can read the contract without loading a model client.
"""

from clawstack.worker.contract import (
    ANSWER_MARKER,
    CONFIG_ENV,
    CONFIG_FILE_ENV,
    ExitCode,
    WorkerConfig,
    WorkerConfigError,
    WorkerError,
    WorkerMaxTurnsError,
    WorkerUsageError,
    answer_from_stdout,
    format_answer,
    load_worker_config,
    parse_worker_config,
    take_worker_config,
    take_worker_config_file,
)

__all__ = [
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
