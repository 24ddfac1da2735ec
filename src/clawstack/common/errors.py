"""The root of every clawstack exception tree.

::

    ClawError                      code: str, retryable: bool
     ├── StrictJSONError           (common.strictjson)
     ├── DigestError               (common.digest)
     ├── UnsafePathError           (common.files)
     ├── PeerCredentialError       (common.uds)
     ├── SocketUnavailableError    (common.uds, retryable)
     └── LLMError                  (clawstack.llm, its own tree)

Each subsystem draws its own subtree under :class:`ClawError`. Every error carries a stable ``code`` as data so
that APIs serialise errors instead of parsing messages. Messages never contain credentials or task text.
"""

from __future__ import annotations


class ClawError(Exception):
    """Base class: a stable machine-readable ``code``, a human ``message`` and ``retryable``."""

    code: str = "internal_error"
    retryable: bool = False

    def __init__(self, message: str, *, code: str | None = None, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable

    def to_dict(self) -> dict[str, str]:
        """The ``{"code", "message"}`` pair an API puts in its error envelope."""
        return {"code": self.code, "message": self.message}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"
