"""``claw runs home status|rm|deliverables|fetch``: a pod's task homes through its supervisor's socket."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import click

from clawstack.cli._runs_common import SOCKET_OPTION, checked, client_for
from clawstack.cli.pod import POD_OPTION


@click.group(name="home")
def home() -> None:
    """Inspect and delete task homes (GET and DELETE /v1/homes/{installation}/{home})."""


@home.command()
@click.argument("installation")
@click.argument("home_id", metavar="HOME")
@POD_OPTION
@SOCKET_OPTION
def status(installation: str, home_id: str, pod_dir: Path, socket_dir: Path | None) -> None:
    """Whether the home exists and which run reserves it."""
    with client_for(pod_dir, socket_dir) as client:
        click.echo(json.dumps(checked(lambda: client.home(installation, home_id)), indent=2))


@home.command()
@click.argument("installation")
@click.argument("home_id", metavar="HOME")
@POD_OPTION
@SOCKET_OPTION
def rm(installation: str, home_id: str, pod_dir: Path, socket_dir: Path | None) -> None:
    """Delete the home, which resets its task: the next run starts empty, with a new session. Refused while a run
    reserves it."""
    with client_for(pod_dir, socket_dir) as client:
        checked(lambda: client.delete_home(installation, home_id))
    click.echo(f"deleted home {installation}/{home_id}")


@home.command()
@click.argument("installation")
@click.argument("home_id", metavar="HOME")
@POD_OPTION
@SOCKET_OPTION
def deliverables(installation: str, home_id: str, pod_dir: Path, socket_dir: Path | None) -> None:
    """List the files the home's worker left for its requester."""
    with client_for(pod_dir, socket_dir) as client:
        click.echo(json.dumps(checked(lambda: client.deliverables(installation, home_id)), indent=2))


@home.command()
@click.argument("installation")
@click.argument("home_id", metavar="HOME")
@click.argument("name")
@click.option("--sha256", default=None, help="Refuse (deliverable_changed) unless the file still has this digest.")
@POD_OPTION
@SOCKET_OPTION
def fetch(
    installation: str, home_id: str, name: str, sha256: str | None, pod_dir: Path, socket_dir: Path | None
) -> None:
    """Write one deliverable's bytes to standard output."""
    with client_for(pod_dir, socket_dir) as client:
        body = checked(lambda: client.deliverable(installation, home_id, name, sha256=sha256))
    sys.stdout.buffer.write(base64.b64decode(body["content_base64"]))
    sys.stdout.buffer.flush()


__all__ = ["home"]
