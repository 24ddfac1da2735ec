"""``claw demo``: the main job, end to end, offline, on the embedded defaults.

It copies ``examples/pod`` to a private scratch directory and runs, as real processes: the scripted fake model
(``claw fake-llm serve``), the pod's tool service, the pod's proxy (``claw up -d``) and the supervisor
(``claw runs serve``, local bubblewrap backend, SQLite ledger). It launches a run that reads ticket 42 through the
proxy-managed tool and prints its answer, launches a second run and cancels it mid-flight, shows both statuses,
then shuts everything down (``claw down``) whatever happens. The model is clawstack's scripted fake, not a
language model, and the output says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import click

from clawstack.common.clock import SystemClock
from clawstack.common.errors import ClawError
from clawstack.runs.client import RunsClient

EXAMPLE: Final = Path(__file__).resolve().parents[3] / "examples" / "pod"
STOP_GRACE_S: Final = 10.0
FAKE_MODEL_STATEMENT: Final = (
    "Every model answer above came from clawstack's scripted fake model (claw fake-llm), not a language model: "
    "it answers what the '@fake' lines in a task tell it to. No model provider was contacted."
)
TASK: Final = (
    "Summarize ticket 42 for the on-call engineer.\n"
    '@fake tool-call: ticket-api__get_ticket {"id": 42}\n'
    "@fake reply: Ticket 42 (open): the third-floor printer smokes when printing duplex; a power cycle did not "
    "help. Next step: take it out of service and call the vendor."
)
SLOW_TASK: Final = "Summarize every ticket ever filed.\n@fake reply: (never sent)\n@fake delay-ms: 60000"


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


class Processes:
    """Child processes started by the demo, each stopped with SIGTERM (then SIGKILL) at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, name: str, argv: list[str], ready_prefix: str, env: dict[str, str] | None = None) -> str:
        log = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)  # noqa: S603
        log.close()
        self.children.append((name, proc))
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith(ready_prefix):
            raise DemoError(f"{name} did not start; see {self.logs / (name + '.log')}")
        return line.removeprefix(ready_prefix)

    def stop(self) -> None:
        for _name, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(STOP_GRACE_S)
            if proc.stdout is not None:
                proc.stdout.close()


def claw(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(  # noqa: S603 (our own interpreter and module, no shell)
        [sys.executable, "-m", "clawstack", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise DemoError(f"claw {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="claw-demo-", dir="/tmp"))
    os.chmod(base, 0o700)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _show(title: str, status: dict[str, Any]) -> None:
    click.echo(f"\n{title}")
    for name in ("state", "cancelled", "failure", "exit_code", "revoked", "revocation_proof", "isolation"):
        click.echo(f"  {name:<17} {status.get(name)}")


@click.command()
@click.option("--keep", is_flag=True, help="Leave the scratch pod in place (its path is printed).")
def demo(keep: bool) -> None:
    """Run the main job end to end: a pod, its proxy and the supervisor, one run answered and one cancelled.

    Everything runs on this machine against clawstack's scripted fake model (claw fake-llm), not a language model.
    """
    with scratch() as base:
        try:
            _run(base)
        except (DemoError, ClawError) as exc:
            raise click.ClickException(f"{exc}") from exc
        finally:
            if keep:
                kept = Path(tempfile.mkdtemp(prefix="claw-demo-kept-", dir="/tmp"))
                shutil.copytree(base, kept, dirs_exist_ok=True)
                click.echo(f"\nthe scratch pod is kept in {kept}")


def _run(base: Path) -> None:
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    logs = base / "logs"
    logs.mkdir()
    processes = Processes(logs)
    python = sys.executable
    try:
        click.echo("Starting clawstack's scripted fake model (claw fake-llm serve) ...")
        fake_url = processes.start(
            "fake-llm", [python, "-m", "clawstack", "fake-llm", "serve", "--port", "0"], "fake-llm listening on "
        )
        tools_port = _free_port()
        processes.start(
            "ticket-api", [python, str(pod / "ticket_api.py"), "--port", str(tools_port)], "======== Running on"
        )
        env = {**os.environ, "CLAW_FAKE_LLM_URL": fake_url, "TICKET_API_URL": f"http://127.0.0.1:{tools_port}"}
        click.echo("Compiling the example pod and starting its proxy (claw up -d) ...")
        click.echo("  " + claw("up", "--pod", str(pod), "-d", env=env).strip().replace("\n", "\n  "))
        socket_dir = base / "sock"
        socket_dir.mkdir(mode=0o700)
        click.echo("Starting the supervisor (claw runs serve, local bubblewrap sandboxes) ...")
        processes.start(
            "runs",
            [python, "-m", "clawstack", "runs", "serve", "--pod", str(pod), "--socket-dir", str(socket_dir)],
            "runs listening: ",
        )
        _runs(socket_dir / "runs.sock")
    finally:
        processes.stop()
        with contextlib.suppress(DemoError):
            claw("down", "--pod", str(pod))
    click.echo(f"\n{FAKE_MODEL_STATEMENT}")


def _runs(socket: Path) -> None:
    authority = SystemClock().now() + timedelta(minutes=10)
    with RunsClient(socket) as client:
        click.echo("\nLaunching run acme/demo-1: " + TASK.splitlines()[0])
        client.launch("acme", "demo-1", {"template": "worker", "task": TASK}, authority_expires_at=authority)
        done = client.status("acme", "demo-1", wait="stopped", timeout_s=60)
        answer, truncated = client.result("acme", "demo-1") if done.get("result") else ("(no answer)", False)
        click.echo(f"\nanswer of acme/demo-1{' (truncated)' if truncated else ''}:\n  {answer}")
        click.echo("\nLaunching run acme/demo-2 (a slow one) and cancelling it mid-flight ...")
        client.launch("acme", "demo-2", {"template": "worker", "task": SLOW_TASK}, authority_expires_at=authority)
        client.status("acme", "demo-2", wait="running", timeout_s=60)
        cancelled = client.cancel("acme", "demo-2", generation=1, wait="stopped", timeout_s=60)
        _show("status of acme/demo-1", client.status("acme", "demo-1"))
        _show("status of acme/demo-2", cancelled)
        if done.get("state") != "stopped" or cancelled.get("state") != "stopped":
            raise DemoError("a run did not end as expected; see the statuses above")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


__all__ = ["FAKE_MODEL_STATEMENT", "demo"]
