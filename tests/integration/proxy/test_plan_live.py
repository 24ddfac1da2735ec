"""Opt-in: a real ChatGPT sign-in serves one minimal plan request (never run in CI).

Set ``CLAWSTACK_LIVE_CHATGPT=1`` and point ``CLAWSTACK_LIVE_CHATGPT_AUTH_DIR`` at a sign-in store made with
``claw proxy auth login chatgpt`` (default ``./.claw-auth/subscriptions``); ``CLAWSTACK_LIVE_CHATGPT_MODEL``
picks the model (default ``gpt-5``). The test may refresh the stored sign-in; it prints no token.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import aiohttp
import pytest

from clawstack.proxy.config import PlanRoute
from clawstack.proxy.plan import AuthStore, PlanTokens, plan_ssl_context
from clawstack.proxy.plan.chatgpt import classify_plan_failure, plan_headers, responses_url, shape_plan_request

pytestmark = pytest.mark.skipif(
    os.environ.get("CLAWSTACK_LIVE_CHATGPT") != "1",
    reason="live ChatGPT plan test: set CLAWSTACK_LIVE_CHATGPT=1 with a real sign-in (CI never does)",
)


async def test_a_real_sign_in_serves_one_plan_request() -> None:
    store = AuthStore(Path(os.environ.get("CLAWSTACK_LIVE_CHATGPT_AUTH_DIR", ".claw-auth/subscriptions")))
    if store.load("chatgpt") is None:
        pytest.fail(f"no chatgpt sign-in in {store.directory}: run claw proxy auth login chatgpt first")
    route = PlanRoute()
    context = plan_ssl_context(route)
    tokens = PlanTokens(store, issuer=route.issuer, ssl_context=context)
    body = shape_plan_request(
        {
            "model": os.environ.get("CLAWSTACK_LIVE_CHATGPT_MODEL", "gpt-5"),
            "instructions": "Answer with the single word OK.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say OK."}]}],
        }
    )
    try:
        access, account = await tokens.access("chatgpt")
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                responses_url(route.base_url),
                json=body,
                headers=plan_headers(access, account, str(uuid.uuid4())),
                ssl=context,
                timeout=aiohttp.ClientTimeout(total=120),
            ) as answer,
        ):
            raw = await answer.read()
            assert answer.status == 200, classify_plan_failure(answer.status, raw)
        events = [json.loads(line[len("data: ") :]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        assert any(event.get("type") == "response.completed" for event in events)
    finally:
        await tokens.aclose()
