"""The operator API: identities, the durable revocation fence, the self-test, the journal and health."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.common.clock import SystemClock
from clawstack.common.ids import new_secret
from clawstack.llm import LLMHTTPError, LLMStreamError
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.revocation import RevocationLedger
from clawstack.proxy.server import ProxyServer

from .conftest import ENVIRON, OPERATOR_TOKEN, StackFactory, proxy_config

CHAIN = [ChainEntry("primary", "openai/gpt-test")]


def in_an_hour() -> Any:
    return SystemClock().now() + timedelta(hours=1)


async def test_operator_token_is_required(make_stack: StackFactory) -> None:
    stack = await make_stack()
    url = stack.proxy.operator_base_url + "/v1/health"
    async with aiohttp.ClientSession() as session:
        for headers, status in (
            ({}, 401),
            ({"Authorization": "Bearer wrong"}, 403),
            ({"Authorization": "Basic x"}, 401),
        ):
            async with session.get(url, headers=headers) as resp:
                assert resp.status == status
                assert OPERATOR_TOKEN not in await resp.text()
    # The worker listener does not serve operator routes at all.
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.proxy.worker_base_url.removesuffix("/v1") + "/v1/identities",
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            data=b"{}",
        ) as resp,
    ):
        assert resp.status == 404


async def test_create_is_idempotent_and_conflicts_are_refused(make_stack: StackFactory) -> None:
    stack = await make_stack()
    secret, expires = new_secret(), in_an_hour()
    first = await stack.operator.create_identity(
        identity_id="run-1", secret=secret, chain=CHAIN, tools=[], expires_at=expires, labels={"run_id": "r"}
    )
    again = await stack.operator.create_identity(
        identity_id="run-1", secret=secret, chain=CHAIN, tools=[], expires_at=expires, labels={"run_id": "r"}
    )
    assert first == again
    assert "secret" not in json.dumps(first)
    assert secret not in json.dumps(first)
    with pytest.raises(ProxyError) as info:
        await stack.operator.create_identity(
            identity_id="run-1", secret=new_secret(), chain=CHAIN, tools=[], expires_at=expires
        )
    assert (info.value.status, info.value.code) == (409, "identity_conflict")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"id": "bad id"}, "invalid_request"),
        ({"secret": "short"}, "invalid_request"),
        ({"chain": []}, "invalid_request"),
        ({"chain": [{"slot": "fallback", "ref": "openai/x"}]}, "chain_invalid"),
        ({"chain": [{"slot": "primary", "ref": "nowhere/x"}]}, "model_ref_unknown"),
        ({"chain": [{"slot": "primary", "ref": "vercel/only-one"}]}, "model_ref_unknown"),
        ({"chain": [{"slot": "primary", "ref": "openai/x", "reasoning_effort": "extreme"}]}, "invalid_request"),
        ({"chain": [{"slot": "primary", "ref": "openai/x", "provider_preferences": {"zdr": True}}]}, "chain_invalid"),
        (
            {"chain": [{"slot": "primary", "ref": "openrouter/a/b", "provider_preferences": {"zdr": False}}]},
            "invalid_request",
        ),
        ({"tools": ["nosuch.tool"]}, "tool_unknown"),
        ({"expires_at": "2020-01-01T00:00:00Z"}, "expiry_invalid"),
        ({"expires_at": "2026-01-01T00:00:00"}, "invalid_request"),
        ({"unexpected": 1}, "invalid_request"),
    ],
)
async def test_create_validation(make_stack: StackFactory, body: dict[str, Any], code: str) -> None:
    stack = await make_stack()
    base = {
        "id": "run-v",
        "secret": new_secret(),
        "chain": [{"slot": "primary", "ref": "openai/x"}],
        "tools": [],
        "expires_at": "2099-01-01T00:00:00Z",
        "labels": {},
    }
    if body.get("expires_at") is None and code != "expiry_invalid":
        base["expires_at"] = (SystemClock().now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    base.update(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.proxy.operator_base_url + "/v1/identities",
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            json=base,
        ) as resp,
    ):
        answer = await resp.json()
        assert resp.status == 400, answer
    assert answer["error"]["code"] == code
    assert base["secret"] not in json.dumps(answer)
    with pytest.raises(ProxyError) as info:
        await stack.operator.get_identity("run-v")
    assert info.value.status == 404  # bad input changed nothing


async def test_revoke_is_a_durable_fence(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
        result = await stack.operator.revoke(ident)
        assert result["revoked"] is True
        assert result["newly_revoked"] is True
        assert result["tools"] == []
        with pytest.raises(LLMHTTPError) as info:
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
        assert (info.value.status, info.value.error_code) == (403, "identity_revoked")
    again = await stack.operator.revoke(ident)
    assert again["revoked"] is True
    assert again["newly_revoked"] is False
    assert (await stack.operator.durable_revocation(ident))["durable"] is True
    described = await stack.operator.get_identity(ident)
    assert described["state"] == "revoked"
    assert described["tools"] == []
    log = (stack.base / "revocations" / "revocations.log").read_bytes()
    assert ident.encode() in log
    assert secret.encode() not in log
    assert oct(os.stat(stack.base / "revocations").st_mode & 0o777) == oct(0o700)


async def test_unknown_id_revocation_is_recorded_and_blocks_creation(make_stack: StackFactory) -> None:
    stack = await make_stack()
    result = await stack.operator.revoke("run-never-created")
    assert result["known"] is False
    assert result["revoked"] is True
    with pytest.raises(ProxyError) as info:
        await stack.operator.create_identity(
            identity_id="run-never-created", secret=new_secret(), chain=CHAIN, tools=[], expires_at=in_an_hour()
        )
    assert info.value.code == "identity_revoked"


async def test_revoked_identity_stays_refused_after_restart(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    await stack.operator.revoke(ident)
    await stack.proxy.stop()
    # Whatever other state survives: here, none of the identity store.
    for item in (tmp_path / "state" / "identities").iterdir():
        item.unlink()
    config = proxy_config(tmp_path, {"openai": stack.primary.base_url})
    async with (
        ProxyServer(config, environ=ENVIRON) as proxy,
        ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as op,
    ):
        with pytest.raises(ProxyError) as info:
            await op.create_identity(identity_id=ident, secret=secret, chain=CHAIN, tools=[], expires_at=in_an_hour())
        assert info.value.code == "identity_revoked"
        assert (await op.revoke(ident))["revoked"] is True


async def test_crash_between_record_and_answer(make_stack: StackFactory, tmp_path: Path) -> None:
    """The state a SIGKILL leaves after the record was fsynced and before the answer: the ledger has it, the
    identity store does not know. The identity is refused, and a repeated revoke answers 200."""
    stack = await make_stack()
    ident, secret = await stack.identity()
    await stack.proxy.stop()
    ledger = RevocationLedger(tmp_path / "revocations")
    ledger.open()
    ledger.record(ident, expires_at=None)
    ledger.close()
    config = proxy_config(tmp_path, {"openai": stack.primary.base_url})
    async with ProxyServer(config, environ=ENVIRON) as proxy:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                proxy.worker_base_url + "/models", headers={"Authorization": f"Bearer {ident}:{secret}"}
            ) as resp,
        ):
            assert resp.status == 403
            assert (await resp.json())["error"]["code"] == "identity_revoked"
        async with ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as op:
            result = await op.revoke(ident)
            assert result["revoked"] is True
            assert result["newly_revoked"] is False
            assert (await op.get_identity(ident))["state"] == "revoked"


async def test_unwritable_revocation_dir_never_acknowledges(
    make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(ProxyError) as info:
        await stack.operator.revoke(ident)
    assert (info.value.status, info.value.code) == (503, "revocation_unwritable")
    monkeypatch.setattr(os, "fsync", real_fsync)
    # Not acknowledged, yet failed closed: the identity is refused from the moment the revoke began.
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMHTTPError) as refused:
            await client.list_models()
    assert refused.value.status == 403
    assert (await stack.operator.durable_revocation(ident))["durable"] is False
    assert (await stack.operator.revoke(ident))["newly_revoked"] is True  # once the disk works again


async def test_revocation_ends_a_stream_in_flight(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        async with client.stream_chat_completion(
            model="primary",
            messages=[{"role": "user", "content": "@fake reply: " + "word " * 200 + "\n@fake chunk-delay-ms: 20"}],
        ) as stream:
            got = 0

            async def consume() -> None:
                nonlocal got
                async for _chunk in stream:
                    got += 1
                    if got == 3:
                        await stack.operator.revoke(ident)

            with pytest.raises(LLMStreamError) as info:
                await consume()
        assert info.value.error_code == "identity_revoked"
    assert got < 50


async def test_self_test_passes_and_fails_closed(make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = await make_stack()
    report = await stack.operator.self_test(worker_base_url=stack.proxy.worker_base_url)
    assert report.passed
    assert report.refused_code == "identity_revoked"

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(ProxyError) as info:
        await stack.operator.self_test(worker_base_url=stack.proxy.worker_base_url)
    assert info.value.code in ("revocation_unwritable", "revocation_self_test_failed")


async def test_journal_records_and_coverage_seal(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await make_stack(config_extra={"journal": {"directory": "journal"}})
    health = await stack.operator.health()
    epoch = health["capture_epoch"]
    assert isinstance(epoch, int)
    assert epoch >= 1
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        for _ in range(3):
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "secret task text"}])
    sealed = (await stack.operator.revoke(ident))["seal"]
    assert sealed["epoch"] == epoch
    assert sealed["records"] == 3
    lines = [json.loads(line) for line in (tmp_path / "journal" / f"journal-{epoch}.jsonl").read_text().splitlines()]
    mine = [line for line in lines if line.get("identity") == ident and line["type"] == "upstream_request"]
    assert len(mine) == 3
    assert all(line["credential_class"] == "api_key" and line["status"] == 200 for line in mine)
    assert "secret task text" not in (tmp_path / "journal" / f"journal-{epoch}.jsonl").read_text()
    (tmp_path / "journal" / "epoch").write_text("garbage")
    assert (await stack.operator.health())["capture_epoch"] is None  # read fresh on every call


async def test_served_by_is_incomplete_after_a_restart(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert (await stack.operator.get_identity(ident))["served_by"] == {"api_key": 1}
    await stack.proxy.stop()
    config = proxy_config(tmp_path, {"openai": stack.primary.base_url})
    async with (
        ProxyServer(config, environ=ENVIRON) as proxy,
        ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as op,
    ):
        described = await op.get_identity(ident)
        assert described["served_by"] == {"api_key": 1}
        assert described["served_by_complete"] is False


async def test_operator_api_on_a_peer_checked_unix_socket(tmp_path: Path, short_dir: Path) -> None:
    from clawstack.llm.fake import FakeModelServer

    sock_dir = short_dir / "op"
    sock_dir.mkdir(mode=0o700)
    async with FakeModelServer() as fake:
        config = proxy_config(
            tmp_path, {"openai": fake.base_url}, operator={"unix_socket": str(sock_dir / "proxy.sock")}
        )
        async with (
            ProxyServer(config, environ=ENVIRON) as proxy,
            ProxyOperatorClient(token=OPERATOR_TOKEN, unix_socket=str(sock_dir / "proxy.sock")) as op,
        ):
            assert proxy.operator_port is None
            report = await op.self_test(worker_base_url=proxy.worker_base_url)
            assert report.passed


async def test_concurrent_revocations_and_creations(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ids = [await stack.identity() for _ in range(20)]
    results = await asyncio.gather(*(stack.operator.revoke(ident) for ident, _ in ids))
    assert all(r["revoked"] for r in results)
    log = (stack.base / "revocations" / "revocations.log").read_text().splitlines()
    assert len(log) == 20


async def test_new_identities_are_refused_before_the_ledger_could_overflow(make_stack: StackFactory) -> None:
    stack = await make_stack(config_extra={"revocation_max_bytes": 4096})
    created: list[str] = []

    async def fill() -> None:
        for _ in range(200):
            created.append((await stack.identity())[0])

    with pytest.raises(ProxyError) as info:
        await fill()
    assert (info.value.status, info.value.code) == (503, "revocation_capacity")
    assert 10 < len(created) < 200
    # Every identity that was admitted can still be revoked, durably.
    for ident in created:
        assert (await stack.operator.revoke(ident))["newly_revoked"] is True
    assert (stack.base / "revocations" / "revocations.log").stat().st_size <= 4096


async def test_worker_api_on_a_unix_socket(tmp_path: Path, short_dir: Path) -> None:
    from clawstack.llm import LLMClient
    from clawstack.llm.fake import FakeModelServer

    async with FakeModelServer() as fake:
        config = proxy_config(tmp_path, {"openai": fake.base_url}, worker={"unix_socket": str(short_dir / "w.sock")})
        async with (
            ProxyServer(config, environ=ENVIRON) as proxy,
            ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as op,
        ):
            assert proxy.worker_port is None
            secret = new_secret()
            await op.create_identity(identity_id="run-u", secret=secret, chain=CHAIN, tools=[], expires_at=in_an_hour())
            async with LLMClient(
                "http://proxy/v1", unix_socket=str(short_dir / "w.sock"), api_key=f"run-u:{secret}"
            ) as c:
                done = await c.chat_completion(
                    model="primary", messages=[{"role": "user", "content": "@fake reply: u"}]
                )
            assert done.content == "u"
