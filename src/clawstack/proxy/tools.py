"""Managed tools in the proxy: the services it dispatches to and the catalog it offers models from.

Descriptors (their format, names and parsing) are :mod:`clawstack.models.descriptors`, shared with the pod compiler;
:func:`parse_descriptor` here raises the proxy's :class:`~clawstack.proxy.errors.ToolError` instead. Dispatching a
call is :mod:`clawstack.proxy.tool_dispatch`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from yarl import URL

from clawstack.models import descriptors
from clawstack.models.descriptors import (
    DESCRIPTOR_INVALID,
    ENV_NAME,
    FUNCTION_SEPARATOR,
    MAX_DESCRIPTOR_BYTES,
    MAX_FUNCTION_NAME,
    MAX_TOOLS_PER_SERVICE,
    SERVICE_NAME,
    TOOL_NAME,
    ServiceDescriptor,
    ToolSpec,
    function_name_for,
    qualified_name_for,
)
from clawstack.proxy.errors import ToolError

_BEARER_RE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: nothing that could split a header


def parse_descriptor(service: str, data: bytes | Mapping[str, Any]) -> ServiceDescriptor:
    """:func:`clawstack.models.descriptors.parse_descriptor`, raising :class:`ToolError`."""
    try:
        return descriptors.parse_descriptor(service, data)
    except descriptors.DescriptorError as exc:
        raise ToolError(exc.message, code=exc.code) from exc


@dataclass(frozen=True, slots=True)
class ToolService:
    """A tool service as the proxy reaches it: its descriptor, its base URL and its resolved bearer.

    ``bearer`` is resolved by the caller from the proxy's own configuration (the variable
    ``descriptor.auth_env`` names); it is required exactly when the descriptor declares auth, must be visible
    ASCII, and never appears in ``repr``. ``base_url`` is an absolute ``http``/``https`` URL without
    credentials, query or fragment; tool paths are appended to it.
    """

    descriptor: ServiceDescriptor
    base_url: str
    bearer: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        service = self.descriptor.service
        if self.descriptor.auth_env is not None:
            if self.bearer is None or not self.bearer.strip():
                raise ValueError(
                    f"tool service {service!r} needs the bearer named by {self.descriptor.auth_env}, "
                    "and it is missing or blank"
                )
            if not _BEARER_RE.fullmatch(self.bearer):
                raise ValueError(f"the bearer for tool service {service!r} holds characters a header cannot carry")
        elif self.bearer is not None:
            raise ValueError(f"tool service {service!r} declares no auth, so it takes no bearer")
        try:
            url = URL(self.base_url)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the base URL of tool service {service!r} is not a URL") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the base URL of tool service {service!r} must be an absolute http(s) URL")
        if url.user is not None or url.password is not None or url.query_string or url.fragment:
            raise ValueError(
                f"the base URL of tool service {service!r} may not carry credentials, a query or a fragment"
            )
        object.__setattr__(self, "base_url", str(url).rstrip("/"))

    @property
    def service(self) -> str:
        """The service's name."""
        return self.descriptor.service


class ToolCatalog:
    """Every managed tool the proxy knows, looked up by qualified name or by function name.

    Built once from the configured services (names must be unique); never changes afterwards, so it can be
    shared by every request.
    """

    def __init__(self, services: Iterable[ToolService]) -> None:
        self._services: dict[str, ToolService] = {}
        self._by_qualified: dict[str, ToolSpec] = {}
        self._by_function: dict[str, ToolSpec] = {}
        for service in services:
            if service.service in self._services:
                raise ValueError(f"tool service {service.service!r} is configured twice")
            self._services[service.service] = service
            for spec in service.descriptor.tools:
                if spec.service != service.service or spec.qualified in self._by_qualified:
                    raise ValueError(f"tool {spec.qualified} does not belong in service {service.service!r} once")
                self._by_qualified[spec.qualified] = spec
                self._by_function[spec.function_name] = spec

    def __len__(self) -> int:
        return len(self._by_qualified)

    def service(self, name: str) -> ToolService | None:
        """The configured service called ``name``, or ``None``."""
        return self._services.get(name)

    def get(self, qualified: str) -> ToolSpec | None:
        """The tool whose qualified name (``service.tool``) is ``qualified``, or ``None``."""
        return self._by_qualified.get(qualified)

    def by_function_name(self, function_name: str) -> ToolSpec | None:
        """The tool the model calls ``function_name`` (``service__tool``), or ``None``."""
        return self._by_function.get(function_name)

    def is_managed_name(self, function_name: str) -> bool:
        """Whether ``function_name`` lies in the managed namespace: ``<service>__…`` for a known service.

        True whether or not such a tool exists or is allowed, so that a call to a known-but-not-allowed (or
        invented) tool of a managed service is recognised as managed and refused, never passed on.
        """
        service, separator, _ = function_name.partition(FUNCTION_SEPARATOR)
        return bool(separator) and service in self._services

    def openai_tools(self, allowlist: Iterable[str]) -> list[dict[str, Any]]:
        """The OpenAI function tools for the allowlisted tools that exist, sorted by qualified name.

        Allowlist entries naming no known tool are skipped (see :meth:`unknown`). Each dict is a fresh copy.
        """
        allowed = {name: self._by_qualified[name] for name in allowlist if name in self._by_qualified}
        return [allowed[name].openai_tool() for name in sorted(allowed)]

    def unknown(self, names: Iterable[str]) -> list[str]:
        """The entries of ``names`` that name no known tool, in order, each once."""
        missing: dict[str, None] = {}
        for name in names:
            if name not in self._by_qualified:
                missing.setdefault(name)
        return list(missing)


__all__ = [
    "DESCRIPTOR_INVALID",
    "ENV_NAME",
    "FUNCTION_SEPARATOR",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_FUNCTION_NAME",
    "MAX_TOOLS_PER_SERVICE",
    "SERVICE_NAME",
    "TOOL_NAME",
    "ServiceDescriptor",
    "ToolCatalog",
    "ToolService",
    "ToolSpec",
    "function_name_for",
    "parse_descriptor",
    "qualified_name_for",
]
