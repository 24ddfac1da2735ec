"""The agent loop: one agent turn, from a user message to a final answer, recorded step by step.

:meth:`AgentLoop.run_turn` appends the user message to the session's transcript, sends the transcript (after the
agent's instructions and its workspace's bootstrap files, see :mod:`clawstack.gateway.bootstrap`; a subagent
session gets ``AGENTS.md`` only, the minimal prompt none) and the agent's effective tools to the agent's model, streams the answer to the caller's
``on_event`` callback, runs the tools the model calls, and loops until the model answers without tool calls or
:data:`MAX_TOOL_ROUNDS` model calls have been made. Every assistant and tool message is appended to the
transcript as soon as it is complete, with the provider, model, usage and stop reason; the run is recorded in the
:class:`~clawstack.gateway.sessions.SessionStore` from ``running`` to ``ok``, ``error``, ``timeout`` or ``aborted``.

Models: the agent's ``model.primary`` and then its ``fallbacks`` (or one explicit ``provider/model``), each through
its provider's ``baseUrl`` and ``apiKey``. A model call that fails before any text was streamed moves on to the
next model in the chain; the turn stays on the model that answered. A failure after text was streamed, or of the
last model, ends the turn with status ``error`` and the model error's code.

Deadlines and cancellation: the whole turn runs under one ``timeout_s`` deadline (default
``agents.defaults.timeoutSeconds``) and ends with status ``timeout`` when it passes. Cancelling the task running
:meth:`~AgentLoop.run_turn` records the run as ``aborted`` and re-raises the cancellation; nothing is appended to
the transcript and no event is sent after it. A message still half-streamed is never appended.

Events (:class:`AgentEvent`, OpenClaw's ``agent`` event streams):

* ``run_status``: ``{"phase": "preparing_context"}`` first, ``{"phase": "starting_model"}`` once the transcript is
  loaded (the gateway repeats these as ``status`` chat events).
* ``lifecycle``: ``{"phase": "start"}``; ``{"phase": "model", "provider", "model", "round"}`` before each model
  call (fallbacks included); ``{"phase": "finishing"}`` once the final answer is in; ``{"phase": "end", "status",
  "terminalReply": {"disposition", "text"}}`` (``disposition`` is ``visible`` for an ``ok`` run, else ``error``;
  plus ``"error": {code, message}`` unless ``ok``) after the run is recorded.
* ``assistant``: ``{"text": <the message so far>, "delta": <the new piece>}`` per streamed piece of text.
* ``tool``: ``{"phase": "start", "name", "toolCallId", "args"}`` and ``{"phase": "result", "name",
  "toolCallId", "isError", "result"}``.
* ``usage``: ``{"outputTokens"}`` after each model call whose answer reported usage.

Transcript shapes: the user message is its text (idempotency key ``"<run_id>:user"``); an assistant message is a
list of ``{"type": "text", "text"}`` and ``{"type": "toolCall", "id", "name", "arguments"}`` blocks; a tool
message is one ``{"type": "text", "text", "toolCallId", "toolName", "isError"}`` block. Assistant messages carry
``usage`` as ``{"input", "output", "totalTokens"}`` and ``stopReason`` in OpenClaw's words (``stop``, ``toolUse``,
``length``; any other finish reason as the model gave it).

Errors raised before a run is recorded (and by :meth:`AgentLoop.complete`, a model call outside any session)::

    GatewayError                   (clawstack.gateway.errors)
     └── AgentLoopError            "agent_loop_error"
          ├── UnknownAgentError    "agent_not_found": no such agent in the config
          ├── UnknownModelError    "model_not_found": the ``model`` override names no configured model
          └── ModelChainError      "model_chain_failed": every model of ``complete``'s chain failed

A run id already past ``accepted`` raises :class:`~clawstack.gateway.sessions.RunStateError`; session and key
errors come from the store.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from clawstack.gateway.bootstrap import BOOTSTRAP_FILES, SUBAGENT_BOOTSTRAP_FILES, bootstrap_context
from clawstack.gateway.config import AgentEntry, GatewayConfig, ProviderConfig, split_model_ref
from clawstack.gateway.custody import NATIVE_OWNER
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import parse_session_key
from clawstack.gateway.sessions import Message, NewMessage, RunStateError, SessionStore, content_text
from clawstack.gateway.tools import Tool, ToolError, ToolInvocation, ToolPolicy, ToolRegistry
from clawstack.llm import ChatCompletion, LLMClient, LLMError, ReasoningEffort, ToolCall

if TYPE_CHECKING:
    from clawstack.gateway.plugins.hooks import HookRegistry

__all__ = [
    "MAX_TOOL_ROUNDS",
    "MINIMAL_INSTRUCTIONS_CHARS",
    "MINIMAL_PROMPT",
    "AgentEvent",
    "AgentLoop",
    "AgentLoopError",
    "EventHandler",
    "EventStream",
    "LLMFactory",
    "ModelChainError",
    "PromptMode",
    "TurnError",
    "TurnResult",
    "TurnStatus",
    "UnknownAgentError",
    "UnknownModelError",
    "default_llm_factory",
    "transcript_to_messages",
]

#: The most model calls one turn makes; a model still calling tools after that ends the turn with an error.
MAX_TOOL_ROUNDS: Final = 16

TurnStatus = Literal["ok", "error", "timeout"]
"""How :meth:`AgentLoop.run_turn` ends when it returns (a cancelled turn raises instead, recorded ``aborted``)."""

EventStream = Literal["run_status", "lifecycle", "assistant", "tool", "usage"]

PromptMode = Literal["full", "minimal"]
"""``full``: the agent's instructions and the whole transcript; ``minimal``: the bounded subagent prompt."""

