"""The chatgpt plan route in a chain, against the synthetic identity provider and plan backend over TLS with a
CA only this test's proxy trusts: the spec's reasons and their effect, the request shape the backend requires,
plan-only chains that never use a key, served_by by credential class, and no token anywhere it should not be."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from clawstack.llm.errors import LLMError
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.plan import AuthStore

from .conftest import Stack, StackFactory
from .plan_idp import PlanIdP, plan_idp_fixture  # noqa: F401 (the fixture)

PLAN_FIRST = [ChainEntry("primary", "chatgpt/gpt-5.6-terra"), ChainEntry("fallback", "openai/gpt-5.6-terra")]
PLAN_ONLY = [ChainEntry("primary", "chatgpt/gpt-5.6-terra")]
ASK: dict[str, Any] = {"messages": [{"role": "user", "content": "@fake reply: from the key"}]}


async def plan_stack(make_stack: StackFactory, idp: PlanIdP, tmp_path: Path) -> tuple[Stack, AuthStore]:
    auth_dir = tmp_path / ".claw-auth" / "subscriptions"
    extra = {
        "auth_dir": str(auth_dir),
        "plan_routes": {"chatgpt": {"issuer": idp.issuer, "base_url": idp.base_url, "ca_file": str(idp.ca_file)}},
    }
    return await make_stack(config_extra=extra), AuthStore(auth_dir)


def sign_in(store: AuthStore, idp: PlanIdP) -> None:
    store.save(idp.mint_signin(datetime.now(UTC)))


async def described(stack: Stack, ident: str) -> dict[str, Any]:
    return await stack.operator.get_identity(ident)  # type: ignore[no-any-return]


async def test_plan_first_with_nobody_signed_in_the_key_serves(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path
) -> None:
    stack, _ = await plan_stack(make_stack, plan_idp, tmp_path)
    assert (await stack.operator.subscriptions()) == {
        "subscriptions": [{"provider": "chatgpt", "state": "not_signed_in"}]
    }
    ident, secret = await stack.identity(chain=PLAN_FIRST)
    async with stack.worker(ident, secret) as client:
        answer = await client.chat_completion(model="primary", **ASK)
    assert answer.content == "from the key"
    about = await described(stack, ident)
    assert about["served_by"] == {"api_key": 1}
    assert about["last_plan_failure"] == "subscription_signin_required"
    assert plan_idp.requests == []


async def test_plan_only_with_nobody_signed_in_fails_and_the_provider_sees_nothing(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path
) -> None:
    stack, _ = await plan_stack(make_stack, plan_idp, tmp_path)
    ident, secret = await stack.identity(chain=PLAN_ONLY)
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMError) as info:
            await client.chat_completion(model="primary", **ASK)
    assert info.value.error_code == "subscription_signin_required"
    assert plan_idp.requests == []
    assert stack.primary.requests == []  # a key is configured, and never used


async def test_a_signed_in_plan_serves_in_the_shape_the_vendor_requires(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stack, store = await plan_stack(make_stack, plan_idp, tmp_path)
    sign_in(store, plan_idp)
    state = (await stack.operator.subscriptions())["subscriptions"][0]
    assert state["state"] == "signed_in"
    ident, secret = await stack.identity(
        chain=[ChainEntry("primary", "chatgpt/gpt-5.6-terra", reasoning_effort="high"), PLAN_FIRST[1]]
    )
    async with stack.worker(ident, secret) as client:
        answer = await client.chat_completion(model="primary", **ASK, extra={"temperature": 0.3, "max_tokens": 50})
        assert answer.content == "Hello from the plan."
        async with client.stream_chat_completion(model="primary", **ASK, extra={"top_p": 0.5}) as stream:
            done = await stream.final_completion()
    assert done.content == "Hello from the plan."
    assert len(plan_idp.requests) == 2
    for request in plan_idp.requests:
        body = request.body
        assert body["model"] == "gpt-5.6-terra"
        assert body["stream"] is True
        assert body["store"] is False
        assert not {"temperature", "top_p", "max_output_tokens", "max_tokens"} & set(body)
        assert request.headers["authorization"].startswith("Bearer ")
    assert plan_idp.requests[0].body["reasoning"] == {"effort": "high"}
    assert stack.primary.requests == []
    about = await described(stack, ident)
    assert about["served_by"] == {"subscription": 2}
    assert about["last_plan_failure"] is None
    # No sign-in token in the proxy's log, its answers, its state directory outside the store.
    logged = caplog.text + json.dumps(about) + json.dumps(await stack.operator.subscriptions())
    for secret_value in plan_idp.secrets():
        assert secret_value not in logged
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert not any(s.encode() in content for s in plan_idp.secrets()), path


async def test_a_spent_plan_rests_and_the_key_serves(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path
) -> None:
    stack, store = await plan_stack(make_stack, plan_idp, tmp_path)
    sign_in(store, plan_idp)
    plan_idp.script(backend=["limit"], resets_in_s=600)
    ident, secret = await stack.identity(chain=PLAN_FIRST)
    async with stack.worker(ident, secret) as client:
        assert (await client.chat_completion(model="primary", **ASK)).content == "from the key"
        assert (await client.chat_completion(model="primary", **ASK)).content == "from the key"
    assert len(plan_idp.requests) == 1  # resting: the second request did not try the plan
    about = await described(stack, ident)
    assert about["served_by"] == {"api_key": 2}
    assert about["last_plan_failure"] == "subscription_limit_reached"
    state = (await stack.operator.subscriptions())["subscriptions"][0]
    assert state["state"] == "signed_in"
    assert "limited_until" in state


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [("not_included", "subscription_not_eligible"), ("bad_request", "subscription_unsupported_request")],
)
async def test_reasons_that_never_move_to_another_billing_path(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path, outcome: str, reason: str
) -> None:
    stack, store = await plan_stack(make_stack, plan_idp, tmp_path)
    sign_in(store, plan_idp)
    plan_idp.script(backend=[outcome])  # type: ignore[list-item]
    ident, secret = await stack.identity(chain=PLAN_FIRST)
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMError) as info:
            await client.chat_completion(model="primary", **ASK)
    assert info.value.error_code == reason
    assert stack.primary.requests == []  # the keyed fallback was not tried


async def test_a_temporary_fault_and_an_expired_access_token(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path
) -> None:
    stack, store = await plan_stack(make_stack, plan_idp, tmp_path)
    sign_in(store, plan_idp)
    plan_idp.script(backend=["server_error", "cut"])
    ident, secret = await stack.identity(chain=PLAN_FIRST)
    async with stack.worker(ident, secret) as client:
        assert (await client.chat_completion(model="primary", **ASK)).content == "from the key"
        assert (await client.chat_completion(model="primary", **ASK)).content == "from the key"
        assert (await described(stack, ident))["last_plan_failure"] == "subscription_unavailable"
        plan_idp.revoke_access_tokens()  # the next call gets a 401: one forced refresh, one retry
        assert (await client.chat_completion(model="primary", **ASK)).content == "Hello from the plan."
    assert plan_idp.refreshes == 1
    assert (await described(stack, ident))["served_by"] == {"api_key": 2, "subscription": 1}


async def test_hosted_tools_are_refused_on_the_plan_route_before_dispatch(
    make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path
) -> None:
    stack, store = await plan_stack(make_stack, plan_idp, tmp_path)
    sign_in(store, plan_idp)
    ident, secret = await stack.identity(chain=PLAN_ONLY)
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMError) as info:
            await client.chat_completion(model="primary", **ASK, tools=[{"type": "web_search"}])
    assert info.value.error_code == "hosted_tool_refused"
    assert plan_idp.requests == []


async def test_a_proxy_without_plan_routes_has_no_subscriptions(make_stack: StackFactory) -> None:
    stack = await make_stack()
    from clawstack.proxy.errors import ProxyError

    with pytest.raises(ProxyError) as info:
        await stack.operator.subscriptions()
    assert (info.value.code, info.value.status) == ("subscriptions_unsupported", 501)
    assert (await stack.operator.health())["capabilities"]["plan_routes"] is False
