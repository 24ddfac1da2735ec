"""Errors raised by :mod:`clawstack.gateway`.

::

    ClawError                                  (clawstack.common.errors)
     └── GatewayError                          gateway_error
          └── GatewayConfigError               gateway_config_invalid      problems: tuple[ConfigProblem, ...]
               ├── GatewayConfigSyntaxError    gateway_config_syntax       line, column (JSON5 syntax, duplicate key)
               └── GatewayConfigUnreadableError gateway_config_unreadable  the file cannot be read or is not UTF-8

Every code is data (:data:`GATEWAY_ERROR_CODES`), so callers branch on ``exc.code`` and APIs serialise
``exc.to_dict()``. A config error's message starts with ``gateway config:`` and names the key path of each
problem (``agents.defaults.subagents.maxConcurrent: must be at least 1``). Messages name keys and the identifiers
a reference failed to match (a provider id, a model id, an operator name), and never quote any other value: not a
secret, not a value of the wrong type, not the text around a JSON5 syntax error (which gets a line and column).
"""

from __future__ import annotations

from dataclasses import dataclass

from clawstack.common.errors import ClawError

__all__ = [
    "GATEWAY_ERROR_CODES",
    "ConfigProblem",
    "GatewayConfigError",
    "GatewayConfigSyntaxError",
    "GatewayConfigUnreadableError",
    "GatewayError",
]


class GatewayError(ClawError):
    """Root of the :mod:`clawstack.gateway` error tree."""

    code = "gateway_error"


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One problem in a gateway config: the key path (``""`` for the whole document) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class GatewayConfigError(GatewayError):
    """The gateway config is invalid; ``problems`` lists every problem found, in document order."""

    code = "gateway_config_invalid"

    def __init__(self, problems: tuple[ConfigProblem, ...] | list[ConfigProblem], *, code: str | None = None) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        super().__init__("gateway config: " + "; ".join(str(p) for p in self.problems), code=code)


class GatewayConfigSyntaxError(GatewayConfigError):
    """The file is not one JSON5 object (syntax error, duplicate key, wrong top-level type)."""

    code = "gateway_config_syntax"

    def __init__(self, problem: ConfigProblem, *, line: int | None = None, column: int | None = None) -> None:
        super().__init__((problem,))
        self.line = line
        self.column = column


class GatewayConfigUnreadableError(GatewayConfigError):
    """The config file cannot be read (missing, unreadable, not UTF-8)."""

    code = "gateway_config_unreadable"


#: Every stable code this package's errors carry.
GATEWAY_ERROR_CODES: frozenset[str] = frozenset(
    cls.code
    for cls in (
        GatewayError,
        GatewayConfigError,
        GatewayConfigSyntaxError,
        GatewayConfigUnreadableError,
    )
)
