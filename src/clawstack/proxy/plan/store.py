"""The sign-in store: one owner-only file per plan provider.

::

    <pod>/.claw-auth/                 0700  created 0700 when missing, as is any missing directory above the store
        subscriptions/                0700  the store directory (the proxy config's ``auth_dir``)
            chatgpt.json              0600  one sign-in record, replaced atomically

A store directory or file that is group- or other-accessible, not owned by us, or a symlink is refused, and the
error says which path and why. Errors name paths, never contents.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from clawstack.common.clock import format_timestamp, parse_timestamp
from clawstack.common.files import PRIVATE_DIR_MODE, UnsafePathError, fsync_dir, read_private, write_private
from clawstack.proxy.plan.errors import PlanStoreError

PROVIDERS: Final = ("chatgpt",)
MAX_RECORD_BYTES: Final = 64 * 1024
RECORD_VERSION: Final = 1
SubscriptionState = Literal["signed_in", "not_signed_in", "signin_required"]
#: Identifies one version of a store file: (device, inode, mtime_ns, size). Saving replaces the inode.
Stamp = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class SignIn:
    """One provider's sign-in. Token values never appear in ``repr``.

    ``needs_signin`` is set once the issuer refused a refresh: the sign-in is over until the operator signs in
    again. ``limited_until`` is the end of a usage-limit rest.
    """

    provider: str
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    id_token: str | None = field(repr=False)
    account_email: str | None
    account_id: str | None
    expires_at: datetime | None
    signed_in_at: datetime
    refreshed_at: datetime | None = None
    needs_signin: bool = False
    limited_until: datetime | None = None

    def with_changes(self, **changes: Any) -> SignIn:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)


def _stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _time(value: datetime | None) -> str | None:
    """RFC 3339 UTC with microseconds, so that a record reads back equal to what was saved."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _encode(signin: SignIn) -> bytes:
    record = {
        "version": RECORD_VERSION,
        "provider": signin.provider,
        "access_token": signin.access_token,
        "refresh_token": signin.refresh_token,
        "id_token": signin.id_token,
        "account_email": signin.account_email,
        "account_id": signin.account_id,
        "expires_at": _time(signin.expires_at),
        "signed_in_at": _time(signin.signed_in_at),
        "refreshed_at": _time(signin.refreshed_at),
        "needs_signin": signin.needs_signin,
        "limited_until": _time(signin.limited_until),
    }
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


def _decode(provider: str, raw: bytes) -> SignIn:
    """Parse a record; raise ``ValueError`` (whose text is never shown) when it is malformed."""
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or data.get("provider") != provider:
        raise ValueError("not a sign-in record")

    def text(name: str, *, required: bool = False) -> str | None:
        value = data.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise ValueError(name)
        return value

    def when(name: str, *, required: bool = False) -> datetime | None:
        value = text(name, required=required)
        return None if value is None else parse_timestamp(value)

    needs = data.get("needs_signin", False)
    if not isinstance(needs, bool):
        raise ValueError("needs_signin")
    signed_in_at = when("signed_in_at", required=True)
    assert signed_in_at is not None
    access = text("access_token", required=True)
    assert access is not None
    return SignIn(
        provider=provider,
        access_token=access,
        refresh_token=text("refresh_token"),
        id_token=text("id_token"),
        account_email=text("account_email"),
        account_id=text("account_id"),
        expires_at=when("expires_at"),
        signed_in_at=signed_in_at,
        refreshed_at=when("refreshed_at"),
        needs_signin=needs,
        limited_until=when("limited_until"),
    )


