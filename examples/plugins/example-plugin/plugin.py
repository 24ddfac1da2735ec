"""An example plugin that uses every part of the plugin runtime; each command shows one.

* ``/summarize TEXT``: ``api.runtime.subagent.complete`` with a model override inside the plugin's policy.
* ``/research QUESTION``: ``subagent.run`` on a session of its own with the plugin's tool (``tools_also_allow``)
  and the minimal prompt, ``wait_for_run``, ``get_session_messages``, then ``delete_session``.
* ``/background TASK``: ``subagent.run`` with ``deliver=True``; answers at once, and the child's answer is
  announced on the agent's main session when it is done.
* ``/mail TEXT``: ``api.runtime.hooks.dispatch_hook_agent_turn`` for a (pretend) e-mail, wrapped as untrusted
  external content; needs ``trust: "trusted"`` or ``"bundled"``.
* ``/remember TEXT`` and ``/recall``: ``api.store``, the plugin's durable key-value space (it survives a
  gateway restart and a plugin reload).
* ``/review CHANGE``, ``/trial TASK``, ``/reviews``: command-scoped native children
  (``ctx.runtime_context.subagents``). ``/review`` spawns a child with the plugin's ``reviewer`` subagent profile
  (instructions from ``agents/reviewer.md``, no write tools, a JSON output schema the collector enforces) and
  reports its findings; ``/trial`` runs a blind child (its prompt does not say which model or where it runs);
  ``/reviews`` recovers this session's children through ``list``.
* A ``before_dispatch`` hook: a chat message starting ``delegate:`` is handed to a tool-less subagent whose
  answer is delivered back to the requester with ``completion_delivery="current-requester"``.
* A ``before_tool_call`` hook on its own tool: trims the note and refuses one longer than
  ``plugins.entries["example-plugin"].config.noteLimit`` characters (``api.plugin_config``, default 500); an
  ``after_tool_call`` hook logs how long each note took.

Enable it with ``plugins.entries["example-plugin"]`` (see ``examples/gateway/gateway.json5``).
"""

from __future__ import annotations

import uuid
from typing import Any

from clawstack.gateway.plugins import (
    AfterToolCallEvent,
    BeforeToolCallEvent,
    BeforeToolCallResult,
    CommandContext,
    DispatchContext,
    PluginApi,
    PluginStoreError,
    SubagentError,
)

__all__ = ["register"]

AGENT = "main"
SMALL_MODEL = "fake/scripted-small"
MEMORY_KEY = "memory"