#: The system prompt's preamble in ``prompt_mode="minimal"``.
MINIMAL_PROMPT: Final = (
    "You are a subagent doing one delegated task in the background. Work only on the task in the user message, "
    "use only the tools you are given, and end with one final answer that reports the result."
)

#: How much of the agent's instructions ``prompt_mode="minimal"`` keeps.
MINIMAL_INSTRUCTIONS_CHARS: Final = 4000

_STOP_REASONS: Final[Mapping[str, str]] = {"stop": "stop", "tool_calls": "toolUse", "length": "length"}


class AgentLoopError(GatewayError):
    """Base of the agent loop's errors: the turn could not start."""

    code = "agent_loop_error"


class UnknownAgentError(AgentLoopError):
    """The agent id names no agent in ``agents.entries``."""

    code = "agent_not_found"


class UnknownModelError(AgentLoopError):
    """The model override names no model of a configured provider."""

    code = "model_not_found"


class ModelChainError(AgentLoopError):
    """Every model of the chain failed (:meth:`AgentLoop.complete`); ``model_error_code`` is the last one's code."""

    code = "model_chain_failed"

    def __init__(self, message: str, *, model_error_code: str) -> None:
        super().__init__(message)
        self.model_error_code = model_error_code


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One progress event of a run: ``seq`` counts from 1 per run; ``data`` depends on ``stream``."""

    run_id: str
    session_key: str
    agent_id: str
    seq: int
    stream: EventStream
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TurnError:
    """Why a turn did not end ``ok``: a stable ``code`` (a model error's own code when the model failed)."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """``{"code", "message"}``."""
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The end of a turn: ``text`` is the last assistant text (``""`` if none); ``error`` unless ``ok``."""

    status: TurnStatus
    text: str
    error: TurnError | None = None


EventHandler = Callable[[AgentEvent], Awaitable[None]]
LLMFactory = Callable[[str, ProviderConfig], LLMClient]
"""``(provider_id, provider) -> LLMClient``: the client for one provider, not yet entered."""


def default_llm_factory(provider_id: str, provider: ProviderConfig) -> LLMClient:
    """A client for the provider's ``baseUrl`` and ``apiKey``; the turn's own deadline bounds every call."""
    api_key = None if provider.api_key is None else provider.api_key.get_secret_value()
    return LLMClient(provider.base_url, api_key=api_key, timeout_s=None)


class _TurnFailed(Exception):
    """Ends a turn with status ``error``; internal to this module."""

    def __init__(self, error: TurnError, text: str = "") -> None:
        super().__init__(error.message)
        self.error = error
        self.text = text


def transcript_to_messages(history: Sequence[Message]) -> list[dict[str, Any]]:
    """The OpenAI chat messages for a stored transcript.

    Tool calls without a stored result (a turn cut short between the two) and results without their call are left
    out, so the request is always well formed.
    """
    result_ids: set[str] = set()
    call_ids: set[str] = set()
    for message in history:
        if isinstance(message.content, list):
            for block in message.content:
                if message.role == "tool" and isinstance(block.get("toolCallId"), str):
                    result_ids.add(block["toolCallId"])
                if message.role == "assistant" and block.get("type") == "toolCall" and isinstance(block.get("id"), str):
                    call_ids.add(block["id"])
    messages: list[dict[str, Any]] = []
    for message in history:
        if message.role in ("user", "system"):
            messages.append({"role": message.role, "content": content_text(message.content)})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": content_text(message.content)}
            calls = [
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": block["arguments"]
                        if isinstance(block.get("arguments"), str)
                        else json.dumps(block.get("arguments", {})),
                    },
                }
                for block in (message.content if isinstance(message.content, list) else [])
                if block.get("type") == "toolCall" and block.get("id") in result_ids
            ]
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
        elif isinstance(message.content, list):
            for block in message.content:
                call_id = block.get("toolCallId")
                if isinstance(call_id, str) and call_id in call_ids:
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": str(block.get("text", ""))})
    return messages


def _load_transcript(store: SessionStore, key: str) -> list[Message]:
    """The whole transcript, oldest first, read a page at a time."""
    pages: list[list[Message]] = []
    offset = 0
    while True:
        page = store.history(key, limit=1000, offset=offset)
        pages.append(page.messages)
        if not page.has_more:
            break
        offset += 1000
    return [message for page_messages in reversed(pages) for message in page_messages]


def _call_arguments(call: ToolCall) -> dict[str, Any] | str:
    """The arguments as an object when they parse as one, else the text as received."""
    try:
        parsed = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return call.arguments
    return parsed if isinstance(parsed, dict) else call.arguments


class AgentLoop:
    """Runs agent turns against one config, session store and tool registry.

    LLM clients are made by ``llm_factory`` once per provider and kept open; :meth:`aclose` closes them.
    """

    def __init__(
        self,
        config: GatewayConfig,
        store: SessionStore,
        registry: ToolRegistry,
        *,
        llm_factory: LLMFactory = default_llm_factory,
        hooks: HookRegistry | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._registry = registry
        self._hooks = hooks
        self._llm_factory = llm_factory
        self._clients: dict[str, LLMClient] = {}
        self._clients_lock = asyncio.Lock()

    async def aclose(self) -> None:
        """Close every LLM client this loop opened. Idempotent."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()

    async def __aenter__(self) -> AgentLoop:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def effective_tools(
        self,
        agent_id: str,
        *,
        tools_allow: Sequence[str] | None = None,
        also_allow: Sequence[str] = (),
        disable_tools: bool = False,
    ) -> list[str]:
        """The registered tools ``agent_id`` may call: the global policy, narrowed by the agent's and the run's.

        The candidates are the gateway's own tools plus the plugin tools named in ``also_allow`` (a plugin tool is
        never on a surface unless a run asks for it); every policy layer then narrows them, denies and explicit
        allow-lists included. ``disable_tools`` gives the exact empty surface.
        """
        if disable_tools:
            return []
        extra = frozenset(also_allow)
        candidates = [name for name in self._registry.names() if name in extra or self._registry.owner(name) is None]
        tools = self._config.tools
        if not tools.swarm.enabled:
            # Without collector support a native child could never be collected: no spawning either.
            candidates = [name for name in candidates if name not in ("sessions_spawn", "agents_wait")]
        layers = [*ToolPolicy.layers_from_config(tools), *ToolPolicy.layers_from_config(self.agent(agent_id).tools)]
        if tools_allow is not None:
            layers.append(ToolPolicy(tools_allow))
        return ToolPolicy().effective(candidates, *layers)

    def agent(self, agent_id: str) -> AgentEntry:
        """The configured agent; :class:`UnknownAgentError` if there is none."""
        try:
            return self._config.agent(agent_id)
        except KeyError:
            raise UnknownAgentError(f"no agent {json.dumps(agent_id)} is configured") from None

    def model_chain(self, agent_id: str, model: str | None) -> tuple[str, ...]:
        """The models a call tries: the agent's primary and fallbacks, or ``model`` (checked to exist) followed by the
        agent's fallbacks."""
        configured = self._config.agent_model(agent_id).chain
        if model is None:
            return configured
        try:
            self._config.resolve_model(model)
        except (KeyError, ValueError):
            raise UnknownModelError(f"no configured model is {json.dumps(model)}") from None
        # An override replaces the primary; the agent's configured fallbacks still follow it.
        return (model, *(ref for ref in configured[1:] if ref != model))

    async def _client(self, provider_id: str, provider: ProviderConfig) -> LLMClient:
        async with self._clients_lock:
            client = self._clients.get(provider_id)
            if client is None:
                client = self._llm_factory(provider_id, provider)
                await client.__aenter__()
                self._clients[provider_id] = client
            return client

    async def complete(
        self, agent_id: str, chain: tuple[str, ...], messages: list[dict[str, Any]]
    ) -> tuple[ChatCompletion, str, str]:
        """One tool-free model call on ``messages`` outside any session, through ``chain`` with the same fallback
        rule as a turn: ``(completion, provider_id, model_id)``; :class:`ModelChainError` when every model failed."""
        turn = _Turn(
            loop=self,
            run_id="",
            session_key="",
            agent_id=agent_id,
            chain=chain,
            system_prompt=None,
            tool_names=[],
            on_event=None,
            _messages=list(messages),
        )
        try:
            return await turn._complete([], 1)
        except _TurnFailed as failed:
            raise ModelChainError(failed.error.message, model_error_code=failed.error.code) from None

    async def run_turn(
        self,
        *,
        run_id: str,
        session_key: str,
        agent_id: str,
        message: str,
        extra_system_prompt: str | None = None,
        model: str | None = None,
        tools_allow: Sequence[str] | None = None,
        also_allow: Sequence[str] = (),
        disable_tools: bool = False,
        prompt_mode: PromptMode = "full",
        reasoning_effort: ReasoningEffort | None = None,
        timeout_s: float | None = None,
        on_event: EventHandler | None = None,
    ) -> TurnResult:
        """Run one turn of ``agent_id`` on ``session_key`` for the user ``message``; see the module docstring.

        ``model`` (``provider/model``) replaces the agent's model chain; ``tools_allow`` narrows the effective
        tools further, ``also_allow`` adds plugin tools to the candidates (see :meth:`effective_tools`);
        ``disable_tools`` sends none. ``prompt_mode="minimal"`` sends the bounded subagent prompt (see
        :data:`MINIMAL_PROMPT`) and only this run's messages instead of the whole transcript.
        ``reasoning_effort`` goes to every model call of the turn. ``timeout_s`` defaults to
        ``agents.defaults.timeoutSeconds``.
        The run ``run_id`` is recorded on the session (created for ``agent_id`` if needed); it may already be
        recorded as ``accepted``, never further along.
        """
        agent = self.agent(agent_id)
        chain = self.model_chain(agent_id, model)
        tool_names = self.effective_tools(
            agent_id, tools_allow=tools_allow, also_allow=also_allow, disable_tools=disable_tools
        )
        if timeout_s is None:
            timeout_s = float(self._config.agents.defaults.timeout_seconds)
        elif not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError("timeout_s must be a positive number of seconds")
        if prompt_mode not in ("full", "minimal"):
            raise ValueError('prompt_mode must be "full" or "minimal"')

        store = self._store
        session = await asyncio.to_thread(store.get_or_create, session_key, agent_id=agent_id)
        # Only a native child's session (which no caller can create or claim) is ever blind.
        blind = session.owner == NATIVE_OWNER and session.metadata.get("blind") is True
        subagent = parse_session_key(session.key).kind == "subagent"
        workspace = agent.workspace
        if agent.skip_bootstrap or prompt_mode == "minimal":
            bootstrap = ""  # the minimal prompt stays bounded: no workspace files
        else:
            bootstrap = (
                await asyncio.to_thread(
                    bootstrap_context,
                    workspace,
                    blind=blind,
                    max_chars=agent.bootstrap_max_chars,
                    total_max_chars=agent.bootstrap_total_max_chars,
                    files=SUBAGENT_BOOTSTRAP_FILES if subagent else BOOTSTRAP_FILES,
                )
            ).text
        if prompt_mode == "minimal":
            instructions = agent.instructions or ""
            if len(instructions) > MINIMAL_INSTRUCTIONS_CHARS:
                instructions = instructions[:MINIMAL_INSTRUCTIONS_CHARS] + "\n[instructions truncated]"
            system_parts = [MINIMAL_PROMPT, instructions, bootstrap, extra_system_prompt or ""]
        else:
            system_parts = [agent.instructions or "", bootstrap, extra_system_prompt or ""]
        system_parts = [part for part in system_parts if part]
        run, _ = await asyncio.to_thread(store.start_run, run_id, session_key)
        if run.state != "accepted":
            raise RunStateError(f"the run is already {run.state}")
        await asyncio.to_thread(store.mark_running, run_id)

        turn = _Turn(
            loop=self,
            run_id=run_id,
            session_key=run.session_key,
            agent_id=agent_id,
            chain=chain,
            system_prompt="\n\n".join(system_parts) or None,
            tool_names=tool_names,
            on_event=on_event,
            this_run_only=prompt_mode == "minimal",
            reasoning_effort=reasoning_effort,
            session_id=session.session_id,
            workspace=workspace,
            blind=blind,
        )
        scope = asyncio.timeout(timeout_s)
        try:
            async with scope:
                result = await turn.run(message)
        except TimeoutError:
            if not scope.expired():
                await asyncio.to_thread(store.finish_run, run_id, "error", "internal error")
                raise
            result = TurnResult(
                "timeout", turn.last_text, TurnError("run_timeout", f"the run took longer than {timeout_s:g} s")
            )
        except _TurnFailed as failed:
            result = TurnResult("error", failed.text, failed.error)
        except asyncio.CancelledError:
            # Best-effort shutdown step: record the run as aborted, then let the cancellation go on.
            await asyncio.to_thread(store.finish_run, run_id, "aborted", "the run was cancelled")
            raise
        except BaseException:
            await asyncio.to_thread(store.finish_run, run_id, "error", "internal error")
            raise
        error = result.error
        await asyncio.to_thread(store.finish_run, run_id, result.status, None if error is None else error.message)
        disposition = "visible" if result.status == "ok" else "error"
        end: dict[str, Any] = {
            "phase": "end",
            "status": result.status,
            "terminalReply": {"disposition": disposition, "text": result.text},
        }
        if error is not None:
            end["error"] = error.to_dict()
        await turn.emit("lifecycle", end)
        return result


@dataclass
class _Turn:
    """The state of one running turn."""

    loop: AgentLoop
    run_id: str
    session_key: str
    agent_id: str
    chain: tuple[str, ...]
    system_prompt: str | None
    tool_names: list[str]
    on_event: EventHandler | None
    this_run_only: bool = False
    reasoning_effort: ReasoningEffort | None = None
    session_id: str = ""
    workspace: Path | None = None
    blind: bool = False
    last_text: str = ""
    _seq: int = 0
    _model_index: int = 0
    _messages: list[dict[str, Any]] = field(default_factory=list)

    async def emit(self, stream: EventStream, data: Mapping[str, Any]) -> None:
        if self.on_event is None:
            return
        self._seq += 1
        await self.on_event(AgentEvent(self.run_id, self.session_key, self.agent_id, self._seq, stream, data))

    async def _append(self, message: NewMessage) -> None:
        await asyncio.to_thread(self.loop._store.append, self.session_key, message)

    async def run(self, user_text: str) -> TurnResult:
        await self.emit("run_status", {"phase": "preparing_context"})
        await self.emit("lifecycle", {"phase": "start"})
        await self._append(NewMessage("user", user_text, run_id=self.run_id, idempotency_key=f"{self.run_id}:user"))
        history = await asyncio.to_thread(_load_transcript, self.loop._store, self.session_key)
        if self.this_run_only:
            history = [message for message in history if message.run_id == self.run_id]
        if self.system_prompt is not None:
            self._messages.append({"role": "system", "content": self.system_prompt})
        self._messages.extend(transcript_to_messages(history))
        tools = self.loop._registry.openai_tools(self.tool_names)
        allowed = frozenset(self.tool_names)
        await self.emit("run_status", {"phase": "starting_model"})
        for round_no in range(1, MAX_TOOL_ROUNDS + 1):
            completion, provider_id, model_id = await self._complete(tools, round_no)
            if completion.usage is not None:
                await self.emit("usage", {"outputTokens": completion.usage.completion_tokens})
            text = completion.content or ""
            self.last_text = text
            await self._append_assistant(completion, provider_id, model_id, round_no)
            if not completion.tool_calls:
                await self.emit("lifecycle", {"phase": "finishing"})
                return TurnResult("ok", text)
            if round_no == MAX_TOOL_ROUNDS:
                break
            for index, call in enumerate(completion.tool_calls):
                await self._run_tool(call, allowed, f"{self.run_id}:tool:{round_no}:{index}")
        raise _TurnFailed(
            TurnError("tool_rounds_exceeded", f"the model was still calling tools after {MAX_TOOL_ROUNDS} model calls"),
            self.last_text,
        )

    async def _complete(self, tools: list[dict[str, Any]], round_no: int) -> tuple[ChatCompletion, str, str]:
        config = self.loop._config
        last_error: LLMError | None = None
        for index in range(self._model_index, len(self.chain)):
            ref = self.chain[index]
            provider_id, _ = split_model_ref(ref)
            provider, model = config.resolve_model(ref)
            await self.emit(
                "lifecycle", {"phase": "model", "provider": provider_id, "model": model.id, "round": round_no}
            )
            client = await self.loop._client(provider_id, provider)
            text = ""
            try:
                async with client.stream_chat_completion(
                    model=model.id,
                    messages=self._messages,
                    tools=tools or None,
                    reasoning_effort=self.reasoning_effort,
                    # The model's configured output cap (maxTokens), as OpenClaw sends it.
                    extra=None if model.max_tokens is None else {"max_completion_tokens": model.max_tokens},
                ) as stream:
                    async for chunk in stream:
                        if chunk.content:
                            text += chunk.content
                            await self.emit("assistant", {"text": text, "delta": chunk.content})
                    completion = await stream.final_completion()
            except LLMError as exc:
                if text:
                    raise _TurnFailed(TurnError(exc.code, exc.message), text) from exc
                last_error = exc
                continue
            self._model_index = index
            return completion, provider_id, model.id
        assert last_error is not None  # the chain is never empty
        raise _TurnFailed(TurnError(last_error.code, last_error.message), self.last_text)

    async def _append_assistant(
        self, completion: ChatCompletion, provider_id: str, model_id: str, round_no: int
    ) -> None:
        blocks: list[dict[str, Any]] = []
        if completion.content:
            blocks.append({"type": "text", "text": completion.content})
        for call in completion.tool_calls:
            blocks.append({"type": "toolCall", "id": call.id, "name": call.name, "arguments": _call_arguments(call)})
        usage = completion.usage
        await self._append(
            NewMessage(
                "assistant",
                blocks,
                run_id=self.run_id,
                idempotency_key=f"{self.run_id}:assistant:{round_no}",
                provider=provider_id,
                model=model_id,
                usage=None
                if usage is None
                else {
                    "input": usage.prompt_tokens,
                    "output": usage.completion_tokens,
                    "totalTokens": usage.total_tokens,
                },
                stop_reason=None
                if completion.finish_reason is None
                else _STOP_REASONS.get(completion.finish_reason, completion.finish_reason),
            )
        )
        entry: dict[str, Any] = {"role": "assistant", "content": completion.content or ""}
        if completion.tool_calls:
            entry["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in completion.tool_calls
            ]
        self._messages.append(entry)

    async def _run_tool(self, call: ToolCall, allowed: frozenset[str], idempotency_key: str) -> None:
        arguments = _call_arguments(call)
        await self.emit("tool", {"phase": "start", "name": call.name, "toolCallId": call.id, "args": arguments})
        result, is_error = await self._call(call.name, arguments, allowed, call.id)
        await self.emit(
            "tool",
            {"phase": "result", "name": call.name, "toolCallId": call.id, "isError": is_error, "result": result},
        )
        block = {"type": "text", "text": result, "toolCallId": call.id, "toolName": call.name, "isError": is_error}
        await self._append(NewMessage("tool", [block], run_id=self.run_id, idempotency_key=idempotency_key))
        self._messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

    async def _call(
        self, name: str, arguments: dict[str, Any] | str, allowed: frozenset[str], tool_call_id: str
    ) -> tuple[str, bool]:
        """Run one tool call: ``(result text, is_error)``. A tool outside the effective set never runs."""
        tool = self.loop._registry.get(name) if name in allowed else None
        if tool is None:
            return f"error: the tool {json.dumps(name)} is not available", True
        if not isinstance(arguments, dict):
            return "error: the arguments are not a JSON object", True
        hooks = self.loop._hooks
        if hooks is None or not hooks.has_tool_hooks():
            return await self._invoke(tool, arguments, tool_call_id)
        # Imported here: the plugin runtime imports this module.
        from clawstack.gateway.plugins.tool_hooks import (
            AfterToolCallEvent,
            BeforeToolCallEvent,
            after_tool_call,
            before_tool_call,
        )

        ids = {"run_id": self.run_id, "tool_call_id": tool_call_id, "session_key": self.session_key}
        decision = await before_tool_call(
            hooks,
            BeforeToolCallEvent(tool_name=name, params=arguments, agent_id=self.agent_id, **ids),
            schema=tool.parameters,
            allowed_tools=allowed,
        )
        if decision.blocked:
            return f"error: {decision.reason}", True
        started = time.monotonic()
        text, is_error = await self._invoke(tool, decision.params, tool_call_id)
        await after_tool_call(
            hooks,
            AfterToolCallEvent(
                tool_name=name,
                params=decision.params,
                agent_id=self.agent_id,
                result=text,
                error=text if is_error else None,
                duration_ms=int((time.monotonic() - started) * 1000),
                **ids,
            ),
        )
        return text, is_error

    async def _invoke(self, tool: Tool, arguments: dict[str, Any], tool_call_id: str) -> tuple[str, bool]:
        """Run the tool's handler: ``(result text, is_error)``."""
        try:
            invocation = ToolInvocation(
                self.run_id,
                self.session_key,
                self.agent_id,
                tool_call_id,
                workspace=self.workspace,
                blind=self.blind,
                session_id=self.session_id,
                tools=tuple(self.tool_names),
                model=self.chain[self._model_index],
            )
            result: object = await tool.handler(arguments, invocation)
        except ToolError as exc:
            return f"error: {exc.message}", True
        except Exception as exc:
            return f"error: the tool failed ({type(exc).__name__})", True
        if not isinstance(result, str):
            return "error: the tool returned something other than text", True
        return result, False
