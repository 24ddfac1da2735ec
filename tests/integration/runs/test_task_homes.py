"""Task homes end to end on both backends, with the real Hermes agent against the scripted fake model: the first
run starts a session, a later run resumes exactly that session, deliverables and questions reach the requester,
one live run per home, the homes API, the meter, and what a worker can reach."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from clawstack.common.digest import spec_digest

from .conftest import BACKENDS, RunsStack, eventually

pytestmark = [pytest.mark.hermes, pytest.mark.slow]
both = pytest.mark.parametrize("stack", BACKENDS, indirect=True)


def home_launch(stack: RunsStack, run_id: str, task: str, home: str = "task-1", **extra: Any) -> dict[str, Any]:
    body = stack.launch_body(run_id, task)
    spec = {"template": "researcher", "task": task, "home": home, **extra}
    return body | {"spec": spec, "spec_digest": spec_digest(spec)}


async def finished(stack: RunsStack, run_id: str) -> dict[str, Any]:
    answer = await stack.call("GET", f"/v1/runs/acme/{run_id}?wait=stopped&timeout=60s")
    return answer.json()  # type: ignore[no-any-return]


def chats(stack: RunsStack) -> list[Any]:
    return [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]


@both
async def test_a_later_run_resumes_the_first_runs_session(stack: RunsStack) -> None:
    first = await stack.call("POST", "/v1/runs", home_launch(stack, "r1", "@fake reply: first answer"))
    assert first.status == 202, first.body
    one = await finished(stack, "r1")
    assert one["state"] == "stopped", one
    assert one["result"]["outcome"] == "answer"
    # Which credential class served the run's completed model calls, as one proxy process counted them.
    assert one["served_by"] == {"api_key": len(chats(stack))}, one
    assert one["served_by_complete"] is True
    assert "last_plan_failure" not in one  # no plan route was tried
    session = one["result"]["session"]
    assert (await stack.call("GET", "/v1/runs/acme/r1/result")).body == b"first answer"
    await stack.call("POST", "/v1/runs", home_launch(stack, "r2", "@fake reply: second answer"))
    two = await finished(stack, "r2")
    assert two["state"] == "stopped", two
    assert two["result"] == {"bytes": 13, "truncated": False, "outcome": "answer", "session": session}
    # The second run's model call carried the first turn: the same conversation, its task as the next message.
    last = chats(stack)[-1].body["messages"]
    turns = [(m["role"], m["content"]) for m in last if m["role"] in ("user", "assistant")]
    assert turns == [
        ("user", "@fake reply: first answer"),
        ("assistant", "first answer"),
        ("user", "@fake reply: second answer"),
    ]
    system = last[0]["content"]
    assert "deliverables/" in system  # the contract tells it about its home
    assert ".claw-run/question.md" in system
    assert "Researcher" in system  # the template's contract


@both
async def test_deliverables_and_questions_reach_the_requester(stack: RunsStack) -> None:
    write = json.dumps({"path": "deliverables/report.md", "content": "# Report\n\nAll good.\n"})
    task = f"@fake tool-call: write_file {write}\n@fake reply: wrote the report"
    await stack.call("POST", "/v1/runs", home_launch(stack, "d1", task, home="reports"))
    done = await finished(stack, "d1")
    assert done["state"] == "stopped", done
    listed = (await stack.call("GET", "/v1/homes/acme/reports/deliverables")).json()
    content = b"# Report\n\nAll good.\n"
    digest = hashlib.sha256(content).hexdigest()
    assert listed["truncated"] is False
    assert [(d["name"], d["bytes"], d["sha256"]) for d in listed["deliverables"]] == [("report.md", 20, digest)]
    fetched = (await stack.call("GET", f"/v1/homes/acme/reports/deliverables/report.md?sha256={digest}")).json()
    assert base64.b64decode(fetched["content_base64"]) == content
    stale = await stack.call("GET", f"/v1/homes/acme/reports/deliverables/report.md?sha256={'0' * 64}")
    assert (stale.status, stale.json()["error"]["code"]) == (409, "deliverable_changed")
    assert "content_base64" not in stale.body.decode()
    # A worker that needs a person leaves a question and ends its turn.
    ask = json.dumps({"path": ".claw-run/question.md", "content": "Which quarter?"})
    await stack.call(
        "POST",
        "/v1/runs",
        home_launch(stack, "d2", f"@fake tool-call: write_file {ask}\n@fake reply: asked", home="reports"),
    )
    asked = await finished(stack, "d2")
    assert asked["state"] == "stopped", asked
    assert asked["result"]["outcome"] == "question"
    assert asked["result"]["session"] == done["result"]["session"]
    assert (await stack.call("GET", "/v1/runs/acme/d2/result")).body == b"Which quarter?"


@both
async def test_one_live_run_per_home_and_the_homes_api(stack: RunsStack) -> None:
    slow = home_launch(stack, "h1", "@fake delay-ms: 4000\n@fake reply: slow", home="busy")
    assert (await stack.call("POST", "/v1/runs", slow)).status == 202
    busy = await stack.call("POST", "/v1/runs", home_launch(stack, "h2", "@fake reply: no", home="busy"))
    assert (busy.status, busy.json()["error"]["code"]) == (409, "home_busy")
    assert (await stack.call("POST", "/v1/runs", slow)).status == 200  # a repeat answers with the run
    other = await stack.call("POST", "/v1/runs", home_launch(stack, "h3", "@fake reply: elsewhere", home="other"))
    assert other.status == 202
    reserved = (await stack.call("GET", "/v1/homes/acme/busy")).json()
    assert reserved["reserved_by"] == "h1"  # from admission, before its worker (and the home) exists
    await stack.call("GET", "/v1/runs/acme/h1?wait=running&timeout=30s")
    reserved = (await stack.call("GET", "/v1/homes/acme/busy")).json()
    assert reserved == {"installation": "acme", "home": "busy", "exists": True, "reserved_by": "h1"}
    refused = await stack.call("DELETE", "/v1/homes/acme/busy")
    assert (refused.status, refused.json()["error"]["code"]) == (409, "home_busy")
    first = await finished(stack, "h1")
    assert first["state"] == "stopped", first
    assert (await stack.call("GET", "/v1/homes/acme/busy")).json()["reserved_by"] is None
    assert (await stack.call("DELETE", "/v1/homes/acme/busy")).json()["deleted"] is True
    unknown = await stack.call("GET", "/v1/homes/acme/busy")
    assert (unknown.status, unknown.json()["error"]["code"]) == (404, "home_unknown")
    # Deleting resets the task: the next run starts with an empty home and a new session.
    await stack.call("POST", "/v1/runs", home_launch(stack, "h4", "@fake reply: afresh", home="busy"))
    fresh = await finished(stack, "h4")
    assert fresh["result"]["session"] != first["result"]["session"]
    await finished(stack, "h3")


@both
async def test_home_is_required_for_a_task_home_template_and_refused_for_a_stateless_one(stack: RunsStack) -> None:
    spec = {"template": "researcher", "task": "x"}
    body = stack.launch_body("n1") | {"spec": spec, "spec_digest": spec_digest(spec)}
    missing = await stack.call("POST", "/v1/runs", body)
    assert missing.status == 400
    assert "home is required" in missing.json()["error"]["message"]
    stateless = await stack.call("POST", "/v1/runs", stack.launch_body("n2", "x", home="h"))
    assert stateless.status == 400
    assert "refused for a stateless" in stateless.json()["error"]["message"]
    for bad in (".hidden", "", "a" * 129, "a/b", "a b"):
        spec = {"template": "researcher", "task": "x", "home": bad}
        answer = await stack.call(
            "POST", "/v1/runs", stack.launch_body("n3") | {"spec": spec, "spec_digest": spec_digest(spec)}
        )
        assert answer.status == 400, bad
    ok = {"template": "researcher", "task": "@fake reply: max", "home": "a" * 128}
    assert (
        await stack.call("POST", "/v1/runs", stack.launch_body("n4") | {"spec": ok, "spec_digest": spec_digest(ok)})
    ).status == 202
    await eventually(lambda: stack.supervisor.record(("acme", "n4")).terminal, timeout_s=60, what="n4 ending")


def terminal(command: str) -> str:
    return "@fake tool-call: terminal " + json.dumps({"command": command})


async def test_a_local_worker_reaches_nothing_but_the_proxy_and_never_holds_its_token_in_the_home(
    stack: RunsStack,
) -> None:
    port = stack.fake.base_url.rsplit(":", 1)[1].split("/")[0]
    probe = (
        f"(echo > /dev/tcp/127.0.0.1/{port}) > deliverables/net.txt 2>&1; echo exit=$? >> deliverables/net.txt; "
        "env > deliverables/env.txt"  # what a worker that looks for its token in its environment finds
    )
    task = terminal(probe) + "\n@fake reply: probed"
    await stack.call("POST", "/v1/runs", home_launch(stack, "p1", task, home="probe"))
    done = await finished(stack, "p1")
    assert done["state"] == "stopped", done
    fetched = (await stack.call("GET", "/v1/homes/acme/probe/deliverables/net.txt")).json()
    text = base64.b64decode(fetched["content_base64"]).decode()
    assert "Connection refused" in text
    assert "exit=1" in text  # the model's own port on the host is not reachable from the worker's network
    listed = (await stack.call("GET", "/v1/homes/acme/probe/deliverables/env.txt")).json()
    environment = base64.b64decode(listed["content_base64"]).decode()
    assert "run-" not in environment  # no credential (nor its identity) in a shell's environment
    assert "CLAW_WORKER_CONFIG" not in environment
    home = stack.supervisor.homes.path("acme", "probe")
    identity = done["run_agent_id"].encode()
    for path in home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert identity not in path.read_bytes(), path.relative_to(home)
    assert str(stack.pod) not in json.dumps(done)  # no host path in the status


@both
async def test_crossing_max_bytes_ends_the_run_home_full(stack: RunsStack) -> None:
    await stack.recompile(lambda text: text.replace("max-bytes: 256m", "max-bytes: 1m"))
    task = terminal("head -c 3000000 /dev/zero > big.bin") + "\n@fake delay-ms: 3000\n@fake reply: filled"
    await stack.call("POST", "/v1/runs", home_launch(stack, "f1", task, home="full"))
    ended = (await stack.call("GET", "/v1/runs/acme/f1?wait=failed&timeout=60s")).json()
    assert (ended["state"], ended["failure"]) == ("failed", "home_full"), ended
    assert ended["revoked"] is True
    assert await stack.supervisor.backend.list_workers() == []  # neither the worker nor its meter remain
    # The home stays (a watchdog, not a cleanup): delete it to reset the task.
    assert (await stack.call("DELETE", "/v1/homes/acme/full")).json()["deleted"] is True


@both
async def test_a_killed_supervisor_keeps_the_home_reserved_until_teardown(stack: RunsStack) -> None:
    from clawstack.common.uds import AsyncUnixClient

    from .test_crash_safety import kill, serve

    await stack.server.stop()
    proc = await asyncio.to_thread(serve, stack.pod, stack.socket_dir)
    client = AsyncUnixClient(stack.socket_dir / "runs.sock")
    try:
        slow = home_launch(stack, "k1", "@fake delay-ms: 4000\n@fake reply: survived", home="kept")
        assert (await client.request("POST", "/v1/runs", json_body=slow)).status == 202
        await client.request("GET", "/v1/runs/acme/k1?wait=running&timeout=30s", timeout_s=40)
        await asyncio.to_thread(kill, proc)
        proc = await asyncio.to_thread(serve, stack.pod, stack.socket_dir)
        other = home_launch(stack, "k2", "@fake reply: no", home="kept")
        busy = await client.request("POST", "/v1/runs", json_body=other)
        assert (busy.status, busy.json()["error"]["code"]) == (409, "home_busy")
        done = await client.request("GET", "/v1/runs/acme/k1?wait=stopped&timeout=60s", timeout_s=70)
        assert done.json()["state"] == "stopped", done.json()
        assert (await client.request("POST", "/v1/runs", json_body=other)).status == 202
        after = await client.request("GET", "/v1/runs/acme/k2?wait=stopped&timeout=60s", timeout_s=70)
        assert after.json()["result"]["session"] == done.json()["result"]["session"]
    finally:
        await client.close()
        await asyncio.to_thread(kill, proc)
    first_turns = [r for r in chats(stack) if r.body["messages"][-1]["content"].endswith("@fake reply: survived")]
    assert len(first_turns) == 1  # one worker, never two


FAILING_HERMES = """
import sys


