"""The proxy enforces its data policy per request: a chain entry without evidence for its provider at its
endpoint is refused before dispatch (``data_policy_violation``), a request asking the provider to retain it is
refused under a no-retention policy, and OpenRouter's controls follow the policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawstack.llm.errors import LLMError
from clawstack.proxy.identities import ChainEntry

from .conftest import StackFactory, attested, proxy_config


async def test_an_unattested_entry_is_refused_before_dispatch(make_stack: StackFactory) -> None:
    stack = await make_stack(config_extra={"data_policy": {"attestations": []}})  # the default, nothing attested
    ident, secret = await stack.identity(chain=[ChainEntry("primary", "openai/gpt-test")])
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMError) as info:
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert info.value.error_code == "data_policy_violation"
    assert "provider openai at " in info.value.server_message
    assert "lacks processing:us|eu" in info.value.server_message
    assert stack.primary.requests == []


async def test_an_attestation_for_another_endpoint_does_not_cover(make_stack: StackFactory) -> None:
    policy = {"attestations": [attested("openai", "https://api.openai.com/v1")]}
    stack = await make_stack(config_extra={"data_policy": policy})
    ident, secret = await stack.identity(chain=[ChainEntry("primary", "openai/gpt-test")])
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMError) as info:
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert info.value.error_code == "data_policy_violation"
    assert stack.primary.requests == []


async def test_store_true_is_refused_under_no_retention(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity(chain=[ChainEntry("primary", "openai/gpt-test")])
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMError) as info:
            await client.chat_completion(
                model="primary", messages=[{"role": "user", "content": "x"}], extra={"store": True}
            )
        assert info.value.error_code == "data_policy_violation"
    assert stack.primary.requests == []


async def test_a_permissive_policy_sends_store_and_sets_no_openrouter_controls(make_stack: StackFactory) -> None:
    permissive = await make_stack(config_extra={"data_policy": "permissive"})
    ident, secret = await permissive.identity(
        chain=[ChainEntry("primary", "openai/gpt-test"), ChainEntry("fallback", "openrouter/google/gemini-test")]
    )
    async with permissive.worker(ident, secret) as client:
        await client.chat_completion(
            model="primary", messages=[{"role": "user", "content": "x"}], extra={"store": True}
        )
        await client.chat_completion(model="fallback", messages=[{"role": "user", "content": "x"}])
    assert permissive.primary.requests[0].body["store"] is True
    assert "provider" not in permissive.fallback.requests[0].body  # a permissive policy sets no OpenRouter controls


def test_a_malformed_policy_refuses_to_start(tmp_path: Path) -> None:
    from clawstack.proxy.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        proxy_config(tmp_path, {"openai": "http://127.0.0.1:9/v1"}, data_policy={"local_retention": "content"})
    assert "data_policy" in info.value.message
    assert "not supported" in info.value.message
