"""The model proxy: per-run identities, the durable revocation fence, model chains, managed tools, the journal.

Run it with ``claw proxy serve``; drive it with :class:`ProxyOperatorClient`. See docs/proxy.md.
"""

import importlib

_EXPORTS: dict[str, str] = {
    "AuthError": "clawstack.proxy.errors",
    "CapacityError": "clawstack.proxy.errors",
    "ChainEntry": "clawstack.proxy.identities",
    "ConfigError": "clawstack.proxy.errors",
    "ConflictError": "clawstack.proxy.errors",
    "ForbiddenError": "clawstack.proxy.errors",
    "JournalError": "clawstack.proxy.errors",
    "NotFoundError": "clawstack.proxy.errors",
    "ProxyConfig": "clawstack.proxy.config",
    "ProxyError": "clawstack.proxy.errors",
    "ProxyOperatorClient": "clawstack.proxy.client",
    "ProxyServer": "clawstack.proxy.server",
    "ProxyService": "clawstack.proxy.service",
    "RequestError": "clawstack.proxy.errors",
    "RevocationError": "clawstack.proxy.errors",
    "SelfTestReport": "clawstack.proxy.client",
    "ToolError": "clawstack.proxy.errors",
    "UpstreamError": "clawstack.proxy.errors",
    "load_config": "clawstack.proxy.config",
    "parse_config": "clawstack.proxy.config",
}


def __getattr__(name: str) -> object:
    """Exports load on first use, so that ``claw proxy serve`` imports only what serving needs."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
