"""The run contract where it is easiest to get wrong: a cancel is durable before its answer, an authority extension
reaches the proxy, a permanent refusal ends the run at once, pins are checked at spawn, ``cllama_ack`` stands for
a real acknowledgement, and the pod is named as it declares itself. Real supervisor, proxy, workers and model;
where a proxy fault is needed, the supervisor's link to the real proxy refuses or waits on the test's word."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest

from clawstack.common.clock import SystemClock, format_timestamp, parse_timestamp
from clawstack.common.digest import spec_digest
from clawstack.common.files import write_private
from clawstack.pod.artifacts import PodPaths, existing_operator_token
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.errors import ProxyError
from clawstack.runs.backends import local as local_backend
from clawstack.runs.ledger import ORDER
from clawstack.runs.lifecycle import identity_id
from clawstack.runs.proxylink import ProxyLink

from .conftest import RunsStack, eventually


class FaultyLink(ProxyLink):
    """The supervisor's real link to the pod's proxy, with faults the test turns on and off."""

    def __init__(self, paths: PodPaths) -> None:
        super().__init__(paths)
        self.hold_self_test = asyncio.Event()  # cleared: every self-test fails (retryable) and the run waits
        self.hold_self_test.set()
        self.create_errors: list[ProxyError] = []  # raised, one per call, before creating an identity
        self.create_calls = 0

    async def self_test(self) -> None:
        if not self.hold_self_test.is_set():
            raise ProxyError("held by the test", code="revocation_self_test_failed", retryable=True)
        await super().self_test()

    async def create_identity(self, **kwargs: Any) -> dict[str, Any]:
        self.create_calls += 1
        if self.create_errors:
            raise self.create_errors.pop(0)
        return await super().create_identity(**kwargs)


@asynccontextmanager
async def operator(stack: RunsStack) -> AsyncIterator[ProxyOperatorClient]:
    paths = PodPaths(stack.pod.resolve())
    token = existing_operator_token(paths)
    assert token is not None
    async with ProxyOperatorClient(token=token, unix_socket=str(paths.operator_socket)) as client:
        yield client


async def status(stack: RunsStack, run_id: str, wait: str | None = None) -> dict[str, Any]:
    query = f"?wait={wait}&timeout=60s" if wait else ""
    return (await stack.call("GET", f"/v1/runs/acme/{run_id}{query}")).json()  # type: ignore[no-any-return]


def at(moment: datetime) -> str:
    return format_timestamp(moment)


async def restart_with(stack: RunsStack, **kwargs: Any) -> FaultyLink:
    link = FaultyLink(PodPaths(stack.pod.resolve()))
    await stack.restart(proxy=link, **kwargs)
    return link


# --------------------------------------------------------------------------------------------------- cancel


async def test_a_cancel_of_a_running_run_is_revoking_on_disk_before_the_answer(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("busy", "@fake reply: x\n@fake delay-ms: 60000"))
    assert (await status(stack, "busy", "running"))["state"] == "running"
    answer = (await stack.call("POST", "/v1/runs/acme/busy/cancel", {"generation": 1})).json()
    assert answer["cancelled"] is True
    assert ORDER[answer["state"]] >= ORDER["revoking"], answer
    # Every later read agrees, and so does the ledger a restarted supervisor reads.
    for _ in range(3):
        assert ORDER[(await status(stack, "busy"))["state"]] >= ORDER["revoking"]
    final = await status(stack, "busy", "stopped")
    assert (final["state"], final["revocation_proof"]) == ("stopped", "cllama_ack")


async def test_claw_runs_cancel_prints_the_revoking_state(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("cli", "@fake reply: x\n@fake delay-ms: 60000"))
    await status(stack, "cli", "running")
    command = [sys.executable, "-m", "clawstack", "runs", "cancel", "acme", "cli", "--generation", "1"]
    command += ["--pod", str(stack.pod), "--socket-dir", str(stack.socket_dir), "--json"]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["cancelled"] is True
    assert ORDER[printed["state"]] >= ORDER["revoking"], printed


async def test_a_cancel_of_an_accepted_run_fences_its_identity_id_though_it_never_had_one(stack: RunsStack) -> None:
    link = await restart_with(stack)
    link.hold_self_test.clear()  # the run stays accepted: no identity, no worker
    launched = (await stack.call("POST", "/v1/runs", stack.launch_body("early", "@fake reply: never"))).json()
    assert launched["state"] == "accepted"
    answer = (await stack.call("POST", "/v1/runs/acme/early/cancel", {"generation": 1})).json()
    assert answer["state"] == "revoking"
    final = (await stack.call("POST", "/v1/runs/acme/early/cancel?wait=stopped&timeout=60s", {"generation": 1})).json()
    assert final["state"] == "stopped", final
    assert (final["cancelled"], final["revoked"], final["revocation_proof"]) == (True, True, "cllama_ack")
    assert final["started_at"] is None
    assert link.create_calls == 0
    # cllama_ack stands for a real terminal 200: the proxy recorded the run's deterministic identity id.
    assert final["run_agent_id"] is not None
    async with operator(stack) as op:
        assert (await op.durable_revocation(final["run_agent_id"]))["durable"] is True
    assert not [r for r in stack.fake.requests if "never" in str(r.body)]


# ------------------------------------------------------------------------------------------------ authority


async def test_an_extended_authority_reaches_the_proxy_before_the_ack(stack: RunsStack) -> None:
    # No grace: the proxy ends the identity exactly at the run's authority, as the supervisor does.
    await stack.restart(callback_origin="http://127.0.0.1:9", identity_grace=timedelta(0))
    now = SystemClock().now()
    task = '@fake tool-call: ticket-api__get_ticket {"id": 42}\n@fake reply: done\n@fake delay-ms: 6000'
    body = stack.launch_body("longer", task)
    body["authority_expires_at"] = at(now + timedelta(seconds=5))
    await stack.call("POST", "/v1/runs", body)
    running = await status(stack, "longer", "running")
    assert running["state"] == "running", running
    new_authority = parse_timestamp(body["authority_expires_at"]) + timedelta(seconds=4)
    extended = await stack.call(
        "POST",
        "/v1/runs/acme/longer/credential",
        {"generation": 1, "credential": "tok", "authority_expires_at": at(new_authority)},
    )
    assert extended.status == 200, extended.body
    async with operator(stack) as op:  # on the proxy's disk before the answer
        described = await op.get_identity(running["run_agent_id"])
    assert described["expires_at"] == at(new_authority)
    final = await status(stack, "longer", "failed")
    assert final["failure"] == "authority_expired", final
    assert parse_timestamp(final["ended_at"]) >= new_authority
    # The worker's second model call (after its tool call) came after the original authority, and was served.
    calls = [r for r in stack.fake.requests if "ticket-api__get_ticket" in str(r.body)]
    assert len(calls) == 2, [r.body for r in calls]


async def test_an_authority_moved_before_the_identity_exists_is_the_one_it_gets(stack: RunsStack) -> None:
    link = await restart_with(stack, callback_origin="http://127.0.0.1:9", identity_grace=timedelta(0))
    link.hold_self_test.clear()
    body = stack.launch_body("moved", "@fake reply: moved")
    await stack.call("POST", "/v1/runs", body)
    later = parse_timestamp(body["authority_expires_at"]) + timedelta(minutes=5)
    answer = await stack.call(
        "POST",
        "/v1/runs/acme/moved/credential",
        {"generation": 1, "credential": "t", "authority_expires_at": at(later)},
    )
    assert answer.json()["authority_expires_at"] == at(later)
    link.hold_self_test.set()
    running = await status(stack, "moved", "revoked")
    async with operator(stack) as op:
        assert (await op.get_identity(running["run_agent_id"]))["expires_at"] == at(later)


async def test_a_permanent_refusal_fails_the_run_at_once(stack: RunsStack) -> None:
    link = await restart_with(stack)
    link.create_errors.append(ProxyError("expires_at is more than 7 days away", code="expiry_invalid", status=400))
    await stack.call("POST", "/v1/runs", stack.launch_body("refused", "@fake reply: never"))
    async with asyncio.timeout(10):  # at once, not after minutes of retries
        final = await status(stack, "refused", "failed")
    assert final["state"] == "failed", final
    assert (final["failure"], final["failure_detail"], final["pending"]) == ("spawn_error", "expiry_invalid", None)
    assert (final["revoked"], final["revocation_proof"]) == (True, "cllama_ack")
    assert link.create_calls == 1


async def test_a_retryable_refusal_is_retried_and_explained_in_pending(stack: RunsStack) -> None:
    link = await restart_with(stack)
    link.create_errors += [
        ProxyError("away", code="proxy_unreachable", status=503, retryable=True),
        ProxyError("away", code="proxy_unreachable", status=503, retryable=True),
    ]
    await stack.call("POST", "/v1/runs", stack.launch_body("patient", "@fake reply: in the end"))

    async def pending() -> str | None:
        return (await status(stack, "patient"))["pending"]  # type: ignore[no-any-return]

    assert await eventually(pending, what="a pending explanation") == "proxy_unreachable: retrying"
    final = await status(stack, "patient", "stopped")
    assert (final["state"], final["pending"]) == ("stopped", None)
    assert link.create_calls == 3


async def test_an_authority_near_the_proxys_seven_days_still_runs(stack: RunsStack) -> None:
    await stack.recompile(lambda text: text.replace("max-authority: 30m", "max-authority: 168h"))
    body = stack.launch_body("week", "@fake reply: a week")
    body["authority_expires_at"] = at(SystemClock().now() + timedelta(days=7) - timedelta(seconds=30))
    assert (await stack.call("POST", "/v1/runs", body)).status == 202
    final = await status(stack, "week", "stopped")
    assert (final["state"], final["failure"]) == ("stopped", None), final


# ---------------------------------------------------------------------------------------------------- pins


async def test_a_run_accepted_under_one_chain_fails_mismatch_at_spawn_after_a_recompile(stack: RunsStack) -> None:
    link = await restart_with(stack)
    link.hold_self_test.clear()  # admitted, but its worker has not started when the pod is recompiled
    body = stack.launch_body("pinned", "@fake reply: never")
    admitted = (await stack.call("POST", "/v1/runs", body)).json()
    await stack.recompile(lambda text: text.replace("primary: local/clawstack-fake", "primary: local/another-model"))
    final = await status(stack, "pinned", "failed")
    assert (final["state"], final["failure"], final["failure_detail"]) == ("failed", "mismatch", "template_recompiled")
    assert final["started_at"] is None
    assert final["revocation_proof"] == "cllama_ack"
    # A repeat of the admitted launch returns the run unchanged, whatever was compiled since.
    again = await stack.call("POST", "/v1/runs", body)
    assert again.status == 200
    assert (again.json()["template_id"], again.json()["models"]) == (admitted["template_id"], admitted["models"])


async def test_a_runner_whose_installed_code_changed_fails_mismatch(
    stack: RunsStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_backend, "installed_runner_digest", lambda runner_type: "sha256:" + "0" * 64)
    await stack.call("POST", "/v1/runs", stack.launch_body("stale-code", "@fake reply: never"))
    final = await status(stack, "stale-code", "failed")
    assert (final["failure"], final["failure_detail"], final["started_at"]) == ("mismatch", "runner_changed", None)


# ----------------------------------------------------------------------------------------------------- pod


async def test_the_pod_is_named_as_it_declares_itself(stack: RunsStack) -> None:
    assert stack.pod.name != "example"  # the example pod declares x-claw.pod: example
    assert (await stack.call("GET", "/v1/identity")).json()["pod"] == "example"
    assert (await stack.call("GET", "/v1/health")).json()["pod"] == "example"
    await stack.call("POST", "/v1/runs", stack.launch_body("named", "@fake reply: x\n@fake delay-ms: 3000"))
    running = await status(stack, "named", "running")
    workers = await stack.supervisor.backend.list_workers()
    assert [(w.pod, w.run_id) for w in workers] == [("example", "named")]
    async with operator(stack) as op:
        assert (await op.get_identity(running["run_agent_id"]))["labels"]["pod"] == "example"
    assert running["run_agent_id"] == identity_id(stack.supervisor.record(("acme", "named")))


# ------------------------------------------------------------------------------------------ not built yet


@pytest.mark.parametrize(
    ("name", "change"),
    [("homey", {"profile": "task_home", "backend": "compose"}), ("boxed", {"backend": "compose"})],
)
async def test_a_template_whose_runs_are_not_built_is_refused_before_any_record(
    stack: RunsStack, name: str, change: dict[str, Any]
) -> None:
    # A compiled template as claw up would write it for such a pod: verified by its own id and context digest.
    paths = PodPaths(stack.pod.resolve())
    document = {**json.loads((paths.templates / "worker.json").read_text()), **change, "name": name}
    del document["id"]
    document["id"] = spec_digest(document)
    write_private(paths.templates / f"{name}.json", json.dumps(document).encode())
    write_private(paths.contexts / f"{name}.json", (paths.contexts / "worker.json").read_bytes())
    listed = (await stack.call("GET", "/v1/templates")).json()
    assert name in [t["name"] for t in listed["templates"]]
    body = stack.launch_body("unsupported", "@fake reply: never")
    body["spec"]["template"] = name
    body["spec_digest"] = spec_digest(body["spec"])
    refused = await stack.call("POST", "/v1/runs", body)
    assert (refused.status, refused.json()["error"]["code"]) == (422, "template_unsupported")
    assert (await stack.call("GET", "/v1/runs/acme/unsupported")).status == 404


async def test_a_template_file_with_unsafe_permissions_is_listed_as_invalid(stack: RunsStack) -> None:
    paths = PodPaths(stack.pod.resolve())
    (paths.templates / "worker.json").chmod(0o644)
    listed = await stack.call("GET", "/v1/templates")
    assert listed.status == 200
    assert listed.json()["invalid"] == ["worker"]
    assert "worker" not in [t["name"] for t in listed.json()["templates"]]
    refused = await stack.call("POST", "/v1/runs", stack.launch_body("unsafe"))
    assert (refused.status, refused.json()["error"]["code"]) == (422, "template_unknown")
