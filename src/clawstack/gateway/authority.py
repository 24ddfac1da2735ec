"""Live operator authority: who holds which operator role now, which channel identities are theirs, who may use a
channel, and the work retained under a requester's authority, which loses it when any of that changes.

:class:`OperatorAuthority` holds the operators (config ``operators[]``: ``name``, ``roles`` ⊆ ``operator.admin``,
``operator.write``, ``operator.read``, and ``links[]`` of channel identities) and each channel's ``allowFrom``. It
is replaced whole by :meth:`~OperatorAuthority.update` (a config reload) or changed one operator at a time by
:meth:`~OperatorAuthority.set_roles`, :meth:`~OperatorAuthority.link` and :meth:`~OperatorAuthority.unlink` (admin
requests). What it answers, always about *now*:

* :meth:`~OperatorAuthority.operator_for`: the operator a channel sender acts as. A sender carries operator
  authority only when it passes the channel's ``allowFrom`` (``"*"`` lets everyone) *and* a channel identity link
  ties it to an operator whose roles hold ``operator.admin`` (channel-owner authority); otherwise ``None``.
* :meth:`~OperatorAuthority.authorizes`: whether a requester holds an operator scope. ``operator.admin``
  satisfies every scope and ``operator.write`` satisfies ``operator.read``. The Gateway operator (a Gateway chat
  client authenticated with the gateway's own token or password) holds its connection's scopes, which no operator
  change affects; a named operator holds its roles; a channel sender holds every scope through channel-owner
  authority, else none.
* :meth:`~OperatorAuthority.capture` and :meth:`~OperatorAuthority.check`: an :class:`AuthorityAssertion` records
  who asked and the operator authority that let them; ``check`` raises :class:`AuthorityRevokedError`, naming what
  changed, once a change has taken that authority away. Only assertions this object issued are accepted.

**Retained work.** Work admitted under an assertion (a queued or running subagent run) is registered with
:meth:`~OperatorAuthority.retain` under an id and dropped with :meth:`~OperatorAuthority.release` when it ends.
Every change re-tests each live assertion: one that no longer holds is marked revoked, and every subscriber
(:meth:`~OperatorAuthority.subscribe`) is called once with the :class:`Revocation` of each newly revoked piece of
work, so that queued work can fail at once with a visible error; running work refuses at its next admission check
(:meth:`~OperatorAuthority.check_retained`). Revocation is final: every change re-tests every live assertion, and
one it found no longer holding stays revoked, so restoring the role or the link later gives neither the assertion
nor the work retained under it its authority back; a fresh request is needed.

Errors::

    GatewayError                          (clawstack.gateway.errors)
     └── AuthorityError                   authority_error
          ├── AuthorityRevokedError       requester_authority_revoked   the requester no longer holds that authority
          ├── AuthorityAssertionError     authority_assertion_invalid   not an assertion this authority issued
          ├── OperatorsInvalidError       operators_invalid             duplicate names or links, unknown roles
          ├── OperatorNotFoundError       operator_not_found            no operator has that name
          └── IdentityLinkConflictError   identity_link_conflict        the identity is linked to another operator
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from clawstack.gateway.config import GatewayConfig, Operator
from clawstack.gateway.dispatch import GATEWAY_OPERATOR, Requester
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.protocol import OPERATOR_SCOPES, OperatorScope, scope_satisfied

__all__ = [
    "GATEWAY_CHANNEL",
    "OPERATOR_SCOPES",
    "AuthorityAssertion",
    "AuthorityAssertionError",
    "AuthorityChange",
    "AuthorityError",
    "AuthorityRevokedError",
    "ChannelIdentity",
    "IdentityLinkConflictError",
    "OperatorAuthority",
    "OperatorEntry",
    "OperatorNotFoundError",
    "OperatorScope",
    "OperatorsInvalidError",
    "Revocation",
    "RevocationListener",
    "scope_satisfied",
]

_log = logging.getLogger(__name__)

#: :attr:`Requester.channel` of Gateway chat (a WebSocket client).
GATEWAY_CHANNEL: Final = "gateway"

_ADMIN: Final = "operator.admin"


class AuthorityError(GatewayError):
    """Root of the operator authority errors."""

    code = "authority_error"


class AuthorityRevokedError(AuthorityError):
    """The requester no longer holds the authority an assertion captured (demoted, role removed, unlinked, …)."""

    code = "requester_authority_revoked"


class AuthorityAssertionError(AuthorityError):
    """Not an :class:`AuthorityAssertion` this :class:`OperatorAuthority` issued."""

    code = "authority_assertion_invalid"


class OperatorsInvalidError(AuthorityError):
    """An operator list with a duplicate name, a duplicate channel identity link or an unknown role."""

    code = "operators_invalid"


class OperatorNotFoundError(AuthorityError):
    """No operator has that name."""

    code = "operator_not_found"


class IdentityLinkConflictError(AuthorityError):
    """The channel identity is linked to another operator; unlink it there first."""

    code = "identity_link_conflict"


@dataclass(frozen=True, slots=True)
class ChannelIdentity:
    """A sender on a channel: ``channel`` is the adapter's name (``"webhook"``), ``sender_id`` its verified id."""

    channel: str
    sender_id: str

    def __str__(self) -> str:
        return f"{self.channel}:{self.sender_id}"


