"""OpenClaw keys that ``claw gateway serve`` accepts without acting on, and those it refuses as not supported.

An OpenClaw config carries keys that mean nothing to clawstack. Those that govern no security, limit, tool, agent
or plugin are *ignored*: accepted so the file loads, and named by :attr:`GatewayConfig.ignored_keys
<clawstack.gateway.config.GatewayConfig.ignored_keys>` so start-up can say so (:data:`IGNORED_KEY_REASONS` says
why each one has no effect). Some are dropped before validation with whatever they hold (:data:`DROPPED_KEYS`);
the others are validated and inert (:data:`INERT_KEYS`, patterns where ``*`` is any object key and ``[]`` any list
item).

Every other OpenClaw key that clawstack does not implement is refused with "not supported by claw gateway" and
its key path (:func:`unsupported`), rather than the bare "unknown key" a typo gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "DROPPED_KEYS",
    "IGNORED_KEYS",
    "IGNORED_KEY_REASONS",
    "INERT_KEYS",
    "REFUSED_UNDER_DROPPED",
    "UNSUPPORTED_MESSAGE",
    "unsupported",
]

#: Dropped before validation, whatever they hold: dotted key → why it has no effect here.
_DROPPED: dict[str, str] = {
    "$schema": "an editor's schema hint",
    "meta": "OpenClaw's record of the version that last wrote the file",
    "wizard": "OpenClaw's onboarding record",
    "update": "claw gateway does not update itself",
    "logging": "claw gateway logs to stderr at --log-level",
    "telemetry": "claw gateway sends no telemetry",
    "discovery": "claw gateway does not advertise itself",
    "gateway.tailscale": "claw gateway does not manage Tailscale",
    "models.mode": 'only the configured providers exist (OpenClaw\'s "replace")',
    "models.catalogRefresh": "there is no built-in model catalog to refresh",
}

#: Validated, then without effect: key pattern → why.
_INERT: dict[str, str] = {
    "models.providers.*.models[].reasoning": "reasoning effort is sent when a run asks for it, whatever this says",
    "models.providers.*.models[].input": "claw gateway sends text only",
    "models.providers.*.models[].cost": "usage is reported in tokens, not priced",
}

DROPPED_KEYS: tuple[str, ...] = tuple(_DROPPED)
INERT_KEYS: tuple[str, ...] = tuple(_INERT)
#: Every ignored key (dropped or inert), as written in the docs.
IGNORED_KEYS: tuple[str, ...] = (*DROPPED_KEYS, *INERT_KEYS)
IGNORED_KEY_REASONS: Mapping[str, str] = MappingProxyType({**_DROPPED, **_INERT})

#: Keys under a dropped key that would govern security: refused instead of dropped with their parent.
REFUSED_UNDER_DROPPED: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"logging": ("audit", "redactPatterns")}  # an audit ledger and transcript redaction: neither exists here
)

UNSUPPORTED_MESSAGE = "not supported by claw gateway"

_TOP_LEVEL = frozenset(
    [
        "env",
        "diagnostics",
        "browser",
        "ui",
        "secrets",
        "auth",
        "accessGroups",
        "acp",
        "nodeHost",
        "worktreeRoot",
        "worktreeAcceleration",
        "security",
        "bindings",
        "broadcast",
        "attachments",
        "messages",
        "tts",
        "commands",
        "approvals",
        "session",
        "transcripts",
        "talk",
        "cloudWorkers",
        "desktop",
        "memory",
        "mcp",
        "skills",
    ]
)
_AGENT_DEFAULTS = frozenset(
    [
        "params",
        "modelSelectionScope",
        "utilityModel",
        "decisionModel",
        "imageModel",
        "mediaModels",
        "voiceModel",
        "pdfModel",
        "pdfMaxMb",
        "pdfMaxPages",
        "models",
        "modelPolicy",
        "cwd",
        "skills",
        "silentReply",
        "repoRoot",
        "contextInjection",
        "experimental",
        "userTimezone",
        "startupContext",
        "contextPruning",
        "compaction",
        "embeddedAgent",
        "thinkingDefault",
        "fastModeDefault",
        "verboseDefault",
        "toolProgressDetail",
        "reasoningDefault",
        "elevatedDefault",
        "blockStreamingDefault",
        "blockStreamingBreak",
        "mediaMaxMb",
        "imageMaxDimensionPx",
        "imageQuality",
        "typingIntervalSeconds",
        "authInheritance",
        "sessionStore",
        "contextLimits",
        "blockStreamingChunk",
        "blockStreamingCoalesce",
        "humanDelay",
        "typingMode",
        "heartbeat",
        "sandbox",
    ]
)
_DEFAULT_SUBAGENTS = frozenset(["delegationMode", "model", "thinking", "announceTimeoutMs", "requireAgentId"])
_AGENT_ENTRY = frozenset(
    [
        "cwd",
        "agentDir",
        "utilityModel",
        "decisionModel",
        "models",
        "modelPolicy",
        "thinkingDefault",
        "verboseDefault",
        "toolProgressDetail",
        "reasoningDefault",
        "fastModeDefault",
        "contextInjection",
        "experimental",
        "skills",
        "embeddedAgent",
        "params",
        "runtime",
        "memory",
        "humanDelay",
        "typingMode",
        "tts",
        "skillsLimits",
        "contextLimits",
        "heartbeat",
        "groupChat",
        "sandbox",
    ]
)
_ENTRY_SUBAGENTS = frozenset(["delegationMode", "model", "thinking", "requireAgentId"])


def unsupported(loc: tuple[str | int, ...]) -> bool:
    """Whether an unknown key at ``loc`` is an OpenClaw key that clawstack does not implement."""
    if not loc:
        return False  # the error is about the document itself
    *parent, key = loc
    if not isinstance(key, str):
        return False
    match parent:
        case []:
            return key in _TOP_LEVEL
        case ["agents", "defaults"]:
            return key in _AGENT_DEFAULTS
        case ["agents", "defaults", "subagents"]:
            return key in _DEFAULT_SUBAGENTS
        case ["agents", "entries", str()] | ["agents", "list", int()]:
            return key in _AGENT_ENTRY
        case ["agents", "entries", str(), "subagents"] | ["agents", "list", int(), "subagents"]:
            return key in _ENTRY_SUBAGENTS
    return False
