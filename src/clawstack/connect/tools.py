"""The seven MCP tools: names, descriptions, argument schemas and argument parsing.

``run_task`` and ``cancel_task`` are the tools that change anything; every other description begins
``READ ONLY:``. Arguments are
closed objects checked strictly (no coercion: ``"5000"`` is not a number); a missing or wrong-typed argument is a
:class:`~clawstack.connect.errors.ToolError` with code ``invalid_arguments`` naming the argument, never its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from clawstack.connect.errors import ToolError
from clawstack.connect.snapshots import Detail

DEFAULT_WAIT_MS: Final = 45_000
MIN_WAIT_MS: Final = 1_000
MAX_WAIT_MS: Final = 120_000
DEFAULT_SESSION_LIMIT: Final = 50
MAX_SESSION_LIMIT: Final = 200
MAX_TEXT_CHARS: Final = 200_000
READ_ONLY_PREFIX: Final = "READ ONLY: "

Text = Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
Name = Annotated[StrictStr, Field(min_length=1, max_length=256)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


class RunTaskArgs(_Args):
    task: Annotated[Text, Field(description="What the agent should do.")]
    agent: Annotated[Name | None, Field(description="The agent id from agents.json (default: the default agent).")] = (
        None
    )
    context: Annotated[StrictStr | None, Field(max_length=MAX_TEXT_CHARS, description="Background for the task.")] = (
        None
    )
    sessionKey: Annotated[
        Name | None,
        Field(
            description="Continue this conversation: a sessionKey run_task returned, or a short name of your own; "
            "omit to start a new one (a new key is minted)."
        ),
    ] = None
    senderName: Annotated[
        Name | None,
        Field(
            description="Who is asking, as the agent should see it. With a personal token the sender is the "
            "token's name instead; with the shared pass or no token it is shown as unverified."
        ),
    ] = None


class CheckTaskArgs(_Args):
    jobId: Name
    sessionKey: Name | None = None
    agent: Name | None = None
    knownLogCount: Annotated[StrictInt | None, Field(description="Log lines already seen; only newer ones return.")] = (
        None
    )
    mode: Annotated[Literal["wait", "poll"], Field(description="wait: until the task ends or waitMs passes.")] = "wait"
    waitMs: Annotated[
        StrictInt | StrictFloat | None, Field(description="How long wait mode waits (default 45000, 1000-120000).")
    ] = None


class GetTaskArgs(_Args):
    taskId: Name
    detail: Detail = "summary"


class ListTasksArgs(_Args):
    view: Literal["active", "all"] = "active"


class GetSessionArgs(_Args):
    sessionId: Name
    mode: Literal["snapshot", "events", "tail", "tasks"] = "snapshot"
    limit: Annotated[StrictInt | None, Field(description="Events to return (default 50, at most 200).")] = None
    after: Annotated[StrictInt | None, Field(description="Return events after this cursor (nextAfter).")] = None
    agent: Name | None = None


class ListSessionsArgs(_Args):
    pass


class CancelTaskArgs(_Args):
    jobId: Name
    stopAgentSession: Annotated[
        bool,
        Field(description="Also stop the attached agent session in its runtime (detach with stopRuntime: true)."),
    ] = False


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its name, description, argument model and whether it only reads."""

    name: str
    description: str
    args: type[_Args]
    read_only: bool

    def input_schema(self) -> dict[str, Any]:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        schema.setdefault("properties", {})
        return schema


TOOLS: Final[tuple[ToolSpec, ...]] = (
    ToolSpec(
        "run_task",
        "Start a task on an OpenClaw agent and return at once with its jobId and sessionKey (status: running). "
        "Follow it with check_task (nextAction says how). Pass sessionKey to continue a conversation; a session "
        "whose previous task is still running refuses a new one (session_busy).",
        RunTaskArgs,
        read_only=False,
    ),
    ToolSpec(
        "check_task",
        READ_ONLY_PREFIX + "Follow a task started with run_task. mode wait (default) waits until the task ends or "
        "waitMs passes (default 45000, clamped to 1000-120000); poll answers at once. Returns status, summary, "
        "new log lines since knownLogCount, and nextAction until the task is terminal.",
        CheckTaskArgs,
        read_only=True,
    ),
    ToolSpec(
        "get_task",
        READ_ONLY_PREFIX + "A task's snapshot at a detail level (core, summary, updates, artifacts, diagnostics, "
        "prompt, full); never waits.",
        GetTaskArgs,
        read_only=True,
    ),
    ToolSpec(
        "list_tasks",
        READ_ONLY_PREFIX + "Recent tasks (view active or all) with 500-character summary previews.",
        ListTasksArgs,
        read_only=True,
    ),
    ToolSpec(
        "get_session",
        READ_ONLY_PREFIX + "One conversation: its tasks and events (mode snapshot, events, tail or tasks; page "
        "events with after = nextAfter).",
        GetSessionArgs,
        read_only=True,
    ),
    ToolSpec(
        "list_sessions",
        READ_ONLY_PREFIX + "Conversations with their last task and summary, and the configured agents.",
        ListSessionsArgs,
        read_only=True,
    ),
    ToolSpec(
        "cancel_task",
        "Cancel a running task started with run_task: its gateway run is aborted and the task ends cancelled "
        "(terminalReason aborted). Cancelling it again answers the same; a task that already ended otherwise is "
        "refused (task_terminal). An attached agent session is stopped only with stopAgentSession: true.",
        CancelTaskArgs,
        read_only=False,
    ),
)
TOOLS_BY_NAME: Final[dict[str, ToolSpec]] = {spec.name: spec for spec in TOOLS}


def parse_arguments(name: str, arguments: object) -> _Args:
    """Validate a call's arguments; :class:`ToolError` (``unknown_tool``, ``invalid_arguments``) otherwise."""
    spec = TOOLS_BY_NAME.get(name)
    if spec is None:
        raise ToolError(f"no tool named {name[:64]!r}", code="unknown_tool")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be an object", field="")
    try:
        return spec.args.model_validate(arguments)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        kind = error["type"]
        if kind == "missing":
            problem = "is required"
        elif kind == "extra_forbidden":
            problem = "is not an argument of this tool"
        else:
            problem = str(error.get("msg", "is invalid")).lower()
        raise ToolError(f"{where}: {problem}", field=where) from None


def clamp_wait_ms(value: float | None) -> int:
    """``waitMs`` as used: the default for ``None`` or NaN, else clamped to 1000-120000."""
    if value is None or math.isnan(value):
        return DEFAULT_WAIT_MS
    return int(min(MAX_WAIT_MS, max(MIN_WAIT_MS, value)))


def clamp_limit(value: int | None) -> int:
    """``get_session``'s ``limit``: default 50, within 1-200."""
    return DEFAULT_SESSION_LIMIT if value is None else min(MAX_SESSION_LIMIT, max(1, value))


__all__ = [
    "DEFAULT_WAIT_MS",
    "MAX_WAIT_MS",
    "MIN_WAIT_MS",
    "READ_ONLY_PREFIX",
    "TOOLS",
    "CancelTaskArgs",
    "CheckTaskArgs",
    "GetSessionArgs",
    "GetTaskArgs",
    "ListSessionsArgs",
    "ListTasksArgs",
    "RunTaskArgs",
    "ToolSpec",
    "clamp_limit",
    "clamp_wait_ms",
    "parse_arguments",
]
