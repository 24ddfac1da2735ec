"""``claw up`` and ``claw down``: compile a pod and start or stop its long-lived part (the proxy)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from clawstack.cli._serving import configure_logging
from clawstack.cli.proxy import run_proxy
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.errors import PodError
from clawstack.pod.up import compile_only, compose_project_argv, down, up
from clawstack.proxy.config import load_config
from clawstack.proxy.errors import ProxyError
from clawstack.runs.ledger import count_unfinished
from clawstack.runs.teardown import cancel_unfinished, finish_after_proxy_stopped


def _unfinished(paths: PodPaths) -> int:
    return count_unfinished(paths.runs)


def _cancel_runs(paths: PodPaths, writer_lock_fd: int | None) -> list[str]:
    """Cancel every unfinished run before the pod stops (claw down)."""
    if count_unfinished(paths.runs) == 0:
        return []
    from clawstack.runs.backends import backend_for

    backend = backend_for(paths)
    try:
        outcome = asyncio.run(cancel_unfinished(paths, backend, writer_lock_fd=writer_lock_fd))
    finally:
        backend.close()
    for name in outcome.revoked:
        click.echo(f"cancelled {name} (revoked)")
    if outcome.stuck:
        raise PodError(
            f"workers could not be removed for {', '.join(outcome.stuck)}; their runs stay unfinished for recovery",
            code="teardown_failed",
        )
    return outcome.awaiting_proxy_stop


def _proxy_stopped(paths: PodPaths, names: list[str]) -> None:
    finish_after_proxy_stopped(paths, names)
    for name in names:
        click.echo(f"cancelled {name} (revocation_proof: proxy_stopped)")


POD_OPTION = click.option(
    "--pod",
    "pod_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The pod directory (holding claw-pod.yml).",
)
"""``--pod DIR``, shared by every command that works on a pod."""


@click.command(name="up")
@POD_OPTION
@click.option("-d", "--detach", is_flag=True, help="Start the pod's proxy in the background and return once healthy.")
@click.option("--check", is_flag=True, help="Only load and compile the pod; write and start nothing.")
def up_command(pod_dir: Path, detach: bool, check: bool) -> None:
    """Compile the pod's per-run templates and start its long-lived part.

    Writes .claw-runs/templates/<service>.json and the proxy's private context, then runs the pod's proxy: in
    the foreground until SIGTERM or SIGINT, or with -d in the background. Refuses while the pod lock is held
    (a running supervisor, another claw up or claw down). An unchanged pod restarts nothing.
    """
    try:
        if check:
            compiled = compile_only(pod_dir)
            for template in compiled.templates:
                click.echo(f"{template.name}: {template.id} ({template.document['profile']})")
            return
        result = up(pod_dir, detach=detach, unfinished_runs=_unfinished)
    except PodError as exc:
        raise click.ClickException(exc.message) from exc
    for template in result.compiled.templates:
        click.echo(f"template {template.name}: {template.id}")
    for warning in result.compiled.spec.warnings:
        click.echo(f"warning: {warning}", err=True)
    if detach:
        state = "started" if result.changed else "unchanged, still running"
        where = (
            f"container {result.proxy_container[:12]}"
            if result.proxy_container is not None
            else f"pid {result.proxy_pid}"
        )
        click.echo(f"proxy {state} ({where})")
        return
    if result.compiled.spec.backend == "compose":
        click.echo("compose project written; run claw up -d to start it")
        return
    configure_logging("info")
    try:
        config = load_config(PodPaths(pod_dir.resolve()).proxy_config)
    except ProxyError as exc:
        raise click.ClickException(exc.message) from exc
    run_proxy(config)


@click.command(name="down")
@POD_OPTION
def down_command(pod_dir: Path) -> None:
    """Stop the pod's long-lived part. Task homes and the revocation ledger stay in place."""
    try:
        stopped = down(pod_dir, cancel_runs=_cancel_runs, after_proxy_stopped=_proxy_stopped)
    except PodError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo("stopped" if stopped else "nothing was running")


@click.command(name="compose", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@POD_OPTION
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def compose_command(pod_dir: Path, args: tuple[str, ...]) -> None:
    """Run ``docker compose ARGS`` on the pod's own project (a compose pod brought up with claw up), for example
    ``claw compose run --rm -p 127.0.0.1:1455:1455 cllama auth login chatgpt --listen 0.0.0.0:1455``."""
    import os
    import subprocess

    from clawstack.pod.artifacts import OPERATOR_TOKEN_ENV, read_pod_manifest

    paths = PodPaths(pod_dir.resolve())
    if not paths.compose_file.exists():
        raise click.ClickException("this pod has no compose project: claw compose needs a compose pod after claw up")
    try:
        pod = read_pod_manifest(paths)["pod"]
    except PodError as exc:
        raise click.ClickException(exc.message) from exc
    env = {k: v for k, v in os.environ.items() if k != OPERATOR_TOKEN_ENV}
    argv = ["docker", "compose", *compose_project_argv(pod, paths), *args]
    raise SystemExit(subprocess.call(argv, env=env))  # noqa: S603 (docker from PATH, the operator's own arguments)
