"""``claw proxy``: the model proxy that holds every credential and fences each run's identity."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from clawstack.cli._proxy_auth import auth
from clawstack.cli._serving import configure_logging, serve_until_signal
from clawstack.proxy.config import ProxyConfig, load_config
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.server import ProxyServer

READY_PREFIX = "proxy listening: "
CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The proxy's configuration file (JSON or YAML; see docs/proxy.md).",
)


def _load(config_path: Path) -> ProxyConfig:
    try:
        return load_config(config_path)
    except ProxyError as exc:
        raise click.ClickException(exc.message) from exc


@click.group(name="proxy")
def proxy() -> None:
    """The model proxy: per-run identities, the durable revocation fence, model chains and managed tools."""


@proxy.command()
@CONFIG_OPTION
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Logging on stderr (never a credential or message content).",
)
def serve(config_path: Path, log_level: str) -> None:
    """Serve the worker and operator APIs in the foreground until SIGTERM or SIGINT.

    Once listening it prints one line on stdout: 'proxy listening: worker=URL operator=ADDRESS'. The operator
    token is read from the variable named by operator_token_env (default CLAW_PROXY_OPERATOR_TOKEN).
    """
    configure_logging(log_level)
    run_proxy(_load(config_path))


def run_proxy(config: ProxyConfig) -> None:
    """Serve ``config``'s proxy in the foreground; print the readiness line; stop on SIGTERM or SIGINT."""
    try:
        server = ProxyServer(config)
    except ProxyError as exc:
        raise click.ClickException(exc.message) from exc

    async def start() -> str:
        try:
            await server.start()
        except (ProxyError, OSError) as exc:
            raise click.ClickException(f"cannot start the proxy: {getattr(exc, 'message', exc)}") from exc
        worker = server.worker_base_url if server.worker_port is not None else f"unix:{config.worker.unix_socket}"
        operator = f"unix:{config.operator.unix_socket}" if config.operator.unix_socket else server.operator_base_url
        return f"{READY_PREFIX}worker={worker} operator={operator}"

    asyncio.run(serve_until_signal(start, server.stop, name="clawstack.proxy"))


@proxy.command("self-test")
@CONFIG_OPTION
def self_test(config_path: Path) -> None:
    """Run the revocation self-test against a running proxy: create, revoke, prove refusal and durability."""
    config = _load(config_path)
    token = config.resolve_env(config.operator_token_env)
    if token is None:
        raise click.ClickException(f"{config.operator_token_env} is not set")
    if config.worker.port in (None, 0):
        raise click.ClickException("the self-test needs the worker API on a fixed TCP port")

    from clawstack.proxy.client import ProxyOperatorClient  # the client is not needed to serve

    async def run() -> None:
        client = (
            ProxyOperatorClient(token=token, unix_socket=config.operator.unix_socket)
            if config.operator.unix_socket
            else ProxyOperatorClient(token=token, base_url=f"http://{config.operator.host}:{config.operator.port}")
        )
        async with client:
            report = await client.self_test(worker_base_url=f"http://{config.worker.host}:{config.worker.port}/v1")
        click.echo(f"revocation self-test passed in {report.duration_ms:.1f} ms (identity {report.identity_id})")

    try:
        asyncio.run(run())
    except ProxyError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc


proxy.add_command(auth)
