"""Address blocks for compose task-home runs' networks: the base must be a private IPv4 range of at least one
/28, and allocation takes the first block no unfinished run holds, or refuses with network_unavailable."""

from __future__ import annotations

import pytest

from clawstack.runs.errors import RunsError
from clawstack.runs.subnets import DEFAULT_BASE, allocate, parse_base


def test_the_default_base_and_first_blocks() -> None:
    base = parse_base(None)
    assert str(base) == DEFAULT_BASE
    assert allocate(base, set()) == "10.213.0.0/28"
    assert allocate(base, {"10.213.0.0/28"}) == "10.213.0.16/28"
    assert allocate(base, {"10.213.0.16/28"}) == "10.213.0.0/28"  # a freed block is reused


@pytest.mark.parametrize("value", ["192.168.50.0/24", "172.20.0.0/16", "10.0.0.0/8", " 10.1.2.0/28 "])
def test_private_ipv4_ranges_are_usable(value: str) -> None:
    assert parse_base(value).is_private


@pytest.mark.parametrize(
    "value",
    [
        "8.8.8.0/24",  # not private
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local
        "fd00::/64",  # not IPv4
        "10.0.0.0/29",  # smaller than one block
        "10.0.0.1/24",  # host bits set
        "ten.zero",
        "10.0.0.0/33",
    ],
)
def test_a_bad_base_is_network_unavailable(value: str) -> None:
    with pytest.raises(RunsError) as caught:
        parse_base(value)
    assert (caught.value.code, caught.value.status) == ("network_unavailable", 503)


def test_no_free_block_is_network_unavailable() -> None:
    base = parse_base("10.9.0.0/27")  # two blocks
    taken = {allocate(base, set())}
    taken.add(allocate(base, taken))
    assert taken == {"10.9.0.0/28", "10.9.0.16/28"}
    with pytest.raises(RunsError) as caught:
        allocate(base, taken)
    assert (caught.value.code, caught.value.status) == ("network_unavailable", 503)
