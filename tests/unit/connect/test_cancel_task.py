"""cancel_task: the gateway run is aborted (chat.abort) and the job ends cancelled with its terminalReason;
cancelling again answers the same; a task that ended otherwise is refused; another caller's task is not found."""

from __future__ import annotations

import asyncio

import pytest

from clawstack.connect import Caller, ConnectService, ToolError
from clawstack.connect.tools import TOOLS_BY_NAME
from clawstack.gateway.server import GatewayServer

from .test_service import WAIT

ALICE, BOB = Caller.user("Alice"), Caller.user("Bob")


async def running(service: ConnectService, caller: Caller = ALICE) -> dict[str, object]:
    job = await service.call("run_task", {"task": "@fake reply: too late\n@fake delay-ms: 20000"}, caller=caller)
    for _ in range(100):
        snap = await service.call("check_task", {"jobId": job["jobId"], "mode": "poll"}, caller=caller)
        if any("accepted the run" in line.get("message", "") for line in snap.get("logs", [])):
            break
        await asyncio.sleep(0.05)
    return job


async def test_cancel_aborts_the_gateway_run(service: ConnectService, gateway: GatewayServer) -> None:
    job = await running(service)
    started = asyncio.get_running_loop().time()
    cancelled = await service.call("cancel_task", {"jobId": job["jobId"]}, caller=ALICE)
    elapsed = asyncio.get_running_loop().time() - started
    assert (cancelled["status"], cancelled["terminalReason"], cancelled["isTerminal"]) == ("cancelled", "aborted", True)
    assert elapsed < 5  # the abort, not the 20 s model delay
    again = await service.call("cancel_task", {"jobId": job["jobId"]}, caller=ALICE)
    assert (again["status"], again["terminalReason"]) == ("cancelled", "aborted")  # idempotent
    check = await service.call("check_task", {"jobId": job["jobId"], **WAIT}, caller=ALICE)
    assert check["status"] == "cancelled"


async def test_a_finished_task_cannot_be_cancelled(service: ConnectService) -> None:
    job = await service.call("run_task", {"task": "@fake reply: done"}, caller=ALICE)
    for _ in range(20):
        if (await service.call("check_task", {"jobId": job["jobId"], **WAIT}, caller=ALICE))["isTerminal"]:
            break
    with pytest.raises(ToolError) as info:
        await service.call("cancel_task", {"jobId": job["jobId"]}, caller=ALICE)
    assert info.value.code == "task_terminal"
    assert (await service.call("get_task", {"taskId": job["taskId"]}, caller=ALICE))["status"] == "completed"


async def test_another_callers_task_is_not_found(service: ConnectService) -> None:
    job = await running(service)
    with pytest.raises(ToolError) as info:
        await service.call("cancel_task", {"jobId": job["jobId"]}, caller=BOB)
    assert info.value.code == "job_not_found"
    await service.call("cancel_task", {"jobId": job["jobId"]}, caller=ALICE)


def test_cancel_task_changes_something_and_says_so() -> None:
    spec = TOOLS_BY_NAME["cancel_task"]
    assert spec.read_only is False
    assert not spec.description.startswith("READ ONLY")
    assert set(spec.input_schema()["properties"]) == {"jobId", "stopAgentSession"}
