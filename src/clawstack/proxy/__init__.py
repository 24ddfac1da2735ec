"""The model proxy: per-run identities, the durable revocation fence, model chains, managed tools, the journal.

Run it with ``claw proxy serve``; drive it with :class:`ProxyOperatorClient`. See docs/proxy.md.
"""

from clawstack.proxy.client import ProxyOperatorClient, SelfTestReport
from clawstack.proxy.config import ProxyConfig, load_config, parse_config
from clawstack.proxy.errors import (
    AuthError,
    CapacityError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    JournalError,
    NotFoundError,
    ProxyError,
    RequestError,
    RevocationError,
    ToolError,
    UpstreamError,
)
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.server import ProxyServer
from clawstack.proxy.service import ProxyService

__all__ = [
    "AuthError",
    "CapacityError",
    "ChainEntry",
    "ConfigError",
    "ConflictError",
    "ForbiddenError",
    "JournalError",
    "NotFoundError",
    "ProxyConfig",
    "ProxyError",
    "ProxyOperatorClient",
    "ProxyServer",
    "ProxyService",
    "RequestError",
    "RevocationError",
    "SelfTestReport",
    "ToolError",
    "UpstreamError",
    "load_config",
    "parse_config",
]
