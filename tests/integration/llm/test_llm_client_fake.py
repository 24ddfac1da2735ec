"""The client against the scripted fake, over real sockets: plain and streamed answers, tool calls,
request fields, scripts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clawstack.llm import ChatCompletion, LLMBadRequestError, LLMClient, ToolCall, Usage
from clawstack.llm.fake import DEFAULT_ANSWER, FakeModelServer, parse_script


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def stream_all(client: LLMClient, text: str, **kwargs: Any) -> tuple[list[str | None], ChatCompletion]:
    async with client.stream_chat_completion(model="m", messages=user(text), **kwargs) as stream:
        contents = [chunk.content async for chunk in stream]
        return contents, await stream.final_completion()


async def test_default_answer_over_tcp(client: LLMClient, fake: FakeModelServer) -> None:
    completion = await client.chat_completion(model="gpt-test", messages=user("Hello there"))
    assert completion.content == DEFAULT_ANSWER
    assert completion.model == "gpt-test"
    assert completion.finish_reason == "stop"
    assert completion.tool_calls == ()
    words = len(DEFAULT_ANSWER.split())
    assert completion.usage == Usage(prompt_tokens=2, completion_tokens=words, total_tokens=2 + words)
    assert completion.raw["object"] == "chat.completion"
    assert fake.base_url.startswith("http://127.0.0.1:")


async def test_plain_and_streamed_over_a_unix_socket(socket_path: Path) -> None:
    async with (
        FakeModelServer(unix_socket=socket_path) as fake,
        LLMClient("http://ignored-host/v1", unix_socket=socket_path) as client,
    ):
        assert fake.unix_socket == str(socket_path)
        assert fake.address == f"unix:{socket_path}"
        completion = await client.chat_completion(model="m", messages=user("@fake reply: over a socket"))
        assert completion.content == "over a socket"
        contents, streamed = await stream_all(client, "@fake reply: streamed over a socket")
        assert streamed.content == "streamed over a socket"
        assert contents[1:4] == ["streamed ", "over ", "a "]
        models = await client.list_models()
        assert [model.id for model in models] == ["clawstack-fake"]


async def test_streaming_reply_in_word_chunks_with_usage(client: LLMClient, fake: FakeModelServer) -> None:
    contents, completion = await stream_all(client, "@fake reply: one two three")
    assert contents == ["", "one ", "two ", "three", None, None]
    assert completion.content == "one two three"
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
    body = fake.requests[-1].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_streaming_without_usage(client: LLMClient, fake: FakeModelServer) -> None:
    _, completion = await stream_all(client, "@fake reply: hi", include_usage=False)
    assert completion.usage is None
    assert "stream_options" not in fake.requests[-1].body


async def test_plain_and_streamed_tool_calls_agree(client: LLMClient) -> None:
    text = (
        '@fake tool-call: get_weather {"city": "Paris", "units": "metric", "days": [1, 2, 3]}\n'
        '@fake tool-call: get_time {"zone": "Europe/Paris"}'
    )
    plain = await client.chat_completion(model="m", messages=user(text))
    _, streamed = await stream_all(client, text)
    for completion in (plain, streamed):
        assert completion.finish_reason == "tool_calls"
        assert completion.content is None
        assert [call.name for call in completion.tool_calls] == ["get_weather", "get_time"]
        assert json.loads(completion.tool_calls[0].arguments) == {"city": "Paris", "units": "metric", "days": [1, 2, 3]}
        assert json.loads(completion.tool_calls[1].arguments) == {"zone": "Europe/Paris"}
        assert all(call.id.startswith("call_") for call in completion.tool_calls)
    assert [(call.name, call.arguments) for call in plain.tool_calls] == [
        (call.name, call.arguments) for call in streamed.tool_calls
    ]


async def test_streamed_tool_call_arguments_arrive_in_fragments(client: LLMClient) -> None:
    async with client.stream_chat_completion(
        model="m", messages=user('@fake tool-call: f {"long": "' + "x" * 60 + '"}')
    ) as stream:
        fragments = [delta.arguments async for chunk in stream for delta in chunk.tool_calls if delta.arguments]
        completion = await stream.final_completion()
    assert len(fragments) > 3
    assert "".join(fragments) == completion.tool_calls[0].arguments


async def test_structured_output(client: LLMClient) -> None:
    completion = await client.chat_completion(
        model="m", messages=user('Summarise.\n@fake structured-output: {"summary": "short", "score": 3}')
    )
    (call,) = completion.tool_calls
    assert call.name == "structured_output"
    assert json.loads(call.arguments) == {"summary": "short", "score": 3}


async def test_tool_calls_first_then_the_reply(client: LLMClient) -> None:
    messages: list[dict[str, Any]] = user('@fake tool-call: lookup {"id": 7}\n@fake reply: Found it.')
    first = await client.chat_completion(model="m", messages=messages)
    assert first.content is None
    (call,) = first.tool_calls
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [first.raw["choices"][0]["message"]["tool_calls"][0]]},
        {"role": "tool", "tool_call_id": call.id, "content": "record 7"},
    ]
    second = await client.chat_completion(model="m", messages=messages)
    assert second.content == "Found it."
    assert second.tool_calls == ()
    assert second.finish_reason == "stop"


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high"])
async def test_reasoning_effort_is_sent(client: LLMClient, fake: FakeModelServer, effort: Any) -> None:
    await client.chat_completion(model="m", messages=user("hi"), reasoning_effort=effort)
    assert fake.requests[-1].body["reasoning_effort"] == effort


async def test_reasoning_effort_is_omitted_when_none(client: LLMClient, fake: FakeModelServer) -> None:
    await client.chat_completion(model="m", messages=user("hi"))
    async with client.stream_chat_completion(model="m", messages=user("hi")) as stream:
        await stream.final_completion()
    assert all("reasoning_effort" not in recorded.body for recorded in fake.requests)


async def test_tools_tool_choice_and_extra_fields_pass_through(client: LLMClient, fake: FakeModelServer) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    extra = {"temperature": 0.25, "max_tokens": 5, "provider": {"order": ["a", "b"], "data_collection": "deny"}}
    choice = {"type": "function", "function": {"name": "f"}}
    await client.chat_completion(model="m", messages=user("hi"), tools=tools, tool_choice=choice, extra=extra)
    body = fake.requests[-1].body
    assert body == {"model": "m", "messages": user("hi"), "tools": tools, "tool_choice": choice, **extra}


async def test_request_headers_are_recorded_without_authorization() -> None:
    async with (
        FakeModelServer(api_key="sk-fake-key") as fake,
        LLMClient(fake.base_url, api_key="sk-fake-key", headers={"X-Trace": "t-1"}) as client,
    ):
        await client.chat_completion(model="m", messages=user("hi"))
        (recorded,) = fake.requests
    assert recorded.method == "POST"
    assert recorded.path == "/v1/chat/completions"
    assert recorded.headers["x-trace"] == "t-1"
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.headers["user-agent"].startswith("clawstack/")
    assert "authorization" not in recorded.headers
    assert "sk-fake-key" not in json.dumps(recorded.to_dict())


async def test_echo_sends_back_the_message_without_directives(client: LLMClient) -> None:
    completion = await client.chat_completion(model="m", messages=user("Say this back.\n@fake echo"))
    assert completion.content == "Say this back."
    _, streamed = await stream_all(client, "  Say   it\nslowly  \n@fake echo")
    assert streamed.content == "Say   it\nslowly"


async def test_empty_content(client: LLMClient) -> None:
    completion = await client.chat_completion(model="m", messages=user("@fake empty"))
    assert completion.content == ""
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 0
    contents, streamed = await stream_all(client, "@fake empty")
    assert streamed.content == ""
    assert streamed.finish_reason == "stop"
    assert "".join(content or "" for content in contents) == ""


async def test_many_calls_on_one_client(client: LLMClient) -> None:
    for index in range(5):
        completion = await client.chat_completion(model="m", messages=user(f"@fake reply: answer {index}"))
        assert completion.content == f"answer {index}"
        _, streamed = await stream_all(client, f"@fake reply: streamed {index}")
        assert streamed.content == f"streamed {index}"


async def test_script_steps_are_used_in_order_and_matched() -> None:
    script = parse_script(
        [
            {"reply": "first"},
            {"match": "weather", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
            {"reply": "third", "chunk_delay_ms": 1},
        ]
    )
    async with FakeModelServer(script) as fake, LLMClient(fake.base_url) as client:
        assert fake.script_steps_remaining == 3
        first = await client.chat_completion(model="m", messages=user("hello"))
        third = await client.chat_completion(model="m", messages=user("hello again"))
        directed = await client.chat_completion(model="m", messages=user("@fake reply: directives win"))
        _, weather = await stream_all(client, "and the weather?")
        assert fake.script_steps_remaining == 0
        with pytest.raises(LLMBadRequestError) as caught:
            await client.chat_completion(model="m", messages=user("one more"))
    assert (first.content, third.content, directed.content) == ("first", "third", "directives win")
    assert weather.tool_calls == (
        ToolCall(id=weather.tool_calls[0].id, name="get_weather", arguments='{"city":"Oslo"}'),
    )
    assert caught.value.error_code == "fake_script_exhausted"


async def test_script_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"reply": "scripted from a file"}]))
    async with FakeModelServer(path) as fake, LLMClient(fake.base_url) as client:
        completion = await client.chat_completion(model="m", messages=user("go"))
    assert completion.content == "scripted from a file"


async def test_list_models(client: LLMClient, fake: FakeModelServer) -> None:
    (model,) = await client.list_models()
    assert (model.id, model.owned_by) == ("clawstack-fake", "clawstack")
    assert fake.requests[-1].method == "GET"
    assert fake.requests[-1].body is None
