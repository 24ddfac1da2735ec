"""clawstack: delegate agent work safely.

Subpackages: ``common`` (the shared kernel), ``llm`` (OpenAI-compatible client and the scripted fake model),
and the systems built on them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("clawstack")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
