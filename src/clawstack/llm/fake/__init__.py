"""The scripted fake model: an OpenAI-compatible test double. It is not a language model.

It answers ``/v1/chat/completions`` the way ``@fake`` directives in the last user message, or the steps of a
script file, tell it to: a given reply, an echo, tool calls, ``structured_output``, delays, slow streams, HTTP
failures, empty answers, dropped connections. See ``docs/fake-llm.md``.

::

    async with FakeModelServer() as fake:
        async with LLMClient(fake.base_url) as client:
            ...
        assert fake.requests[0].body["model"] == "clawstack-fake"
"""

from clawstack.llm.fake.behaviour import DEFAULT_ANSWER, STRUCTURED_OUTPUT_TOOL, Behaviour, FakeToolCall
from clawstack.llm.fake.directives import parse_directives, strip_directives
from clawstack.llm.fake.requests import RecordedRequest
from clawstack.llm.fake.script import FakeScript, ScriptStep, load_script, parse_script
from clawstack.llm.fake.server import FakeModelServer, ServerState

__all__ = [
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
