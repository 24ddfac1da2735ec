"""The runs network of a compose pod and the host guard that keeps its workers off the host.

Workers join ``claw-runs-<pod>``, a Compose network with ``internal: true``: Docker gives it no route out, but
traffic to the host's own addresses (the bridge gateway, ``docker0``, ``eth0``) still reaches the host's INPUT
chain, so a worker could call any service listening on the host. The guard closes that: one rule
``INPUT -i <bridge> -j DROP`` (and its IPv6 twin when the kernel has IPv6), where ``<bridge>`` is the Linux bridge
the network is pinned to by ``com.docker.network.bridge.name``. Traffic between containers on the bridge (workers
to the proxy) is bridged, not delivered to the host, and is unaffected; so is Docker's embedded DNS, which answers
inside each container's own network namespace.

The bridge name is derived from the pod name (``clawr-`` and the first 9 hex digits of its SHA-256: 15 bytes,
Linux's limit), so every process that knows the pod agrees on it without reading Docker.

Errors (:class:`~clawstack.pod.errors.BackendError`):

``network_guard_failed``  ``iptables`` (or ``ip6tables``) is missing, refuses (not root), or the rule is absent
                          after being installed
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from clawstack.pod.errors import BackendError

BRIDGE_PREFIX: Final = "clawr-"
IFNAMSIZ_MAX: Final = 15
_TIMEOUT_S: Final = 30
_IF_INET6: Final = Path("/proc/net/if_inet6")


@dataclass(frozen=True, slots=True)
class RunsNetwork:
    """The Docker network name of a pod's runs network and the Linux bridge it is pinned to."""

    name: str
    bridge: str


def runs_network(pod_name: str) -> RunsNetwork:
    """The runs network of the pod named ``pod_name`` (its ``x-claw.pod``)."""
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:9]
    return RunsNetwork(name=f"claw-runs-{pod_name}", bridge=f"{BRIDGE_PREFIX}{digest}")


IptablesRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
"""Runs one ``iptables``/``ip6tables`` argv and returns its completed process (injectable for tests)."""


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 (fixed argv, no shell)
        list(argv), capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )


def _ipv6_enabled() -> bool:
    return _IF_INET6.exists()


def _tools(ipv6: bool | None) -> tuple[str, ...]:
    return ("iptables", "ip6tables") if (_ipv6_enabled() if ipv6 is None else ipv6) else ("iptables",)


def _rule(network: RunsNetwork) -> list[str]:
    return ["INPUT", "-i", network.bridge, "-j", "DROP"]


def _call(runner: IptablesRunner, tool: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return runner([tool, "-w", str(_TIMEOUT_S), *args])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(
            f"cannot run {tool} to guard the runs network ({exc}); claw needs {tool} and root to keep workers "
            "off the host",
            code="network_guard_failed",
        ) from exc


def _present(runner: IptablesRunner, tool: str, network: RunsNetwork) -> bool:
    done = _call(runner, tool, ["-C", *_rule(network)])
    if done.returncode == 0:
        return True
    if done.returncode == 1:  # iptables -C: the rule does not exist
        return False
    raise _refused(tool, "check", done)


def _refused(tool: str, action: str, done: subprocess.CompletedProcess[str]) -> BackendError:
    tail = " / ".join(done.stderr.strip().splitlines()[-2:]) or f"exit status {done.returncode}"
    return BackendError(
        f"{tool} refused to {action} the runs network guard ({tail}); claw up and the compose backend need root "
        "(or CAP_NET_ADMIN) to keep workers off the host",
        code="network_guard_failed",
    )


def guard_present(network: RunsNetwork, *, runner: IptablesRunner = _run, ipv6: bool | None = None) -> bool:
    """Whether every guard rule of ``network`` is installed (``ipv6``: default, whether the kernel has IPv6)."""
    return all(_present(runner, tool, network) for tool in _tools(ipv6))


def ensure_guard(network: RunsNetwork, *, runner: IptablesRunner = _run, ipv6: bool | None = None) -> None:
    """Install the guard rules of ``network`` unless present, then verify them. Idempotent."""
    for tool in _tools(ipv6):
        if _present(runner, tool, network):
            continue
        done = _call(runner, tool, ["-I", *_rule(network)])
        if done.returncode != 0:
            raise _refused(tool, "install", done)
        if not _present(runner, tool, network):
            raise BackendError(
                f"the runs network guard ({tool}) is absent right after it was installed", code="network_guard_failed"
            )


def remove_guard(network: RunsNetwork, *, runner: IptablesRunner = _run, ipv6: bool | None = None) -> None:
    """Remove every copy of the guard rules of ``network``. Idempotent: nothing to remove is not an error."""
    for tool in _tools(ipv6):
        while _present(runner, tool, network):
            done = _call(runner, tool, ["-D", *_rule(network)])
            if done.returncode != 0:
                raise _refused(tool, "remove", done)


__all__ = [
    "BRIDGE_PREFIX",
    "IptablesRunner",
    "RunsNetwork",
    "ensure_guard",
    "guard_present",
    "remove_guard",
    "runs_network",
]
