"""Who calls ClawConnect: every tool call, MCP session, job, gateway session and attachment has one caller.

A :class:`Caller` is one of four kinds, and :attr:`Caller.key` is the identity stored as a record's owner:

=============== ================== ======================================================================
kind            key                who
=============== ================== ======================================================================
``user``        ``user:<name>``    the owner of a personal token (``MCP_USER_TOKENS``, ``MCP_USER_TOKENS_FILE``)
``public``      ``public``         anyone holding the shared pass (``PUBLIC_MCP_PASS``): one caller of its own
``anonymous``   ``anonymous``      anyone reaching an HTTP endpoint that has no token configured
``operator``    ``operator``       the one local user of ``claw connect mcp`` (stdio): the gateway's operator
=============== ================== ======================================================================

A user key always has the ``user:`` prefix, so no token name can take another kind's key; the name ``public`` is
refused for personal tokens outright (:mod:`clawstack.connect.auth`), so that it cannot pose as the shared pass
in what the agent reads either. Only a ``user`` is **identified**: its name is who it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

CallerKind = Literal["user", "public", "anonymous", "operator"]
USER_PREFIX: Final = "user:"


@dataclass(frozen=True, slots=True)
class Caller:
    """One caller; ``name`` is set for a ``user`` (the token's owner) and only for one."""

    kind: CallerKind
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.kind == "user") != bool(self.name):
            raise ValueError("a user caller has a name, and only a user caller has one")

    @classmethod
    def user(cls, name: str) -> Caller:
        return cls("user", name)

    @property
    def key(self) -> str:
        """The owner identity stored on every record this caller creates."""
        return USER_PREFIX + self.name if self.kind == "user" and self.name else self.kind

    @property
    def identified(self) -> bool:
        """Whether the caller's name is who it is (a personal token's owner)."""
        return self.kind == "user"

    @property
    def is_operator(self) -> bool:
        """Whether this is the local operator (stdio), whose own gateway sessions stay usable by their keys."""
        return self.kind == "operator"


OPERATOR: Final = Caller("operator")
"""The one local user of the stdio server."""
ANONYMOUS: Final = Caller("anonymous")
"""Anyone reaching an HTTP endpoint without tokens: one caller, confined like any other."""
PUBLIC: Final = Caller("public")
"""The holders of the shared pass: one caller of its own."""


__all__ = ["ANONYMOUS", "OPERATOR", "PUBLIC", "USER_PREFIX", "Caller", "CallerKind"]
