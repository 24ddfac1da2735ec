"""A task-home run's meter is watched for the whole run, not only until its first measure: a meter that stops
measuring later (here: frozen with SIGSTOP, so its monitor still lives and its last measure still says ``ok``) ends
the run ``home_meter_unavailable`` once it has been silent for the supervisor's ``meter_silence_s``, through the
normal revocation and teardown. Real supervisor, proxy, Hermes worker and meter sandboxes."""

from __future__ import annotations

import json
import os
import signal

import pytest

from clawstack.runs.backends.base import RunLabels
from clawstack.runs.backends.local import LocalBackend
from clawstack.runs.backends.local_meter import METER_DIR
from clawstack.runs.backends.monitor import MONITOR_RECORD

from .conftest import RunsStack, eventually
from .test_task_homes import home_launch, terminal

pytestmark = [pytest.mark.hermes, pytest.mark.slow]

SILENCE_S = 3.0
"""Three of the meter's one-second intervals: a meter that measures is never taken for a silent one."""


async def test_a_meter_that_stops_measuring_mid_run_ends_it_home_meter_unavailable(stack: RunsStack) -> None:
    await stack.restart(meter_silence_s=SILENCE_S)
    backend = stack.supervisor.backend
    assert isinstance(backend, LocalBackend)
    labels = RunLabels(pod=stack.supervisor.pod_name, installation="acme", run_id="m1")
    task = terminal("sleep 60") + "\n@fake reply: never"
    assert (await stack.call("POST", "/v1/runs", home_launch(stack, "m1", task, home="metered"))).status == 202
    await stack.call("GET", "/v1/runs/acme/m1?wait=running&timeout=30s")

    async def measures() -> int:
        return (await backend.inspect(labels)).home_meter_seq or 0

    async def measured_past(seq: float) -> bool:
        return await measures() >= seq

    # Positive control: a meter that keeps measuring keeps the run going well past the silence limit.
    first = await eventually(measures, timeout_s=30, what="the meter's first measure")
    await eventually(lambda: measured_past(first + 2 * SILENCE_S), timeout_s=30, what="the meter measuring on")
    assert stack.supervisor.record(("acme", "m1")).state == "running"

    record = json.loads((backend.run_dir(labels) / METER_DIR / MONITOR_RECORD).read_text())
    os.kill(record["sandbox"]["runner"]["pid"], signal.SIGSTOP)  # alive, its monitor too, but measuring nothing
    ended = (await stack.call("GET", "/v1/runs/acme/m1?wait=failed&timeout=30s")).json()
    assert (ended["state"], ended["failure"]) == ("failed", "home_meter_unavailable"), ended
    assert ended["revoked"] is True
    assert await backend.list_workers() == []  # the worker and the frozen meter are gone
