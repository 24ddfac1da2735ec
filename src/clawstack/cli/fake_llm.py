"""``claw fake-llm``: run the scripted fake model (a test double, not a language model) as a server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from clawstack.cli._serving import configure_logging, serve_until_signal
from clawstack.llm.errors import FakeScriptError
from clawstack.llm.fake import FakeModelServer, load_script

READY_PREFIX = "fake-llm listening on "
"""The readiness line on stdout is this prefix followed by the address (a base URL or ``unix:PATH``)."""

API_KEY_ENV = "CLAW_FAKE_LLM_API_KEY"


@click.group(name="fake-llm")
def fake_llm() -> None:
    """The scripted fake model: an OpenAI-compatible test double. It is not a language model.

    It answers /v1/chat/completions as '@fake' directive lines in the last user message, or the steps of a
    script file, tell it to (see docs/fake-llm.md). Tests, benchmarks and the offline demo use it.
    """


@fake_llm.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (TCP).")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="TCP port; 0 picks a free one, which the readiness line shows.",
)
@click.option(
    "--unix-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Listen on this Unix socket (mode 0600) instead of TCP.",
)
@click.option(
    "--script",
    "script_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON script file: steps answered in order (see docs/fake-llm.md).",
)
@click.option(
    "--api-key",
    envvar=API_KEY_ENV,
    show_envvar=True,
    help="Require 'Authorization: Bearer KEY' on /v1 requests. Prefer the environment variable: "
    "other users can read a process's arguments.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Logging on stderr (one line per request; never message content).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    unix_socket: Path | None,
    script_path: Path | None,
    api_key: str | None,
    log_level: str,
) -> None:
    """Serve the scripted fake model in the foreground until SIGTERM or SIGINT.

    Once listening it prints one line on stdout, 'fake-llm listening on ADDRESS', where ADDRESS is the base URL
    (http://HOST:PORT/v1) or unix:PATH. This is a test double that answers what it is told, not a language
    model.
    """
    if unix_socket is not None and (
        ctx.get_parameter_source("port") is not click.core.ParameterSource.DEFAULT
        or ctx.get_parameter_source("host") is not click.core.ParameterSource.DEFAULT
    ):
        raise click.UsageError("--unix-socket cannot be combined with --host or --port")
    try:
        script = None if script_path is None else load_script(script_path)
    except FakeScriptError as exc:
        raise click.BadParameter(exc.message, param_hint="--script") from exc
    configure_logging(log_level)
    server = FakeModelServer(script, host=host, port=port, unix_socket=unix_socket, api_key=api_key or None)
    asyncio.run(_serve(server))


async def _serve(server: FakeModelServer) -> None:
    async def start() -> str:
        try:
            await server.start()
        except OSError as exc:
            where = server.unix_socket or "the requested TCP address"
            raise click.ClickException(f"cannot listen on {where}: {exc.strerror or exc}") from exc
        return f"{READY_PREFIX}{server.address}"

    await serve_until_signal(start, server.stop, name="clawstack.llm.fake")
