"""``claw gateway``: run the agent gateway (the OpenClaw-compatible WebSocket protocol) in the foreground."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import click

from clawstack.cli._serving import configure_logging, serve_until_signal
from clawstack.gateway.config import GatewayConfig, load_config
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.server import GatewayServer

__all__ = ["READY_PREFIX", "gateway"]

_log = logging.getLogger("clawstack.gateway")

READY_PREFIX = "gateway listening on "
"""The readiness line on stdout is this prefix followed by ``ws://HOST:PORT``."""


@click.group(name="gateway")
def gateway() -> None:
    """The agent gateway: sessions, lanes, the agent loop and the WebSocket protocol (docs/gateway-protocol.md)."""


@gateway.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway config, one JSON5 file with OpenClaw's key names (see docs/gateway-config.md).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where sessions, transcripts and runs are kept (default: a 'gateway-data' directory beside the config).",
)
@click.option(
    "--plugins",
    "plugin_paths",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A plugin directory, or a directory of plugin directories, to load besides plugins.load.paths (repeatable).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Logging on stderr (never message content or secrets).",
)
def serve(config_path: Path, data_dir: Path | None, plugin_paths: tuple[Path, ...], log_level: str) -> None:
    """Serve the gateway in the foreground until SIGTERM or SIGINT.

    Once listening it prints one line on stdout, 'gateway listening on ws://HOST:PORT', where HOST:PORT come from
    gateway.bind and gateway.port (port 0 picks a free port, which the line shows). Runs a previous process left
    in flight are recorded as interrupted at start-up. Plugins that fail to load are logged on stderr with their
    error code; the gateway still starts.
    """
    try:
        config = load_config(config_path)
    except GatewayError as exc:
        raise click.ClickException(exc.message) from exc
    configure_logging(log_level)
    directory = data_dir if data_dir is not None else config_path.resolve().parent / "gateway-data"
    asyncio.run(_serve(config, directory, plugin_paths))


async def _serve(config: GatewayConfig, data_dir: Path, plugin_paths: Sequence[Path] = ()) -> None:
    server = GatewayServer(config, data_dir=data_dir, plugin_paths=plugin_paths)

    async def start() -> str:
        try:
            await server.start()
        except OSError as exc:
            raise click.ClickException(f"cannot listen: {exc.strerror or exc}") from exc
        except GatewayError as exc:
            raise click.ClickException(exc.message) from exc
        for plugin in server.plugins:
            if plugin.state == "failed":
                error = plugin.error or {}
                _log.error(
                    "plugin %s failed: [%s] %s", plugin.id, error.get("code", "plugin_error"), error.get("message", "")
                )
        return f"{READY_PREFIX}{server.url}"

    await serve_until_signal(start, server.stop, name="clawstack.gateway")
