"""``claw runs``: the supervisor (``serve``) and the operator commands that talk to it over its socket."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from clawstack.cli._runs_common import SOCKET_OPTION, checked, client_for, socket_dir_for
from clawstack.cli._runs_home import home
from clawstack.cli._runs_view import runs_table, status_block
from clawstack.cli._serving import configure_logging, serve_until_signal
from clawstack.cli.pod import POD_OPTION
from clawstack.common.clock import SystemClock
from clawstack.common.errors import ClawError
from clawstack.common.files import ensure_private_dir
from clawstack.pod.artifacts import PodPaths
from clawstack.runs.client import RunsClient, load_spec
from clawstack.runs.listing import MAX_LIMIT, STATES
from clawstack.runs.server import RunsServer, parse_timeout
from clawstack.runs.supervisor import Supervisor

if TYPE_CHECKING:
    from clawstack.runs.backends.base import Backend

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")


@click.group(name="runs")
def runs() -> None:
    """The run supervisor: one isolated one-shot worker per unit of work (see docs/runs.md)."""


@runs.command()
@POD_OPTION
@SOCKET_OPTION
@click.option("--allow-uid", "allow_uids", type=int, multiple=True, help="Another UID that may use the socket.")
@click.option("--callback-origin", default=None, help="Where run callbacks go (scheme://host[:port]).")
@click.option(
    "--callback-path",
    default="/runs/{installation}/{run_id}",
    show_default=True,
    help="Callback path template; {installation} and {run_id} are filled in.",
)
@click.option("--heartbeat", default="60s", show_default=True, help="Heartbeat callback interval.")
@click.option("--remove-orphans", is_flag=True, help="Remove workers of this pod that the ledger does not know.")
@click.option(
    "--allow-no-isolation",
    is_flag=True,
    help="Run workers without a sandbox where bubblewrap is missing (status says isolation: none).",
)
def serve(
    pod_dir: Path,
    socket_dir: Path | None,
    allow_uids: tuple[int, ...],
    callback_origin: str | None,
    callback_path: str,
    heartbeat: str,
    remove_orphans: bool,
    allow_no_isolation: bool,
) -> None:
    """Run the supervisor in the foreground until SIGTERM or SIGINT. The backend is the one the pod declares
    (x-claw.backend: local sandboxes, or one Docker Compose project per run)."""
    configure_logging("info")
    paths = PodPaths(pod_dir.resolve())
    directory = socket_dir_for(pod_dir, socket_dir)
    if socket_dir is None:
        ensure_private_dir(directory)
    backend = _backend(paths, allow_no_isolation=allow_no_isolation)
    supervisor = Supervisor(
        paths.pod,
        backend,
        callback_origin=callback_origin,
        callback_path=callback_path,
        heartbeat_s=parse_timeout(heartbeat) or 60.0,
    )
    server = RunsServer(supervisor, directory, allowed_uids=allow_uids)

    async def start() -> str:
        try:
            await server.start(remove_orphans=remove_orphans)
        except ClawError as exc:
            raise click.ClickException(exc.message) from exc
        return f"runs listening: unix:{server.socket_path}"

    asyncio.run(serve_until_signal(start, server.stop, name="clawstack.runs"))


def _backend(paths: PodPaths, *, allow_no_isolation: bool = False) -> Backend:
    """The backend the compiled pod declares (its workers carry the pod's labels)."""
    from clawstack.runs.backends import backend_for

    try:
        return backend_for(paths, allow_no_isolation=allow_no_isolation)
    except ClawError as exc:
        raise click.ClickException(exc.message) from exc


def _print_status(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    click.echo(status_block(status))


@runs.command()
@click.argument("installation")
@click.argument("run_id")
@click.option("--spec", "spec_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--authority-ttl", default="30m", show_default=True, help="How long the run's authority lasts.")
@click.option("--generation", default=1, show_default=True, type=int)
@click.option("--credential-env", default=None, help="Read the callback credential from this variable.")
@POD_OPTION
@SOCKET_OPTION
@JSON_OPTION
def launch(
    installation: str,
    run_id: str,
    spec_path: Path,
    authority_ttl: str,
    generation: int,
    credential_env: str | None,
    pod_dir: Path,
    socket_dir: Path | None,
    as_json: bool,
) -> None:
    """Launch a run from a spec file (for operators and tests)."""
    ttl = parse_timeout(authority_ttl) or 1800.0
    credential = os.environ.get(credential_env) if credential_env else None
    if credential_env and not credential:
        raise click.ClickException(f"{credential_env} is not set")
    with client_for(pod_dir, socket_dir) as client:
        status = checked(
            lambda: client.launch(
                installation,
                run_id,
                load_spec(spec_path),
                generation=generation,
                authority_expires_at=SystemClock().now() + timedelta(seconds=ttl),
                credential=credential,
            )
        )
    _print_status(status, as_json)


@runs.command()
@click.argument("installation")
@click.argument("run_id")
@click.option("--wait", type=click.Choice(["running", "revoked", "stopped", "failed"]), default=None)
@click.option("--timeout", default="60s", show_default=True)
@POD_OPTION
@SOCKET_OPTION
@JSON_OPTION
def status(
    installation: str,
    run_id: str,
    wait: str | None,
    timeout: str,
    pod_dir: Path,
    socket_dir: Path | None,
    as_json: bool,
) -> None:
    """Show a run's status (optionally waiting for a state)."""
    with client_for(pod_dir, socket_dir) as client:
        result = checked(
            lambda: client.status(installation, run_id, wait=wait, timeout_s=parse_timeout(timeout) if wait else None)
        )
    _print_status(result, as_json)


def _list_runs(client: RunsClient, installation: str | None, state: str | None, limit: int | None) -> list[Any]:
    """Every matching run, newest first, following ``next_cursor`` until the last page or ``limit`` runs."""
    shown: list[Any] = []
    cursor: str | None = None
    while True:
        want = MAX_LIMIT if limit is None else min(MAX_LIMIT, limit - len(shown))
        page = client.list_runs(installation=installation, state=state, limit=want, cursor=cursor)
        shown.extend(page["runs"])
        cursor = page["next_cursor"]
        if cursor is None or (limit is not None and len(shown) >= limit):
            return shown


@runs.command(name="ls")
@click.option("--installation", default=None, help="Only this installation's runs.")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only runs in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most this many runs (default all).")
@click.option("--watch", is_flag=True, help="Redraw the table about every second until Ctrl-C.")
@POD_OPTION
@SOCKET_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the runs' status objects as a JSON array.")
def list_command(
    installation: str | None,
    state: str | None,
    limit: int | None,
    watch: bool,
    pod_dir: Path,
    socket_dir: Path | None,
    as_json: bool,
) -> None:
    """List runs, newest first: installation, run, state, failure, age (since accepted) and runtime."""
    if watch and as_json:
        raise click.UsageError("--watch draws a table; it cannot be combined with --json")
    with client_for(pod_dir, socket_dir) as client:

        def matching() -> list[Any]:
            return checked(lambda: _list_runs(client, installation, state, limit))  # type: ignore[no-any-return]

        def table() -> Table:
            return runs_table(matching(), SystemClock().now())

        if as_json:
            click.echo(json.dumps(matching(), indent=2))
        elif not watch:
            # Off a terminal (a pipe, a file), never cut a column to 80 characters.
            Console(width=None if sys.stdout.isatty() else 100_000).print(table())
        else:
            try:
                with Live(table(), auto_refresh=False) as live:
                    while True:
                        time.sleep(1.0)
                        live.update(table(), refresh=True)
            except KeyboardInterrupt:
                return  # Ctrl-C is how a watch ends: exit 0


@runs.command()
@click.argument("installation")
@click.argument("run_id")
@click.option("--generation", required=True, type=int)
@click.option("--wait", type=click.Choice(["running", "revoked", "stopped", "failed"]), default=None)
@click.option("--timeout", default="60s", show_default=True)
@POD_OPTION
@SOCKET_OPTION
@JSON_OPTION
def cancel(
    installation: str,
    run_id: str,
    generation: int,
    wait: str | None,
    timeout: str,
    pod_dir: Path,
    socket_dir: Path | None,
    as_json: bool,
) -> None:
    """Cancel a run (a never-accepted key is tombstoned)."""
    with client_for(pod_dir, socket_dir) as client:
        result = checked(
            lambda: client.cancel(
                installation,
                run_id,
                generation=generation,
                wait=wait,
                timeout_s=parse_timeout(timeout) if wait else None,
            )
        )
    if result.get("tombstone"):
        click.echo(f"{installation}/{run_id} was never accepted; it is tombstoned")
        return
    _print_status(result, as_json)


@runs.command()
@click.argument("installation")
@click.argument("run_id")
@POD_OPTION
@SOCKET_OPTION
def result(installation: str, run_id: str, pod_dir: Path, socket_dir: Path | None) -> None:
    """Print a run's answer."""
    with client_for(pod_dir, socket_dir) as client:
        text, truncated = checked(lambda: client.result(installation, run_id))
    click.echo(text)
    if truncated:
        click.echo("(the answer was cut at the template's max-result-bytes)", err=True)


@runs.command()
@POD_OPTION
@click.option("--remove-orphans", is_flag=True, help="Remove workers the ledger does not know (needs the pod lock).")
def doctor(pod_dir: Path, remove_orphans: bool) -> None:
    """Check the ledger, the templates and the workers; report plan sign-in state."""
    from clawstack.pod.artifacts import list_templates

    paths = PodPaths(pod_dir.resolve())
    problems = 0
    listing = list_templates(paths)
    click.echo(
        f"templates: {len(listing['templates'])} verified"
        + (f", INVALID: {', '.join(listing['invalid'])} (run claw up)" if listing["invalid"] else "")
    )
    problems += len(listing["invalid"])
    backend = _backend(paths)
    try:
        problems += _doctor_workers(paths, backend, remove_orphans=remove_orphans)
    finally:
        backend.close()
    problems += _doctor_families(paths)
    _doctor_signins(paths)
    if problems:
        raise click.ClickException(f"{problems} problem(s) found")


SIGNIN_COMMANDS = {
    "local": "claw proxy auth login chatgpt --pod {pod}",
    "compose": "claw compose --pod {pod} run --rm -p 127.0.0.1:1455:1455 cllama auth login chatgpt --listen 0.0.0.0:1455",
}


def _doctor_signins(paths: PodPaths) -> None:
    """Show each plan sign-in's state, with the command that signs in on this pod's backend when one is needed."""
    from clawstack.pod.artifacts import read_pod_manifest
    from clawstack.proxy.errors import ProxyError
    from clawstack.runs.proxylink import ProxyLink

    try:
        states = asyncio.run(ProxyLink(paths).subscriptions())["subscriptions"]
    except ProxyError as exc:
        if exc.code == "subscriptions_unsupported":
            click.echo("plan sign-in: unsupported (this pod's proxy has no plan routes)")
        else:
            click.echo(f"plan sign-in: unknown: the proxy did not answer ({exc.code}); start it with claw up -d")
        return
    try:
        backend = read_pod_manifest(paths).get("backend", "local")
    except ClawError:
        backend = "local"
    for state in states:
        account = f" ({state['account']})" if state.get("account") else ""
        resting = f", resting until {state['limited_until']}" if state.get("limited_until") else ""
        line = f"plan sign-in: {state.get('provider')}: {state.get('state')}{account}{resting}"
        if state.get("state") != "signed_in":
            command = SIGNIN_COMMANDS.get(backend, SIGNIN_COMMANDS["local"]).format(pod=paths.pod)
            line += f"; sign in with: {command}"
        click.echo(line)


def _doctor_families(paths: PodPaths) -> int:
    """Report family drift: compiled entries whose family now resolves elsewhere; the number drifted."""
    from clawstack.pod.drift import family_drift

    try:
        in_use, drifted = family_drift(paths)
    except ClawError as exc:
        click.echo(f"model families: cannot read the pod's family table: {exc.message}")
        return 1
    except OSError as exc:
        click.echo(f"model families: cannot read the pod file: {exc.strerror}")
        return 1
    if not drifted:
        click.echo(f"model families: {in_use} chain entr{'y' if in_use == 1 else 'ies'} from a family, no drift")
        return 0
    click.echo(f"model families: {len(drifted)} drifted (run claw up to recompile with the current resolution)")
    for item in drifted:
        click.echo(f"  {item.describe()}")
    return len(drifted)


def _doctor_workers(paths: PodPaths, backend: Backend, *, remove_orphans: bool) -> int:
    """Report the ledger's unfinished runs and the orphaned workers (removing them if asked); the problems left."""
    from clawstack.pod.lock import PodLock
    from clawstack.runs.ledger import Ledger

    if (paths.runs / "ledger.sqlite3").exists():
        ledger = Ledger(paths.runs)
        ledger.open()
        try:
            unfinished = ledger.unfinished()
            click.echo(f"ledger: {ledger.count()} runs, {len(unfinished)} unfinished")
            for record in unfinished:
                pending = f" ({record.pending})" if record.pending else ""
                click.echo(f"  {record.installation}/{record.run_id}: {record.state}{pending}")
            workers = asyncio.run(backend.list_workers())
            orphans = [w for w in workers if ledger.get(w.installation, w.run_id) is None]
        finally:
            ledger.close()
    else:
        click.echo("ledger: none yet (no run was ever launched)")
        orphans = list(asyncio.run(backend.list_workers()))
    click.echo(f"orphaned workers: {len(orphans)}")
    for orphan in orphans:
        click.echo(f"  {orphan.installation}/{orphan.run_id}")
    if orphans and remove_orphans:
        lock = PodLock(paths.lock, holder="claw runs doctor")
        try:
            lock.acquire(inheritable=True)  # a compose down it runs keeps writer authority until it exits
        except ClawError as exc:  # the supervisor (or claw up/down) holds the pod: it removes orphans itself
            raise click.ClickException(
                f"{exc.code}: {exc.message}; orphans are removed by the supervisor's start "
                "(claw runs serve --remove-orphans) or by this command while nothing holds the pod"
            ) from exc
        try:
            for orphan in orphans:
                asyncio.run(backend.remove(orphan, writer_lock_fd=lock.fd))
                click.echo(f"  removed {orphan.installation}/{orphan.run_id}")
        finally:
            lock.release()
        return 0
    return len(orphans)


runs.add_command(home)
