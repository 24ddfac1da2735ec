"""Address blocks for task-home runs' own networks under the compose backend.

Each task-home run gets an internal network of its own, holding its worker and its forwarder; its address block
is a ``/28`` taken from ``CLAW_RUN_SUBNET_BASE`` (default :data:`DEFAULT_BASE`), which must be a private IPv4
range of at least one block. The supervisor allocates a block at admission, under its admission lock, among the
blocks no unfinished run holds, and records it with the run (so a restart keeps it). A bad base, or no free block,
is ``503 network_unavailable`` at launch.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from typing import Final

from clawstack.runs.errors import RunsError

BASE_ENV: Final = "CLAW_RUN_SUBNET_BASE"
DEFAULT_BASE: Final = "10.213.0.0/16"
BLOCK_PREFIX: Final = 28
"""16 addresses: the network, the bridge, the worker and the forwarder, with room to spare."""


def parse_base(value: str | None) -> ipaddress.IPv4Network:
    """The base range (``network_unavailable`` unless it is a private IPv4 range of at least one block)."""
    text = DEFAULT_BASE if value is None or not value.strip() else value.strip()
    try:
        base = ipaddress.ip_network(text, strict=True)
    except ValueError:
        raise RunsError("network_unavailable", f"{BASE_ENV} is not an IPv4 range such as {DEFAULT_BASE}") from None
    if not isinstance(base, ipaddress.IPv4Network) or not base.is_private or base.is_loopback or base.is_link_local:
        raise RunsError("network_unavailable", f"{BASE_ENV} must be a private IPv4 range such as {DEFAULT_BASE}")
    if base.prefixlen > BLOCK_PREFIX:
        raise RunsError("network_unavailable", f"{BASE_ENV} must hold at least one /{BLOCK_PREFIX} block")
    return base


def allocate(base: ipaddress.IPv4Network, taken: Collection[str]) -> str:
    """The first ``/28`` of ``base`` that is not in ``taken`` (``network_unavailable`` when every one is)."""
    held = set(taken)
    for block in base.subnets(new_prefix=BLOCK_PREFIX):
        if str(block) not in held:
            return str(block)
    raise RunsError("network_unavailable", "no address block is free for a task-home run's network; retry later")


__all__ = ["BASE_ENV", "BLOCK_PREFIX", "DEFAULT_BASE", "allocate", "parse_base"]
