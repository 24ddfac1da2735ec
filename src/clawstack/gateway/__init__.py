"""The agent gateway (``claw gateway serve``): its config, sessions, lanes, agent loop and protocol server.

Sessions, their keys and transcripts are :mod:`clawstack.gateway.sessions` and :mod:`clawstack.gateway.keys`.
The config (:mod:`clawstack.gateway.config`) is one JSON5 file with OpenClaw's key names, loaded by
:func:`load_config`; every error this package raises is a :class:`GatewayError` (see
:mod:`clawstack.gateway.errors`).
"""

from clawstack.gateway.agent import AgentEvent, AgentLoop, TurnResult
from clawstack.gateway.config import GatewayConfig, load_config, parse_config
from clawstack.gateway.errors import (
    ConfigProblem,
    GatewayConfigError,
    GatewayConfigSyntaxError,
    GatewayConfigUnreadableError,
    GatewayError,
)
from clawstack.gateway.keys import SessionKey, SessionKeyError, normalize_agent_id, parse_session_key
from clawstack.gateway.lanes import LaneError, Lanes
from clawstack.gateway.runner import GatewayRuns
from clawstack.gateway.server import GatewayServer
from clawstack.gateway.sessions import SessionError, SessionStore
from clawstack.gateway.tools import Tool, ToolPolicy, ToolRegistry

__all__ = [
    "AgentEvent",
    "AgentLoop",
    "ConfigProblem",
    "GatewayConfig",
    "GatewayConfigError",
    "GatewayConfigSyntaxError",
    "GatewayConfigUnreadableError",
    "GatewayError",
    "GatewayRuns",
    "GatewayServer",
    "LaneError",
    "Lanes",
    "SessionError",
    "SessionKey",
    "SessionKeyError",
    "SessionStore",
    "Tool",
    "ToolPolicy",
    "ToolRegistry",
    "TurnResult",
    "load_config",
    "normalize_agent_id",
    "parse_config",
    "parse_session_key",
]