@dataclass(frozen=True, slots=True)
class OperatorEntry:
    """One operator as the authority holds it: a name, roles and the channel identities that are them."""

    name: str
    roles: frozenset[OperatorScope]
    links: frozenset[ChannelIdentity] = frozenset()

    @classmethod
    def from_config(cls, operator: Operator) -> OperatorEntry:
        """The entry a config ``operators[]`` item describes."""
        links = frozenset(ChannelIdentity(link.channel, link.id) for link in operator.links)
        return cls(operator.name, frozenset(operator.roles), links)


class AuthorityAssertion:
    """What an owner-authorized command captured: the requester and the operator authority that authorised it.

    Opaque to plugins: it grants nothing by itself, and only the :class:`OperatorAuthority` that issued it
    accepts it (:meth:`OperatorAuthority.check`). ``operator`` is the operator whose authority it records,
    ``scope`` the strongest scope that authority held, ``channel`` and ``sender_id`` who asked.
    """

    __slots__ = ("__weakref__", "_channel", "_operator", "_scope", "_sender_id", "_via")

    def __init__(
        self,
        *,
        channel: str,
        sender_id: str | None,
        operator: str,
        scope: OperatorScope,
        via: Literal["gateway", "operator", "link"],
    ) -> None:
        self._channel = channel
        self._sender_id = sender_id
        self._operator = operator
        self._scope: OperatorScope = scope
        self._via = via

    @property
    def channel(self) -> str:
        return self._channel

    @property
    def sender_id(self) -> str | None:
        return self._sender_id

    @property
    def operator(self) -> str:
        return self._operator

    @property
    def scope(self) -> OperatorScope:
        return self._scope

    def __repr__(self) -> str:
        who = self._channel if self._sender_id is None else f"{self._channel}:{self._sender_id}"
        return f"AuthorityAssertion({who} as {self._operator!r}, {self._scope})"


@dataclass(frozen=True, slots=True)
class Revocation:
    """One piece of retained work that lost its authority, and why."""

    work_id: str
    error: AuthorityRevokedError


@dataclass(frozen=True, slots=True)
class AuthorityChange:
    """What a change did: whether anything changed, and the retained work it revoked."""

    changed: bool
    revocations: tuple[Revocation, ...] = ()


RevocationListener = Callable[[tuple[Revocation, ...]], None]
"""Called once per change with the retained work it newly revoked (never with an empty tuple)."""


