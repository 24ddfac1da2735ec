"""Start-up refusals that need no running stack: compose task homes without root."""

from __future__ import annotations

import pytest

from clawstack.runs.supervisor import StartupError, check_task_homes_runnable

HOME = {"name": "researcher", "profile": "task_home"}
STATELESS = {"name": "worker", "profile": "stateless"}


def test_compose_task_homes_need_a_root_supervisor() -> None:
    with pytest.raises(StartupError) as info:
        check_task_homes_runnable("compose", 1000, [STATELESS, HOME])
    assert "researcher" in info.value.message
    assert "root" in info.value.message


@pytest.mark.parametrize(
    ("backend", "euid", "templates"),
    [
        ("compose", 0, [STATELESS, HOME]),  # root: served
        ("compose", 1000, [STATELESS]),  # no task home: served
        ("local", 1000, [STATELESS, HOME]),  # the local backend runs task homes under any user
    ],
)
def test_what_is_served(backend: str, euid: int, templates: list[dict[str, str]]) -> None:
    check_task_homes_runnable(backend, euid, templates)