def register(api: PluginApi) -> None:
    """Register the plugin's tool, commands and hooks."""
    notes: list[str] = []
    limit = api.plugin_config.get("noteLimit")
    note_limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else 500

    async def take_note(arguments: dict[str, Any]) -> str:
        notes.append(str(arguments.get("text", "")))
        return f"noted ({len(notes)} so far)"

    api.register_tool(
        "example_take_note",
        take_note,
        description="Write down one finding while researching.",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    )

    async def summarize(ctx: CommandContext) -> str:
        try:
            result = await api.runtime.subagent.complete(
                AGENT,
                ctx.args or "(nothing to summarize)",
                extra_system_prompt="Summarize the user's text in one sentence.",
                model=SMALL_MODEL,
                timeout_ms=20_000,
            )
        except SubagentError as exc:
            return f"Summary unavailable ({exc.code})."
        return result.text

    async def research(ctx: CommandContext) -> str:
        subagent = api.runtime.subagent
        session_key = f"agent:{AGENT}:subagent:research-{uuid.uuid4()}"
        try:
            accepted = await subagent.run(
                session_key=session_key,
                message=ctx.args or "(no question)",
                tools_also_allow=["example_take_note"],
                prompt_mode="minimal",
            )
            result = await subagent.wait_for_run(accepted.run_id, timeout_ms=30_000)
            if result.status == "pending":
                return f"Research is still running (run {accepted.run_id})."
            transcript = await subagent.get_session_messages(accepted.session_key, limit=50)
            await subagent.delete_session(accepted.session_key)
        except SubagentError as exc:
            return f"Research failed to start ({exc.code})."
        if result.status != "ok":
            return f"Research ended {result.status}: {result.error or result.stop_reason}."
        return f"{result.terminal_reply} ({transcript.total} messages, {len(notes)} notes)"

    async def background(ctx: CommandContext) -> str:
        try:
            accepted = await api.runtime.subagent.run(
                session_key=f"agent:{AGENT}:subagent:background-{uuid.uuid4()}",
                message=ctx.args or "(no task)",
                disable_tools=True,
                deliver=True,
            )
        except SubagentError as exc:
            return f"Could not start the task ({exc.code})."
        return f"Started in the background as run {accepted.run_id}; its answer will be announced here."

    async def mail(ctx: CommandContext) -> str:
        result = await api.runtime.hooks.dispatch_hook_agent_turn(
            name="Example inbox",
            agent_id=AGENT,
            session_key=f"hook:example-mail:{uuid.uuid4()}",
            message=ctx.args or "(empty e-mail)",
            external_content_source="email",
            deliver=True,
            idempotency_key=None,
        )
        if not result.ok:
            return f"The e-mail turn was refused: {result.reason}"
        return f"The e-mail is being handled as run {result.run_id}."

    async def remember(ctx: CommandContext) -> str:
        try:
            memory = await api.store.get(MEMORY_KEY, default=[])
            memory.append(ctx.args or "(nothing)")
            await api.store.set(MEMORY_KEY, memory[-20:])
        except PluginStoreError as exc:
            return f"Could not remember that ({exc.code})."
        return f"Remembered ({len(memory[-20:])} items kept)."

    async def recall(ctx: CommandContext) -> str:
        try:
            memory = await api.store.get(MEMORY_KEY, default=[])
        except PluginStoreError as exc:
            return f"Could not recall ({exc.code})."
        return "; ".join(memory) if memory else "Nothing remembered yet."

    async def review(ctx: CommandContext) -> str:
        native = ctx.runtime_context.subagents
        if native is None:
            return "Native review is unavailable for this request."
        child = await native.spawn(task=ctx.args or "Review the latest change.", profile="reviewer")
        collected = await native.collect(ids=[child["run_id"]], timeout_seconds=30)
        if collected["pending"]:
            return f"Review {child['run_id']} is still running; /reviews shows it."
        result = collected["results"][0]
        if result["status"] != "done":
            return f"Review {result['status']}: {result['error']}"
        findings = result["structured_output"]["findings"]
        return "Findings: " + "; ".join(findings) if findings else "No findings."

    async def trial(ctx: CommandContext) -> str:
        native = ctx.runtime_context.subagents
        if native is None or "native-subagent-blind-v1" not in api.runtime.capabilities:
            return "A blind trial is unavailable for this request."
        child = await native.spawn(task=ctx.args or "Solve the frozen task.", context="isolated", blind=True)
        collected = await native.collect(ids=[child["run_id"]], await_results=True)
        return str(collected["results"][0]["result"])

    async def reviews(ctx: CommandContext) -> str:
        native = ctx.runtime_context.subagents
        if native is None:
            return "Native reviews are unavailable for this request."
        children = await native.list()
        if not children:
            return "No native children in this session."
        return "; ".join(f"{child['run_id']} {child['status']}" for child in children)

    async def check_note(event: BeforeToolCallEvent) -> BeforeToolCallResult | None:
        text = str(event.params.get("text", "")).strip()
        if len(text) > note_limit:
            return BeforeToolCallResult(block=True, block_reason=f"a note may have at most {note_limit} characters")
        return BeforeToolCallResult(params={"text": text})

    async def log_note(event: AfterToolCallEvent) -> None:
        api.logger.info("note tool ended in %s ms (error: %s)", event.duration_ms, event.error is not None)

    async def delegate(ctx: DispatchContext) -> str | None:
        if not ctx.message.startswith("delegate:"):
            return None
        try:
            await ctx.subagent.run(
                session_key=f"agent:{ctx.agent_id}:subagent:delegate-{uuid.uuid4()}",
                message=ctx.message.removeprefix("delegate:").strip() or "(no task)",
                disable_tools=True,
                completion_delivery="current-requester",
            )
        except SubagentError as exc:
            return f"Could not delegate ({exc.code})."
        return "Delegated to a subagent; its answer will follow in this conversation."

    api.register_command("summarize", summarize, description="Summarize text", accepts_args=True)
    api.register_command("research", research, description="Research a question", accepts_args=True)
    api.register_command("background", background, description="Run a task in the background", accepts_args=True)
    api.register_command("mail", mail, description="Handle an e-mail as a hook turn", accepts_args=True)
    api.register_command("remember", remember, description="Remember a line", accepts_args=True)
    api.register_command("recall", recall, description="Recall what was remembered")
    native = {"accepts_args": True, "runtime_capabilities": ["subagents"]}
    api.register_command("review", review, description="Review a change with the reviewer profile", **native)
    api.register_command("trial", trial, description="Run a blind trial", **native)
    api.register_command("reviews", reviews, description="List this session's native children", **native)
    if api.agent is not None and api.agent.register_subagent_profile is not None:
        api.agent.register_subagent_profile(
            id="reviewer",
            description="Review a change without editing files",
            instructions_file="agents/reviewer.md",
            tools={"deny": ["write", "edit", "exec"]},
            output_schema={
                "type": "object",
                "properties": {"findings": {"type": "array", "items": {"type": "string"}}},
                "required": ["findings"],
                "additionalProperties": False,
            },
        )
    api.register_hook("before_dispatch", delegate)
    api.register_hook("before_tool_call", check_note, matcher=["example_take_note"])
    api.register_hook("after_tool_call", log_note, matcher=["example_take_note"])
    api.logger.info("example plugin registered (code identity %s)", api.code_identity)
