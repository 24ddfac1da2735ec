"""The pod's proxy as a managed background process under the local backend.

``claw up -d`` starts ``claw proxy serve`` in its own session with its output in ``proxy.log`` (0600), records
its pid and the digest of what it serves in ``proxy.pid``, and returns only once the operator API answers a health
check. ``claw down`` stops it with SIGTERM (SIGKILL after a grace period) and verifies it is gone. A pid file is
trusted only if that process is alive and its command line is this pod's proxy, so a recycled pid is never
signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

from clawstack.common.errors import ClawError
from clawstack.common.files import read_private, write_private
from clawstack.common.uds import sync_client
from clawstack.pod.artifacts import OPERATOR_TOKEN_ENV, PodPaths, existing_operator_token
from clawstack.pod.errors import BackendError

START_TIMEOUT_S: Final = 20.0
_LAUNCHER: Final = (
    "import os, subprocess, sys\n"
    "log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)\n"
    "p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)\n"
    "print(p.pid)\n"
)
STOP_GRACE_S: Final = 20.0


@dataclass(frozen=True, slots=True)
class ProxyProcess:
    pid: int
    digest: str


class LocalProxy:
    """Start, find, check and stop one pod's proxy process."""

    def __init__(self, paths: PodPaths) -> None:
        self.paths = paths
        self.pid_file = paths.proxy / "proxy.pid"
        self.log_file = paths.proxy / "proxy.log"

    def running(self) -> ProxyProcess | None:
        """The live proxy process of this pod, or ``None``."""
        try:
            record = json.loads(read_private(self.pid_file, max_bytes=4096))
            pid, digest = int(record["pid"]), str(record["digest"])
        except (OSError, ClawError, ValueError, KeyError, TypeError):  # an unreadable record is not ours
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if b"serve" not in cmdline or os.fsencode(self.paths.proxy_config) not in cmdline:
            return None
        return ProxyProcess(pid=pid, digest=digest)

    def start(self, *, digest: str, timeout_s: float = START_TIMEOUT_S) -> ProxyProcess:
        """Start the proxy and wait until its operator API is healthy."""
        env = {k: v for k, v in os.environ.items() if k != OPERATOR_TOKEN_ENV}
        argv = [sys.executable, "-m", "clawstack", "proxy", "serve", "--config", str(self.paths.proxy_config)]
        try:
            # A short-lived launcher starts the proxy in its own session and exits, so the proxy is nobody's
            # child: it outlives claw up, and no caller is left holding an unreaped process.
            launched = subprocess.run(  # noqa: S603 (our own interpreter, no shell)
                [sys.executable, "-c", _LAUNCHER, str(self.log_file), *argv],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
                check=True,
            )
            pid = int(launched.stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise BackendError(
                f"the proxy could not be launched; see {self.log_file}", code="proxy_start_failed"
            ) from exc
        write_private(self.pid_file, json.dumps({"pid": pid, "digest": digest}).encode())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                raise BackendError(f"the proxy exited while starting; see {self.log_file}", code="proxy_start_failed")
            if self.healthy():
                return ProxyProcess(pid=pid, digest=digest)
            time.sleep(0.05)
        self._terminate(pid)
        raise BackendError(
            f"the proxy did not become healthy within {timeout_s:g} s; see {self.log_file}", code="proxy_start_failed"
        )

    def healthy(self) -> bool:
        """Whether the operator API answers a health check with the pod's operator token."""
        return operator_healthy(self.paths)

    def stop(self, *, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop the proxy if it runs; return whether one was stopped. Raises if it cannot be made to exit."""
        current = self.running()
        if current is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        self._terminate(current.pid, grace_s=grace_s)
        self.pid_file.unlink(missing_ok=True)
        return True

    def _terminate(self, pid: int, *, grace_s: float = STOP_GRACE_S) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
        if _alive(pid):
            raise BackendError(f"the proxy (pid {pid}) does not exit", code="proxy_stop_failed")


def operator_healthy(paths: PodPaths, *, timeout_s: float = 2.0) -> bool:
    """Whether the pod's proxy answers ``GET /v1/health`` on its operator socket (``PodPaths.operator_socket``)
    with the pod's operator token, under either backend. Never raises: an absent or broken proxy is ``False``."""
    token = existing_operator_token(paths)
    if token is None or not paths.operator_socket.exists():
        return False
    try:
        with sync_client(paths.operator_socket, timeout_s=timeout_s) as client:
            response = client.get("/v1/health", headers={"Authorization": f"Bearer {token}"})
            return response.status_code == 200 and response.json().get("status") == "ok"
    except (ClawError, httpx.HTTPError, ValueError, AttributeError):
        return False


def wait_for_operator_healthy(paths: PodPaths, *, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Poll :func:`operator_healthy` until it holds (``True``) or ``timeout_s`` passes (``False``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if operator_healthy(paths):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


__all__ = ["LocalProxy", "ProxyProcess", "operator_healthy", "wait_for_operator_healthy"]
