"""Live operator authority on a running gateway: demoting a person, removing a role or unlinking an identity
(``users.*`` admin methods, or a config reload) revokes the authority of work retained for that requester.

Alice writes on the webhook channel; her identity is linked to the operator ``alice`` (``operator.admin``), so a
``require_auth`` command of hers carries an assertion, and the run it starts (``subagent.run(assert_current=…)``)
is retained under it. The subagent lane has one slot, held by a slow run, so her run is queued when the change
lands: it fails at once, visibly, instead of waiting for the slot.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.channels import signed_headers
from clawstack.gateway.config import parse_config
from clawstack.gateway.dispatch import Requester, RunRequest
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_ws_protocol import API_KEY, WAIT_S, Client, config_document, connected

SECRET = "webhook-secret-0123456789abcdef"

PLUGIN = """
started = {}

def register(api):
    async def delegate(ctx):
        run = await api.runtime.subagent.run(
            session_key="agent:main:subagent:alice-work",
            message="ALICE-WORK please",
            assert_current=ctx.assertion,
        )
        started["run"] = run.run_id
        return f"queued {run.run_id}"

    async def hog(ctx):
        run = await api.runtime.subagent.run(session_key="agent:main:subagent:hog", message="HOG slow")
        started["hog"] = run.run_id
        return "hogging"

    api.register_command("delegate", delegate, description="Start work for the sender", require_auth=True)
    api.register_command("hog", hog, description="Hold the subagent slot", require_auth=True)
"""


def document(base_url: str, *, alice_roles: list[str]) -> dict[str, Any]:
    doc = config_document(base_url)
    doc["agents"]["defaults"]["subagents"] = {"maxConcurrent": 1, "runTimeoutSeconds": 60}
    doc["plugins"] = {"entries": {"delegator": {"trust": "trusted"}}}
    doc["channels"] = {"webhook": {"enabled": True, "secret": SECRET, "allowFrom": ["alice"]}}
    doc["operators"] = [{"name": "alice", "roles": alice_roles, "links": [{"channel": "webhook", "id": "alice"}]}]
    return doc


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        server.add_script_steps(
            parse_script(
                [
                    {"match_user": "HOG", "reply": "done hogging", "delay_ms": 20_000},
                    {"match_user": "ALICE-WORK", "reply": "never"},
                ]
            )
        )
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    plugin = tmp_path / "plugins" / "delegator"
    plugin.mkdir(parents=True)
    (plugin / "claw.plugin.json").write_text(json.dumps({"id": "delegator", "version": "1.0.0", "entry": "plugin.py"}))
    (plugin / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    config = parse_config(document(fake.base_url, alice_roles=["operator.admin"]), base_dir=tmp_path, environ={})
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin]) as gateway:
        yield gateway


@pytest.fixture
async def admin(server: GatewayServer) -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as http:
        client = await connected(http, server.port)
        yield client
        await client.ws.close()


async def say(server: GatewayServer, sender: str, text: str, message_id: str) -> Any:
    body = json.dumps({"messageId": message_id, "sender": {"id": sender}, "text": text}).encode()
    headers = signed_headers(SECRET, body, timestamp=int(time.time()))
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{server.port}/channels/webhook"
        async with http.post(url, data=body, headers=headers) as res:
            assert res.status == 202
            return await res.json()


async def queued_alice_run(server: GatewayServer, fake: FakeModelServer) -> str:
    """Hold the slot, then have Alice queue her work behind it; the queued run's id."""
    hog = await say(server, "alice", "/hog", "m-hog")
    assert (await server.runs.wait_run(hog["runId"], WAIT_S)).state == "ok"  # type: ignore[union-attr]
    await fake.wait_for_requests(1)
    answer = await say(server, "alice", "/delegate", "m-delegate")
    assert (await server.runs.wait_run(answer["runId"], WAIT_S)).state == "ok"  # type: ignore[union-attr]
    messages = server.store.run_messages(answer["runId"])
    run_id = str(messages[-1].content[0]["text"]).removeprefix("queued ")  # type: ignore[index]
    assert server.runs.is_queued(run_id)
    return run_id


