"""clawstack's stateless one-shot runner: ``python -m clawstack.worker.oneshot [--] TASK [SESSION]``.

One process per run. It takes its configuration from the private file ``CLAW_WORKER_CONFIG_FILE`` names, which
it removes, or else from ``CLAW_WORKER_CONFIG``; either way both variables leave its environment first. It
sends the task as the only user message (the agent contract as the system message) to the model proxy in one
chat completion without tools of its own, and prints ``\\n🦞 <answer>\\n`` on stdout, once,
at the end. Managed business tools are added and run by the proxy, out of the runner's sight; should the model
still ask the runner for a tool, each call is answered "unavailable" and the model is asked again, up to
``max_turns`` requests. ``SESSION`` is accepted for the PicoClaw contract and unused: this runner keeps no state.

stderr gets progress and failure lines that never carry the task, the contract, the credential, the answer or
what the endpoint said. The exit status is one of :class:`~clawstack.worker.contract.ExitCode`.

The supervisor pins the runner by a digest of the files of :data:`RUNNER_MODULES`, so this module imports as
little of clawstack as it can, and a test pins that list against a fresh import.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final

from clawstack.llm import ChatCompletion, LLMClient, LLMError, LLMHTTPError, ToolCall
from clawstack.worker.contract import (
    ExitCode,
    WorkerConfig,
    WorkerConfigError,
    WorkerMaxTurnsError,
    WorkerUsageError,
    format_answer,
    load_worker_config,
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
    "clawstack.llm",
    "clawstack.llm._parse",
    "clawstack.llm._translate",
    "clawstack.llm.accumulate",
    "clawstack.llm.client",
    "clawstack.llm.errors",
    "clawstack.llm.sse",
    "clawstack.llm.types",
    "clawstack.worker",
    "clawstack.worker.contract",
    "clawstack.worker.oneshot",
)
"""Every clawstack module the runner loads: the files whose digest pins it."""

USAGE: Final = (
    "usage: python -m clawstack.worker.oneshot [--] TASK [SESSION]\n"
    "  TASK     the task, sent to the model as the only user message\n"
    "  SESSION  accepted for the PicoClaw contract; unused by this stateless runner\n"
    "The configuration comes from the file CLAW_WORKER_CONFIG_FILE names (read, then removed) or from the\n"
    "CLAW_WORKER_CONFIG environment variable (see docs/worker.md).\n"
    "The answer is printed on stdout after the marker '\\n🦞 '.\n"
)

TOOLS_UNAVAILABLE: Final = (
    "Tools are unavailable to this worker. Answer the task with text only, from what you already have."
)
"""The content of the tool message that answers each tool call the model sends to the runner."""

CANCEL_GRACE_S: Final = 2.0
"""How long a signalled runner lets the cancelled request close its connection before it exits anyway."""

_PROGRAM: Final = "oneshot"


@dataclass(frozen=True)
class Arguments:
    """The runner's positional arguments."""

    task: str = field(repr=False)
    session: str | None = field(default=None, repr=False)


def parse_arguments(argv: Sequence[str]) -> Arguments:
    """``[--] TASK [SESSION]``; a blank task, no task or more than two arguments is a :class:`WorkerUsageError`.

    Nothing else is an option, so a task may begin with ``-``; a leading ``--`` is dropped, which lets a task
    be ``--help`` or ``--`` itself.
    """
    args = list(argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise WorkerUsageError("no task given")
    if len(args) > 2:
        raise WorkerUsageError(f"expected TASK [SESSION], got {len(args)} arguments")
    if not args[0].strip():
        raise WorkerUsageError("the task is blank")
    return Arguments(task=args[0], session=args[1] if len(args) == 2 else None)


def _say(line: str) -> None:
    """One progress or failure line on stderr. Callers never pass task, contract, credential or answer text."""
    try:
        sys.stderr.write(f"{_PROGRAM}: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # A closed stderr must not turn an answer into a failure.


def _assistant_turn(completion: ChatCompletion) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": completion.content,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in completion.tool_calls
        ],
    }


def _tool_refusal(call: ToolCall) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": TOOLS_UNAVAILABLE}