def main():
    print("some output of hermes that must never reach a report", file=sys.stderr)
    return 7
"""


async def test_a_failed_turn_and_a_question_reach_status_ledger_and_end_callback(
    stack: RunsStack, tmp_path: Path
) -> None:
    from clawstack.runs.backends.local import LocalBackend
    from clawstack.runs.server import RunsServer
    from clawstack.runs.supervisor import Supervisor

    from .test_lifecycle import Orchestrator, start_orchestrator

    orchestrator = Orchestrator()
    runner, origin = await start_orchestrator(orchestrator)
    try:
        await stack.restart(callback_origin=origin, heartbeat_s=3600)
        ask = json.dumps({"path": ".claw-run/question.md", "content": "Which quarter?"})
        task = f"@fake tool-call: write_file {ask}\n@fake reply: asked"
        body = home_launch(stack, "q1", task, home="cb") | {"credential": "orchestrator-token-q"}
        await stack.call("POST", "/v1/runs", body)
        asked = await finished(stack, "q1")
        assert asked["result"]["outcome"] == "question", asked
        end = await eventually(lambda: [c for c in orchestrator.calls if c[0].endswith("/q1/end")], timeout_s=30)
        assert end[0][2] == {
            "installation": "acme",
            "run_id": "q1",
            "generation": 1,
            "outcome": "succeeded",
            "reason": "",
            "summary": "Which quarter?",
            "summary_truncated": False,
            "result_outcome": "question",
            "session": asked["result"]["session"],
            "served_by": asked["served_by"],
            "served_by_complete": True,
        }
        assert asked["served_by"]["api_key"] >= 2  # the tool round and the answer
        # A Hermes that fails: its exit code reaches only the ledger, the reason the status and the callback.
        site = tmp_path / "site"
        (site / "hermes_cli").mkdir(parents=True)
        (site / "hermes_cli" / "__init__.py").write_text("")
        (site / "hermes_cli" / "main.py").write_text(FAILING_HERMES)
        await stack.server.stop()
        backend = LocalBackend(stack.pod / ".claw-runs" / "workers", pod="example", hermes_site=site)
        stack.server = RunsServer(
            Supervisor(stack.pod, backend, callback_origin=origin, heartbeat_s=3600), stack.socket_dir
        )
        await stack.server.start()
        body = home_launch(stack, "x1", "@fake reply: never", home="cb") | {"credential": "orchestrator-token-x"}
        await stack.call("POST", "/v1/runs", body)
        failed = (await stack.call("GET", "/v1/runs/acme/x1?wait=failed&timeout=60s")).json()
        assert (failed["state"], failed["failure"], failed["exit_code"]) == ("failed", "worker_runner_exit", 3)
        assert failed["result"] is None
        assert "exit_observed" not in failed  # Hermes's own code is the ledger's, not the status's
        assert stack.supervisor.record(("acme", "x1")).exit_observed == {"runner_code": 7}
        end = await eventually(lambda: [c for c in orchestrator.calls if c[0].endswith("/x1/end")], timeout_s=30)
        assert end[0][2]["outcome"] == "failed"
        assert end[0][2]["reason"] == "worker_runner_exit"
        assert "result_outcome" not in end[0][2]
        assert "session" not in end[0][2]
        assert "hermes" not in json.dumps(failed)
    finally:
        await runner.cleanup()


async def restart_proxy(stack: RunsStack) -> None:
    """Restart the pod's proxy: its process under local, its container under compose."""
    if stack.supervisor.backend.name == "local":
        from clawstack.pod.artifacts import PodPaths
        from clawstack.pod.localproxy import LocalProxy

        proxy = LocalProxy(PodPaths(stack.pod.resolve()))
        current = proxy.running()
        assert current is not None
        await asyncio.to_thread(proxy.stop)
        await asyncio.to_thread(proxy.start, digest=current.digest)
        return
    from tests.docker_images import docker_client

    client = docker_client()
    try:
        wanted = [f"claw.pod={stack.supervisor.pod_name}", "claw.role=proxy"]
        (container,) = client.containers.list(filters={"label": wanted})
        await asyncio.to_thread(container.restart, timeout=10)
    finally:
        client.close()


