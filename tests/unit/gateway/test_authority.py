"""Live operator authority (``clawstack.gateway.authority``): current roles, links and allowFrom, assertions, and
the revocation of retained work when any of them changes."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.gateway.authority import (
    OPERATOR_SCOPES,
    AuthorityAssertion,
    AuthorityAssertionError,
    AuthorityRevokedError,
    ChannelIdentity,
    IdentityLinkConflictError,
    OperatorAuthority,
    OperatorEntry,
    OperatorNotFoundError,
    OperatorsInvalidError,
    Revocation,
    scope_satisfied,
)
from clawstack.gateway.config import Operator, parse_config
from clawstack.gateway.dispatch import GATEWAY_OPERATOR, Requester

ALICE = ChannelIdentity("webhook", "alice")
RITA = ChannelIdentity("webhook", "rita")
CAROL = ChannelIdentity("webhook", "carol")


def operators(**roles: tuple[str, ...]) -> list[OperatorEntry]:
    links = {"alice-admin": {ALICE}, "rita-reader": {RITA}, "carol-admin": {CAROL}}
    return [OperatorEntry(name, frozenset(r), frozenset(links.get(name, ()))) for name, r in roles.items()]  # type: ignore[arg-type]


def authority(**allow: Any) -> OperatorAuthority:
    return OperatorAuthority(
        operators(
            **{
                "alice-admin": ("operator.admin",),
                "rita-reader": ("operator.read",),
                "carol-admin": ("operator.admin",),
            }
        ),
        allow_from={"webhook": allow.get("allow", ("alice", "rita", "dave"))},
    )


def channel(sender: str, *, operator: str | None = None) -> Requester:
    return Requester(
        f"agent:main:channel:webhook:{sender}", "main", "webhook", True, sender_id=sender, operator=operator
    )


def gateway(scopes: tuple[str, ...] = ("operator.read", "operator.write", "operator.admin"), **kw: Any) -> Requester:
    return Requester(
        "agent:main:main",
        "main",
        "gateway",
        kw.get("authenticated", True),
        operator=kw.get("operator", GATEWAY_OPERATOR),
        scopes=scopes,
    )


@pytest.mark.parametrize(
    ("held", "needed", "expected"),
    [
        (("operator.admin",), "operator.read", True),
        (("operator.admin",), "operator.write", True),
        (("operator.admin",), "operator.admin", True),
        (("operator.write",), "operator.read", True),
        (("operator.write",), "operator.write", True),
        (("operator.write",), "operator.admin", False),
        (("operator.read",), "operator.write", False),
        (("operator.read",), "operator.read", True),
        ((), "operator.read", False),
    ],
)
def test_scope_satisfied(held: tuple[str, ...], needed: str, expected: bool) -> None:
    assert scope_satisfied(held, needed) is expected


def test_built_from_the_config(tmp_path: Path) -> None:
    document = {
        "models": {"providers": {"fake": {"baseUrl": "http://127.0.0.1:1/v1", "models": [{"id": "m"}]}}},
        "agents": {"defaults": {"model": {"primary": "fake/m"}}},
        "gateway": {"port": 0, "auth": {"mode": "token", "token": "t"}},
        "channels": {"webhook": {"allowFrom": ["alice"]}},
        "operators": [
            {"name": "alice-admin", "roles": ["operator.admin"], "links": [{"channel": "webhook", "id": "alice"}]},
            {"name": "bob", "roles": ["operator.read", "operator.write"]},
        ],
    }
    auth = OperatorAuthority.from_config(parse_config(document, base_dir=tmp_path, environ={}))
    assert [e.name for e in auth.operators] == ["alice-admin", "bob"]
    assert auth.links_of("alice-admin") == (ALICE,)
    assert auth.operator_for("webhook", "alice") == "alice-admin"
    assert auth.allows("webhook", "alice")
    assert not auth.allows("webhook", "bob")


@pytest.mark.parametrize(
    ("sender", "allow", "expected"),
    [
        ("alice", ("alice",), "alice-admin"),  # allowed and linked to an operator.admin
        ("alice", ("*",), "alice-admin"),
        ("rita", ("rita",), None),  # linked to an operator.read only
        ("dave", ("dave",), None),  # allowed, unlinked
        ("carol", ("alice",), None),  # linked to an operator.admin, not allowed on the channel
        ("alice", (), None),  # no allowFrom: no one
    ],
)
def test_operator_for(sender: str, allow: tuple[str, ...], expected: str | None) -> None:
    assert authority(allow=allow).operator_for("webhook", sender) == expected
    assert authority(allow=allow).operator_for("other", sender) is None


def test_authorizes() -> None:
    auth = authority()
    assert auth.authorizes(gateway(), "operator.admin")
    assert auth.authorizes(gateway(("operator.write",)), "operator.read")
    assert not auth.authorizes(gateway(("operator.read",)), "operator.write")
    assert not auth.authorizes(gateway(authenticated=False), "operator.read")
    assert auth.authorizes(gateway((), operator="rita-reader"), "operator.read")
    assert not auth.authorizes(gateway((), operator="rita-reader"), "operator.write")
    assert not auth.authorizes(gateway((), operator="nobody"), "operator.read")
    assert not auth.authorizes(gateway((), operator=None), "operator.read")
    for scope in OPERATOR_SCOPES:
        assert auth.authorizes(channel("alice"), scope)
        assert not auth.authorizes(channel("rita"), scope)  # channel authority is channel-owner authority only
        assert not auth.authorizes(channel("carol"), scope)
    assert not auth.authorizes(Requester("k", "main", "webhook", True), "operator.read")


def test_capture() -> None:
    auth = authority()
    owner = auth.capture(gateway())
    assert owner is not None
    assert (owner.channel, owner.operator, owner.scope) == ("gateway", GATEWAY_OPERATOR, "operator.admin")
    writer = auth.capture(gateway(("operator.write",)))
    assert writer is not None
    assert writer.scope == "operator.write"
    linked = auth.capture(channel("alice", operator="alice-admin"))
    assert linked is not None
    assert (linked.channel, linked.sender_id, linked.operator, linked.scope) == (
        "webhook",
        "alice",
        "alice-admin",
        "operator.admin",
    )
    assert "alice-admin" in repr(linked)
    named = auth.capture(gateway((), operator="rita-reader"))
    assert named is not None
    assert named.scope == "operator.read"
    for nobody in (
        channel("rita"),
        channel("dave"),
        channel("carol"),
        gateway(()),
        gateway(authenticated=False),
        gateway(operator=None),
        gateway((), operator="nobody"),
    ):
        assert auth.capture(nobody) is None, nobody
    for assertion in (owner, writer, linked, named):
        auth.check(assertion)
        assert auth.is_current(assertion)


def test_assertions_of_another_authority_or_forged_are_refused() -> None:
    auth, other = authority(), authority()
    theirs = other.capture(channel("alice"))
    assert theirs is not None
    forged = AuthorityAssertion(
        channel="webhook", sender_id="alice", operator="alice-admin", scope="operator.admin", via="link"
    )
    for bad in (theirs, forged, "assertion", None):
        with pytest.raises(AuthorityAssertionError) as caught:
            auth.check(bad)  # type: ignore[arg-type]
        assert caught.value.code == "authority_assertion_invalid"
        assert not auth.is_current(bad)  # type: ignore[arg-type]
        with pytest.raises(AuthorityAssertionError):
            auth.retain("w", bad)  # type: ignore[arg-type]


REVOKING: list[tuple[str, Any, str]] = [
    ("demoted", lambda a: a.set_roles("alice-admin", ["operator.write"]), "no longer holds operator.admin"),
    ("roles removed", lambda a: a.set_roles("alice-admin", []), "no longer holds operator.admin"),
    ("unlinked", lambda a: a.unlink("alice-admin", ALICE), "no longer linked"),
    (
        "linked to another person",
        lambda a: (a.unlink("alice-admin", ALICE), a.link("carol-admin", ALICE)),
        "no longer linked to operator 'alice-admin'",
    ),
    ("removed", lambda a: a.update(operators(**{"carol-admin": ("operator.admin",)})), "no longer exists"),
    ("not allowed any more", lambda a: a.update([*a.operators], allow_from={"webhook": ["rita"]}), "allowFrom"),
]


@pytest.mark.parametrize(("case", "change", "reason"), REVOKING, ids=[c[0] for c in REVOKING])
def test_a_change_revokes_the_assertion_and_the_work_retained_under_it(case: str, change: Any, reason: str) -> None:
    auth = authority()
    alice = auth.capture(channel("alice"))
    owner = auth.capture(gateway())
    assert alice is not None
    assert owner is not None
    heard: list[tuple[Revocation, ...]] = []
    auth.subscribe(heard.append)
    auth.retain("queued-run", alice)
    auth.retain("other-run", owner)
    generation = auth.generation

    change(auth)

    assert auth.generation > generation
    with pytest.raises(AuthorityRevokedError, match=reason) as caught:
        auth.check(alice)
    assert caught.value.code == "requester_authority_revoked"
    assert not auth.is_current(alice)
    with pytest.raises(AuthorityRevokedError, match=reason):
        auth.check_retained("queued-run")
    auth.check_retained("other-run")  # the Gateway operator's authority is untouched
    auth.check(owner)
    assert [[r.work_id for r in batch] for batch in heard] == [["queued-run"]]
    assert reason in heard[0][0].error.message


def test_revocation_is_final() -> None:
    auth = authority()
    alice = auth.capture(channel("alice"))
    assert alice is not None
    auth.retain("run", alice)
    auth.set_roles("alice-admin", ["operator.read"])
    auth.set_roles("alice-admin", ["operator.admin"])  # restored: a fresh request is needed
    with pytest.raises(AuthorityRevokedError):
        auth.check(alice)
    with pytest.raises(AuthorityRevokedError):
        auth.check_retained("run")
    again = auth.capture(channel("alice"))
    assert again is not None
    auth.check(again)


def test_changes_that_leave_authority_intact_revoke_nothing() -> None:
    auth = authority()
    alice = auth.capture(channel("alice"))
    assert alice is not None
    heard: list[tuple[Revocation, ...]] = []
    auth.subscribe(heard.append)
    auth.retain("run", alice)
    assert auth.set_roles("alice-admin", ["operator.admin", "operator.read"]).changed
    assert auth.set_roles("rita-reader", []).revocations == ()
    assert auth.link("alice-admin", ChannelIdentity("webhook", "alice2")).changed
    assert not auth.link("alice-admin", ALICE).changed  # linking again is harmless
    assert not auth.unlink("rita-reader", ALICE).changed  # only the expected operator's link is removed
    assert not auth.update([*auth.operators]).changed
    assert auth.update([*auth.operators], allow_from={"webhook": ["*"]}).changed
    auth.check(alice)
    auth.check_retained("run")
    assert heard == []


def test_retaining_revoked_work_revokes_it_at_once_and_release_forgets_it() -> None:
    auth = authority()
    alice = auth.capture(channel("alice"))
    assert alice is not None
    auth.set_roles("alice-admin", ["operator.read"])
    heard: list[tuple[Revocation, ...]] = []
    auth.subscribe(heard.append)
    auth.retain("late", alice)
    assert [r.work_id for r in heard[0]] == ["late"]
    assert auth.retained("late") is alice
    auth.retain("late", alice)  # the same again: nothing new
    assert len(heard) == 1
    other = auth.capture(gateway())
    assert other is not None
    with pytest.raises(AuthorityAssertionError):
        auth.retain("late", other)
    auth.release("late")
    auth.release("late")
    assert auth.retained("late") is None
    auth.check_retained("late")  # no longer retained: nothing to refuse
    auth.check_retained("never-retained")


def test_listeners_unsubscribe_and_a_failing_listener_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth = authority()
    alice = auth.capture(channel("alice"))
    assert alice is not None
    auth.retain("run", alice)
    heard: list[str] = []

    def broken(revocations: tuple[Revocation, ...]) -> None:
        raise RuntimeError("listener bug")

    auth.subscribe(broken)
    unsubscribe = auth.subscribe(lambda batch: heard.append("removed"))
    auth.subscribe(lambda batch: heard.extend(r.work_id for r in batch))
    unsubscribe()
    unsubscribe()
    change = auth.set_roles("alice-admin", [])
    assert [r.work_id for r in change.revocations] == ["run"]
    assert heard == ["run"]
    assert "a revocation listener failed" in caplog.text


def test_dropped_assertions_are_not_kept() -> None:
    auth = authority()
    assert auth.capture(channel("alice")) is not None
    gc.collect()
    auth.set_roles("alice-admin", [])  # nothing retained, nothing to revoke
    assert len(auth._issued) == 0


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([OperatorEntry("a", frozenset()), OperatorEntry("a", frozenset())], "two operators are named 'a'"),
        (
            [OperatorEntry("a", frozenset(), frozenset({ALICE})), OperatorEntry("b", frozenset(), frozenset({ALICE}))],
            "webhook:alice is linked to 'a' and 'b'",
        ),
        ([OperatorEntry("a", frozenset({"operator.root"}))], "unknown roles"),  # type: ignore[arg-type]
    ],
)
def test_invalid_operator_lists_are_refused_and_change_nothing(items: list[OperatorEntry], message: str) -> None:
    auth = authority()
    before = auth.operators
    with pytest.raises(OperatorsInvalidError, match=message) as caught:
        auth.update(items)
    assert caught.value.code == "operators_invalid"
    assert auth.operators == before
    assert auth.generation == 0


def test_admin_changes_refuse_what_they_cannot_do() -> None:
    auth = authority()
    with pytest.raises(OperatorNotFoundError) as missing:
        auth.set_roles("nobody", ["operator.read"])
    assert missing.value.code == "operator_not_found"
    with pytest.raises(OperatorNotFoundError):
        auth.link("nobody", ALICE)
    with pytest.raises(OperatorNotFoundError):
        auth.unlink("nobody", ALICE)
    with pytest.raises(OperatorNotFoundError):
        auth.links_of("nobody")
    with pytest.raises(OperatorsInvalidError):
        auth.set_roles("rita-reader", ["operator.owner"])
    with pytest.raises(IdentityLinkConflictError) as conflict:
        auth.link("rita-reader", ALICE)
    assert conflict.value.code == "identity_link_conflict"
    assert auth.operator_for("webhook", "alice") == "alice-admin"
    assert auth.generation == 0


def test_config_operators_and_entries_both_work() -> None:
    auth = OperatorAuthority(
        [
            Operator.model_validate(
                {"name": "x", "roles": ["operator.admin"], "links": [{"channel": "webhook", "id": "x"}]}
            )
        ],
        allow_from={"webhook": ["x"]},
    )
    assert auth.operator_for("webhook", "x") == "x"
    assert auth.links_of("x") == (ChannelIdentity("webhook", "x"),)


_ROLE_SETS = st.frozensets(st.sampled_from(OPERATOR_SCOPES))


@settings(max_examples=200, deadline=None)
@given(first=_ROLE_SETS, second=_ROLE_SETS, linked=st.booleans(), allowed=st.booleans())
def test_retained_work_is_revoked_exactly_when_channel_owner_authority_is_lost(
    first: frozenset[str], second: frozenset[str], linked: bool, allowed: bool
) -> None:
    auth = OperatorAuthority(
        [OperatorEntry("p", first, frozenset({ALICE}))],  # type: ignore[arg-type]
        allow_from={"webhook": ["alice"]},
    )
    assertion = auth.capture(channel("alice"))
    if "operator.admin" not in first:
        assert assertion is None
        return
    assert assertion is not None
    auth.retain("w", assertion)
    change = auth.update(
        [OperatorEntry("p", second, frozenset({ALICE}) if linked else frozenset())],  # type: ignore[arg-type]
        allow_from={"webhook": ["alice"] if allowed else []},
    )
    keeps = "operator.admin" in second and linked and allowed
    assert auth.is_current(assertion) is keeps
    assert [r.work_id for r in change.revocations] == ([] if keeps else ["w"])