async def test_demoting_the_requester_fails_her_queued_run_at_once(
    server: GatewayServer, fake: FakeModelServer, admin: Client
) -> None:
    run_id = await queued_alice_run(server, fake)
    await admin.request("sessions.messages.subscribe", {"sessionKey": "agent:main:subagent:alice-work"})
    res = await admin.request("users.setRole", {"profileId": "alice", "role": "operator.read"})
    assert res["payload"] == {
        "ok": True,
        "profileId": "alice",
        "roles": ["operator.read"],
        "changed": True,
        "revoked": 1,
    }
    async with asyncio.timeout(5):  # at once: the slot is still held for 20 s
        event = await admin.wait_for_chat(run_id, "error")
    assert event["payload"]["errorKind"] == "requester_authority_revoked"
    run = await server.runs.wait_run(run_id, 1)
    assert run is not None
    assert run.state == "error"
    assert not any("ALICE-WORK" in str(r.body["messages"]) for r in fake.requests)


async def test_unlinking_the_identity_revokes_and_a_later_command_carries_no_authority(
    server: GatewayServer, fake: FakeModelServer, admin: Client
) -> None:
    run_id = await queued_alice_run(server, fake)
    res = await admin.request(
        "users.unlinkChannelIdentity", {"profileId": "alice", "identity": {"channelId": "webhook", "senderId": "alice"}}
    )
    assert res["payload"] == {"ok": True, "removed": True, "revoked": 1}
    run = await server.runs.wait_run(run_id, 5)
    assert run is not None
    assert run.state == "error"
    listed = await admin.request("users.listChannelIdentities", {"profileId": "alice"})
    assert listed["payload"] == {"profileId": "alice", "links": []}


async def test_a_config_reload_that_removes_the_role_revokes(
    server: GatewayServer, fake: FakeModelServer, tmp_path: Path
) -> None:
    run_id = await queued_alice_run(server, fake)
    reloaded = parse_config(document(fake.base_url, alice_roles=["operator.read"]), base_dir=tmp_path, environ={})
    assert server.reload(reloaded) == ()
    run = await server.runs.wait_run(run_id, 5)
    assert run is not None
    assert run.state == "error"


async def test_users_methods_need_admin_and_refuse_bad_input(server: GatewayServer, admin: Client) -> None:
    async with aiohttp.ClientSession() as http:
        writer = await connected(http, server.port, scopes=["operator.write"])
        refused = await writer.request("users.setRole", {"profileId": "alice", "role": None})
        assert refused["error"]["details"]["missingScope"] == "operator.admin"
    cases = [
        ("users.setRole", {"profileId": "nobody", "role": None}, "operator_not_found"),
        ("users.setRole", {"profileId": "alice", "role": "operator.root"}, None),
        ("users.setRole", {"profileId": "alice"}, None),
        ("users.linkChannelIdentity", {"profileId": "alice", "identity": {"channelId": "webhook"}}, None),
        ("users.listChannelIdentities", {"profileId": "nobody"}, "operator_not_found"),
    ]
    for method, params, code in cases:
        res = await admin.request(method, params)
        assert res["ok"] is False, (method, params)
        assert res["error"]["code"] == "INVALID_REQUEST"
        if code is not None:
            assert res["error"]["details"]["code"] == code


