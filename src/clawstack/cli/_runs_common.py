"""What the ``claw runs`` commands share: the socket option, the client, and turning API refusals into messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from clawstack.common.errors import ClawError
from clawstack.pod.artifacts import PodPaths
from clawstack.runs.client import RunsClient
from clawstack.runs.errors import RunsError

SOCKET_OPTION = click.option(
    "--socket-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The socket directory (default <pod>/.claw-runs/sock).",
)


def socket_dir_for(pod_dir: Path, socket_dir: Path | None) -> Path:
    return socket_dir if socket_dir is not None else PodPaths(pod_dir.resolve()).runs / "sock"


def client_for(pod_dir: Path, socket_dir: Path | None) -> RunsClient:
    return RunsClient(socket_dir_for(pod_dir, socket_dir) / "runs.sock")


def checked(action: Any) -> Any:
    try:
        return action()
    except RunsError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc
    except ClawError as exc:
        raise click.ClickException(exc.message) from exc


__all__ = ["SOCKET_OPTION", "checked", "client_for", "socket_dir_for"]
