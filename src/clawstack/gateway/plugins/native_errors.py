"""The native facade's errors (:mod:`clawstack.gateway.plugins.native_facade`).

Errors::

    SubagentError                       (clawstack.gateway.plugins.api)
     └── NativeError                    native_error
          ├── NativeArgumentError       native_invalid_argument    a bad argument (nothing happened)
          ├── NativeUnsupportedError    native_unsupported         a spawn option this gateway does not offer
          ├── NativeToolDeniedError     native_tool_denied         the requester's tool policy denies the call
          ├── NativeAuthorityError      native_authority_revoked   the requester's operator authority ended
          ├── NativeRequestConflictError native_request_conflict   a request_id reused with other arguments
          ├── NativeNotOwnerError       native_not_owner           an id this plugin and parent do not own
          ├── NativeRefusedError        native_spawn_refused       the spawn policy or a tool hook refused it
          ├── NativeRewriteError        native_rewrite_refused     a tool hook rewrote what a native spawn keeps
          └── NativePolicyChangedError  native_policy_changed      the runtime config changed during a list (retry)
"""

from __future__ import annotations

from clawstack.gateway.plugins.api import SubagentError

__all__ = [
    "NativeArgumentError",
    "NativeAuthorityError",
    "NativeError",
    "NativeNotOwnerError",
    "NativePolicyChangedError",
    "NativeRefusedError",
    "NativeRequestConflictError",
    "NativeRewriteError",
    "NativeToolDeniedError",
    "NativeUnsupportedError",
]


class NativeError(SubagentError):
    code = "native_error"


class NativeArgumentError(NativeError):
    code = "native_invalid_argument"


class NativeUnsupportedError(NativeError):
    code = "native_unsupported"


class NativeToolDeniedError(NativeError):
    code = "native_tool_denied"


class NativeAuthorityError(NativeError):
    code = "native_authority_revoked"


class NativeRequestConflictError(NativeError):
    code = "native_request_conflict"


class NativeNotOwnerError(NativeError):
    code = "native_not_owner"


class NativeRefusedError(NativeError):
    code = "native_spawn_refused"


class NativeRewriteError(NativeError):
    code = "native_rewrite_refused"


class NativePolicyChangedError(NativeError):
    code = "native_policy_changed"
