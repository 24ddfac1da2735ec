"""clawstack: delegate agent work safely.

Subpackages: ``common`` (the shared kernel), ``llm`` (OpenAI-compatible client and the scripted fake model),
and the systems built on them.
"""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    # The version is read from the installed metadata on first use: importlib.metadata costs a process that never
    # asks (most never do before serving) tens of milliseconds at start-up.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("clawstack")
        except PackageNotFoundError:  # running from a source tree that was never installed
            value = "0.0.0"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'clawstack' has no attribute {name!r}")
