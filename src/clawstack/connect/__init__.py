"""ClawConnect: an MCP server that lets MCP clients run tasks on a gateway and follow them to their end.

``claw connect mcp`` serves it over stdio and ``claw connect http`` over Streamable HTTP; both serve the tools of
:class:`ConnectService` through :func:`create_mcp_server`. Agents come from ``agents.json`` (:func:`load_agents`);
jobs live in a durable SQLite :class:`JobStore`; :class:`GatewayClient` speaks the gateway WebSocket protocol (this
package never imports :mod:`clawstack.gateway`). Every error is a :class:`ConnectError` (see
:mod:`clawstack.connect.errors`). The opt-in seam that attaches a task to a managed agent session in a runtime
someone else owns is :mod:`clawstack.connect.agent_session`. docs/connect.md describes the tools and their fields.
"""

from clawstack.connect.agents import Agent, AgentRegistry, load_agents, parse_agents
from clawstack.connect.auth import AuthConfigError, TokenAuth, parse_user_tokens
from clawstack.connect.callers import ANONYMOUS, OPERATOR, PUBLIC, Caller
from clawstack.connect.errors import (
    AgentsConfigError,
    ConnectError,
    GatewayError,
    GatewayRequestError,
    GatewayTimeoutError,
    GatewayTransportError,
    HandshakeError,
    JobStoreError,
    SessionBusyError,
    ToolError,
)
from clawstack.connect.follow import Outcome, RunFollower
from clawstack.connect.gateway_client import ConnectionState, GatewayClient, RunEvent, RunWatch
from clawstack.connect.http import AuthGuard, HttpServer, create_app
from clawstack.connect.jobs import Job, JobStore, LogEntry
from clawstack.connect.mcp_sessions import McpSessionSettings
from clawstack.connect.server import create_mcp_server, serve_stdio, tool_definitions
from clawstack.connect.service import ConnectService
from clawstack.connect.tools import TOOLS, ToolSpec

__all__ = [
    "ANONYMOUS",
    "OPERATOR",
    "PUBLIC",
    "TOOLS",
    "Agent",
    "AgentRegistry",
    "AgentsConfigError",
    "AuthConfigError",
    "AuthGuard",
    "Caller",
    "ConnectError",
    "ConnectService",
    "ConnectionState",
    "GatewayClient",
    "GatewayError",
    "GatewayRequestError",
    "GatewayTimeoutError",
    "GatewayTransportError",
    "HandshakeError",
    "HttpServer",
    "Job",
    "JobStore",
    "JobStoreError",
    "LogEntry",
    "McpSessionSettings",
    "Outcome",
    "RunEvent",
    "RunFollower",
    "RunWatch",
    "SessionBusyError",
    "TokenAuth",
    "ToolError",
    "ToolSpec",
    "create_app",
    "create_mcp_server",
    "load_agents",
    "parse_agents",
    "parse_user_tokens",
    "serve_stdio",
    "tool_definitions",
]