def _check_private_dir(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise PlanStoreError(f"{path} is a symlink; the sign-in store must be a real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise PlanStoreError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise PlanStoreError(f"{path} is owned by uid {st.st_uid}, not uid {os.geteuid()}; refusing the sign-in store")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise PlanStoreError(
            f"{path} has mode {mode:04o}: group or others can reach the sign-in store; it must be 0700 "
            f"(fix with: chmod 700 {path})"
        )


class AuthStore:
    """The sign-in store in ``directory`` (normally ``<pod>/.claw-auth/subscriptions``)."""

    def __init__(self, directory: Path) -> None:
        self._directory = Path(directory)

    @property
    def directory(self) -> Path:
        return self._directory

    def path(self, provider: str) -> Path:
        """The record file of ``provider``; refuses a provider this store does not hold."""
        if provider not in PROVIDERS:
            raise ValueError(f"unknown plan provider {provider!r}; supported: {', '.join(PROVIDERS)}")
        return self._directory / f"{provider}.json"

    def _existing_dir(self) -> bool:
        """Whether the store directory exists; refuses an unsafe one."""
        try:
            _check_private_dir(self._directory)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise PlanStoreError(
                f"cannot read {self._directory}: {exc.strerror}", code="auth_store_unreadable"
            ) from exc
        return True

    def _create_dir(self) -> None:
        missing: list[Path] = []
        for candidate in (self._directory, *self._directory.parents):
            if os.path.lexists(candidate):
                break
            missing.append(candidate)
        for directory in reversed(missing):
            try:
                os.mkdir(directory, PRIVATE_DIR_MODE)
            except FileExistsError:
                continue
            os.chmod(directory, PRIVATE_DIR_MODE)  # the umask may have narrowed the mode; make it exact
        _check_private_dir(self._directory)

    def stamp(self, provider: str) -> Stamp | None:
        """The current version of ``provider``'s file, or ``None`` when there is none."""
        path = self.path(provider)
        try:
            return _stamp_of(os.stat(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PlanStoreError(f"cannot read {path}: {exc.strerror}", code="auth_store_unreadable") from exc

    def load_versioned(self, provider: str) -> tuple[SignIn | None, Stamp | None]:
        """``provider``'s sign-in and the file version it was read from; ``(None, None)`` when not signed in."""
        path = self.path(provider)
        if not self._existing_dir():
            return None, None
        for _ in range(5):  # a save that replaces the file mid-read changes the stamp: read again
            before = self.stamp(provider)
            if before is None:
                return None, None
            try:
                raw = read_private(path, max_bytes=MAX_RECORD_BYTES)
            except FileNotFoundError:
                continue
            except UnsafePathError as exc:
                raise PlanStoreError(f"refusing the sign-in record: {exc.message}") from exc
            except OSError as exc:
                raise PlanStoreError(f"cannot read {path}: {exc.strerror}", code="auth_store_unreadable") from exc
            if self.stamp(provider) != before:
                continue
            try:
                return _decode(provider, raw), before
            except (ValueError, UnicodeDecodeError) as exc:
                raise PlanStoreError(
                    f"{path} is not a valid sign-in record; sign in again with: claw proxy auth login {provider}",
                    code="auth_store_unreadable",
                ) from exc
        raise PlanStoreError(f"{path} kept changing while it was read", code="auth_store_unreadable")

    def load(self, provider: str) -> SignIn | None:
        """``provider``'s sign-in, or ``None`` when nobody signed in."""
        return self.load_versioned(provider)[0]

    def save(self, signin: SignIn) -> Stamp:
        """Write ``signin`` atomically (0600), creating the store directory (0700) if needed; return the new
        file version."""
        path = self.path(signin.provider)
        try:
            self._create_dir()
            write_private(path, _encode(signin))
        except OSError as exc:
            raise PlanStoreError(f"cannot write {path}: {exc.strerror}", code="auth_store_unreadable") from exc
        stamp = self.stamp(signin.provider)
        assert stamp is not None
        return stamp

    def remove(self, provider: str) -> bool:
        """Delete ``provider``'s sign-in; ``False`` when there was none."""
        path = self.path(provider)
        if not self._existing_dir():
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.EISDIR:
                raise PlanStoreError(f"{path} is a directory, not a sign-in record") from exc
            raise PlanStoreError(f"cannot remove {path}: {exc.strerror}", code="auth_store_unreadable") from exc
        fsync_dir(self._directory)
        return True

    def state(self, provider: str, now: datetime) -> dict[str, str]:
        """The sign-in state as ``GET /v1/subscriptions`` reports it; it never carries a token."""
        return signin_state(provider, self.load(provider), now)


def signin_state(provider: str, signin: SignIn | None, now: datetime) -> dict[str, str]:
    """``{"provider", "state", "account"?, "limited_until"?}`` for ``signin`` at ``now``."""
    if signin is None:
        return {"provider": provider, "state": "not_signed_in"}
    expired = signin.expires_at is not None and signin.expires_at <= now and not signin.refresh_token
    state: SubscriptionState = "signin_required" if signin.needs_signin or expired else "signed_in"
    report = {"provider": provider, "state": state}
    if signin.account_email:
        report["account"] = signin.account_email
    if signin.limited_until is not None and signin.limited_until > now:
        report["limited_until"] = format_timestamp(signin.limited_until)
    return report


__all__ = ["MAX_RECORD_BYTES", "PROVIDERS", "AuthStore", "SignIn", "Stamp", "SubscriptionState", "signin_state"]
