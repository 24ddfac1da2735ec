"""``claw proxy auth login|status|logout``: the operator's plan sign-ins, kept in the proxy's auth directory."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from clawstack.common.clock import SystemClock
from clawstack.proxy.config import PlanRoute, ProxyConfig, load_config
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.plan import PROVIDERS, AuthStore, login, plan_ssl_context
from clawstack.proxy.plan.chatgpt import DEFAULT_LISTEN
from clawstack.proxy.plan.tokens import signin_command

_CONFIG = click.option(
    "--config",
    "config_path",
    envvar="CLAW_PROXY_CONFIG",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The proxy's configuration file (default: $CLAW_PROXY_CONFIG, else the pod's .claw-runtime/proxy/proxy.json).",
)
_POD = click.option(
    "--pod",
    "pod_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The pod directory whose proxy config to use when --config and $CLAW_PROXY_CONFIG are unset.",
)
_PROVIDER = click.argument("provider", metavar="PROVIDER")


def _check_provider(provider: str) -> str:
    if provider not in PROVIDERS:
        raise click.UsageError(f"unknown plan provider {provider!r}; supported providers: {', '.join(PROVIDERS)}")
    return provider


def _config(config_path: Path | None, pod_dir: Path) -> ProxyConfig:
    if config_path is None:
        from clawstack.pod.artifacts import PodPaths  # the pod compiler is loaded only to find a pod's config

        config_path = PodPaths(pod_dir.resolve()).proxy_config
    path = config_path
    if not path.exists():
        raise click.ClickException(f"no proxy config at {path}: run claw up first, or pass --config FILE")
    try:
        return load_config(path)
    except ProxyError as exc:
        raise click.ClickException(exc.message) from exc


def _store(config: ProxyConfig) -> AuthStore:
    if config.auth_dir is None:
        raise click.ClickException("this proxy has no plan routes: its config sets no auth_dir")
    return AuthStore(Path(config.auth_dir))


def _route(config: ProxyConfig, provider: str) -> PlanRoute:
    for name, route in config.plan_routes.items():
        if name == provider:
            return route
    return PlanRoute()


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (for example 127.0.0.1:1455)", param_hint="--listen")
    return host, int(port)


@click.group(name="auth")
def auth() -> None:
    """The operator's plan sign-ins (chatgpt/<model> routes). No agent signs in; workers never see the store."""


@auth.command("login")
@_PROVIDER
@click.option(
    "--listen",
    default=f"{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}",
    show_default=True,
    help="HOST:PORT of the callback listener (0.0.0.0:1455 inside a container; port 0 picks a free port). "
    "The browser always returns to localhost:<port>.",
)
@_CONFIG
@_POD
def login_command(provider: str, listen: str, config_path: Path | None, pod_dir: Path) -> None:
    """Sign in to PROVIDER's plan in a browser on this machine.

    Prints a URL; open it, sign in, and the command finishes when the browser returns to the listener. A running
    proxy uses the new sign-in from its next request.
    """
    provider = _check_provider(provider)
    address = _listen(listen)
    config = _config(config_path, pod_dir)
    store = _store(config)
    route = _route(config, provider)

    def show(url: str) -> None:
        click.echo(f"Open this URL in a browser on this machine and sign in to {provider}:")
        click.echo(url)
        sys.stdout.flush()

    try:
        context = plan_ssl_context(route)
        signin = asyncio.run(
            login(store, provider=provider, issuer=route.issuer, listen=address, ssl_context=context, print_url=show)
        )
    except ProxyError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc
    except OSError as exc:  # an unreadable ca_file
        raise click.ClickException(f"cannot load the plan route's CA bundle: {exc.strerror or exc}") from exc
    who = signin.account_email or signin.account_id or "an unnamed account"
    click.echo(f"signed in to {provider} as {who}")


def _status_line(report: dict[str, str]) -> str:
    provider, state = report["provider"], report["state"]
    if state == "signed_in":
        line = f"{provider}: signed_in"
        if "account" in report:
            line += f" ({report['account']})"
        if "limited_until" in report:
            line += f", usage limit resting until {report['limited_until']}"
        return line
    if state == "signin_required":
        return f"{provider}: signin_required — the sign-in expired; sign in again with: {signin_command(provider)}"
    return f"{provider}: not_signed_in — sign in with: {signin_command(provider)}"


@auth.command("status")
@_CONFIG
@_POD
@click.option("--json", "as_json", is_flag=True, help='Print {"subscriptions": [...]} as GET /v1/subscriptions does.')
def status_command(config_path: Path | None, pod_dir: Path, as_json: bool) -> None:
    """Show each plan provider's sign-in state (never a token)."""
    store = _store(_config(config_path, pod_dir))
    now = SystemClock().now()
    try:
        reports = [store.state(provider, now) for provider in PROVIDERS]
    except ProxyError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc
    if as_json:
        click.echo(json.dumps({"subscriptions": reports}))
        return
    for report in reports:
        click.echo(_status_line(report))


@auth.command("logout")
@_PROVIDER
@_CONFIG
@_POD
def logout_command(provider: str, config_path: Path | None, pod_dir: Path) -> None:
    """Sign out of PROVIDER: delete its sign-in record. A running proxy stops using it from its next request."""
    provider = _check_provider(provider)
    store = _store(_config(config_path, pod_dir))
    try:
        removed = store.remove(provider)
    except ProxyError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc
    if removed:
        click.echo(f"signed out of {provider}: removed its sign-in")
    else:
        click.echo(f"{provider}: not signed in; nothing to remove")


__all__ = ["auth"]
