"""The lifecycle through real workers: restarts and re-adoption, cancellation, deadlines, authority, callbacks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from aiohttp import web

from clawstack.common.clock import SystemClock
from clawstack.common.errors import ClawError
from clawstack.common.uds import AsyncUnixClient
from clawstack.pod.artifacts import PodPaths
from clawstack.runs.backends.base import RunLabels

from .conftest import BACKENDS, RunsStack, eventually, make_server

pytestmark = pytest.mark.parametrize("stack", BACKENDS, indirect=True)


async def wait_state(stack: RunsStack, run_id: str, state: str) -> dict[str, Any]:
    return (await stack.call("GET", f"/v1/runs/acme/{run_id}?wait={state}&timeout=60s")).json()  # type: ignore[no-any-return]


async def test_a_supervisor_restart_re_adopts_the_worker(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("adopt", "@fake reply: survived\n@fake delay-ms: 1500"))
    running = await wait_state(stack, "adopt", "running")
    assert running["state"] == "running"
    await stack.restart()  # drivers stop; the worker keeps going; the new supervisor reconciles
    done = await wait_state(stack, "adopt", "stopped")
    assert done["state"] == "stopped", done
    assert (await stack.call("GET", "/v1/runs/acme/adopt/result")).body == b"survived"
    chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    assert len(chat) == 1  # never a second worker


async def test_sigkill_of_the_supervisor_process_then_restart(stack: RunsStack) -> None:
    # Hand the pod to a supervisor in its own process, kill it with SIGKILL mid-run, start another.
    await stack.server.stop()
    paths = PodPaths(stack.pod.resolve())
    argv = [
        sys.executable,
        "-m",
        "clawstack",
        "runs",
        "serve",
        "--pod",
        str(stack.pod),
        "--socket-dir",
        str(stack.socket_dir),
    ]

    def serve() -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("runs listening: ")
        return proc

    first = serve()
    started = [first]
    client = AsyncUnixClient(stack.socket_dir / "runs.sock")
    try:
        body = stack.launch_body("killed", "@fake reply: outlived\n@fake delay-ms: 1500")
        assert (await client.request("POST", "/v1/runs", json_body=body)).status == 202
        status = await client.request("GET", "/v1/runs/acme/killed?wait=running&timeout=30s")
        assert status.json()["state"] == "running"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = serve()  # the lock died with the first process
        started.append(second)
        try:
            done = (await client.request("GET", "/v1/runs/acme/killed?wait=stopped&timeout=60s", timeout_s=90)).json()
            assert done["state"] == "stopped", done
            assert done["revoked"] is True
            assert (await client.request("GET", "/v1/runs/acme/killed/result")).body == b"outlived"
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
    finally:
        await client.close()
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
    chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    assert len(chat) == 1
    assert not list((paths.runs / "workers").glob("acme/killed/monitor.pid"))
    stack.server = make_server(stack.pod, stack.socket_dir)
    await stack.server.start()


async def test_cancel_while_running_removes_the_worker_and_revokes(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("c1", "@fake reply: never\n@fake delay-ms: 20000"))
    await wait_state(stack, "c1", "running")
    answer = (await stack.call("POST", "/v1/runs/acme/c1/cancel?wait=stopped&timeout=60s", {"generation": 1})).json()
    assert answer["state"] == "stopped"
    assert answer["cancelled"] is True
    assert answer["revoked"] is True
    assert answer["result"] is None
    labels = RunLabels(pod=stack.supervisor.pod_name, installation="acme", run_id="c1")
    assert (await stack.supervisor.backend.inspect(labels)).running is False
    again = (await stack.call("POST", "/v1/runs/acme/c1/cancel", {"generation": 1})).json()
    assert again["state"] == "stopped"  # idempotent


async def test_cancel_right_after_launch(stack: RunsStack) -> None:
    launched = await stack.call("POST", "/v1/runs", stack.launch_body("c0", "@fake reply: x\n@fake delay-ms: 5000"))
    assert launched.status == 202
    final = (await stack.call("POST", "/v1/runs/acme/c0/cancel?wait=stopped&timeout=60s", {"generation": 1})).json()
    assert final["state"] == "stopped"
    assert final["cancelled"] is True
    assert final["result"] is None
    assert final["revoked"] is True


async def test_the_deadline_fails_a_slow_run(stack: RunsStack) -> None:
    spec_task = "@fake reply: too late\n@fake delay-ms: 30000"
    body = stack.launch_body("slowpoke", spec_task, max_runtime_seconds=1)
    assert (await stack.call("POST", "/v1/runs", body)).status == 202
    done = await wait_state(stack, "slowpoke", "failed")
    assert done["state"] == "failed", done
    assert done["failure"] == "timeout"
    assert done["revoked"] is True


async def test_authority_expiry_fails_the_run(stack: RunsStack) -> None:
    body = stack.launch_body("auth", "@fake reply: late\n@fake delay-ms: 30000")
    body["authority_expires_at"] = (SystemClock().now() + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (await stack.call("POST", "/v1/runs", body)).status == 202
    done = await wait_state(stack, "auth", "failed")
    assert done["failure"] == "authority_expired", done
    assert done["revoked"] is True


class Orchestrator:
    def __init__(self, status: int = 200) -> None:
        self.calls: list[tuple[str, str | None, dict[str, Any]]] = []
        self.status = status

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            self.calls.append((request.path, request.headers.get("Authorization"), await request.json()))
            return web.json_response({}, status=self.status)

        app = web.Application()
        app.router.add_post("/runs/{installation}/{run_id}/{kind}", handle)
        return app


async def start_orchestrator(orchestrator: Orchestrator) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(orchestrator.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_callbacks_start_and_end_with_the_credential(stack: RunsStack) -> None:
    orchestrator = Orchestrator()
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=3600)
        body = {**stack.launch_body("cb", "@fake reply: the summary"), "credential": "orchestrator-token-1"}
        launched = (await stack.call("POST", "/v1/runs", body)).json()
        assert launched["credential"] == "held"
        done = await wait_state(stack, "cb", "stopped")
        for _ in range(200):
            if (
                len(orchestrator.calls) >= 2
                and (await stack.call("GET", "/v1/runs/acme/cb")).json()["callbacks"]["end"] == "acked"
            ):
                break
            await asyncio.sleep(0.05)
        kinds = [path.rsplit("/", 1)[1] for path, _, _ in orchestrator.calls]
        assert kinds == ["start", "end"], kinds
        assert all(auth == "Bearer orchestrator-token-1" for _, auth, _ in orchestrator.calls)
        end = orchestrator.calls[1][2]
        assert end == {
            "installation": "acme",
            "run_id": "cb",
            "generation": 1,
            "outcome": "succeeded",
            "reason": "",
            "summary": "the summary",
            "summary_truncated": False,
        }
        final = (await stack.call("GET", "/v1/runs/acme/cb")).json()
        assert final["callbacks"] == {"start": "acked", "end": "acked"}
        assert done["state"] == "stopped"
        credential_file = PodPaths(stack.pod.resolve()).runs / "secrets" / "acme" / "cb.credential"
        assert oct(os.stat(credential_file).st_mode & 0o777) == oct(0o600)
        assert "orchestrator-token-1" not in json.dumps(final)
    finally:
        await runner.cleanup()


async def test_a_401_callback_tears_the_run_down_and_no_end_after_cancel(stack: RunsStack) -> None:
    orchestrator = Orchestrator(status=401)
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=3600)
        body = {**stack.launch_body("cb401", "@fake reply: x\n@fake delay-ms: 20000"), "credential": "tok"}
        await stack.call("POST", "/v1/runs", body)
        done = await wait_state(stack, "cb401", "failed")
        assert done["failure"] == "authority_expired", done
        assert done["callbacks"]["start"] == "rejected"
        orchestrator.status = 200
        body = {**stack.launch_body("cbcancel", "@fake reply: x\n@fake delay-ms: 20000"), "credential": "tok"}
        await stack.call("POST", "/v1/runs", body)
        await wait_state(stack, "cbcancel", "running")
        await stack.call("POST", "/v1/runs/acme/cbcancel/cancel?wait=stopped&timeout=60s", {"generation": 1})
        await asyncio.sleep(0.3)  # give a wrongly sent end the time to arrive before asserting it did not
        kinds = [path for path, _, _ in orchestrator.calls if "/cbcancel/" in path]
        assert not any(path.endswith("/end") for path in kinds), kinds
    finally:
        await runner.cleanup()


async def test_heartbeats_while_running(stack: RunsStack) -> None:
    orchestrator = Orchestrator()
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=0.2)
        body = {**stack.launch_body("hb", "@fake reply: beat\n@fake delay-ms: 1500"), "credential": "hb-token"}
        await stack.call("POST", "/v1/runs", body)
        await wait_state(stack, "hb", "stopped")
        for _ in range(200):
            if any(path.endswith("/end") for path, _, _ in orchestrator.calls):
                break
            await asyncio.sleep(0.05)
        kinds = [path.rsplit("/", 1)[1] for path, _, _ in orchestrator.calls]
        assert kinds[0] == "start"
        assert kinds[-1] == "end"
        assert kinds.count("heartbeat") >= 2, kinds
        assert set(kinds[1:-1]) == {"heartbeat"}
        beat = next(body for path, _, body in orchestrator.calls if path.endswith("/heartbeat"))
        assert beat == {"installation": "acme", "run_id": "hb", "generation": 1}
    finally:
        await runner.cleanup()


async def test_a_model_failure_is_exit_nonzero_with_no_result(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("broken", "@fake fail: 400"))
    done = await wait_state(stack, "broken", "failed")
    assert done["state"] == "failed"
    assert done["failure"] == "exit_nonzero"
    assert done["exit_code"] == 4
    assert done["result"] is None
    assert done["revoked"] is True
    missing = await stack.call("GET", "/v1/runs/acme/broken/result")
    assert (missing.status, missing.json()["error"]["code"]) == (409, "result_unavailable")


async def test_a_run_whose_worker_never_started_gets_an_end_and_no_start(
    stack: RunsStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    orchestrator = Orchestrator()
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=3600)

        async def refuse(spec: object) -> None:
            raise ClawError("the sandbox cannot start", code="spawn_failed")

        monkeypatch.setattr(stack.supervisor.backend, "spawn", refuse)
        body = {**stack.launch_body("nostart", "@fake reply: never"), "credential": "orchestrator-token-2"}
        await stack.call("POST", "/v1/runs", body)
        final = await wait_state(stack, "nostart", "failed")
        assert (final["failure"], final["started_at"]) == ("spawn_error", None)

        async def ended() -> bool:
            status = (await stack.call("GET", "/v1/runs/acme/nostart")).json()
            return bool(status["callbacks"]["end"] == "acked")

        await eventually(ended, what="the end callback")
        kinds = [path.rsplit("/", 1)[1] for path, _, _ in orchestrator.calls]
        assert kinds == ["end"], kinds
        assert (orchestrator.calls[0][2]["outcome"], orchestrator.calls[0][2]["reason"]) == ("failed", "spawn_error")
        status = (await stack.call("GET", "/v1/runs/acme/nostart")).json()
        assert status["callbacks"] == {"start": "skipped", "end": "acked"}
    finally:
        await runner.cleanup()


async def test_credential_replacement_and_a_lost_credential(stack: RunsStack) -> None:
    orchestrator = Orchestrator()
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=3600)
        launch = stack.launch_body("cred", "@fake reply: x\n@fake delay-ms: 1500")
        first = (await stack.call("POST", "/v1/runs", launch)).json()
        assert first["credential"] == "none"
        stale = await stack.call("POST", "/v1/runs/acme/cred/credential", {"generation": 0, "credential": "t"})
        assert stale.status == 400
        replaced = await stack.call("POST", "/v1/runs/acme/cred/credential", {"generation": 1, "credential": "t2"})
        assert replaced.json()["credential"] == "held"
        too_far = await stack.call(
            "POST",
            "/v1/runs/acme/cred/credential",
            {"generation": 1, "credential": "t3", "authority_expires_at": "2099-01-01T00:00:00Z"},
        )
        assert (too_far.status, too_far.json()["error"]["code"]) == (422, "grant_exceeded")
        before = (await stack.call("GET", "/v1/runs/acme/cred")).json()
        for past in ("2001-01-01T00:00:00Z", before["accepted_at"]):
            expired = await stack.call(
                "POST",
                "/v1/runs/acme/cred/credential",
                {"generation": 1, "credential": "t3", "authority_expires_at": past},
            )
            assert (expired.status, expired.json()["error"]["code"]) == (400, "request_invalid"), expired.body
        after = (await stack.call("GET", "/v1/runs/acme/cred")).json()
        assert after["authority_expires_at"] == before["authority_expires_at"]  # refused: nothing changed
        # A lost credential is recovered by repeating the launch with a reissued one: the same run, one worker.
        again = (await stack.call("POST", "/v1/runs", {**launch, "credential": "t4"})).json()
        assert again["accepted_at"] == first["accepted_at"]
        assert again["credential"] == "held"
        await wait_state(stack, "cred", "stopped")
        chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
        assert len(chat) == 1
        unknown = await stack.call("POST", "/v1/runs/acme/nope/credential", {"generation": 1, "credential": "t"})
        assert unknown.status == 404
    finally:
        await runner.cleanup()


async def test_a_restarted_supervisor_keeps_a_running_runs_heartbeats_going(stack: RunsStack) -> None:
    orchestrator = Orchestrator()
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=0.2)
        body = {**stack.launch_body("beats", "@fake reply: beat\n@fake delay-ms: 4000"), "credential": "hb"}
        await stack.call("POST", "/v1/runs", body)
        await wait_state(stack, "beats", "running")
        await eventually(lambda: any(path.endswith("/heartbeat") for path, _, _ in orchestrator.calls))
        await stack.restart(callback_origin=origin, heartbeat_s=0.2)
        before = len(orchestrator.calls)
        await wait_state(stack, "beats", "stopped")
        await eventually(lambda: orchestrator.calls and orchestrator.calls[-1][0].endswith("/end"))
        after = [path.rsplit("/", 1)[1] for path, _, _ in orchestrator.calls[before:]]
        assert after.count("heartbeat") >= 2, after  # the new supervisor's heartbeats
        assert after[-1] == "end"
        assert after.count("start") == 0  # start was acked before the restart: it is not sent again
    finally:
        await runner.cleanup()


async def test_a_start_never_acknowledged_is_delivered_after_a_restart_before_the_end(stack: RunsStack) -> None:
    orchestrator = Orchestrator(status=503)  # every callback is retried with backoff, none resolved
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=3600)
        body = {**stack.launch_body("unacked", "@fake reply: done\n@fake delay-ms: 1500"), "credential": "tok"}
        await stack.call("POST", "/v1/runs", body)
        await wait_state(stack, "unacked", "running")
        await eventually(lambda: orchestrator.calls)
        await stack.server.stop()  # the start is still being retried: it stays unresolved in the ledger
        orchestrator.status = 200
        orchestrator.calls.clear()
        await stack.restart(callback_origin=origin, heartbeat_s=3600)
        final = await wait_state(stack, "unacked", "stopped")
        await eventually(lambda: end_acked(stack, "unacked"))
        kinds = [path.rsplit("/", 1)[1] for path, _, _ in orchestrator.calls]
        assert kinds == ["start", "end"], kinds
        assert final["state"] == "stopped"
    finally:
        await runner.cleanup()


async def end_acked(stack: RunsStack, run_id: str) -> bool:
    return (await stack.call("GET", f"/v1/runs/acme/{run_id}")).json()["callbacks"]["end"] == "acked"  # type: ignore[no-any-return]