@both
async def test_served_by_is_incomplete_when_the_proxy_restarted_during_the_run(stack: RunsStack) -> None:
    # A running worker reaches the restarted proxy: over the runs network under compose, and under local
    # through the socket's directory, which its sandbox binds (not the socket file the old proxy removed).
    before = len(chats(stack))
    task = terminal("sleep 8") + "\n@fake reply: across a restart"
    await stack.call("POST", "/v1/runs", home_launch(stack, "p1", task, home="restart"))
    await eventually(lambda: len(chats(stack)) > before, timeout_s=90, what="the first model call")
    await restart_proxy(stack)  # between the run's two model calls
    done = await finished(stack, "p1")
    assert done["state"] == "stopped", {k: done[k] for k in ("state", "failure", "exit_code")}
    assert done["served_by_complete"] is False  # another proxy process counted part of the run
    assert done["served_by"]["api_key"] >= 1
    assert (await stack.call("GET", "/v1/runs/acme/p1/result")).body == b"across a restart"


async def test_served_by_stays_complete_when_the_proxy_restarts_during_the_revocation(
    stack: RunsStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = stack.supervisor.proxy
    revoke = proxy.revoke
    restarted: list[str] = []

    async def restart_then_revoke(identity_id: str) -> Any:
        if not restarted:  # after the run's last call: the worker is gone
            restarted.append(identity_id)
            await restart_proxy(stack)
        return await revoke(identity_id)

    monkeypatch.setattr(proxy, "revoke", restart_then_revoke)
    await stack.call("POST", "/v1/runs", home_launch(stack, "p2", "@fake reply: counted", home="restart2"))
    done = await finished(stack, "p2")
    assert restarted
    assert done["state"] == "stopped", {k: done[k] for k in ("state", "failure", "exit_code")}
    assert done["served_by"] == {"api_key": 1}
    assert done["served_by_complete"] is True  # the restart came after the last call: nothing was lost


async def test_a_stateless_run_reports_no_served_by(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", stack.launch_body("s1"))
    stateless = (await stack.call("GET", "/v1/runs/acme/s1?wait=stopped&timeout=60s")).json()
    assert stateless["state"] == "stopped", stateless
    assert not {"served_by", "served_by_complete", "last_plan_failure"} & set(stateless)


@both
async def test_a_turn_killed_mid_way_is_resumed_from_the_last_stored_turn(stack: RunsStack) -> None:
    from clawstack.llm.fake import parse_script

    await stack.call("POST", "/v1/runs", home_launch(stack, "m1", "@fake reply: stored turn", home="mid"))
    first = await finished(stack, "m1")
    # The killed turn's model call is held by a one-time script step (its text carries no directive, so the
    # next turn, which carries it as history, is not held too).
    stack.fake.add_script_steps(parse_script([{"match": "KILLED-TURN", "reply": "never stored", "delay_ms": 30000}]))
    await stack.call("POST", "/v1/runs", home_launch(stack, "m2", "KILLED-TURN: take your time", home="mid"))
    await stack.call("GET", "/v1/runs/acme/m2?wait=running&timeout=30s")
    await asyncio.sleep(3)  # Hermes is up and its model call is held: the turn is mid-way
    cancelled = await stack.call("POST", "/v1/runs/acme/m2/cancel?wait=stopped&timeout=60s", {"generation": 1})
    assert cancelled.json()["state"] == "stopped"
    assert cancelled.json()["cancelled"] is True
    await stack.call("POST", "/v1/runs", home_launch(stack, "m3", "@fake reply: resumed", home="mid"))
    third = await finished(stack, "m3")
    assert third["state"] == "stopped", third
    assert third["result"]["session"] == first["result"]["session"]
    assert (await stack.call("GET", "/v1/runs/acme/m3/result")).body == b"resumed"
    messages = chats(stack)[-1].body["messages"]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert replies == ["stored turn"]  # the last stored turn is there; the killed one stored no reply
    assert "KILLED-TURN" in json.dumps(messages)  # what the killed turn was asked stays in the conversation


@pytest.mark.parametrize("stack", BACKENDS[1:], indirect=True)
async def test_a_compose_worker_reaches_only_its_forwarder(stack: RunsStack) -> None:
    await stack.call("POST", "/v1/runs", home_launch(stack, "c1", "@fake reply: first", home="probe"))
    first = await finished(stack, "c1")
    subnet = stack.supervisor.record(("acme", "c1")).subnet
    assert subnet is not None
    assert subnet.endswith("/28")
    host = str(next(ipaddress.ip_network(subnet).hosts()))  # the host's own address on the run's network
    port = stack.fake.base_url.rsplit(":", 1)[1].split("/")[0]

    def reach(name: str, target: str) -> str:
        return f"(timeout 3 bash -c 'echo > /dev/tcp/{target}') >> deliverables/net.txt 2>&1; echo {name}=$? >> deliverables/net.txt"

    probe = "; ".join(
        [reach("forwarder", "forwarder/8080"), reach("proxy", "cllama/8080"), reach("host", f"{host}/{port}")]
    )
    task = terminal(probe + "; env > deliverables/env.txt") + "\n@fake reply: probed"
    await stack.call("POST", "/v1/runs", home_launch(stack, "c2", task, home="probe"))
    done = await finished(stack, "c2")
    assert done["state"] == "stopped", done
    assert done["result"]["session"] == first["result"]["session"]
    assert done["isolation"]["enforced"][-3:] == ["home_mount_only", "run_network_only", "host_input_dropped"]
    text = base64.b64decode(
        (await stack.call("GET", "/v1/homes/acme/probe/deliverables/net.txt")).json()["content_base64"]
    )
    assert b"forwarder=0" in text  # its one route out
    assert b"proxy=0" not in text  # the proxy is not on its network
    assert b"host=0" not in text  # nor is the host, on the address its own network gives it
    env = base64.b64decode(
        (await stack.call("GET", "/v1/homes/acme/probe/deliverables/env.txt")).json()["content_base64"]
    )
    assert b"run-" not in env


@pytest.mark.parametrize("stack", BACKENDS[1:], indirect=True)
async def test_a_compose_task_home_launch_without_an_address_block_is_network_unavailable(
    stack: RunsStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAW_RUN_SUBNET_BASE", "10.77.0.0/28")  # room for one run's network
    slow = home_launch(stack, "b1", "@fake delay-ms: 3000\n@fake reply: held", home="one")
    assert (await stack.call("POST", "/v1/runs", slow)).status == 202
    full = await stack.call("POST", "/v1/runs", home_launch(stack, "b2", "@fake reply: no", home="two"))
    assert (full.status, full.json()["error"]["code"]) == (503, "network_unavailable")
    assert (await stack.call("GET", "/v1/runs/acme/b2")).status == 404  # nothing was recorded
    assert (await stack.call("POST", "/v1/runs", slow)).status == 200  # a repeat is not a new allocation
    monkeypatch.setenv("CLAW_RUN_SUBNET_BASE", "8.8.8.0/24")
    bad = await stack.call("POST", "/v1/runs", home_launch(stack, "b3", "@fake reply: no", home="three"))
    assert (bad.status, bad.json()["error"]["code"]) == (503, "network_unavailable")
    monkeypatch.setenv("CLAW_RUN_SUBNET_BASE", "10.77.0.0/28")
    assert (await finished(stack, "b1"))["state"] == "stopped"
    assert (
        await stack.call("POST", "/v1/runs", home_launch(stack, "b4", "@fake reply: freed", home="two"))
    ).status == 202
    assert (await finished(stack, "b4"))["state"] == "stopped"


@both
async def test_concurrent_launches_for_one_home_admit_exactly_one(stack: RunsStack) -> None:
    bodies = [home_launch(stack, f"race-{i}", "@fake reply: won", home="race") for i in range(5)]
    answers = await asyncio.gather(*(stack.call("POST", "/v1/runs", body) for body in bodies))
    statuses = sorted(answer.status for answer in answers)
    assert statuses == [202, 409, 409, 409, 409]
    assert {a.json()["error"]["code"] for a in answers if a.status == 409} == {"home_busy"}
    (winner,) = [body["run_id"] for body, answer in zip(bodies, answers, strict=True) if answer.status == 202]
    assert (await finished(stack, winner))["state"] == "stopped"
    # Two installations that use one id get two homes, and do not hold each other's.
    other = home_launch(stack, "race-beta", "@fake reply: beta", home="race") | {"installation": "beta"}
    assert (await stack.call("POST", "/v1/runs", other)).status == 202
    done = (await stack.call("GET", "/v1/runs/beta/race-beta?wait=stopped&timeout=60s")).json()
    assert done["state"] == "stopped", done
    assert stack.supervisor.homes.path("beta", "race") != stack.supervisor.homes.path("acme", "race")
