"""LLMClient construction and request building, without a network: validation and what goes in the body."""

from __future__ import annotations

from typing import Any

import pytest

from clawstack.llm import UNSET, LLMClient
from clawstack.llm.client import _request_body


def test_repr_and_endpoint_hide_credentials() -> None:
    client = LLMClient("http://user:hunter2@127.0.0.1:9/v1/?k=secret", api_key="sk-very-secret")
    assert client.endpoint == "http://127.0.0.1:9/v1"
    assert "secret" not in repr(client)
    assert "hunter2" not in repr(client)


def test_unix_socket_endpoint_names_the_socket() -> None:
    client = LLMClient("http://localhost/v1", unix_socket="/run/m.sock")
    assert client.endpoint == "http://localhost/v1 (unix:/run/m.sock)"


@pytest.mark.parametrize("url", ["127.0.0.1:8080/v1", "ftp://h/v1", "/v1", "http:///v1"])
def test_base_url_must_be_absolute_http(url: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        LLMClient(url)


@pytest.mark.parametrize("field", ["timeout_s", "first_byte_timeout_s"])
@pytest.mark.parametrize("value", [0, -1.0])
def test_timeouts_must_be_positive(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        LLMClient("http://h/v1", **{field: value})


def test_unset_is_distinct_from_none() -> None:
    assert UNSET is not None
    assert repr(UNSET)


async def test_calls_outside_the_context_manager_are_refused() -> None:
    client = LLMClient("http://127.0.0.1:9/v1")
    with pytest.raises(RuntimeError, match="async context manager"):
        await client.chat_completion(model="m", messages=[])


def _body(**kwargs: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": None,
        "tool_choice": None,
        "reasoning_effort": None,
        "extra": None,
        "stream": False,
    }
    arguments.update(kwargs)
    return _request_body(**arguments)


def test_minimal_body() -> None:
    assert _body() == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_full_body() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = _body(tools=tools, tool_choice="required", reasoning_effort="minimal", extra={"temperature": 0}, stream=True)
    assert body["tools"] == tools
    assert body["tool_choice"] == "required"
    assert body["reasoning_effort"] == "minimal"
    assert body["temperature"] == 0
    assert body["stream"] is True


def test_reasoning_effort_is_checked_at_runtime() -> None:
    with pytest.raises(ValueError, match="reasoning_effort"):
        _body(reasoning_effort="extreme")


@pytest.mark.parametrize(
    "field", ["model", "messages", "stream", "stream_options", "tools", "tool_choice", "reasoning_effort"]
)
def test_extra_may_not_override_fields_the_client_sets(field: str) -> None:
    with pytest.raises(ValueError, match=f"extra field '{field}'"):
        _body(extra={field: 1})
