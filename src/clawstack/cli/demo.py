"""``claw demo``: the main job, end to end, offline.

It starts ``claw fake-llm serve`` as a real subprocess, waits for its readiness line, sends one plain and one
streaming chat completion through :mod:`clawstack.llm`, prints the answers, and stops the subprocess whatever
happens. The model is clawstack's scripted fake, not a language model, and the output says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import textwrap

import click

from clawstack.cli.fake_llm import READY_PREFIX
from clawstack.llm import LLMClient, LLMError

MODEL = "clawstack-fake"
STOP_GRACE_S = 5.0
_STDERR_TAIL_BYTES = 4096

PLAIN_MESSAGE = (
    "Hello! Who is answering?\n"
    "@fake reply: Hello from clawstack's scripted fake model. I say exactly what the '@fake' lines in your "
    "message tell me to say."
)
STREAM_MESSAGE = "@fake echo\nStreaming works too: this sentence comes back to you word by word."

FAKE_MODEL_STATEMENT = (
    "Every answer above came from clawstack's scripted fake model (claw fake-llm), not a language model: "
    "it answers what the '@fake' lines in a message tell it to. No model provider was contacted."
)


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


@click.command()
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Give up if the demo has not finished after this many seconds.",
)
def demo(timeout_s: float) -> None:
    """Run the main job end to end: start the scripted fake model, chat with it, print the answers.

    The model is clawstack's scripted fake (claw fake-llm), not a language model; nothing leaves this machine.
    """
    try:
        asyncio.run(_run(timeout_s))
    except DemoError as exc:
        raise click.ClickException(str(exc)) from exc


async def _run(timeout_s: float) -> None:
    click.echo("Starting clawstack's scripted fake model (claw fake-llm serve) ...")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "clawstack",
        "fake-llm",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stderr_tail = bytearray()
    assert process.stderr is not None
    drain = asyncio.create_task(_keep_tail(process.stderr, stderr_tail))
    phase = "waiting for the fake model to be ready"
    try:
        async with asyncio.timeout(timeout_s):
            base_url = await _wait_for_ready(process, stderr_tail)
            click.echo(f"The fake model is listening on {base_url}\n")
            phase = "talking to the fake model"
            await _converse(base_url)
    except TimeoutError as exc:
        raise DemoError(f"the demo timed out after {timeout_s:g} s while {phase}") from exc
    except LLMError as exc:
        raise DemoError(f"the chat completion failed: {exc.message} [{exc.code}]") from exc
    finally:
        await _stop(process)
        await drain
    click.echo(f"\n{FAKE_MODEL_STATEMENT}")


async def _keep_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read the child's stderr to the end, keeping the last few KiB for an error message."""
    while chunk := await stream.read(4096):
        tail += chunk
        del tail[:-_STDERR_TAIL_BYTES]


async def _wait_for_ready(process: asyncio.subprocess.Process, stderr_tail: bytearray) -> str:
    assert process.stdout is not None
    line = (await process.stdout.readline()).decode("utf-8", "replace").strip()
    if not line.startswith(READY_PREFIX):
        status = await process.wait() if not line else process.returncode
        detail = stderr_tail.decode("utf-8", "replace").strip()
        raise DemoError(
            f"claw fake-llm serve did not start (exit status {status}, first line {line!r})"
            + (f":\n{detail}" if detail else "")
        )
    return line[len(READY_PREFIX) :]


async def _converse(base_url: str) -> None:
    async with LLMClient(base_url) as client:
        _show("user", PLAIN_MESSAGE)
        completion = await client.chat_completion(model=MODEL, messages=[{"role": "user", "content": PLAIN_MESSAGE}])
        _show("assistant", completion.content or "")
        if completion.usage is not None:
            usage = completion.usage
            click.echo(f"{'':12}(usage: {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens)")
        click.echo()
        _show("user", STREAM_MESSAGE)
        click.echo(f"{'assistant':>9} > ", nl=False)
        chunks = 0
        async with client.stream_chat_completion(
            model=MODEL, messages=[{"role": "user", "content": STREAM_MESSAGE}]
        ) as stream:
            async for chunk in stream:
                if chunk.content:
                    chunks += 1
                    click.echo(chunk.content, nl=False)
            streamed = await stream.final_completion()
        click.echo(f"\n{'':12}(streamed in {chunks} pieces; finish reason: {streamed.finish_reason})")


def _show(role: str, text: str) -> None:
    lines = textwrap.dedent(text).splitlines() or [""]
    click.echo(f"{role:>9} > {lines[0]}")
    for line in lines[1:]:
        click.echo(f"{'':12}{line}")


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Stop the child: SIGTERM, then SIGKILL if it has not exited within the grace period."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
