"""``claw gateway``: run the agent gateway (the OpenClaw-compatible WebSocket protocol) in the foreground."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import click

from clawstack import __version__
from clawstack.cli._serving import configure_logging, serve_until_signal
from clawstack.common.ids import new_uuid
from clawstack.gateway.config import GatewayConfig, default_state_dir, load_config
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.protocol import PROTOCOL_VERSION
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
    help=(
        "The gateway's state directory: sessions, transcripts, runs, and the workspaces no config key places"
        " (default: one directory per config file, $CLAW_GATEWAY_HOME/<name>-<hash of the config's path>, where"
        " $CLAW_GATEWAY_HOME defaults to $XDG_STATE_HOME/clawstack/gateway or ~/.local/state/clawstack/gateway)."
    ),
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
    """Serve the gateway in the foreground until SIGTERM or SIGINT; SIGHUP reloads the config's operators.

    Once listening it prints one line on stdout, 'gateway listening on ws://HOST:PORT', where HOST:PORT come from
    gateway.bind and gateway.port (port 0 picks a free port, which the line shows). Runs a previous process left
    in flight are recorded as interrupted at start-up. Plugins that fail to load are logged on stderr with their
    error code; the gateway still starts.

    State is kept per gateway: without --data-dir, each config file gets its own state directory (see --data-dir),
    so two gateways whose configs share a folder never collide; one config file serves one gateway at a time.
    Config keys an OpenClaw config may carry that have no effect here are named in one warning on stderr.

    On SIGHUP the config file is read again and its operators (roles, channel identity links) and channels'
    allowFrom take effect at once, revoking work retained under authority they take away; other changed keys are
    named in a warning and wait for a restart. A config that no longer loads is logged and changes nothing.
    """
    directory = data_dir if data_dir is not None else default_state_dir(config_path)
    try:
        config = load_config(config_path, state_dir=directory)
    except GatewayError as exc:
        raise click.ClickException(exc.message) from exc
    configure_logging(log_level)
    if config.ignored_keys:
        _log.warning(
            "config keys with no effect in claw gateway (see docs/gateway-config.md): %s",
            ", ".join(config.ignored_keys),
        )
    _log.info("state directory: %s", directory)
    asyncio.run(_serve(config, directory, plugin_paths, config_path=config_path))


async def _serve(
    config: GatewayConfig, data_dir: Path, plugin_paths: Sequence[Path] = (), *, config_path: Path | None = None
) -> None:
    server = GatewayServer(config, data_dir=data_dir, plugin_paths=plugin_paths)

    def reload() -> None:
        assert config_path is not None
        try:
            fresh = load_config(config_path, state_dir=data_dir)
        except GatewayError as exc:
            _log.error("config reload failed, nothing changed: %s", exc.message)
            return
        pending = server.reload(fresh)
        _log.info("config reloaded: operators and channel allowFrom applied")
        if pending:
            _log.warning("config keys changed that take effect after a restart: %s", ", ".join(pending))

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
        if config_path is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        return f"{READY_PREFIX}{server.url}"

    try:
        await serve_until_signal(start, server.stop, name="clawstack.gateway")
    finally:
        if config_path is not None:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


@gateway.command()
@click.argument("message")
@click.option("--url", default="ws://127.0.0.1:18789", show_default=True, help="The gateway's WebSocket address.")
@click.option("--token", envvar="CLAW_GATEWAY_TOKEN", help="The gateway token (default: $CLAW_GATEWAY_TOKEN).")
@click.option("--password", envvar="CLAW_GATEWAY_PASSWORD", help="The gateway password, for password auth.")
@click.option("--session", "session_key", default="agent:main:main", show_default=True, help="The session key.")
@click.option(
    "--follow",
    type=click.FloatRange(min=0),
    default=0.0,
    help="After the answer, keep printing what is announced on the session for this many seconds.",
)
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True, help="Seconds to wait.")
def chat(
    message: str, url: str, token: str | None, password: str | None, session_key: str, follow: float, timeout: float
) -> None:
    """Send MESSAGE on a session of a running gateway and print the answer as it streams.

    A message '/name args' runs a plugin command. Background work a plugin starts can announce its answer on the
    session later; --follow keeps listening for those announcements.
    """
    if not token and not password:
        raise click.UsageError("give --token (or $CLAW_GATEWAY_TOKEN) or --password")
    auth: dict[str, str] = {"token": token} if token else {"password": password or ""}
    code = asyncio.run(_chat(url, auth, session_key, message, follow, timeout))
    raise SystemExit(code)


async def _chat(url: str, auth: dict[str, str], key: str, message: str, follow: float, deadline_s: float) -> int:
    from clawstack.connect.transcript import message_text  # a client's helper: only this command needs it

    run_id = new_uuid()
    streamed = False
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=2)) as ws,
        ):
            async with asyncio.timeout(10):
                await ws.receive_json()  # connect.challenge
            await ws.send_json(
                {
                    "type": "req",
                    "id": "connect",
                    "method": "connect",
                    "params": {
                        "minProtocol": PROTOCOL_VERSION,
                        "maxProtocol": PROTOCOL_VERSION,
                        "client": {"id": "cli", "mode": "cli", "version": __version__, "platform": sys.platform},
                        "role": "operator",
                        "scopes": ["operator.read", "operator.write", "operator.admin"],
                        "caps": [],
                        "auth": auth,
                    },
                }
            )
            send = {"sessionKey": key, "message": message, "idempotencyKey": run_id}
            async with asyncio.timeout(deadline_s):
                async for frame in _frames(ws):
                    if frame.get("type") == "res":
                        if not frame.get("ok"):
                            error = frame.get("error") or {}
                            click.echo(f"error: {error.get('message', 'refused')}", err=True)
                            return 1
                        if frame.get("id") == "connect":
                            await ws.send_json({"type": "req", "id": "send", "method": "chat.send", "params": send})
                        continue
                    payload = frame.get("payload") or {}
                    if frame.get("event") != "chat" or payload.get("runId") != run_id:
                        continue
                    state = payload.get("state")
                    if state == "delta":
                        streamed = True
                        click.echo(payload.get("deltaText", ""), nl=False)
                    elif state == "final":
                        click.echo("" if streamed else message_text(payload.get("message")))
                        break
                    elif state in ("error", "aborted"):
                        click.echo(f"\n{state}: {payload.get('errorMessage', '')}", err=True)
                        return 1
            if follow > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(follow):
                        async for frame in _frames(ws):
                            payload = frame.get("payload") or {}
                            if frame.get("event") == "chat" and payload.get("state") == "final":
                                click.echo(message_text(payload.get("message")))
    except TimeoutError:
        click.echo("error: no answer in time", err=True)
        return 1
    except (aiohttp.ClientError, OSError) as exc:
        click.echo(f"error: cannot reach the gateway at {url}: {exc}", err=True)
        return 1
    return 0


async def _frames(ws: aiohttp.ClientWebSocketResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON object frames the gateway sends, until the socket closes."""
    async for msg in ws:
        if msg.type is not aiohttp.WSMsgType.TEXT:
            break
        frame = json.loads(msg.data)
        if isinstance(frame, dict):
            yield frame