async def run_task(config: WorkerConfig, task: str, *, progress: Callable[[str], None] = _say) -> str:
    """Ask the model for the answer to ``task``; return its text (``""`` when it sent none).

    Raises :class:`~clawstack.llm.LLMError` when a request fails and :class:`WorkerMaxTurnsError` when the
    model asked for tools on all ``config.max_turns`` requests.
    """
    messages: list[dict[str, Any]] = []
    if config.contract:
        messages.append({"role": "system", "content": config.contract})
    messages.append({"role": "user", "content": task})
    async with LLMClient(
        config.base_url,
        api_key=config.credential,
        unix_socket=config.model_unix_socket,
        timeout_s=config.request_timeout_s,
    ) as client:
        for turn in range(1, config.max_turns + 1):
            progress(f"asking the model at {client.endpoint} (request {turn} of {config.max_turns})")
            completion = await client.chat_completion(model=config.model, messages=messages)
            if not completion.tool_calls:
                return completion.content or ""
            progress(f"the model asked for {len(completion.tool_calls)} tool call(s); tools are unavailable here")
            messages.append(_assistant_turn(completion))
            messages.extend(_tool_refusal(call) for call in completion.tool_calls)
    raise WorkerMaxTurnsError(f"the model still asked for tools after {config.max_turns} request(s)")


def _model_failure(exc: LLMError) -> str:
    status = f", HTTP {exc.status}" if isinstance(exc, LLMHTTPError) else ""
    return f"the model could not answer ({exc.code}{status})"


async def serve(config: WorkerConfig, task: str, stdout: BinaryIO) -> int:
    """Run one task to its exit status, writing the answer to ``stdout``; SIGTERM or SIGINT ends it early.

    A signal cancels the request in flight and ends the run with ``128 + signal`` and nothing on stdout.
    Must run in the main thread (it installs signal handlers on the running loop).
    """
    loop = asyncio.get_running_loop()
    signalled: list[int] = []
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        signalled.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    work = asyncio.create_task(run_task(config, task))
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if signalled:
        _say(f"stopped by signal {signalled[0]}")
        work.cancel()
        # Let the client close its connection so the proxy sees the request end, but never wait long.
        await asyncio.wait({work}, timeout=CANCEL_GRACE_S)
        if work.done() and not work.cancelled():
            work.exception()  # retrieved, not raised: the signal decides how this run ends
        return 128 + signalled[0]
    try:
        answer = work.result()
    except LLMError as exc:
        _say(_model_failure(exc))
        return ExitCode.MODEL_FAILED
    except WorkerMaxTurnsError as exc:
        _say(exc.message)
        return ExitCode.MAX_TURNS
    try:
        stdout.write(format_answer(answer).encode("utf-8", "replace"))
        stdout.flush()
    except OSError:
        _say("could not write the answer to stdout")
        return ExitCode.INTERNAL_ERROR
    return ExitCode.ANSWERED


def main(argv: Sequence[str] | None = None) -> int:
    """The runner's entry point; returns the exit status. ``argv`` excludes the program name."""
    # First of all, so that no code path, however it ends, leaves the credential in the environment or on disk.
    try:
        config: WorkerConfig | None = load_worker_config(os.environ)
        config_error: WorkerConfigError | None = None
    except WorkerConfigError as exc:
        config, config_error = None, exc
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    try:
        arguments = parse_arguments(args_in)
    except WorkerUsageError as exc:
        _say(f"{exc.message}\n{USAGE}".rstrip("\n"))
        return ExitCode.USAGE
    if config is None:
        assert config_error is not None
        _say(f"configuration error ({config_error.code}): {config_error.message}")
        return ExitCode.CONFIG
    try:
        return asyncio.run(serve(config, arguments.task, sys.stdout.buffer))
    except Exception as exc:
        # The process boundary: report the kind of failure only, since a traceback's messages could quote input.
        _say(f"internal error ({type(exc).__name__})")
        return ExitCode.INTERNAL_ERROR


__all__ = [
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

if __name__ == "__main__":
    sys.exit(main())
