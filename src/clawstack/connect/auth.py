"""Who may call ``claw connect http``: personal tokens, a shared pass, or nobody configured (open).

* ``MCP_USER_TOKENS``: ``Name:token,Name:token`` — each token names its owner, so the server knows who calls.
* ``MCP_USER_TOKENS_FILE``: a JSON object ``{"Name": "token", …}``, read again whenever the file changes (its
  modification time, size or inode). A file that cannot be read or parsed admits none of its tokens (and says so
  on stderr) until it is fixed: a revocation with a typo must not keep the old tokens alive.
* ``PUBLIC_MCP_PASS``: one shared pass, without identity: its holders are one caller of their own
  (:data:`~clawstack.connect.callers.PUBLIC`), whose name ``public`` no personal token may take.

With none of them set the endpoint is **open**: every caller is the one anonymous caller
(:data:`~clawstack.connect.callers.ANONYMOUS`), confined to its own records like any other, and :func:`describe`
says so at start. Offered tokens come from
``Authorization: Bearer …`` or the ``pass`` query parameter. Every configured token is compared with
:func:`~clawstack.common.ids.secrets_equal` (constant time, and all of them, whatever matches first); tokens are
never logged.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from clawstack.common.ids import secrets_equal
from clawstack.connect.callers import ANONYMOUS, PUBLIC, Caller
from clawstack.connect.errors import ConnectError

RESERVED_NAMES: Final = frozenset({"public"})
"""Names no personal token may have: the shared pass's caller is ``public``."""
MAX_TOKENS_FILE_BYTES: Final = 1024 * 1024
_log = logging.getLogger(__name__)


class AuthConfigError(ConnectError):
    """``MCP_USER_TOKENS`` (or the file's first read) is malformed."""

    code = "auth_config_invalid"


def parse_user_tokens(text: str) -> dict[str, str]:
    """``Name:token,Name:token`` as ``{name: token}``; :class:`AuthConfigError` names the bad entry's position."""
    tokens: dict[str, str] = {}
    for index, entry in enumerate(part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, token = entry.partition(":")
        name, token = name.strip(), token.strip()
        if not sep or not name or not token:
            raise AuthConfigError(f"MCP_USER_TOKENS entry {index + 1} is not Name:token")
        if name in tokens:
            raise AuthConfigError(f"MCP_USER_TOKENS names {name!r} twice")
        if name.lower() in RESERVED_NAMES:
            raise AuthConfigError(f"MCP_USER_TOKENS entry {index + 1}: {name!r} is the shared pass's caller name")
        tokens[name] = token
    return tokens


def _parse_tokens_file(data: bytes) -> dict[str, str]:
    document = json.loads(data)
    if not isinstance(document, dict) or not all(
        isinstance(name, str) and name and isinstance(token, str) and token for name, token in document.items()
    ):
        raise ValueError("must be an object of non-empty name: token strings")
    if any(name.lower() in RESERVED_NAMES for name in document):
        raise ValueError("'public' is the shared pass's caller name")
    return dict(document)


class TokenAuth:
    """Checks offered tokens; see the module docstring."""

    def __init__(
        self,
        *,
        user_tokens: Mapping[str, str] | None = None,
        tokens_file: str | os.PathLike[str] | None = None,
        public_pass: str | None = None,
    ) -> None:
        self._user_tokens = dict(user_tokens or {})
        self._tokens_file = Path(tokens_file) if tokens_file else None
        self._public_pass = public_pass or None
        self._file_tokens: dict[str, str] = {}
        self._file_stamp: tuple[int, int, int] | None = None
        if self._tokens_file is not None:
            self._reload_if_changed()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TokenAuth:
        return cls(
            user_tokens=parse_user_tokens(environ.get("MCP_USER_TOKENS", "")),
            tokens_file=environ.get("MCP_USER_TOKENS_FILE") or None,
            public_pass=environ.get("PUBLIC_MCP_PASS") or None,
        )

    @property
    def open(self) -> bool:
        """``True`` when no token, token file or pass is configured: anyone may call."""
        return not self._user_tokens and self._tokens_file is None and self._public_pass is None

    def describe(self) -> str:
        """How callers are admitted, for the start-up line: never a token."""
        if self.open:
            return "open: no MCP_USER_TOKENS, MCP_USER_TOKENS_FILE or PUBLIC_MCP_PASS is set, anyone who can reach it may call"
        parts = []
        if self._user_tokens or self._tokens_file is not None:
            parts.append("personal tokens")
        if self._public_pass is not None:
            parts.append("a shared pass")
        return "auth: " + " and ".join(parts)

    def identify(self, offered: str | None) -> Caller | None:
        """The caller ``offered`` admits, or ``None`` when it admits nobody."""
        if self.open:
            return ANONYMOUS
        if self._tokens_file is not None:
            self._reload_if_changed()
        if not offered:
            return None
        match: str | None = None
        for name, token in (*self._user_tokens.items(), *self._file_tokens.items()):
            if secrets_equal(offered, token) and match is None:
                match = name
        public = self._public_pass is not None and secrets_equal(offered, self._public_pass)
        if match is not None:
            return Caller.user(match)
        if public:
            return PUBLIC
        return None

    def _reload_if_changed(self) -> None:
        assert self._tokens_file is not None
        try:
            st = os.stat(self._tokens_file)
        except OSError:
            if self._file_stamp != (0, 0, 0):
                _log.error("MCP_USER_TOKENS_FILE cannot be read; its tokens are refused until it can")
            self._file_tokens, self._file_stamp = {}, (0, 0, 0)
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        try:
            with open(self._tokens_file, "rb") as handle:
                self._file_tokens = _parse_tokens_file(handle.read(MAX_TOKENS_FILE_BYTES + 1))
        except (OSError, ValueError):
            self._file_tokens = {}
            _log.error(
                "MCP_USER_TOKENS_FILE is not a JSON object of name: token (the name 'public' is reserved); "
                "its tokens are refused until fixed"
            )
            return
        _log.info("MCP_USER_TOKENS_FILE loaded: %d token(s)", len(self._file_tokens))


__all__ = ["RESERVED_NAMES", "AuthConfigError", "TokenAuth", "parse_user_tokens"]
