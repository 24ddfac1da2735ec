"""An async OpenAI-compatible client (chat completions, streaming, tool calls) over TCP or a Unix socket.

The scripted fake model that tests and the offline demo talk to lives in :mod:`clawstack.llm.fake`.
"""

from clawstack.llm.accumulate import CompletionAccumulator
from clawstack.llm.client import UNSET, ChatStream, LLMClient
from clawstack.llm.errors import (
    LLM_ERROR_CODES,
    FakeDirectiveError,
    FakeModelError,
    FakeScriptError,
    LLMAuthenticationError,
    LLMBadRequestError,
    LLMError,
    LLMHTTPError,
    LLMPermissionDeniedError,
    LLMProtocolError,
    LLMRateLimitError,
    LLMServerError,
    LLMStreamError,
    LLMTimeoutError,
    LLMTransportError,
)
from clawstack.llm.types import (
    ChatCompletion,
    ChatCompletionChunk,
    Message,
    ModelInfo,
    ReasoningEffort,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
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
