"""What a worker can learn from the proxy's worker listener without a credential: that it is alive, nothing more."""

from __future__ import annotations

import json

import httpx
import pytest

from clawstack.llm.fake import parse_script
from tests.integration.proxy.conftest import KEYS, StackFactory, make_stack  # noqa: F401 - the fixture

pytestmark = pytest.mark.security


async def test_worker_health_is_liveness_only_and_the_operator_keeps_the_detail(make_stack: StackFactory) -> None:  # noqa: F811
    stack = await make_stack(
        primary_script=parse_script([{"fail": 401}, {"reply": "never"}]),
        fallback_script=parse_script([{"reply": "ok"}]),
    )
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    async with httpx.AsyncClient() as http:
        answer = await http.get(stack.proxy.worker_base_url + "/health")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    for detail in ("key_dead", "revocations", "keys", "records", "capabilities", "OPENAI"):
        assert detail not in answer.text
    # Positive control: the operator's health, on its own listener with its token, still says which key is dead.
    health = await stack.operator.health()
    assert health["keys"] == {"openai:OPENAI_API_KEY": "key_dead"}
    assert "records" in health["revocations"]
    assert KEYS["OPENAI_API_KEY"] not in json.dumps(health)
