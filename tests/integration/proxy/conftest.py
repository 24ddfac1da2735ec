"""A real proxy on real sockets, forwarding to real scripted fake models."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from clawstack.common.clock import SystemClock
from clawstack.common.ids import new_id, new_secret
from clawstack.llm import LLMClient
from clawstack.llm.fake import FakeModelServer
from clawstack.models.policy import PLAN_POLICY_ENDPOINT
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.config import ProxyConfig, parse_config
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.server import ProxyServer

OPERATOR_TOKEN = "op-" + "t" * 40
KEYS = {
    "OPENAI_API_KEY": "sk-openai-" + "k" * 24,
    "CUSTOM_KEY": "sk-custom-" + "c" * 24,
    "OPENROUTER_API_KEY": "sk-or-" + "o" * 24,
    "VERCEL_API_KEY": "sk-vercel-" + "v" * 24,
    "TICKET_TOKEN": "tool-bearer-" + "b" * 24,
}
ENVIRON = {"CLAW_PROXY_OPERATOR_TOKEN": OPERATOR_TOKEN}


def attested(provider: str, endpoint: str) -> dict[str, Any]:
    return {
        "provider": provider,
        "endpoint": endpoint,
        "guarantees": ["processing:us", "training:none", "retention:none"],
    }


def proxy_config(base: Path, upstreams: dict[str, str], **extra: Any) -> ProxyConfig:
    data: dict[str, Any] = {
        "worker": {"port": 0},
        "operator": {"port": 0},
        "state_dir": "state",
        "revocation_dir": "revocations",
        "env": dict(KEYS),
        "upstreams": {
            prefix: {
                "base_url": url,
                "api_key_env": f"{prefix.upper()}_API_KEY" if prefix != "custom" else "CUSTOM_KEY",
            }
            for prefix, url in upstreams.items()
        },
        "routing": {"first_byte_timeout_s": 2.0, "request_timeout_s": 20.0, "retry_after_cap_s": 30.0},
        # The default policy (US/EU, no training, no retention), with every fake upstream attested.
        "data_policy": {
            "attestations": [
                *(attested(prefix, url) for prefix, url in upstreams.items()),
                attested("chatgpt", PLAN_POLICY_ENDPOINT),
            ]
        },
    }
    data.update(extra)
    return parse_config(data, base_dir=base, environ={})


@dataclass
class Stack:
    proxy: ProxyServer
    operator: ProxyOperatorClient
    primary: FakeModelServer
    fallback: FakeModelServer
    base: Path

    async def identity(
        self, chain: list[ChainEntry] | None = None, tools: list[str] | None = None, ttl_s: float = 3600
    ) -> tuple[str, str]:
        ident, secret = new_id("run-"), new_secret()
        await self.operator.create_identity(
            identity_id=ident,
            secret=secret,
            chain=chain or [ChainEntry("primary", "openai/gpt-test"), ChainEntry("fallback", "custom/fallback-model")],
            tools=tools or [],
            expires_at=SystemClock().now() + timedelta(seconds=ttl_s),
            labels={"installation": "acme", "run_id": "r-1"},
        )
        return ident, secret

    def worker(self, ident: str, secret: str, **kwargs: Any) -> LLMClient:
        return LLMClient(self.proxy.worker_base_url, api_key=f"{ident}:{secret}", timeout_s=30, **kwargs)


StackFactory = Callable[..., Any]


@pytest.fixture
async def make_stack(tmp_path: Path) -> AsyncIterator[StackFactory]:
    started: list[tuple[ProxyServer, ProxyOperatorClient, FakeModelServer, FakeModelServer]] = []

    async def factory(
        primary_script: Any = None, fallback_script: Any = None, config_extra: dict[str, Any] | None = None
    ) -> Stack:
        primary = FakeModelServer(primary_script)
        fallback = FakeModelServer(fallback_script)
        await primary.start()
        await fallback.start()
        config = proxy_config(
            tmp_path,
            {
                "openai": primary.base_url,
                "custom": fallback.base_url,
                "openrouter": fallback.base_url,
                "vercel": fallback.base_url,
            },
            **(config_extra or {}),
        )
        proxy = ProxyServer(config, environ=ENVIRON)
        await proxy.start()
        operator = ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url)
        started.append((proxy, operator, primary, fallback))
        return Stack(proxy, operator, primary, fallback, tmp_path)

    yield factory
    for proxy, operator, primary, fallback in started:
        await operator.close()
        await proxy.stop()
        await primary.stop()
        await fallback.stop()
