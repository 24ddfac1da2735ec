"""``POST /v1/identities/{id}/expiry``: a run's authority moved, and its identity's expiry moves with it, durably."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest

from clawstack.common.clock import SystemClock, format_timestamp
from clawstack.common.ids import new_secret
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.errors import ProxyError
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.server import ProxyServer

from .conftest import ENVIRON, OPERATOR_TOKEN, StackFactory, proxy_config

CHAIN = [ChainEntry("primary", "openai/gpt-test")]


async def test_a_moved_expiry_is_durable_idempotent_and_lets_the_worker_call_past_the_old_one(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity(chain=CHAIN, ttl_s=2)
    later = SystemClock().now().replace(microsecond=0) + timedelta(hours=2)
    first = await stack.operator.set_expiry(ident, later)
    again = await stack.operator.set_expiry(ident, later)
    assert first == again
    assert first["expires_at"] == format_timestamp(later)
    await asyncio.sleep(2.2)  # past the original expiry; real time, because the worker API checks real time
    async with stack.worker(ident, secret) as worker:
        reply = await worker.chat_completion(
            model="primary", messages=[{"role": "user", "content": "@fake reply: past the old expiry"}]
        )
    assert "past the old expiry" in str(reply)
    # The change survives a restart of the proxy (it was on disk before the answer).
    await stack.proxy.stop()
    config = proxy_config(tmp_path, {"openai": stack.primary.base_url})
    async with (
        ProxyServer(config, environ=ENVIRON) as proxy,
        ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as op,
    ):
        described = await op.get_identity(ident)
        assert described["expires_at"] == format_timestamp(later)
        assert described["state"] == "active"


async def test_a_repeated_create_answers_with_the_stored_expiry(make_stack: StackFactory) -> None:
    stack = await make_stack()
    secret = new_secret()
    soon = SystemClock().now().replace(microsecond=0) + timedelta(hours=1)
    await stack.operator.create_identity(identity_id="run-x", secret=secret, chain=CHAIN, tools=[], expires_at=soon)
    moved = soon + timedelta(hours=1)
    await stack.operator.set_expiry("run-x", moved)
    repeat = await stack.operator.create_identity(
        identity_id="run-x", secret=secret, chain=CHAIN, tools=[], expires_at=soon
    )
    assert repeat["expires_at"] == format_timestamp(moved)


async def test_refusals(make_stack: StackFactory) -> None:
    stack = await make_stack()
    now = SystemClock().now()
    with pytest.raises(ProxyError) as info:
        await stack.operator.set_expiry("run-nobody", now + timedelta(hours=1))
    assert (info.value.status, info.value.code) == (404, "identity_unknown")
    ident, _ = await stack.identity(chain=CHAIN)
    for bad in (now - timedelta(minutes=1), now + timedelta(days=7, minutes=1)):
        with pytest.raises(ProxyError) as info:
            await stack.operator.set_expiry(ident, bad)
        assert (info.value.status, info.value.code) == (400, "expiry_invalid")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{stack.proxy.operator_base_url}/v1/identities/{ident}/expiry",
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            json={"expires_at": "2030-01-01T00:00:00", "extra": 1},
        ) as resp,
    ):
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_request"
    before = await stack.operator.get_identity(ident)
    await stack.operator.revoke(ident)
    with pytest.raises(ProxyError) as info:
        await stack.operator.set_expiry(ident, now + timedelta(hours=3))
    assert (info.value.status, info.value.code) == (409, "identity_revoked")
    assert (await stack.operator.get_identity(ident))["expires_at"] == before["expires_at"]
    expiring, _ = await stack.identity(chain=CHAIN, ttl_s=1)
    await asyncio.sleep(1.2)
    with pytest.raises(ProxyError) as info:
        await stack.operator.set_expiry(expiring, now + timedelta(hours=3))
    assert (info.value.status, info.value.code) == (409, "identity_expired")
