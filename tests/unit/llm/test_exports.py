"""The public API of clawstack.llm (and of its test double, clawstack.llm.fake) is exactly these lists."""

import types

import clawstack.llm
import clawstack.llm.fake

LLM_API = [
    "LLM_ERROR_CODES",
    "UNSET",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatStream",
    "CompletionAccumulator",
    "FakeDirectiveError",
    "FakeModelError",
    "FakeScriptError",
    "LLMAuthenticationError",
    "LLMBadRequestError",
    "LLMClient",
    "LLMError",
    "LLMHTTPError",
    "LLMPermissionDeniedError",
    "LLMProtocolError",
    "LLMRateLimitError",
    "LLMServerError",
    "LLMStreamError",
    "LLMTimeoutError",
    "LLMTransportError",
    "Message",
    "ModelInfo",
    "ReasoningEffort",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
]

FAKE_API = [
    "DEFAULT_ANSWER",
    "STRUCTURED_OUTPUT_TOOL",
    "Behaviour",
    "FakeModelServer",
    "FakeScript",
    "FakeToolCall",
    "RecordedRequest",
    "ScriptStep",
    "ServerState",
    "load_script",
    "parse_directives",
    "parse_script",
    "strip_directives",
]


def _public_names(module: types.ModuleType) -> list[str]:
    return sorted(
        name
        for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
    )


def test_llm_all_is_pinned() -> None:
    assert clawstack.llm.__all__ == LLM_API
    assert _public_names(clawstack.llm) == sorted(LLM_API)


def test_fake_all_is_pinned() -> None:
    assert clawstack.llm.fake.__all__ == FAKE_API
    assert _public_names(clawstack.llm.fake) == sorted(FAKE_API)
