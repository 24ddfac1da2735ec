"""Task-home runs on a plan route, through the supervisor, with real Hermes workers: the proxy's plan route points
at the synthetic identity provider and plan backend (TLS, a CA only this test's proxy trusts). Plan first with
nobody signed in (the key serves; the run reports subscription_signin_required), plan only with nobody signed in
(the run fails; the provider sees no request), a signed-in plan serving the run, and a worker that looks for the
sign-in, the key or the operator token and finds none."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from clawstack.common.digest import spec_digest
from clawstack.common.files import read_private, write_private
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.localproxy import LocalProxy
from clawstack.proxy.plan import AuthStore
from tests.integration.proxy.plan_idp import PlanIdP, plan_idp_fixture  # noqa: F401 (the fixture)

from .conftest import RunsStack

pytestmark = [pytest.mark.hermes, pytest.mark.slow]

PLAN_ATTESTATION = (
    "      - provider: chatgpt\n"
    "        endpoint: https://api.openai.com/v1\n"
    "        guarantees: [processing:us, training:none, retention:none]\n"
)


def with_chain(chain: str):  # type: ignore[no-untyped-def]
    def edit(text: str) -> str:
        text = text.replace("      agent: ./RESEARCHER.md\n", f"      agent: ./RESEARCHER.md\n      models: {chain}\n")
        return text.replace("    attestations:                    # the self-hosted upstream's guarantees, declared by its operator\n",
                            "    attestations:\n" + PLAN_ATTESTATION)  # fmt: skip

    return edit


async def point_plan_route_at(stack: RunsStack, idp: PlanIdP) -> None:
    """Test only: the pod file cannot name a plan issuer; rewrite the proxy's config and restart it."""
    paths = PodPaths(stack.pod.resolve())
    config = json.loads(read_private(paths.proxy_config, max_bytes=4 * 1024 * 1024))
    config["plan_routes"] = {"chatgpt": {"issuer": idp.issuer, "base_url": idp.base_url, "ca_file": str(idp.ca_file)}}
    write_private(paths.proxy_config, json.dumps(config).encode())
    proxy = LocalProxy(paths)
    current = proxy.running()
    assert current is not None
    await asyncio.to_thread(proxy.stop)
    await asyncio.to_thread(proxy.start, digest=current.digest)


def home_launch(stack: RunsStack, run_id: str, task: str, home: str) -> dict[str, Any]:
    spec = {"template": "researcher", "task": task, "home": home}
    return stack.launch_body(run_id, task) | {"spec": spec, "spec_digest": spec_digest(spec)}


async def run(stack: RunsStack, run_id: str, task: str, home: str) -> dict[str, Any]:
    answer = await stack.call("POST", "/v1/runs", home_launch(stack, run_id, task, home))
    assert answer.status == 202, answer.body
    for _ in range(3):
        done = (await stack.call("GET", f"/v1/runs/acme/{run_id}?wait=stopped&timeout=60s")).json()
        if done["state"] in ("stopped", "failed"):
            break
    return done  # type: ignore[no-any-return]


async def test_plan_first_and_plan_only_through_the_supervisor(stack: RunsStack, plan_idp: PlanIdP) -> None:
    await stack.recompile(with_chain("{primary: chatgpt/gpt-5.6-terra, fallback: local/clawstack-fake}"))
    await point_plan_route_at(stack, plan_idp)
    subscriptions = (await stack.call("GET", "/v1/subscriptions")).json()
    assert subscriptions == {"subscriptions": [{"provider": "chatgpt", "state": "not_signed_in"}]}

    # Plan first, nobody signed in: the key serves, and the run says why the plan could not.
    probe = "env; cat /proc/self/mounts; ls -la / /run /run/claw 2>&1; cat ~/.codex/auth.json 2>&1"
    task = "@fake tool-call: terminal " + json.dumps({"command": probe}) + "\n@fake reply: probed"
    first = await run(stack, "pf1", task, "plan-a")
    assert first["state"] == "stopped", first
    assert first["served_by"]["api_key"] >= 2
    assert first["served_by_complete"] is True
    assert first["last_plan_failure"] == "subscription_signin_required"
    assert plan_idp.requests == []
    # What the worker saw (its terminal output reached the fake model as a tool result): no sign-in, no store,
    # no key, no operator token.
    seen = json.dumps([r.body for r in stack.fake.requests if r.body])
    assert "/run/claw" in seen  # the probe ran
    assert ".claw-auth" not in seen
    assert "CLAW_PROXY_OPERATOR_TOKEN" not in seen
    paths = PodPaths(stack.pod.resolve())
    operator_token = json.loads(read_private(paths.proxy_config, max_bytes=4 * 1024 * 1024))["env"][
        "CLAW_PROXY_OPERATOR_TOKEN"
    ]
    assert operator_token not in seen

    # Signed in: the plan serves the run, in the shape the vendor requires; the key is not used.
    AuthStore(paths.auth).save(plan_idp.mint_signin(datetime.now(UTC)))
    assert (await stack.call("GET", "/v1/subscriptions")).json()["subscriptions"][0]["state"] == "signed_in"
    fake_calls = len(stack.fake.requests)
    second = await run(stack, "pf2", "@fake reply: unused", "plan-b")
    assert second["state"] == "stopped", second
    assert second["served_by"] == {"subscription": len(plan_idp.requests)}
    assert "last_plan_failure" not in second
    assert len(stack.fake.requests) == fake_calls
    assert (await stack.call("GET", "/v1/runs/acme/pf2/result")).body == b"Hello from the plan."
    for request in plan_idp.requests:
        assert request.body["stream"] is True
        assert request.body["store"] is False
        assert not {"temperature", "top_p", "max_output_tokens"} & set(request.body)
    # A spent plan falls back to the key.
    plan_idp.script(backend=["limit"])
    third = await run(stack, "pf3", "@fake reply: from the key again", "plan-c")
    assert third["state"] == "stopped", third
    assert third["last_plan_failure"] == "subscription_limit_reached"
    assert third["served_by"]["api_key"] >= 1
    # No sign-in token in the proxy's log or anywhere in the pod outside the store.
    secrets = plan_idp.secrets()
    for path in stack.pod.rglob("*"):
        if path.is_file() and paths.auth not in path.parents and path.stat().st_size < 8 * 1024 * 1024:
            content = path.read_bytes()
            assert not any(s.encode() in content for s in secrets), path


async def test_plan_only_with_nobody_signed_in_fails_and_the_provider_sees_nothing(
    stack: RunsStack, plan_idp: PlanIdP
) -> None:
    await stack.recompile(with_chain("{primary: chatgpt/gpt-5.6-terra}"))
    await point_plan_route_at(stack, plan_idp)
    fake_calls = len(stack.fake.requests)
    done = await run(stack, "po1", "@fake reply: never", "plan-only")
    assert done["state"] == "failed", done
    assert plan_idp.requests == []
    assert len(stack.fake.requests) == fake_calls  # the key configured for other templates was never used
    assert done.get("last_plan_failure") == "subscription_signin_required"
