"""The v1 API over the real socket: launches and every refusal, idempotence, status, long-polls, results."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from clawstack.common.digest import spec_digest

from .conftest import BACKENDS, RunsStack


async def launch(stack: RunsStack, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    resp = await stack.call("POST", "/v1/runs", body)
    return resp.status, resp.json()


@pytest.mark.parametrize("stack", BACKENDS, indirect=True)
async def test_a_run_goes_from_launch_to_its_answer(stack: RunsStack) -> None:
    status, first = await launch(
        stack, stack.launch_body("r1", "Summarize ticket 42\n@fake reply: Ticket 42: the printer is on fire.")
    )
    assert status == 202
    assert first["state"] in ("accepted", "running")
    status, again = await launch(
        stack, stack.launch_body("r1", "Summarize ticket 42\n@fake reply: Ticket 42: the printer is on fire.")
    )
    assert status == 200  # an idempotent retry returns the same run
    assert again["accepted_at"] == first["accepted_at"]
    done = (await stack.call("GET", "/v1/runs/acme/r1?wait=stopped&timeout=60s")).json()
    assert done["state"] == "stopped", done
    assert done["exit_code"] == 0
    assert done["revoked"] is True
    assert done["revocation_proof"] == "cllama_ack"
    assert done["failure"] is None
    isolation = done["isolation"]
    assert isolation["backend"] == stack.supervisor.backend.name
    if isolation["backend"] == "compose":
        assert isolation["mechanism"] == "container"
        assert {"read_only_root", "cap_drop_all", "runs_network_only", "host_input_dropped"} <= set(
            isolation["enforced"]
        )
    else:
        assert isolation["mechanism"] in ("bubblewrap", "none")
        assert ("read_only_root" in isolation["enforced"]) == (isolation["mechanism"] == "bubblewrap")
    result = await stack.call("GET", "/v1/runs/acme/r1/result")
    assert result.status == 200
    assert result.body.decode() == "Ticket 42: the printer is on fire."
    assert result.headers["X-Claw-Result-Truncated"] == "false"
    # The task reached the model only as the user message, with the template's contract as the system message.
    (request,) = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    assert request.body["messages"][-1]["content"].startswith("Summarize ticket 42")
    assert request.body["messages"][0]["role"] == "system"


BAD_BODIES: list[tuple[str, Any, str]] = [
    ("unknown field", {"extra": 1}, "request_invalid"),
    ("bad installation", {"installation": "Acme"}, "request_invalid"),
    ("bad run id", {"run_id": "a/b"}, "request_invalid"),
    ("generation zero", {"generation": 0}, "request_invalid"),
    ("generation bool", {"generation": True}, "request_invalid"),
    ("naive authority", {"authority_expires_at": "2030-01-01T00:00:00"}, "request_invalid"),
    ("authority in the past", {"authority_expires_at": "2020-01-01T00:00:00Z"}, "request_invalid"),
    ("wrong digest", {"spec_digest": "sha256:" + "0" * 64}, "digest_invalid"),
]


@pytest.mark.parametrize(("name", "change", "code"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
async def test_bad_launch_bodies(stack: RunsStack, name: str, change: dict[str, Any], code: str) -> None:
    body = {**stack.launch_body("bad"), **change}
    status, answer = await launch(stack, body)
    assert answer["error"]["code"] == code, answer
    assert answer["run"] is None
    assert status in (400, 409, 422)
    assert (await stack.call("GET", "/v1/runs/acme/bad")).status == 404  # nothing was recorded


BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("float", {"max_runtime_seconds": 1.5}, "request_invalid"),
    ("nested object", {"tools": {"a": 1}}, "request_invalid"),
    ("bool", {"task": True}, "request_invalid"),
    ("unknown field", {"priority": "high"}, "request_invalid"),
    ("no task", {"task": None}, "request_invalid"),
    ("non-string tool", {"tools": [1]}, "request_invalid"),
]


@pytest.mark.parametrize(("name", "change", "code"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
async def test_bad_specs(stack: RunsStack, name: str, change: dict[str, Any], code: str) -> None:
    spec: dict[str, Any] = {"template": "worker", "task": "x", **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    body = {**stack.launch_body("bad"), "spec": spec}
    body["spec_digest"] = (
        spec_digest(spec)
        if all(not isinstance(v, (float, dict, bool)) for v in spec.values())
        else "sha256:" + "0" * 64
    )
    status, answer = await launch(stack, body)
    assert answer["error"]["code"] == code, answer
    assert status == 400


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"installation": "acme", "installation": "acme"}', "request_invalid"),
        (b'{"spec": {"task": "\\ud800"}}', "request_invalid"),
        (b"\xff\xfe", "request_invalid"),
        (b"[1, 2]", "request_invalid"),
    ],
)
async def test_raw_bodies_the_strict_parser_refuses(stack: RunsStack, raw: bytes, code: str) -> None:
    resp = await stack.call("POST", "/v1/runs", raw=raw)
    assert resp.status == 400
    assert resp.json()["error"]["code"] == code


async def test_body_limit(stack: RunsStack) -> None:
    body = stack.launch_body("big", "x" * (70 * 1024))
    resp = await stack.call("POST", "/v1/runs", body)
    assert resp.status == 413
    assert resp.json()["error"]["code"] == "body_too_large"


async def test_grant_and_template_refusals(stack: RunsStack) -> None:
    templates = (await stack.call("GET", "/v1/templates")).json()
    (worker,) = [t for t in templates["templates"] if t["name"] == "worker"]
    current = worker["id"]
    cases = [
        ({"template": "nope", "task": "x"}, "template_unknown", 422),
        ({"template": "worker", "template_id": "sha256:" + "1" * 64, "task": "x"}, "template_changed", 409),
        (
            {"template": "worker", "task": "x", "tools": ["ticket-api.get_ticket", "ticket-api.delete"]},
            "grant_exceeded",
            422,
        ),
        ({"template": "worker", "task": "x", "max_runtime_seconds": 301}, "grant_exceeded", 422),
        ({"template": "worker", "task": "x" * 16385}, "grant_exceeded", 422),
        ({"template": "worker", "task": "x", "home": "h1"}, "request_invalid", 400),
    ]
    for index, (spec, code, status) in enumerate(cases):
        body = {**stack.launch_body(f"g{index}"), "spec": spec, "spec_digest": spec_digest(spec)}
        got, answer = await launch(stack, body)
        assert (got, answer["error"]["code"]) == (status, code), answer
        if code == "template_changed":
            assert answer["error"]["current_template_id"] == current
    far = {**stack.launch_body("g-auth"), "authority_expires_at": "2099-01-01T00:00:00Z"}
    got, answer = await launch(stack, far)
    assert (got, answer["error"]["code"]) == (422, "grant_exceeded")
    with_credential = {**stack.launch_body("g-cred"), "credential": "token-abc"}
    got, answer = await launch(stack, with_credential)
    assert (got, answer["error"]["code"]) == (422, "callbacks_disabled")
    pinned = {"template": "worker", "template_id": current, "task": "@fake reply: pinned"}
    got, _ = await launch(stack, {**stack.launch_body("g-pinned"), "spec": pinned, "spec_digest": spec_digest(pinned)})
    assert got == 202


async def test_digest_mismatch_generation_and_cancel_tombstones(stack: RunsStack) -> None:
    status, _ = await launch(stack, stack.launch_body("k1", "@fake reply: a\n@fake delay-ms: 2000"))
    assert status == 202
    status, answer = await launch(stack, stack.launch_body("k1", "something else"))
    assert (status, answer["error"]["code"]) == (409, "digest_mismatch")
    bumped = {**stack.launch_body("k1", "@fake reply: a\n@fake delay-ms: 2000"), "generation": 3}
    assert (await launch(stack, bumped))[0] == 200
    stale = await stack.call("POST", "/v1/runs/acme/k1/cancel", {"generation": 2})
    assert (stale.status, stale.json()["error"]["code"]) == (409, "stale_generation")
    cancelled = await stack.call("POST", "/v1/runs/acme/k1/cancel?wait=stopped&timeout=60s", {"generation": 3})
    final = cancelled.json()
    assert final["state"] == "stopped", final
    assert final["cancelled"] is True
    assert final["revoked"] is True
    again = await launch(stack, bumped)
    assert (again[0], again[1]["error"]["code"]) == (409, "cancelled")
    # An unknown key is tombstoned: a later launch of it is refused, whatever its generation.
    stone = await stack.call("POST", "/v1/runs/acme/never/cancel?wait=stopped&timeout=5s", {"generation": 1})
    assert stone.status == 200
    body = stone.json()
    assert set(body) >= set(final) - {"capture_epoch", "capture_epoch_observed_at"}  # the status shape
    assert (body["installation"], body["run_id"], body["generation"]) == ("acme", "never", 1)
    assert (body["state"], body["cancelled"], body["tombstone"]) == (None, True, True)
    assert (body["revoked"], body["credential"], body["callbacks"]) == (
        False,
        "none",
        {"start": "skipped", "end": "skipped"},
    )
    again_stone = await stack.call("POST", "/v1/runs/acme/never/cancel", {"generation": 5})
    assert again_stone.json() == body  # idempotent: the first tombstone's generation stays
    refused = await launch(stack, {**stack.launch_body("never"), "generation": 9})
    assert (refused[0], refused[1]["error"]["code"]) == (409, "cancelled")


async def test_status_of_a_run_never_accepted_and_other_endpoints(stack: RunsStack) -> None:
    missing = await stack.call("GET", "/v1/runs/acme/ghost")
    assert (missing.status, missing.json()["error"]["code"]) == (404, "not_found")
    bad = await stack.call("GET", "/v1/runs/Acme/ghost")
    assert bad.status == 400
    subscriptions = await stack.call("GET", "/v1/subscriptions")
    assert subscriptions.status == 200
    assert subscriptions.json() == {"subscriptions": [{"provider": "chatgpt", "state": "not_signed_in"}]}
    identity = (await stack.call("GET", "/v1/identity")).json()
    assert identity["protocol"] == 1
    health = (await stack.call("GET", "/v1/health")).json()
    assert health["status"] == "ok"
    assert (await stack.call("GET", "/v1/runs/acme/ghost/result")).status == 404


async def test_long_poll_times_out_with_the_current_status(stack: RunsStack) -> None:
    await launch(stack, stack.launch_body("slow", "@fake reply: late\n@fake delay-ms: 3000"))
    started = asyncio.get_running_loop().time()
    answer = (await stack.call("GET", "/v1/runs/acme/slow?wait=stopped&timeout=0.5s")).json()
    assert asyncio.get_running_loop().time() - started < 5
    assert answer["state"] in ("accepted", "running")
    over = await stack.call("GET", "/v1/runs/acme/slow?wait=stopped&timeout=61s")
    assert (over.status, over.json()["error"]["code"]) == (400, "request_invalid")
    bad_wait = await stack.call("GET", "/v1/runs/acme/slow?wait=accepted")
    assert bad_wait.status == 400


@pytest.mark.parametrize("stack", BACKENDS, indirect=True)
async def test_concurrent_identical_launches_make_one_run(stack: RunsStack) -> None:
    body = stack.launch_body("same", "@fake reply: once")
    answers = await asyncio.gather(*(launch(stack, body) for _ in range(10)))
    assert sorted(status for status, _ in answers) == [200] * 9 + [202]
    done = (await stack.call("GET", "/v1/runs/acme/same?wait=stopped&timeout=60s")).json()
    assert done["state"] == "stopped"
    chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    assert len(chat) == 1  # one worker, one model call


async def test_errors_never_echo_the_task(stack: RunsStack) -> None:
    secret_task = "confidential-task-text-" + "z" * 10
    body = {**stack.launch_body("echo", secret_task), "spec_digest": "sha256:" + "0" * 64}
    resp = await stack.call("POST", "/v1/runs", body)
    assert secret_task.encode() not in resp.body
    assert json.loads(resp.body)["error"]["code"] == "digest_invalid"


async def test_a_trickling_body_is_cut_off(stack: RunsStack) -> None:
    await stack.restart(body_timeout_s=0.5)
    reader, writer = await asyncio.open_unix_connection(str(stack.socket_dir / "runs.sock"))
    writer.write(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), timeout=10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(body)["error"]["code"] == "body_timeout"


async def test_the_supervisor_refuses_an_unsafe_socket_directory(stack: RunsStack) -> None:
    from clawstack.common.files import UnsafePathError

    from .conftest import make_server

    await stack.server.stop()
    loose = stack.socket_dir.parent / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    server = make_server(stack.pod, loose)
    with pytest.raises(UnsafePathError):
        await server.start()
    assert not (loose / "runs.sock").exists()
    await stack.restart()  # the lock was released: a proper start works


async def test_a_disallowed_peer_is_refused(stack: RunsStack) -> None:
    import os
    import shutil as sh
    import subprocess as sp

    python = sh.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root and a system python3 to connect as another user")
    sock = stack.socket_dir / "runs.sock"
    os.chmod(stack.socket_dir.parent, 0o711)
    os.chmod(stack.socket_dir, 0o711)
    os.chmod(sock, 0o666)
    script = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "s.sendall(b'GET /v1/identity HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "out=b''\n"
        "while True:\n"
        "    b=s.recv(65536)\n"
        "    if not b: break\n"
        "    out+=b\n"
        "sys.stdout.write(out.decode())\n"
    )
    done = await asyncio.to_thread(
        sp.run,
        [python, "-I", "-c", script, str(sock)],
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        timeout=20,
        check=True,
    )
    head, _, body = done.stdout.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 403")
    assert json.loads(body)["error"]["code"] == "peer_forbidden"


async def test_the_client_libraries(stack: RunsStack) -> None:
    from datetime import timedelta

    from clawstack.common.clock import SystemClock
    from clawstack.runs.client import AsyncRunsClient, RunsClient
    from clawstack.runs.errors import RunsError

    authority = SystemClock().now() + timedelta(minutes=5)
    async with AsyncRunsClient(stack.socket_dir / "runs.sock") as client:
        launched = await client.launch(
            "acme", "lib-1", {"template": "worker", "task": "@fake reply: via async"}, authority_expires_at=authority
        )
        assert launched["state"] in ("accepted", "running")
        done = await client.status("acme", "lib-1", wait="stopped", timeout_s=60)
        assert done["state"] == "stopped"
        assert await client.result("acme", "lib-1") == ("via async", False)
        with pytest.raises(RunsError) as info:
            await client.status("acme", "missing")
        assert info.value.code == "not_found"
        assert "worker" in [t["name"] for t in (await client.templates())["templates"]]

    def sync_calls() -> tuple[str, bool]:
        with RunsClient(stack.socket_dir / "runs.sock") as client:
            client.launch(
                "acme", "lib-2", {"template": "worker", "task": "@fake reply: via sync"}, authority_expires_at=authority
            )
            assert client.status("acme", "lib-2", wait="stopped", timeout_s=60)["state"] == "stopped"
            return client.result("acme", "lib-2")

    assert await asyncio.to_thread(sync_calls) == ("via sync", False)


async def test_subscriptions_and_doctor_show_the_plan_sign_in(stack: RunsStack) -> None:
    import stat

    from click.testing import CliRunner

    from clawstack.cli import cli
    from clawstack.pod.artifacts import PodPaths

    store = PodPaths(stack.pod).auth
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    doctor = await asyncio.to_thread(CliRunner().invoke, cli, ["runs", "doctor", "--pod", str(stack.pod)])
    assert (
        f"plan sign-in: chatgpt: not_signed_in; sign in with: claw proxy auth login chatgpt --pod {stack.pod.resolve()}"
        in doctor.output
    ), doctor.output
    status = await asyncio.to_thread(
        CliRunner().invoke, cli, ["proxy", "auth", "status", "--pod", str(stack.pod), "--json"]
    )
    assert '"not_signed_in"' in status.output, status.output
