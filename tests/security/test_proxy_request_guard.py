"""A prompt-injected worker adds provider-specific fields to its chat body (live search, Gemini's grounding, raw
``extra_body``, OpenRouter routing and plugins, Anthropic thinking, ...). The proxy's final-request guard refuses
each before dispatch on every request shape (Chat Completions, the Responses adapter, the plan route): nothing
reaches an upstream. Each case has its positive control: a clean request is served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.request_guard import CHAT_FIELDS, DROPPED_FIELDS, OUTGOING_FIELDS, REFUSED_FIELDS
from clawstack.proxy.responses_api import RESPONSES_FIELDS
from clawstack.proxy.server import ProxyServer
from tests.integration.proxy.conftest import Stack, StackFactory, make_stack  # noqa: F401 (the fixture)
from tests.integration.proxy.plan_idp import PlanIdP, plan_idp_fixture  # noqa: F401 (the fixture)
from tests.integration.proxy.test_plan_route import PLAN_ONLY, plan_stack, sign_in
from tests.integration.proxy.test_shapes import Upstream, ask, served  # noqa: F401 (the fixture)
from tests.integration.proxy.test_worker_api import raw

pytestmark = pytest.mark.security

MESSAGES = [{"role": "user", "content": "hi"}]
CHAIN = [ChainEntry("primary", "openai/gpt-test"), ChainEntry("fallback", "openrouter/google/gemini-test")]

# (extra body fields, expected code, expected param)
EXTENSIONS: list[tuple[dict[str, Any], str, str]] = [
    ({"search_parameters": {"mode": "on", "sources": [{"type": "web"}]}}, "request_field_refused", "search_parameters"),
    ({"google": {"tools": [{"google_search": {}}]}}, "request_field_refused", "google"),
    (
        {"extra_body": {"google": {"thinking_config": {"include_thoughts": True}}}},
        "request_field_refused",
        "extra_body",
    ),
    ({"metadata": {"exfil": "data"}}, "data_policy_violation", "metadata"),  # the default policy keeps nothing
    ({"plugins": [{"id": "web", "max_results": 5}]}, "request_field_refused", "plugins"),
    ({"transforms": ["middle-out"]}, "request_field_refused", "transforms"),
    ({"provider": {"sort": "price", "ignore": ["x"]}}, "request_field_refused", "provider.sort"),
    ({"provider": {"data_collection": "allow"}}, "data_policy_violation", ""),
    ({"models": ["openai/gpt-test", "anthropic/claude"]}, "request_field_refused", "models"),
    ({"route": "fallback"}, "request_field_refused", "route"),
    (
        {"safety_settings": [{"category": "HARM_CATEGORY_X", "threshold": "BLOCK_NONE"}]},
        "request_field_refused",
        "safety_settings",
    ),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "request_field_refused", "thinking"),
    ({"web_search_options": {"search_context_size": "high"}}, "request_field_refused", "web_search_options"),
    (
        {"tools": [{"type": "function", "function": {"name": "f"}, "google_search": {}}]},
        "request_field_refused",
        "tools[0].google_search",
    ),
    ({"tools": [{"google_search_retrieval": {}}]}, "hosted_tool_refused", "tools[0].type"),
    ({"tools": [{"type": "mcp", "server_url": "https://mcp.example.com"}]}, "hosted_tool_refused", "tools[0].type"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "x-extension": 1}}]},
        "request_field_refused",
        "tools[0].function.x-extension",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-operator-data"}}]}]},
        "request_field_refused",
        "messages[0].content[0].file.file_id",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.example/?d=1"}}]}
            ]
        },
        "request_field_refused",
        "messages[0].content[0].image_url.url",
    ),
]
IDS = [param or "provider-weakened" for _, _, param in EXTENSIONS]


def refused_as(answer: dict[str, Any], code: str, param: str) -> None:
    error = answer["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param
        assert param in error["message"]


@pytest.fixture
async def chat_stack(make_stack: StackFactory) -> tuple[Stack, dict[str, str]]:  # noqa: F811
    stack = await make_stack()
    ident, secret = await stack.identity(chain=CHAIN)
    return stack, {"Authorization": f"Bearer {ident}:{secret}"}


async def post(stack: Stack, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    got, answer, _ = await raw(
        stack.proxy.worker_base_url + "/chat/completions", headers=headers, data=json.dumps(body).encode()
    )
    return got, answer


@pytest.mark.parametrize(("extra", "code", "param"), EXTENSIONS, ids=IDS)
@pytest.mark.parametrize("model", ["primary", "fallback"])  # a Chat Completions route and an openrouter/ one
async def test_a_provider_extension_is_refused_before_any_upstream(
    chat_stack: tuple[Stack, dict[str, str]], model: str, extra: dict[str, Any], code: str, param: str
) -> None:
    stack, headers = chat_stack
    got, answer = await post(stack, headers, {"model": model, "messages": MESSAGES, **extra})
    assert got == 400, answer
    refused_as(answer, code, param)
    assert stack.primary.requests == []
    assert stack.fallback.requests == []
    got, _ = await post(stack, headers, {"model": model, "messages": MESSAGES})  # the positive control
    assert got == 200
    assert len(stack.primary.requests + stack.fallback.requests) == 1


async def test_the_responses_adapter_gets_no_extension(served: tuple[Upstream, ProxyServer, str]) -> None:  # noqa: F811
    upstream, proxy, credential = served
    assert (await ask(proxy, credential, max_tokens=64)).status_code == 200  # the model now speaks Responses
    assert [kind for kind, _ in upstream.requests] == ["chat", "responses"]
    for extra, code, param in EXTENSIONS:
        if param == "":
            continue  # preferences are checked on openrouter/ entries only; no other route is sent them
        answer = await ask(proxy, credential, **extra)
        assert answer.status_code == 400, extra
        refused_as(answer.json(), code, param)
    assert len(upstream.requests) == 2  # nothing more was sent
    clean = await ask(
        proxy, credential, max_tokens=64, stop=["x"], user="u", tools=[{"type": "function", "function": {"name": "f"}}]
    )
    assert clean.status_code == 200
    kind, sent = upstream.requests[-1]
    assert kind == "responses"
    assert set(sent) <= RESPONSES_FIELDS
    assert set(sent["tools"][0]) == {"type", "name", "parameters", "strict"}


async def test_the_plan_route_gets_no_extension(make_stack: StackFactory, plan_idp: PlanIdP, tmp_path: Path) -> None:  # noqa: F811
    stack, store = await plan_stack(make_stack, plan_idp, tmp_path)
    sign_in(store, plan_idp)
    ident, secret = await stack.identity(chain=PLAN_ONLY)
    headers = {"Authorization": f"Bearer {ident}:{secret}"}
    for extra, code, param in EXTENSIONS:
        if param == "":
            continue  # preferences are checked on openrouter/ entries only; no other route is sent them
        got, answer = await post(stack, headers, {"model": "primary", "messages": MESSAGES, **extra})
        assert got == 400, extra
        refused_as(answer, code, param)
    assert plan_idp.requests == []
    got, _ = await post(stack, headers, {"model": "primary", "messages": MESSAGES, "temperature": 0.2})
    assert got == 200
    (request,) = plan_idp.requests
    assert set(request.body) <= OUTGOING_FIELDS["plan"]
    assert "temperature" not in request.body


# ------------------------------------------------------------------------------------------ property test

KNOWN_TOP: frozenset[str] = frozenset({*CHAT_FIELDS, *REFUSED_FIELDS, *DROPPED_FIELDS})
TOOL_KEYS = frozenset({"type", "function"})
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})

_names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=16),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names, inner, max_size=3),
    max_leaves=8,
)


def unknown(known: frozenset[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(_names.filter(lambda key: key not in known), _json, max_size=3)


@st.composite
def hostile_bodies(draw: st.DrawFn) -> dict[str, Any]:
    tools = []
    for index in range(draw(st.integers(0, 3))):
        function = {"name": f"tool_{index}", "parameters": {"type": "object"}, **draw(unknown(FUNCTION_KEYS))}
        tools.append({"type": "function", "function": function, **draw(unknown(TOOL_KEYS))})
    body: dict[str, Any] = {**draw(unknown(KNOWN_TOP)), "model": "primary", "messages": MESSAGES}
    if tools:
        body["tools"] = tools
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=hostile_bodies())
async def test_nothing_unknown_ever_reaches_the_upstream(
    chat_stack: tuple[Stack, dict[str, str]], body: dict[str, Any]
) -> None:
    stack, headers = chat_stack
    stack.primary.clear_requests()
    got, answer = await post(stack, headers, body)
    if got != 200:
        assert got == 400
        assert answer["error"]["code"] == "request_field_refused"
        assert stack.primary.requests == []
        return
    (request,) = stack.primary.requests
    sent = request.body
    assert set(sent) <= OUTGOING_FIELDS["chat"]
    assert set(sent) - {"model"} <= set(body)
    for tool in sent.get("tools") or []:
        assert set(tool) <= TOOL_KEYS
        assert set(tool["function"]) <= FUNCTION_KEYS
