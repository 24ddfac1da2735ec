"""The example plugin: a ``/hello`` command that asks the ``main`` agent for a one-line greeting.

Load it by listing ``examples/plugins`` in ``plugins.load.paths``. The command uses
``api.runtime.subagent.complete`` (tool-free, no session) and answers with the model's text, or with a short
explanation when this gateway runs no completions or the completion fails.
"""

from __future__ import annotations

from clawstack.gateway.plugins import CommandContext, PluginApi, SubagentError

__all__ = ["register"]


def register(api: PluginApi) -> None:
    """Register ``/hello [name]``."""
    capabilities = api.runtime.capabilities
    uses_complete = "subagent.complete" in capabilities

    async def hello(ctx: CommandContext) -> str:
        if not uses_complete:
            return "Hello! (This gateway runs no subagent completions.)"
        name = ctx.args.strip() or "there"
        try:
            result = await api.runtime.subagent.complete(
                "main",
                f"Write a one-line greeting for this person:\n{name}",
                extra_system_prompt="Answer with the greeting only.",
                timeout_ms=10_000,
            )
        except SubagentError as exc:
            api.logger.warning("greeting failed: %s", exc.code)
            return f"Hello, {name}! (The model is unavailable: {exc.code}.)"
        return result.text

    api.register_command(
        "hello",
        hello,
        description="Greet someone with a line written by the main agent",
        accepts_args=True,
    )
    api.logger.info("hello plugin registered (code identity %s)", api.code_identity)