def _entries(operators: Iterable[Operator | OperatorEntry]) -> dict[str, OperatorEntry]:
    entries: dict[str, OperatorEntry] = {}
    owners: dict[ChannelIdentity, str] = {}
    for item in operators:
        entry = OperatorEntry.from_config(item) if isinstance(item, Operator) else item
        if entry.name in entries:
            raise OperatorsInvalidError(f"two operators are named {entry.name!r}")
        unknown = sorted(set(entry.roles).difference(OPERATOR_SCOPES))
        if unknown:
            raise OperatorsInvalidError(f"operator {entry.name!r} has unknown roles {unknown}")
        for link in entry.links:
            if link in owners:
                raise OperatorsInvalidError(f"channel identity {link} is linked to {owners[link]!r} and {entry.name!r}")
            owners[link] = entry.name
        entries[entry.name] = entry
    return entries


class OperatorAuthority:
    """The gateway's current operator authority and the work retained under it (see the module docstring)."""

    def __init__(
        self,
        operators: Iterable[Operator | OperatorEntry] = (),
        *,
        allow_from: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self._operators = _entries(operators)
        self._allow_from = {channel: frozenset(senders) for channel, senders in (allow_from or {}).items()}
        self._issued: weakref.WeakSet[AuthorityAssertion] = weakref.WeakSet()
        self._revoked: weakref.WeakKeyDictionary[AuthorityAssertion, AuthorityRevokedError] = (
            weakref.WeakKeyDictionary()
        )
        self._retained: dict[str, AuthorityAssertion] = {}
        self._listeners: list[RevocationListener] = []
        self.generation = 0
        """Counts the changes that changed something."""

    @classmethod
    def from_config(cls, config: GatewayConfig) -> OperatorAuthority:
        """The authority ``config`` describes: its ``operators`` and every channel's ``allowFrom``."""
        return cls(config.operators, allow_from=_config_allow_from(config))

    # -- what is current -----------------------------------------------------------------------------------------

    @property
    def operators(self) -> tuple[OperatorEntry, ...]:
        """The operators, by name."""
        return tuple(self._operators[name] for name in sorted(self._operators))

    def links_of(self, name: str) -> tuple[ChannelIdentity, ...]:
        """The channel identities linked to operator ``name``; :class:`OperatorNotFoundError` if there is none."""
        return tuple(sorted(self._require(name).links, key=str))

    def allows(self, channel: str, sender_id: str) -> bool:
        """Whether ``sender_id`` passes ``channel``'s ``allowFrom`` (``"*"`` is everyone; no list is no one)."""
        senders = self._allow_from.get(channel, frozenset())
        return "*" in senders or sender_id in senders

    def operator_for(self, channel: str, sender_id: str) -> str | None:
        """The operator whose channel-owner authority ``sender_id`` carries on ``channel`` now, or ``None``."""
        if not self.allows(channel, sender_id):
            return None
        identity = ChannelIdentity(channel, sender_id)
        for entry in self._operators.values():
            if identity in entry.links:
                return entry.name if _ADMIN in entry.roles else None
        return None

    def authorizes(self, requester: Requester, scope: str) -> bool:
        """Whether ``requester`` holds ``scope`` now (see the module docstring)."""
        if requester.channel == GATEWAY_CHANNEL:
            if requester.operator == GATEWAY_OPERATOR:
                return requester.authenticated and scope_satisfied(requester.scopes, scope)
            entry = None if requester.operator is None else self._operators.get(requester.operator)
            return entry is not None and scope_satisfied(entry.roles, scope)
        if requester.sender_id is None:
            return False
        return self.operator_for(requester.channel, requester.sender_id) is not None

    def capture(self, requester: Requester) -> AuthorityAssertion | None:
        """An assertion of ``requester``'s current operator authority; ``None`` when it carries none now."""
        assertion: AuthorityAssertion | None = None
        if requester.channel == GATEWAY_CHANNEL:
            operator = requester.operator
            if operator == GATEWAY_OPERATOR:
                held = requester.scopes if requester.authenticated else ()
                via: Literal["gateway", "operator"] = "gateway"
            else:
                entry = None if operator is None else self._operators.get(operator)
                held = () if entry is None else tuple(entry.roles)
                via = "operator"
            best = next((s for s in OPERATOR_SCOPES if scope_satisfied(held, s)), None)
            if operator is not None and best is not None:
                assertion = AuthorityAssertion(
                    channel=requester.channel, sender_id=requester.sender_id, operator=operator, scope=best, via=via
                )
        elif requester.sender_id is not None:
            linked = self.operator_for(requester.channel, requester.sender_id)
            if linked is not None:
                assertion = AuthorityAssertion(
                    channel=requester.channel, sender_id=requester.sender_id, operator=linked, scope=_ADMIN, via="link"
                )
        if assertion is not None:
            self._issued.add(assertion)
        return assertion

    def check(self, assertion: AuthorityAssertion) -> None:
        """Raise :class:`AuthorityRevokedError` unless the asserted authority still holds now.

        :class:`AuthorityAssertionError` for anything this authority did not issue.
        """
        self._check_issued(assertion)
        revoked = self._revoked.get(assertion)
        if revoked is not None:
            raise AuthorityRevokedError(revoked.message)

    def is_current(self, assertion: AuthorityAssertion) -> bool:
        """Whether :meth:`check` would pass."""
        return assertion in self._issued and assertion not in self._revoked

    # -- retained work -------------------------------------------------------------------------------------------

    def retain(self, work_id: str, assertion: AuthorityAssertion) -> None:
        """Keep ``work_id`` under ``assertion`` until :meth:`release`; if it no longer holds, revoke at once.

        Retaining the same id again with the same assertion does nothing; with another assertion it is an error.
        """
        self._check_issued(assertion)
        existing = self._retained.get(work_id)
        if existing is not None:
            if existing is not assertion:
                raise AuthorityAssertionError(f"work {work_id!r} is already retained under another assertion")
            return
        self._retained[work_id] = assertion
        revoked = self._revoked.get(assertion)
        if revoked is not None:
            self._notify((Revocation(work_id, revoked),))

    def release(self, work_id: str) -> None:
        """Forget ``work_id`` (it ended); unknown ids are ignored."""
        self._retained.pop(work_id, None)

    def retained(self, work_id: str) -> AuthorityAssertion | None:
        """The assertion ``work_id`` is retained under, or ``None``."""
        return self._retained.get(work_id)

    def check_retained(self, work_id: str) -> None:
        """The admission check of retained work: raise its :class:`AuthorityRevokedError` if it was revoked.

        Work that is not retained passes: it was not admitted under anyone's authority.
        """
        assertion = self._retained.get(work_id)
        revoked = None if assertion is None else self._revoked.get(assertion)
        if revoked is not None:
            raise AuthorityRevokedError(revoked.message)

    def subscribe(self, listener: RevocationListener) -> Callable[[], None]:
        """Call ``listener`` with the revocations of every later change; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # -- changes -------------------------------------------------------------------------------------------------

    def update(
        self,
        operators: Iterable[Operator | OperatorEntry],
        *,
        allow_from: Mapping[str, Iterable[str]] | None = None,
    ) -> AuthorityChange:
        """Replace the operators (and, when given, every channel's ``allowFrom``): a config reload."""
        entries = _entries(operators)
        channels = self._allow_from if allow_from is None else {c: frozenset(s) for c, s in allow_from.items()}
        return self._apply(entries, channels)

    def update_from_config(self, config: GatewayConfig) -> AuthorityChange:
        """:meth:`update` with what a newly loaded ``config`` says."""
        return self.update(config.operators, allow_from=_config_allow_from(config))

    def set_roles(self, name: str, roles: Iterable[str]) -> AuthorityChange:
        """Give operator ``name`` exactly ``roles`` (none at all leaves it without authority)."""
        entry = self._require(name)
        wanted = frozenset(roles)
        unknown = sorted(wanted.difference(OPERATOR_SCOPES))
        if unknown:
            raise OperatorsInvalidError(f"unknown roles {unknown}; the roles are {list(OPERATOR_SCOPES)}")
        return self._replace(
            OperatorEntry(entry.name, frozenset(r for r in OPERATOR_SCOPES if r in wanted), entry.links)
        )

    def link(self, name: str, identity: ChannelIdentity) -> AuthorityChange:
        """Link ``identity`` to operator ``name``; linking it again is harmless, to another operator an error."""
        entry = self._require(name)
        for other in self._operators.values():
            if identity in other.links and other.name != name:
                raise IdentityLinkConflictError(
                    f"channel identity {identity} is linked to operator {other.name!r}; unlink it there first"
                )
        return self._replace(OperatorEntry(entry.name, entry.roles, entry.links | {identity}))

    def unlink(self, name: str, identity: ChannelIdentity) -> AuthorityChange:
        """Remove ``identity`` from operator ``name`` only (``changed`` is whether it was linked there)."""
        entry = self._require(name)
        return self._replace(OperatorEntry(entry.name, entry.roles, entry.links - {identity}))

    # -- inside --------------------------------------------------------------------------------------------------

    def _require(self, name: str) -> OperatorEntry:
        entry = self._operators.get(name)
        if entry is None:
            raise OperatorNotFoundError(f"no operator is named {name!r}")
        return entry

    def _replace(self, entry: OperatorEntry) -> AuthorityChange:
        return self._apply({**self._operators, entry.name: entry}, self._allow_from)

    def _apply(self, operators: dict[str, OperatorEntry], allow_from: dict[str, frozenset[str]]) -> AuthorityChange:
        if operators == self._operators and allow_from == self._allow_from:
            return AuthorityChange(changed=False)
        self._operators = operators
        self._allow_from = allow_from
        self.generation += 1
        newly: dict[AuthorityAssertion, AuthorityRevokedError] = {}
        for assertion in list(self._issued):
            if assertion not in self._revoked:
                problem = self._why_not_current(assertion)
                if problem is not None:
                    newly[assertion] = self._revoked[assertion] = AuthorityRevokedError(problem)
        revocations = tuple(
            Revocation(work_id, newly[assertion]) for work_id, assertion in self._retained.items() if assertion in newly
        )
        if revocations:
            self._notify(revocations)
        return AuthorityChange(changed=True, revocations=revocations)

    def _notify(self, revocations: tuple[Revocation, ...]) -> None:
        for listener in list(self._listeners):
            try:
                listener(revocations)
            except Exception:
                # One listener's failure must not keep the others from hearing of the revocation.
                _log.exception("a revocation listener failed")

    def _check_issued(self, assertion: object) -> None:
        if not isinstance(assertion, AuthorityAssertion) or assertion not in self._issued:
            raise AuthorityAssertionError("not an authority assertion this gateway issued")

    def _why_not_current(self, assertion: AuthorityAssertion) -> str | None:
        via = assertion._via
        if via == "gateway":
            return None  # the gateway's own secret; no operator change affects it
        entry = self._operators.get(assertion.operator)
        if entry is None:
            return f"operator {assertion.operator!r} no longer exists"
        if via == "operator":
            if not scope_satisfied(entry.roles, assertion.scope):
                return f"operator {assertion.operator!r} no longer holds {assertion.scope}"
            return None
        assert assertion.sender_id is not None  # a link assertion always names its sender
        identity = ChannelIdentity(assertion.channel, assertion.sender_id)
        if identity not in entry.links:
            return f"channel identity {identity} is no longer linked to operator {assertion.operator!r}"
        if _ADMIN not in entry.roles:
            return f"operator {assertion.operator!r} no longer holds {_ADMIN}"
        if not self.allows(assertion.channel, assertion.sender_id):
            return f"sender {assertion.sender_id!r} is no longer allowed on channel {assertion.channel!r} (allowFrom)"
        return None


def _config_allow_from(config: GatewayConfig) -> dict[str, tuple[str, ...]]:
    # The webhook channel is the one channel adapter with an allowFrom (``channels.webhook``).
    return {"webhook": config.channels.webhook.allow_from}
