"""``claw demo``: the main job, end to end, offline, on the embedded defaults.

It copies ``examples/pod`` to a private scratch directory and runs, as real processes: the scripted fake model
(``claw fake-llm serve``), the pod's tool service, the pod's proxy (``claw up -d``) and the supervisor
(``claw runs serve``, local bubblewrap backend, SQLite ledger). With ``--backend compose`` the same pod runs on
Docker Compose instead (:func:`make_compose_pod`): ``claw images build`` first, then the proxy and the tool
service in containers and each run its own Compose project; the fake model stays on the host, reached as
``host.docker.internal``. It launches a run that reads ticket 42 through the
proxy-managed tool and prints its answer, launches a second run and cancels it mid-flight, shows both statuses,
then shuts everything down (``claw down``) whatever happens. The model is clawstack's scripted fake, not a
language model, and the output says so.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import click
import yaml

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
HOME_TASKS: Final = (
    "Start a report on the printer tickets and hand me a first draft.\n"
    '@fake tool-call: write_file {"path": "deliverables/report.md", "content": "# Printers\\n\\nTicket 42: the '
    'third-floor printer smokes when printing duplex.\\n"}\n'
    "@fake reply: I put a first draft in deliverables/report.md.",
    "Thanks. What did you write last time?\n@fake reply: A first draft of the printer report; it is still in "
    "deliverables/report.md.",
)


TOOL_PORT: Final = 8091


def make_compose_pod(pod: Path, *, worker_image: str, tool_image: str, name: str | None = None) -> None:
    """Turn a copy of ``examples/pod`` into its compose form: ``x-claw.backend: compose``, the worker on
    ``worker_image`` (an image of runner type ``oneshot``), the researcher on ``clawstack/hermes`` (runner type
    ``hermes``), and the ticket API in a container of ``tool_image``
    (one with ``python3`` and aiohttp, such as ``clawstack/proxy``) running the pod's ``ticket_api.py``, which the
    proxy reaches on the pod's network. The model upstream stays ``${CLAW_FAKE_LLM_URL}``. ``name`` renames the pod
    (``x-claw.pod``), which names its Compose projects and labels its containers: pods sharing one engine need
    different names."""
    pod_file = pod / "claw-pod.yml"
    document = yaml.safe_load(pod_file.read_text())
    document["x-claw"]["backend"] = "compose"
    if name is not None:
        document["x-claw"]["pod"] = name
    services = document["services"]
    if "researcher" in services:  # the task-home template runs clawstack's Hermes image
        from clawstack.pod.imagebuild import HERMES_IMAGE

        services["researcher"]["image"] = HERMES_IMAGE
    services["worker"]["image"] = worker_image
    tool = services["ticket-api"]
    tool.update(
        {
            "image": tool_image,
            "entrypoint": ["python3", "/app/ticket_api.py", "--host", "0.0.0.0", "--port", str(TOOL_PORT)],  # noqa: S104
            "volumes": ["./ticket_api.py:/app/ticket_api.py:ro"],
            "user": "65534:65534",
            "read_only": True,
            "cap_drop": ["ALL"],
            "environment": {"TICKET_API_TOKEN": "${TICKET_API_TOKEN:-example-ticket-token-change-me}"},
        }
    )
    tool["x-claw"]["endpoint"] = f"http://ticket-api:{TOOL_PORT}"
    pod_file.write_text(yaml.safe_dump(document, sort_keys=False))


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


def _sockets(directory: str, names: list[str]) -> list[str]:
    """The Unix sockets among ``names``: a kept copy of the scratch pod leaves them out (they cannot be copied)."""
    return [name for name in names if stat.S_ISSOCK(os.lstat(os.path.join(directory, name)).st_mode)]


def _show(title: str, status: dict[str, Any]) -> None:
    click.echo(f"\n{title}")
    for name in ("state", "cancelled", "failure", "exit_code", "revoked", "revocation_proof"):
        click.echo(f"  {name:<17} {status.get(name)}")
    isolation = status.get("isolation") or {}
    enforced = ", ".join(isolation.get("enforced") or ())
    click.echo(f"  {'isolation':<17} {isolation.get('backend')}/{isolation.get('mechanism')}: {enforced}")


@click.command()
@click.option("--keep", is_flag=True, help="Leave the scratch pod in place (its path is printed).")
@click.option(
    "--backend",
    type=click.Choice(["local", "compose"]),
    default="local",
    show_default=True,
    help="Where workers run: bubblewrap sandboxes, or one Docker Compose project per run (needs Docker).",
)
def demo(keep: bool, backend: str) -> None:
    """Run the main job end to end: a pod, its proxy and the supervisor, one run answered and one cancelled.

    Everything runs on this machine against clawstack's scripted fake model (claw fake-llm), not a language model.
    """
    with scratch() as base:
        try:
            _run(base, backend)
        except (DemoError, ClawError) as exc:
            raise click.ClickException(f"{exc}") from exc
        finally:
            if keep:
                kept = Path(tempfile.mkdtemp(prefix="claw-demo-kept-", dir="/tmp"))
                shutil.copytree(base, kept, dirs_exist_ok=True, ignore=_sockets)
                click.echo(f"\nthe scratch pod is kept in {kept}")


def _run(base: Path, backend: str) -> None:
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    logs = base / "logs"
    logs.mkdir()
    processes = Processes(logs)
    python = sys.executable
    try:
        if backend == "compose":
            from clawstack.pod.imagebuild import PROXY_IMAGE, WORKER_IMAGE

            click.echo("Building clawstack's images locally (claw images build; nothing is pulled) ...")
            click.echo("  " + claw("images", "build").strip().replace("\n", "\n  "))
            make_compose_pod(pod, worker_image=WORKER_IMAGE, tool_image=PROXY_IMAGE)
        click.echo("Starting clawstack's scripted fake model (claw fake-llm serve) ...")
        host = "0.0.0.0" if backend == "compose" else "127.0.0.1"  # noqa: S104 - the proxy's container calls it
        fake_url = processes.start(
            "fake-llm",
            [python, "-m", "clawstack", "fake-llm", "serve", "--host", host, "--port", "0"],
            "fake-llm listening on ",
        )
        env = {**os.environ, "CLAW_FAKE_LLM_URL": fake_url}
        if backend == "compose":
            env["CLAW_FAKE_LLM_URL"] = fake_url.replace(host, "host.docker.internal", 1)
        else:
            tools_port = _free_port()
            processes.start(
                "ticket-api", [python, str(pod / "ticket_api.py"), "--port", str(tools_port)], "======== Running on"
            )
            env["TICKET_API_URL"] = f"http://127.0.0.1:{tools_port}"
        click.echo("Compiling the example pod and starting its proxy (claw up -d) ...")
        click.echo("  " + claw("up", "--pod", str(pod), "-d", env=env).strip().replace("\n", "\n  "))
        socket_dir = base / "sock"
        socket_dir.mkdir(mode=0o700)
        where = "one Docker Compose project per run" if backend == "compose" else "local bubblewrap sandboxes"
        click.echo(f"Starting the supervisor (claw runs serve, {where}) ...")
        processes.start(
            "runs",
            [python, "-m", "clawstack", "runs", "serve", "--pod", str(pod), "--socket-dir", str(socket_dir)],
            "runs listening: ",
        )
        _runs(socket_dir / "runs.sock")
        _task_home(socket_dir / "runs.sock")
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


def _task_home(socket: Path) -> None:
    """Two runs of one task on one home: the second resumes the first run's Hermes session and fetches the
    deliverable the first one wrote."""
    authority = SystemClock().now() + timedelta(minutes=10)
    sessions = []
    with RunsClient(socket) as client:
        for index, task in enumerate(HOME_TASKS, start=1):
            run_id = f"home-{index}"
            click.echo(f"\nLaunching run acme/{run_id} on home acme/printers (Hermes): " + task.splitlines()[0])
            spec = {"template": "researcher", "task": task, "home": "printers"}
            client.launch("acme", run_id, spec, authority_expires_at=authority)
            done = client.status("acme", run_id, wait="stopped", timeout_s=60)
            if done.get("state") != "stopped" or not done.get("result"):
                _show(f"status of acme/{run_id}", done)
                raise DemoError(f"the task-home run acme/{run_id} did not end as expected")
            sessions.append(done["result"]["session"])
            answer, _ = client.result("acme", run_id)
            click.echo(f"  answer ({done['result']['outcome']}, session {done['result']['session']}):\n  {answer}")
        if sessions[0] != sessions[1]:
            raise DemoError("the second run did not resume the first run's session")
        click.echo("  the second run resumed the first run's session")
        listed = client.deliverables("acme", "printers")["deliverables"]
        click.echo(
            "\nDeliverables of home acme/printers: " + ", ".join(f"{d['name']} ({d['bytes']} bytes)" for d in listed)
        )
        report = client.deliverable("acme", "printers", "report.md", sha256=listed[0]["sha256"])
        text = base64.b64decode(report["content_base64"]).decode()
        click.echo("  report.md:\n    " + text.strip().replace("\n", "\n    "))


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


__all__ = ["FAKE_MODEL_STATEMENT", "demo", "make_compose_pod"]
