"""The supervisor's client libraries refuse an ``installation``, ``run_id``, ``home`` or deliverable name outside
the server's patterns before any request (``r1/../../homes/…`` would reach another endpoint), and the synchronous
client checks the server's peer UID before it writes a byte."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from clawstack.runs.client import AsyncRunsClient, RunsClient
from clawstack.runs.errors import RunsError

pytestmark = pytest.mark.security

BAD_RUN = [
    ("acme", "r1/../../homes/acme/h1"),
    ("acme", "r1/result"),
    ("acme/../x", "r1"),
    ("ACME", "r1"),
    ("acme", ""),
    ("acme", "r1?wait=stopped"),
    ("acme", "r%2F1"),
    ("acme", "x" * 129),
]
BAD_HOME = [("acme", "../runs"), ("acme", ".hidden"), ("acme", "h1/deliverables/x"), ("a b", "h1"), ("acme", "")]
BAD_NAME = ["../secret", ".hidden", "a/b", "", "x" * 129, " lead"]


class Listener:
    """A Unix-socket server that records every byte a client sends it (and never answers)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.received = b""
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.settimeout(0.5)
            try:
                while chunk := conn.recv(65536):
                    self.received += chunk
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture
def listener(short_dir: Path) -> Iterator[Listener]:
    directory = short_dir / "sock"
    directory.mkdir(mode=0o700)
    server = Listener(directory / "runs.sock")
    yield server
    server.close()


@pytest.mark.parametrize(("installation", "run_id"), BAD_RUN)
def test_run_paths_outside_the_patterns_are_refused_before_any_request(
    listener: Listener, installation: str, run_id: str
) -> None:
    with RunsClient(listener.path, timeout_s=1) as client:
        calls: list[Callable[[], object]] = [
            lambda: client.status(installation, run_id),
            lambda: client.result(installation, run_id),
            lambda: client.cancel(installation, run_id, generation=1),
        ]
        for call in calls:
            with pytest.raises(RunsError) as info:
                call()
            assert info.value.code == "request_invalid"
    assert listener.connections == 0
    assert listener.received == b""


@pytest.mark.parametrize(("installation", "home"), BAD_HOME)
def test_home_paths_outside_the_patterns_are_refused(listener: Listener, installation: str, home: str) -> None:
    with RunsClient(listener.path, timeout_s=1) as client:
        calls: list[Callable[[], object]] = [
            lambda: client.home(installation, home),
            lambda: client.delete_home(installation, home),
            lambda: client.deliverables(installation, home),
            lambda: client.deliverable(installation, home, "report.md"),
        ]
        for call in calls:
            with pytest.raises(RunsError) as info:
                call()
            assert info.value.code == "request_invalid"
    assert listener.received == b""


@pytest.mark.parametrize("name", BAD_NAME)
async def test_deliverable_names_outside_the_pattern_are_refused_by_both_clients(listener: Listener, name: str) -> None:
    with RunsClient(listener.path, timeout_s=1) as client, pytest.raises(RunsError) as info:
        client.deliverable("acme", "h1", name)
    assert info.value.code == "request_invalid"
    async with AsyncRunsClient(listener.path, timeout_s=1) as aclient:
        with pytest.raises(RunsError) as ainfo:
            await aclient.deliverable("acme", "h1", name)
        assert ainfo.value.code == "request_invalid"
        for bad_installation, bad_run in BAD_RUN:
            with pytest.raises(RunsError):
                await aclient.status(bad_installation, bad_run)
        for bad_installation, bad_home in BAD_HOME:
            with pytest.raises(RunsError):
                await aclient.deliverables(bad_installation, bad_home)
    assert listener.received == b""


def test_positive_control_a_valid_path_is_sent(listener: Listener) -> None:
    with RunsClient(listener.path, timeout_s=0.5) as client, pytest.raises(httpx.HTTPError):  # it never answers
        client.deliverable("acme", "h1", "Report 1.md")
    assert b"GET /v1/homes/acme/h1/deliverables/Report%201.md " in listener.received