async def test_sighup_reloads_the_operators_of_a_running_claw_gateway(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess

    from tests.integration.gateway import peers
    from tests.integration.gateway.test_ws_protocol import TOKEN

    doc = document("http://127.0.0.1:9/v1", alice_roles=["operator.admin"])
    port = peers.free_port()
    doc["gateway"]["port"] = port
    config_path = tmp_path / "gateway.json5"
    config_path.write_text(json.dumps(doc))
    argv = [
        peers.claw_executable(),
        "gateway",
        "serve",
        "--config",
        str(config_path),
        "--data-dir",
        str(tmp_path / "d"),
    ]
    proc = await asyncio.to_thread(
        subprocess.Popen, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).startswith(b"gateway listening on ")

        async def links() -> list[Any]:
            async with aiohttp.ClientSession() as http:
                client = await peers.PeerClient.connected(http, f"ws://127.0.0.1:{port}/ws", auth={"token": TOKEN})
                res = await client.request("users.listChannelIdentities", {"profileId": "alice"})
                await client.ws.close()
                return list(res["payload"]["links"])

        assert await links() == [{"channelId": "webhook", "senderId": "alice"}]
        config_path.write_text("{ not json5")  # a broken config changes nothing
        os.kill(proc.pid, signal.SIGHUP)
        assert proc.stderr is not None
        async with asyncio.timeout(10):
            while b"config reload failed, nothing changed" not in await asyncio.to_thread(proc.stderr.readline):
                pass
        assert await links() == [{"channelId": "webhook", "senderId": "alice"}]
        doc["operators"][0]["links"] = []
        config_path.write_text(json.dumps(doc))
        os.kill(proc.pid, signal.SIGHUP)
        async with asyncio.timeout(10):
            while b"config reloaded" not in await asyncio.to_thread(proc.stderr.readline):
                pass
        assert await links() == []
        assert proc.poll() is None
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


async def test_a_reload_names_the_changed_keys_that_wait_for_a_restart(
    server: GatewayServer, fake: FakeModelServer, tmp_path: Path
) -> None:
    changed = document(fake.base_url, alice_roles=["operator.admin"])
    changed["channels"]["webhook"]["allowFrom"] = ["alice", "bob"]  # live
    assert server.reload(parse_config(changed, base_dir=tmp_path, environ={})) == ()
    changed["channels"]["webhook"]["secret"] = "another-secret-0123456789"
    changed["agents"]["defaults"]["subagents"]["maxConcurrent"] = 3
    assert server.reload(parse_config(changed, base_dir=tmp_path, environ={})) == ("agents", "channels")


async def test_work_retained_under_revoked_authority_before_its_task_runs_fails(
    server: GatewayServer, fake: FakeModelServer, tmp_path: Path
) -> None:
    # Work can be retained between its start and its task's first step (a spawn retains right after it starts the
    # run): a revocation then still fails it, visibly, instead of leaving it in flight for ever.
    alice = Requester("agent:main:channel:webhook:alice", "main", "webhook", authenticated=True, sender_id="alice")
    assertion = server._authority.capture(alice)  # type: ignore[union-attr]
    assert assertion is not None
    server.reload(parse_config(document(fake.base_url, alice_roles=["operator.read"]), base_dir=tmp_path, environ={}))
    request = RunRequest("agent:main:subagent:late", "main", "ALICE-WORK late", "subagent")
    started = await server.runs.start_run(request)
    assert not server.runs._active[started.run_id].entered  # the case this pins
    server._authority.retain(started.run_id, assertion)  # type: ignore[union-attr]
    run = await server.runs.wait_run(started.run_id, 5)
    assert run is not None
    assert run.state == "error"
    assert not any("ALICE-WORK" in str(r.body["messages"]) for r in fake.requests)


async def test_aborting_a_run_before_its_task_runs_records_it(server: GatewayServer) -> None:
    request = RunRequest("agent:main:subagent:brief", "main", "ALICE-WORK brief", "subagent")
    started = await server.runs.start_run(request)
    assert not server.runs._active[started.run_id].entered
    assert await server.runs.abort("agent:main:subagent:brief") == [started.run_id]
    run = await server.runs.wait_run(started.run_id, 5)
    assert run is not None
    assert run.state == "aborted"
